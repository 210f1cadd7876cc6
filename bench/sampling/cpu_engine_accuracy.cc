// The CPU engines' accuracy, side by side with gperftools' CPU profiler
// (bench/sampling/cpu_engine_accuracy.py runs the matrix and reads every
// profile with `go tool pprof`). Built twice: with inprof's DefaultProfiler,
// and with -DINPROF_ACCURACY_GPERFTOOLS against libprofiler
// (ProfilerStart/ProfilerStop, CPUPROFILE_FREQUENCY from the environment).
//
//   cpu_engine_accuracy WORKLOAD SECONDS OUTPUT
//
// WORKLOAD:
//   rate     one thread spins SECONDS of CPU;
//   kernel   one thread alternates 32 read()s of 64 KiB from /dev/zero
//            (ReadChunks: kernel CPU) with user-space spinning for SECONDS
//            of CPU;
//   churn    2,000 threads that each spin 1-2 ms of CPU (SECONDS unused);
//   classes  20,000 threads in four classes spinning 20, 100, 250 and
//            500 us (2-50% of a 1 ms period), each first in PhaseA<C>
//            (30% of it) then in PhaseB<C> (70%) (SECONDS unused).
// Prints "truth_cpu_s=... truth_kernel_pct=..." measured with the threads'
// own CPU clocks ("classes": one "truth FUNCTION SECONDS" line per phase).
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#ifdef INPROF_ACCURACY_GPERFTOOLS
#include <gperftools/profiler.h>
#else
#include "inprof/inprof.h"
#endif

namespace {

int64_t ThreadCpuNow() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1'000'000'000LL + ts.tv_nsec;
}

volatile uint64_t g_sink;

__attribute__((noinline)) uint64_t SpinIterations(uint64_t n) {
  uint64_t x = 88172645463325252ULL;
  for (uint64_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
  }
  return x;
}

__attribute__((noinline)) void SpinFor(int64_t ns) {
  const int64_t end = ThreadCpuNow() + ns;
  while (ThreadCpuNow() < end) g_sink = SpinIterations(2000);
}

// Not tail calls, and bodies that differ (identical ones are folded into
// one function): each phase keeps a frame and a name of its own.
template <int kClass>
__attribute__((noinline)) void PhaseA(int64_t ns) {
  SpinFor(ns);
  g_sink = g_sink + 2 * kClass;
}
template <int kClass>
__attribute__((noinline)) void PhaseB(int64_t ns) {
  SpinFor(ns);
  g_sink = g_sink + 2 * kClass + 1;
}

__attribute__((noinline)) void ReadChunks(int fd, char* buffer) {
  for (int i = 0; i < 32; ++i) {
    if (read(fd, buffer, 64 * 1024) < 0 && errno != EINTR) std::abort();
  }
  asm volatile("" ::: "memory");
}

// A registration for the calling thread (inprof), or gperftools'
// ProfilerRegisterThread.
template <typename P>
auto Register(P& profiler, const char* name) {
#ifdef INPROF_ACCURACY_GPERFTOOLS
  (void)profiler;
  (void)name;
  ProfilerRegisterThread();
  return 0;
#else
  return profiler.RegisterThread(name);
#endif
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s rate|kernel|churn SECONDS OUTPUT\n",
                 argv[0]);
    return 2;
  }
  const std::string workload = argv[1];
  const int64_t cpu_ns = static_cast<int64_t>(std::atof(argv[2]) * 1e9);
#ifdef INPROF_ACCURACY_GPERFTOOLS
  int profiler = 0;
  ProfilerStart(argv[3]);
#else
  inprof::Options options = inprof::Options::FromEnv();
  options.output = argv[3];
  // CPU engines only, unless INPROF_WALL_PERIOD asks for wall samples too
  // (they take the CPU points no CPU signal took: TakeSwallowed).
  if (std::getenv("INPROF_WALL_PERIOD") == nullptr) {
    options.wall_period = absl::ZeroDuration();
  }
  inprof::DefaultProfiler profiler(options);
  inprof::ScopedProfiler running(profiler);
