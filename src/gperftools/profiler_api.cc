// gperftools' CPU profiler API (<gperftools/profiler.h>, the copy in
// include/inprof/gperftools/) and its variables on inprof's automatic
// profiler (src/run/auto_profiler.h):
//
//   CPUPROFILE=FILE            profile from load to exit into FILE
//   CPUPROFILE_FREQUENCY=N     samples per CPU-second, 1 to 1000 (100);
//                              the period is 1s/N of each thread's CPU
//   CPUPROFILESIGNAL=N         do not start at load: signal N starts a run
//                              into FILE.0, the next stops it, the next
//                              starts FILE.1, ...
//   CPUPROFILE_PER_THREAD_TIMERS, CPUPROFILE_TIMER_SIGNAL   accepted; inprof
//                              always uses per-thread timers
//   HEAPPROFILE=PREFIX         heap profile from load to exit: PREFIX.0001.heap
//                              (a forked or exec'd child: PREFIX_<pid>.0001.heap)
//                              (<gperftools/heap-profiler.h>: HeapProfilerStart,
//                              HeapProfilerDump, HeapProfilerStop,
//                              IsHeapProfilerRunning, GetHeapProfile)
//   HEAP_PROFILE_ALLOCATION_INTERVAL=BYTES    dump each time this many more
//                              bytes were allocated (1073741824; 0: never)
//   HEAP_PROFILE_DEALLOCATION_INTERVAL=BYTES  ... freed (0)
//   HEAP_PROFILE_INUSE_INTERVAL=BYTES         ... whenever the bytes in use
//                              pass their last high mark by this (104857600)
//   HEAP_PROFILE_TIME_INTERVAL=SECONDS        ... every this many seconds (0)
//
// Built into libinprof_preload.so and, with INPROF_GPERFTOOLS_CONSTRUCTOR,
// into libinprof_gperftools.a, whose constructor reads the variables (the
// preload library's constructor does it in preload_linux.cc).
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "inprof/base/fork_guard.h"
#include "inprof/base/log.h"
#include "inprof/base/platform.h"
#include "inprof/heap/allocation_provider.h"
#include "inprof/internal/legacy_heap.h"
#include "inprof/internal/process_maps.h"
#include "inprof/options.h"
#include "src/run/gperftools_env.h"
#include "src/run/auto_profiler.h"
#include "gperftools/heap-profiler.h"
#include "gperftools/profiler.h"

