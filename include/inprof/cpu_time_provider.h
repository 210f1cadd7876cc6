// inprof/cpu_time_provider.h: samples each thread by its own CPU time.
//
// The provider turns a registered thread's CPU time into profiling signals
// delivered to that thread, through one of three engines (Options::
// cpu_engine, INPROF_CPU_ENGINE), chosen at Start() along the chain
// perf -> timer -> itimer (async-profiler's engine chain is the model):
//
//   perf    a perf-event task clock per thread (perf_event_open, software
//           event PERF_COUNT_SW_TASK_CLOCK) whose overflow is signalled to
//           that thread (F_SETOWN_EX + F_SETSIG = SIGPROF). The kernel's
//           hrtimer fires after exactly `cpu_period` of the thread's CPU, so
//           1 ms means 1,000 samples per CPU-second. Where the kernel allows
//           it (root, CAP_PERFMON, perf_event_paranoid <= 1) the event also
//           counts kernel mode, and an overflow in a system call is
//           delivered on its return: the syscall's CPU lands on its caller.
//           A user-space-only event (perf_event_paranoid = 2) drops those
//           overflows; the engine then says so, and `auto` prefers timer.
//           One file descriptor per thread, at most Options::perf_fd_share
//           percent of those free under RLIMIT_NOFILE (counted at Start()
//           and again when the program changes its limit); threads beyond
//           that budget use the timer engine. A descriptor the program
//           closed (and maybe reused) is never disabled or closed by inprof
//           (base/owned_fd.h).
//   timer   a POSIX timer on the thread's CPU clock (pthread_getcpuclockid)
//           signalling that thread (SIGEV_THREAD_ID). The kernel checks CPU
//           timers at scheduler ticks, so periods below a tick (4 ms at
//           HZ=250) are delivered one tick apart. Counts kernel mode.
//   itimer  one process-wide ITIMER_PROF: the last resort when a thread
//           timer cannot be created. Signals go to whichever thread runs.
//
// Where samples fall and what they weigh (internal/cpu_lattice.h): the perf
// and timer engines sample each thread at points of its own CPU time one
// period apart, the first drawn uniformly in (0, period] of its CPU after
// arming, and each sample is worth one period per point crossed since the
// previous one (Go's runtime samples the same way). A thread's expected
// CPU in the profile is its CPU, on the stacks where it spent it, however
// little it uses: a thread that lives a tenth of a period has a one-in-ten
// chance of one sample worth a whole period. A late or coalesced signal
// loses nothing (the next sample counts every point crossed), and a
// thread's total differs from its clock by less than one period, with mean
// zero. Points crossed that no signal took by the time the thread stops
// (its signal still in flight; for the timer engine, a thread that ended
// between two scheduler ticks) are credited when it stops (TakeTail), to
// its last stack or, when it had none, to kTailFrame.
//
// The itimer engine keeps its own semantics: the process-wide signal lands
// on whichever thread runs, and each sample is worth the CPU that thread
// used since its previous sample.
//
// The perf engine's first period can be shorter than the kernel's own
// delivery of a signal (measured on a VM: a 10 us period never returned to
// user space). The event is therefore armed for one overflow only
// (PERF_EVENT_IOC_REFRESH): the kernel stops it after the first, and the
// handler restarts it at the steady period.
//
// Thread-safety: see sample_provider.h. OnSignal is async-signal-safe.
// ArmThread and DisarmThread may run for different threads at the same time
// (kArmsConcurrently): the descriptor budget and the counters are atomic, the
// first-expiry generator and the process-wide itimer have locks of their own.
//
// Example:
//   inprof::Options options;
//   options.cpu_engine = inprof::CpuEngine::kPerf;  // or INPROF_CPU_ENGINE
//   using MyProfiler = inprof::Profiler<inprof::FramePointerUnwinder,
//                                       inprof::DefaultSampleRing,
//                                       inprof::CpuTimeProvider>;
//   MyProfiler profiler(options);
#ifndef INPROF_CPU_TIME_PROVIDER_H_
#define INPROF_CPU_TIME_PROVIDER_H_

#if defined(_WIN32)
// Windows: the sampler thread's variant, same names.
#include "inprof/windows/cpu_time_provider_windows.h"
#else

#include <time.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

#include "absl/random/random.h"
#include "absl/status/status.h"
#include "inprof/base/owned_fd.h"
#include "inprof/sample_provider.h"

