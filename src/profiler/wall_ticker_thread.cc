// The wall ticker's pacing, arm queue and threads
// (internal/wall_ticker_thread.h).
#include "inprof/internal/wall_ticker_thread.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "absl/random/distributions.h"
#include "absl/random/random.h"
#include "inprof/base/contained.h"
#include "inprof/base/owned_fd.h"
#include "inprof/base/profiler_thread.h"
#include "inprof/internal/profiler_base.h"
#include "inprof/internal/wall_ticker.h"

namespace inprof::internal {

// The threads armed at Start() are counted from the ticker's start: the
// first wake-up hands out their time since (it was lost: the head of a
// run, 2-20 ms of each thread registered before Start()).
void TickerPacing::Restart(int64_t period_ns, int64_t now_ns) {
  cpu_at_ = -1;
  cost_per_visit_ns_ = 0;
  visits_ = 0;
  visit_cap_ = SIZE_MAX;
  budget_stretch_.store(1, std::memory_order_relaxed);
  allowance_ns_ = 0;
  allowance_cpu_at_ = -1;
  allowance_wall_at_ = -1;
  period_ns_ = period_ns;
  thread_ns_ = 0;
  counted_from_ns_ = now_ns;
  threads_at_ns_ = now_ns;
  own_accounts_ = 0;
}

// After Stop()'s last wake-up (ProfilerBase::Stop: TickNow), which handed
// out the threads' time up to it.
void TickerPacing::Stop(int64_t now_ns) {
  if (last_tick_ns_ > 0) NoteRound(now_ns - last_tick_ns_ + last_round_ns_);
  last_tick_ns_ = 0;
  last_round_ns_ = 0;
  thread_ns_ = 0;
  counted_from_ns_ = 0;
  own_accounts_ = 0;
  lateness_ = 1;
}

// The lateness covers a busy machine, or a ticker that fell behind and
// rescheduled from its real time.
double TickerPacing::WakeUp(int64_t now_ns, size_t batch) {
  const uint32_t spacing = this->spacing();
  if (last_tick_ns_ > 0 && now_ns > last_tick_ns_ && period_ns_ > 0) {
    const double planned = static_cast<double>(period_ns_) *
                           static_cast<double>(std::max<size_t>(1, batch)) * spacing;
    const double late =
        std::clamp(static_cast<double>(now_ns - last_tick_ns_) / planned, 0.25, 100.0);
    lateness_ = 0.875 * lateness_ + 0.125 * late;
  }
  last_tick_ns_ = now_ns;
  last_round_ns_ = 0;  // this wake-up's (NoteRound)
  return static_cast<double>(spacing) * std::max(1.0, lateness_);
}

// The sampler's CPU per visit covers its whole wake-ups: waking, the lock,
// the visits. With 10,000 threads that each wake 5 times a second a visit
// costs ~15 us (the thread's state from /proc, its stack copied and
// walked), so a round of them every 2 s would take 7.5% of a core; within
// a 1% budget the round takes ~15 s instead, and each visit credits the
// longer interval to where the thread is then. Threads whose clocks stand
// cost little to visit, and are not held back.
//
// The cap from the cost alone held the visits of the round robin, not the
// CPU: at 10,000 threads the visits ahead of it (threads that ran, due
// after a round) and the cost's lag took the sampler to 0.8-1.4% of a
// core against a 1% budget (docs/measurements.md); the allowance holds
// the CPU itself.
void TickerPacing::MeasureCpu(int64_t cpu_ns, double budget, int64_t now_ns, size_t threads) {
  if (now_ns >= 0 && budget > 0) {
    if (allowance_cpu_at_ < 0 || cpu_ns < allowance_cpu_at_ || now_ns < allowance_wall_at_) {
      allowance_ns_ = 0;  // a baseline (a new thread's clock)
    } else {
      allowance_ns_ += budget * static_cast<double>(now_ns - allowance_wall_at_) -
                       static_cast<double>(cpu_ns - allowance_cpu_at_);
      allowance_ns_ =
          std::clamp(allowance_ns_, -budget * static_cast<double>(kBudgetDebtNs), 0.0);
    }
    allowance_cpu_at_ = cpu_ns;
    allowance_wall_at_ = now_ns;
  }
  if (cpu_at_ < 0 || cpu_ns < cpu_at_) {
    cpu_at_ = cpu_ns;
    visits_ = 0;
    return;
  }
  if (visits_ > 0) {  // else the CPU counts towards the next visits
    const double cost = static_cast<double>(cpu_ns - cpu_at_) / static_cast<double>(visits_);
    cost_per_visit_ns_ =
        cost_per_visit_ns_ <= 0 ? cost : 0.75 * cost_per_visit_ns_ + 0.25 * cost;
    cpu_at_ = cpu_ns;
    visits_ = 0;
  }
  if (cost_per_visit_ns_ <= 0) return;
  double cost = cost_per_visit_ns_;
  if (now_ns >= 0 && budget > 0) {
    // Fewer visits while in debt: the same cap at a cost scaled by the
    // inverse.
    const double scale = std::clamp(
        1 + allowance_ns_ / (budget * static_cast<double>(kBudgetHorizonNs)), 1.0 / 16, 1.0);
    cost /= scale;
  }
  visit_cap_ = VisitBudgetPerTick(budget, period_ns_, cost);
  // Below one visit a tick (the cap's floor), the wake-ups come further
  // apart instead, once a round at one visit a tick is longer than
  // kLongRoundNs already: at 10,000 threads on a guest whose system calls
  // are dear a visit cost 80-300 us, and one a tick alone took 1.0-1.4% of
  // a core against a 1% budget. A few threads keep a visit a tick (their
  // rounds short; a visit's cost there is mostly the wake-up's).
  uint32_t stretch = 1;
  if (budget > 0 && static_cast<double>(threads) * static_cast<double>(period_ns_) >
                        static_cast<double>(kLongRoundNs)) {
    const double per_tick = budget * static_cast<double>(period_ns_) / cost;
    if (per_tick < 1) {
      stretch = static_cast<uint32_t>(
          std::min<double>(kMaxBudgetStretch, std::ceil(1 / std::max(per_tick, 1e-9))));
    }
  }
  budget_stretch_.store(stretch, std::memory_order_relaxed);
}

// A batch of 10 stretched 16x put wake-ups 1.6 s apart: a busy thread's
// wall before its following began was only the round robin's estimate,
// 0.92x its life on its own stack in 2 of 4 runs at 10,000 threads.
size_t TickerPacing::BatchWhenStretched(size_t batch) const {
  const uint32_t stretch = budget_stretch();
  return stretch > 1 ? std::max<size_t>(1, batch / stretch) : batch;
}

void TickerPacing::CountThreads(int64_t now_ns, size_t threads) {
  if (counted_from_ns_ > 0 && now_ns > threads_at_ns_ && threads > own_accounts_) {
    thread_ns_ += static_cast<double>(threads - own_accounts_) *
                  static_cast<double>(now_ns - threads_at_ns_);
  }
  threads_at_ns_ = std::max(threads_at_ns_, now_ns);
}

void TickerPacing::Ended(int64_t now_ns, int64_t registered_ns) {
  if (counted_from_ns_ <= 0 || registered_ns >= counted_from_ns_ || now_ns <= counted_from_ns_) {
    return;
  }
  thread_ns_ = std::max(0.0, thread_ns_ - static_cast<double>(now_ns - counted_from_ns_));
}

double TickerPacing::ThreadTime(int64_t now_ns, size_t threads) {
  CountThreads(now_ns, threads);
  const double total = counted_from_ns_ > 0 ? thread_ns_ : 0;
  thread_ns_ = 0;
  counted_from_ns_ = now_ns;
  threads_at_ns_ = now_ns;
  return total;
}

// A followed thread's wall profile does not depend on its visits, a
// blocked thread's episode is credited whole whenever it is visited, and a
// thread that changes is found within kMaxQuietFactor periods (each visit
// still credits the interval to where the thread is then, at a time the
// program cannot predict: no bias, but a longer interval is a coarser
// sample). With many threads the batches already space the wake-ups.
// bench/overhead: the ticker's wake-ups were most of wall sampling's cost
// on busy threads.
void TickerPacing::EndWakeUp(size_t threads, size_t next) {
  const uint32_t factor = quiet_factor_.load(std::memory_order_relaxed);
  const uint32_t cap = static_cast<uint32_t>(
      std::clamp<size_t>(kMaxTickBatch / std::max<size_t>(next, 1), 1, kMaxQuietFactor));
  quiet_factor_.store(threads != 0 && steady_visits >= threads ? std::min<uint32_t>(factor * 2, cap)
                                                               : 1,
                      std::memory_order_relaxed);
}

bool TickerPacing::Unquiet() {
  if (quiet_factor_.load(std::memory_order_relaxed) <= 1) return false;
  quiet_factor_.store(1, std::memory_order_relaxed);
  return true;
}

void TickerPacing::NoteRound(int64_t ns) {
  last_round_ns_ = std::max(last_round_ns_, ns);
  if (ns > 0 &&
      static_cast<uint64_t>(ns) > longest_round_ns_.load(std::memory_order_relaxed)) {
    longest_round_ns_.store(static_cast<uint64_t>(ns), std::memory_order_relaxed);
  }
}

void ArmQueue::Push(SlotBase* slot) {
  slot->arm_queued = true;
  queue_.push_back(Queued{slot, slot->generation});
}

// The slot leaves the registry: its preparation is undone by DisarmLocked,
// its points taken by its tail.
void ArmQueue::Forget(SlotBase* slot) {
  if (!slot->arm_queued) return;
  std::erase_if(queue_, [slot](const Queued& q) { return q.slot == slot; });
  slot->arm_queued = false;
}

void ArmQueue::Clear() {
  for (const Queued& q : queue_) q.slot->arm_queued = false;
  queue_.clear();
}

// A slot reused since it was queued, or whose thread is retiring, is
// skipped: its tail takes its points.
size_t ArmQueue::ArmBatch(absl::FunctionRef<void(SlotBase*)> arm) {
  const size_t n = std::min(queue_.size(), kBatch);
  size_t armed = 0;
  for (size_t i = 0; i < n; ++i) {
    SlotBase* slot = queue_[i].slot;
    slot->arm_queued = false;
    if (slot->generation != queue_[i].generation ||
        slot->retiring.load(std::memory_order_acquire)) {
      continue;
    }
    arm(slot);
    ++armed;
  }
  queue_.erase(queue_.begin(), queue_.begin() + static_cast<ptrdiff_t>(n));
  return armed;
}

void WallTickerThread::Start(absl::Duration period, const TickerPacing& pacing,
                             std::function<size_t(size_t, int64_t)> tick,
                             std::function<void()> arm) {
  Threads* t = threads_.get();
  {
    std::lock_guard<std::mutex> lock(t->mutex);
    t->stop = false;
    t->arm = false;
  }
  arm_wake_pending_.store(false, std::memory_order_relaxed);
  t->armer = std::thread([this, t, arm = std::move(arm)] {
    pthread_setname_np(pthread_self(), "inprof-arm");
    MarkProfilerThread();
    std::unique_lock<std::mutex> lock(t->mutex);
    while (!t->stop) {
      t->cv.wait(lock, [t] { return t->stop || t->arm; });
      if (t->stop) break;
      // Threads that registered in a burst wait for their arming.
      t->arm = false;
      lock.unlock();
      RunContained("arming registered threads", [&] {
        arm_wake_pending_.store(false, std::memory_order_release);
        arm();
      });
      lock.lock();
    }
  });
  t->thread = std::thread([t, period, &pacing, tick = std::move(tick)] {
    pthread_setname_np(pthread_self(), "inprof-tick");
    MarkProfilerThread();
    // Its own descriptor table: the /proc/self/task/TID/syscall files it
    // opens, keeps and closes never take or close a number of the
    // program's, whatever the program does meanwhile (dup2 onto a number,
    // close_range). DESIGN.md, "Hard rules of the host".
    EnterPrivateDescriptorTable();
    const auto step = absl::ToChronoNanoseconds(period);
    // Intervals drawn uniformly from [0.5, 1.5] x `step`: visits at fixed
    // intervals lock onto a program's own rhythm (measured: a thread
    // sleeping 5 ms and spinning 5 ms was profiled 90-99.7% asleep at a
    // fixed 10 ms); with random intervals each visit falls at a random
    // phase of any rhythm. Uniform rather than exponential: each visit is
    // worth its interval, and the intervals' spread adds to the profile's
    // variance (exponential: twice a fixed interval's, this: 1.08x).
    absl::BitGen gen;
    auto jittered = [&gen](std::chrono::nanoseconds d) {
      const double u = absl::Uniform<double>(gen, 0.5, 1.5);
      return std::chrono::nanoseconds(
          static_cast<int64_t>(static_cast<double>(d.count()) * u));
    };
    auto next = std::chrono::steady_clock::now() + jittered(step);
    auto last = std::chrono::steady_clock::now();  // the last wake-up's schedule
    size_t batch = 1;
    std::unique_lock<std::mutex> lock(t->mutex);
    // One wake-up standing for `ticks` ticks, scheduled `at`, outside the
    // lock. steady_clock is CLOCK_MONOTONIC in libstdc++ and libc++ on
    // Linux: the same clock as the visits' (NowNanos). A visit that throws
    // (memory pressure) is skipped, never the host.
    auto run_tick = [&](size_t ticks, std::chrono::steady_clock::time_point at) {
      lock.unlock();
      RunContained("a wall-time visit", [&] {
        batch = tick(ticks, std::chrono::duration_cast<std::chrono::nanoseconds>(
                                at.time_since_epoch())
                                .count());
      });
      lock.lock();
    };
    while (!t->stop) {
      t->cv.wait_until(lock, next, [t] { return t->stop || t->replan || t->edge; });
      if (t->stop) break;
      if (t->edge) {
        // A window's edge (TickNow): the ticks since the last wake-up, now;
        // the schedule starts again from here, so that the next wake-up
        // stands for the time after this one only (kept at `next`, it
        // visited a whole batch for what was left of one: ~10% more
        // visits than the budget's at 10,000 threads and 1 s windows).
        t->edge = false;
        const auto now = std::chrono::steady_clock::now();
        const size_t ticks = static_cast<size_t>(std::max<int64_t>(
            1, std::llround(static_cast<double>((now - last).count()) /
                            static_cast<double>(step.count()))));
        run_tick(std::min(ticks, std::max<size_t>(batch, 1)), now);
        last = now;
        next = now + jittered(step * batch * pacing.spacing());
        ++t->edges_done;
        t->cv.notify_all();
        continue;
      }
      if (t->replan) {
        // A thread registered while the ticker waited long: back to the
        // base period, its first visit within one.
        t->replan = false;
        next = std::min(next, std::chrono::steady_clock::now() + jittered(step));
        continue;
      }
      run_tick(batch, next);
      last = next;
      next += jittered(step * batch * pacing.spacing());
      const auto now = std::chrono::steady_clock::now();
      // Fell behind: do not burst.
      if (next < now) next = now + jittered(step);
    }
  });
  armer_ready_.store(true, std::memory_order_release);
}

void WallTickerThread::Stop(bool in_forked_child) {
  // A thread registering from now on arms itself; Stop() forgets the queue.
  armer_ready_.store(false, std::memory_order_release);
  if (!threads_->thread.joinable()) return;
  if (in_forked_child) {
    // A forked child has no ticker thread: detaching it throws, and
    // destroying a condition variable it waited on can hang. Leak the
    // parent's ticker state (a few dozen bytes) and start afresh.
    (void)threads_.release();
    threads_ = std::make_unique<Threads>();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(threads_->mutex);
    threads_->stop = true;
  }
  threads_->cv.notify_all();
  threads_->thread.join();
  threads_->armer.join();
}

// After RegisterThread queued a prepared slot (registry lock not held).
void WallTickerThread::WakeToArm() {
  if (arm_wake_pending_.exchange(true, std::memory_order_acq_rel)) return;
  {
    std::lock_guard<std::mutex> lock(threads_->mutex);
    threads_->arm = true;
  }
  threads_->cv.notify_all();
}

void WallTickerThread::TickNow(absl::Duration timeout) {
  if (!armer_ready_.load(std::memory_order_acquire)) return;
  Threads* t = threads_.get();
  std::unique_lock<std::mutex> lock(t->mutex);
  if (t->stop) return;
  const uint64_t done = t->edges_done;
  t->edge = true;
  t->cv.notify_all();
  t->cv.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                 [t, done] { return t->stop || t->edges_done != done; });
}

void WallTickerThread::Replan() {
  {
    std::lock_guard<std::mutex> lock(threads_->mutex);
    threads_->replan = true;
  }
  threads_->cv.notify_all();
}

}  // namespace inprof::internal
