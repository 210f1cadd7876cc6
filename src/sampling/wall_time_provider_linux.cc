#include "inprof/wall_time_provider.h"

#include <time.h>

#include "inprof/internal/thread_info.h"

namespace inprof {

int64_t WallTimeProvider::NowNanos() noexcept {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

absl::Status WallTimeProvider::Configure(const Options& options) {
  period_ = options.wall_period;
  threads_per_tick_ = static_cast<size_t>(
      options.wall_threads_per_tick > 0 ? options.wall_threads_per_tick : 1);
  return absl::OkStatus();
}

absl::Status WallTimeProvider::ArmThread(ThreadContext& thread,
                                         ThreadData& data, int /*tag*/) {
  if (period_ == absl::ZeroDuration() || data.armed) return absl::OkStatus();
  data.last_wall_ns = NowNanos();
  data.pending_wall_ns.store(0, std::memory_order_relaxed);
  data.cpu_mark.store(internal::ThreadCpuNanos(thread.cpu_clock),
                      std::memory_order_relaxed);
  data.armed = true;
  data.tail_pending = true;
  return absl::OkStatus();
}

void WallTimeProvider::DisarmThread(ThreadContext&, ThreadData& data) noexcept {
  data.armed = false;
}

bool WallTimeProvider::OnSignal(ThreadContext& thread, ThreadData& data,
                                const siginfo_t&,
                                std::span<int64_t> values) noexcept {
  const int64_t owed = data.pending_wall_ns.exchange(0, std::memory_order_acq_rel);
  data.cpu_mark.store(internal::ThreadCpuNanos(thread.cpu_clock),
                      std::memory_order_release);
  if (owed <= 0) return false;
  values[0] = 1;
  values[1] = owed;
  return true;
}

bool WallTimeProvider::TakeTail(ThreadContext&, ThreadData& data,
                                std::span<int64_t> values) {
  if (!data.tail_pending) return false;
  data.tail_pending = false;
  const int64_t now = NowNanos();
  // Owed to a signal that never ran, plus the time since the last visit.
  const int64_t owed = data.pending_wall_ns.exchange(0) + (now - data.last_wall_ns);
  data.last_wall_ns = now;
  values[0] = 0;
  values[1] = owed;
  return owed > 0;
}

TickDecision WallTimeProvider::VisitThread(ThreadContext& thread,
                                           ThreadData& data, int64_t now_ns,
                                           bool has_last_stack,
                                           std::span<int64_t> values) {
  if (!data.armed) return TickDecision::kSkip;
  const int64_t cpu = internal::ThreadCpuNanos(thread.cpu_clock);
  if (cpu < 0) return TickDecision::kSkip;  // exited without unregistering
  const int64_t elapsed = now_ns - data.last_wall_ns;
  data.last_wall_ns = now_ns;
  if (elapsed <= 0) return TickDecision::kSkip;
  const int64_t mark = data.cpu_mark.load(std::memory_order_acquire);
  const bool blocked = mark >= 0 && cpu - mark <= kBlockedCpuSlackNs;
  if (blocked && has_last_stack) {
    data.cpu_mark.store(cpu, std::memory_order_relaxed);
    values[0] = 1;
    values[1] = elapsed;
    return TickDecision::kCreditBlocked;
  }
  data.pending_wall_ns.fetch_add(elapsed, std::memory_order_acq_rel);
  ++data.signals;
  return TickDecision::kSignal;
}

}  // namespace inprof
