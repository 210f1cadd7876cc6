#include "inprof/internal/thread_info.h"

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace inprof::internal {

absl::StatusOr<CurrentThreadInfo> DescribeCurrentThread() {
  CurrentThreadInfo info;
  info.tid = static_cast<pid_t>(syscall(SYS_gettid));
  pthread_attr_t attr;
  int rc = pthread_getattr_np(pthread_self(), &attr);
  if (rc != 0) {
    return absl::InternalError(
        absl::StrCat("pthread_getattr_np failed: ", strerror(rc)));
  }
  void* addr = nullptr;
  size_t size = 0;
  rc = pthread_attr_getstack(&attr, &addr, &size);
  pthread_attr_destroy(&attr);
  if (rc != 0 || addr == nullptr || size == 0) {
    return absl::InternalError("pthread_attr_getstack gave no stack bounds");
  }
  info.stack.lo = reinterpret_cast<uintptr_t>(addr);
  info.stack.hi = info.stack.lo + size;
  rc = pthread_getcpuclockid(pthread_self(), &info.cpu_clock);
  if (rc != 0) {
    return absl::InternalError(
        absl::StrCat("pthread_getcpuclockid failed: ", strerror(rc)));
  }
  return info;
}

pid_t CurrentTid() noexcept { return static_cast<pid_t>(syscall(SYS_gettid)); }

int64_t ThreadCpuNanos(clockid_t clock) noexcept {
  struct timespec ts;
  if (clock_gettime(clock, &ts) != 0) return -1;
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

}  // namespace inprof::internal
