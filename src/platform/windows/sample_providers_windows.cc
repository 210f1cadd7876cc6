// CpuTimeProvider and WallTimeProvider on Windows, and the thread counters
// they read.
#include <windows.h>

#include "absl/strings/str_cat.h"
#include "inprof/internal/cpu_lattice.h"
#include "inprof/windows/cpu_time_provider_windows.h"
#include "inprof/windows/sample_provider_windows.h"
#include "inprof/windows/wall_time_provider_windows.h"

namespace inprof {
namespace internal {

ThreadTimes ReadThreadTimes(void* handle) noexcept {
  ThreadTimes t;
  FILETIME created, exited, kernel, user;
  if (GetThreadTimes(static_cast<HANDLE>(handle), &created, &exited, &kernel, &user)) {
    auto ns = [](const FILETIME& f) {
      return static_cast<int64_t>(
                 (static_cast<uint64_t>(f.dwHighDateTime) << 32) | f.dwLowDateTime) *
             100;  // 100 ns units
    };
    t.cpu_ns = ns(kernel) + ns(user);
  }
  ULONG64 cycles = 0;
  if (QueryThreadCycleTime(static_cast<HANDLE>(handle), &cycles)) {
    t.cycles = cycles;
    t.has_cycles = true;
  }
  return t;
}

int64_t MonotonicNanos() noexcept {
  static const int64_t frequency = [] {
    LARGE_INTEGER f;
    QueryPerformanceFrequency(&f);
    return static_cast<int64_t>(f.QuadPart);
  }();
  LARGE_INTEGER now;
  QueryPerformanceCounter(&now);
  const int64_t ticks = now.QuadPart;
  // Split to keep ticks * 1e9 from overflowing.
  return ticks / frequency * 1'000'000'000 +
         ticks % frequency * 1'000'000'000 / frequency;
}

}  // namespace internal

absl::Status CpuTimeProvider::Configure(const Options& options) {
  period_ns_ = absl::ToInt64Nanoseconds(options.cpu_period);
  if (period_ns_ <= 0) {
    return absl::InvalidArgumentError("cpu_period must be positive");
  }
  SYSTEM_INFO info;
  GetSystemInfo(&info);
  threads_per_tick_ = info.dwNumberOfProcessors > 0 ? info.dwNumberOfProcessors : 1;
  return absl::OkStatus();
}

absl::Status CpuTimeProvider::ArmThread(ThreadContext& /*thread*/, ThreadData& data,
                                        const ThreadTimes& times, int64_t /*now_ns*/) {
  data.armed = true;
  // CPU before the profiler started is not in the profile.
  data.next_due_ns = (times.cpu_ns >= 0 ? times.cpu_ns : 0) +
                     absl::Uniform<int64_t>(absl::IntervalOpenClosed, bitgen_, 0,
                                            period_ns_);
  return absl::OkStatus();
}

VisitDecision CpuTimeProvider::Visit(ThreadContext& /*thread*/, ThreadData& data,
                                     const ThreadTimes& times, int64_t /*now_ns*/,
                                     std::span<int64_t> values) {
  if (!data.armed || times.cpu_ns < 0) return VisitDecision::kSkip;
  const int64_t points =
      internal::TakeLatticePoints(times.cpu_ns, &data.next_due_ns, period_ns_);
  if (points == 0) return VisitDecision::kSkip;
  values[0] = 1;
  values[1] = points * period_ns_;
  return VisitDecision::kSample;
}

bool CpuTimeProvider::TakeTail(ThreadContext& /*thread*/, ThreadData& data,
                               const ThreadTimes& times, int64_t /*now_ns*/,
                               std::span<int64_t> values) {
  if (!data.armed) return false;
  data.armed = false;
  if (times.cpu_ns < 0) return false;
  const int64_t points =
      internal::TakeLatticePoints(times.cpu_ns, &data.next_due_ns, period_ns_);
  values[0] = 0;
  values[1] = points * period_ns_;
  return points > 0;
}

std::string CpuTimeProvider::Describe() const {
  return absl::StrCat("cpu engine=thread-times (GetThreadTimes every ",
                      absl::FormatDuration(absl::Nanoseconds(period_ns_)),
                      ", at most ", threads_per_tick_, " threads a tick)");
}

absl::Status WallTimeProvider::Configure(const Options& options) {
  period_ = options.wall_period;
  if (period_ < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("wall_period must not be negative");
  }
  threads_per_tick_ = options.wall_threads_per_tick > 0
                          ? static_cast<size_t>(options.wall_threads_per_tick)
                          : 1;
  return absl::OkStatus();
}

absl::Status WallTimeProvider::ArmThread(ThreadContext& /*thread*/, ThreadData& data,
                                         const ThreadTimes& times, int64_t now_ns) {
  data.armed = true;
  data.blocked = false;
  data.last_visit_ns = now_ns;
  data.last_cpu_ns = times.cpu_ns;
  data.last_cycles = times.cycles;
  return absl::OkStatus();
}

VisitDecision WallTimeProvider::Visit(ThreadContext& /*thread*/, ThreadData& data,
                                      const ThreadTimes& times, int64_t now_ns,
                                      std::span<int64_t> values) {
  if (!data.armed) return VisitDecision::kSkip;
  const int64_t elapsed = now_ns - data.last_visit_ns;
  if (elapsed <= 0) return VisitDecision::kSkip;
  const bool ran = times.has_cycles ? times.cycles != data.last_cycles
                                    : times.cpu_ns != data.last_cpu_ns;
  data.last_visit_ns = now_ns;
  data.last_cpu_ns = times.cpu_ns;
  data.last_cycles = times.cycles;
  data.blocked = !ran;
  values[0] = 1;
  values[1] = elapsed;
  // Without a cycle counter a run shorter than the CPU clock's step is
  // invisible: the stack is taken at every visit.
  if (!times.has_cycles) return VisitDecision::kSample;
  return ran ? VisitDecision::kSample : VisitDecision::kSameStack;
}

bool WallTimeProvider::TakeTail(ThreadContext& /*thread*/, ThreadData& data,
                                const ThreadTimes& /*times*/, int64_t now_ns,
                                std::span<int64_t> values) {
  if (!data.armed) return false;
  data.armed = false;
  const int64_t elapsed = now_ns - data.last_visit_ns;
  if (elapsed <= 0) return false;
  data.last_visit_ns = now_ns;
  values[0] = 0;
  values[1] = elapsed;
  return true;
}

}  // namespace inprof
