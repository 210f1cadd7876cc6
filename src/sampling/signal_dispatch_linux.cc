#include "inprof/internal/signal_dispatch.h"

#include "inprof/base/fork_guard.h"
#include "inprof/internal/thread_info.h"

#include <errno.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <signal.h>
#include <time.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <sched.h>

#include "absl/strings/str_cat.h"

namespace inprof::internal {
namespace {

// Initial-exec: the handler must not trap into __tls_get_addr (DESIGN.md).
__thread ThreadSlotHeader* tls_slot __attribute__((tls_model("initial-exec"))) =
    nullptr;

std::atomic<uint64_t> g_next_session{1};
std::atomic<uint64_t> g_active_session{0};
std::atomic<uint64_t> g_no_slot{0};
std::atomic<uint64_t> g_inactive{0};
std::atomic<uint64_t> g_foreign{0};
std::mutex g_install_mutex;
bool g_installed = false;
// At static initialisation, when no lock is held (base/fork_guard.h).
[[maybe_unused]] const bool g_install_mutex_fork_safe =
    (RegisterForkLock(&g_install_mutex, kForkRankGlobal), true);

// The tag a SIGPROF for `slot` carries, or 0 when it is not inprof's.
int SignalTag(const ThreadSlotHeader& slot, const siginfo_t* info) noexcept {
  if (info == nullptr) return 0;
  switch (info->si_code) {
    case SI_TIMER:  // a per-thread POSIX CPU timer (timer engine)
    case SI_QUEUE:  // rt_tgsigqueueinfo from the wall ticker
      return (info->si_value.sival_int & kSignalTagMagicMask) ==
                     kSignalTagMagic
                 ? info->si_value.sival_int
                 : 0;
    case POLL_IN:   // a perf event's overflow, F_SETSIG'ed to SIGPROF
    case POLL_HUP: {
      const int fd = slot.perf_fd.load(std::memory_order_relaxed);
      return fd >= 0 && info->si_fd == fd
                 ? slot.perf_tag.load(std::memory_order_relaxed)
                 : 0;
    }
    case SI_KERNEL:  // ITIMER_PROF (itimer engine)
      return slot.itimer_tag.load(std::memory_order_relaxed);
    default:
      return 0;
  }
}

// Whether the walk fits below `sp` on the thread's own stack (the bounds
// captured at registration). A thread on another stack -- a signal handler's
// sigaltstack, a coroutine's -- fails the check whatever that stack's size:
// its bounds are not known.
bool StackHasRoom(const ThreadSlotHeader& slot, uintptr_t sp) noexcept {
  return sp >= slot.stack.lo && sp < slot.stack.hi &&
         sp - slot.stack.lo >= slot.sample_stack_bytes;
}

// Small on purpose: it may run on an 8 KiB stack that already holds the
// kernel's signal frame (~3 KiB with AVX-512 state). Everything that needs
// room is behind StackHasRoom.
void ProfilingSignalHandler(int /*signo*/, siginfo_t* info, void* ucontext) {
  const int saved_errno = errno;
  ThreadSlotHeader* slot = tls_slot;
  int tag = 0;
  if (slot == nullptr) {
    g_no_slot.fetch_add(1, std::memory_order_relaxed);
  } else if ((tag = SignalTag(*slot, info)) == 0) {
    g_foreign.fetch_add(1, std::memory_order_relaxed);
  } else {
    // Dekker handshake with DeactivateSession: publish that we are inside,
    // then check the session; Stop clears the session, then waits for us.
    slot->in_handler.store(1, std::memory_order_seq_cst);
    const uint64_t active = g_active_session.load(std::memory_order_seq_cst);
    if (active != 0 &&
        slot->session.load(std::memory_order_relaxed) == active &&
        SignalTagMatchesSession(tag, active)) {
      const auto sp = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
      if (StackHasRoom(*slot, sp)) {
        slot->sample(slot, info, ucontext, tag);
      } else {
        slot->samples_small_stack.fetch_add(1, std::memory_order_relaxed);
        if (slot->sample_stackless != nullptr) {
          slot->sample_stackless(slot, info, ucontext, tag);
        }
      }
    } else {
      g_inactive.fetch_add(1, std::memory_order_relaxed);
    }
    slot->in_handler.store(0, std::memory_order_release);
  }
  errno = saved_errno;
}

// Who handles kProfilingSignal, from its current sigaction.
enum class Disposition { kOurs, kUnset, kForeign };
Disposition ProfilingSignalDisposition(const struct sigaction& current) {
  if ((current.sa_flags & SA_SIGINFO) != 0) {
    if (current.sa_sigaction == &ProfilingSignalHandler) return Disposition::kOurs;
    return current.sa_sigaction != nullptr ? Disposition::kForeign
                                           : Disposition::kUnset;
  }
  return current.sa_handler == SIG_DFL || current.sa_handler == SIG_IGN
             ? Disposition::kUnset
             : Disposition::kForeign;
}

}  // namespace

ThreadSlotHeader* CurrentThreadSlot() noexcept { return tls_slot; }

void SetCurrentThreadSlot(ThreadSlotHeader* slot) noexcept {
  // The handler runs on this same thread, so a compiler fence orders the
  // store against it.
  std::atomic_signal_fence(std::memory_order_seq_cst);
  tls_slot = slot;
  std::atomic_signal_fence(std::memory_order_seq_cst);
}

void MarkUnregistering(ThreadSlotHeader& slot) noexcept {
  slot.exit_cpu_ns.store(ThreadCpuNanos(slot.cpu_clock), std::memory_order_relaxed);
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  slot.exit_wall_ns.store(now.tv_sec * 1'000'000'000LL + now.tv_nsec,
                          std::memory_order_relaxed);
}

void BeginRetireOnOwnThread(ThreadSlotHeader& slot) noexcept {
  SetCurrentThreadSlot(nullptr);  // no handler of this thread finds it again
  if (slot.exit_cpu_ns.load(std::memory_order_relaxed) < 0) MarkUnregistering(slot);
  slot.retiring.store(true, std::memory_order_seq_cst);
  // A visit under way may still signal this thread: it is short (a /proc
  // read), and the thread must be alive for it.
  while (slot.visiting.load(std::memory_order_seq_cst)) sched_yield();
}

void SignalThisThread(int tag) noexcept {
  const int saved_errno = errno;
  siginfo_t info;
  std::memset(&info, 0, sizeof(info));
  info.si_signo = kProfilingSignal;
  info.si_code = SI_QUEUE;
  info.si_pid = getpid();
  info.si_uid = getuid();
  info.si_value.sival_int = tag;
  syscall(SYS_rt_tgsigqueueinfo, info.si_pid, CurrentTid(), kProfilingSignal, &info);
  errno = saved_errno;
}

uint64_t NewSessionId() noexcept {
  return g_next_session.fetch_add(1, std::memory_order_relaxed);
}

absl::Status InstallSignalHandler() {
  std::lock_guard<std::mutex> lock(g_install_mutex);
  struct sigaction current;
  if (sigaction(kProfilingSignal, nullptr, &current) != 0) {
    return absl::InternalError(
        absl::StrCat("sigaction(SIGPROF) query failed: ", strerror(errno)));
  }
  const Disposition disposition = ProfilingSignalDisposition(current);
  if (disposition == Disposition::kOurs) {
    g_installed = true;
    return absl::OkStatus();
  }
  if (disposition == Disposition::kForeign) {
    return absl::FailedPreconditionError(
        "SIGPROF already has a handler installed by the application or "
        "another profiler; inprof leaves it in place and does not start");
  }
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_sigaction = &ProfilingSignalHandler;
  action.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&action.sa_mask);
  if (sigaction(kProfilingSignal, &action, nullptr) != 0) {
    return absl::InternalError(
        absl::StrCat("sigaction(SIGPROF) failed: ", strerror(errno)));
  }
  g_installed = true;
  return absl::OkStatus();
}