namespace inprof::gperftools {
namespace {

// Trivially initialised: the constructor that sets it may run before the
// dynamic initialisers of this file. Never destroyed.
run::SignalWake* g_toggle = nullptr;

void ToggleHandler(int sig) {
  const int saved = errno;
  g_toggle->Post(sig);
  errno = saved;
}

// `arg`: CPUPROFILE's path (a heap string this thread owns).
void* ToggleThread(void* arg) {
  const std::string signal_file = *static_cast<std::string*>(arg);
  delete static_cast<std::string*>(arg);
  int runs = 0;
  while (true) {
    (void)g_toggle->Wait();
    if (run::CurrentStatus().running) {
      run::Stop();
    } else {
      const std::string file = absl::StrCat(signal_file, ".", runs++);
      if (absl::Status s = run::Start(file); !s.ok()) {
        internal::Log(absl::StrCat("CPUPROFILESIGNAL: cannot start profiling "
                                   "into '", file, "': ", s.message()));
      }
    }
  }
}

// gperftools' dump intervals (its HEAP_PROFILE_* variables, read at each
// HeapProfilerStart; 0 turns one off). Checked against the allocation
// profiler's estimates (AllocationProvider::Stats) every kIntervalCheck, on
// a thread of inprof's, where gperftools checks at each allocation: a dump
// comes up to that much later, and its reason says what had been reached.
struct DumpIntervals {
  int64_t allocation = int64_t{1} << 30;  // bytes allocated since the last dump
  int64_t deallocation = 0;               // bytes freed since the last dump
  int64_t inuse = int64_t{100} << 20;     // growth of the high mark of bytes in use
  int64_t time_s = 0;                     // seconds since the last dump
  bool any() const { return allocation > 0 || deallocation > 0 || inuse > 0 || time_s > 0; }
};
constexpr auto kIntervalCheck = std::chrono::milliseconds(100);

// The heap profiler's state (HeapProfilerStart to HeapProfilerStop).
struct HeapProfiling {
  std::mutex mu;
  std::condition_variable changed;  // running or the intervals changed
  bool running = false;
  bool started_profiler = false;  // HeapProfilerStart started run::Start
  std::string prefix;      // the dumps' (a child's: with its pid)
  std::string prefix_as_given;
  int dumps = 0;
  DumpIntervals intervals;
  // What the last interval dump saw (at HeapProfilerStart: what was then).
  uint64_t last_dump_alloc = 0;
  uint64_t last_dump_free = 0;
  uint64_t high_mark = 0;
  int64_t last_dump_ns = 0;  // steady clock
  bool checker_started = false;
};
void HeapAtForkChild();
HeapProfiling& Heap() {
  static auto* heap = [] {
    auto* h = new HeapProfiling;  // never destroyed: used at exit
    // A fork() while the interval checker dumps would leave the lock held
    // in the child, whose exit dump would then wait forever.
    internal::RegisterForkLock(&h->mu, internal::kForkRankOutermost);
    pthread_atfork(nullptr, nullptr, &HeapAtForkChild);
    return h;
  }();
  return *heap;
}

int64_t SteadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A HEAP_PROFILE_* variable: a whole number, 0 or more; otherwise one line
// naming it, and `fallback`.
int64_t IntervalFromEnvironment(const char* name, int64_t fallback, const char* unit) {
  const char* value = getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  int64_t n = 0;
  if (!absl::SimpleAtoi(value, &n) || n < 0) {
    internal::Log(absl::StrCat(name, "='", value, "': expected a whole number of ", unit,
                               " (0: never); using ", fallback));
    return fallback;
  }
  return n;
}

DumpIntervals IntervalsFromEnvironment() {
  DumpIntervals d;
  d.allocation =
      IntervalFromEnvironment("HEAP_PROFILE_ALLOCATION_INTERVAL", d.allocation, "bytes");
  d.deallocation =
      IntervalFromEnvironment("HEAP_PROFILE_DEALLOCATION_INTERVAL", d.deallocation, "bytes");
  d.inuse = IntervalFromEnvironment("HEAP_PROFILE_INUSE_INTERVAL", d.inuse, "bytes");
  d.time_s = IntervalFromEnvironment("HEAP_PROFILE_TIME_INTERVAL", d.time_s, "seconds");
  return d;
}

void DumpLocked(HeapProfiling& h, const char* reason) {
  absl::StatusOr<std::string> pprof = run::HeapSnapshot();
  if (!pprof.ok()) {
    internal::Log(absl::StrCat("HeapProfilerDump: no heap profile: ", pprof.status().message()));
    return;
  }
  const std::string path = absl::StrFormat("%s.%04d.heap", h.prefix, ++h.dumps);
  if (absl::Status s = WriteFileAtomically(path, *pprof); !s.ok()) {
    internal::Log(absl::StrCat("HeapProfilerDump: ", s.message()));
    return;
  }
  internal::Log(absl::StrCat("dumping heap profile to ", path,
                             reason != nullptr && *reason != '\0'
                                 ? absl::StrCat(" (", reason, ")")
                                 : std::string()));
}

void DumpAtExit() {
  HeapProfiling& h = Heap();
  std::lock_guard<std::mutex> lock(h.mu);
  if (h.running) DumpLocked(h, "exiting");
  h.running = false;  // the interval checker dumps no more: the profiler stops
}

// gperftools' MaybeDumpProfileLocked, on the estimates: one dump at most a
// check, for the first interval reached, in gperftools' order.
void MaybeDumpLocked(HeapProfiling& h) {
  const AllocationProvider::Stats s = AllocationProvider::stats();
  const DumpIntervals& d = h.intervals;
  const int64_t now = SteadyNanos();
  const int64_t since_s = (now - h.last_dump_ns) / 1'000'000'000;
  constexpr int kMiB = 20;
  std::string reason;
  if (d.allocation > 0 && s.alloc_bytes >= h.last_dump_alloc + d.allocation) {
    reason = absl::StrCat(s.alloc_bytes >> kMiB, " MB allocated cumulatively, ",
                          s.inuse_bytes >> kMiB, " MB currently in use");
  } else if (d.deallocation > 0 && s.freed_bytes >= h.last_dump_free + d.deallocation) {
    reason = absl::StrCat(s.freed_bytes >> kMiB, " MB freed cumulatively, ",
                          s.inuse_bytes >> kMiB, " MB currently in use");
  } else if (d.inuse > 0 && s.inuse_bytes > h.high_mark + d.inuse) {
    reason = absl::StrCat(s.inuse_bytes >> kMiB, " MB currently in use");
  } else if (d.time_s > 0 && since_s >= d.time_s) {
    reason = absl::StrCat(since_s, " sec since the last dump");
    h.last_dump_ns = now;
  } else {
    return;
  }
  DumpLocked(h, reason.c_str());
  h.last_dump_alloc = s.alloc_bytes;
  h.last_dump_free = s.freed_bytes;
  h.high_mark = std::max(h.high_mark, s.inuse_bytes);
}

// The interval checker: sleeps while heap profiling is off or has no
// interval, else checks every kIntervalCheck. Lives as long as the process.
void* IntervalThread(void*) {
  HeapProfiling& h = Heap();
  std::unique_lock<std::mutex> lock(h.mu);
  while (true) {
    if (!h.running || !h.intervals.any()) {
      h.changed.wait(lock);
      continue;
    }
    h.changed.wait_for(lock, kIntervalCheck);
    if (h.running) MaybeDumpLocked(h);
  }
  return nullptr;
}

// A forked child profiles its own heap from the fork on (the run layer's
// handler, registered before this one, started its profiler and with it
// the allocation hooks' takeover, AllocHooks::Install) into PREFIX_<pid>,
// as gperftools names a child's files: never into its parent's. It has no
// checker thread (fork copies the calling thread only): one of its own.
// The dumps' lock is held by the fork guard until its own child handler,
// which may come after this one: not taken here (one thread).
void HeapAtForkChild() {
  HeapProfiling& h = Heap();
  h.checker_started = false;
  if (!h.running) return;
  if (!run::AllocationsSampled()) {
    h.running = false;  // no profiler of its own: no dumps, none of its parent's
    return;
  }
  h.prefix = absl::StrCat(h.prefix_as_given, "_", getpid());
  h.dumps = 0;
  const AllocationProvider::Stats s = AllocationProvider::stats();
  h.last_dump_alloc = s.alloc_bytes;
  h.last_dump_free = s.freed_bytes;
  h.high_mark = s.inuse_bytes;
  h.last_dump_ns = SteadyNanos();
  if (h.intervals.any()) {
    h.checker_started = run::StartDetachedThread("inprof-heapdump", &IntervalThread, nullptr);
  }
}

}  // namespace

void ApplyHeapProfileDefaults(Options& options) {
  const char* prefix = getenv("HEAPPROFILE");
  if (prefix == nullptr || *prefix == '\0') return;
  // Go's and jemalloc's mean, unless INPROF_ALLOC_PERIOD says otherwise.
  if (options.alloc_period == 0 && getenv("INPROF_ALLOC_PERIOD") == nullptr) {
    options.alloc_period = 512 * 1024;
    options.alloc_period_source = "HEAPPROFILE";
  }
}

void StartHeapFromEnvironment() {
  const char* prefix = getenv("HEAPPROFILE");
  if (prefix == nullptr || *prefix == '\0') return;
  // An exec'd child inherits the variable: as with gperftools (and
  // CPUPROFILE here), a process other than the tree's first writes
  // PREFIX_<pid>.NNNN.heap, never its parent's files.
  const std::string own =
      run::IsFirstProcess() ? std::string(prefix) : absl::StrCat(prefix, "_", getpid());
  HeapProfilerStart(own.c_str());
  // After run::Start's own exit hook: atexit runs this one first, while
  // the profiler still runs.
  if (IsHeapProfilerRunning()) atexit(&DumpAtExit);
}

namespace {

// `path` as an output pattern that names exactly it: gperftools writes
// ProfilerStart's file and CPUPROFILE as given ("%p" stays "%p"), where
// inprof's patterns expand %p, %t and %%.
std::string LiteralPattern(std::string_view path) {
  std::string out;
  out.reserve(path.size());
  for (char c : path) {
    out.push_back(c);
    if (c == '%') out.push_back('%');
  }
  return out;
}

}  // namespace

void ApplyGperftoolsDefaults(Options& options) {
  if (getenv("INPROF_WALL_PERIOD") == nullptr) {
    options.wall_period = absl::ZeroDuration();
  }
}

bool ApplyEnvironment(Options& options) {
  const char* file = getenv("CPUPROFILE");
  if (file == nullptr || *file == '\0') return false;
  ApplyGperftoolsDefaults(options);
  std::string path = file;
  // gperftools' libprofiler, when loaded, marks the variable as seen by
  // setting the high bit of its first byte (so that its children write
  // FILE_<pid>); the path is the value without the mark.
  path[0] = static_cast<char>(path[0] & 0x7f);
  options.output = LiteralPattern(path);
  options.export_period = absl::ZeroDuration();
  options.write_output = true;
  if (const char* f = getenv("CPUPROFILE_FREQUENCY"); f != nullptr && *f) {
    int hz = 0;
    if (!absl::SimpleAtoi(f, &hz) || hz < 1) {
      internal::Log(absl::StrCat("CPUPROFILE_FREQUENCY='", f,
                                 "': expected a whole number of samples per "
                                 "second from 1 to 1000; using 100"));
    } else {
      if (hz > 1000) {
        internal::Log(absl::StrCat("CPUPROFILE_FREQUENCY=", hz,
                                   ": inprof samples at most every 1ms of a "
                                   "thread's CPU; using 1000"));
        hz = 1000;
      }
      options.cpu_period = absl::Seconds(1) / hz;
    }
  }
  return true;
}

bool StartFromEnvironment(Options options, const std::string& report,
                          bool children) {
  if (!ApplyEnvironment(options)) return false;
  run::Init(options, report, children);
  // As with gperftools: the first process writes FILE, a forked or exec'd
  // child FILE_<pid> (see OutputPatternForThisProcess).
  options.output = run::OutputPatternForThisProcess(options.output);
  if (const char* sig = getenv("CPUPROFILESIGNAL"); sig != nullptr && *sig) {
    int n = 0;
    if (!absl::SimpleAtoi(sig, &n) || n < 1 || n >= NSIG || n == SIGPROF ||
        n == SIGKILL || n == SIGSTOP) {
      internal::Log(absl::StrCat("CPUPROFILESIGNAL='", sig,
                                 "': expected a signal number (not SIGPROF); "
                                 "profiling from load to exit instead"));
    } else {
      g_toggle = new run::SignalWake;
      struct sigaction sa;
      std::memset(&sa, 0, sizeof(sa));
      sa.sa_handler = &ToggleHandler;
      sa.sa_flags = SA_RESTART;
      sigaction(n, &sa, nullptr);
      auto* file = new std::string(options.output);
      if (!run::StartDetachedThread("inprof-cpuprofsig", &ToggleThread, file)) {
        delete file;
      }
      return true;
    }
  }
  if (absl::Status s = run::Start(options.output); !s.ok()) {
    internal::Log(absl::StrCat("CPUPROFILE='", getenv("CPUPROFILE"),
                               "': profiling stays off: ", s.message()));
  }
  return true;
}

namespace {

#ifdef INPROF_GPERFTOOLS_CONSTRUCTOR
// libinprof_gperftools.a: the program's own link; CPUPROFILE starts it.
__attribute__((constructor)) void GperftoolsInit() {
  run::UnblockSigprofAfterExec();
  Options options = Options::FromEnv();
  if (!options.enabled) return;
  ApplyGperftoolsDefaults(options);
  ApplyHeapProfileDefaults(options);
  if (!StartFromEnvironment(options, "", true)) {
    run::Init(options, "", true);  // threads register; ProfilerStart samples
  }
  StartHeapFromEnvironment();
}
#endif

std::atomic<bool> g_filter_said{false};

}  // namespace
}  // namespace inprof::gperftools

