// include/inprof/internal/wall_ticker.h: the ticker's visits to the threads
// of one provider that TicksThreads (wall time).
//
// Defines: WallTickerHost (what a visit asks of the profiler) and
// WallTicker<P> (which threads a wake-up visits, in what order, and what
// each decision of the provider turns into).
//
// The ticker thread (ProfilerBase::Tick) wakes, and for each ticking
// provider WallTicker::VisitNext visits the next threads round robin. A
// visit asks the provider (P::VisitThread) what the interval since the
// thread's last visit was, and does what it decides: nothing, a signal
// (the handler records the sample), a blocked thread's stack read without a
// signal (else a signal), or the interval's values credited to the stack
// of the thread's blocking episode, of its newest running sample, or to a
// frame of its own. The episode's state (SlotBase::blocked_*) is kept here;
// the stacks, the aggregate and the signal are the host's.
//
// The host is the profiler (Profiler<U, R, Ps...>, through a small adapter
// per provider); tests give a fake (tests/sampling/wall_ticker_test.cc).
//
// Thread-safety: VisitNext and every host call it makes run on the ticker
// thread with the profiler's registry lock held; never in a signal handler.
#ifndef INPROF_INTERNAL_WALL_TICKER_H_
#define INPROF_INTERNAL_WALL_TICKER_H_

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "inprof/internal/profiler_base.h"
#include "inprof/internal/sample_record.h"
#include "inprof/sample_provider.h"
#include "inprof/wall_time_provider.h"

namespace inprof::internal {

// What a visit asks of the profiler, for one provider P. All under the
// registry lock.
//   h.Data(slot) -> P::ThreadData&: the provider's data for the thread.
//   h.RunningSamplesAtVisit(slot) -> uint32_t&: the thread's running-sample
//     count (SlotBase::running_samples) at this provider's last visit.
//   H::kCountsRunningSamples: whether a provider of the composition
//     SamplesRunningThreads (else running samples are never looked at).
//   h.DrainSlot(slot): the thread's ring into the aggregate (its newest
//     stacks into SlotBase::last/blocked/running_stack).
//   h.ReadBlockedStack(slot) -> bool: the waiting thread's stack read and
//     recorded without a signal; false when it could not be (then signalled).
//   h.Signal(slot): the profiling signal with this provider's tag.
//   h.CreditBlocked/CreditRunning(slot, values), h.CreditSynthetic(slot,
//     values, frame): the interval's values added to the episode's stack,
//     to the newest running sample's, or to `frame`.
//   h.TablesReady(), h.TablesGeneration(): the unwinder's lazily built
//     tables (always ready, generation 0, for unwinders without them).
template <typename H, typename P>
concept WallTickerHost =
    requires(H& h, SlotBase& slot, std::span<const int64_t> values,
             const char* frame) {
      { h.Data(slot) } -> std::same_as<typename P::ThreadData&>;
      { h.RunningSamplesAtVisit(slot) } -> std::same_as<uint32_t&>;
      { H::kCountsRunningSamples } -> std::convertible_to<bool>;
      h.DrainSlot(slot);
      { h.ReadBlockedStack(slot) } -> std::same_as<bool>;
      h.Signal(slot);
      h.CreditBlocked(slot, values);
      h.CreditRunning(slot, values);
      h.CreditSynthetic(slot, values, frame);
      { h.TablesReady() } -> std::same_as<bool>;
      { h.TablesGeneration() } -> std::same_as<uint64_t>;
    };

// What one VisitNext did, for the profiler's counters.
struct WallVisitCounts {
  uint64_t visits = 0;
  // Visits the round's 2 s would have asked for that the sampler's CPU
  // budget deferred (VisitsPerTick's `cap`).
  uint64_t deferred = 0;
  uint64_t signals = 0;
  uint64_t stacks_read = 0;
  uint64_t episodes_resampled = 0;
  // Threads' time (ns) no visit took: what was left with no thread to
  // hand it to (threads that registered and ended between two wake-ups).
  uint64_t unattributed_ns = 0;
  // Threads whose own account began at this wake-up (KeepsOwnAccounts,
  // SlotBase::ticker_own_account): for TickerPacing::BeginOwnAccounts.
  uint64_t own_accounts_begun = 0;
  // The squared weights (ms^2) of the visits that took a share of the
  // threads' time (TickTime::round_weights): the estimator's variance is
  // sum(w^2) p (1 - p) for a stack on which the threads spend a share p.
  double weight_sq_ms2 = 0;
};

// The most visits a tick that keep the sampler within `budget` (a
// fraction of one core) when its CPU per visit is `cost_ns` (its wake-ups'
// CPU over their visits), at tick period `period_ns`; at least 1.
// SIZE_MAX: no budget (budget <= 0) or no cost measured yet.
inline size_t VisitBudgetPerTick(double budget, int64_t period_ns, double cost_ns) {
  if (budget <= 0 || cost_ns <= 0 || period_ns <= 0) return SIZE_MAX;
  const double visits = budget * static_cast<double>(period_ns) / cost_ns;
  if (visits >= 1e15) return SIZE_MAX;
  return visits < 1 ? 1 : static_cast<size_t>(visits);
}

// One per provider of a composition (its cursor); VisitNext exists for
// providers that TicksThreads.
template <typename P>
class WallTicker {
 public:
  // The longest a round of the threads takes: past P::ThreadsPerTick() a
  // tick, the visits grow with the thread count so that each thread is
  // visited at least this often (10,000 threads at a 10 ms period: 50 a
  // tick), as long as the sampler's CPU stays within its budget
  // (Options::wall_cpu_budget: `cap` below); past that the rounds grow
  // longer. Between two visits a thread's wall time is owed to it, credited
  // at its next visit to where it is then.
  static constexpr int64_t kMaxRoundNs = 2'000'000'000;

