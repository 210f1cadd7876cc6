// internal: not part of the public API.
//
// One of inprof's own threads (collector, exporter, uploader, Windows'
// sampler). On Linux a std::thread. On Windows a thread that starts at
// ProfilerThreadEntry (CreateThread), so that automatic thread tracking
// (inprof_autoregister.dll) tells it from the program's threads by its
// start address and never registers it: a std::thread's start address is
// the C runtime's, the same as the program's own threads'.
//
// Thread-safety: like std::thread; join() once, from one thread.
//
// Example:
//   internal::ProfilerThread t([] { Collect(); });
//   t.join();
#ifndef INPROF_BASE_PROFILER_THREAD_H_
#define INPROF_BASE_PROFILER_THREAD_H_

#include <cstdint>
#include <functional>
#include <utility>

#include "inprof/base/contained.h"

#if !defined(_WIN32)
#include <thread>

#include "inprof/base/owned_fd.h"
#endif

namespace inprof::internal {

#if defined(_WIN32)

class ProfilerThread {
 public:
  ProfilerThread() = default;
  explicit ProfilerThread(std::function<void()> body);
  ProfilerThread(ProfilerThread&& other) noexcept
      : handle_(std::exchange(other.handle_, nullptr)) {}
  ProfilerThread& operator=(ProfilerThread&& other) noexcept {
    std::swap(handle_, other.handle_);
    return *this;
  }
  ProfilerThread(const ProfilerThread&) = delete;
  ProfilerThread& operator=(const ProfilerThread&) = delete;
  ~ProfilerThread();  // joins a thread still joinable

  bool joinable() const { return handle_ != nullptr; }
  void join();

 private:
  void* handle_ = nullptr;  // HANDLE
};

// Where every ProfilerThread starts (its Win32 start address).
uintptr_t ProfilerThreadStartAddress();

#else

// Whether the calling thread is one of inprof's own: the allocation
// profiler leaves their allocations out (initial-exec TLS: no allocation,
// no loader call).
bool IsProfilerThread() noexcept;
// Marks the calling thread as inprof's (what ProfilerThread's thread does
// first). Under AddressSanitizer it also notes the thread's stack, whose
// poison a forked child clears (the thread does not exist there).
void MarkProfilerThread() noexcept;

class ProfilerThread {
 public:
  ProfilerThread() = default;
  // A thread made by a thread with a descriptor table of its own shares
  // that table (owned_fd.h) and knows it.
  explicit ProfilerThread(std::function<void()> body)
      : thread_([body = std::move(body), table = ThisDescriptorTable()] {
          MarkProfilerThread();
          JoinDescriptorTable(table);
          // The last resort: an exception its loop did not contain ends
          // this thread, never the host (base/contained.h).
          RunContained("an inprof thread", body);
        }) {}
  bool joinable() const { return thread_.joinable(); }
  void join() { thread_.join(); }

 private:
  std::thread thread_;
};

#endif

}  // namespace inprof::internal

#endif  // INPROF_BASE_PROFILER_THREAD_H_
