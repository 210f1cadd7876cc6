// libinprof_preload.so: what `inprof run` (and LD_PRELOAD by hand) loads into
// an unmodified program. Before main() it reads the INPROF_* environment,
// starts the default profiler and registers the main thread; it interposes
// pthread_create so each thread the program creates is registered for
// exactly as long as it runs (the automatic counterpart of RegisterThread,
// as DllMain's thread attach is on Windows), follows the names threads take
// (pthread_setname_np, prctl(PR_SET_NAME)), writes the profile however the
// program ends (return from main, exit(), SIGINT/SIGTERM/SIGHUP), gives
// each forked child a profiler of its own, and steps aside when the program
// installs its own SIGPROF handler.
//
// Only the interposed functions are exported (preload.map): the profiler's
// code inside stays private to this object, so a program that links inprof
// itself never binds to it.
//
// Variables read here besides Options::FromEnv()'s (set by `inprof run`):
//   INPROF_RUN_REPORT  a file each process appends one line to per profile
//                      written ("PATH\tPID\tCOMM"); unset: nothing reported.
//   INPROF_RUN_CHILDREN=0  children are not profiled: LD_PRELOAD loses this
//                      library for exec'd programs, forks get no profiler.
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "inprof/inprof.h"
#include "inprof/internal/fork_guard.h"
#include "inprof/internal/log.h"
#include "inprof/sink.h"

namespace inprof {
namespace {

using PreloadProfiler = DefaultProfiler;

pid_t Gettid() { return static_cast<pid_t>(syscall(SYS_gettid)); }

std::string CurrentThreadName() {
  char name[17] = {};
  if (prctl(PR_GET_NAME, name, 0, 0, 0) != 0) return "thread";
  return name;
}

// Set on the threads inprof itself runs (collector, exporter, ticker,
// uploaders, the signal watcher) and on any thread while it is inside a call
// into the profiler: threads created then are inprof's own, never
// registered, and the SIGPROF handler inprof installs is not the program's.
thread_local bool t_inprof __attribute__((tls_model("initial-exec"))) = false;

struct InprofScope {
  bool saved = t_inprof;
  InprofScope() { t_inprof = true; }
  ~InprofScope() { t_inprof = saved; }
};

// Appends each written profile to INPROF_RUN_REPORT and writes the file
// like FileSink.
class ReportingFileSink final : public ProfileSink {
 public:
  ReportingFileSink(std::string pattern, std::string report)
      : file_(std::move(pattern)), report_(std::move(report)) {}
  absl::string_view name() const override { return "file"; }
  absl::Status Consume(std::shared_ptr<const ExportedProfile> p) override {
    absl::Status s = file_.Consume(p);
    if (!s.ok() || report_.empty()) return s;
    const std::string line =
        absl::StrCat(file_.last_path(), "\t", getpid(), "\t",
                     CurrentProcessName(), "\n");
    int fd = open(report_.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
    if (fd >= 0) {
      // One write(2) with O_APPEND: lines of concurrent processes never mix.
      ssize_t n = write(fd, line.data(), line.size());
      (void)n;
      close(fd);
    }
    return s;
  }

 private:
  static std::string CurrentProcessName() {
    char buf[64] = {};
    int fd = open("/proc/self/comm", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return "?";
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    std::string s(buf, n > 0 ? static_cast<size_t>(n) : 0);
    while (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  }

  FileSink file_;
  std::string report_;
};

struct State {
  // Held while the profiler starts or stops (the constructor, exit, an end
  // signal, stepping aside, a forked child): exit() waits for a profile
  // another thread is writing.
  std::mutex lifecycle;
  PreloadProfiler* profiler = nullptr;  // never destroyed: see Finish()
  ThreadRegistration* main_registration = nullptr;
  bool finished = false;
  bool children = true;
  std::string report;
  int watch_pipe[2] = {-1, -1};
  // pthread_t of the threads registered here -> their ids, so that
  // pthread_setname_np(other, ...) finds the thread. A leaf lock, held
  // across fork() (internal/fork_guard.h).
  std::mutex tids_mu;
  absl::flat_hash_map<pthread_t, pid_t> tids;
};

State& state() {
  static State* s = [] {
    auto* st = new State;  // never destroyed: used until the last exit
    internal::RegisterForkLock(&st->tids_mu, internal::kForkRankLeaf);
    return st;
  }();
  return *s;
}

std::atomic<PreloadProfiler*> g_profiler{nullptr};

void RememberTid(pthread_t thread, pid_t tid) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.tids_mu);
  s.tids[thread] = tid;
}

void ForgetTid(pthread_t thread) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.tids_mu);
  s.tids.erase(thread);
}

// Stops the profiler (the profile is written) once. The profiler object is
// never destroyed: threads the program leaves running may still hold
// registrations, which then unregister from a stopped profiler.
void Finish(absl::string_view why) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.lifecycle);
  if (s.finished || s.profiler == nullptr) return;
  s.finished = true;
  g_profiler.store(nullptr, std::memory_order_release);
  InprofScope scope;
  delete s.main_registration;
  s.main_registration = nullptr;
  absl::Status st = s.profiler->Stop();
  if (!st.ok()) internal::Log(absl::StrCat(why, ": ", st.message()));
}