  // Visits a tick for `threads` threads at tick period `period_ns`: at
  // least `configured`, more for a round of kMaxRoundNs, and at most `cap`
  // (the CPU budget's), even below `configured`: with 10,000 threads a
  // visit costs 20-40 us here (the thread's state read from /proc, its
  // stack copied and walked), and the configured 5 a tick alone took 1.6-2%
  // of a core against a 1% budget. At least one.
  static size_t VisitsPerTick(size_t configured, size_t threads, int64_t period_ns,
                              size_t cap = SIZE_MAX) {
    const size_t floor = std::max<size_t>(1, configured);
    if (period_ns <= 0) return floor;
    const uint64_t needed =
        (static_cast<uint64_t>(threads) * static_cast<uint64_t>(period_ns) + kMaxRoundNs - 1) /
        kMaxRoundNs;
    return static_cast<size_t>(
        std::min<uint64_t>(std::max<uint64_t>(floor, needed), std::max<size_t>(cap, 1)));
  }

  // One wake-up standing for `batch` ticks: visits batch * VisitsPerTick
  // threads of `threads` (each at most once), from where the last wake-up
  // stopped. Lowers `next` to the batch the next
  // wake-up may stand for (a full round of the threads in that many ticks,
  // within [1, max_batch]). `steady_visits` counts steady visits in a row
  // across providers (ReportsSteadyVisits; reset by any other). `cap`:
  // the most visits a tick the sampler's CPU budget allows. `due`: threads
  // that ran and were not visited for a round (ProfilerBase::wall_due_),
  // visited first, whatever the cap; the round robin then passes over
  // them.
  template <typename H>
    requires TicksThreads<P> && WallTickerHost<H, P>
  WallVisitCounts VisitNext(P& provider, H& host, std::span<SlotBase* const> threads,
                            TickTime when, size_t batch, size_t max_batch,
                            size_t& next, size_t& steady_visits, size_t cap = SIZE_MAX,
                            std::span<const WallDue> due = {}) {
    WallVisitCounts counts;
    if (provider.TickPeriod() <= absl::ZeroDuration()) return counts;
    const size_t n = threads.size();
    const int64_t period_ns = absl::ToInt64Nanoseconds(provider.TickPeriod());
    const size_t per_tick = VisitsPerTick(provider.ThreadsPerTick(), n, period_ns, cap);
    next = std::min(next, std::clamp<size_t>(n / per_tick, 1, max_batch));
    if (n == 0) {
      // No thread left to carry it: counted, and shown in the comments.
      // When the last wake-up visited every thread, the threads' tails took
      // their time since their last visit, or since arming
      // (WallTimeProvider::TakeTail): only what was carried is left.
      counts.unattributed_ns = static_cast<uint64_t>(
          carried_ns_ + (visited_all_ ? 0.0 : std::max(0.0, when.thread_ns)));
      carried_ns_ = 0;
      handed_ns_ = when.now_ns;
      return counts;
    }
    const size_t visits = std::min(n, batch * per_tick);
    const size_t wanted = std::min(
        n, batch * VisitsPerTick(provider.ThreadsPerTick(), n, period_ns));
    counts.deferred = wanted - visits;
    // Horvitz-Thompson: each of the n threads is visited in this wake-up
    // with chance visits/n, so a visit weighs n/visits times the interval
    // the wake-up stands for: the threads' time since the last wake-up
    // (TickTime::thread_ns) -- of the threads still there: those that ended
    // since are weighed by their tails from their visits before their end
    // (EndsRounds, TickerPacing::Ended), as the ones that registered since
    // and ended are carried by the visits to the others (a ratio
    // estimator). A
    // wake-up credits that time whatever the budget's cap does to the
    // visits from one to the next; weights of "the time since the thread's
    // previous visit" credited a 1 s export window 0.69-1.15x its threads'
    // lifetimes at 10,000 threads (the round's pace, not the window's).
    // Real time, not the schedule's: a ticker kept 300 ms from the
    // registry lock while 10,000 threads unregistered credited their last
    // window 0.7x their lifetimes in it.
    //
    // The time is handed out visit by visit, each taking what is left over
    // the visits still to make (RoundWeight): a thread followed, or
    // credited since its arming, has its time accounted otherwise and its
    // share is dropped; one found ended takes none and is not counted (its
    // time is its tail's), and the round robin goes on; one not armed yet
    // (a burst of
    // registrations) leaves its share to the others, the round robin going
    // on past `visits` (up to 4x), and what is left to the next wake-up's
    // visits, as long as threads are registered. When every thread is
    // visited at each wake-up, its visits credit exactly the time since its
    // previous one instead.
    when.round_weights = when.thread_ns > 0 && visits < n;
    visited_all_ = visits >= n;
    when.handed_ns = handed_ns_;
    // The threads' time is handed out up to now (or there was none to hand
    // out); a wake-up that visits every thread has each credit its own.
    if (when.round_weights || when.thread_ns <= 0) handed_ns_ = when.now_ns;
    double left = when.round_weights ? when.thread_ns + carried_ns_ : 0;
    // Visiting every thread, each visit takes its own interval: time
    // carried from earlier wake-ups has no taker, and is counted.
    if (!when.round_weights) counts.unattributed_ns += static_cast<uint64_t>(carried_ns_);
    carried_ns_ = 0;
    when.round_ns =
        when.round_weights
            ? std::max<int64_t>(1, static_cast<int64_t>(left / static_cast<double>(visits)))
            : RoundEstimate(when,
                            static_cast<int64_t>((n + per_tick - 1) / per_tick) * period_ns);
    round_estimate_ns_ = when.round_ns;
    TickTime ahead = when;
    ahead.out_of_round = true;
    for (const WallDue& d : due) {
      // Queued before it unregistered, or before its slot was reused.
      if (d.slot->generation != d.generation) continue;
      if (d.slot->wall_last_visit_ns == when.now_ns) continue;  // another provider's
      VisitOne(provider, host, *d.slot, ahead, counts, steady_visits);
    }
    // A thread visited ahead just now is visited in its round all the
    // same: the visit ahead only began its following (then this one finds
    // nothing to credit), or did nothing; skipping this one would take a
    // sample from the threads that run.
    size_t weighed = 0;  // visits that took a weight
    size_t own = 0;      // visits to threads that keep their own account
    size_t ended = 0;    // threads found ended (looked at, not visited)
    size_t j = 0;
    for (; j < n && (j < visits + ended ||
                     (when.round_weights && weighed + own < visits && left >= 1 &&
                      j < 4 * visits + ended));
         ++j) {
      if (when.round_weights) {
        const size_t to_weigh = visits > weighed + own ? visits - weighed - own : 1;
        when.round_ns = std::max<int64_t>(
            1, static_cast<int64_t>(left / static_cast<double>(to_weigh)));
      }
      const RoundWeight use =
          VisitOne(provider, host, *threads[(cursor_ + j) % n], when, counts, steady_visits);
      // A thread found ended takes no share: the time of the threads that
      // ended since the last wake-up is not in thread_ns (TickerPacing::
      // Ended), their tails weigh it (EndsRounds). Nor does one that keeps
      // its own account: its time is not in thread_ns either (TickerPacing::
      // BeginOwnAccounts), so its share is the other visits' (dropped, it
      // left the total short or long by its share against its time: up to
      // a round's worth, 0.6 s of 720 s in WallManyThreadsTest).
      if (use == RoundWeight::kEnded) ++ended;
      if (use == RoundWeight::kOwnAccount) ++own;
      if (when.round_weights && use == RoundWeight::kTaken) {
        left -= static_cast<double>(when.round_ns);
        ++weighed;
        const double ms = static_cast<double>(when.round_ns) / 1e6;
        counts.weight_sq_ms2 += ms * ms;
      }
    }
    cursor_ = (cursor_ + j) % n;
    if (when.round_weights && left >= 1) carried_ns_ = left;
    // Each of the n threads was among the j looked at with chance j/n: a
    // thread weighed since it was armed that ends has its time since the
    // last wake-up estimated from its visits (WallTimeProvider::TakeTail).
    if constexpr (EndsRounds<P>) provider.EndRound(when.now_ns, n, j);
    return counts;
  }

