// The program bench/overhead/run.sh profiles: fixed amounts of work under
// no profiler, inprof (three unwinders), gperftools, or `perf record`
// (which wraps it from outside), so that their overhead and accuracy can be
// compared run against run. Not a test and not a Google Benchmark: one run,
// one RESULT line.
//
//   overhead_workload PROFILER cpu THREADS CALLS      CALLS descents of a
//                                                      42-frame chain per thread
//   overhead_workload PROFILER mixed THREADS CYCLES CALLS
//                                       per cycle: a CPU burst of CALLS descents,
//                                       then a sleep, a condition-variable wait or
//                                       a pipe round trip with a partner thread
//   overhead_workload PROFILER idle THREADS SECONDS    threads blocked on a
//                                                      condition variable
//   overhead_workload calibrate      prints the CPU cost of one descent
//   overhead_workload engines        prints each inprof composition's engine
//   overhead_workload analyze FILE   totals of a pprof file (inprof's, or
//                                    gperftools' converted by go tool pprof -proto)
//
// PROFILER: none, perf (both run no in-process profiler), inprof
// (inprof::DefaultProfiler), inprof-dwarf (inprof::DwarfProfiler),
// inprof-fp (frame-pointer unwinding), gperftools (only in the binary built
// with -DINPROF_OVERHEAD_GPERFTOOLS; CPUPROFILE and CPUPROFILE_FREQUENCY come
// from the environment). inprof reads INPROF_* (INPROF_CPU_PERIOD,
// INPROF_OUTPUT, ...) from the environment like any user's program.
//
// Worker threads are named "worker-N" (pthread_setname_np), so perf's comm
// and the profile's "thread name" label both identify them.
#include <dirent.h>
#include <pthread.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "inprof/inprof.h"
#include "inprof/pprof_reader.h"

#ifdef INPROF_OVERHEAD_GPERFTOOLS
#include <gperftools/profiler.h>
#endif

namespace {

// ---------------------------------------------------------------------------
// The work: OverheadRoot -> Frame<0> -> ... -> Frame<39> -> OverheadLeaf, 42
// frames of our own under the thread's entry frames.

constexpr int kChainDepth = 40;
// Leaf iterations per descent: a descent costs ~4 us here (`calibrate`), and
// 98-99% of the chain's samples land in the leaf, 42 frames deep.
constexpr int kLeafIterations = 2000;

__attribute__((noinline)) uint64_t OverheadLeaf(uint64_t x) {
  for (int i = 0; i < kLeafIterations; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    x ^= x >> 29;
  }
  return x;
}

template <int K>
__attribute__((noinline)) uint64_t Frame(uint64_t x) {
  uint64_t y;
  if constexpr (K + 1 == kChainDepth) {
    y = OverheadLeaf(x + K);
  } else {
    y = Frame<K + 1>(x ^ (static_cast<uint64_t>(K) * 0x9e3779b97f4a7c15ULL));
  }
  // Work after the call keeps it from becoming a tail call (which would
  // collapse the chain into one frame).
  asm volatile("" : "+r"(y));
  return y + K;
}

__attribute__((noinline)) uint64_t OverheadRoot(uint64_t calls, uint64_t seed) {
  for (uint64_t i = 0; i < calls; ++i) seed = Frame<0>(seed + i);
  asm volatile("" : "+r"(seed));
  return seed;
}

std::atomic<uint64_t> g_sink{0};

// ---------------------------------------------------------------------------
// Clocks.

double Seconds(const timespec& t) { return t.tv_sec + t.tv_nsec * 1e-9; }

double Now() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return Seconds(t);
}

double ThreadCpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return Seconds(t);
}

struct Usage {
  double user = 0, sys = 0;
  double cpu() const { return user + sys; }
};

Usage ProcessUsage() {
  rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  Usage u;
  u.user = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6;
  u.sys = ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
  return u;
}

// Peak RSS of this program's own memory: VmHWM. getrusage's ru_maxrss
// survives exec, so it would report the RSS of whatever forked us (the
// Python driver, ~20 MB) when that is larger.
long PeakRssKib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atol(line.c_str() + 6);
  }
  return 0;
}

// CPU of another thread of this process, in ns precision: the kernel's
// per-thread CPU clock id for `tid` (what pthread_getcpuclockid builds:
// MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED) in linux/posix-timers.h).
// /proc's utime/stime would only have 10 ms resolution.
double OtherThreadCpuSeconds(pid_t tid) {
  const clockid_t clock =
      static_cast<clockid_t>((~static_cast<uint32_t>(tid)) << 3 | 6u);
  timespec t;
  if (clock_gettime(clock, &t) != 0) return 0;
  return Seconds(t);
}

