// The process's automatic profiler (auto_profiler.h): its state, Init,
// Start and Stop, the profile written however the program ends (atexit,
// the end signals' watcher thread, and _exit/_Exit, interposed here: the
// profile is written first, by the watcher thread, for a bounded time: see
// FinishBeforeExit), and a profiler of its own for each forked child. The
// calls it interposes for threads, SIGPROF and exec are in
// auto_profiler_{threads,signals,exec}_linux.cc (auto_profiler_state.h
// says which does what).
//
// Linked into libinprof_preload.so (with preload_linux.cc, what `inprof run`
// loads) and libinprof_gperftools (the gperftools API drop-in). In the
// shared library only the interposed calls and the gperftools API are
// exported (preload.map), so a program that links inprof itself never binds
// to this copy.
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
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

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "inprof/inprof.h"
#include "inprof/base/fork_guard.h"
#include "inprof/base/log.h"
#include "inprof/sink.h"
#include "src/run/auto_profiler.h"
#include "src/run/auto_profiler_state.h"
#include "src/run/run_report.h"

namespace inprof::run::detail {

pid_t Gettid() { return static_cast<pid_t>(syscall(SYS_gettid)); }

std::string CurrentThreadName() {
  char name[17] = {};
  if (prctl(PR_GET_NAME, name, 0, 0, 0) != 0) return "thread";
  return name;
}

constinit thread_local bool t_inprof __attribute__((tls_model("initial-exec"))) = false;

State& state() {
  static State* s = [] {
    auto* st = new State;  // never destroyed: used until the last exit
    internal::RegisterForkLock(&st->tids_mu, internal::kForkRankLeaf);
    return st;
  }();
  return *s;
}

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

namespace {

// The run report (INPROF_RUN_REPORT): src/run/run_report.h.
using run::AppendToReport;
using run::ReportingFileSink;

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

}  // namespace
}  // namespace inprof::run::detail

namespace inprof::run {

using namespace detail;  // NOLINT: this file's own parts

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

}  // namespace inprof::run

using inprof::run::detail::Next;

extern "C" {

// _exit and _Exit skip atexit: the profile is written first (bounded; see
// FinishBeforeExit). exit() needs nothing here: its atexit handler writes
// it, and libc's own calls to _exit do not come through here.
__attribute__((visibility("default"), noreturn)) void _exit(int status) {
  using Fn = void (*)(int);
  static Fn real = Next<Fn>("_exit");
  inprof::run::detail::FinishBeforeExit();
  if (real != nullptr) real(status);
  syscall(SYS_exit_group, status);
  __builtin_unreachable();
}

__attribute__((visibility("default"), noreturn)) void _Exit(int status) noexcept {
  _exit(status);
}

}  // extern "C"
