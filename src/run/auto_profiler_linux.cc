// The process's automatic profiler (auto_profiler.h) and the calls it
// interposes: pthread_create (each thread the program creates is registered
// for exactly as long as its start routine runs: the automatic counterpart
// of RegisterThread, as DllMain's thread attach is on Windows),
// pthread_setname_np and prctl (thread names as the program sets them),
// sigaction and signal (a program taking SIGPROF for itself makes inprof
// write what it has and step aside), the exec family (SIGPROF stays
// blocked across an exec, see ExecGuard) and _exit/_Exit (the profile is
// written first, by the watcher thread, for a bounded time: see
// FinishBeforeExit).
//
// Linked into libinprof_preload.so (with preload_linux.cc, what `inprof run`
// loads) and libinprof_gperftools (the gperftools API drop-in). In the
// shared library only the interposed calls and the gperftools API are
// exported (preload.map), so a program that links inprof itself never binds
// to this copy.
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
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
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "inprof/inprof.h"
#include "inprof/base/fork_guard.h"
#include "inprof/base/log.h"
#include "inprof/sink.h"
#include "src/run/auto_profiler.h"
#include "src/run/run_report.h"

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

// The run report (INPROF_RUN_REPORT): src/run/run_report.h.
using run::AppendToReport;
using run::ReportingFileSink;

struct State {
  // Held while the profiler starts or stops (Start, Stop at exit, on an end
  // signal, stepping aside, in a forked child): exit() waits for a profile
  // another thread is writing.
  std::mutex lifecycle;
  PreloadProfiler* profiler = nullptr;  // never destroyed: see Stop()
  std::shared_ptr<ReportingFileSink> sink;
  ThreadRegistration* first_registration = nullptr;  // Init()'s thread
  bool running = false;
  bool stepped_aside = false;
  bool hooks_installed = false;  // atexit, at_quick_exit, end signals
  bool children = true;
  Options options;  // without sinks: what a forked child starts with
  std::string report;
  std::string output;
  pid_t first_pid = 0;       // the tree's first process (kFirstPidVariable)
  absl::Time start;
  // The end signals' handler wakes the watcher thread through this (no
  // descriptor: see run::SignalWake).
  run::SignalWake end_signal;
  bool end_watcher = false;  // its thread runs in this process
  pid_t end_watcher_pid = 0;  // where that thread runs (a vfork child is not)
  // FinishBeforeExit's requests the watcher has answered.
  std::atomic<uint64_t> finishes{0};
  // pthread_t of the threads registered here -> their ids, so that
  // pthread_setname_np(other, ...) finds the thread. A leaf lock, held
  // across fork() (base/fork_guard.h).
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

// The profiler threads register with (null before Init or when disabled),
// and whether it samples now.
std::atomic<PreloadProfiler*> g_profiler{nullptr};
std::atomic<bool> g_running{false};

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

// Lifecycle lock held. The profiler object is never destroyed: threads the
// program leaves running may still hold registrations.
void StopLocked(State& s) {
  if (!s.running) return;
  s.running = false;
  g_running.store(false, std::memory_order_release);
  InprofScope scope;
  absl::Status st = s.profiler->Stop();
  // Stop() logged the failure; `inprof run` is told, to say which process
  // it was.
  if (!st.ok()) AppendToReport(s.report, "failed", st.message());
}

void Finish() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.lifecycle);
  StopLocked(s);
}

void AtExit() { Finish(); }

// SIGINT, SIGTERM, SIGHUP with their default action: the handler only wakes
// the watcher thread, which writes the profile and then lets the signal
// take its default effect. A program that installs its own handler replaces
// this one (and usually exits, which writes the profile at exit).
constexpr int kEndSignals[] = {SIGINT, SIGTERM, SIGHUP};
// What FinishBeforeExit posts to the watcher (signal numbers are below).
constexpr int kFinishRequest = 0x100;

void EndSignalHandler(int sig) {
  const int saved = errno;
  state().end_signal.Post(sig);
  errno = saved;
}