// Sum of the CPU of this process's threads whose name starts with "inprof-"
// (the collector, the wall ticker, the exporter, uploaders).
struct OwnThreads {
  int count = 0;
  double cpu_s = 0;
  std::string by_name;  // "inprof-collect:0.012345,inprof-tick:..."
};

OwnThreads ProfilerThreadsCpu() {
  OwnThreads own;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return own;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    std::ifstream comm(std::string("/proc/self/task/") + entry->d_name + "/comm");
    std::string name;
    if (!std::getline(comm, name) || name.rfind("inprof-", 0) != 0) continue;
    const double cpu = OtherThreadCpuSeconds(static_cast<pid_t>(std::atoi(entry->d_name)));
    ++own.count;
    own.cpu_s += cpu;
    char item[64];
    std::snprintf(item, sizeof(item), "%s%s:%.6f", own.by_name.empty() ? "" : ",",
                  name.c_str(), cpu);
    own.by_name += item;
  }
  closedir(dir);
  return own;
}

// ---------------------------------------------------------------------------
// The profilers, behind one small interface.

class Hooks {
 public:
  virtual ~Hooks() = default;
  // Called on each worker thread before it works; the result is kept alive
  // until the thread is done.
  virtual std::shared_ptr<void> RegisterThread(const std::string&) { return nullptr; }
  virtual absl::Status Stop() { return absl::OkStatus(); }
  // " key=value" pairs for the RESULT line, read after Stop().
  virtual std::string Stats() { return ""; }
};

template <typename P>
class InprofHooks : public Hooks {
 public:
  InprofHooks() : profiler_(inprof::Options::FromEnv()) {}
  absl::Status Start() { return profiler_.Start(); }
  std::shared_ptr<void> RegisterThread(const std::string& name) override {
    return std::make_shared<inprof::ThreadRegistration>(profiler_.RegisterThread(name));
  }
  absl::Status Stop() override { return profiler_.Stop(); }
  std::string Stats() override {
    const inprof::ProfilerStats s = profiler_.stats();
    std::string engine = P::Engine();
    std::replace(engine.begin(), engine.end(), ' ', ';');
    std::replace(engine.begin(), engine.end(), '=', ':');
    char buf[512];
    std::snprintf(buf, sizeof(buf),
                  " samples_taken=%llu samples_recorded=%llu samples_dropped=%llu"
                  " stacks_truncated=%llu cpu_period_ms=%.3f wall_period_ms=%.3f engine=%s",
                  static_cast<unsigned long long>(s.samples_taken),
                  static_cast<unsigned long long>(s.samples_recorded),
                  static_cast<unsigned long long>(s.samples_dropped),
                  static_cast<unsigned long long>(s.stacks_truncated),
                  absl::ToDoubleMilliseconds(profiler_.options().cpu_period),
                  absl::ToDoubleMilliseconds(profiler_.options().wall_period),
                  engine.c_str());
    return buf;
  }

 private:
  P profiler_;
};

// The frame-pointer composition, spelled out so that this builds whether or
// not inprof.h names it.
using FpProfiler = inprof::Profiler<inprof::FramePointerUnwinder, inprof::DefaultSampleRing,
                                    inprof::CpuTimeProvider, inprof::WallTimeProvider>;

#ifdef INPROF_OVERHEAD_GPERFTOOLS
// gperftools starts profiling from its constructor when CPUPROFILE is set;
// its docs ask each thread to call ProfilerRegisterThread() (a no-op with
// the default process-wide ITIMER_PROF, needed with per-thread timers).
class GperftoolsHooks : public Hooks {
 public:
  std::shared_ptr<void> RegisterThread(const std::string&) override {
    ProfilerRegisterThread();
    return nullptr;
  }
  absl::Status Stop() override {
    ProfilerState state;
    ProfilerGetCurrentState(&state);
    samples_ = state.samples_gathered;
    ProfilerStop();  // flushes and writes $CPUPROFILE, as exit would
    return absl::OkStatus();
  }
  std::string Stats() override { return " samples_taken=" + std::to_string(samples_); }

 private:
  int samples_ = 0;
};
#endif

// ---------------------------------------------------------------------------
// The workloads. Each worker stores its own CPU clock at its end.

