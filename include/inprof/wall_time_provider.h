// inprof/wall_time_provider.h: samples every registered thread by wall time,
// running or blocked.
//
// A ticker thread wakes at random intervals averaging `wall_period`
// (uniform in [0.5, 1.5] x the period, so its visits never lock onto a program's own
// rhythm: a thread alternating 5 ms of sleep and 5 ms of work is seen half
// and half) and visits up to `wall_threads_per_tick` registered threads in
// round-robin (the dd-win-prof seed's sampler loop).
//
// A visit's weight is fixed when it is taken. When a wake-up visits only
// some of the n registered threads (k of them, round robin), it hands the
// time since the previous wake-up of the threads still there (the count
// integrated over real time: TickTime::thread_ns) out to its visits in
// equal shares (Horvitz-Thompson: a thread visited with chance k/n weighs
// n/k intervals; a visit that credits nothing leaves its share to the
// others, WallTicker::VisitNext). A thread that ends between two wake-ups
// is not in that time: its tail credits its time from the last wake-up
// before its end to its end over c, its chance of a visit since it was
// armed (the rounds the wake-ups covered, at most 1), when a visit did
// weigh it, to the stack that visit left (TakeTail, EndsRounds). So each
// wake-up credits the threads' time, the ended ones' in expectation, and
// each export window (a wake-up is made at its edge,
// WallTickerThread::TickNow) holds the threads' lifetimes in it; a
// thread's expected wall time on a stack is the time it spent there (the
// round robin's phase against its start and end is arbitrary). The
// variance: a thread visited m times is credited m shares of about a round
// R, so its total is within about a round of its lifetime; over N threads
// with independent phases the errors' sum has standard deviation about
// R sqrt(N/6) (10,000 threads, R = 20 s, 3 s each: 816 s of 30,000 s,
// 2.7%), while the total per window is exact up to the wake-ups at its
// edges and the ended threads' tails: M threads ending within an interval
// of the wake-ups, each with chance c, sum to their time within a relative
// standard deviation of about 1.15 sqrt((1 - c) / (c M)) (10,000 threads
// after 3 s, c ~ 0.1: 3.5% of that time). When every thread is visited at
// each wake-up (few threads), a visit weighs the time since the thread's
// previous visit (between the ticker's scheduled wake-ups, TickTime) and
// its first a round at the ticker's pace (TickTime::round_ns). A thread
// once followed (below) keeps an exact account instead
// (ThreadData::exact): its running samples carry its wall time as it goes,
// and its visits settle the rest exactly. Its own account begins at a
// wake-up, and from then on the ticker counts it out of the time it hands
// out (OwnAccount, TickerPacing::BeginOwnAccounts): the visit that begins
// it in the round takes its share for the time before, as any visit. Time no visit could take --
// threads that registered and ended between two wake-ups, with no thread
// left to carry it -- is counted (ProfilerStats::wall_unattributed_ns) and
// shown in the comments.
//
// A visit reads the thread's state from the kernel rather than guessing it,
// in one read of /proc/self/task/TID/syscall ("running", or where the
// thread waits: internal::LookAtThread):
//   - running or runnable ('R'): the thread is signalled and its stack taken
//     in the handler, labelled "thread state"="running";
//   - running throughout the interval since the previous visit (its CPU
//     clock advanced by >= kRanThroughoutPercent of the wall time): no
//     /proc read, and, when the profiler holds the stack of a sample that
//     a CPU provider took of the thread within that interval, no signal
//     either: the interval is credited to that stack, labelled "running"
//     (a thread that ran throughout spent its wall time where it spent its
//     CPU; a CPU sample falls at a random point of its running, as a wall
//     signal would). A busy thread then costs the wall sampler a clock read
//     per visit instead of a second signal and a second walk;
//   - blocked (sleeping, in I/O, stopped): the first visit of a blocking
//     episode learns where it blocks (that sample is labelled "blocked"):
//     the profiler reads the stack from a copy where it can
//     (ReadBlockedStack), else signals the thread once; later visits of the
//     same episode credit that stack without either, because a signal
//     interrupts epoll_wait, poll or nanosleep with EINTR even under
//     SA_RESTART (the profiler samples an episode once more when that first
//     stack was walked before the unwind tables it needed existed:
//     UnwindResult::provisional). The episode goes on while the thread
//     waits where it was seen and has not run since: its CPU clock moved by
//     at most kBlockedCpuSlackNs since the last look (or since inprof's
//     handler last returned on it), and the same system call from the same
//     stack pointer and pc (/proc/self/task/TID/syscall) where that can be
//     read. A thread that ran and waits again at the same sp and pc (a
//     sleep loop, an event loop) begins a new episode: any caller at the
//     same depth reaches that sp and pc, and crediting the old episode's
//     stack gave each such thread's time to its first episode's stack. Its
//     stack is then read again, or, where it cannot be read, it is
//     signalled: an EINTR for a thread that ran since its last one, never
//     two in one wait.
// So a thread blocked for a whole run sees one signal, however long the run.
//
// A thread found running throughout an interval in which a CPU provider
// sampled it is *followed*: from then on each of its running samples is
// also worth its CPU time as wall time, on its own stack, labelled running
// (FollowRunningSample, called as the profiler drains the sample), and a
// visit credits only the balance (the interval's wall time less what those
// samples carried) to the newest running sample's stack -- or carries it
// over to the next visit. A followed thread is never signalled for wall
// time, and its wall profile has as many distinct stacks as its CPU
// profile, however seldom it is visited. The first visit that does not find
// it running throughout ends the following; the balance then goes where the
// thread is (blocked: that episode's stack).
//
// SteadyVisit says whether the last visit found nothing new (a followed
// thread, or a blocked one that has not run): when a whole round of visits
// is steady the profiler's ticker wakes less often (profiler.h), since
// neither kind of thread needs a visit to be profiled right.
//
// Thread-safety: see sample_provider.h. VisitThread runs on the ticker
// thread under the registry lock; OnSignal in the handler.
// They share only atomics.
//
// Example:
//   inprof::Options options;
//   options.wall_period = absl::Milliseconds(10);
//   options.wall_threads_per_tick = 5;
//   inprof::DefaultProfiler profiler(options);   // CPU + wall
#ifndef INPROF_WALL_TIME_PROVIDER_H_
#define INPROF_WALL_TIME_PROVIDER_H_

