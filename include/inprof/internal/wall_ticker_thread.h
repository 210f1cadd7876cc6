// internal: not part of the public API (include inprof/profiler.h).
//
// The wall ticker's own machinery, which ProfilerBase owns and calls:
//   TickerPacing     how far apart its wake-ups come (the back-off after
//                    steady rounds, how late they come) and how many visits
//                    a tick its CPU budget allows. Pure arithmetic on the
//                    times and counts it is given: no clock, no thread.
//   ArmQueue         threads that registered in a burst, prepared and
//                    waiting for the ticker's armer thread to arm them.
//   WallTickerThread the ticker thread ("inprof-tick": jittered wake-ups,
//                    batches, the back-off) and the armer ("inprof-arm").
// What a wake-up visits is WallTicker's (wall_ticker.h).
//
// Thread-safety: TickerPacing and ArmQueue under the profiler's registry
// lock, but for TickerPacing's atomics (quiet_factor, Unquiet,
// longest_round_ns: any thread). WallTickerThread: Start and Stop on the
// thread that starts and stops the profiler; WakeToArm, Replan and
// armer_ready from any thread. Never in a signal handler.
//
// Example (ProfilerBase):
//   pacing_.Restart(period_ns);
//   ticker_.Start(period, pacing_,
//                 [this](size_t batch, int64_t at) { return Tick(batch, at); },
//                 [this] { ArmQueued(); });
//   ...
//   const double pace = pacing_.WakeUp(now_ns, batch);  // in Tick
//   ticker_.Stop(/*in_forked_child=*/false);
#ifndef INPROF_INTERNAL_WALL_TICKER_THREAD_H_
#define INPROF_INTERNAL_WALL_TICKER_THREAD_H_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/time/time.h"

namespace inprof::internal {

struct SlotBase;  // profiler_base.h

// The ticker's pace and CPU budget (registry lock, but for the atomics).
class TickerPacing {
 public:
  // Most ticks one wake-up may stand for (ProfilerBase::Tick).
  static constexpr size_t kMaxTickBatch = 10;
  // Most base periods the ticker waits between wake-ups while every thread
  // is steady.
  static constexpr uint32_t kMaxQuietFactor = 8;

  // A new ticker thread at `period_ns`, a new CPU clock: its cost per visit
  // is measured again, and no cap holds until it is.
  // Threads' time counts from `now_ns` (0: from the first wake-up).
  void Restart(int64_t period_ns, int64_t now_ns = 0);

  // Stop(), at `now_ns`: a thread's wait for its next visit, at most the
  // time since the last wake-up and a round beyond it, is noted as a wait
  // between visits (longest_round_ns); the wake-ups' history is forgotten.
  void Stop(int64_t now_ns);

  // A wake-up at `now_ns` (CLOCK_MONOTONIC) standing for `batch` ticks.
  // Returns its pace (TickTime::pace): the factor the schedule spaces the
  // wake-ups by (quiet_factor), times how late they come on average (the
  // time since the last wake-up over the interval planned for `batch`
  // ticks, each clamped to [0.25, 100], smoothed over ~8 wake-ups), at
  // least the spacing.
  double WakeUp(int64_t now_ns, size_t batch);

  // The registered threads' count integrated over time (registry lock):
  // CountThreads before the count changes from `threads`; ThreadTime at a
  // wake-up: the threads' time since the previous wake-up, in thread-
  // nanoseconds (0 at the first) -- threads that ended since included,
  // whose time the visits to those left carry.
  // Threads that keep their own account (SlotBase::ticker_own_account)
  // are left out of `threads`.
  void CountThreads(int64_t now_ns, size_t threads);
  double ThreadTime(int64_t now_ns, size_t threads);
  // `n` threads began to keep their own account at this wake-up (after
  // ThreadTime): counted out from its time on. One that leaves the count
  // (after CountThreads) keeps its time out of Ended: its tail credits it.
  void BeginOwnAccounts(size_t n) { own_accounts_ += n; }
  void LeaveOwnAccount() {
    if (own_accounts_ > 0) --own_accounts_;
  }
  size_t own_accounts() const { return own_accounts_; }
  // A thread registered at `registered_ns` ended and left the count at
  // `now_ns` (after CountThreads). When it was registered at the last
  // wake-up, its time since is taken out of the next ThreadTime: the
  // visits of that wake-up weighed its end instead (WallTimeProvider::
  // TakeTail). A thread that registered since stays in it (no visit saw
  // it: the next wake-up's visits carry its time).
  void Ended(int64_t now_ns, int64_t registered_ns);