struct Worker {
  double cpu_s = 0;
  // idle: the CPU its RegisterThread call took, and its unregistration.
  double register_s = 0, unregister_s = 0;
};

void NameThisThread(int index) {
  char name[16];
  std::snprintf(name, sizeof(name), "worker-%d", index);
  pthread_setname_np(pthread_self(), name);
}

void RunCpu(Hooks& hooks, int threads, uint64_t calls, std::vector<Worker>& workers) {
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) {
    pool.emplace_back([&, i] {
      NameThisThread(i);
      auto registration = hooks.RegisterThread("worker-" + std::to_string(i));
      g_sink += OverheadRoot(calls, static_cast<uint64_t>(i));
      workers[i].cpu_s = ThreadCpuSeconds();
    });
  }
  for (auto& t : pool) t.join();
}

struct Pipe {
  int fd[2] = {-1, -1};
};

void WriteByte(int fd) {
  char c = 1;
  while (write(fd, &c, 1) < 0 && errno == EINTR) {
  }
}

void ReadByte(int fd) {
  char c;
  while (read(fd, &c, 1) < 0 && errno == EINTR) {
  }
}

void RunMixed(Hooks& hooks, int threads, int cycles, uint64_t calls,
              std::vector<Worker>& workers) {
  // Thread 2k and 2k+1 are partners for the pipe round trip.
  std::vector<Pipe> to_odd(threads / 2 + 1), to_even(threads / 2 + 1);
  for (auto* pipes : {&to_odd, &to_even}) {
    for (Pipe& p : *pipes) {
      if (pipe(p.fd) != 0) std::abort();
    }
  }
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) {
    pool.emplace_back([&, i] {
      NameThisThread(i);
      auto registration = hooks.RegisterThread("worker-" + std::to_string(i));
      std::mutex mutex;
      std::condition_variable cv;
      const bool has_partner = (i ^ 1) < threads;
      for (int c = 0; c < cycles; ++c) {
        g_sink += OverheadRoot(calls, static_cast<uint64_t>(c));
        switch (c % 3) {
          case 0:
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
            break;
          case 1: {
            std::unique_lock<std::mutex> lock(mutex);
            cv.wait_for(lock, std::chrono::milliseconds(1), [] { return false; });
            break;
          }
          default:
            if (!has_partner) {
              std::this_thread::sleep_for(std::chrono::milliseconds(1));
            } else if (i % 2 == 0) {
              WriteByte(to_odd[i / 2].fd[1]);
              ReadByte(to_even[i / 2].fd[0]);
            } else {
              ReadByte(to_odd[i / 2].fd[0]);
              WriteByte(to_even[i / 2].fd[1]);
            }
        }
      }
      workers[i].cpu_s = ThreadCpuSeconds();
    });
  }
  for (auto& t : pool) t.join();
  for (auto* pipes : {&to_odd, &to_even}) {
    for (Pipe& p : *pipes) {
      close(p.fd[0]);
      close(p.fd[1]);
    }
  }
}

void RunIdle(Hooks& hooks, int threads, double seconds, std::vector<Worker>& workers) {
  // Two condition variables: the last worker to arrive wakes the main
  // thread, and only the end wakes the workers. With one, every arrival's
  // notify_all woke all the workers already waiting -- half a million
  // wake-ups for 1000 threads, which measured context switches, not idle
  // threads.
  std::mutex mutex;
  std::condition_variable all_ready, go;
  int ready = 0;
  bool done = false;
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) {
    pool.emplace_back([&, i] {
      NameThisThread(i);
      const double before_register = ThreadCpuSeconds();
      auto registration = hooks.RegisterThread("worker-" + std::to_string(i));
      workers[i].register_s = ThreadCpuSeconds() - before_register;
      std::unique_lock<std::mutex> lock(mutex);
      if (++ready == threads) all_ready.notify_one();
      go.wait(lock, [&] { return done; });
      lock.unlock();
      workers[i].cpu_s = ThreadCpuSeconds();
      registration.reset();
      workers[i].unregister_s = ThreadCpuSeconds() - workers[i].cpu_s;
    });
  }
  {
    std::unique_lock<std::mutex> lock(mutex);
    all_ready.wait(lock, [&] { return ready == threads; });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  {
    std::lock_guard<std::mutex> lock(mutex);
    done = true;
  }
  go.notify_all();
  for (auto& t : pool) t.join();
}

// ---------------------------------------------------------------------------
// The other modes.