#if defined(_WIN32)
// Windows: the sampler thread's variant, same names.
#include "inprof/windows/wall_time_provider_windows.h"
#else

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <span>
#include <utility>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "inprof/base/owned_fd.h"
#include "inprof/internal/label_table.h"
#include "inprof/internal/thread_info.h"
#include "inprof/sample_provider.h"
#include "inprof/tick_provider.h"

namespace inprof {

class WallTimeProvider {
 public:
  static constexpr const char* kName = "wall";
  // Datadog's native profiler names these the same way.
  static constexpr std::array<SampleTypeSpec, 2> kSampleTypes{
      {{"wall-samples", "count"}, {"wall-time", "nanoseconds"}}};
  static constexpr size_t kPeriodTypeIndex = 1;
  static constexpr const char* kTailFrame =
      "[inprof: wall time since the thread's last sample]";
  // Where the wall time of a thread waiting in sigwait, sigwaitinfo or
  // sigtimedwait goes. Such a wait dequeues any signal of its set that
  // arrives, blocked or not: a signal thread that waits for every signal
  // (a server's usual shape) would take inprof's SIGPROF as one of its
  // own. So it is never signalled, and its stack is not known.
  static constexpr const char* kSigwaitFrame =
      "[inprof: waiting for signals in sigwait (not signalled: the wait "
      "would take inprof's signal)]";
  // Label on every wall sample.
  static constexpr const char* kStateLabel = internal::kThreadState;
  static constexpr const char* kRunning = internal::kThreadRunning;
  static constexpr const char* kBlocked = internal::kThreadBlocked;
  // CPU a blocked thread may use between two looks and still be in the same
  // blocking episode: the kernel's signal delivery and sigreturn after the
  // handler has marked its clock, and an interrupted sleep's retry, cost a
  // few microseconds.
  static constexpr int64_t kBlockedCpuSlackNs = 50'000;
  // A thread that used at least this share (percent) of the wall time since
  // the last look as CPU is taken to be running without reading its state:
  // one that blocked within the last 3% of the interval is then sampled as
  // running, once (its next look sees the wait).
  static constexpr int64_t kRanThroughoutPercent = 97;
  // A signal whose sample has not been taken after this long was lost (a
  // pending SIGPROF swallows a queued one; one pending for a CPU sample
  // gives the wall time to that sample: TakeSwallowed): the thread is
  // signalled again -- once it has run since (VisitThread).
  static constexpr int64_t kSignalLostAfterNs = 200'000'000;
  // ArmThread and DisarmThread touch only the thread's own data.
  static constexpr bool kArmsConcurrently = true;
  // TakeTail ends at ThreadContext::exit_wall_ns when it is set.
  static constexpr bool kUnregistersLate = true;

