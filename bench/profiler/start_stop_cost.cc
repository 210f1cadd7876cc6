// Fixed cost of profiling a program: what Start() costs the calling thread,
// what Stop() (with the last export: symbolize, encode, gzip, write) costs,
// and the whole process's CPU and peak RSS for a run that does a little
// work, next to the same program unprofiled (`none`) and, when built with
// -DINPROF_START_STOP_GPERFTOOLS, gperftools' ProfilerStart/ProfilerStop.
//
//   start_stop_cost inprof|none [WORK_MS]       (bench/profiler/start_stop_cost.py
//                                                 runs them side by side)
//
// Prints one line: RESULT start_ms=... stop_ms=... start_cpu_ms=...
// stop_cpu_ms=... process_cpu_ms=... maxrss_kib=...
#include <sys/resource.h>
#include <time.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "bench_util.h"
#ifdef INPROF_START_STOP_GPERFTOOLS
#include <gperftools/profiler.h>
#else
#include "inprof/inprof.h"
#endif

namespace {

double Now(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

// Two frames deep, in the program: something for the profile to name.
__attribute__((noinline)) unsigned long StartStopWork(double ms) {
  unsigned long x = 1;
  const double end = Now(CLOCK_THREAD_CPUTIME_ID) + ms;
  while (Now(CLOCK_THREAD_CPUTIME_ID) < end) {
    for (int i = 0; i < 10000; ++i) x = x * 6364136223846793005UL + 1;
  }
  return x;
}


void Report(double start_ms, double stop_ms, double start_cpu, double stop_cpu,
            unsigned long sink) {
  rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  const double cpu = ru.ru_utime.tv_sec * 1e3 + ru.ru_utime.tv_usec / 1e3 +
                     ru.ru_stime.tv_sec * 1e3 + ru.ru_stime.tv_usec / 1e3;
  std::printf(
      "RESULT start_ms=%.3f stop_ms=%.3f start_cpu_ms=%.3f stop_cpu_ms=%.3f "
      "process_cpu_ms=%.1f maxrss_kib=%ld sink=%lu\n",
      start_ms, stop_ms, start_cpu, stop_cpu, cpu, inprof::bench::PeakRssKib(), sink & 1);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "inprof";
  const double work_ms = argc > 2 ? std::atof(argv[2]) : 100;
  double t0, c0, t1, c1, t2, c2, t3, c3;
  unsigned long sink = 0;
#ifdef INPROF_START_STOP_GPERFTOOLS
  const char* out = std::getenv("INPROF_OUTPUT");
  t0 = Now(CLOCK_MONOTONIC);
  c0 = Now(CLOCK_PROCESS_CPUTIME_ID);
  if (mode != "none") ProfilerStart(out != nullptr ? out : "gperftools.prof");
  t1 = Now(CLOCK_MONOTONIC);
  c1 = Now(CLOCK_PROCESS_CPUTIME_ID);
  sink = StartStopWork(work_ms);
  t2 = Now(CLOCK_MONOTONIC);
  c2 = Now(CLOCK_PROCESS_CPUTIME_ID);
  if (mode != "none") ProfilerStop();
  t3 = Now(CLOCK_MONOTONIC);
  c3 = Now(CLOCK_PROCESS_CPUTIME_ID);
#else
  inprof::Options options = inprof::Options::FromEnv();
  if (mode == "none") options.enabled = false;
  inprof::DefaultProfiler profiler(options);
  {
    auto self = profiler.RegisterThread("main");
    t0 = Now(CLOCK_MONOTONIC);
    c0 = Now(CLOCK_PROCESS_CPUTIME_ID);
    absl::Status started = profiler.Start();
    t1 = Now(CLOCK_MONOTONIC);
    c1 = Now(CLOCK_PROCESS_CPUTIME_ID);
    if (!started.ok() && mode != "none") {
      std::fprintf(stderr, "start_stop_cost: %s\n", started.ToString().c_str());
      return 1;
    }
    sink = StartStopWork(work_ms);
  }
  t2 = Now(CLOCK_MONOTONIC);
  c2 = Now(CLOCK_PROCESS_CPUTIME_ID);
  absl::Status stopped = profiler.Stop();
  t3 = Now(CLOCK_MONOTONIC);
  c3 = Now(CLOCK_PROCESS_CPUTIME_ID);
  if (!stopped.ok() && mode != "none") {
    std::fprintf(stderr, "start_stop_cost: %s\n", stopped.ToString().c_str());
    return 1;
  }
#endif
  Report(t1 - t0, t3 - t2, c1 - c0, c3 - c2, sink);
  return 0;
}
