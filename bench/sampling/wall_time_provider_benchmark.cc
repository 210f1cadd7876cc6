// The sampler's own CPU with many registered idle threads (issue goal: under
// 0.5% of one core with 1,000 threads). Idle threads get no CPU-timer
// signals; the wall ticker visits 5 of them per 10 ms tick and credits them
// without signals once it has seen each stack.
#include "inprof/wall_time_provider.h"

#include <dirent.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <span>
#include <vector>

#include "benchmark/benchmark.h"
#include "inprof/inprof.h"
#include "inprof/internal/thread_info.h"

namespace inprof {
namespace {

// CPU seconds of this process's threads whose name starts with `prefix`.
double ThreadsCpuSeconds(const std::string& prefix) {
  double total = 0;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return 0;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    const std::string base = std::string("/proc/self/task/") + e->d_name;
    std::ifstream comm(base + "/comm");
    std::string name;
    std::getline(comm, name);
    if (name.rfind(prefix, 0) != 0) continue;
    std::ifstream schedstat(base + "/schedstat");
    double run_ns = 0;
    schedstat >> run_ns;  // first field: time spent on the CPU, ns
    total += run_ns / 1e9;
  }
  closedir(dir);
  return total;
}

void BM_WallTicker_IdleThreads(benchmark::State& state) {
  const int count = static_cast<int>(state.range(0));
  Options options;
  options.output = "/tmp/inprof_wall_benchmark.pb.gz";
  DefaultProfiler profiler(options);
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  int registered = 0;
  std::vector<std::thread> threads;
  for (int i = 0; i < count; ++i) {
    threads.emplace_back([&] {
      auto r = profiler.RegisterThread("idle");
      std::unique_lock<std::mutex> lock(mu);
      ++registered;
      cv.notify_all();
      cv.wait(lock, [&] { return done; });
    });
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return registered == count; });
  }
  if (!profiler.Start().ok()) {
    state.SkipWithError("profiler did not start");
  }
  // Let the ticker see every thread once (the one signal each gets).
  std::this_thread::sleep_for(std::chrono::seconds(1) * count / 500 +
                              std::chrono::milliseconds(200));
  double tick = 0, collect = 0, wall = 0;
  for (auto _ : state) {
    const double tick0 = ThreadsCpuSeconds("inprof-tick");
    const double collect0 = ThreadsCpuSeconds("inprof-collect");
    const auto t0 = std::chrono::steady_clock::now();
    std::this_thread::sleep_for(std::chrono::seconds(2));
    wall += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    tick += ThreadsCpuSeconds("inprof-tick") - tick0;
    collect += ThreadsCpuSeconds("inprof-collect") - collect0;
  }
  state.counters["profiler_cpu_pct_of_core"] = 100.0 * (tick + collect) / wall;
  state.counters["ticker_pct"] = 100.0 * tick / wall;
  state.counters["collector_pct"] = 100.0 * collect / wall;
  {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
  }
  cv.notify_all();
  for (auto& t : threads) t.join();
  profiler.Stop().IgnoreError();
}
BENCHMARK(BM_WallTicker_IdleThreads)->Arg(100)->Arg(1000)->Iterations(1)->UseRealTime()->Unit(benchmark::kMillisecond);

// What one visit to a blocked thread reads from the kernel: since
// 2026-11-25 one /proc/self/task/TID/syscall (LookAtThread: its state and
// where it waits), where it used to read .../stat and then .../syscall
// (arg 1); since 2026-11-26 through the file kept open between looks
// (arg 2: a pread, no open and close). The thread waits on a condition
// variable throughout.
void BM_WallTimeProvider_LookAtBlockedThread(benchmark::State& state) {
  const bool two_reads = state.range(0) == 1;
  const bool kept = state.range(0) == 2;
  internal::OwnedFd kept_file;  // closed at scope exit
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  std::atomic<pid_t> tid{0};
  std::thread waiter([&] {
    tid = internal::CurrentTid();
    std::unique_lock<std::mutex> lock(mutex);
    cv.wait(lock, [&] { return done; });
  });
  while (internal::LookAtThread(tid.load()).state != 'S') {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (auto _ : state) {
    if (two_reads) {
      benchmark::DoNotOptimize(internal::ThreadState(tid));
      benchmark::DoNotOptimize(internal::ThreadSyscallSite(tid));
    } else if (kept) {
      benchmark::DoNotOptimize(internal::LookAtThread(tid, &kept_file, true));
    } else {
      benchmark::DoNotOptimize(internal::LookAtThread(tid));
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex);
    done = true;
  }
  cv.notify_all();
  waiter.join();
}
BENCHMARK(BM_WallTimeProvider_LookAtBlockedThread)
    ->Arg(0)
    ->Arg(1)
    ->Arg(2)
    ->Unit(benchmark::kMicrosecond);

// What the wall sampler adds to a visit to learn where a waiting thread
// waits without signalling it (profiler_collector.h: ReadBlockedStack): a copy of its
// stack from where it waits up (process_vm_readv; the visit's look at
// /proc/self/task/TID/syscall gave sp and pc, measured above), the walk of
// the copy, and the thread's CPU clock read again to check it did not run. The signal it replaces costs the thread a
// wake-up, the handler and the way back to its wait
// (BM_Signal_RoundTrip in profiler_benchmark.cc measures a signal to the
// calling thread, which is cheaper). The thread waits on a condition
// variable throughout; counters: its stack's bytes and frames.
void BM_WallTimeProvider_ReadWaitingStack(benchmark::State& state) {
  DwarfUnwinder::RefreshModules();
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  std::atomic<pid_t> tid{0};
  std::atomic<clockid_t> clock{0};
  std::atomic<uintptr_t> stack_hi{0};
  std::thread waiter([&] {
    auto info = internal::DescribeCurrentThread();
    if (info.ok()) {
      clock = info->cpu_clock;
      stack_hi = info->stack.hi;
    }
    tid = internal::CurrentTid();
    std::unique_lock<std::mutex> lock(mutex);
    cv.wait(lock, [&] { return done; });
  });
  while (internal::LookAtThread(tid.load()).state != 'S') {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::vector<uint64_t> copy(64 * 1024 / 8);
  uintptr_t pcs[128];
  size_t bytes = 0, frames = 0;
  bool complete = true;
  const int64_t before = internal::ThreadCpuNanos(clock);
  const internal::SyscallSite site = internal::ThreadSyscallSite(tid);
  for (auto _ : state) {
    bytes = std::min<size_t>(stack_hi - site.sp, copy.size() * 8) & ~size_t{7};
    if (internal::CopyOwnMemory(getpid(), site.sp, bytes, copy.data()) != 0) {
      state.SkipWithError("process_vm_readv failed");
      break;
    }
    const UnwindResult r = DwarfUnwinder().UnwindCopy(
        site.pc, site.sp, std::span<const uint64_t>(copy.data(), bytes / 8), pcs);
    frames = r.depth;
    complete &= !r.truncated && internal::ThreadCpuNanos(clock) == before;
  }
  if (!complete) state.SkipWithError("a walk was truncated or the thread ran");
  state.counters["stack_bytes"] = static_cast<double>(bytes);
  state.counters["frames"] = static_cast<double>(frames);
  {
    std::lock_guard<std::mutex> lock(mutex);
    done = true;
  }
  cv.notify_all();
  waiter.join();
}
BENCHMARK(BM_WallTimeProvider_ReadWaitingStack)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace inprof

BENCHMARK_MAIN();