  struct ThreadData {
    bool armed = false;
    bool tail_pending = false;
    // Ticker: the scheduled time of the last visit (TickTime), up to which
    // the thread's wall time is credited.
    int64_t last_wall_ns = 0;
    // Ticker: when the last look at its CPU clock happened (cpu_mark's
    // wall time): whether it ran throughout is judged on real time.
    int64_t last_look_ns = 0;
    // Wall time owed to the next handler run (ticker adds, handler takes);
    // accumulates if a signal is lost while another SIGPROF is pending.
    std::atomic<int64_t> pending_wall_ns{0};
    // The thread's CPU clock when the ticker last looked.
    std::atomic<int64_t> cpu_mark{-1};
    // Set by the ticker before it signals: the sample is of a blocked thread.
    std::atomic<bool> signal_blocked{false};
    // A blocked thread was signalled and its episode's stack is on its way
    // (ticker).
    bool blocked_signal_sent = false;
    // Where the episode whose stack the profiler holds was blocked.
    internal::SyscallSite episode_site;
    int64_t signal_sent_ns = 0;  // ticker: when the last signal was sent
    int64_t signal_sent_clock = -1;  // ticker: the thread's CPU clock then
    bool last_look_blocked = false;  // ticker
    uint64_t signals = 0;  // signals sent to the thread (ticker)
    // Following (ticker, drains and TakeTail, all under the registry lock;
    // never ArmThread, which may run outside it): the thread's running
    // samples carry its wall time; the wall time they carried since the
    // last visit, and the balance owed (+) or credited ahead (-) to the
    // thread.
    bool following = false;
    int64_t followed_ns = 0;
    int64_t follow_balance_ns = 0;
    bool steady_visit = false;  // ticker: the last visit found nothing new
    // Ticker: what the last visit did with TickTime::round_ns.
    RoundWeight round_weight = RoundWeight::kNotYet;
    // Ticker: no visit has credited the thread since it was armed; its
    // first weighs TickTime::round_ns.
    bool fresh = true;
    // Ticker: a visit since it was armed weighed it (round_weight kTaken),
    // when the provider's rounds_covered_ was covered_at_arm; a thread that
    // ends then owes its time since the last wake-up (TakeTail).
    bool weighed = false;
    double covered_at_arm = 0;  // ArmThread
    // Ticker, drains and TakeTail (registry lock): the thread was followed,
    // or visited at a wake-up that visited every thread (its visit then
    // credited the time since the previous one, or since it was armed),
    // since it was armed. From then on its account is exact, interval by
    // interval: its visits credit the time since the previous one, the
    // following's balance settles what its samples did not carry, and its
    // tail is credited when it ends (its visits then come at times its
    // running decides: the weight of the next interval is unknown).
    bool exact = false;
    // The thread's /proc/self/task/TID/syscall kept open between looks
    // (internal::LookAtThread), empty when not; closed by DisarmThread.
    internal::OwnedFd syscall_file;
    ThreadData() = default;
    ThreadData(const ThreadData&) = delete;
    ThreadData& operator=(const ThreadData&) = delete;
  };

