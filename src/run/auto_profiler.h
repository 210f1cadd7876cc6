// internal: not part of the public API.
//
// The process's automatic profiler, shared by the preload library `inprof
// run` loads (src/run/preload_linux.cc) and the gperftools API drop-in
// (src/gperftools/profiler_api.cc): one DefaultProfiler per process, every
// thread the program creates registered with it (interposed pthread_create)
// whether or not it runs, thread names followed, the profile written however
// the program ends, a profiler of its own for each forked child, and SIGPROF
// handed over to a program that installs its own handler.
//
// Thread-safety: every function may be called from any thread; none from a
// signal handler.
#ifndef INPROF_RUN_AUTO_PROFILER_H_
#define INPROF_RUN_AUTO_PROFILER_H_

#include <semaphore.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "inprof/options.h"

namespace inprof::run {

// First thing in a process image an exec() started from a profiled one:
// discards the SIGPROF the old image left pending and unblocks it (see
// ExecGuard in auto_profiler_exec_linux.cc).
void UnblockSigprofAfterExec();

// Starts a detached helper thread named `name` that runs fn(arg) with every
// signal blocked (signals meant for the program never land on it). Returns
// false if the thread could not be created (fn is then not run).
bool StartDetachedThread(const char* name, void* (*fn)(void*), void* arg);

// A signal handler's wake-up call to a helper thread, without a descriptor:
// a pipe's number may be closed by the program (a daemon's close_range(3,
// ~0U, 0) at start) and reused for one of its files, which the handler
// would then write into, and the helper would never wake. Post() is
// async-signal-safe (sem_post); each Post() wakes one Wait(), which returns
// the value of the latest Post() (a signal number).
class SignalWake {
 public:
  SignalWake() { sem_init(&sem_, 0, 0); }
  ~SignalWake() { sem_destroy(&sem_); }
  SignalWake(const SignalWake&) = delete;
  SignalWake& operator=(const SignalWake&) = delete;
  void Post(int value) noexcept {
    value_.store(value, std::memory_order_relaxed);
    sem_post(&sem_);
  }
  int Wait() noexcept {
    while (sem_wait(&sem_) != 0) {
    }
    return value_.load(std::memory_order_relaxed);
  }

 private:
  sem_t sem_;
  std::atomic<int> value_{0};
};

// Constructs the profiler from `options` (nothing when options.enabled is
// false) and registers the calling thread. `report`: the file each written
// profile's path is appended to ("" for none). `children`: forked children
// profile (and start when the parent runs). Once per process.
void Init(Options options, std::string report, bool children);

// The variable that names the process tree's first process: `inprof run`
// sets it for the command it starts; Init() sets it where it is unset.
inline constexpr char kFirstPidVariable[] = "INPROF_RUN_FIRST_PID";

// `pattern` as this process writes it, so that no process of the tree
// replaces another's profile: a pattern without %p is written as given by
// the tree's first process only; any other (a forked or exec'd child)
// appends "_%p", gperftools' convention for CPUPROFILE. A pattern that names
// an existing FIFO or character device (/dev/null) is kept: every process
// writes into it, nothing is created or replaced.
std::string OutputPatternForThisProcess(const std::string& pattern);
// Whether this process is the tree's first (kFirstPidVariable): false in a
// forked or exec'd child of a process that called Init().
bool IsFirstProcess();

// Starts sampling into `output_pattern` (%p, %t). FailedPrecondition when
// not initialised, disabled or stepped aside; AlreadyExists when running.
absl::Status Start(const std::string& output_pattern);

// Records in the run's report (Init's `report`) that this process could
// not start profiling, and why (`inprof run` says so at the end).
void ReportStartFailure(const absl::Status& status);

// Stops sampling and writes the profile (waits for a write under way on
// another thread; a failure is logged). No-op when not running.
void Stop();

struct Status {
  bool running = false;
  absl::Time start;          // of the current run
  std::string output;        // its output pattern
  int64_t samples = 0;       // taken so far in this process
};
Status CurrentStatus();

// Whether Init's options sample allocations (INPROF_ALLOC_PERIOD, or
// HEAPPROFILE in the gperftools drop-in).
bool AllocationsSampled();

// Turns allocation sampling on at a mean of `period` bytes for the next
// Start (HeapProfilerStart without HEAPPROFILE or INPROF_ALLOC_PERIOD).
// FailedPrecondition while profiling runs without it (its CPU profile
// started without allocations) or when profiling is off.
absl::Status SampleAllocations(uint64_t period, const char* source = "");

// The heap now (ProfilerCommon::HeapProfile: a gzip pprof, alloc_* since
// Start and inuse_* now). FailedPrecondition when not running; NotFound
// when allocations are not sampled.
absl::StatusOr<std::string> HeapSnapshot();

// Registers the calling thread (a thread the program created before Init, or
// without pthread_create) until it exits. No-op when it is registered.
void RegisterCurrentThread();

}  // namespace inprof::run

#endif  // INPROF_RUN_AUTO_PROFILER_H_
