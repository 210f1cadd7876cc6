// internal: not part of the public API.
//
// What the registry captures about the calling thread when it registers.
#ifndef INPROF_INTERNAL_THREAD_INFO_H_
#define INPROF_INTERNAL_THREAD_INFO_H_

#include <sys/types.h>
#include <time.h>

#include "absl/status/statusor.h"
#include "inprof/unwinder.h"

namespace inprof::internal {

struct CurrentThreadInfo {
  pid_t tid = 0;
  StackBounds stack;       // from pthread_getattr_np
  clockid_t cpu_clock = 0; // pthread_getcpuclockid: readable from any thread
};

// Describes the calling thread. Allocates (reads /proc for the main thread);
// never call it from a signal handler.
absl::StatusOr<CurrentThreadInfo> DescribeCurrentThread();

// The calling thread's kernel thread id. Async-signal-safe.
pid_t CurrentTid() noexcept;

// Thread CPU time of `clock` in nanoseconds, or -1 if the thread is gone.
// Async-signal-safe.
int64_t ThreadCpuNanos(clockid_t clock) noexcept;

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_THREAD_INFO_H_