bool UnblockProfilingSignalInThisThread() noexcept {
  sigset_t mask;
  if (pthread_sigmask(SIG_SETMASK, nullptr, &mask) != 0 ||
      sigismember(&mask, kProfilingSignal) != 1) {
    return false;
  }
  struct sigaction current;
  if (sigaction(kProfilingSignal, nullptr, &current) != 0) return false;
  const Disposition disposition = ProfilingSignalDisposition(current);
  if (disposition == Disposition::kForeign) return false;  // left alone
  if (disposition == Disposition::kUnset) {
    // Not installed yet: a SIGPROF already pending (sent to an image that
    // blocked it across an exec, say) would terminate the process.
    sigset_t pending;
    if (sigpending(&pending) != 0 || sigismember(&pending, kProfilingSignal) != 0) {
      return false;
    }
  }
  sigset_t profiling;
  sigemptyset(&profiling);
  sigaddset(&profiling, kProfilingSignal);
  return pthread_sigmask(SIG_UNBLOCK, &profiling, nullptr) == 0;
}

absl::Status ActivateSession(uint64_t session) {
  uint64_t expected = 0;
  if (!g_active_session.compare_exchange_strong(expected, session,
                                                std::memory_order_seq_cst)) {
    if (expected == session) return absl::OkStatus();
    return absl::FailedPreconditionError(
        "another inprof profiler is already running in this process; stop it "
        "before starting a second one");
  }
  return absl::OkStatus();
}

void DeactivateSession(uint64_t session) noexcept {
  uint64_t expected = session;
  g_active_session.compare_exchange_strong(expected, 0,
                                           std::memory_order_seq_cst);
}

void WaitForHandler(const ThreadSlotHeader& slot) noexcept {
  while (slot.in_handler.load(std::memory_order_seq_cst) != 0) sched_yield();
}

uint64_t ActiveSession() noexcept {
  return g_active_session.load(std::memory_order_acquire);
}

DispatchStats GetDispatchStats() noexcept {
  return {g_no_slot.load(std::memory_order_relaxed),
          g_inactive.load(std::memory_order_relaxed),
          g_foreign.load(std::memory_order_relaxed)};
}

}  // namespace inprof::internal