  // The last wake-up's RoundEstimate (0 before one).
  int64_t round_estimate_ns() const { return round_estimate_ns_; }

  // How long a thread waits between two visits of the round robin now:
  // `planned` (the threads over the visits a tick, the CPU budget's cap
  // included, times the period) times TickTime::pace (how many periods
  // apart the wake-ups come: the back-off after steady rounds, a late
  // ticker on a busy machine). Each factor is the
  // ticker's state now: the times since the threads' previous visits are
  // no guide while the thread count, the back-off or the batching change
  // (on a burst of registrations they weighed first visits 3.7 s for a
  // 0.4 s round, or 0.8 s for an 8 s one).
  static int64_t RoundEstimate(TickTime when, int64_t planned) {
    const double pace = when.pace >= 1 ? when.pace : 1.0;
    return std::max<int64_t>(static_cast<int64_t>(static_cast<double>(planned) * pace), 1);
  }

 private:
  // What the visit did with TickTime::round_ns (ReportsRoundWeight; else
  // kTaken for any visit that happened).
  template <typename H>
  RoundWeight VisitOne(P& provider, H& host, SlotBase& slot, TickTime when,
                WallVisitCounts& counts, size_t& steady_visits) {
    if (slot.arm_in_flight) {  // being armed; visited next round
      steady_visits = 0;
      return RoundWeight::kNotYet;
    }
    // A thread that unregistered itself may be gone, and its id reused:
    // never visited again. One that unregisters during the visit waits
    // for it to end (ThreadSlotHeader::retiring). Looked at first without
    // marking it: a burst of exits passes thousands of these, each of
    // which would wait (yielding) for the mark to go.
    if (slot.retiring.load(std::memory_order_acquire)) return RoundWeight::kEnded;
    slot.visiting.store(true, std::memory_order_seq_cst);
    if (slot.retiring.load(std::memory_order_seq_cst)) {
      slot.visiting.store(false, std::memory_order_release);
      return RoundWeight::kEnded;
    }
    // Cleared however the visit ends: one that throws (the heap full: the
    // ticker's RunContained skips it) must not leave the thread's
    // unregistration waiting for the mark forever.
    struct Unmark {
      SlotBase& slot;
      ~Unmark() { slot.visiting.store(false, std::memory_order_release); }
    } unmark{slot};
    slot.wall_last_visit_ns = when.now_ns;
    Visit(provider, host, slot, when, counts);
    NoteOwnAccount(host, slot, counts);
    ++counts.visits;
    if constexpr (ReportsSteadyVisits<P>) {
      if (P::SteadyVisit(host.Data(slot))) {
        ++steady_visits;
      } else {
        steady_visits = 0;
      }
    }
    if constexpr (ReadsBlockedStacks<P>) {
      // Since when the thread has not run (a thread dump's "waited").
      if (const int64_t clock = P::LookClock(host.Data(slot)); clock != slot.still_clock) {
        slot.still_clock = clock;
        slot.still_since_ns = when.now_ns;
      }
    }
    RoundWeight took = RoundWeight::kTaken;
    if constexpr (ReportsRoundWeight<P>) took = P::RoundWeightUse(host.Data(slot));
    // Last (`unmark`, after `took` is read): the thread may unregister (and
    // its data change) from here.
    return took;
  }