using namespace inprof;

extern "C" {

__attribute__((visibility("default"))) int ProfilerStartWithOptions(
    const char* fname, const struct ProfilerOptions* options) {
  if (fname == nullptr || *fname == '\0') return 0;
  if (options != nullptr && options->filter_in_thread != nullptr &&
      !gperftools::g_filter_said.exchange(true)) {
    internal::Log("ProfilerStartWithOptions: filter_in_thread is not "
                  "supported; every registered thread is profiled");
  }
  // A program that never loaded the variables' constructor (the preload
  // library without CPUPROFILE): the profiler from INPROF_*.
  Options from_env = Options::FromEnv();
  if (!from_env.enabled) return 0;  // INPROF_ENABLED=0: a silent no-op
  gperftools::ApplyGperftoolsDefaults(from_env);
  run::Init(std::move(from_env), "", true);
  absl::Status s = run::Start(gperftools::LiteralPattern(fname));
  if (!s.ok() && !absl::IsAlreadyExists(s)) {
    internal::Log(absl::StrCat("ProfilerStart('", fname, "'): ", s.message()));
  }
  return s.ok() ? 1 : 0;
}

__attribute__((visibility("default"))) int ProfilerStart(const char* fname) {
  return ProfilerStartWithOptions(fname, nullptr);
}

__attribute__((visibility("default"))) void ProfilerStop(void) {
  run::Stop();
}

__attribute__((visibility("default"))) void ProfilerFlush(void) {}
__attribute__((visibility("default"))) void ProfilerEnable(void) {}
__attribute__((visibility("default"))) void ProfilerDisable(void) {}

__attribute__((visibility("default"))) int ProfilingIsEnabledForAllThreads(void) {
  return run::CurrentStatus().running ? 1 : 0;
}

__attribute__((visibility("default"))) void ProfilerRegisterThread(void) {
  run::RegisterCurrentThread();
}

__attribute__((visibility("default"))) void HeapProfilerStart(const char* prefix) {
  if (prefix == nullptr || *prefix == '\0') return;
  gperftools::HeapProfiling& h = gperftools::Heap();
  std::lock_guard<std::mutex> lock(h.mu);
  if (h.running) return;
  if (!run::AllocationsSampled()) {
    // As gperftools' does: no variable needed. The mean is Go's and
    // jemalloc's default (HEAPPROFILE's too).
    if (absl::Status s = run::SampleAllocations(512 * 1024, "HeapProfilerStart"); !s.ok()) {
      internal::Log(absl::StrCat("HeapProfilerStart('", prefix,
                                 "'): allocations cannot be sampled now: ", s.message(),
                                 " (set HEAPPROFILE or INPROF_ALLOC_PERIOD in the "
                                 "environment to sample them from the start); no heap "
                                 "profile"));
      return;
    }
  }
  h.started_profiler = false;
  if (!run::CurrentStatus().running) {
    // The heap alone: the CPU profile of this run goes nowhere.
    if (absl::Status s = run::Start("/dev/null"); !s.ok() && !absl::IsAlreadyExists(s)) {
      internal::Log(absl::StrCat("HeapProfilerStart('", prefix, "'): ", s.message()));
      return;
    }
    h.started_profiler = true;
  }
  h.running = true;
  h.prefix = prefix;
  h.prefix_as_given = prefix;
  h.dumps = 0;
  h.intervals = gperftools::IntervalsFromEnvironment();
  const AllocationProvider::Stats s = AllocationProvider::stats();
  h.last_dump_alloc = s.alloc_bytes;
  h.last_dump_free = s.freed_bytes;
  h.high_mark = s.inuse_bytes;  // what it grows by from now on, as gperftools'
  h.last_dump_ns = gperftools::SteadyNanos();
  if (h.intervals.any() && !h.checker_started) {
    h.checker_started =
        run::StartDetachedThread("inprof-heapdump", &gperftools::IntervalThread, nullptr);
    if (!h.checker_started) {
      internal::Log(absl::StrCat("HeapProfilerStart('", prefix,
                                 "'): no thread for the HEAP_PROFILE_* dump intervals; "
                                 "dumps at HeapProfilerDump and exit only"));
    }
  }
  h.changed.notify_all();
}

__attribute__((visibility("default"))) int IsHeapProfilerRunning(void) {
  gperftools::HeapProfiling& h = gperftools::Heap();
  std::lock_guard<std::mutex> lock(h.mu);
  return h.running ? 1 : 0;
}

__attribute__((visibility("default"))) void HeapProfilerStop(void) {
  gperftools::HeapProfiling& h = gperftools::Heap();
  std::lock_guard<std::mutex> lock(h.mu);
  if (!h.running) return;
  h.running = false;
  h.changed.notify_all();
  if (h.started_profiler) run::Stop();
  h.started_profiler = false;
}

__attribute__((visibility("default"))) void HeapProfilerDump(const char* reason) {
  gperftools::HeapProfiling& h = gperftools::Heap();
  std::lock_guard<std::mutex> lock(h.mu);
  if (!h.running) return;
  gperftools::DumpLocked(h, reason);
}

__attribute__((visibility("default"))) char* GetHeapProfile(void) {
  std::string text;
  {
    gperftools::HeapProfiling& h = gperftools::Heap();
    std::lock_guard<std::mutex> lock(h.mu);
    if (h.running) {
      absl::StatusOr<std::string> pprof = run::HeapSnapshot();
      std::string maps;
      if (pprof.ok()) {
        // The maps as the symbolizer reads them (O_CLOEXEC, closed here).
        if (auto read = internal::ReadProcessMaps(getpid(), &maps); !read.ok()) {
          pprof = read.status();
        }
      }
      absl::StatusOr<std::string> legacy =
          pprof.ok() ? internal::PprofToLegacyHeapProfile(*pprof, maps) : pprof.status();
      if (legacy.ok()) {
        text = std::move(*legacy);
      } else {
        internal::Log(absl::StrCat("GetHeapProfile: no heap profile: ", legacy.status().message()));
      }
    }
  }
  // The caller frees it (gperftools' contract): the C allocator's block.
  char* out = static_cast<char*>(std::malloc(text.size() + 1));
  if (out == nullptr) return nullptr;
  std::memcpy(out, text.data(), text.size());
  out[text.size()] = '\0';
  return out;
}

__attribute__((visibility("default"))) void ProfilerGetCurrentState(
    struct ProfilerState* state) {
  if (state == nullptr) return;
  const run::Status s = run::CurrentStatus();
  std::memset(state, 0, sizeof(*state));
  state->enabled = s.running ? 1 : 0;
  if (s.running) {
    state->start_time = absl::ToTimeT(s.start);
    std::strncpy(state->profile_name, s.output.c_str(),
                 sizeof(state->profile_name) - 1);
  }
  state->samples_gathered = static_cast<int>(s.samples);
}

}  // extern "C"
