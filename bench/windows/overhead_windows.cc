// The Windows profiler's cost to a program: the same CPU-bound work (two
// threads x a 40-frame chain) without a profiler and with DefaultProfiler
// at its defaults (CPU every 10 ms, wall every 10 ms), interleaved,
// `rounds` times; prints each pair's process CPU (GetProcessTimes) and wall
// time, and the medians of their ratios.
//
//   bash scripts/windows.sh bench        (runs it under Wine, 7 rounds)
//   overhead_windows.exe [ROUNDS] [MS_OF_CPU_PER_THREAD]
//   overhead_windows.exe idle THREADS SECONDS
//                        registered threads that only wait: the process's
//                        CPU over SECONDS without and with the profiler
//                        (the sampler reads every thread's clock each tick)
#include <windows.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "inprof/inprof.h"

namespace {

volatile uint64_t g_sink;

int64_t ThreadCpuNanos() {
  FILETIME c, e, k, u;
  GetThreadTimes(GetCurrentThread(), &c, &e, &k, &u);
  auto ns = [](const FILETIME& f) {
    return static_cast<int64_t>((static_cast<uint64_t>(f.dwHighDateTime) << 32) |
                                f.dwLowDateTime) * 100;
  };
  return ns(k) + ns(u);
}

int64_t ProcessCpuNanos() {
  FILETIME c, e, k, u;
  GetProcessTimes(GetCurrentProcess(), &c, &e, &k, &u);
  auto ns = [](const FILETIME& f) {
    return static_cast<int64_t>((static_cast<uint64_t>(f.dwHighDateTime) << 32) |
                                f.dwLowDateTime) * 100;
  };
  return ns(k) + ns(u);
}

__attribute__((noinline)) void Leaf(int64_t cpu_ns) {
  const int64_t until = ThreadCpuNanos() + cpu_ns;
  uint64_t x = 1;
  while (ThreadCpuNanos() < until) {
    for (int i = 0; i < 1000000; ++i) x = x * 6364136223846793005ULL + i;
    g_sink = x;
  }
}

__attribute__((noinline)) void Chain(int depth, int64_t cpu_ns) {
  if (depth == 0) {
    Leaf(cpu_ns);
  } else {
    Chain(depth - 1, cpu_ns);
  }
  g_sink = g_sink + 1;
}

struct Run {
  double cpu_s, wall_s;
};

Run Work(bool profiled, int64_t cpu_ns) {
  LARGE_INTEGER f, t0, t1;
  QueryPerformanceFrequency(&f);
  const int64_t cpu0 = ProcessCpuNanos();
  QueryPerformanceCounter(&t0);
  {
    inprof::Options options;
    options.enabled = profiled;
    options.output = "NUL";
    options.write_output = false;
    inprof::DefaultProfiler profiler(options);
    inprof::ScopedProfiler running(profiler);
    std::vector<std::thread> threads;
    for (int i = 0; i < 2; ++i) {
      threads.emplace_back([&] {
        auto registration = profiler.RegisterThread("worker");
        Chain(40, cpu_ns);
      });
    }
    for (auto& t : threads) t.join();
  }
  QueryPerformanceCounter(&t1);
  return {static_cast<double>(ProcessCpuNanos() - cpu0) / 1e9,
          static_cast<double>(t1.QuadPart - t0.QuadPart) / static_cast<double>(f.QuadPart)};
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

// THREADS registered threads blocked for `seconds`; the process's CPU.
double IdleRun(bool profiled, int threads, double seconds) {
  inprof::Options options = inprof::Options::FromEnv();  // INPROF_WALL_PERIOD=0 etc.
  options.enabled = profiled;
  options.write_output = false;
  inprof::DefaultProfiler profiler(options);
  inprof::ScopedProfiler running(profiler);
  HANDLE stop = CreateEventA(nullptr, TRUE, FALSE, nullptr);
  std::vector<std::thread> waiting;
  for (int i = 0; i < threads; ++i) {
    waiting.emplace_back([&] {
      auto registration = profiler.RegisterThread("idle");
      WaitForSingleObject(stop, INFINITE);
    });
  }
  Sleep(200);  // all registered
  const int64_t cpu0 = ProcessCpuNanos();
  Sleep(static_cast<DWORD>(seconds * 1000));
  const int64_t cpu = ProcessCpuNanos() - cpu0;
  SetEvent(stop);
  for (auto& t : waiting) t.join();
  CloseHandle(stop);
  return static_cast<double>(cpu) / 1e9;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "idle") {
    const int threads = argc > 2 ? std::atoi(argv[2]) : 1000;
    const double seconds = argc > 3 ? std::atof(argv[3]) : 2.0;
    const double plain = IdleRun(false, threads, seconds);
    const double profiled = IdleRun(true, threads, seconds);
    std::printf("%d idle registered threads, %.1f s: process CPU %.3f s without the profiler, "
                "%.3f s with it (%.1f%% of a core)\n",
                threads, seconds, plain, profiled, 100.0 * (profiled - plain) / seconds);
    return 0;
  }
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 7;
  const int64_t cpu_ms = argc > 2 ? std::atoll(argv[2]) : 1500;
  std::vector<double> cpu_ratio, wall_ratio;
  std::printf("round  plain cpu/wall s   profiled cpu/wall s\n");
  for (int r = 0; r < rounds; ++r) {
    // Alternate which goes first, so drift falls on both alike.
    Run plain, profiled;
    if (r % 2 == 0) {
      plain = Work(false, cpu_ms * 1'000'000);
      profiled = Work(true, cpu_ms * 1'000'000);
    } else {
      profiled = Work(true, cpu_ms * 1'000'000);
      plain = Work(false, cpu_ms * 1'000'000);
    }
    cpu_ratio.push_back(profiled.cpu_s / plain.cpu_s);
    wall_ratio.push_back(profiled.wall_s / plain.wall_s);
    std::printf("%5d  %6.3f / %6.3f    %6.3f / %6.3f\n", r, plain.cpu_s, plain.wall_s,
                profiled.cpu_s, profiled.wall_s);
  }
  std::printf("median ratio, profiled / plain: CPU x%.4f, wall x%.4f (%d rounds, 2 threads x %lld ms)\n",
              Median(cpu_ratio), Median(wall_ratio), rounds, static_cast<long long>(cpu_ms));
  return 0;
}