  absl::Status Configure(const Options& options);
  int64_t Period() const { return absl::ToInt64Nanoseconds(period_); }
  absl::Status ArmThread(ThreadContext& thread, ThreadData& data, int tag);
  void DisarmThread(ThreadContext& thread, ThreadData& data) noexcept;
  static bool OnSignal(ThreadContext& thread, ThreadData& data,
                       const siginfo_t& info,
                       std::span<int64_t> values) noexcept;
  // Whether the sample OnSignal just took is of a blocked thread.
  static bool SampledBlocked(const ThreadData& data) noexcept {
    return data.signal_blocked.load(std::memory_order_relaxed);
  }
  // In the handler of another provider's sample of the thread (a CPU
  // sample; sample_provider.h: TakesSwallowedSignals). SIGPROF is not a
  // queued signal: a wall signal sent while that sample's signal was
  // pending was discarded, and the wall time owed to it is taken by this
  // sample's stack, labelled running. Not for a signal sent to a blocked
  // thread: its sample begins an episode, and it is sent again after
  // kSignalLostAfterNs. Async-signal-safe.
  static bool TakeSwallowed(ThreadContext&, ThreadData& data,
                            std::span<int64_t> values) noexcept {
    if (data.pending_wall_ns.load(std::memory_order_acquire) <= 0 ||
        data.signal_blocked.load(std::memory_order_relaxed)) {
      return false;
    }
    const int64_t owed = data.pending_wall_ns.exchange(0, std::memory_order_acq_rel);
    if (owed <= 0) return false;
    values[0] = 1;
    values[1] = owed;
    return true;
  }
  bool TakeTail(ThreadContext& thread, ThreadData& data,
                std::span<int64_t> values);
  // Registry lock held: a running sample worth `cpu_ns` of CPU was drained
  // for the thread. When it is followed, fills `values` with the wall time
  // that sample carries and returns true.
  static bool FollowRunningSample(ThreadData& data, int64_t cpu_ns,
                                  std::span<int64_t> values) noexcept {
    if (!data.following || cpu_ns <= 0) return false;
    data.followed_ns += cpu_ns;
    values[0] = 1;
    values[1] = cpu_ns;
    return true;
  }
  static bool SteadyVisit(const ThreadData& data) noexcept {
    return data.steady_visit;
  }
  static RoundWeight RoundWeightUse(const ThreadData& data) noexcept {
    return data.round_weight;
  }
  // The thread's account is exact (ThreadData::exact): the ticker counts
  // it out of the threads' time it hands out (KeepsOwnAccounts).
  static bool OwnAccount(const ThreadData& data) noexcept { return data.exact; }

  // After each wake-up with threads (EndsRounds). Registry lock.
  void EndRound(int64_t now_ns, size_t threads, size_t looked) {
    if (threads == 0) return;
    const double covered = rounds_covered_.load(std::memory_order_relaxed) +
                           static_cast<double>(looked) / static_cast<double>(threads);
    rounds_covered_.store(covered, std::memory_order_relaxed);
    rounds_[round_count_++ % rounds_.size()] = Round{now_ns, covered};
  }
  // Wall time (ns) the tails of threads that ended between two wake-ups
  // credited over their chances of a visit (EndedShare). Registry lock.
  uint64_t ended_between_ns() const { return ended_between_ns_; }
  // The squared weights (ms^2) of those tails since the last call: a part
  // of the estimator's variance (WallVisitCounts::weight_sq_ms2). Registry
  // lock.
  double TakeEndedShareSq() { return std::exchange(ended_share_sq_ms2_, 0.0); }

  absl::Duration TickPeriod() const { return period_; }
  size_t ThreadsPerTick() const { return threads_per_tick_; }
  TickDecision VisitThread(ThreadContext& thread, ThreadData& data,
                           TickTime when, bool has_episode_stack,
                           bool has_running_sample, std::span<int64_t> values);
  // Instead of the signal a visit asked for with kSignalBlocked, the
  // profiler may read the thread's stack from outside (when its unwinder
  // walks copies of stacks, DwarfUnwinder::UnwindCopy): where the thread
  // waits (/proc/self/task/TID/syscall: its sp and pc), and its CPU clock
  // read before that look. The copy is the thread's stack as it waits only
  // if the clock still reads the same after it (the thread did not run).
  static internal::SyscallSite EpisodeSite(const ThreadData& data) {
    return data.episode_site;
  }
  static int64_t LookClock(const ThreadData& data) {
    return data.cpu_mark.load(std::memory_order_relaxed);
  }
  // The sample the signal's handler would have taken (OnSignal's values),
  // taken by the ticker once it read the stack; the visit then counts as a
  // stack read, not a signal.
  bool TakeStackRead(ThreadData& data, std::span<int64_t> values) noexcept;
  // A blocked thread was signalled for its episode's stack, which the
  // profiler does not hold yet (it may be in the thread's ring).
  static bool AwaitsEpisodeStack(const ThreadData& data) {
    return data.blocked_signal_sent;
  }
  // Visits that found threads running / blocked, signals sent to blocked
  // threads (one per blocking episode at most), the visits that read a
  // thread's state from /proc (not those to idle threads, nor to threads
  // that ran throughout the interval), and the visits to running threads
  // credited to a running sample's stack instead of signalling.
  // Also: the visits to followed threads.
  struct VisitCounts {
    uint64_t running = 0, blocked = 0, blocked_signals = 0, state_reads = 0,
             running_credits = 0, following = 0;
    // Episodes whose stack the profiler read without a signal (TakeStackRead).
    uint64_t blocked_stack_reads = 0;
    // Visits that found a signal still not taken after kSignalLostAfterNs
    // by a thread that had not run since it was sent, and did not send it
    // again (VisitThread).
    uint64_t undelivered = 0;
  };
  VisitCounts visit_counts() const { return counts_; }
  // Descriptors of threads' .../syscall files held open now, and the most
  // it holds (1/16 of those free under RLIMIT_NOFILE at Configure and
  // whenever the program changes that limit, at most kMaxKeptFiles): the
  // threads looked at first keep theirs, the others' are opened at each look.
  int kept_files() const { return kept_files_.held(); }
  int kept_file_budget() const { return kept_files_.limit(); }
  static constexpr int kMaxKeptFiles = 256;
  // For the profile's comments: "" unless the budget held files back.
  std::string Describe() const;

