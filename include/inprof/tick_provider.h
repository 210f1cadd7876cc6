// inprof/tick_provider.h: what the profiler's wall ticker asks of a
// provider it drives (Linux; WallTimeProvider is the one in the library).
//
// Defines: TickTime (when a visit happens, and the weights of a wake-up),
// TickDecision (what a visit asks the profiler to do), RoundWeight, and
// the concepts a ticking provider models: TicksThreads and its optional
// capabilities (NamesSigwaitFrame, ReportsSteadyVisits, ReportsRoundWeight,
// EndsRounds, FollowsRunningThreads, ReadsBlockedStacks).
//
// Thread-safety: the ticker calls a provider's ticking functions on its
// own thread with the profiler's registry lock held; never in a signal
// handler.
//
// Example (a provider that ticks; internal/wall_ticker.h drives it):
//   static_assert(inprof::TicksThreads<inprof::WallTimeProvider>);
#ifndef INPROF_TICK_PROVIDER_H_
#define INPROF_TICK_PROVIDER_H_

#include <cstddef>
#include <cstdint>
#include <span>

#include "absl/time/time.h"
#include "inprof/internal/thread_info.h"
#include "inprof/sample_provider.h"

namespace inprof {

// Optional capability of a provider: it is driven by the profiler's ticker
// thread rather than by per-thread timers.
//   (1) p.TickPeriod() -> absl::Duration (zero: never ticks);
//   (2) p.ThreadsPerTick() -> size_t;
//   (3) p.VisitThread(ThreadContext&, ThreadData&, TickTime when,
//       bool has_episode_stack, bool has_running_sample,
//       std::span<int64_t> values) -> TickDecision
//       (has_episode_stack: the profiler holds the stack of the thread's
//       current blocking episode; has_running_sample: a provider that
//       SamplesRunningThreads took a sample of the thread since this
//       provider's previous visit, whose stack the profiler can credit);
//   (4) p.AwaitsEpisodeStack(ThreadData&) -> bool: a sample that will give
//       that stack was asked for (the profiler drains the thread's ring).
// When a visit happens. `scheduled_ns` is when the ticker meant to wake
// (its random schedule); `now_ns` when it did (CLOCK_MONOTONIC, both;
// scheduled_ns <= now_ns). A visit credits the wall time between the
// scheduled times of its thread's visits, not between the times they
// happened: on a busy machine the ticker wakes late, later when the
// threads it samples are running (they are the load it waits behind), so
// real intervals ending in a running look are longer -- measured with 8
// threads alternating 5 ms of sleep and 5 ms of spinning beside two busy
// loops: 0.6-1.1 points of the sleep share moved to the spinning stack.
// The schedule does not depend on the threads.
struct TickTime {
  int64_t now_ns = 0;
  int64_t scheduled_ns = 0;
  // The weight of a visit whose thread's account is estimated (a first
  // visit; with round_weights, every visit of a thread never followed),
  // fixed when it is taken (WallTicker::VisitNext): its share of the
  // threads' time since the last wake-up, or the round's time at the
  // ticker's rate (WallTicker::RoundEstimate). 0: not known (tests): the
  // first visit credits the time since the thread was armed.
  int64_t round_ns = 0;
  // The registered threads' time since the ticker's previous wake-up
  // (thread-ns of real time; 0 at the first, or not known), which
  // WallTicker::VisitNext hands out: the threads that keep their own
  // account (KeepsOwnAccounts) left out.
  double thread_ns = 0;
  // Up to when the wake-ups handed out the threads' time (the last that
  // did, WallTicker::VisitNext; 0: none). A thread whose own account begins
  // at a wake-up that visits every thread credits its time from there: its
  // time before was in the shares already.
  int64_t handed_ns = 0;
  // Set by WallTicker::VisitNext when a wake-up visits only some of the
  // threads: every visit of a thread not followed weighs round_ns. Else
  // (every thread visited at each wake-up; tests) a thread's visits after
  // its first credit the time since its previous one.
  bool round_weights = false;
  // How many base periods apart the ticker's wake-ups come now, a batch's
  // worth counted as one: the back-off after steady rounds, times how late
  // the ticker wakes (ProfilerBase::Tick); 1 for the period itself.
  double pace = 1;
  // A visit ahead of the round robin (ProfilerBase::wall_due_: the thread
  // ran and was not visited for a round). Chosen because the thread runs,
  // so it is no sample of where the thread is: it only begins following
  // (or visits a followed thread), never credits a weight.
  bool out_of_round = false;
  // A visit made when it was meant to (tests, and callers without a
  // schedule).
  static TickTime At(int64_t ns) { return TickTime{ns, ns}; }
};

enum class TickDecision {
  kSkip,           // nothing to record now (time owed to a signal in flight)
  kSignal,         // send the profiling signal; OnSignal records the sample
  kSignalBlocked,  // the same for a blocked thread: a new blocking episode
  kCreditBlocked,  // add `values` to the episode's stack, no signal
  kCreditRunning,  // add `values` (labelled running) to the stack of the
                   // running sample taken in the interval, no signal
  kFollowing,      // nothing now: the thread runs throughout and its running
                   // samples carry its wall time (FollowRunningSample)
  kCreditSigwait,  // add `values` to kSigwaitFrame, no signal: the thread
                   // waits in sigwait/sigwaitinfo/sigtimedwait, which would
                   // take the signal as one of its own
};

template <typename P>
concept TicksThreads =
    SampleProvider<P> &&
    requires(P& p, ThreadContext& thread, typename P::ThreadData& data,
             std::span<int64_t> values) {
      { p.TickPeriod() } -> std::convertible_to<absl::Duration>;
      { p.ThreadsPerTick() } -> std::convertible_to<size_t>;
      { p.VisitThread(thread, data, TickTime{}, bool{}, bool{}, values) }
          -> std::same_as<TickDecision>;
      { p.AwaitsEpisodeStack(data) } -> std::convertible_to<bool>;
    };

// Optional, for a ticking provider:
//
// NamesSigwaitFrame: `static constexpr const char* P::kSigwaitFrame`, where
// kCreditSigwait's values go (else kTailFrame).
template <typename P>
concept NamesSigwaitFrame = TicksThreads<P> && requires {
  { P::kSigwaitFrame } -> std::convertible_to<const char*>;
};

// ReportsSteadyVisits: `static bool P::SteadyVisit(const ThreadData&)`,
// after a visit: the thread is followed, or blocked without having run
// since. A whole round of steady visits lets the ticker wake less often.
template <typename P>
concept ReportsSteadyVisits =
    TicksThreads<P> && requires(const typename P::ThreadData& data) {
      { P::SteadyVisit(data) } -> std::convertible_to<bool>;
    };

// What a visit did with TickTime::round_ns: credited it (or owes it to a
// signal); not needed it (the thread keeps its own account: KeepsOwnAccounts;
// its share goes to the other visits); found the thread ended (its time is
// its tail's: no share); found it not armed yet (its share goes to the
// other visits: WallTicker::VisitNext).
enum class RoundWeight { kTaken, kOwnAccount, kEnded, kNotYet };

// KeepsOwnAccounts: `static bool P::OwnAccount(const ThreadData&)`, after a
// visit: the thread's wall time is credited by its own visits and tail from
// now on (ThreadData::exact), not by shares of the threads' time. The
// ticker then counts it out of the time it hands out (TickerPacing::
// BeginOwnAccounts), or it would be credited twice.
template <typename P>
concept KeepsOwnAccounts =
    TicksThreads<P> && requires(const typename P::ThreadData& data) {
      { P::OwnAccount(data) } -> std::convertible_to<bool>;
    };

// ReportsRoundWeight: `static RoundWeight P::RoundWeightUse(const
// ThreadData&)`, after a visit. Without it: kTaken.
template <typename P>
concept ReportsRoundWeight =
    TicksThreads<P> && requires(const typename P::ThreadData& data) {
      { P::RoundWeightUse(data) } -> std::same_as<RoundWeight>;
    };

// EndsRounds: `void p.EndRound(int64_t now_ns, size_t threads, size_t
// looked)`, after each wake-up with threads: it looked at `looked` of
// `threads` threads round robin. A thread weighed at a visit since it was
// armed that ends owes its time from the last wake-up before its end to
// its end over its chance of such a visit (WallTimeProvider::TakeTail).
template <typename P>
concept EndsRounds = TicksThreads<P> && requires(P& p) {
  p.EndRound(int64_t{}, size_t{}, size_t{});
};

// FollowsRunningThreads: `static bool P::FollowRunningSample(ThreadData&,
// int64_t cpu_ns, std::span<int64_t> values)`: a running sample (of a
// provider that SamplesRunningThreads) drained for a thread the provider
// follows carries its wall time; true when `values` are to be added to
// that sample's stack.
template <typename P>
concept FollowsRunningThreads =
    TicksThreads<P> &&
    requires(typename P::ThreadData& data, std::span<int64_t> values) {
      { P::FollowRunningSample(data, int64_t{}, values) } -> std::convertible_to<bool>;
    };

// ReadsBlockedStacks: the provider knows where a blocked thread waits, so
// that the ticker can copy its stack instead of signalling it:
//   (1) P::EpisodeSite(data) -> internal::SyscallSite, the pc and sp of its
//       system call;
//   (2) P::LookClock(data) -> int64_t, its CPU clock when the visit looked;
//   (3) p.TakeStackRead(data, values) -> bool: the sample's values, when the
//       copy was walked (false: signal it after all).
template <typename P>
concept ReadsBlockedStacks =
    TicksThreads<P> &&
    requires(P& p, typename P::ThreadData& data, std::span<int64_t> values) {
      { P::EpisodeSite(data) } -> std::same_as<internal::SyscallSite>;
      { P::LookClock(data) } -> std::convertible_to<int64_t>;
      { p.TakeStackRead(data, values) } -> std::convertible_to<bool>;
    };

}  // namespace inprof

#endif  // INPROF_TICK_PROVIDER_H_
