// internal: not part of the public API.
//
// What the parts of the automatic profiler (auto_profiler.h) share: its
// state, the profiler threads register with, the flag that marks inprof's
// own threads and calls, and the next definition of an interposed call.
//   auto_profiler_linux.cc          the state, Init/Start/Stop, the end
//                                   signals and _exit, a forked child's
//                                   profiler
//   auto_profiler_threads_linux.cc  pthread_create (each thread registered
//                                   while its start routine runs), thread
//                                   names (pthread_setname_np, prctl)
//   auto_profiler_signals_linux.cc  SIGPROF kept the profiler's: stepping
//                                   aside for a program's handler, out of
//                                   the program's masks and waits
//   auto_profiler_exec_linux.cc     SIGPROF blocked across an exec
//
// Thread-safety: as auto_profiler.h; State's fields under its locks.
#ifndef INPROF_RUN_AUTO_PROFILER_STATE_H_
#define INPROF_RUN_AUTO_PROFILER_STATE_H_

#include <dlfcn.h>
#include <pthread.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "absl/time/time.h"
#include "inprof/base/growth_safe_table.h"
#include "inprof/inprof.h"
#include "src/run/auto_profiler.h"
#include "src/run/run_report.h"

namespace inprof::run::detail {

using PreloadProfiler = DefaultProfiler;

pid_t Gettid();
// The calling thread's name (PR_GET_NAME; "thread" when it cannot be read).
std::string CurrentThreadName();

// Set on the threads inprof itself runs (collector, exporter, ticker,
// uploaders, the signal watcher) and on any thread while it is inside a call
// into the profiler: threads created then are inprof's own, never
// registered, and the SIGPROF handler inprof installs is not the program's.
// Initial-exec and constant-initialized: read in interposed calls a signal
// handler may make, without a call into the TLS machinery.
extern constinit thread_local bool t_inprof __attribute__((tls_model("initial-exec")));

struct InprofScope {
  bool saved = t_inprof;
  InprofScope() { t_inprof = true; }
  ~InprofScope() { t_inprof = saved; }
};

struct State {
  // Held while the profiler starts or stops (Start, Stop at exit, on an end
  // signal, stepping aside, in a forked child): exit() waits for a profile
  // another thread is writing.
  std::mutex lifecycle;
  PreloadProfiler* profiler = nullptr;  // never destroyed: see Stop()
  std::shared_ptr<run::ReportingFileSink> sink;
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
  internal::ThrowSafeMap<pthread_t, pid_t> tids;
};

State& state();

// The profiler threads register with (null before Init or when disabled),
// and whether it samples now.
extern std::atomic<PreloadProfiler*> g_profiler;
extern std::atomic<bool> g_running;

// pthread_t of the threads registered here (State::tids).
void RememberTid(pthread_t thread, pid_t tid);
void ForgetTid(pthread_t thread);

// Lifecycle lock held: stops sampling and writes the profile (the run
// report hears of a failure). The profiler object is never destroyed:
// threads the program leaves running may still hold registrations.
void StopLocked(State& s);
// StopLocked under the lifecycle lock.
void Finish();

// The next definition of the interposed call `name` (libc's).
template <typename F>
F Next(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
}

}  // namespace inprof::run::detail

#endif  // INPROF_RUN_AUTO_PROFILER_STATE_H_
