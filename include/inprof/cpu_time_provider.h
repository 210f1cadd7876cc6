// inprof/cpu_time_provider.h: samples each thread by its own CPU time.
//
// Each registered thread gets a POSIX timer on its CPU clock
// (pthread_getcpuclockid) that delivers the profiling signal to that thread
// alone (SIGEV_THREAD_ID) every `cpu_period` of CPU it uses. Unlike a
// process-wide setitimer, every thread is sampled in proportion to its own
// CPU on any number of cores, and an idle thread costs nothing: its clock
// does not advance, so its timer never fires.
//
// Each sample is worth the CPU time the thread used since its previous sample
// (read from the thread's clock in the handler), so timer overruns, tick
// granularity and late delivery never bias the total: the profile's CPU sum
// equals the threads' CPU up to their last sample. The first expiry is
// randomised within one period so threads shorter than a period are sampled
// fairly.
//
// Thread-safety: see sample_provider.h. OnSignal is async-signal-safe.
//
// Example:
//   using MyProfiler = inprof::Profiler<inprof::FramePointerUnwinder,
//                                       inprof::DefaultSampleRing,
//                                       inprof::CpuTimeProvider>;
#ifndef INPROF_CPU_TIME_PROVIDER_H_
#define INPROF_CPU_TIME_PROVIDER_H_

#include <time.h>

#include <array>
#include <atomic>
#include <cstdint>

#include "absl/random/random.h"
#include "absl/status/status.h"
#include "inprof/sample_provider.h"

namespace inprof {

class CpuTimeProvider {
 public:
  static constexpr const char* kName = "cpu";
  // Datadog's native profiler names these the same way.
  static constexpr std::array<SampleTypeSpec, 2> kSampleTypes{
      {{"cpu-samples", "count"}, {"cpu-time", "nanoseconds"}}};
  static constexpr size_t kPeriodTypeIndex = 1;

  struct ThreadData {
    timer_t timer{};
    bool armed = false;
    // The thread's CPU clock at its last sample. Written by ArmThread before
    // the timer exists and by the handler after; the kernel orders the two
    // (timer_settime, then the signal), which ThreadSanitizer cannot see, so
    // it is a relaxed atomic (a plain load and store on x86-64).
    std::atomic<int64_t> last_cpu_ns{0};
    bool tail_pending = false;  // armed since the last TakeTail
  };

  absl::Status Configure(const Options& options);
  int64_t Period() const { return period_ns_; }
  absl::Status ArmThread(ThreadContext& thread, ThreadData& data, int tag);
  void DisarmThread(ThreadContext& thread, ThreadData& data) noexcept;
  static bool OnSignal(ThreadContext& thread, ThreadData& data,
                       const siginfo_t& info,
                       std::span<int64_t> values) noexcept;
  // CPU used since the last sample: {0 samples, nanoseconds}.
  bool TakeTail(ThreadContext& thread, ThreadData& data,
                std::span<int64_t> values);

 private:
  int64_t period_ns_ = 10'000'000;
  absl::BitGen bitgen_;  // first-expiry jitter; used under the registry lock
};

static_assert(SampleProvider<CpuTimeProvider>);
static_assert(ReportsTail<CpuTimeProvider>);

}  // namespace inprof

#endif  // INPROF_CPU_TIME_PROVIDER_H_
