// internal: not part of the public API.
//
// AllocGuard: while one lives on a thread, that thread's allocations are
// never sampled by the allocation profiler (inprof/heap/allocation_provider.h):
// its byte countdown (alloc/alloc_sampler.h) is parked at its maximum and
// restored afterwards. inprof's own work on the host's threads
// (RegisterThread, Stop, a registration's end, labels) runs under one, so
// that what inprof allocates for itself is not profiled as the host's; the
// sampled path runs under one, so it never recurses. In base, so that code
// compiled into libinprof guards itself whether or not the allocation
// profiler is linked (the thread-local state is a few words). Nests.
//
// Thread-safety: per thread (initial-exec TLS: no allocation, no loader
// call). Linux; on Windows a guard does nothing.
//
// Example:
//   {
//     internal::AllocGuard guard;
//     names_.push_back(std::string(name));   // not sampled
//   }
#ifndef INPROF_BASE_ALLOC_GUARD_H_
#define INPROF_BASE_ALLOC_GUARD_H_

#include <cstdint>

namespace inprof::internal {

#if !defined(_WIN32)

// One thread's allocation-sampling state. Zero-initialized (a new thread's
// first allocation takes the slow path, which draws its first countdown).
struct AllocThreadState {
  uint64_t countdown;   // bytes left before the next sample
  uint64_t generation;  // the g_alloc_generation the countdown was drawn for
  uint64_t rng;         // xorshift64* state; 0: not seeded yet
  uint64_t mean;        // the mean the current countdown was drawn with
  uint32_t guard;       // > 0: inside the sampled path or inprof's own work
  // The last address this thread's free() looked up in a live-heap table
  // and did not find there, that table, and its insert count then
  // (LiveHeapTable::Erase: an allocator hands the same block out again and
  // again, and its home slot may be another block's).
  uintptr_t absent_address;
  const void* absent_table;
  uint64_t absent_inserts;
};

// Initial-exec: the executable (or a preloaded library) owns it, so a
// thread's first access never goes through __tls_get_addr. __thread, not
// thread_local: an extern thread_local is reached through a TLS wrapper
// function (a check and a call for possible dynamic initialization) on
// every access from another translation unit. Defined in src/base.
extern __thread AllocThreadState alloc_thread_state
    __attribute__((tls_model("initial-exec")));

class AllocGuard {
 public:
  AllocGuard() : saved_(alloc_thread_state.countdown) {
    alloc_thread_state.countdown = UINT64_MAX;
    ++alloc_thread_state.guard;
  }
  ~AllocGuard() {
    --alloc_thread_state.guard;
    alloc_thread_state.countdown = saved_;
  }
  AllocGuard(const AllocGuard&) = delete;
  AllocGuard& operator=(const AllocGuard&) = delete;

  // Whether the calling thread is inside one.
  static bool Active() { return alloc_thread_state.guard > 0; }

 private:
  uint64_t saved_;
};

#else

class AllocGuard {
 public:
  // User-provided, so that a guard nobody reads is no unused variable.
  AllocGuard() noexcept {}
  ~AllocGuard() {}
  AllocGuard(const AllocGuard&) = delete;
  AllocGuard& operator=(const AllocGuard&) = delete;
  static bool Active() { return false; }
};

#endif

}  // namespace inprof::internal

#endif  // INPROF_BASE_ALLOC_GUARD_H_