void AtExit() { Finish("at exit"); }

// SIGINT, SIGTERM, SIGHUP with their default action: the handler only wakes
// the watcher thread, which writes the profile and then lets the signal
// take its default effect. A program that installs its own handler replaces
// this one (and usually exits, which writes the profile at exit).
constexpr int kEndSignals[] = {SIGINT, SIGTERM, SIGHUP};

void EndSignalHandler(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  ssize_t n = write(state().watch_pipe[1], &b, 1);
  (void)n;
  errno = saved;
}

void* WatchEndSignals(void*) {
  t_inprof = true;
  unsigned char b = 0;
  while (true) {
    ssize_t n = read(state().watch_pipe[0], &b, 1);
    if (n == 1) break;
    if (n < 0 && errno == EINTR) continue;
    return nullptr;
  }
  const int sig = b;
  Finish(absl::StrCat("on ", strsignal(sig)));
  signal(sig, SIG_DFL);
  kill(getpid(), sig);
  return nullptr;
}

void InstallEndSignalHandlers() {
  State& s = state();
  if (pipe2(s.watch_pipe, O_CLOEXEC) != 0) return;
  bool any = false;
  for (int sig : kEndSignals) {
    struct sigaction current;
    if (sigaction(sig, nullptr, &current) != 0) continue;
    if ((current.sa_flags & SA_SIGINFO) != 0 || current.sa_handler != SIG_DFL) {
      continue;  // ignored (nohup) or handled: the program's choice stands
    }
    struct sigaction action;
    std::memset(&action, 0, sizeof(action));
    action.sa_handler = &EndSignalHandler;
    action.sa_flags = SA_RESTART;
    sigemptyset(&action.sa_mask);
    if (sigaction(sig, &action, nullptr) == 0) any = true;
  }
  if (!any) return;
  pthread_t watcher;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  // Signals meant for the program are never taken by this thread.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  if (pthread_create(&watcher, &attr, &WatchEndSignals, nullptr) == 0) {
    pthread_setname_np(watcher, "inprof-signals");
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  pthread_attr_destroy(&attr);
}

// Drops this library from LD_PRELOAD so exec'd programs are not profiled.
void RemoveSelfFromPreload() {
  const char* preload = getenv("LD_PRELOAD");
  if (preload == nullptr) return;
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&RemoveSelfFromPreload), &info) == 0 ||
      info.dli_fname == nullptr) {
    return;
  }
  std::string kept;
  for (absl::string_view part :
       absl::StrSplit(preload, absl::ByAnyChar(": "), absl::SkipEmpty())) {
    if (part == info.dli_fname) continue;
    if (!kept.empty()) kept.push_back(':');
    kept.append(part.data(), part.size());
  }
  if (kept.empty()) {
    unsetenv("LD_PRELOAD");
  } else {
    setenv("LD_PRELOAD", kept.c_str(), 1);
  }
}

Options PreloadOptions() {
  Options options = Options::FromEnv();
  State& s = state();
  if (const char* r = getenv("INPROF_RUN_REPORT"); r != nullptr) s.report = r;
  if (options.write_output) {
    options.write_output = false;
    options.sinks.push_back(
        std::make_shared<ReportingFileSink>(options.output, s.report));
  }
  return options;
}

// Constructs and starts a profiler for this process and registers the
// calling thread. Mutex held.
void StartLocked(State& s) {
  InprofScope scope;
  auto* profiler = new PreloadProfiler(PreloadOptions());
  if (!profiler->options().enabled) return;
  absl::Status st = profiler->Start();
  if (!st.ok()) {
    internal::Log(absl::StrCat("profiling stays off: ", st.message()));
    return;
  }
  s.profiler = profiler;
  s.finished = false;
  s.main_registration =
      new ThreadRegistration(profiler->RegisterThread(CurrentThreadName()));
  RememberTid(pthread_self(), Gettid());
  g_profiler.store(profiler, std::memory_order_release);
}