  // The ticker thread's CPU clock `cpu_ns` at a wake-up: its CPU per visit
  // since the last measurement (smoothed), and from it visit_cap() within
  // `budget` (a fraction of one core; <= 0: none). The first measurement
  // on a thread (or a clock that went back) only sets the baseline; one
  // with no visits since waits for them.
  //
  // With `now_ns` (CLOCK_MONOTONIC; -1: none), the CPU is also held to the
  // budget over time: the allowance (the budget's CPU since the baseline
  // less what was spent, kept within [-kBudgetDebtNs of the budget's time,
  // 0]) scales the cap by 1 + allowance over a second of budget, at least
  // 1/16. What the cap does not see -- visits ahead of the round robin, a
  // cost that rose since it was smoothed -- is paid back by fewer visits
  // next. CPU left unused is not saved up: a surplus spent later took the
  // sampler over its budget in the window that spent it.
  // `threads`: the threads registered (budget_stretch()).
  void MeasureCpu(int64_t cpu_ns, double budget, int64_t now_ns = -1, size_t threads = 0);
  // A round this long at one visit a tick (WallTicker::kMaxRoundNs): past
  // it, less than one visit a tick spaces the wake-ups (budget_stretch()).
  static constexpr int64_t kLongRoundNs = 2'000'000'000;
  static constexpr int64_t kBudgetHorizonNs = 1'000'000'000;
  static constexpr int64_t kBudgetDebtNs = 4'000'000'000;
  // The allowance now (ns of CPU), for tests.
  double allowance_ns() const { return allowance_ns_; }

  // The visits a wake-up made (counted towards the next MeasureCpu).
  void AddVisits(uint64_t visits) {
    visits_ += visits;
    total_visits_.fetch_add(visits, std::memory_order_relaxed);
  }
  // All visits in this profiler's life (ProfilerStats::wall_visits). Any
  // thread.
  uint64_t total_visits() const { return total_visits_.load(std::memory_order_relaxed); }

  // After a wake-up's visits to `threads` threads, of which steady_visits
  // in a row were steady; `next` is the batch the next wake-up may stand
  // for. A whole round of steady visits doubles quiet_factor, up to
  // kMaxQuietFactor and up to kMaxTickBatch / next (a thread's revisit
  // interval never grows past kMaxTickBatch periods); anything else brings
  // it back to 1.
  void EndWakeUp(size_t threads, size_t next);

  // How many base periods the next wake-up waits (1: the base period),
  // from the back-off after steady rounds. Any thread.
  uint32_t quiet_factor() const { return quiet_factor_.load(std::memory_order_relaxed); }
  // How many times further apart the wake-ups come to keep the CPU budget
  // when even one visit a tick costs more than it allows and the threads'
  // round is long already (MeasureCpu; 1 otherwise, at most
  // kMaxBudgetStretch). Any thread.
  uint32_t budget_stretch() const { return budget_stretch_.load(std::memory_order_relaxed); }
  static constexpr uint32_t kMaxBudgetStretch = 16;
  // The spacing of the wake-ups in base periods (a batch counted as one):
  // quiet_factor() times budget_stretch(). Any thread.
  uint32_t spacing() const { return quiet_factor() * budget_stretch(); }
  // The batch the next wake-up stands for (`batch`: the round's), fewer
  // ticks each while the wake-ups are spaced for the budget: the visits a
  // second are the same, and a thread that starts running is visited
  // ahead of the round robin within kMaxBudgetStretch ticks.
  size_t BatchWhenStretched(size_t batch) const;

  // A thread registered: back to the base period. True when the ticker was
  // spaced wider and must plan its next wake-up again. Any thread.
  bool Unquiet();

  // A wake-up's round estimate (WallTicker::round_estimate_ns).
  void NoteRound(int64_t ns);
  // The longest wait between visits noted in this profiler's life
  // (ProfilerStats::wall_longest_round_ns). Any thread.
  uint64_t longest_round_ns() const {
    return longest_round_ns_.load(std::memory_order_relaxed);
  }

  // The most visits a tick the budget allows (SIZE_MAX: no cap).
  size_t visit_cap() const { return visit_cap_; }
  // The smoothed lateness and CPU per visit (0: none measured), for tests.
  double lateness() const { return lateness_; }
  double cost_per_visit_ns() const { return cost_per_visit_ns_; }

  // Steady visits in a row across providers (WallTicker::VisitNext's
  // `steady_visits`).
  size_t steady_visits = 0;