int Calibrate() {
  const double start = ThreadCpuSeconds();
  uint64_t calls = 0;
  while (ThreadCpuSeconds() - start < 0.3) {
    g_sink += OverheadRoot(100, calls);
    calls += 100;
  }
  std::printf("CALIBRATE ns_per_call=%.1f leaf_iterations=%d depth=%d\n",
              (ThreadCpuSeconds() - start) * 1e9 / static_cast<double>(calls),
              kLeafIterations, kChainDepth + 2);
  return 0;
}

int Engines() {
  std::printf("ENGINE inprof %s\nENGINE inprof-dwarf %s\nENGINE inprof-fp %s\n",
              inprof::DefaultProfiler::Engine().c_str(),
              inprof::DwarfProfiler::Engine().c_str(), FpProfiler::Engine().c_str());
  return 0;
}

// Totals of the workers' CPU samples in a pprof file: inprof's types
// (cpu-samples, cpu-time) or gperftools' as go tool pprof -proto converts
// them (samples, cpu). A sample whose "thread name" label does not start
// with "worker" is left out; a profile without thread names (gperftools)
// counts every sample.
int Analyze(const char* path) {
  auto profile = inprof::ReadPprofFile(path);
  if (!profile.ok()) {
    std::fprintf(stderr, "%s\n", std::string(profile.status().message()).c_str());
    return 1;
  }
  int count = profile->ValueIndex("cpu-samples");
  if (count < 0) count = profile->ValueIndex("samples");
  int nanos = profile->ValueIndex("cpu-time");
  if (nanos < 0) nanos = profile->ValueIndex("cpu");
  if (count < 0 || nanos < 0) {
    std::fprintf(stderr, "%s: no CPU sample types\n", path);
    return 1;
  }
  int64_t samples = 0, cpu_ns = 0, pseudo_ns = 0, chain = 0, complete = 0;
  for (const auto& s : profile->samples) {
    auto name = s.str_labels.find("thread name");
    if (name != s.str_labels.end() && name->second.rfind("worker", 0) != 0) continue;
    samples += s.values[count];
    cpu_ns += s.values[nanos];
    if (!s.stack.empty() && s.stack[0].rfind("[inprof:", 0) == 0) {
      pseudo_ns += s.values[nanos];
      continue;
    }
    // A sample in the chain is complete when the walk reached OverheadRoot
    // through every Frame<K> in between (and all 40 of them from the leaf).
    bool in_leaf = false, has_root = false;
    int frames = 0, deepest = -1;
    for (const std::string& f : s.stack) {
      if (f.find("OverheadLeaf") != std::string::npos) in_leaf = true;
      if (f.find("OverheadRoot") != std::string::npos) has_root = true;
      if (size_t at = f.find("Frame<"); at != std::string::npos) {
        ++frames;
        deepest = std::max(deepest, std::atoi(f.c_str() + at + 6));
      }
    }
    if (!in_leaf && frames == 0) continue;
    chain += s.values[count];
    const bool all_frames = in_leaf ? frames == kChainDepth : frames == deepest + 1;
    if (has_root && all_frames) complete += s.values[count];
  }
  std::printf("ANALYZE samples=%lld cpu_s=%.6f pseudo_cpu_s=%.6f chain_samples=%lld"
              " complete_samples=%lld\n",
              static_cast<long long>(samples), cpu_ns / 1e9, pseudo_ns / 1e9,
              static_cast<long long>(chain), static_cast<long long>(complete));
  return 0;
}

int PrintUsage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s PROFILER cpu THREADS CALLS | PROFILER mixed THREADS CYCLES CALLS"
               " | PROFILER idle THREADS SECONDS | calibrate | engines | analyze FILE\n"
               "PROFILER: none perf inprof inprof-dwarf inprof-fp"
#ifdef INPROF_OVERHEAD_GPERFTOOLS
               " gperftools"
