// The sampler's own CPU with many registered idle threads (issue goal: under
// 0.5% of one core with 1,000 threads). Idle threads get no CPU-timer
// signals; the wall ticker visits 5 of them per 10 ms tick and credits them
// without signals once it has seen each stack.
#include "inprof/wall_time_provider.h"

#include <dirent.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
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
  int kept_fd = -1;
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
      benchmark::DoNotOptimize(internal::LookAtThread(tid, &kept_fd, true));
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
  if (kept_fd >= 0) close(kept_fd);
}
BENCHMARK(BM_WallTimeProvider_LookAtBlockedThread)
    ->Arg(0)
    ->Arg(1)
    ->Arg(2)
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace inprof

BENCHMARK_MAIN();
