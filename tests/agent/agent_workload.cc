// A profiled program for tests/agent/agent_library_test.cc: it links inprof
// and profiles itself with Options::FromEnv(), so INPROF_AGENT_SOCKET in its
// environment puts it in library mode.
//
//   agent_workload threads OUT   threads "light" (200 ms of CPU in
//                                AgentSpinLight) and "heavy" (500 ms in
//                                AgentSpinHeavy); writes "pid N" and "name ns"
//                                lines of each one's measured CPU to OUT, and
//                                "name_outer ns" of its CPU around its
//                                registration
//   agent_workload spawn OUT     200 ms in AgentSpinParent on "main" (writes
//                                "parent ns" to OUT), then fork+exec's
//                                `agent_workload threads OUT.child` and waits
//                                for it
//   agent_workload die [OUT]     300 ms in AgentSpinDie, then SIGKILL itself
//                                (no Stop(), no exit handlers); prints "die NS
//                                die_outer NS" (its measured CPU, and the main
//                                thread's since it registered) to stderr; with
//                                OUT, writes them there first too and
//                                collects every 10 s (its collector never
//                                drains the samples before it dies; it waits
//                                for the unwind tables, then 1 s, before it
//                                spins, for the collector's first pass to end)
//   agent_workload long MS       MS ms of CPU in AgentSpinLong; prints
//                                "started" once its profiler runs, and
//                                "spun NS" (its measured CPU) to stderr
//   agent_workload until FILE MS spins in AgentSpinLong until FILE exists
//                                (60 s at most), then MS ms more in one call;
//                                prints "started" once its profiler runs
//   agent_workload heap DIR      allocates 100 blocks of 64 KiB in
//                                AgentHeapKept and keeps them, 50 of 32 KiB in
//                                AgentHeapFreed and frees them; waits until the
//                                agent wrote 4 more windows of its into DIR
//                                (agent-PID-*.pb.gz; 60 s at most); frees the
//                                kept ones and keeps 10 of 16 KiB from
//                                AgentHeapLate until Stop(); prints
//                                "started" after the first allocations
//   agent_workload locks DIR     8 waits in AgentLockWait on a mutex the main
//                                thread holds for 5 ms after the waiter is in
//                                the kernel; writes "waited NS" (the waiter's
//                                lock calls, as it timed them) to DIR/waited,
//                                prints "started", and waits until DIR/done
//                                exists (60 s at most)
//   agent_workload sleeper DIR   a thread registered as "sleeper" blocks in
//                                read() in AgentBlockedInRead; prints
//                                "started" once it waits there (10 s at
//                                most) and waits until DIR/done exists
//                                (60 s at most), then wakes it and joins it
#include <dirent.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "inprof/inprof.h"

namespace {

int64_t ThreadCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1'000'000'000LL + ts.tv_nsec;
}

// Written by every spinning thread: atomic, so that ThreadSanitizer sees no
// race of the test's own.
std::atomic<uint64_t> g_sink;

// Each burns `ns` of the calling thread's CPU in a loop of its own, so the
// profile names the function.
#define INPROF_SPIN_FUNCTION(name, salt)                       \
  __attribute__((noinline)) int64_t name(int64_t ns) {         \
    const int64_t t0 = ThreadCpuNs();                          \
    uint64_t x = salt;                                         \
    while (ThreadCpuNs() - t0 < ns) {                          \
      for (int i = 0; i < 20000; ++i) x = x * 6364136223846793005ULL + salt; \
      g_sink.store(x, std::memory_order_relaxed);              \
    }                                                          \
    return ThreadCpuNs() - t0;                                 \
  }

// The agent's windows of this process written into `dir` so far.
size_t AgentWindowsIn(const char* dir) {
  const std::string prefix = "agent-" + std::to_string(getpid()) + "-";
  size_t n = 0;
  if (DIR* d = opendir(dir)) {
    while (dirent* e = readdir(d)) {
      if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) ++n;
    }
    closedir(d);
  }
  return n;
}

}  // namespace

