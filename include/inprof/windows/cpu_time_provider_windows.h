// inprof/windows/cpu_time_provider_windows.h: CpuTimeProvider on Windows,
// the dd-win-prof seed's CPU sampling.
//
// Every cpu_period the sampler reads each registered thread's CPU time
// (GetThreadTimes, without stopping it) and samples the threads whose CPU
// crossed one of its sample points since their last sample: points one
// period apart, the first drawn uniformly in (0, period] of its CPU after
// arming, each worth one period (internal/cpu_lattice.h, as on Linux), so a
// thread's expected CPU in the profile is its CPU however little it uses.
// At most ThreadsPerTick() threads are sampled a tick (the machine's
// logical processors: no more threads can have run at once; threads that
// ran at their last visit are read first, see kIdleVisitsPerTick); a
// thread left over keeps its points for its next sample. Points crossed
// that no sample took when the thread stops (TakeTail) go to its last
// stack. The samples fall where the thread was when Windows' accounting
// had last advanced its clock (each clock tick, 15.6 ms by default).
//
// Thread-safety: called by the profiler under its registry lock.
//
// Example:
//   using MyProfiler = inprof::Profiler<inprof::OsUnwinder,
//                                       inprof::DefaultSampleRing,
//                                       inprof::CpuTimeProvider>;
#ifndef INPROF_WINDOWS_CPU_TIME_PROVIDER_WINDOWS_H_
#define INPROF_WINDOWS_CPU_TIME_PROVIDER_WINDOWS_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "inprof/options.h"
#include "inprof/windows/sample_provider_windows.h"

namespace inprof {

class CpuTimeProvider {
 public:
  static constexpr const char* kName = "cpu";
  static constexpr std::array<SampleTypeSpec, 2> kSampleTypes{
      {{"cpu-samples", "count"}, {"cpu-time", "nanoseconds"}}};
  static constexpr size_t kPeriodTypeIndex = 1;

  struct ThreadData {
    bool armed = false;
    int64_t next_due_ns = 0;  // the thread's CPU time at its next sample point
  };

  // With more registered threads than this, the sampler reads the clocks
  // of the threads that did not run at their last visit this many a tick,
  // round-robin, and those that did every tick: 1,000 idle threads cost 32
  // reads a tick, not 1,000 (~7 us each under Wine), and a thread that
  // starts running is seen within n / 32 ticks (its CPU until then goes to
  // the stack it is seen at).
  static constexpr size_t kIdleVisitsPerTick = 32;

  absl::Status Configure(const Options& options);
  int64_t Period() const { return period_ns_; }
  size_t IdleVisitsPerTick() const { return kIdleVisitsPerTick; }
  absl::Duration TickPeriod() const { return absl::Nanoseconds(period_ns_); }
  size_t ThreadsPerTick() const { return threads_per_tick_; }
  absl::Status ArmThread(ThreadContext& thread, ThreadData& data,
                         const ThreadTimes& times, int64_t now_ns);
  VisitDecision Visit(ThreadContext& thread, ThreadData& data,
                      const ThreadTimes& times, int64_t now_ns,
                      std::span<int64_t> values);
  bool TakeTail(ThreadContext& thread, ThreadData& data, const ThreadTimes& times,
                int64_t now_ns, std::span<int64_t> values);
  // "cpu engine=thread-times period=10ms threads-per-tick=8", for the
  // profile's comments.
  std::string Describe() const;

 private:
  int64_t period_ns_ = 10'000'000;
  size_t threads_per_tick_ = 1;
  absl::BitGen bitgen_;  // first sample points (the sampler thread's)
};
static_assert(SampleProvider<CpuTimeProvider>);
static_assert(ReportsTail<CpuTimeProvider>);
static_assert(SparesIdleThreads<CpuTimeProvider>);

}  // namespace inprof

#endif  // INPROF_WINDOWS_CPU_TIME_PROVIDER_WINDOWS_H_