namespace inprof {

class CpuTimeProvider {
 public:
  static constexpr const char* kName = "cpu";
  // Datadog's native profiler names these the same way.
  static constexpr std::array<SampleTypeSpec, 2> kSampleTypes{
      {{"cpu-samples", "count"}, {"cpu-time", "nanoseconds"}}};
  static constexpr size_t kPeriodTypeIndex = 1;
  // Without PERF_EVENT_IOC_REFRESH, the shortest first period the perf
  // engine arms (a shorter one could keep the thread in signal delivery
  // before its handler lengthens it). Kernels since 2.6.31 have it.
  static constexpr int64_t kPerfFirstPeriodFloorNs = 100'000;
  // Threads are armed and disarmed outside the registry lock (their
  // perf_event_open, fcntl and close system calls).
  static constexpr bool kArmsConcurrently = true;
  // A perf event's opening costs its registering thread ~5 us alone and
  // ~22 us when 1,000 threads register at once (the burst's context
  // switches inflate each of its system calls): in such a burst the
  // sampler opens them (PrepareThread).
  static constexpr bool kArmsInTwoSteps = true;
  // DisarmThread closes or deletes what ArmThread made, which outlives the
  // thread; TakeTail ends at ThreadContext::exit_cpu_ns when it is set.
  static constexpr bool kUnregistersLate = true;
  // The perf and timer engines signal a thread after CPU time of its own,
  // so while it runs: a wall sample of a thread that ran throughout may
  // reuse the stack (sample_provider.h). The itimer engine's process-wide
  // signal may land on another thread; the profiler does not count those
  // (si_code SI_KERNEL).
  static constexpr bool kSamplesRunningThreads = true;

  struct ThreadData {
    ThreadData() = default;
    ThreadData(const ThreadData&) = delete;
    ThreadData& operator=(const ThreadData&) = delete;
    // A forked child inherits the parent's event descriptors; forgetting
    // the parent's slot there closes its copy.
    ~ThreadData();

    CpuEngine engine = CpuEngine::kAuto;  // the engine arming it; kAuto: none
    timer_t timer{};
    int perf_fd = -1;
    // What perf_fd was when opened: it is disabled and closed only if it
    // still is (the program may have closed and reused the number).
    internal::FdIdentity perf_identity;
    bool armed = false;
    // For the handler: the engine whose signals sample the thread (set
    // before its timer starts) and its period.
    std::atomic<CpuEngine> signal_engine{CpuEngine::kAuto};
    // Atomic (relaxed) because ArmThread may run on another thread than
    // the signal handler that reads them; the kernel orders the two (the
    // timer exists after the write), which ThreadSanitizer cannot see.
    std::atomic<int64_t> period_ns{0};
    // The engine of the thread's last arming, kept after DisarmThread: its
    // tail (taken after disarming) is measured the way its samples were.
    CpuEngine tail_engine = CpuEngine::kAuto;
    // Perf and timer engines: the thread's CPU clock at its next sample
    // point (internal/cpu_lattice.h) and (last_cpu_ns) at its last sample,
    // -1 before the first (OwesSample). itimer engine: its CPU clock at its
    // last sample (last_cpu_ns). Written by ArmThread before the timer exists and by the
    // handler after; the kernel orders the two (timer_settime, then the
    // signal), which ThreadSanitizer cannot see, so relaxed atomics (plain
    // loads and stores on x86-64).
    std::atomic<int64_t> next_due_ns{0};
    std::atomic<int64_t> last_cpu_ns{0};
    // Perf engine: armed for one overflow (PERF_EVENT_IOC_REFRESH), which
    // the kernel signals with POLL_HUP after stopping the event; the
    // handler then restarts it at the steady period.
    std::atomic<bool> first_overflow_pending{false};
    std::atomic<int64_t> first_point_ns{0};  // the thread's CPU clock at that overflow
    bool tail_pending = false;  // armed since the last TakeTail
    // PrepareThread ran and ArmThread has not yet opened the thread's
    // event: its sample points count from the preparation.
    bool prepared = false;
  };

