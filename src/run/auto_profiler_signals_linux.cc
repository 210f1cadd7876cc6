// SIGPROF stays the automatic profiler's (auto_profiler_state.h): a
// program that installs its own handler (sigaction, signal) makes inprof
// write what it has and step aside, and SIGPROF is kept out of the
// program's signal masks, sigwait sets and signalfds while it profiles
// (WithoutSigprof).
#include <signal.h>
#include <sys/signalfd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "inprof/inprof.h"
#include "inprof/base/log.h"
#include "src/run/auto_profiler_state.h"

namespace inprof::run::detail {
namespace {

// The program's own signal masks and waits, on a registered thread while
// profiling: SIGPROF is taken out of them. A thread that blocks it gets no
// sample (its SIGPROF stays pending), and sigwait, sigwaitinfo,
// sigtimedwait and a signalfd return a pending or arriving SIGPROF to the
// program as its own signal: a server that blocks every signal and waits
// for them in sigwait took inprof's wall signal for one of its own (and
// ended, in the run_target "sigwait" test, before this).
//
// Returns `set`, or a copy of it without SIGPROF in `storage` when it must
// be taken out.
// `call` names the program's call in the log line, which says what the set
// held: every signal, or SIGPROF alone, or SIGPROF among others.
const sigset_t* WithoutSigprof(const sigset_t* set, sigset_t& storage,
                               const char* call) {
  if (set == nullptr || t_inprof || sigismember(set, SIGPROF) != 1) return set;
  if (!g_running.load(std::memory_order_acquire)) return set;
  internal::ThreadSlotHeader* slot = internal::CurrentThreadSlot();
  if (slot == nullptr || slot->session.load(std::memory_order_relaxed) == 0) {
    return set;
  }
  static std::atomic<bool> said{false};
  if (!said.exchange(true)) {
    InprofScope scope;
    int others = 0;  // signals in the set besides SIGPROF
    for (int sig = 1; sig < NSIG; ++sig) {
      if (sig != SIGPROF && sigismember(set, sig) == 1) ++others;
    }
    sigset_t full;
    sigfillset(&full);
    bool every = true;
    for (int sig = 1; sig < NSIG && every; ++sig) {
      every = sigismember(&full, sig) != 1 || sigismember(set, sig) == 1;
    }
    const bool waits = std::strncmp(call, "sig", 3) == 0 && std::strcmp(call, "sigprocmask") != 0;
    internal::Log(absl::StrCat(
        "the program ", waits ? "waits for " : "blocks ",
        every ? "every signal" : others == 0 ? "SIGPROF" : absl::StrCat("SIGPROF and ", others, " other signal", others == 1 ? "" : "s"),
        " (", call, "); inprof keeps SIGPROF "
        "out of its signal masks, sigwait sets and signalfds while it "
        "profiles, so that it can sample and the program never receives it "
        "(said once)"));
  }
  storage = *set;
  sigdelset(&storage, SIGPROF);
  return &storage;
}

}  // namespace
}  // namespace inprof::run::detail

using inprof::run::detail::InprofScope;
using inprof::run::detail::Next;
using inprof::run::detail::t_inprof;

extern "C" {

// A program that takes SIGPROF for itself: inprof writes what it has and
// steps aside before the program's handler replaces its own.
static void StepAsideForSigprof(const char* how) {
  inprof::run::detail::State& s = inprof::run::detail::state();
  std::lock_guard<std::mutex> lock(s.lifecycle);
  if (s.stepped_aside || s.profiler == nullptr) return;
  s.stepped_aside = true;
  if (!s.running) return;
  inprof::internal::Log(absl::StrCat(
      "the program installs its own SIGPROF handler (", how,
      "): profiling stops here and the profile so far is written"));
  inprof::run::detail::StopLocked(s);
}

__attribute__((visibility("default"))) int sigaction(
    int sig, const struct sigaction* act, struct sigaction* old) {
  using Fn = int (*)(int, const struct sigaction*, struct sigaction*);
  static Fn real = Next<Fn>("sigaction");
  if (real == nullptr) {
    errno = ENOSYS;
    return -1;
  }
  if (sig == SIGPROF && act != nullptr && !t_inprof) {
    StepAsideForSigprof("sigaction");
  }
  return real(sig, act, old);
}

__attribute__((visibility("default"))) sighandler_t signal(int sig,
                                                           sighandler_t h) {
  using Fn = sighandler_t (*)(int, sighandler_t);
  static Fn real = Next<Fn>("signal");
  if (real == nullptr) {
    errno = ENOSYS;
    return SIG_ERR;
  }
  if (sig == SIGPROF && !t_inprof) StepAsideForSigprof("signal");
  return real(sig, h);
}

__attribute__((visibility("default"))) int pthread_sigmask(int how,
                                                           const sigset_t* set,
                                                           sigset_t* old) {
  using Fn = int (*)(int, const sigset_t*, sigset_t*);
  static Fn real = Next<Fn>("pthread_sigmask");
  if (real == nullptr) return ENOSYS;
  sigset_t storage;
  if (how != SIG_UNBLOCK) set = inprof::run::detail::WithoutSigprof(set, storage, "pthread_sigmask");
  return real(how, set, old);
}

__attribute__((visibility("default"))) int sigprocmask(int how,
                                                       const sigset_t* set,
                                                       sigset_t* old) {
  using Fn = int (*)(int, const sigset_t*, sigset_t*);
  static Fn real = Next<Fn>("sigprocmask");
  if (real == nullptr) {
    errno = ENOSYS;
    return -1;
  }
  sigset_t storage;
  if (how != SIG_UNBLOCK) set = inprof::run::detail::WithoutSigprof(set, storage, "sigprocmask");
  return real(how, set, old);
}

__attribute__((visibility("default"))) int sigwait(const sigset_t* set,
                                                   int* sig) {
  using Fn = int (*)(const sigset_t*, int*);
  static Fn real = Next<Fn>("sigwait");
  if (real == nullptr) return ENOSYS;
  sigset_t storage;
  set = inprof::run::detail::WithoutSigprof(set, storage, "sigwait");
  return real(set, sig);
}

__attribute__((visibility("default"))) int sigwaitinfo(const sigset_t* set,
                                                       siginfo_t* info) {
  using Fn = int (*)(const sigset_t*, siginfo_t*);
  static Fn real = Next<Fn>("sigwaitinfo");
  if (real == nullptr) {
    errno = ENOSYS;
    return -1;
  }
  sigset_t storage;
  set = inprof::run::detail::WithoutSigprof(set, storage, "sigwaitinfo");
  return real(set, info);
}

__attribute__((visibility("default"))) int sigtimedwait(
    const sigset_t* set, siginfo_t* info, const struct timespec* timeout) {
  using Fn = int (*)(const sigset_t*, siginfo_t*, const struct timespec*);
  static Fn real = Next<Fn>("sigtimedwait");
  if (real == nullptr) {
    errno = ENOSYS;
    return -1;
  }
  sigset_t storage;
  set = inprof::run::detail::WithoutSigprof(set, storage, "sigtimedwait");
  return real(set, info, timeout);
}

__attribute__((visibility("default"))) int signalfd(int fd, const sigset_t* mask,
                                                    int flags) {
  using Fn = int (*)(int, const sigset_t*, int);
  static Fn real = Next<Fn>("signalfd");
  if (real == nullptr) {
    errno = ENOSYS;
    return -1;
  }
  sigset_t storage;
  mask = inprof::run::detail::WithoutSigprof(mask, storage, "signalfd");
  return real(fd, mask, flags);
}

}  // extern "C"