void* WatchEndSignals(void*) {
  t_inprof = true;
  State& s = state();
  while (true) {
    const int what = s.end_signal.Wait();
    Finish();
    if (what == kFinishRequest) {
      s.finishes.fetch_add(1, std::memory_order_release);
      continue;
    }
    signal(what, SIG_DFL);
    kill(getpid(), what);
    return nullptr;
  }
}

// The watcher thread, for the end signals and FinishBeforeExit; in this
// process (a forked child starts its own).
void StartEndWatcher(State& s) {
  s.end_watcher =
      run::StartDetachedThread("inprof-signals", &WatchEndSignals, nullptr);
  s.end_watcher_pid = s.end_watcher ? getpid() : 0;
}

void InstallEndSignalHandlers() {
  State& s = state();
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
    sigaction(sig, &action, nullptr);
  }
  // Also when the program handles every end signal: _exit() needs it.
  StartEndWatcher(s);
}

// Before _exit() or _Exit() (interposed below): the profile is written by
// the watcher thread while the calling thread waits, at most stop_timeout +
// 5 s. The caller may be a signal handler that interrupted a thread holding
// a lock Stop() needs (malloc's): the wait is what bounds it, and it uses
// only async-signal-safe calls (sem_post, getpid, clock_gettime,
// nanosleep). Not in a process whose watcher is another's (a vfork child
// shares the parent's memory and has its own pid), nor on inprof's own
// threads.
void FinishBeforeExit() {
  if (t_inprof || !g_running.load(std::memory_order_acquire)) return;
  State& s = state();
  if (!s.end_watcher || s.end_watcher_pid != getpid()) return;
  const uint64_t before = s.finishes.load(std::memory_order_acquire);
  s.end_signal.Post(kFinishRequest);
  const int64_t limit_ns =
      absl::ToInt64Nanoseconds(s.options.stop_timeout) + 5'000'000'000LL;
  timespec start{};
  clock_gettime(CLOCK_MONOTONIC, &start);
  while (s.finishes.load(std::memory_order_acquire) == before) {
    timespec now{};
    clock_gettime(CLOCK_MONOTONIC, &now);
    if ((now.tv_sec - start.tv_sec) * 1'000'000'000LL + (now.tv_nsec - start.tv_nsec) >=
        limit_ns) {
      return;
    }
    const timespec tick{0, 1'000'000};
    nanosleep(&tick, nullptr);
  }
}

// Lifecycle lock held. A new profiler with the sink, and the calling thread
// registered with it.
void ConstructLocked(State& s) {
  InprofScope scope;
  Options options = s.options;
  s.sink = std::make_shared<ReportingFileSink>(s.report);
  if (options.write_output) {
    options.write_output = false;
    options.sinks.push_back(s.sink);
  }
  s.profiler = new PreloadProfiler(std::move(options));
  // A forked child's thread still points at its slot in the parent's
  // profiler: it registers afresh.
  internal::SetCurrentThreadSlot(nullptr);
  s.first_registration = new ThreadRegistration(
      s.profiler->RegisterThread(CurrentThreadName()));
  RememberTid(pthread_self(), Gettid());
  g_profiler.store(s.profiler, std::memory_order_release);
}

absl::Status StartLocked(State& s, const std::string& output) {
  if (s.profiler == nullptr) {
    return absl::FailedPreconditionError("profiling is off (INPROF_ENABLED=0)");
  }
  if (s.stepped_aside) {
    return absl::FailedPreconditionError(
        "the program installed its own SIGPROF handler");
  }
  if (s.running) return absl::AlreadyExistsError("profiling is already on");
  InprofScope scope;
  s.sink->SetPattern(output);
  if (absl::Status st = s.profiler->Start(); !st.ok()) return st;
  s.running = true;
  s.output = output;
  s.start = absl::Now();
  g_running.store(true, std::memory_order_release);
  if (!s.hooks_installed) {
    s.hooks_installed = true;
    atexit(&AtExit);
    at_quick_exit(&AtExit);
    InstallEndSignalHandlers();
  }
  AppendToReport(s.report, "started");
  return absl::OkStatus();
}