  absl::Status Configure(const Options& options);
  int64_t Period() const { return period_ns_; }
  absl::Status ArmThread(ThreadContext& thread, ThreadData& data, int tag);
  // Arming in two steps (sample_provider.h, ArmsInTwoSteps), for the perf
  // engine only: on the registering thread, the thread's first sample point
  // is drawn from its CPU clock now, with no other system call; ArmThread,
  // later on the sampler's thread, opens and routes the event so that it
  // overflows at that point, or at once when the thread's CPU has passed it
  // (that sample takes every point crossed since: the stack the thread is
  // on moments after its arming stands in for its CPU before). From the
  // preparation on, the thread's CPU counts exactly as if it were armed: a
  // thread that ends before its arming has its points taken on the stack
  // it unregisters from (OwesSample) and by its tail. False for the other
  // engines (their arming is cheap): arm now.
  bool PrepareThread(ThreadContext& thread, ThreadData& data);
  void DisarmThread(ThreadContext& thread, ThreadData& data) noexcept;
  static bool OnSignal(ThreadContext& thread, ThreadData& data,
                       const siginfo_t& info,
                       std::span<int64_t> values) noexcept;
  // On the thread: a sample point its CPU crossed has not been taken yet
  // (its signal is on its way). Perf and timer engines; only for a point
  // crossed within the last period, or a thread never sampled: older points
  // (signals that never came: the timer engine on a loaded machine) go to
  // the tail, on the thread's last sampled stack, not on the stack it
  // unregisters from.
  static bool OwesSample(ThreadContext& thread, const ThreadData& data) noexcept;
  // In the handler of another provider's sample of the thread (a wall
  // sample; sample_provider.h: TakesSwallowedSignals): the points the
  // thread's CPU crossed that no CPU signal took, if their signal is
  // overdue (the oldest crossed more than a period ago), are taken by that
  // sample's stack. SIGPROF is not queued, so a perf overflow's signal
  // raised while a wall signal was pending was discarded; one still pending
  // finds nothing left and records nothing. Points crossed within the last
  // period wait for their own signal: a wall signal to a thread that waited
  // for a core lands where the scheduler took it off (clock_gettime, read
  // on this kernel), not where the CPU went. The timer engine's points are
  // never taken here (a POSIX timer's signal is queued behind a pending
  // one). It also restarts a perf event stopped after
  // its first overflow whose signal was discarded that way.
  // Async-signal-safe.
  static bool TakeSwallowed(ThreadContext& thread, ThreadData& data,
                            std::span<int64_t> values) noexcept;
  // CPU used since the last sample: {0 samples, nanoseconds}.
  bool TakeTail(ThreadContext& thread, ThreadData& data,
                std::span<int64_t> values);

  // The engine chosen at Configure (never kAuto once configured).
  CpuEngine engine() const { return engine_; }
  // One line for logs and the profile's comments, e.g. "cpu engine=perf
  // (task-clock, hrtimer, kernel included)".
  std::string Describe() const;
  // Threads armed by each engine since Configure, and those the perf engine
  // handed to the timer engine (file-descriptor budget or perf_event_open
  // failure).
  struct EngineCounts {
    uint64_t perf = 0, timer = 0, itimer = 0, perf_fallbacks = 0;
    int perf_fd_budget = 0;
  };
  EngineCounts counts() const;

 private:
  // `now`: the thread's CPU clock as ArmThread read it; `soft_limit`: the
  // RLIMIT_NOFILE soft limit the descriptor budget read (0: unknown).
  absl::Status ArmPerf(ThreadContext& thread, ThreadData& data, int tag, int64_t now,
                       uint64_t soft_limit);
  absl::Status ArmTimer(ThreadContext& thread, ThreadData& data, int tag);
  absl::Status ArmItimer(ThreadContext& thread, ThreadData& data, int tag);
  // A thread's first sample point: uniform in (0, period] of its CPU.
  int64_t FirstPeriod();
  int64_t FirstExpiry(const ThreadData& data, int64_t origin, int64_t shortest);
  // A prepared thread whose CPU passed its first point: its event's first
  // (and, with PERF_EVENT_IOC_REFRESH, only) short period.
  static constexpr int64_t kPreparedShortestNs = 1'000;

  int64_t period_ns_ = 10'000'000;
  CpuEngine requested_ = CpuEngine::kAuto;
  CpuEngine engine_ = CpuEngine::kTimer;
  bool perf_kernel_ = false;  // the perf event counts kernel mode too
  std::string perf_unavailable_;  // why the perf engine was not chosen
  internal::DescriptorBudget perf_fds_;
  std::mutex itimer_mutex_;
  int itimer_threads_ = 0;  // itimer_mutex_
  std::atomic<uint64_t> armed_perf_{0}, armed_timer_{0}, armed_itimer_{0},
      perf_fallbacks_{0};
  // First sample points (FirstPeriod): a SplitMix64 sequence from a seed
  // drawn at construction, one atomic step per thread armed (no lock: a
  // registering thread in a burst took a contended mutex here).
  std::atomic<uint64_t> first_point_state_{absl::Uniform<uint64_t>(absl::BitGen())};
  // PERF_EVENT_IOC_REFRESH failed once (a kernel without it): first
  // periods are then no shorter than kPerfFirstPeriodFloorNs.
  std::atomic<bool> perf_refresh_failed_{false};
};

static_assert(SampleProvider<CpuTimeProvider>);
static_assert(ReportsTail<CpuTimeProvider>);
static_assert(TakesSwallowedSignals<CpuTimeProvider>);
static_assert(OwesSamples<CpuTimeProvider>);
static_assert(ArmsConcurrently<CpuTimeProvider>);
static_assert(UnregistersLate<CpuTimeProvider>);
static_assert(SamplesRunningThreads<CpuTimeProvider>);
static_assert(ArmsInTwoSteps<CpuTimeProvider>);

}  // namespace inprof

#endif  // !_WIN32

#endif  // INPROF_CPU_TIME_PROVIDER_H_