 private:
  int64_t period_ns_ = 0;
  // The last wake-up (0 before one) and its round.
  int64_t last_tick_ns_ = 0;
  int64_t last_round_ns_ = 0;
  // CountThreads: thread-nanoseconds since counted_from_ns_ (the last
  // wake-up; 0: none yet), counted up to threads_at_ns_.
  double thread_ns_ = 0;
  int64_t threads_at_ns_ = 0;
  int64_t counted_from_ns_ = 0;
  size_t own_accounts_ = 0;
  double lateness_ = 1;
  std::atomic<uint32_t> quiet_factor_{1};
  std::atomic<uint32_t> budget_stretch_{1};
  std::atomic<uint64_t> longest_round_ns_{0};
  std::atomic<uint64_t> total_visits_{0};
  // The ticker thread's CPU clock when last measured (-1: not yet on this
  // thread), the visits since, and its CPU per visit (0: none measured).
  int64_t cpu_at_ = -1;
  uint64_t visits_ = 0;
  double cost_per_visit_ns_ = 0;
  size_t visit_cap_ = SIZE_MAX;
  // The allowance (MeasureCpu's `now_ns`) and the clocks it was counted to
  // (-1: no baseline yet).
  double allowance_ns_ = 0;
  int64_t allowance_cpu_at_ = -1;
  int64_t allowance_wall_at_ = -1;
};

// Threads prepared by RegisterThread in a burst, waiting for the armer
// (registry lock). A slot that leaves the registry leaves the queue.
class ArmQueue {
 public:
  // Most slots armed per hold of the registry lock (~5 us each).
  static constexpr size_t kBatch = 32;

  // Queues `slot` (SlotBase::arm_queued) as registered now.
  void Push(SlotBase* slot);
  // `slot` will not be armed from the queue (a no-op when not queued).
  void Forget(SlotBase* slot);
  // Every queued slot forgotten.
  void Clear();
  bool empty() const { return queue_.empty(); }
  size_t size() const { return queue_.size(); }

  // Takes the oldest kBatch slots (fewer when fewer wait) off the queue and
  // passes to `arm` each whose registration is the one queued (same
  // generation) and not retiring. Returns how many were passed.
  size_t ArmBatch(absl::FunctionRef<void(SlotBase*)> arm);

 private:
  struct Queued {
    SlotBase* slot;
    uint64_t generation;
  };
  std::vector<Queued> queue_;
};

// The ticker thread and the armer thread.
class WallTickerThread {
 public:
  WallTickerThread() = default;
  WallTickerThread(const WallTickerThread&) = delete;
  WallTickerThread& operator=(const WallTickerThread&) = delete;

  // Starts both threads. The ticker calls tick(batch, scheduled_ns) at
  // intervals drawn uniformly from [0.5, 1.5] x period x batch x
  // pacing.spacing() (tick returns the next batch); the armer calls
  // arm() after WakeToArm. Then armer_ready() is true.
  void Start(absl::Duration period, const TickerPacing& pacing,
             std::function<size_t(size_t batch, int64_t scheduled_ns)> tick,
             std::function<void()> arm);

  // armer_ready() false, then both threads ended and joined (in a forked
  // child, where they do not exist, only forgotten). A no-op when not
  // started.
  void Stop(bool in_forked_child);

  // The armer thread runs: a registering thread may leave its arming to it.
  bool armer_ready() const { return armer_ready_.load(std::memory_order_acquire); }

  // One wake-up of the armer for however many threads queue before it
  // runs.
  void WakeToArm();

  // The ticker plans its next wake-up again, within a base period.
  void Replan();

  // A wake-up now, standing for the ticks since the last one (at least
  // one), waited for up to `timeout`: at an export window's edge, so that
  // the window's last wake-up credits the threads' time up to its end
  // rather than the next window's first crediting it (with a wake-up every
  // 100 ms, 1 s windows at 10,000 threads held 0.89-1.09x their threads'
  // lifetimes). A no-op when not started. Not from the ticker thread.
  void TickNow(absl::Duration timeout);

 private:
  struct Threads {
    std::mutex mutex;
    std::condition_variable cv;
    bool stop = false;
    bool replan = false;  // Replan
    bool arm = false;     // WakeToArm
    bool edge = false;    // TickNow: a wake-up asked for
    uint64_t edges_done = 0;
    std::thread thread;
    // Arms the threads queued in a burst on the program's descriptor
    // table, where the signal handler finds each perf event: the ticker
    // thread has a table of its own (its /proc files).
    std::thread armer;
  };
  std::unique_ptr<Threads> threads_ = std::make_unique<Threads>();
  std::atomic<bool> armer_ready_{false};
  std::atomic<bool> arm_wake_pending_{false};
};

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_WALL_TICKER_THREAD_H_
