// inprof/windows/wall_time_provider_windows.h: WallTimeProvider on Windows.
//
// Every wall_period the sampler visits up to wall_threads_per_tick
// registered threads, round-robin, running or not (wall time counts a
// thread that waits as much as one that runs), and credits each with
// the wall time since its previous visit. A thread that ran since then is
// suspended and its stack taken ("thread state" = running); one that did
// not run is where it was: its last stack is credited without suspending
// it ("blocked"). Whether it ran is read from QueryThreadCycleTime, which
// counts any run however short; where that fails (Wine 8) the CPU time
// cannot tell a short run (Wine advances it every 10 ms), so every visit
// takes the stack.
//
// Thread-safety: called by the profiler under its registry lock.
//
// Example:
//   inprof::Options options;
//   options.wall_period = absl::Milliseconds(20);  // zero: no wall samples
#ifndef INPROF_WINDOWS_WALL_TIME_PROVIDER_WINDOWS_H_
#define INPROF_WINDOWS_WALL_TIME_PROVIDER_WINDOWS_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "inprof/internal/label_table.h"
#include "inprof/options.h"
#include "inprof/windows/sample_provider_windows.h"

namespace inprof {

class WallTimeProvider {
 public:
  static constexpr const char* kName = "wall";
  static constexpr std::array<SampleTypeSpec, 2> kSampleTypes{
      {{"wall-samples", "count"}, {"wall-time", "nanoseconds"}}};
  static constexpr size_t kPeriodTypeIndex = 1;
  static constexpr const char* kTailFrame =
      "[inprof: wall time since the thread's last sample]";
  static constexpr const char* kStateLabel = internal::kThreadState;
  static constexpr const char* kRunning = internal::kThreadRunning;
  static constexpr const char* kBlocked = internal::kThreadBlocked;

  struct ThreadData {
    bool armed = false;
    bool blocked = false;     // the latest visit found it had not run
    int64_t last_visit_ns = 0;
    int64_t last_cpu_ns = 0;
    uint64_t last_cycles = 0;
  };

  absl::Status Configure(const Options& options);
  int64_t Period() const { return absl::ToInt64Nanoseconds(period_); }
  absl::Duration TickPeriod() const { return period_; }
  size_t ThreadsPerTick() const { return threads_per_tick_; }
  absl::Status ArmThread(ThreadContext& thread, ThreadData& data,
                         const ThreadTimes& times, int64_t now_ns);
  VisitDecision Visit(ThreadContext& thread, ThreadData& data,
                      const ThreadTimes& times, int64_t now_ns,
                      std::span<int64_t> values);
  bool TakeTail(ThreadContext& thread, ThreadData& data, const ThreadTimes& times,
                int64_t now_ns, std::span<int64_t> values);
  static bool SampledBlocked(const ThreadData& data) { return data.blocked; }

 private:
  absl::Duration period_ = absl::Milliseconds(10);
  size_t threads_per_tick_ = 5;
};
static_assert(SampleProvider<WallTimeProvider>);
static_assert(ReportsTail<WallTimeProvider>);
static_assert(LabelsThreadState<WallTimeProvider>);
static_assert(NamesTailFrame<WallTimeProvider>);

}  // namespace inprof

#endif  // INPROF_WINDOWS_WALL_TIME_PROVIDER_WINDOWS_H_
