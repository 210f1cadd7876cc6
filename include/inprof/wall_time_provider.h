// inprof/wall_time_provider.h: samples every registered thread by wall time,
// running or blocked.
//
// A ticker thread wakes every `wall_period` and visits up to
// `wall_threads_per_tick` registered threads in round-robin (the dd-win-prof
// seed's sampler loop). Each visit is worth the wall time since the thread's
// previous visit, so over a run a thread's wall total equals the time it was
// registered. A thread whose CPU clock has not advanced since it was last
// seen is still blocked where it was: it is credited with its last stack and
// labelled "thread state"="blocked", without a signal, because a signal
// would interrupt epoll_wait/poll/nanosleep with EINTR even under SA_RESTART.
// A thread that ran is signalled and its stack taken in the handler
// ("thread state"="running"). So a thread blocked for a whole run sees at
// most one signal, the first time it is visited.
//
// Thread-safety: see sample_provider.h. VisitThread runs on the ticker
// thread under the registry lock; OnSignal in the handler. They share only
// pending_wall_ns and cpu_mark, which are atomics.
//
// Example:
//   inprof::Options options;
//   options.wall_period = absl::Milliseconds(10);
//   options.wall_threads_per_tick = 5;
//   inprof::DefaultProfiler profiler(options);   // CPU + wall
#ifndef INPROF_WALL_TIME_PROVIDER_H_
#define INPROF_WALL_TIME_PROVIDER_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "inprof/sample_provider.h"

namespace inprof {

// Optional capability of a provider: it is driven by the profiler's ticker
// thread rather than by per-thread timers.
//   (1) p.TickPeriod() -> absl::Duration (zero: never ticks);
//   (2) p.ThreadsPerTick() -> size_t;
//   (3) p.VisitThread(ThreadContext&, ThreadData&, int64_t now_ns,
//       bool has_last_stack, std::span<int64_t> values) -> TickDecision.
enum class TickDecision {
  kSkip,           // nothing to record
  kSignal,         // send the profiling signal; OnSignal records the sample
  kCreditBlocked,  // add `values` to the thread's last stack, no signal
};

template <typename P>
concept TicksThreads =
    SampleProvider<P> &&
    requires(P& p, ThreadContext& thread, typename P::ThreadData& data,
             std::span<int64_t> values) {
      { p.TickPeriod() } -> std::convertible_to<absl::Duration>;
      { p.ThreadsPerTick() } -> std::convertible_to<size_t>;
      { p.VisitThread(thread, data, int64_t{}, bool{}, values) }
          -> std::same_as<TickDecision>;
    };

class WallTimeProvider {
 public:
  static constexpr const char* kName = "wall";
  // Datadog's native profiler names these the same way.
  static constexpr std::array<SampleTypeSpec, 2> kSampleTypes{
      {{"wall-samples", "count"}, {"wall-time", "nanoseconds"}}};
  static constexpr size_t kPeriodTypeIndex = 1;
  static constexpr const char* kTailFrame =
      "[inprof: wall time since the thread's last sample]";
  // Label on every wall sample.
  static constexpr const char* kStateLabel = "thread state";
  static constexpr const char* kRunning = "running";
  static constexpr const char* kBlocked = "blocked";
  // CPU a thread may use between two looks and still count as blocked: the
  // handler's own unwinding and sigreturn, and an interrupted sleep's retry,
  // cost a few microseconds (bench/profiler_benchmark.cc: ~1 us per sample).
  static constexpr int64_t kBlockedCpuSlackNs = 50'000;

  struct ThreadData {
    bool armed = false;
    bool tail_pending = false;
    int64_t last_wall_ns = 0;  // ticker: monotonic time of the last visit
    // Wall time owed to the next handler run (ticker adds, handler takes);
    // accumulates if a signal is lost while another SIGPROF is pending.
    std::atomic<int64_t> pending_wall_ns{0};
    // The thread's CPU clock when it was last seen: by the handler at the
    // end of a sample, or by the ticker when it credited a blocked thread.
    std::atomic<int64_t> cpu_mark{-1};
    uint64_t signals = 0;  // signals sent to the thread (ticker)
  };

  absl::Status Configure(const Options& options);
  int64_t Period() const { return absl::ToInt64Nanoseconds(period_); }
  absl::Status ArmThread(ThreadContext& thread, ThreadData& data, int tag);
  void DisarmThread(ThreadContext& thread, ThreadData& data) noexcept;
  static bool OnSignal(ThreadContext& thread, ThreadData& data,
                       const siginfo_t& info,
                       std::span<int64_t> values) noexcept;
  bool TakeTail(ThreadContext& thread, ThreadData& data,
                std::span<int64_t> values);

  absl::Duration TickPeriod() const { return period_; }
  size_t ThreadsPerTick() const { return threads_per_tick_; }
  TickDecision VisitThread(ThreadContext& thread, ThreadData& data,
                           int64_t now_ns, bool has_last_stack,
                           std::span<int64_t> values);

  // Monotonic nanoseconds (CLOCK_MONOTONIC). Async-signal-safe.
  static int64_t NowNanos() noexcept;

 private:
  absl::Duration period_ = absl::Milliseconds(10);
  size_t threads_per_tick_ = 5;
};

static_assert(SampleProvider<WallTimeProvider>);
static_assert(ReportsTail<WallTimeProvider>);
static_assert(TicksThreads<WallTimeProvider>);

}  // namespace inprof

#endif  // INPROF_WALL_TIME_PROVIDER_H_
