// tests/sampling/wall_time_provider_test_util.h: helpers shared by the
// sources of wall_time_provider_test (wall_time_provider_test.cc,
// wall_time_provider_signal_test.cc): a CPU burner, a thread run for a
// measured registered span and the check of a wall total against it, the
// options the tests profile with, and a frame that waits in read().
//
// Thread-safety: the functions are reentrant.
#ifndef INPROF_TESTS_SAMPLING_WALL_TIME_PROVIDER_TEST_UTIL_H_
#define INPROF_TESTS_SAMPLING_WALL_TIME_PROVIDER_TEST_UTIL_H_

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "inprof/options.h"
#include "inprof/wall_time_provider.h"
#include "util/test_util.h"

namespace inprof::wall_time_provider_test {

using ::inprof::testing::ThreadCpuNow;

inline __attribute__((noinline)) uint64_t Spin(int64_t ns) {
  const int64_t end = ThreadCpuNow() + ns;
  uint64_t x = 1;
  while (ThreadCpuNow() < end) {
    for (int i = 0; i < 1000; ++i) x = x * 2862933555777941757ULL + 3037000493ULL;
  }
  return x;
}

// A registered thread's wall time in the profile runs from its arming,
// inside RegisterThread, to its tail, read inside the registration's
// Reset(): between the clock read inside those two calls and the one
// outside them. A bound on the outer clock alone also counts the calls'
// own time before arming and after the tail, which on a loaded machine (a
// thread waiting for a core) was 40-80 ms of 1.4 s. A wall sample weighs
// the time until the thread's next visit (wall_time_provider.h), so a
// thread's total is w1 + (t_n - t_1) for visits t_1..t_n, its first
// weighing w1: within [L - head - tail, L + w1] of its lifetime L, with w1,
// the head (arming to t_1) and the tail (t_n to its end) each at most the
// longest wait between two visits (ProfilerStats::wall_longest_round_ns):
// a deterministic bound, [inner - 2 R, outer + R].
struct RegisteredSpan {
  int64_t inner_ns = 0;
  int64_t outer_ns = 0;
};
inline int64_t MonotonicNow() { return WallTimeProvider::NowNanos(); }
template <typename Profiler, typename Body>
RegisteredSpan RunRegistered(Profiler& profiler, const std::string& name, Body body) {
  const int64_t outer0 = MonotonicNow();
  auto registration = profiler.RegisterThread(name);
  const int64_t inner0 = MonotonicNow();
  body();
  const int64_t inner1 = MonotonicNow();
  registration.Reset();
  const int64_t outer1 = MonotonicNow();
  return {inner1 - inner0, outer1 - outer0};
}
// Whether `ns` in the profile lies within `span`, or up to `ahead_ns`
// above it; the message says by how much it does not.
// `round_ns`: the longest wait between two visits (R above; 0 for a
// thread whose wall time is exact, a followed one).
inline ::testing::AssertionResult WithinSpan(int64_t ns, const RegisteredSpan& span,
                                             int64_t ahead_ns = 0, int64_t round_ns = 0) {
  if (ns >= span.inner_ns - 2 * round_ns && ns <= span.outer_ns + round_ns + ahead_ns) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << ns / 1e9 << " s in the profile, outside " << span.inner_ns / 1e9 << "-"
         << span.outer_ns / 1e9 << " s registered (+" << ahead_ns / 1e9 << " s, a round "
         << round_ns / 1e9 << " s)";
}

inline Options WallOptions(const std::string& name) {
  Options options;
  options.output = testing::TestTmpDir() + "/" + name + ".pb.gz";
  options.wall_period = absl::Milliseconds(10);
  options.wall_threads_per_tick = 5;
  return options;
}

inline double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// Waits in read() on `fd` until a byte arrives.
inline __attribute__((noinline)) int WallTestWaitInRead(int fd) {
  char c = 0;
  const ssize_t n = read(fd, &c, 1);
  asm volatile("" : : : "memory");  // not a tail call
  return static_cast<int>(n);
}

}  // namespace inprof::wall_time_provider_test

#endif  // INPROF_TESTS_SAMPLING_WALL_TIME_PROVIDER_TEST_UTIL_H_