  // After a visit: a thread whose provider began its own account leaves
  // the ticker's count (SlotBase::ticker_own_account).
  template <typename H>
  static void NoteOwnAccount(H& host, SlotBase& slot, WallVisitCounts& counts) noexcept {
    if constexpr (KeepsOwnAccounts<P>) {
      if (!slot.ticker_own_account && P::OwnAccount(host.Data(slot))) {
        slot.ticker_own_account = true;
        ++counts.own_accounts_begun;
      }
    }
  }

  template <typename H>
  void Visit(P& provider, H& host, SlotBase& slot, TickTime when,
             WallVisitCounts& counts) {
    typename P::ThreadData& data = host.Data(slot);
    // The sample that began a blocking episode may still be in the ring:
    // without draining it the episode would look stackless and the thread
    // be signalled (and its blocking call interrupted) again.
    if (slot.blocked_stack.empty() && !slot.blocked_stackless &&
        provider.AwaitsEpisodeStack(data)) {
      host.DrainSlot(slot);
    }
    constexpr size_t kValues = P::kSampleTypes.size();
    int64_t values[kValues] = {};
    std::span<int64_t> v(values, kValues);
    // The rest of an episode is credited to the stack of its first sample,
    // for as long as the thread waits there (a whole run, for a sleep
    // loop). A stack walked before the tables it needed existed may miss
    // frames (libc's, at start-up: one such stack got 10% of a test's wall
    // time, credited to its caller's caller for 4 s): once the tables are
    // ready, the episode is sampled again, once.
    bool has_episode_stack = !slot.blocked_stack.empty() || slot.blocked_stackless;
    const bool resample =
        has_episode_stack && slot.blocked_provisional && !slot.blocked_resampled &&
        host.TablesReady() &&
        (!slot.blocked_tables_ready ||
         (host.TablesGeneration() & RecordMeta::kGenerationMask) != slot.blocked_tables_generation);
    if (resample) has_episode_stack = false;
    // A running sample taken since this provider's last visit (its record
    // may still be in the ring: drained if it is used).
    bool has_running_sample = false;
    if constexpr (FollowsRunningThreads<P>) {
      // A followed thread's samples carry its wall time: drained first, so
      // that the visit's balance counts those taken in its interval; and
      // before the visit that may begin the following, so that those
      // samples do not carry time the visit credits.
      if (data.following || slot.running_samples.load(std::memory_order_acquire) !=
                                host.RunningSamplesAtVisit(slot)) {
        host.DrainSlot(slot);
      }
    }
    if constexpr (H::kCountsRunningSamples) {
      const uint32_t taken = slot.running_samples.load(std::memory_order_acquire);
      uint32_t& at_visit = host.RunningSamplesAtVisit(slot);
      has_running_sample = taken != at_visit;
      at_visit = taken;
    }
    switch (provider.VisitThread(slot, data, when, has_episode_stack,
                                 has_running_sample, v)) {
      case TickDecision::kSkip:
      case TickDecision::kFollowing:
        break;
      case TickDecision::kSignalBlocked:
        // A new blocking episode (or the same one sampled again): its stack
        // comes with this sample.
        ForgetEpisode(slot);
        slot.blocked_resampled = resample;
        if (resample) ++counts.episodes_resampled;
        if (host.ReadBlockedStack(slot)) {
          ++counts.stacks_read;
          break;
        }
        host.Signal(slot);
        ++counts.signals;
        break;
      case TickDecision::kSignal:
        host.Signal(slot);
        ++counts.signals;
        break;
      case TickDecision::kCreditBlocked:
        host.CreditBlocked(slot, v);
        break;
      case TickDecision::kCreditRunning:
        host.CreditRunning(slot, v);
        break;
      case TickDecision::kCreditSigwait:
        // Not an episode with a stack: the next visit looks again rather
        // than crediting an older episode's stack.
        ForgetEpisode(slot);
        if constexpr (NamesSigwaitFrame<P>) {
          host.CreditSynthetic(slot, v, P::kSigwaitFrame);
        } else {
          host.CreditSynthetic(slot, v, kTailFrame);
        }
        break;
    }
  }

  static void ForgetEpisode(SlotBase& slot) {
    slot.blocked_stack.clear();
    slot.blocked_labels.clear();
    slot.blocked_provisional = false;
    slot.blocked_stackless = false;
  }

  size_t cursor_ = 0;  // where the next wake-up starts
  int64_t round_estimate_ns_ = 0;  // the last wake-up's RoundEstimate
  // Threads' time a wake-up could not hand out, for the next (VisitNext).
  double carried_ns_ = 0;
  // Whether the last wake-up with threads visited each of them.
  bool visited_all_ = false;
  // Up to when the wake-ups handed the threads' time out (TickTime::
  // handed_ns).
  int64_t handed_ns_ = 0;
};

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_WALL_TICKER_H_
