#include "inprof/wall_time_provider.h"

#include <sys/syscall.h>
#include <unistd.h>
#include <time.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "inprof/internal/thread_info.h"

namespace inprof {

int64_t WallTimeProvider::NowNanos() noexcept {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

absl::Status WallTimeProvider::Configure(const Options& options) {
  period_ = options.wall_period;
  threads_per_tick_ = static_cast<size_t>(
      options.wall_threads_per_tick > 0 ? options.wall_threads_per_tick : 1);
  // A small share of the descriptors still free: the host's own come first
  // (the perf engine takes INPROF_PERF_FD_SHARE, 25% by default).
  kept_files_.Configure(1, 16, kMaxKeptFiles, "the wall sampler",
                        "further threads' /proc/self/task/TID/syscall files "
                        "are opened at each look instead of kept open");
  return absl::OkStatus();
}

std::string WallTimeProvider::Describe() const {
  const std::string held = kept_files_.Describe();
  return held.empty() ? held : absl::StrCat("wall sampler's kept files ", held);
}

absl::Status WallTimeProvider::ArmThread(ThreadContext& thread,
                                         ThreadData& data, int /*tag*/) {
  if (period_ == absl::ZeroDuration() || data.armed) return absl::OkStatus();
  data.last_wall_ns = NowNanos();
  data.covered_at_arm = rounds_covered_.load(std::memory_order_relaxed);
  data.last_look_ns = data.last_wall_ns;
  data.pending_wall_ns.store(0, std::memory_order_relaxed);
  data.cpu_mark.store(internal::ThreadCpuNanos(thread.cpu_clock),
                      std::memory_order_relaxed);
  // The following's fields belong to the registry lock (drains read them
  // while a registering thread arms outside it): TakeTail reset them when
  // the slot's last tail was taken, and a new slot starts with them reset.
  data.armed = true;
  data.tail_pending = true;
  data.fresh = true;
  data.exact = false;
  return absl::OkStatus();
}

void WallTimeProvider::DisarmThread(ThreadContext&, ThreadData& data) noexcept {
  data.armed = false;
  if (!data.syscall_file.valid()) return;
  if (data.syscall_file.InThisTable()) {
    data.syscall_file.Reset();  // closed only if it is still inprof's
  } else {
    // The ticker's (its own table): closed there, at its next visit.
    const internal::OwnedFd::Parked parked = data.syscall_file.Park();
    std::lock_guard<std::mutex> lock(parked_mutex_);
    if (parked_count_ < parked_.size()) {
      parked_[parked_count_++] = parked;
      any_parked_.store(true, std::memory_order_release);
    }
  }
  kept_files_.Give();
}

void WallTimeProvider::CloseParkedFiles() noexcept {
  if (!any_parked_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(parked_mutex_);
  for (size_t i = 0; i < parked_count_; ++i) {
    // Those of another table (a ticker of an earlier session, whose table
    // went with it) are dropped too.
    internal::OwnedFd::CloseParked(parked_[i]);
  }
  parked_count_ = 0;
  any_parked_.store(false, std::memory_order_release);
}

bool WallTimeProvider::OnSignal(ThreadContext&, ThreadData& data,
                                const siginfo_t&,
                                std::span<int64_t> values) noexcept {
  const int64_t owed = data.pending_wall_ns.exchange(0, std::memory_order_acq_rel);
  if (owed <= 0) return false;
  values[0] = 1;
  values[1] = owed;
  return true;
}

bool WallTimeProvider::TakeStackRead(ThreadData& data,
                                     std::span<int64_t> values) noexcept {
  const int64_t owed = data.pending_wall_ns.exchange(0, std::memory_order_acq_rel);
  if (owed <= 0) return false;
  // VisitThread counted the signal it asked for.
  --data.signals;
  --counts_.blocked_signals;
  ++counts_.blocked_stack_reads;
  values[0] = 1;
  values[1] = owed;
  return true;
}

bool WallTimeProvider::TakeTail(ThreadContext& thread, ThreadData& data,
                                std::span<int64_t> values) {
  // A thread that unregistered itself read the clock as it did.
  const int64_t exit_ns = thread.exit_wall_ns.load(std::memory_order_relaxed);
  const bool weighed = data.weighed;
  data.weighed = false;
  data.round_weight = RoundWeight::kNotYet;
  if (!data.tail_pending) return false;
  data.tail_pending = false;
  const int64_t now = exit_ns >= 0 ? std::max(exit_ns, data.last_wall_ns) : NowNanos();
  // Owed to a signal that never ran (the weight of a sample the thread's
  // handler did not take). The time since the last visit is not owed: each
  // visit's weight stands for the interval after it (VisitThread), so a
  // thread that ends between two visits has nothing left to credit. A
  // followed thread is the exception: its running samples carry its wall
  // time as it goes, and the visits only settle what they did not carry,
  // up to the visit; its tail is the time since, less what its samples
  // carried.
  int64_t owed = data.pending_wall_ns.exchange(0) + data.follow_balance_ns;
  // A thread never visited while every thread is visited at each wake-up:
  // its time since arming, as its first visit would have credited. No other
  // visit carries it there: it was lost, 3-4 ms of a 3 ms thread beside the
  // sampler at 1 ms (safety_alloc_failure's threads, before it checked CPU).
  if (data.exact) {
    owed += now - data.last_wall_ns;
  } else if (data.fresh && every_thread_visited_) {
    owed += std::max<int64_t>(0, now - std::max(data.last_wall_ns, handed_ns_));
  }
  // A thread weighed at the ticker's last wake-up, which visited only some
  // of the threads (each with chance 1/round_factor_), that ended before
  // the next: its time since that wake-up, times the factor, to where the
  // visit found it. The visits of the next wake-up stand for the threads
  // still there (TickerPacing::Ended takes the others' time out of what
  // they hand out): ended threads' time is estimated from the visits
  // before their end, unbiased (Horvitz-Thompson), and nothing is left
  // for a wake-up that finds them gone. Handed to the visits of the next
  // wake-up instead, it had no taker when the threads ended together: at
  // 10,000 threads the window in which they ended held 0.72-0.85 of their
  // lifetimes in it (bench/sampling/many_threads).
  if (!data.exact && exit_ns >= 0 && weighed) {
    const int64_t share = EndedShare(data.covered_at_arm, exit_ns);
    owed += share;
    ended_between_ns_ += static_cast<uint64_t>(share);
    const double ms = static_cast<double>(share) / 1e6;
    ended_share_sq_ms2_ += ms * ms;
  }
  if (data.following) owed -= data.followed_ns;
  owed = std::max<int64_t>(0, owed);
  data.exact = false;
  data.following = false;
  data.follow_balance_ns = 0;
  data.followed_ns = 0;
  data.last_wall_ns = now;
  values[0] = 0;
  values[1] = owed;
  return owed > 0;
}

// Horvitz-Thompson: the round robin looks at each thread once a round, and
// a wake-up that looks at j of n threads covers j/n of a round: a thread
// armed when the wake-ups had covered A rounds is weighed at a visit by
// the last wake-up before its end (L rounds covered) with chance
// min(1, L - A) (a thread registers at a random place of the round
// robin). One that was is credited
// its time from that wake-up to its end over that chance, to the stack its
// last visit saw -- the whole of it for a thread that lived through a
// round. The threads' total is their time, in expectation, and nothing is
// left for a wake-up that finds them gone. From the last wake-up's visits
// alone (6-17 when the window's edge had just asked for one), the window
// in which 10,000 threads ended held 0.65-1.11 of their time in it.
int64_t WallTimeProvider::EndedShare(double covered_at_arm, int64_t exit_ns) const {
  const uint64_t kept = std::min<uint64_t>(round_count_, rounds_.size());
  for (uint64_t k = 1; k <= kept; ++k) {
    const Round& round = rounds_[(round_count_ - k) % rounds_.size()];
    if (round.at_ns >= exit_ns) continue;  // after its end
    if (round.covered <= covered_at_arm) return 0;
    const double chance = std::min(1.0, round.covered - covered_at_arm);
    return std::llround(static_cast<double>(exit_ns - round.at_ns) / chance);
  }
  return 0;
}

TickDecision WallTimeProvider::VisitThread(ThreadContext& thread, ThreadData& data,
                                           TickTime when, bool has_episode_stack,
                                           bool has_running_sample,
                                           std::span<int64_t> values) {
  const TickDecision decision =
      VisitOnce(thread, data, when, has_episode_stack, has_running_sample, values);
  if (data.round_weight == RoundWeight::kTaken) data.weighed = true;
  return decision;
}

TickDecision WallTimeProvider::VisitOnce(ThreadContext& thread,
                                           ThreadData& data, TickTime when,
                                           bool has_episode_stack,
                                           bool has_running_sample,
                                           std::span<int64_t> values) {
  CloseParkedFiles();
  data.steady_visit = false;
  data.round_weight = RoundWeight::kNotYet;
  every_thread_visited_ = !when.round_weights;
  handed_ns_ = when.handed_ns;
  if (!data.armed) return TickDecision::kSkip;
  // Credited up to the visit's scheduled time (TickTime); a thread armed
  // after it waits for the next visit.
  const int64_t credit_to = when.scheduled_ns;
  // A visit's weight is fixed when it is taken: TickTime::round_ns, the
  // visit's share of the registered threads' time since the ticker's
  // previous wake-up (Horvitz-Thompson: a thread is visited in a wake-up
  // with chance visits/threads). A thread visited every R seconds
  // is credited about R per visit, and one that lives L seconds is visited
  // L/R times on average (it enters the round robin at a random place, and
  // the round robin's phase against its end is arbitrary), so nothing is
  // left to credit when it ends, time spent on a stack is credited there on
  // average, and each wake-up credits its interval's worth for every
  // thread: an export window's total is its threads' lifetimes in it, up
  // to the wake-ups at its edges. A thread once followed keeps an exact
  // account instead (ThreadData::exact): its visits credit the time since
  // the previous one. When every thread is visited at each wake-up
  // (TickTime::round_weights false: a few threads), every visit credits
  // the time since the previous one, the first the time since arming, and
  // the account is exact from then on: the following that begins later
  // credits the interval before it, and the tail the time since the last
  // visit. (The first visit weighed a round estimate instead, which stood
  // for the interval after it, and later visits credited the interval
  // before them: a thread whose following began at its second visit lost
  // both the wait for its first visit and the interval to its second, 14
  // ms of a 0.3 s busy thread at 10 ms, and every thread its time since
  // its last visit when it ended: GperftoolsTest.WallTimeOnlyWhen...)
  const int64_t backward = credit_to - data.last_wall_ns;
  if (backward <= 0) return TickDecision::kSkip;
  const int64_t weight = when.round_ns > 0 ? when.round_ns : backward;
  const bool fresh = data.fresh;
  const bool estimated = when.round_weights && (fresh || !data.exact);
  // Not estimated, the visit credits the thread's own interval. One whose
  // own account begins here credits from where the wake-ups stopped handing
  // out the threads' time (its time before is in their shares): not from
  // its last visit, whose weight stood for a share, nor from its arming.
  const int64_t own_from =
      data.exact ? data.last_wall_ns : std::max(data.last_wall_ns, when.handed_ns);
  if (!estimated && credit_to <= own_from) return TickDecision::kSkip;
  int64_t elapsed = estimated ? weight : credit_to - own_from;
  // A visit that credits: the thread's account runs up to credit_to, and
  // is exact when the visit credited its own interval.
  auto credited = [&] {
    data.last_wall_ns = credit_to;
    data.fresh = false;
    if (!estimated) data.exact = true;
  };
  const int64_t clock = internal::ThreadCpuNanos(thread.cpu_clock);
  if (clock < 0) {  // exited
    data.round_weight = RoundWeight::kEnded;
    return TickDecision::kSkip;
  }
  // Changed below where the visit credits nothing, or credits the time
  // since arming instead.
  data.round_weight = estimated ? RoundWeight::kTaken : RoundWeight::kOwnAccount;
  // A thread that ran throughout the interval since the last look (its CPU
  // clock advanced by nearly all the wall time): see below.
  const int64_t previous_mark = data.cpu_mark.load(std::memory_order_relaxed);
  const int64_t since_look = when.now_ns - data.last_look_ns;
  bool ran_throughout =
      previous_mark >= 0 && since_look > 0 &&
      (clock - previous_mark) * 100 >= since_look * kRanThroughoutPercent;
  if (when.out_of_round && !data.following) {
    // Visited because it ran: a sample taken then would be one more of it
    // running. Only the following begins out of the round: when a CPU
    // sample of it is there and it runs or waits for a core now -- on a
    // busy machine a busy thread does not get 97% of a core, and unfollowed
    // in a round of thousands its first visit would weigh the whole round
    // (a 3 s busy thread among 10,000 credited 20 s).
    data.round_weight = RoundWeight::kOwnAccount;  // never in the round
    if (!has_running_sample) return TickDecision::kSkip;
    if (!ran_throughout) {
      const internal::ThreadLook peek =
          internal::LookAtThread(thread.tid, &data.syscall_file, /*keep=*/false);
      ++counts_.state_reads;
      if (peek.state != 'R') return TickDecision::kSkip;
      ran_throughout = true;  // runs, or waits for a core: where it ran
    }
  }
  // Wall time its running samples carried ahead of the visits while it was
  // followed (a sample drained just after the visit that began the
  // following is worth time that visit credited) is taken off what it is
  // owed next, so that its total stays its lifetime.
  const int64_t ahead = !data.following && data.follow_balance_ns < 0
                            ? std::min(-data.follow_balance_ns, elapsed - 1)
                            : 0;
  if (ahead > 0) {
    data.follow_balance_ns += ahead;
    elapsed -= ahead;
  }
  if (data.pending_wall_ns.load(std::memory_order_acquire) > 0 &&
      clock == data.signal_sent_clock &&
      when.now_ns - data.signal_sent_ns >= kSignalLostAfterNs) {
    // A signal not taken this long after it was sent, by a thread that has
    // not run a nanosecond since, was not delivered: the thread blocks
    // SIGPROF in its signal mask (or is stopped), and the signal waits in
    // the kernel, which would discard a second one. Not sent again, and
    // not a reason to keep waking: the time stays owed to that signal,
    // whose handler takes it when the thread unblocks it (or the tail
    // does). Seen under ThreadSanitizer, whose deferred signal handling
    // once left a thread waiting with every signal blocked: the sampler
    // re-signalled it every kSignalLostAfterNs and woke every period.
    data.pending_wall_ns.fetch_add(elapsed, std::memory_order_acq_rel);
    credited();
    data.last_look_ns = when.now_ns;
    data.steady_visit = true;
    ++counts_.undelivered;
    return TickDecision::kSkip;
  }
  if (data.last_look_blocked && has_episode_stack &&
      clock == data.cpu_mark.load(std::memory_order_relaxed) &&
      data.pending_wall_ns.load(std::memory_order_acquire) == 0) {
    // Not a nanosecond of CPU since it was last seen blocked in this
    // episode: it has not run, so it waits where it waited (or was just
    // woken and waits for a core). No /proc reads: an idle thread's visit
    // costs one clock read, as it did before the kernel's state was read.
    credited();
    data.last_look_ns = when.now_ns;
    data.steady_visit = true;
    ++counts_.blocked;
    values[0] = 1;
    values[1] = elapsed;
    return TickDecision::kCreditBlocked;
  }
  // A thread whose CPU clock advanced by nearly all the wall time since the
  // last look ran throughout and is running now, or stopped microseconds
  // ago: signalled as running without asking the kernel. Reading
  // /proc/PID/task/TID/stat costs ~60 us on a 2-core VM, 40% of a
  // visit to a running thread (bench/overhead cpu-1: the ticker's CPU).
  // Real time since that look, not the credited interval: the ticker's
  // lateness would otherwise count as the thread's.
  // One read says both whether it runs and, if not, where it waits.
  internal::ThreadLook look;
  look.state = 'R';
  bool looked = false;
  if (!ran_throughout) {
    // Its file stays open for the next looks while the budget allows.
    const bool had_file = data.syscall_file.valid();
    const bool keep = !had_file && kept_files_.TryTake();
    look = internal::LookAtThread(thread.tid, &data.syscall_file, keep);
    // Not kept after all (the thread is gone), or found taken by the
    // program (closed, the number maybe reused): its share is free again.
    if ((keep || had_file) && !data.syscall_file.valid()) kept_files_.Give();
    looked = true;
    ++counts_.state_reads;
  }
  const char state = look.state;
  if (state == 0) {  // exited
    data.round_weight = RoundWeight::kEnded;
    return TickDecision::kSkip;
  }
  credited();
  // The thread's own CPU since the last look or, when one of inprof's
  // handlers ran on it since (a sample, CPU or wall), since that handler
  // returned: what the sample cost it is not the thread running.
  const int64_t mark = std::max(
      data.cpu_mark.load(std::memory_order_relaxed),
      thread.handler_exit_clock.load(std::memory_order_relaxed));
  data.cpu_mark.store(clock, std::memory_order_relaxed);
  data.last_look_ns = when.now_ns;
  const bool barely_ran = mark >= 0 && clock - mark <= kBlockedCpuSlackNs;

  // A followed thread: its running samples carried the interval's wall
  // time, up to the balance.
  const int64_t followed = data.followed_ns;
  data.followed_ns = 0;
  if (data.following) {
    const int64_t balance = data.follow_balance_ns + elapsed - followed;
    if (ran_throughout) {
      ++counts_.running;
      ++counts_.following;
      data.steady_visit = true;
      if (has_running_sample && balance > 0) {
        // The rest goes to the newest running sample's stack (a CPU sample
        // taken in the interval, drained before this visit).
        data.follow_balance_ns = 0;
        ++counts_.running_credits;
        values[0] = 0;
        values[1] = balance;
        return TickDecision::kCreditRunning;
      }
      data.follow_balance_ns = balance;  // carried to the next visit
      return TickDecision::kFollowing;
    }
    // No longer running throughout: what the samples did not carry is time
    // the thread did not run, charged below to where it is now (at least a
    // nanosecond, so that a signal sent for it takes its stack; time carried
    // ahead is taken off later visits).
    // Its account stays exact (ThreadData::exact): its next visits credit
    // the intervals before them, and its tail the time after the last.
    data.following = false;
    data.follow_balance_ns = std::min<int64_t>(balance - 1, 0);
    elapsed = std::max<int64_t>(balance, 1);
  }

  // 'R' with barely any CPU since the thread was last seen blocked is the
  // thread woken from its wait (by its event, or by our signal) and not yet
  // back at its own work -- often waiting for a core on a busy machine: the
  // time still belongs to the wait.
  const bool blocked =
      state != 'R' ||
      ((data.last_look_blocked || data.blocked_signal_sent) && barely_ran);
  if (data.pending_wall_ns.load(std::memory_order_acquire) > 0 &&
      when.now_ns - data.signal_sent_ns < kSignalLostAfterNs) {
    // A signal is still on its way: the time is owed to that sample. Never
    // a second signal (nor a second EINTR) before the first was handled --
    // unless it was lost (a pending SIGPROF swallows a queued one).
    data.pending_wall_ns.fetch_add(elapsed, std::memory_order_acq_rel);
    return TickDecision::kSkip;
  }
  data.last_look_blocked = blocked;
  if (!blocked) {
    ++counts_.running;
    data.blocked_signal_sent = false;
    data.signal_blocked.store(false, std::memory_order_relaxed);
    if (ran_throughout && has_running_sample) {
      // Ran throughout, and sampled by its CPU provider meanwhile: its wall
      // time went where its CPU went, and from now on its running samples
      // carry its wall time as it goes. No second signal, walk and EINTR
      // risk for a busy thread. At its first visit the time since it was
      // armed (it ran throughout) goes to that sample's stack; after
      // earlier visits, their weights stood for the interval up to now.
      // Wall time credited ahead (follow_balance_ns < 0: a running sample
      // of an earlier following carried CPU from before it began) is kept,
      // to be taken off what this following's visits settle: this visit
      // credits nothing to take it off. Reset to 0, one such sample's worth
      // was forgotten per following, and a thread whose following came and
      // went (a busy thread on a loaded machine) was credited 15% more than
      // its lifetime.
      data.following = true;
      const bool was_exact = data.exact;
      data.exact = true;
      data.round_weight = RoundWeight::kOwnAccount;
      if (!was_exact && when.round_weights) {
        // Among threads whose time the wake-ups hand out: its own account
        // begins now, and the ticker counts it out from here
        // (KeepsOwnAccounts). Its time up to now is in the shares: a visit
        // in the round takes its share, as any would, to where it ran; one
        // ahead of the round takes none (its share went to the round's
        // visits). Crediting it the time since its arming or its last visit
        // instead counted that time twice, and dropping its shares from
        // then on left the threads' total off by a round (0.6 s of 720 s).
        data.last_wall_ns = when.now_ns;
        if (when.out_of_round) {
          data.follow_balance_ns = std::min<int64_t>(data.follow_balance_ns - ahead, 0);
          return TickDecision::kFollowing;
        }
        data.round_weight = RoundWeight::kTaken;
      }
      // Its share, or the interval before the visit (less what was
      // credited ahead), which it ran throughout.
      data.follow_balance_ns = std::min<int64_t>(data.follow_balance_ns, 0);
      ++counts_.running_credits;
      values[0] = 1;
      values[1] = elapsed;
      return TickDecision::kCreditRunning;
    }
    // Running or runnable: its stack now, in the handler.
    data.pending_wall_ns.fetch_add(elapsed, std::memory_order_acq_rel);
    data.signal_sent_ns = when.now_ns;
    data.signal_sent_clock = clock;
    ++data.signals;
    return TickDecision::kSignal;
  }
  ++counts_.blocked;
  // Where it waits: from the look above (one snapshot of state and site).
  // A look that found it running (just woken, still counted as blocked)
  // has no site, and a second read would say "running" again: the episode
  // goes on if it barely ran. Asked now only when there was no look.
  const internal::SyscallSite site =
      looked ? look.site : internal::ThreadSyscallSite(thread.tid);
  if (site.nr == SYS_rt_sigtimedwait) {
    // sigwait, sigwaitinfo, sigtimedwait: a signal would end the wait as
    // one of the program's own (kSigwaitFrame). Not an episode: the next
    // visit looks again.
    data.blocked_signal_sent = false;
    data.episode_site = internal::SyscallSite{};
    values[0] = 1;
    values[1] = elapsed;
    return TickDecision::kCreditSigwait;
  }
  if (has_episode_stack && barely_ran &&
      (!site.known() || !data.episode_site.known() || site == data.episode_site)) {
    // The same episode: it did not run since it was seen there (woken by
    // our signal, or by an event handled in microseconds).
    data.steady_visit = true;
    values[0] = 1;
    values[1] = elapsed;
    return TickDecision::kCreditBlocked;
  }
  // One that ran left the wait and came back: a new episode, even at the
  // same sp and pc, which a system call's wrapper reaches from any caller
  // at the same depth (a loop's two reads, two helpers of one frame size).
  // Taken as the same episode, each such thread's time went to the stack
  // of its first episode for the rest of the run: 200 threads napping in
  // two functions of one frame size credited their time to the wrong one
  // by 3-4x the sampling spread (WallManyThreadsTest.EachStacksWallTime...).
  // A new blocking episode: its stack read without a signal where it can
  // be (WallTicker: ReadBlockedStack), else one signal to learn where.
  ++counts_.blocked_signals;
  data.episode_site = site;
  data.signal_sent_ns = when.now_ns;
  data.signal_sent_clock = clock;
  data.blocked_signal_sent = true;
  data.signal_blocked.store(true, std::memory_order_relaxed);
  data.pending_wall_ns.fetch_add(elapsed, std::memory_order_acq_rel);
  ++data.signals;
  return TickDecision::kSignalBlocked;
}

}  // namespace inprof