// In a forked child: the parent's profiler is forgotten (its threads do not
// exist here) and the child gets one of its own, with the thread that forked
// registered; it samples if the parent did.
void AtForkChild() {
  State& s = state();
  // The child has one thread: a lifecycle lock another thread of the parent
  // held (writing the parent's profile) means nothing here.
  new (&s.lifecycle) std::mutex;
  // Nor does the parent's signal watcher exist here: the end signals'
  // handlers (inherited) need one of the child's own, or SIGTERM would
  // never end the child.
  if (s.end_watcher) {
    s.end_signal.~SignalWake();
    new (&s.end_signal) run::SignalWake;
    s.finishes.store(0, std::memory_order_relaxed);
    StartEndWatcher(s);
  }
  PreloadProfiler* parent = s.profiler;
  if (parent == nullptr) return;
  const bool was_running = s.running;
  if (was_running) {
    InprofScope scope;
    (void)parent->Stop();  // in a child: forgets, writes nothing
  }
  s.running = false;
  g_running.store(false, std::memory_order_release);
  // The parent's registrations and profiler: leaked, never touched.
  s.first_registration = nullptr;
  s.profiler = nullptr;
  g_profiler.store(nullptr, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(s.tids_mu);
    s.tids.clear();
  }
  if (!s.children) return;
  std::lock_guard<std::mutex> lock(s.lifecycle);
  ConstructLocked(s);
  if (was_running) {
    const std::string output = run::OutputPatternForThisProcess(s.output);
    if (absl::Status st = StartLocked(s, output); !st.ok()) {
      internal::Log(absl::StrCat("forked child: profiling stays off: ",
                                 st.message()));
      AppendToReport(s.report, "off", st.message());
    }
  }
}

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

void Rename(pid_t tid, const char* name) {
  PreloadProfiler* profiler = g_profiler.load(std::memory_order_acquire);
  if (profiler == nullptr || tid <= 0 || name == nullptr) return;
  InprofScope scope;
  profiler->SetThreadName(tid, name);
}

}  // namespace

namespace run {

void UnblockSigprofAfterExec() { inprof::UnblockSigprofAfterExec(); }

bool StartDetachedThread(const char* name, void* (*fn)(void*), void* arg) {
  pthread_t t;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  InprofScope scope;  // inprof's own thread starts with every signal blocked
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  const bool started = pthread_create(&t, &attr, fn, arg) == 0;
  if (started) pthread_setname_np(t, name);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  pthread_attr_destroy(&attr);
  return started;
}

void Init(Options options, std::string report, bool children) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.lifecycle);
  if (s.profiler != nullptr || !options.enabled) return;
  // Before main(), like the preload's other environment changes: forked
  // and exec'd children inherit it and know they are not the first.
  int first = 0;
  const char* first_env = getenv(kFirstPidVariable);
  if (first_env == nullptr || !absl::SimpleAtoi(first_env, &first) || first <= 0) {
    first = getpid();
    setenv(kFirstPidVariable, absl::StrCat(first).c_str(), 1);
  }
  s.first_pid = first;
  options.sinks.clear();
  s.options = std::move(options);
  s.report = std::move(report);
  s.children = children;
  ConstructLocked(s);
  InprofScope scope;
  pthread_atfork(nullptr, nullptr, &AtForkChild);
}

bool IsFirstProcess() {
  const pid_t first = state().first_pid;
  return first == 0 || getpid() == first;
}

std::string OutputPatternForThisProcess(const std::string& pattern) {
  bool names_pid = false;
  for (size_t i = 0; i + 1 < pattern.size(); ++i) {
    if (pattern[i] != '%') continue;
    if (pattern[i + 1] == 'p') names_pid = true;
    ++i;  // "%%" is a literal percent sign
  }
  if (names_pid || getpid() == state().first_pid) return pattern;
  struct stat st;
  const std::string path = ExpandOutputPattern(pattern, getpid(), absl::Now());
  if (lstat(path.c_str(), &st) == 0 && (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode))) {
    return pattern;
  }
  return pattern + "_%p";
}

absl::Status Start(const std::string& output_pattern) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.lifecycle);
  return StartLocked(s, output_pattern);
}

void Stop() { Finish(); }

