#include "inprof/cpu_time_provider.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/perf_event.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "absl/numeric/int128.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "inprof/base/sanitizers.h"
#include "inprof/internal/cpu_lattice.h"
#include "inprof/internal/thread_info.h"

namespace inprof {
namespace {

perf_event_attr TaskClockAttr(uint64_t period_ns, bool kernel) {
  perf_event_attr attr;
  std::memset(&attr, 0, sizeof(attr));
  attr.size = sizeof(attr);
  attr.type = PERF_TYPE_SOFTWARE;
  attr.config = PERF_COUNT_SW_TASK_CLOCK;
  attr.sample_period = period_ns;
  attr.disabled = 1;  // enabled once the signal's owner is set
  attr.exclude_kernel = kernel ? 0 : 1;
  attr.exclude_hv = 1;
  attr.wakeup_events = 1;
  return attr;
}

int OpenTaskClock(pid_t tid, uint64_t period_ns, bool kernel) {
  perf_event_attr attr = TaskClockAttr(period_ns, kernel);
  return static_cast<int>(syscall(SYS_perf_event_open, &attr, tid, -1, -1,
                                  PERF_FLAG_FD_CLOEXEC));
}

}  // namespace

CpuTimeProvider::ThreadData::~ThreadData() {
  if (perf_fd >= 0) internal::CloseIfOurs(perf_fd, perf_identity);
}

absl::Status CpuTimeProvider::Configure(const Options& options) {
  period_ns_ = absl::ToInt64Nanoseconds(options.cpu_period);
  if (period_ns_ <= 0) {
    return absl::InvalidArgumentError("cpu_period must be positive");
  }
  requested_ = options.cpu_engine;
  armed_perf_ = armed_timer_ = armed_itimer_ = perf_fallbacks_ = 0;
  perf_unavailable_.clear();
  perf_kernel_ = false;

  // Probe the perf engine on the calling thread: with kernel mode first,
  // then user space only (perf_event_paranoid = 2 without CAP_PERFMON).
  bool perf_ok = false;
  if (requested_ == CpuEngine::kAuto || requested_ == CpuEngine::kPerf) {
    int fd = OpenTaskClock(0, static_cast<uint64_t>(period_ns_), true);
    if (fd >= 0) {
      perf_kernel_ = true;
    } else {
      const int kernel_errno = errno;
      fd = OpenTaskClock(0, static_cast<uint64_t>(period_ns_), false);
      if (fd < 0) {
        perf_unavailable_ = absl::StrCat("perf_event_open(task-clock): ",
                                         strerror(kernel_errno));
      }
    }
    if (fd >= 0) {
      close(fd);
      perf_ok = true;
    }
  }
  // The share of descriptors still free that the engine may hold.
  if (perf_ok) {
    // At most perf_threads of them (options.h: what a perf event costs).
    perf_fds_.Configure(options.perf_fd_share, 100, options.perf_threads, "the perf engine",
                        "further threads use the timer engine", "INPROF_PERF_THREADS");
    if (perf_fds_.limit() <= 0) {
      perf_ok = false;
      perf_unavailable_ = options.perf_fd_share == 0  ? "INPROF_PERF_FD_SHARE=0"
                          : options.perf_threads == 0 ? "INPROF_PERF_THREADS=0"
                                                      : "no file descriptors to spare under "
                                                        "RLIMIT_NOFILE";
    }
  }

  switch (requested_) {
    case CpuEngine::kPerf:
      if (!perf_ok) {
        return absl::FailedPreconditionError(absl::StrCat(
            "INPROF_CPU_ENGINE=perf: perf events are not available (",
            perf_unavailable_, ")"));
      }
      engine_ = CpuEngine::kPerf;
      break;
    case CpuEngine::kAuto:
      // A user-space-only event loses the CPU of system calls (an overflow
      // in kernel mode is dropped); the timer engine keeps it, at tick
      // precision. Accuracy first.
      if (perf_ok && !perf_kernel_) {
        perf_unavailable_ =
            "perf events are limited to user space (perf_event_paranoid); "
            "the timer engine keeps kernel CPU";
      }
      engine_ = perf_ok && perf_kernel_ ? CpuEngine::kPerf : CpuEngine::kTimer;
      break;
    case CpuEngine::kTimer:
      engine_ = CpuEngine::kTimer;
      break;
    case CpuEngine::kItimer:
      engine_ = CpuEngine::kItimer;
      break;
  }
  return absl::OkStatus();
}

CpuTimeProvider::EngineCounts CpuTimeProvider::counts() const {
  EngineCounts c;
  c.perf = armed_perf_.load(std::memory_order_relaxed);
  c.timer = armed_timer_.load(std::memory_order_relaxed);
  c.itimer = armed_itimer_.load(std::memory_order_relaxed);
  c.perf_fallbacks = perf_fallbacks_.load(std::memory_order_relaxed);
  c.perf_fd_budget = perf_fds_.limit();
  return c;
}

std::string CpuTimeProvider::Describe() const {
  const EngineCounts counts = this->counts();
  std::string s = absl::StrCat("cpu engine=", CpuEngineName(engine_));
  switch (engine_) {
    case CpuEngine::kPerf:
      absl::StrAppend(&s, " (task-clock perf event per thread, hrtimer; ",
                      perf_kernel_ ? "kernel mode included"
                                   : "user space only: kernel CPU goes to "
                                     "the next user-space sample",
                      "; up to ", perf_fds_.limit(), " descriptors)");
      break;
    case CpuEngine::kTimer:
      absl::StrAppend(&s, " (POSIX CPU timer per thread, scheduler-tick "
                          "precision");
      if (!perf_unavailable_.empty()) {
        absl::StrAppend(&s, "; perf not used: ", perf_unavailable_);
      }
      absl::StrAppend(&s, ")");
      break;
    case CpuEngine::kItimer:
      absl::StrAppend(&s, " (process-wide ITIMER_PROF)");
      break;
    case CpuEngine::kAuto:
      break;
  }
  if (counts.perf + counts.timer + counts.itimer > 0) {
    absl::StrAppend(&s, "; threads armed: perf=", counts.perf,
                    " timer=", counts.timer, " itimer=", counts.itimer);
    if (counts.perf_fallbacks > 0) {
      absl::StrAppend(&s, " (", counts.perf_fallbacks,
                      " moved from perf to timer: descriptor budget, INPROF_PERF_THREADS or "
                      "perf_event_open failure)");
    }
  }
  if (engine_ == CpuEngine::kPerf) {
    if (const std::string held = perf_fds_.Describe(); !held.empty()) {
      absl::StrAppend(&s, "; perf descriptors ", held);
    }
  }
  return s;
}

int64_t CpuTimeProvider::FirstPeriod() {
  // SplitMix64 (Steele, Lea and Flood 2014): the state steps by the golden
  // gamma, the output is its mix; uniform over 64 bits, then scaled to
  // (0, period] by a 128-bit multiply (bias below 2^-40 for any period).
  uint64_t z = first_point_state_.fetch_add(0x9e3779b97f4a7c15ULL,
                                            std::memory_order_relaxed) +
               0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  const uint64_t scaled = absl::Uint128High64(
      absl::uint128(z) * absl::uint128(static_cast<uint64_t>(period_ns_)));
  return static_cast<int64_t>(scaled) + 1;
}

bool CpuTimeProvider::PrepareThread(ThreadContext& thread, ThreadData& data) {
  if (engine_ != CpuEngine::kPerf || data.armed || data.prepared) return false;
  const int64_t now = internal::ThreadCpuNanos(thread.cpu_clock);
  if (now < 0) return false;
  const int64_t first = FirstPeriod();
  data.period_ns.store(period_ns_, std::memory_order_relaxed);
  data.next_due_ns.store(now + first, std::memory_order_relaxed);
  data.first_point_ns.store(now + first, std::memory_order_relaxed);
  data.last_cpu_ns.store(-1, std::memory_order_relaxed);  // no sample yet
  data.first_overflow_pending.store(false, std::memory_order_relaxed);
  // OwesSample and TakeSwallowed read the lattice as the perf engine's
  // (no event yet: perf_fd stays -1, so nothing is restarted).
  data.signal_engine.store(CpuEngine::kPerf, std::memory_order_relaxed);
  data.tail_engine = CpuEngine::kPerf;
  data.tail_pending = true;
  data.prepared = true;
  return true;
}

absl::Status CpuTimeProvider::ArmThread(ThreadContext& thread,
                                        ThreadData& data, int tag) {
  if (data.armed) return absl::OkStatus();
  const int64_t now = internal::ThreadCpuNanos(thread.cpu_clock);
  if (now < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "thread ", thread.tid, " has exited without unregistering"));
  }
  data.period_ns.store(period_ns_, std::memory_order_relaxed);
  if (!data.prepared) data.last_cpu_ns.store(now, std::memory_order_relaxed);
  absl::Status status;
  if (engine_ == CpuEngine::kPerf) {
    // Reserve a descriptor of the budget first: threads arm concurrently.
    uint64_t soft_limit = 0;  // read by TryTake; the event's move needs it
    if (perf_fds_.TryTake(&soft_limit)) {
      try {
        status = ArmPerf(thread, data, tag, now, soft_limit);
      } catch (...) {  // std::bad_alloc making its error
        perf_fds_.Give();
        throw;
      }
      if (status.ok()) return status;
      perf_fds_.Give();
    }
    perf_fallbacks_.fetch_add(1, std::memory_order_relaxed);
  }
  if (engine_ != CpuEngine::kItimer) {
    status = ArmTimer(thread, data, tag);
    if (status.ok()) return status;
  }
  if (data.prepared) {
    // The itimer engine measures CPU from its arming: the points crossed
    // since the preparation are taken now, with the stack the thread
    // unregisters from or its tail (it was never sampled; DisarmThread
    // forgets the preparation).
    return status;
  }
  // The last resort: one process-wide timer.
  absl::Status itimer = ArmItimer(thread, data, tag);
  if (itimer.ok()) return itimer;
  return status.ok() ? itimer : status;
}