#endif
  double truth_cpu = 0, truth_kernel_pct = 0;
  if (workload == "rate") {
    [[maybe_unused]] auto r = Register(profiler, "main");
    const int64_t t0 = ThreadCpuNow();
    SpinFor(cpu_ns);
    truth_cpu = (ThreadCpuNow() - t0) / 1e9;
  } else if (workload == "kernel") {
    [[maybe_unused]] auto r = Register(profiler, "main");
    const int fd = open("/dev/zero", O_RDONLY | O_CLOEXEC);
    std::vector<char> buffer(64 * 1024);
    int64_t in_reads = 0;
    const int64_t t0 = ThreadCpuNow();
    int64_t t = t0;
    while (t - t0 < cpu_ns) {
      ReadChunks(fd, buffer.data());
      const int64_t after = ThreadCpuNow();
      in_reads += after - t;
      g_sink = SpinIterations(80'000);
      t = ThreadCpuNow();
    }
    close(fd);
    truth_cpu = (t - t0) / 1e9;
    truth_kernel_pct = 100.0 * in_reads / (t - t0);
  } else if (workload == "churn") {
    std::atomic<int64_t> measured{0};
    for (int batch = 0; batch < 500; ++batch) {
      std::vector<std::thread> threads;
      for (int i = 0; i < 4; ++i) {
        const int64_t ns = 1'000'000 + ((batch * 4 + i) % 5) * 250'000;
        threads.emplace_back([&, ns] {
          const int64_t t0 = ThreadCpuNow();
          {
            [[maybe_unused]] auto r = Register(profiler, "short");
            SpinFor(ns);
          }
          measured += ThreadCpuNow() - t0;
        });
      }
      for (auto& t : threads) t.join();
    }
    truth_cpu = measured / 1e9;
  } else if (workload == "classes") {
    constexpr int64_t kBurnNs[4] = {20'000, 100'000, 250'000, 500'000};
    std::atomic<int64_t> truth[4][2] = {};
    std::atomic<int> next{0};
    std::vector<std::thread> spawners;
    for (int s = 0; s < 2; ++s) {
      spawners.emplace_back([&] {
        for (int i; (i = next.fetch_add(1)) < 20'000;) {
          const int c = i % 4;
          std::thread([&, c] {
            [[maybe_unused]] auto r = Register(profiler, "class");
            const int64_t a = kBurnNs[c] * 3 / 10, b = kBurnNs[c] - a;
            int64_t t0 = ThreadCpuNow();
            switch (c) {
              case 0: PhaseA<0>(a); break;
              case 1: PhaseA<1>(a); break;
              case 2: PhaseA<2>(a); break;
              default: PhaseA<3>(a); break;
            }
            int64_t t1 = ThreadCpuNow();
            truth[c][0] += t1 - t0;
            switch (c) {
              case 0: PhaseB<0>(b); break;
              case 1: PhaseB<1>(b); break;
              case 2: PhaseB<2>(b); break;
              default: PhaseB<3>(b); break;
            }
            truth[c][1] += ThreadCpuNow() - t1;
          }).join();
        }
      });
    }
    for (auto& t : spawners) t.join();
    for (int c = 0; c < 4; ++c) {
      std::printf("truth PhaseA<%d> %.6f\ntruth PhaseB<%d> %.6f\n", c,
                  truth[c][0] / 1e9, c, truth[c][1] / 1e9);
      truth_cpu += (truth[c][0] + truth[c][1]) / 1e9;
    }
  } else {
    std::fprintf(stderr, "unknown workload '%s'\n", workload.c_str());
    return 2;
  }
#ifdef INPROF_ACCURACY_GPERFTOOLS
  ProfilerStop();
#endif
  std::printf("truth_cpu_s=%.4f truth_kernel_pct=%.2f\n", truth_cpu,
              truth_kernel_pct);
  return 0;
}
