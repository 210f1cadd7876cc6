// inprof/windows/cpu_time_provider_windows.h: CpuTimeProvider on Windows,
// the dd-win-prof seed's CPU sampling.
//
// Every cpu_period the sampler reads each registered thread's CPU time
// (GetThreadTimes, without stopping it) and samples the threads whose time
// advanced since their last sample, at most ThreadsPerTick() of them (the
// machine's logical processors: no more threads can have run at once),
// each with the CPU it used since its last sample (threads that ran at
// their last visit are read first; see kIdleVisitsPerTick). A thread left over by
// that limit keeps its CPU for its next sample, so a thread's samples add up
// to its CPU time exactly; the rest at its end (TakeTail) goes to its last
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
    int64_t last_cpu_ns = 0;  // the thread's CPU time at its last sample
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
};
static_assert(SampleProvider<CpuTimeProvider>);
static_assert(ReportsTail<CpuTimeProvider>);

}  // namespace inprof

#endif  // INPROF_WINDOWS_CPU_TIME_PROVIDER_WINDOWS_H_
