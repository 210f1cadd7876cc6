// tests/safety/safety_util.h: helpers shared by the reliability and safety suite
// (tests/safety/safety_*_test.cc: never break the host).
//
// Defines: CPU burners, a way to send the profiling signal to one thread the
// way inprof's timers do (tagged) or the way kill(1) does (untagged), counters
// of process resources read from /proc (threads, fds, POSIX timers, RSS), a
// fork-and-wait helper with a watchdog, a watchdog thread, and the iteration
// scaling every test uses: CI runs a bounded count, INPROF_SAFETY_FULL=1 runs
// the count the issue asks for, and a sanitizer build runs less.
//
// Thread-safety: the functions are reentrant unless noted.
//
// Example:
//   const int threads = safety::Scaled(/*ci=*/20'000, /*full=*/100'000);
//   safety::Watchdog watchdog(absl::Seconds(120), "thread churn");
//   ASSERT_TRUE(safety::SendProfilingSignal(tid, /*tagged=*/true));
#ifndef INPROF_TESTS_SAFETY_UTIL_H_
#define INPROF_TESTS_SAFETY_UTIL_H_

#include <dirent.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "inprof/inprof.h"
#include "inprof/base/sanitizers.h"
#include "inprof/internal/signal_dispatch.h"
#include "util/test_util.h"

// Which sanitizer, if any, this translation unit is built with
// (inprof/base/sanitizers.h).
#if defined(INPROF_ASAN)
#define INPROF_SAFETY_ASAN 1
#endif
#if defined(INPROF_TSAN)
#define INPROF_SAFETY_TSAN 1
#endif

namespace inprof::safety {

#if defined(INPROF_SAFETY_ASAN)
inline constexpr bool kAsan = true;
#else
inline constexpr bool kAsan = false;
#endif
#if defined(INPROF_SAFETY_TSAN)
inline constexpr bool kTsan = true;
#else
inline constexpr bool kTsan = false;
#endif
inline constexpr bool kSanitized = kAsan || kTsan;

// True when INPROF_SAFETY_FULL=1: run the full counts (up to 10x CI's).
inline bool FullRun() {
  const char* v = std::getenv("INPROF_SAFETY_FULL");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

// The iteration count for this run: `full` with INPROF_SAFETY_FULL=1,
// otherwise `ci`: a quarter of it under ASan (2-3x slower), a sixteenth
// under TSan (5-15x slower, and every thread's birth costs it more: 5,000
// births with signals in flight took 120 s on the two CI cores). The
// plain and ASan suites keep the scale; TSan checks the same races on
// fewer rounds.
inline int64_t Scaled(int64_t ci, int64_t full) {
  if (FullRun()) return full;
  const int64_t divisor = kTsan ? 16 : kAsan ? 4 : 1;
  return ci / divisor > 0 ? ci / divisor : 1;
}

using ::inprof::testing::ThreadCpuNow;

inline int64_t MonotonicNow() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1'000'000'000LL + ts.tv_nsec;
}

// Burns about `ns` of this thread's CPU time without touching errno.
__attribute__((noinline)) inline uint64_t BurnCpu(int64_t ns) {
  const int64_t end = ThreadCpuNow() + ns;
  uint64_t x = 88172645463325252ULL;
  while (ThreadCpuNow() < end) {
    for (int i = 0; i < 2000; ++i) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
    }
  }
  asm volatile("" : "+r"(x));
  return x;
}

inline pid_t Gettid() { return static_cast<pid_t>(syscall(SYS_gettid)); }