// A prepared thread (PrepareThread) keeps the lattice it was given: its
// engine's first expiry is the CPU left to its next point from `origin`
// (its clock now), at least `shortest`.
int64_t CpuTimeProvider::FirstExpiry(const ThreadData& data, int64_t origin,
                                     int64_t shortest) {
  if (!data.prepared) return FirstPeriod();
  const int64_t left = data.next_due_ns.load(std::memory_order_relaxed) - origin;
  return std::max(left, shortest);
}

absl::Status CpuTimeProvider::ArmPerf(ThreadContext& thread, ThreadData& data,
                                      int tag, int64_t now, uint64_t soft_limit) {
  // A prepared thread's event overflows at its next point, or within a
  // microsecond when its CPU has passed it (the one-overflow limit keeps
  // that short period from repeating). The origin is ArmThread's read of
  // the clock (`now`): the thread's CPU between it and the enabling makes
  // that first overflow as late, not the point (the read it replaces came
  // one getrlimit later, before the same system calls).
  int64_t first = FirstExpiry(data, data.prepared ? now : 0, kPreparedShortestNs);
  const bool refresh = !perf_refresh_failed_.load(std::memory_order_relaxed);
  // The event's first period ends at the first sample point; without a
  // one-overflow limit, not before the floor (the point itself stays where
  // it was drawn and is counted by that later sample).
  const int64_t event_first =
      refresh ? first : std::max(first, std::min(period_ns_, kPerfFirstPeriodFloorNs));
  // Above the numbers the program's open() takes first, before O_ASYNC
  // (the overflow signal's si_fd is the number O_ASYNC was set on).
  const int opened = OpenTaskClock(thread.tid, static_cast<uint64_t>(event_first),
                                   perf_kernel_);
  if (opened < 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "perf_event_open for thread ", thread.tid, ": ", strerror(errno)));
  }
  internal::FdIdentity identity;
  const int fd = internal::MovePerfEventAboveProgramRange(opened, &identity, soft_limit);
  if (fd < 0) {
    return absl::AbortedError(absl::StrCat(
        "the perf event of thread ", thread.tid, " lost its number to the "
        "program (dup2) before inprof moved it"));
  }
  f_owner_ex owner{F_OWNER_TID, thread.tid};
  if (fcntl(fd, F_SETFL, O_ASYNC) != 0 ||
      fcntl(fd, F_SETSIG, internal::kProfilingSignal) != 0 ||
      fcntl(fd, F_SETOWN_EX, &owner) != 0) {
    const int err = errno;
    close(fd);
    return absl::InternalError(absl::StrCat(
        "cannot route perf overflows to thread ", thread.tid, ": ",
        strerror(err)));
  }
  data.perf_fd = fd;
  data.perf_identity = identity;  // read by the move's checks
  // The handler matches the overflow's si_fd against these.
  thread.perf_tag.store(tag, std::memory_order_relaxed);
  thread.perf_fd.store(fd, std::memory_order_release);
  // The event counts from its enabling, just after this read: the first
  // sample point is `first` of CPU from here.
  const int64_t origin = internal::ThreadCpuNanos(thread.cpu_clock);
  if (origin < 0) {
    thread.perf_fd.store(-1, std::memory_order_release);
    data.perf_fd = -1;
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat(
        "thread ", thread.tid, " has exited without unregistering"));
  }
  if (!data.prepared) {
    data.next_due_ns.store(origin + first, std::memory_order_relaxed);
    data.last_cpu_ns.store(-1, std::memory_order_relaxed);  // no sample yet
  }
  data.first_point_ns.store(origin + first, std::memory_order_relaxed);
  data.first_overflow_pending.store(refresh || event_first != period_ns_,
                                    std::memory_order_relaxed);
  data.signal_engine.store(CpuEngine::kPerf, std::memory_order_relaxed);
  int enabled = -1;
  if (refresh) {
    enabled = ioctl(fd, PERF_EVENT_IOC_REFRESH, 1);
    if (enabled != 0) {
      // Not expected on any kernel this builds for; from now on every
      // thread is armed with a floor instead (the event's period is
      // already set: this one keeps its short first period, which the
      // handler lengthens).
      perf_refresh_failed_.store(true, std::memory_order_relaxed);
      data.first_overflow_pending.store(true, std::memory_order_relaxed);
    }
  }
  if (enabled != 0) enabled = ioctl(fd, PERF_EVENT_IOC_ENABLE, 0);
  if (enabled != 0) {
    const int err = errno;
    thread.perf_fd.store(-1, std::memory_order_release);
    data.perf_fd = -1;
    close(fd);
    return absl::InternalError(absl::StrCat(
        "cannot enable the perf event of thread ", thread.tid, ": ",
        strerror(err)));
  }
  data.engine = data.tail_engine = CpuEngine::kPerf;
  data.armed = true;
  data.tail_pending = true;
  data.prepared = false;
  armed_perf_.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status CpuTimeProvider::ArmTimer(ThreadContext& thread, ThreadData& data,
                                       int tag) {
  struct sigevent sev;
  std::memset(&sev, 0, sizeof(sev));
  sev.sigev_notify = SIGEV_THREAD_ID;
  sev.sigev_signo = internal::kProfilingSignal;
  sev.sigev_value.sival_int = tag;
  sev._sigev_un._tid = thread.tid;
  if (timer_create(thread.cpu_clock, &sev, &data.timer) != 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "timer_create for thread ", thread.tid, " failed: ", strerror(errno)));
  }
  // The timer counts from timer_settime, just after this read.
  const int64_t origin = internal::ThreadCpuNanos(thread.cpu_clock);
  const int64_t first = FirstExpiry(data, origin >= 0 ? origin : 0, 1);
  if (!data.prepared) {
    data.next_due_ns.store((origin >= 0 ? origin : 0) + first,
                           std::memory_order_relaxed);
    data.last_cpu_ns.store(-1, std::memory_order_relaxed);  // no sample yet
  }
  data.signal_engine.store(CpuEngine::kTimer, std::memory_order_relaxed);
  struct itimerspec spec;
  spec.it_value.tv_sec = first / 1'000'000'000;
  spec.it_value.tv_nsec = first % 1'000'000'000;
  spec.it_interval.tv_sec = period_ns_ / 1'000'000'000;
  spec.it_interval.tv_nsec = period_ns_ % 1'000'000'000;
  if (timer_settime(data.timer, 0, &spec, nullptr) != 0) {
    const int err = errno;
    timer_delete(data.timer);
    return absl::InternalError(absl::StrCat(
        "timer_settime for thread ", thread.tid, " failed: ", strerror(err)));
  }
  data.engine = data.tail_engine = CpuEngine::kTimer;
  data.armed = true;
  data.tail_pending = true;
  data.prepared = false;
  armed_timer_.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status CpuTimeProvider::ArmItimer(ThreadContext& thread,
                                        ThreadData& data, int tag) {
  std::lock_guard<std::mutex> lock(itimer_mutex_);
  if (itimer_threads_ == 0) {
    itimerval spec;
    spec.it_interval.tv_sec = period_ns_ / 1'000'000'000;
    spec.it_interval.tv_usec = (period_ns_ % 1'000'000'000) / 1000;
    if (spec.it_interval.tv_sec == 0 && spec.it_interval.tv_usec == 0) {
      spec.it_interval.tv_usec = 1;
    }
    // A random first expiry, as for the per-thread engines: the timer is
    // off whenever no thread is registered, and restarting it with a full
    // period would never fire while threads shorter than a period come and
    // go (measured: 0% of 2,000 such threads' CPU on their stacks).
    const int64_t first = FirstPeriod();
    spec.it_value.tv_sec = first / 1'000'000'000;
    spec.it_value.tv_usec = (first % 1'000'000'000) / 1000;
    if (spec.it_value.tv_sec == 0 && spec.it_value.tv_usec == 0) {
      spec.it_value.tv_usec = 1;
    }
    if (setitimer(ITIMER_PROF, &spec, nullptr) != 0) {
      return absl::InternalError(
          absl::StrCat("setitimer(ITIMER_PROF) failed: ", strerror(errno)));
    }
  }
  // Its samples count from here (a perf or timer arming that failed first
  // may have reset the clock this engine measures from).
  data.last_cpu_ns.store(internal::ThreadCpuNanos(thread.cpu_clock),
                         std::memory_order_relaxed);
  data.signal_engine.store(CpuEngine::kItimer, std::memory_order_relaxed);
  ++itimer_threads_;
  thread.itimer_tag.store(tag, std::memory_order_release);
  data.engine = data.tail_engine = CpuEngine::kItimer;
  data.armed = true;
  data.tail_pending = true;
  armed_itimer_.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

void CpuTimeProvider::DisarmThread(ThreadContext& thread,
                                   ThreadData& data) noexcept {
  if (!data.armed) {
    if (data.prepared) {
      // Never armed: no signal will come; its tail takes its points.
      data.prepared = false;
      data.signal_engine.store(CpuEngine::kAuto, std::memory_order_relaxed);
    }
    return;
  }
  switch (data.engine) {
    case CpuEngine::kPerf:
      thread.perf_fd.store(-1, std::memory_order_release);
      // Only the event inprof opened: the program may have closed it and
      // reused the number.
      if (internal::IsStillOurs(data.perf_fd, data.perf_identity)) {
        ioctl(data.perf_fd, PERF_EVENT_IOC_DISABLE, 0);
        close(data.perf_fd);
      } else {
        internal::NoteDescriptorTaken(data.perf_fd, "a thread's perf event");
      }
      data.perf_fd = -1;
      perf_fds_.Give();
      break;
    case CpuEngine::kTimer:
      timer_delete(data.timer);
      break;
    case CpuEngine::kItimer: {
      thread.itimer_tag.store(0, std::memory_order_release);
      std::lock_guard<std::mutex> lock(itimer_mutex_);
      if (--itimer_threads_ == 0) {
        itimerval off{};
        setitimer(ITIMER_PROF, &off, nullptr);
      }
      break;
    }
    case CpuEngine::kAuto:
      break;
  }
  data.engine = CpuEngine::kAuto;
  data.signal_engine.store(CpuEngine::kAuto, std::memory_order_relaxed);
  data.armed = false;
}

namespace {

// Handler side of the perf engine's first overflow: the event, stopped by
// its one-overflow limit (or still at its short first period), goes on at
// the steady period. Only while `fd` is still that event (fstat and
// PERF_EVENT_IOC_ID, once per arming): a program that closed it and put a
// file of its own on the number never gets perf's ioctls on that file.
// Async-signal-safe.
void ContinueAtSteadyPeriod(int fd, const internal::FdIdentity& identity,
                            int64_t period_ns) noexcept {
  if (fd < 0) return;
#if defined(INPROF_TSAN)
  // ThreadSanitizer models the check's fstat in a handler as a use of the
  // number that races with a close() of it elsewhere, and its report of
  // that use (of a thread gone since) fails its own CHECK: the ioctls go
  // unchecked there, as before the check.
  (void)identity;
#else
  if (!internal::IsStillOurs(fd, identity)) return;
#endif
  uint64_t period = static_cast<uint64_t>(period_ns);
  ioctl(fd, PERF_EVENT_IOC_PERIOD, &period);
  ioctl(fd, PERF_EVENT_IOC_ENABLE, 0);
}

// The lattice points crossed by `now` (the thread's CPU clock) since the
// last sample, as a sample's values. Async-signal-safe.
// Perf and timer engines: `last_sample` becomes the CPU clock of this
// sample (OwesSample reads it).
bool TakePoints(int64_t now, std::atomic<int64_t>& next_due, int64_t period_ns,
                std::atomic<int64_t>& last_sample,
                std::span<int64_t> values) noexcept {
  if (now < 0 || period_ns <= 0) return false;
  int64_t due = next_due.load(std::memory_order_relaxed);
  const int64_t points = internal::TakeLatticePoints(now, &due, period_ns);
  if (points == 0) return false;
  next_due.store(due, std::memory_order_relaxed);
  last_sample.store(now, std::memory_order_relaxed);
  values[0] = 1;
  values[1] = points * period_ns;
  return true;
}

}  // namespace

bool CpuTimeProvider::OnSignal(ThreadContext& thread, ThreadData& data,
                               const siginfo_t& info,
                               std::span<int64_t> values) noexcept {
  const CpuEngine engine = data.signal_engine.load(std::memory_order_relaxed);
  if (engine == CpuEngine::kItimer) {
    // The process-wide timer: the CPU this thread used since its last
    // sample.
    const int64_t now = internal::ThreadCpuNanos(thread.cpu_clock);
    if (now < 0) return false;
    const int64_t used = now - data.last_cpu_ns.load(std::memory_order_relaxed);
    data.last_cpu_ns.store(now, std::memory_order_relaxed);
    values[0] = 1;
    values[1] = used > 0 ? used : 0;
    return true;
  }
  if (engine == CpuEngine::kPerf &&
      (info.si_code == POLL_HUP ||
       data.first_overflow_pending.load(std::memory_order_relaxed))) {
    // POLL_HUP: the kernel stopped the event at its one-overflow limit.
    data.first_overflow_pending.store(false, std::memory_order_relaxed);
    ContinueAtSteadyPeriod(thread.perf_fd.load(std::memory_order_acquire), data.perf_identity,
                           data.period_ns.load(std::memory_order_relaxed));
  }
  return TakePoints(internal::ThreadCpuNanos(thread.cpu_clock), data.next_due_ns,
                    data.period_ns.load(std::memory_order_relaxed),
                    data.last_cpu_ns, values);
}

bool CpuTimeProvider::OwesSample(ThreadContext& thread,
                                 const ThreadData& data) noexcept {
  const CpuEngine engine = data.signal_engine.load(std::memory_order_relaxed);
  if (engine != CpuEngine::kPerf && engine != CpuEngine::kTimer) return false;
  const int64_t now = internal::ThreadCpuNanos(thread.cpu_clock);
  const int64_t due = data.next_due_ns.load(std::memory_order_relaxed);
  if (now < 0 || now < due) return false;
  // The stack the thread unregisters from stands in for the CPU just
  // before it: for a point crossed within the last period (its signal in
  // flight), or for a thread never sampled (it has no other stack). Points
  // crossed longer ago are CPU whose signals never came (the timer engine
  // on a loaded machine: its CPU timer is checked only at scheduler ticks
  // that find the thread running, and went 0.5 s of the thread's CPU
  // without one, measured); the unregistration stack, the same every time,
  // would take them all. They go to the thread's tail instead, credited to
  // its last sampled stack (a stack drawn where its CPU went).
  const int64_t period = data.period_ns.load(std::memory_order_relaxed);
  return data.last_cpu_ns.load(std::memory_order_relaxed) < 0 ||
         now - due < period;
}

bool CpuTimeProvider::TakeSwallowed(ThreadContext& thread, ThreadData& data,
                                    std::span<int64_t> values) noexcept {
  const CpuEngine engine = data.signal_engine.load(std::memory_order_relaxed);
  if (engine != CpuEngine::kPerf && engine != CpuEngine::kTimer) return false;
  const int64_t now = internal::ThreadCpuNanos(thread.cpu_clock);
  // Only points whose own signal is overdue: a point crossed within the
  // last period may still have its signal coming (the perf event's
  // overflows lag the thread-clock lattice by up to a period; a timer
  // signal is only raised at a scheduler tick), and a wall signal to a
  // thread that waited for a core is delivered where the scheduler took it
  // off (on this kernel, at the return of clock_gettime or read): taking
  // those points there put 12-17% (perf) and 52-67% (timer) of a loaded
  // profile on clock_gettime. A POSIX timer's signal is queued even behind
  // a pending SIGPROF (it is never swallowed): the timer engine's points
  // wait for it, or for the tail.
  const int64_t period = data.period_ns.load(std::memory_order_relaxed);
  const int64_t due = data.next_due_ns.load(std::memory_order_relaxed);
  const bool taken = engine == CpuEngine::kPerf && now >= 0 &&
                     now - due >= period &&
                     TakePoints(now, data.next_due_ns, period,
                                data.last_cpu_ns, values);
  if (engine == CpuEngine::kPerf &&
      data.first_overflow_pending.load(std::memory_order_relaxed) &&
      now >= data.first_point_ns.load(std::memory_order_relaxed)) {
    // The first point is behind: the event overflowed (or is about to).
    // When no SIGPROF is pending, the overflow's signal, which would have
    // restarted the event, was discarded behind the one being handled.
    // (Restarting an event that has not overflowed yet only starts its
    // steady period now; its remaining one-overflow limit then stops it
    // once more, signalled as usual.)
    sigset_t pending;
    if (sigpending(&pending) == 0 &&
        sigismember(&pending, internal::kProfilingSignal) == 0) {
      data.first_overflow_pending.store(false, std::memory_order_relaxed);
      ContinueAtSteadyPeriod(thread.perf_fd.load(std::memory_order_acquire), data.perf_identity,
                             data.period_ns.load(std::memory_order_relaxed));
    }
  }
  return taken;
}

bool CpuTimeProvider::TakeTail(ThreadContext& thread, ThreadData& data,
                               std::span<int64_t> values) {
  if (!data.tail_pending) return false;
  data.tail_pending = false;
  // A thread that unregistered itself read its clock as it did.
  const int64_t exit_ns = thread.exit_cpu_ns.load(std::memory_order_relaxed);
  const int64_t now =
      exit_ns >= 0 ? exit_ns : internal::ThreadCpuNanos(thread.cpu_clock);
  if (now < 0) return false;  // the thread is gone: its clock is unreadable
  // DisarmThread ran before this (it forgets data.engine).
  if (data.tail_engine == CpuEngine::kItimer) {
    const int64_t used = now - data.last_cpu_ns.load(std::memory_order_relaxed);
    data.last_cpu_ns.store(now, std::memory_order_relaxed);
    values[0] = 0;
    values[1] = used;
    return used > 0;
  }
  // Points crossed that no signal took (one in flight as the thread
  // stopped; for the timer engine, CPU between two scheduler ticks).
  int64_t due = data.next_due_ns.load(std::memory_order_relaxed);
  const int64_t period = data.period_ns.load(std::memory_order_relaxed);
  const int64_t points = internal::TakeLatticePoints(now, &due, period);
  data.next_due_ns.store(due, std::memory_order_relaxed);
  values[0] = 0;
  values[1] = points * period;
  return points > 0;
}

}  // namespace inprof