extern "C" {
// Each allocates `bytes` on a stack of its own (the pointer escapes, so the
// call stays; the store after it keeps the call from being a tail call).
#define INPROF_ALLOC_FUNCTION(name)                                      \
  __attribute__((noinline)) void* name(size_t bytes) {                 \
    void* p = std::malloc(bytes);                                        \
    g_sink.store(reinterpret_cast<uintptr_t>(p), std::memory_order_relaxed); \
    return p;                                                            \
  }
INPROF_ALLOC_FUNCTION(AgentHeapKept)
INPROF_ALLOC_FUNCTION(AgentHeapFreed)
INPROF_ALLOC_FUNCTION(AgentHeapLate)

// Blocks in read() on `fd` (the store after it keeps the call in it).
__attribute__((noinline)) ssize_t AgentBlockedInRead(int fd) {
  char c;
  const ssize_t n = read(fd, &c, 1);
  g_sink.store(static_cast<uint64_t>(n), std::memory_order_relaxed);
  return n;
}

// A wait of its own: the lock call stays in it (the store after it keeps
// it from being a tail call).
__attribute__((noinline)) void AgentLockWait(std::mutex& m) {
  m.lock();
  g_sink.store(1, std::memory_order_relaxed);
}

INPROF_SPIN_FUNCTION(AgentSpinLight, 1)
INPROF_SPIN_FUNCTION(AgentSpinHeavy, 3)
INPROF_SPIN_FUNCTION(AgentSpinParent, 5)
INPROF_SPIN_FUNCTION(AgentSpinDie, 7)
INPROF_SPIN_FUNCTION(AgentSpinLong, 9)
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: agent_workload threads|spawn|die|long ...\n");
    return 2;
  }
  const std::string mode = argv[1];
  inprof::Options options = inprof::Options::FromEnv();
  if (mode == "die" && argc == 3) options.collect_period = absl::Seconds(10);
  inprof::DefaultProfiler profiler(options);
  inprof::ScopedProfiler running(profiler);
  const int64_t before_registering = ThreadCpuNs();
  auto self = profiler.RegisterThread("main");
  const int64_t registered = before_registering;
  if (mode == "threads" && argc == 3) {
    // Each thread's CPU in its spin, and around its registration (the
    // profile's total is within a period of both: agent_library_test).
    int64_t light = 0, heavy = 0, light_outer = 0, heavy_outer = 0;
    auto worker = [&](const char* name, int64_t (*spin)(int64_t), int64_t ns, int64_t* inner,
                      int64_t* outer) {
      const int64_t t0 = ThreadCpuNs();
      auto r = profiler.RegisterThread(name);
      *inner = spin(ns);
      r.Reset();
      *outer = ThreadCpuNs() - t0;
    };
    std::thread a(worker, "light", AgentSpinLight, 200'000'000, &light, &light_outer);
    std::thread b(worker, "heavy", AgentSpinHeavy, 500'000'000, &heavy, &heavy_outer);
    a.join();
    b.join();
    std::ofstream(argv[2]) << "pid " << getpid() << "\nlight " << light << "\nlight_outer "
                           << light_outer << "\nheavy " << heavy << "\nheavy_outer "
                           << heavy_outer << "\n";
    return 0;
  }
  if (mode == "spawn" && argc == 3) {
    const int64_t parent = AgentSpinParent(200'000'000);
    std::ofstream(argv[2]) << "parent " << parent << "\n";
    const std::string out = std::string(argv[2]) + ".child";
    const pid_t child = fork();
    if (child == 0) {
      execl("/proc/self/exe", "agent_workload", "threads", out.c_str(), nullptr);
      _exit(127);
    }
    int status = 0;
    waitpid(child, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
  }
  if (mode == "die") {
    // Without a collection period to wait for: its collector's first pass
    // (right after Start(), building the unwind tables, ~1 s under TSan)
    // ends meanwhile; after the tables, one drain is left of it.
    if (argc == 3) {
      for (int i = 0; i < 60'000 && !inprof::DwarfUnwinder::TablesReady(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    const int64_t spun = AgentSpinDie(300'000'000);
    // Its measured CPU, and all the main thread's since it registered.
    if (argc == 3) {
      std::ofstream(argv[2]) << "die " << spun << "\ndie_outer " << ThreadCpuNs() - registered
                             << "\n";
    }
    std::fprintf(stderr, "die %lld die_outer %lld\n", static_cast<long long>(spun),
                 static_cast<long long>(ThreadCpuNs() - registered));
    raise(SIGKILL);
    return 1;
  }
  if (mode == "long" && argc == 3) {
    std::printf("started\n");
    std::fflush(stdout);
    const int64_t spun = AgentSpinLong(std::atoll(argv[2]) * 1'000'000);
    std::fprintf(stderr, "spun %lld\n", static_cast<long long>(spun));
    return 0;
  }
  if (mode == "until" && argc == 4) {
    std::printf("started\n");
    std::fflush(stdout);
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (access(argv[2], F_OK) != 0 && std::chrono::steady_clock::now() < give_up) {
      AgentSpinLong(5'000'000);
    }
    AgentSpinLong(std::atoll(argv[3]) * 1'000'000);
    return 0;
  }
  if (mode == "heap" && argc == 3) {
    std::vector<void*> kept;
    for (int i = 0; i < 100; ++i) kept.push_back(AgentHeapKept(64 * 1024));
    for (int i = 0; i < 50; ++i) std::free(AgentHeapFreed(32 * 1024));
    std::printf("started\n");
    std::fflush(stdout);
    const size_t before = AgentWindowsIn(argv[2]);
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (AgentWindowsIn(argv[2]) < before + 4 && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    for (void* p : kept) std::free(p);
    // Still live when the profiler stops (never freed: the process ends;
    // held by a global, so LeakSanitizer sees them reachable).
    static void* late[10];
    for (void*& p : late) p = AgentHeapLate(16 * 1024);
    return 0;
  }
  if (mode == "sleeper" && argc == 3) {
    int fds[2];
    if (pipe(fds) != 0) return 1;
    std::atomic<pid_t> tid{0};
    std::thread sleeper([&] {
      auto registered = profiler.RegisterThread("sleeper");
      tid.store(static_cast<pid_t>(syscall(SYS_gettid)));
      AgentBlockedInRead(fds[0]);
    });
    // "started" once it waits in read() (/proc's syscall file starts with
    // the call's number), 10 s at most.
    auto in_read = [&] {
      std::ifstream in("/proc/self/task/" + std::to_string(tid.load()) + "/syscall");
      long number = -1;
      return tid.load() != 0 && static_cast<bool>(in >> number) && number == SYS_read;
    };
    for (int i = 0; i < 10'000 && !in_read(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::printf("started\n");
    std::fflush(stdout);
    const std::string done = std::string(argv[2]) + "/done";
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (access(done.c_str(), F_OK) != 0 && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (write(fds[1], "x", 1) != 1) return 1;
    sleeper.join();
    return 0;
  }
  if (mode == "locks" && argc == 3) {
    // Each round's wait found the lock busy (the waiter is in the kernel,
    // glibc's lock word 2, before the hold begins) and lasts at least 5 ms.
    std::mutex m;
    int64_t waited = 0;
    for (int round = 0; round < 8; ++round) {
      m.lock();
      std::atomic<bool> finished{false};
      std::thread waiter([&] {
        auto registered = profiler.RegisterThread("lock waiter");
        const auto start = std::chrono::steady_clock::now();
        AgentLockWait(m);
        waited += std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now() - start)
                      .count();
        m.unlock();
        finished.store(true);
      });
      while (__atomic_load_n(&m.native_handle()->__data.__lock, __ATOMIC_ACQUIRE) != 2) {
        std::this_thread::yield();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      m.unlock();
      waiter.join();
    }
    const std::string dir = argv[2];
    std::ofstream(dir + "/waited") << "waited " << waited << "\n";
    std::printf("started\n");
    std::fflush(stdout);
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (access((dir + "/done").c_str(), F_OK) != 0 &&
           std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return 0;
  }
  std::fprintf(stderr, "agent_workload: unknown mode %s\n", mode.c_str());
  return 2;
}