// In a forked child: the parent's profiler is forgotten (its threads do not
// exist here) and the child starts one of its own, registering the thread
// that forked.
void AtForkChild() {
  State& s = state();
  // The child has one thread: a lifecycle lock another thread of the parent
  // held (writing the parent's profile) means nothing here.
  new (&s.lifecycle) std::mutex;
  PreloadProfiler* parent = s.profiler;
  if (parent == nullptr || s.finished) return;
  {
    InprofScope scope;
    (void)parent->Stop();  // in a child: forgets, writes nothing
  }
  // The registration belongs to the parent's profiler: leaked, not undone.
  s.main_registration = nullptr;
  s.profiler = nullptr;
  g_profiler.store(nullptr, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(s.tids_mu);
    s.tids.clear();
  }
  if (!s.children) return;
  std::lock_guard<std::mutex> lock(s.lifecycle);
  StartLocked(s);
}

// An exec() from a profiled process keeps SIGPROF blocked across it (see
// ExecGuard) and says so in the environment: the signals still pending from
// the old image are discarded here, before SIGPROF is unblocked, instead of
// killing the new image (whose handler the kernel reset to the default).
constexpr char kSigprofBlocked[] = "INPROF_RUN_SIGPROF_BLOCKED";

void DiscardPendingSigprof() {
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

// inprof's lines on stderr, less the engine line every process would print
// at start (the profile's comments carry it).
void FilterLog(absl::string_view line) {
  if (absl::StartsWith(line, "inprof: cpu engine=")) return;
  internal::WriteLineToStderr(line);
}

__attribute__((constructor)) void PreloadInit() {
  UnblockSigprofAfterExec();
  internal::SetLogSink(&FilterLog);
  State& s = state();
  const char* enabled = getenv("INPROF_ENABLED");
  const char* children = getenv("INPROF_RUN_CHILDREN");
  s.children = !(children != nullptr && std::strcmp(children, "0") == 0);
  if (!s.children) RemoveSelfFromPreload();
  if (enabled != nullptr && ParseBoolFlag("INPROF_ENABLED", enabled).value_or(true) == false) {
    return;  // a no-op: no profiler, and the interposed calls pass through
  }
  {
    std::lock_guard<std::mutex> lock(s.lifecycle);
    StartLocked(s);
  }
  if (s.profiler == nullptr) return;
  InprofScope scope;
  atexit(&AtExit);
  pthread_atfork(nullptr, nullptr, &AtForkChild);
  InstallEndSignalHandlers();
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
    State& s = state();
    if (g_profiler.load(std::memory_order_acquire) == nullptr) return;
    sigset_t prof;
    sigemptyset(&prof);
    sigaddset(&prof, SIGPROF);
    if (!s.children) {
      Finish("before exec");
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

struct StartArgs {
  void* (*fn)(void*);
  void* arg;
  bool internal;
};

// The program's thread, registered for as long as its start routine runs:
// the registration is undone when the routine returns, and by the unwinding
// pthread_exit() and cancellation do.
void* Trampoline(void* p) {
  StartArgs args = *static_cast<StartArgs*>(p);
  delete static_cast<StartArgs*>(p);
  if (args.internal) {
    t_inprof = true;
    return args.fn(args.arg);
  }
  PreloadProfiler* profiler = g_profiler.load(std::memory_order_acquire);
  if (profiler == nullptr) return args.fn(args.arg);
  ThreadRegistration registration;
  {
    InprofScope scope;
    registration = profiler->RegisterThread(CurrentThreadName());
  }
  const pthread_t self = pthread_self();
  RememberTid(self, Gettid());
  struct Undo {
    pthread_t self;
    ~Undo() { ForgetTid(self); }
  } undo{self};
  return args.fn(args.arg);
}

template <typename F>
F Next(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
}

void Rename(pid_t tid, const char* name) {
  PreloadProfiler* profiler = g_profiler.load(std::memory_order_acquire);
  if (profiler == nullptr || tid <= 0 || name == nullptr) return;
  InprofScope scope;
  profiler->SetThreadName(tid, name);
}

}  // namespace
}  // namespace inprof

using inprof::InprofScope;
using inprof::Next;
using inprof::t_inprof;

extern "C" {

__attribute__((visibility("default"))) int pthread_create(
    pthread_t* thread, const pthread_attr_t* attr, void* (*fn)(void*),
    void* arg) {
  using Fn = int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*),
                     void*);
  static Fn real = Next<Fn>("pthread_create");
  if (real == nullptr) return EAGAIN;
  const bool internal = t_inprof;
  if (!internal && inprof::g_profiler.load(std::memory_order_acquire) == nullptr) {
    return real(thread, attr, fn, arg);
  }
  auto* args = new (std::nothrow) inprof::StartArgs{fn, arg, internal};
  if (args == nullptr) return real(thread, attr, fn, arg);
  const int rc = real(thread, attr, &inprof::Trampoline, args);
  if (rc != 0) delete args;
  return rc;
}

