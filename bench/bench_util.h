// bench/bench_util.h: what the whole-program benchmarks share.
//
// Example:
//   std::printf("maxrss_kib=%ld\n", inprof::bench::PeakRssKib());
#ifndef INPROF_BENCH_BENCH_UTIL_H_
#define INPROF_BENCH_BENCH_UTIL_H_

#include <cstdio>

namespace inprof::bench {

// This program's peak RSS in KiB (VmHWM), -1 when it cannot be read.
// VmHWM starts afresh at exec(), whereas ru_maxrss keeps the peak of the
// process that forked it (a Python driver shows as 14 MiB in every run).
inline long PeakRssKib() {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  long kib = -1;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::sscanf(line, "VmHWM: %ld kB", &kib) == 1) break;
  }
  std::fclose(f);
  return kib;
}

}  // namespace inprof::bench

#endif  // INPROF_BENCH_BENCH_UTIL_H_