#endif
               "\n",
               argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "calibrate") == 0) return Calibrate();
  if (argc >= 2 && std::strcmp(argv[1], "engines") == 0) return Engines();
  if (argc >= 3 && std::strcmp(argv[1], "analyze") == 0) return Analyze(argv[2]);
  if (argc < 5) return PrintUsage(argv[0]);
  const std::string profiler = argv[1];
  const std::string workload = argv[2];
  const int threads = std::atoi(argv[3]);
  if (threads < 1 || (workload == "mixed" && argc < 6)) return PrintUsage(argv[0]);

  std::unique_ptr<Hooks> hooks;
  absl::Status started = absl::OkStatus();
  // Construction and Start(): for DwarfProfiler this reads every loaded
  // module's CFI. gperftools starts before main and perf outside, so theirs
  // read ~0 here.
  const double start_cpu0 = ThreadCpuSeconds(), start_t0 = Now();
  if (profiler == "none" || profiler == "perf") {
    hooks = std::make_unique<Hooks>();
  } else if (profiler == "inprof") {
    auto h = std::make_unique<InprofHooks<inprof::DefaultProfiler>>();
    started = h->Start();
    hooks = std::move(h);
  } else if (profiler == "inprof-dwarf") {
    auto h = std::make_unique<InprofHooks<inprof::DwarfProfiler>>();
    started = h->Start();
    hooks = std::move(h);
  } else if (profiler == "inprof-fp") {
    auto h = std::make_unique<InprofHooks<FpProfiler>>();
    started = h->Start();
    hooks = std::move(h);
#ifdef INPROF_OVERHEAD_GPERFTOOLS
  } else if (profiler == "gperftools") {
    ProfilerState state;
    ProfilerGetCurrentState(&state);
    if (!state.enabled) {
      std::fprintf(stderr, "gperftools is not profiling: set CPUPROFILE\n");
      return 1;
    }
    hooks = std::make_unique<GperftoolsHooks>();
#endif
  } else {
    return PrintUsage(argv[0]);
  }
  if (!started.ok()) {
    std::fprintf(stderr, "profiler did not start: %s\n",
                 std::string(started.message()).c_str());
    return 1;
  }

  const double start_wall = Now() - start_t0, start_cpu = ThreadCpuSeconds() - start_cpu0;

  std::vector<Worker> workers(threads);
  const Usage before = ProcessUsage();
  const double t0 = Now();
  if (workload == "cpu") {
    RunCpu(*hooks, threads, std::strtoull(argv[4], nullptr, 10), workers);
  } else if (workload == "mixed") {
    RunMixed(*hooks, threads, std::atoi(argv[4]), std::strtoull(argv[5], nullptr, 10),
             workers);
  } else if (workload == "idle") {
    RunIdle(*hooks, threads, std::atof(argv[4]), workers);
  } else {
    return PrintUsage(argv[0]);
  }
  const double t1 = Now();
  const Usage after = ProcessUsage();
  const OwnThreads own_before = ProfilerThreadsCpu();

  const double stop_cpu0 = ThreadCpuSeconds(), stop_t0 = Now();
  const absl::Status stopped = hooks->Stop();
  const double stop_wall = Now() - stop_t0, stop_cpu = ThreadCpuSeconds() - stop_cpu0;
  const OwnThreads own_after = ProfilerThreadsCpu();
  const Usage end = ProcessUsage();
  if (!stopped.ok()) {
    std::fprintf(stderr, "Stop: %s\n", std::string(stopped.message()).c_str());
  }

  double workers_cpu = 0;
  for (const Worker& w : workers) workers_cpu += w.cpu_s;
  // Medians over the threads (idle only: zero elsewhere), in microseconds.
  auto median_us = [&workers](double Worker::*field) {
    std::vector<double> v;
    for (const Worker& w : workers) v.push_back(w.*field);
    if (v.empty()) return 0.0;
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2] * 1e6;
  };
  std::printf(
      "RESULT profiler=%s workload=%s threads=%d wall_s=%.6f cpu_s=%.6f user_s=%.6f"
      " sys_s=%.6f run_cpu_s=%.6f maxrss_kib=%ld workers_cpu_s=%.6f prof_threads=%d"
      " prof_threads_cpu_s=%.6f prof_threads_after_s=%.6f start_wall_s=%.6f"
      " start_cpu_s=%.6f stop_wall_s=%.6f stop_cpu_s=%.6f stop_ok=%d register_cpu_us=%.1f"
      " unregister_cpu_us=%.1f prof_thread_cpu=%s%s\n",
      profiler.c_str(), workload.c_str(), threads, t1 - t0, after.cpu() - before.cpu(),
      after.user - before.user, after.sys - before.sys, end.cpu(), PeakRssKib(),
      workers_cpu, own_before.count, own_before.cpu_s, own_after.cpu_s, start_wall, start_cpu,
      stop_wall,
      stop_cpu, stopped.ok() ? 1 : 0, median_us(&Worker::register_s),
      median_us(&Worker::unregister_s), own_before.by_name.empty() ? "-" : own_before.by_name.c_str(), hooks->Stats().c_str());
  return g_sink.load() == 42 ? 3 : 0;  // keeps the work observable
}
