// internal: not part of the public API.
//
// inprof's own threads (the collector, the exporter, the wall ticker, the
// uploader, the agent's and the endpoint's) do work that allocates: under
// memory pressure (RLIMIT_AS, `ulimit -v`, overcommit off) that work
// throws std::bad_alloc, and an exception that leaves a thread's body ends
// the host with std::terminate. So it never leaves: each unit of work runs
// under RunContained, which swallows it, counts it and says so once, and
// the thread goes on with its next unit (the pass, window or module is
// skipped). An exception thrown inside a dl_iterate_phdr callback would
// unwind through the loader with its lock held: ForEachLoadedObject
// catches it inside the callback and throws it again after the loader
// returned.
//
// Thread-safety: any thread. Not in a signal handler.
//
// Example:
//   while (!stop) {
//     RunContained("a collector pass", [&] { Drain(); });
//   }
#ifndef INPROF_BASE_CONTAINED_H_
#define INPROF_BASE_CONTAINED_H_

#include <cstddef>
#include <cstdint>
#include <exception>
#include <utility>

#if !defined(_WIN32)
#include <link.h>
#endif

namespace inprof::internal {

// Counts a unit of work that threw and logs the first of each `what`
// (without allocating when the log line itself cannot be made). `what`
// names the work ("a collector pass"); `error` is the exception's what().
void NoteContainedFailure(const char* what, const char* error) noexcept;

// Units of work that threw since the process started.
uint64_t ContainedFailures() noexcept;

// Runs `work()`; false when it threw (counted and logged once).
template <typename F>
bool RunContained(const char* what, F&& work) noexcept {
  try {
    std::forward<F>(work)();
    return true;
  } catch (const std::exception& e) {
    NoteContainedFailure(what, e.what());
  } catch (...) {
    NoteContainedFailure(what, "an unknown exception");
  }
  return false;
}

#if !defined(_WIN32)
// dl_iterate_phdr with `visit(info, size)` as its callback (nonzero stops
// the walk); an exception `visit` throws is thrown again here, after the
// loader's lock is released.
template <typename F>
void ForEachLoadedObject(F&& visit) {
  struct Context {
    F* visit;
    std::exception_ptr error;
  } context{&visit, nullptr};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t size, void* data) -> int {
        auto& c = *static_cast<Context*>(data);
        try {
          return (*c.visit)(info, size);
        } catch (...) {
          c.error = std::current_exception();
          return 1;
        }
      },
      &context);
  if (context.error) std::rethrow_exception(context.error);
}
#endif

}  // namespace inprof::internal

#endif  // INPROF_BASE_CONTAINED_H_