// A provider that samples every signal tagged with its index: how these
// tests run the handler at moments of their choosing. (CpuTimeProvider
// samples only where a thread's CPU crossed one of its sample points, so a
// signal sent by hand with its tag usually records nothing.)
struct ProbeProvider {
  static constexpr const char* kName = "probe";
  static constexpr std::array<SampleTypeSpec, 1> kSampleTypes{
      {{"probe-samples", "count"}}};
  static constexpr size_t kPeriodTypeIndex = 0;
  struct ThreadData {};
  absl::Status Configure(const Options&) { return absl::OkStatus(); }
  int64_t Period() const { return 1; }
  absl::Status ArmThread(ThreadContext&, ThreadData&, int) {
    return absl::OkStatus();
  }
  void DisarmThread(ThreadContext&, ThreadData&) noexcept {}
  static bool OnSignal(ThreadContext&, ThreadData&, const siginfo_t&,
                       std::span<int64_t> values) noexcept {
    values[0] = 1;
    signals_taken.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  // Signals sampled, by every thread (SendProbeSignalToSelf).
  static inline std::atomic<uint64_t> signals_taken{0};
};
static_assert(SampleProvider<ProbeProvider>);

// DefaultProfiler's CPU and wall providers, and the probe (index 2).
template <typename U>
using ProbedProfilerOf =
    Profiler<U, DefaultSampleRing, CpuTimeProvider, WallTimeProvider, ProbeProvider>;
using ProbedProfiler = ProbedProfilerOf<FramePointerUnwinder>;
inline constexpr int kProbeProvider = 2;

// Sends SIGPROF to thread `tid` of this process. Tagged: as inprof's own
// signals are (SI_QUEUE with the tag of provider `provider`, by default
// ProbedProfiler's probe, which samples every one); untagged: like
// `kill -PROF` (the handler counts it as foreign). Uses rt_tgsigqueueinfo
// directly: glibc's pthread_sigqueue leaves garbage in rbp on the way.
// Returns false if the thread is gone. Async-signal-safe.
inline bool SendProfilingSignal(pid_t tid, bool tagged,
                                int provider = kProbeProvider) {
  if (!tagged) return syscall(SYS_tgkill, getpid(), tid, SIGPROF) == 0;
  siginfo_t info;
  std::memset(&info, 0, sizeof(info));
  info.si_signo = SIGPROF;
  info.si_code = SI_QUEUE;
  info.si_pid = getpid();
  info.si_uid = getuid();
  info.si_value.sival_int = internal::MakeSignalTag(provider);
  return syscall(SYS_rt_tgsigqueueinfo, getpid(), tid, SIGPROF, &info) == 0;
}

// Sends the probe's signal to the calling thread until the probe has
// sampled one (true), at most `tries` times. SIGPROF is a standard signal:
// one sent while another is pending (a timer's or the wall sampler's,
// generated in the moment before the send) is discarded by the kernel, and
// the pending one is handled in its place; one in ~30 runs of 25 sends met
// that. A signal a thread sends itself is handled before the system call
// returns, so the probe's count tells which happened. Only for a thread
// that is the only one sending probe signals.
inline bool SendProbeSignalToSelf(int tries = 100) {
  for (int i = 0; i < tries; ++i) {
    const uint64_t before = ProbeProvider::signals_taken.load(std::memory_order_relaxed);
    if (!SendProfilingSignal(Gettid(), /*tagged=*/true)) return false;
    if (ProbeProvider::signals_taken.load(std::memory_order_relaxed) != before) {
      return true;
    }
  }
  return false;
}

// Entries of a /proc directory, "." and ".." excluded.
inline int CountDirEntries(const char* path) {
  int n = 0;
  if (DIR* d = opendir(path)) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}
inline int CountThreads() { return CountDirEntries("/proc/self/task"); }
// Open fds, the one opendir uses to count them excluded.
inline int CountFds() { return CountDirEntries("/proc/self/fd") - 1; }

// POSIX timers of this process (one "ID:" line each in /proc/self/timers);
// -1 where the kernel lacks that file (CONFIG_CHECKPOINT_RESTORE=n).
inline int CountPosixTimers() {
  std::ifstream in("/proc/self/timers");
  if (!in) return -1;
  int n = 0;
  std::string line;
  while (std::getline(in, line)) n += line.rfind("ID:", 0) == 0;
  return n;
}

// Resident set size in bytes.
inline int64_t RssBytes() {
  std::ifstream in("/proc/self/statm");
  int64_t size = 0, resident = 0;
  in >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

// The scheduler state letter of thread `tid` ('R', 'S', 'D', ...), or 0.
inline char ThreadState(pid_t tid) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size()
             ? stat[paren + 2]
             : 0;
}

// Waits until thread `tid` sleeps in the kernel (state 'S'); false after
// `timeout`.
inline bool WaitUntilBlocked(pid_t tid,
                             absl::Duration timeout = absl::Seconds(5)) {
  const int64_t end = MonotonicNow() + absl::ToInt64Nanoseconds(timeout);
  while (MonotonicNow() < end) {
    if (ThreadState(tid) == 'S') return true;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return false;
}

// A small stack (a coroutine's, a sigaltstack) of `size` bytes with a
// PROT_NONE guard page below it: whatever overflows it faults at once
// instead of corrupting the memory below. base() is null when mmap failed.
class GuardedStack {
 public:
  explicit GuardedStack(size_t size) : size_(size) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    map_size_ = size_ + page;
    void* m = mmap(nullptr, map_size_, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return;
    map_ = static_cast<char*>(m);
    mprotect(map_, page, PROT_NONE);
    base_ = map_ + page;
  }
  ~GuardedStack() {
    if (map_ != nullptr) munmap(map_, map_size_);
  }
  GuardedStack(const GuardedStack&) = delete;
  GuardedStack& operator=(const GuardedStack&) = delete;
  char* base() const { return base_; }
  size_t size() const { return size_; }

 private:
  size_t size_;
  size_t map_size_ = 0;
  char* map_ = nullptr;
  char* base_ = nullptr;
};

// Runs `body` in a forked child and returns its exit code, or 128 + signal
// when it died of a signal. The child is killed by SIGALRM after
// `timeout_s`, which reads as 128 + SIGALRM (a hang).
//
// The child's stderr goes to a memory file that the parent copies to its
// own stderr, and to its stdout when the child failed: a sanitizer's report
// in the child (ASan exits 1 with it) then sits in the test's output beside
// the failed assertion, which is the part a CI log shows.
inline int RunInChild(const std::function<int()>& body, unsigned timeout_s) {
  fflush(nullptr);
  const int log = memfd_create("child-stderr", 0);
  const pid_t pid = fork();
  if (pid == 0) {
    if (log >= 0) {
      dup2(log, STDERR_FILENO);
      close(log);
    }
    signal(SIGALRM, SIG_DFL);
    alarm(timeout_s);
    _exit(body());
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  const int code =
      WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (log >= 0) {
    std::string text;
    char buf[4096];
    ssize_t n = 0;
    while (text.size() < (1u << 20) &&
           (n = pread(log, buf, sizeof(buf), static_cast<off_t>(text.size()))) > 0) {
      text.append(buf, static_cast<size_t>(n));
    }
    close(log);
    if (!text.empty()) {
      std::fwrite(text.data(), 1, text.size(), stderr);
      if (code != 0) {
        std::printf("the child (exit code %d) wrote to stderr:\n%s", code,
                    text.c_str());
        std::fflush(stdout);
      }
    }
  }
  return code;
}

// Aborts the process with a message if not destroyed within `limit`: a hang
// fails the test quickly and says where, instead of hitting meson's timeout.
class Watchdog {
 public:
  Watchdog(absl::Duration limit, std::string what)
      : what_(std::move(what)),
        thread_([this, limit] {
          std::unique_lock<std::mutex> lock(mutex_);
          if (!cv_.wait_for(lock, absl::ToChronoNanoseconds(limit),
                            [this] { return done_; })) {
            std::fprintf(stderr, "safety watchdog: '%s' still running after %s; "
                         "aborting (a hang)\n",
                         what_.c_str(), absl::FormatDuration(limit).c_str());
            std::abort();
          }
        }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  std::string what_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

// Puts `wrapper` in front of the profiling-signal handler a running
// profiler installed (tests count what reaches it); the wrapper runs
// inprof's handler with CallInprofHandler(). UnwrapInprofHandler() puts
// inprof's back. Returns false if no SA_SIGINFO handler is installed.
inline struct sigaction& InprofAction() {
  static struct sigaction action;
  return action;
}
inline void CallInprofHandler(int signo, siginfo_t* info, void* ucontext) {
  InprofAction().sa_sigaction(signo, info, ucontext);
}
inline bool WrapInprofHandler(void (*wrapper)(int, siginfo_t*, void*)) {
  if (sigaction(internal::kProfilingSignal, nullptr, &InprofAction()) != 0 ||
      (InprofAction().sa_flags & SA_SIGINFO) == 0) {
    return false;
  }
  struct sigaction wrapped = InprofAction();
  wrapped.sa_sigaction = wrapper;
  return sigaction(internal::kProfilingSignal, &wrapped, nullptr) == 0;
}
inline bool UnwrapInprofHandler() {
  return sigaction(internal::kProfilingSignal, &InprofAction(), nullptr) == 0;
}

}  // namespace inprof::safety

#endif  // INPROF_TESTS_SAFETY_UTIL_H_