__attribute__((visibility("default"))) int pthread_setname_np(
    pthread_t thread, const char* name) {
  using Fn = int (*)(pthread_t, const char*);
  static Fn real = Next<Fn>("pthread_setname_np");
  if (real == nullptr) return ENOSYS;
  const int rc = real(thread, name);
  if (rc != 0 || t_inprof) return rc;
  pid_t tid = 0;
  if (pthread_equal(thread, pthread_self())) {
    tid = inprof::Gettid();
  } else {
    inprof::State& s = inprof::state();
    std::lock_guard<std::mutex> lock(s.tids_mu);
    auto it = s.tids.find(thread);
    if (it != s.tids.end()) tid = it->second;
  }
  inprof::Rename(tid, name);
  return rc;
}

__attribute__((visibility("default"))) int prctl(int option, ...) {
  va_list ap;
  va_start(ap, option);
  unsigned long a2 = va_arg(ap, unsigned long);
  unsigned long a3 = va_arg(ap, unsigned long);
  unsigned long a4 = va_arg(ap, unsigned long);
  unsigned long a5 = va_arg(ap, unsigned long);
  va_end(ap);
  using Fn = int (*)(int, ...);
  static Fn real = Next<Fn>("prctl");
  if (real == nullptr) {
    errno = ENOSYS;
    return -1;
  }
  const int rc = real(option, a2, a3, a4, a5);
  if (rc == 0 && option == PR_SET_NAME && !t_inprof) {
    char name[17] = {};
    std::strncpy(name, reinterpret_cast<const char*>(a2), 16);
    inprof::Rename(inprof::Gettid(), name);
  }
  return rc;
}

// A program that takes SIGPROF for itself: inprof writes what it has and
// steps aside before the program's handler replaces its own.
static void StepAsideForSigprof(const char* how) {
  if (inprof::g_profiler.load(std::memory_order_acquire) == nullptr) return;
  inprof::internal::Log(absl::StrCat(
      "the program installs its own SIGPROF handler (", how,
      "): profiling stops here and the profile so far is written"));
  inprof::Finish("stepping aside for the program's SIGPROF handler");
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

__attribute__((visibility("default"))) int execve(const char* path,
                                                  char* const argv[],
                                                  char* const envp[]) {
  using Fn = int (*)(const char*, char* const*, char* const*);
  static Fn real = Next<Fn>("execve");
  inprof::ExecGuard guard;
  return real(path, argv, guard.Mark(envp));
}

__attribute__((visibility("default"))) int execv(const char* path,
                                                 char* const argv[]) {
  using Fn = int (*)(const char*, char* const*);
  static Fn real = Next<Fn>("execv");
  inprof::ExecGuard guard;
  guard.MarkEnviron();
  return real(path, argv);
}

__attribute__((visibility("default"))) int execvp(const char* file,
                                                  char* const argv[]) {
  using Fn = int (*)(const char*, char* const*);
  static Fn real = Next<Fn>("execvp");
  inprof::ExecGuard guard;
  guard.MarkEnviron();
  return real(file, argv);
}

__attribute__((visibility("default"))) int execvpe(const char* file,
                                                   char* const argv[],
                                                   char* const envp[]) {
  using Fn = int (*)(const char*, char* const*, char* const*);
  static Fn real = Next<Fn>("execvpe");
  inprof::ExecGuard guard;
  return real(file, argv, guard.Mark(envp));
}

__attribute__((visibility("default"))) int fexecve(int fd, char* const argv[],
                                                   char* const envp[]) {
  using Fn = int (*)(int, char* const*, char* const*);
  static Fn real = Next<Fn>("fexecve");
  inprof::ExecGuard guard;
  return real(fd, argv, guard.Mark(envp));
}

__attribute__((visibility("default"))) int execl(const char* path,
                                                 const char* arg, ...) {
  va_list ap;
  va_start(ap, arg);
  std::vector<char*> args = inprof::CollectArgs(arg, ap, nullptr);
  va_end(ap);
  return execv(path, args.data());
}

__attribute__((visibility("default"))) int execlp(const char* file,
                                                  const char* arg, ...) {
  va_list ap;
  va_start(ap, arg);
  std::vector<char*> args = inprof::CollectArgs(arg, ap, nullptr);
  va_end(ap);
  return execvp(file, args.data());
}

__attribute__((visibility("default"))) int execle(const char* path,
                                                  const char* arg, ...) {
  va_list ap;
  va_start(ap, arg);
  char** envp = nullptr;
  std::vector<char*> args = inprof::CollectArgs(arg, ap, &envp);
  va_end(ap);
  return execve(path, args.data(), envp);
}

}  // extern "C"
