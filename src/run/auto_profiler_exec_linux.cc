// An exec() from a profiled process (auto_profiler_state.h): SIGPROF stays
// blocked across it (ExecGuard, around each call of the exec family
// interposed here), and the new image's preload discards what is pending
// before it unblocks it (run::UnblockSigprofAfterExec).
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <vector>

#include "src/run/auto_profiler.h"
#include "src/run/auto_profiler_state.h"

namespace inprof::run::detail {
namespace {

// An exec() from a profiled process keeps SIGPROF blocked across it (see
// ExecGuard) and says so in the environment: the signals still pending from
// the old image are discarded here, before SIGPROF is unblocked, instead of
// killing the new image (whose handler the kernel reset to the default).
constexpr char kSigprofBlocked[] = "INPROF_RUN_SIGPROF_BLOCKED";

void DiscardPendingSigprof() {
  InprofScope scope;  // the real sigtimedwait, SIGPROF kept in its set
  sigset_t prof;
  sigemptyset(&prof);
  sigaddset(&prof, SIGPROF);
  const timespec zero = {0, 0};
  while (sigtimedwait(&prof, nullptr, &zero) == SIGPROF) {
  }
}

void UnblockSigprofAfterExec() {
  if (getenv(kSigprofBlocked) == nullptr) return;
  unsetenv(kSigprofBlocked);
  DiscardPendingSigprof();
  sigset_t prof;
  sigemptyset(&prof);
  sigaddset(&prof, SIGPROF);
  pthread_sigmask(SIG_UNBLOCK, &prof, nullptr);
}

// Around an exec() from a profiled process. The new image starts with
// SIGPROF's handler reset to the default, which terminates; a profiling
// signal pending at that moment (a timer or the wall sampler fired just
// before) would kill it. So SIGPROF stays blocked on the calling thread
// across the exec and the environment tells the new image's preload to
// discard what is pending and unblock it. With --no-children the new image
// gets no preload: the profile is written first, the pending signals are
// discarded, and the exec happens with the mask as it was.
class ExecGuard {
 public:
  ExecGuard() {
    InprofScope scope;  // the real pthread_sigmask: SIGPROF blocked for real
    State& s = state();
    if (!g_running.load(std::memory_order_acquire)) return;
    sigset_t prof;
    sigemptyset(&prof);
    sigaddset(&prof, SIGPROF);
    if (!s.children) {
      Finish();
      pthread_sigmask(SIG_BLOCK, &prof, &old_);
      DiscardPendingSigprof();
      pthread_sigmask(SIG_SETMASK, &old_, nullptr);
      return;
    }
    pthread_sigmask(SIG_BLOCK, &prof, &old_);
    blocked_ = true;
  }
  ~ExecGuard() {  // the exec failed
    if (!blocked_) return;
    InprofScope scope;
    if (set_environ_) unsetenv(kSigprofBlocked);
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  ExecGuard(const ExecGuard&) = delete;
  ExecGuard& operator=(const ExecGuard&) = delete;

  // For the exec calls that pass `environ`.
  void MarkEnviron() {
    if (!blocked_) return;
    setenv(kSigprofBlocked, "1", 1);
    set_environ_ = true;
  }
  // For those that take an environment: a copy with the marker.
  char* const* Mark(char* const* envp) {
    if (!blocked_ || envp == nullptr) return envp;
    for (char* const* e = envp; *e != nullptr; ++e) env_.push_back(*e);
    env_.push_back(const_cast<char*>("INPROF_RUN_SIGPROF_BLOCKED=1"));
    env_.push_back(nullptr);
    return env_.data();
  }

 private:
  sigset_t old_;
  bool blocked_ = false;
  bool set_environ_ = false;
  std::vector<char*> env_;
};

// The arguments of execl(), execle(), execlp() as a vector; for execle(),
// *envp gets the environment that follows the terminating null.
std::vector<char*> CollectArgs(const char* arg0, va_list ap, char*** envp) {
  std::vector<char*> args;
  args.push_back(const_cast<char*>(arg0));
  if (arg0 != nullptr) {
    while (char* a = va_arg(ap, char*)) args.push_back(a);
  }
  args.push_back(nullptr);
  if (envp != nullptr) *envp = va_arg(ap, char**);
  return args;
}

}  // namespace
}  // namespace inprof::run::detail

namespace inprof::run {

void UnblockSigprofAfterExec() { detail::UnblockSigprofAfterExec(); }

}  // namespace inprof::run

using inprof::run::detail::Next;

extern "C" {

__attribute__((visibility("default"))) int execve(const char* path,
                                                  char* const argv[],
                                                  char* const envp[]) {
  using Fn = int (*)(const char*, char* const*, char* const*);
  static Fn real = Next<Fn>("execve");
  inprof::run::detail::ExecGuard guard;
  return real(path, argv, guard.Mark(envp));
}

__attribute__((visibility("default"))) int execv(const char* path,
                                                 char* const argv[]) {
  using Fn = int (*)(const char*, char* const*);
  static Fn real = Next<Fn>("execv");
  inprof::run::detail::ExecGuard guard;
  guard.MarkEnviron();
  return real(path, argv);
}

__attribute__((visibility("default"))) int execvp(const char* file,
                                                  char* const argv[]) {
  using Fn = int (*)(const char*, char* const*);
  static Fn real = Next<Fn>("execvp");
  inprof::run::detail::ExecGuard guard;
  guard.MarkEnviron();
  return real(file, argv);
}

__attribute__((visibility("default"))) int execvpe(const char* file,
                                                   char* const argv[],
                                                   char* const envp[]) {
  using Fn = int (*)(const char*, char* const*, char* const*);
  static Fn real = Next<Fn>("execvpe");
  inprof::run::detail::ExecGuard guard;
  return real(file, argv, guard.Mark(envp));
}

__attribute__((visibility("default"))) int fexecve(int fd, char* const argv[],
                                                   char* const envp[]) {
  using Fn = int (*)(int, char* const*, char* const*);
  static Fn real = Next<Fn>("fexecve");
  inprof::run::detail::ExecGuard guard;
  return real(fd, argv, guard.Mark(envp));
}

__attribute__((visibility("default"))) int execl(const char* path,
                                                 const char* arg, ...) {
  va_list ap;
  va_start(ap, arg);
  std::vector<char*> args = inprof::run::detail::CollectArgs(arg, ap, nullptr);
  va_end(ap);
  return execv(path, args.data());
}

__attribute__((visibility("default"))) int execlp(const char* file,
                                                  const char* arg, ...) {
  va_list ap;
  va_start(ap, arg);
  std::vector<char*> args = inprof::run::detail::CollectArgs(arg, ap, nullptr);
  va_end(ap);
  return execvp(file, args.data());
}

__attribute__((visibility("default"))) int execle(const char* path,
                                                  const char* arg, ...) {
  va_list ap;
  va_start(ap, arg);
  char** envp = nullptr;
  std::vector<char*> args = inprof::run::detail::CollectArgs(arg, ap, &envp);
  va_end(ap);
  return execve(path, args.data(), envp);
}

}  // extern "C"