  // Monotonic nanoseconds (CLOCK_MONOTONIC). Async-signal-safe.
  static int64_t NowNanos() noexcept;

 private:
  absl::Duration period_ = absl::Milliseconds(10);
  size_t threads_per_tick_ = 5;
  VisitCounts counts_;  // ticker (registry lock)
  // The ticker's last wake-up visited every thread (round_weights off): a thread
  // ending before its first visit then owes its time since arming (TakeTail),
  // or since the wake-ups last handed out the threads' time (TickTime::
  // handed_ns, as of the last visit).
  bool every_thread_visited_ = false;
  int64_t handed_ns_ = 0;
  // The ticker's last wake-ups (EndRound), newest at round_count_ - 1: a
  // thread that ended is found at the last before its end (at ~10 a
  // second, these go back 6 s: its unregistration is finished within a
  // collector's pass, 50 ms). Registry lock.
  struct Round {
    int64_t at_ns = 0;
    double covered = 0;  // rounds_covered_ after it
  };
  // The rounds of the threads all wake-ups so far looked at: each, its
  // looked-at threads over the threads then (EndRound; ArmThread reads it
  // outside the registry lock).
  std::atomic<double> rounds_covered_{0};
  std::array<Round, 64> rounds_{};
  uint64_t round_count_ = 0;
  uint64_t ended_between_ns_ = 0;
  double ended_share_sq_ms2_ = 0;
  // TakeTail: what a thread weighed at a visit since it was armed (when
  // rounds_covered_ was `covered_at_arm`) owes for its time from the last
  // wake-up before its end (`exit_ns`) to its end.
  int64_t EndedShare(double covered_at_arm, int64_t exit_ns) const;
  TickDecision VisitOnce(ThreadContext& thread, ThreadData& data, TickTime when,
                         bool has_episode_stack, bool has_running_sample,
                         std::span<int64_t> values);
  internal::DescriptorBudget kept_files_;  // DisarmThread may run outside the lock
  // Kept files of threads that left, opened by the ticker in its own descriptor
  // table (internal::EnterPrivateDescriptorTable): the leaving thread cannot close
  // them there, so the ticker does at its next visit (CloseParkedFiles); one that
  // finds this full is left to the ticker's table, gone when the ticker ends.
  static constexpr size_t kMaxParkedFiles = 1024;
  std::mutex parked_mutex_;
  std::array<internal::OwnedFd::Parked, kMaxParkedFiles> parked_;
  size_t parked_count_ = 0;  // parked_mutex_
  std::atomic<bool> any_parked_{false};
  void CloseParkedFiles() noexcept;
};

static_assert(SampleProvider<WallTimeProvider>);
static_assert(ReportsTail<WallTimeProvider>);
static_assert(TicksThreads<WallTimeProvider>);
// What the Profiler uses: a renamed member fails here, not by quietly turning it off.
static_assert(TakesSwallowedSignals<WallTimeProvider>);
static_assert(ArmsConcurrently<WallTimeProvider>);
static_assert(UnregistersLate<WallTimeProvider>);
static_assert(NamesTailFrame<WallTimeProvider>);
static_assert(ReportsBlockedSamples<WallTimeProvider>);
static_assert(LabelsThreadState<WallTimeProvider>);
static_assert(NamesSigwaitFrame<WallTimeProvider>);
static_assert(ReportsSteadyVisits<WallTimeProvider>);
static_assert(FollowsRunningThreads<WallTimeProvider>);
static_assert(ReadsBlockedStacks<WallTimeProvider>);

}  // namespace inprof

#endif  // !_WIN32

#endif  // INPROF_WALL_TIME_PROVIDER_H_
