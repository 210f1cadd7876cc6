#include "inprof/cpu_time_provider.h"

#include <signal.h>
#include <time.h>

#include <cerrno>
#include <cstring>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "inprof/internal/thread_info.h"

namespace inprof {

absl::Status CpuTimeProvider::Configure(const Options& options) {
  period_ns_ = absl::ToInt64Nanoseconds(options.cpu_period);
  if (period_ns_ <= 0) {
    return absl::InvalidArgumentError("cpu_period must be positive");
  }
  return absl::OkStatus();
}

absl::Status CpuTimeProvider::ArmThread(ThreadContext& thread,
                                        ThreadData& data, int tag) {
  if (data.armed) return absl::OkStatus();
  const int64_t now = internal::ThreadCpuNanos(thread.cpu_clock);
  if (now < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "thread ", thread.tid, " has exited without unregistering"));
  }
  data.last_cpu_ns.store(now, std::memory_order_relaxed);

  struct sigevent sev;
  std::memset(&sev, 0, sizeof(sev));
  sev.sigev_notify = SIGEV_THREAD_ID;
  sev.sigev_signo = internal::kProfilingSignal;
  sev.sigev_value.sival_int = tag;
  sev._sigev_un._tid = thread.tid;
  if (timer_create(thread.cpu_clock, &sev, &data.timer) != 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "timer_create for thread ", thread.tid, " failed: ", strerror(errno)));
  }
  // Random first expiry in (0, period]: a thread that lives less than one
  // period is still sampled with probability proportional to its CPU.
  const int64_t first = absl::Uniform<int64_t>(absl::IntervalOpenClosed,
                                               bitgen_, 0, period_ns_);
  struct itimerspec spec;
  spec.it_value.tv_sec = first / 1'000'000'000;
  spec.it_value.tv_nsec = first % 1'000'000'000;
  spec.it_interval.tv_sec = period_ns_ / 1'000'000'000;
  spec.it_interval.tv_nsec = period_ns_ % 1'000'000'000;
  if (timer_settime(data.timer, 0, &spec, nullptr) != 0) {
    const int err = errno;
    timer_delete(data.timer);
    return absl::InternalError(absl::StrCat(
        "timer_settime for thread ", thread.tid, " failed: ", strerror(err)));
  }
  data.armed = true;
  data.tail_pending = true;
  return absl::OkStatus();
}

void CpuTimeProvider::DisarmThread(ThreadContext&, ThreadData& data) noexcept {
  if (!data.armed) return;
  timer_delete(data.timer);
  data.armed = false;
}

bool CpuTimeProvider::OnSignal(ThreadContext& thread, ThreadData& data,
                               const siginfo_t&,
                               std::span<int64_t> values) noexcept {
  const int64_t now = internal::ThreadCpuNanos(thread.cpu_clock);
  if (now < 0) return false;
  const int64_t used = now - data.last_cpu_ns.load(std::memory_order_relaxed);
  data.last_cpu_ns.store(now, std::memory_order_relaxed);
  values[0] = 1;
  values[1] = used > 0 ? used : 0;
  return true;
}

bool CpuTimeProvider::TakeTail(ThreadContext& thread, ThreadData& data,
                               std::span<int64_t> values) {
  if (!data.tail_pending) return false;
  data.tail_pending = false;
  const int64_t now = internal::ThreadCpuNanos(thread.cpu_clock);
  if (now < 0) return false;  // the thread is gone: its clock is unreadable
  const int64_t used = now - data.last_cpu_ns.load(std::memory_order_relaxed);
  data.last_cpu_ns.store(now, std::memory_order_relaxed);
  values[0] = 0;
  values[1] = used;
  return used > 0;
}

}  // namespace inprof