void ReportStartFailure(const absl::Status& status) {
  State& s = state();
  std::string report;
  {
    std::lock_guard<std::mutex> lock(s.lifecycle);
    report = s.report;
  }
  AppendToReport(report, "off", status.message());
}

Status CurrentStatus() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.lifecycle);
  Status out;
  out.running = s.running;
  out.start = s.start;
  out.output = s.output;
  if (s.profiler != nullptr) {
    out.samples = static_cast<int64_t>(s.profiler->stats().samples_taken);
  }
  return out;
}

bool AllocationsSampled() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.lifecycle);
  return s.profiler != nullptr && s.options.alloc_period > 0;
}

absl::Status SampleAllocations(uint64_t period, const char* source) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.lifecycle);
  if (s.profiler == nullptr) {
    return absl::FailedPreconditionError("profiling is off (INPROF_ENABLED=0)");
  }
  if (s.options.alloc_period > 0) return absl::OkStatus();
  if (s.running) {
    return absl::FailedPreconditionError(
        "the CPU profile running now started without allocation sampling");
  }
  if (absl::Status st = s.profiler->SetAllocPeriod(period, source); !st.ok()) return st;
  s.options.alloc_period = period;
  s.options.alloc_period_source = source;
  return absl::OkStatus();
}

absl::StatusOr<std::string> HeapSnapshot() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.lifecycle);  // Stop at exit waits for it
  if (s.profiler == nullptr || !s.running) {
    return absl::FailedPreconditionError("profiling is not running");
  }
  InprofScope scope;
  return s.profiler->HeapProfile("inuse_space");
}

void RegisterCurrentThread() {
  PreloadProfiler* profiler = g_profiler.load(std::memory_order_acquire);
  if (profiler == nullptr) return;
  if (internal::ThreadSlotHeader* slot = internal::CurrentThreadSlot();
      slot != nullptr && slot->session.load() != 0) {
    return;
  }
  // Lives until the thread exits (a thread_local's destructor).
  thread_local std::unique_ptr<ThreadRegistration> registration;
  InprofScope scope;
  registration = std::make_unique<ThreadRegistration>(
      profiler->RegisterThread(CurrentThreadName()));
  RememberTid(pthread_self(), Gettid());
}

}  // namespace run
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
  inprof::State& s = inprof::state();
  std::lock_guard<std::mutex> lock(s.lifecycle);
  if (s.stepped_aside || s.profiler == nullptr) return;
  s.stepped_aside = true;
  if (!s.running) return;
  inprof::internal::Log(absl::StrCat(
      "the program installs its own SIGPROF handler (", how,
      "): profiling stops here and the profile so far is written"));
  inprof::StopLocked(s);
}

// _exit and _Exit skip atexit: the profile is written first (bounded; see
// FinishBeforeExit). exit() needs nothing here: its atexit handler writes
// it, and libc's own calls to _exit do not come through here.
__attribute__((visibility("default"), noreturn)) void _exit(int status) {
  using Fn = void (*)(int);
  static Fn real = Next<Fn>("_exit");
  inprof::FinishBeforeExit();
  if (real != nullptr) real(status);
  syscall(SYS_exit_group, status);
  __builtin_unreachable();
}

__attribute__((visibility("default"), noreturn)) void _Exit(int status) noexcept {
  _exit(status);
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
  if (how != SIG_UNBLOCK) set = inprof::WithoutSigprof(set, storage, "pthread_sigmask");
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
  if (how != SIG_UNBLOCK) set = inprof::WithoutSigprof(set, storage, "sigprocmask");
  return real(how, set, old);
}

__attribute__((visibility("default"))) int sigwait(const sigset_t* set,
                                                   int* sig) {
  using Fn = int (*)(const sigset_t*, int*);
  static Fn real = Next<Fn>("sigwait");
  if (real == nullptr) return ENOSYS;
  sigset_t storage;
  set = inprof::WithoutSigprof(set, storage, "sigwait");
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
  set = inprof::WithoutSigprof(set, storage, "sigwaitinfo");
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
  set = inprof::WithoutSigprof(set, storage, "sigtimedwait");
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
  mask = inprof::WithoutSigprof(mask, storage, "signalfd");
  return real(fd, mask, flags);
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
