// End to end: real workloads profiled by DefaultProfiler, the profile read
// back with `go tool pprof -raw` (the canonical consumer) and protoc, and the
// CPU it reports compared with the CPU measured by the threads' own clocks.
#include "inprof/profiler.h"

#include <time.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "inprof/inprof.h"
#include "util/test_util.h"

namespace inprof {
namespace {

using ::inprof::testing::ThreadCpuNow;

// Three leaf functions with distinct names; each spins for a number of
// iterations (no clock reads inside, so all their time is their own).
__attribute__((noinline)) uint64_t SpinAlpha(uint64_t n) {
  uint64_t x = n;
  for (uint64_t i = 0; i < n; ++i) x = x * 6364136223846793005ULL + 1442695040888963407ULL;
  return x;
}
__attribute__((noinline)) uint64_t SpinBravo(uint64_t n) {
  uint64_t x = n;
  for (uint64_t i = 0; i < n; ++i) x = (x ^ (x >> 29)) * 0xbf58476d1ce4e5b9ULL + i;
  return x;
}
__attribute__((noinline)) uint64_t SpinCharlie(uint64_t n) {
  uint64_t x = n;
  for (uint64_t i = 0; i < n; ++i) x = (x + i) * 0x94d049bb133111ebULL ^ (x >> 31);
  return x;
}

// Iterations that take about `ns` of CPU, calibrated once.
uint64_t IterationsFor(int64_t ns) {
  static const double per_ns = [] {
    const int64_t t0 = ThreadCpuNow();
    volatile uint64_t sink = SpinAlpha(20'000'000);
    (void)sink;
    return 20'000'000.0 / static_cast<double>(ThreadCpuNow() - t0);
  }();
  return static_cast<uint64_t>(per_ns * static_cast<double>(ns));
}

bool StackHas(const testing::RawSample& s, const std::string& fn) {
  for (const auto& f : s.stack) {
    if (f.find(fn) != std::string::npos) return true;
  }
  return false;
}

class ProfilerE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    INPROF_REQUIRE_TOOL("go");
  }
};

TEST_F(ProfilerE2eTest, FunctionSharesMatchMeasuredCpu) {
  Options options;
  options.output = testing::TestTmpDir() + "/e2e_shares.pb.gz";
  // Each sample point of the thread's CPU (P = 1 ms apart) is credited to
  // the function running when its signal is handled: with the perf engine
  // microseconds of the thread's CPU after the point, with the timer engine
  // at the next scheduler tick it runs at, at most one tick later (<= 10 ms
  // at HZ >= 100). So each call gets its own CPU to within P + one tick,
  // deterministically: few long calls (two rounds) keep the shares' error
  // bound near 3 points, computed below (with the perf engine it is
  // a few milliseconds in all).
  options.cpu_period = absl::Milliseconds(1);
  DefaultProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  std::array<int64_t, 3> measured{};
  int64_t measured_total = 0;
  constexpr int kRounds = 2;
  // Calibrated before the thread registers: the calibration runs SpinAlpha,
  // which no clock below would count.
  const uint64_t base = IterationsFor(160'000'000);
  int64_t outer_total = 0;  // the thread's CPU around its registration
  {
    const int64_t outer0 = ThreadCpuNow();
    auto self = profiler.RegisterThread("main");
    volatile uint64_t sink = 0;
    const int64_t start = ThreadCpuNow();
    for (int round = 0; round < kRounds; ++round) {
      int64_t t0 = ThreadCpuNow();
      sink = sink + SpinAlpha(base);
      int64_t t1 = ThreadCpuNow();
      sink = sink + SpinBravo(2 * base);
      int64_t t2 = ThreadCpuNow();
      sink = sink + SpinCharlie(3 * base);
      int64_t t3 = ThreadCpuNow();
      measured[0] += t1 - t0;
      measured[1] += t2 - t1;
      measured[2] += t3 - t2;
    }
    measured_total = ThreadCpuNow() - start;
    self.Reset();
    outer_total = ThreadCpuNow() - outer0;
  }
  ASSERT_TRUE(profiler.Stop().ok());

  ASSERT_TRUE(testing::ProtocDecodeOk(options.output).ok());
  auto samples = testing::ReadWithGoPprofRaw(options.output);
  ASSERT_TRUE(samples.ok()) << samples.status();
  std::array<int64_t, 3> profiled{};
  int64_t profiled_total = 0;
  const std::array<std::string, 3> names{"SpinAlpha", "SpinBravo", "SpinCharlie"};
  for (const auto& s : *samples) {
    ASSERT_EQ(s.values.size(), 4u);  // cpu-samples, cpu-time, wall-samples, wall-time
    if (s.labels.count("thread name") == 0 ||
        s.labels.at("thread name") != "main") {
      continue;
    }
    profiled_total += s.values[1];
    for (size_t i = 0; i < 3; ++i) {
      if (StackHas(s, names[i])) profiled[i] += s.values[1];
    }
  }
  const int64_t sum_measured = measured[0] + measured[1] + measured[2];
  const int64_t sum_profiled = profiled[0] + profiled[1] + profiled[2];
  ASSERT_GT(sum_profiled, 0);
  // Each function's CPU within e = rounds x (P + tick) of its clock, the
  // three together within 3e: its share m_i / M moves by at most
  // (e M + m_i 3e) / (M (M - 3e)), about 3 points for the slowest tick
  // (HZ=100).
  constexpr double kTick = 10e6;
  const double e = kRounds * (absl::ToDoubleNanoseconds(options.cpu_period) + kTick);
  const double m_total = static_cast<double>(sum_measured);
  for (size_t i = 0; i < 3; ++i) {
    const double want = 100.0 * measured[i] / sum_measured;
    const double got = 100.0 * profiled[i] / sum_profiled;
    const double bound = 100.0 * (e * m_total + static_cast<double>(measured[i]) * 3 * e) /
                         (m_total * (m_total - 3 * e));
    std::printf("%-12s measured %5.1f%%  profiled %5.1f%%  (bound %.1f points)\n",
                names[i].c_str(), want, got, bound);
    EXPECT_NEAR(got, want, bound) << names[i];
  }
  std::printf("total        measured %.3fs  profiled %.3fs\n",
              measured_total / 1e9, profiled_total / 1e9);
  // The thread's CPU in the profile: the period times the sample points it
  // crossed from arming to its tail, within one period of its registered
  // CPU, deterministically (it was +-10%, picked by hand).
  const int64_t period = absl::ToInt64Nanoseconds(options.cpu_period);
  EXPECT_GT(profiled_total, measured_total - period);
  EXPECT_LT(profiled_total, outer_total + period);
}

TEST_F(ProfilerE2eTest, PerThreadCpuMatchesEachThreadsClock) {
  Options options;
  options.output = testing::TestTmpDir() + "/e2e_threads.pb.gz";
  DefaultProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  std::map<std::string, int64_t> measured, outer;  // inside / around registration
  std::mutex mu;
  auto worker = [&](std::string name, int64_t ns) {
    const uint64_t chunk = IterationsFor(5'000'000);
    const int64_t outer0 = ThreadCpuNow();
    auto registration = profiler.RegisterThread(name);
    const int64_t t0 = ThreadCpuNow();
    volatile uint64_t sink = 0;
    while (ThreadCpuNow() - t0 < ns) sink = sink + SpinBravo(chunk);
    const int64_t used = ThreadCpuNow() - t0;
    registration.Reset();
    const int64_t around = ThreadCpuNow() - outer0;
    std::lock_guard<std::mutex> lock(mu);
    measured[name] = used;
    outer[name] = around;
  };
  std::thread sleeper([&] {
    auto registration = profiler.RegisterThread("sleeper");
    const int64_t t0 = ThreadCpuNow();
    std::this_thread::sleep_for(std::chrono::milliseconds(800));
    std::lock_guard<std::mutex> lock(mu);
    measured["sleeper"] = ThreadCpuNow() - t0;
  });
  std::thread light(worker, "light", 250'000'000);
  std::thread heavy(worker, "heavy", 750'000'000);
  std::thread medium(worker, "medium", 500'000'000);
  light.join();
  heavy.join();
  medium.join();
  sleeper.join();
  ASSERT_TRUE(profiler.Stop().ok());

  auto samples = testing::ReadWithGoPprofRaw(options.output);
  ASSERT_TRUE(samples.ok()) << samples.status();
  std::map<std::string, int64_t> profiled;
  for (const auto& s : *samples) {
    auto it = s.labels.find("thread name");
    if (it != s.labels.end()) profiled[it->second] += s.values[1];
  }
  // Each thread's CPU in the profile: the period times the sample points
  // it crossed from arming to its tail, within one period of its
  // registered CPU, deterministically (it was +-10%, picked by hand).
  const int64_t period = absl::ToInt64Nanoseconds(options.cpu_period);
  for (const char* name : {"light", "medium", "heavy"}) {
    std::printf("%-8s measured %.3fs profiled %.3fs\n", name,
                measured[name] / 1e9, profiled[name] / 1e9);
    EXPECT_GT(profiled[name], measured[name] - period) << name;
    EXPECT_LT(profiled[name], outer[name] + period) << name;
  }
  // The sleeper's few microseconds of CPU cross at most one sample point
  // (10 ms): deterministic.
  EXPECT_LE(profiled["sleeper"], absl::ToInt64Nanoseconds(options.cpu_period));
}

// Frameless leaves: GCC 12 emits no frame record in leaf functions that do
// not use the stack (SpinCharlie), and libc's string routines have none
// either. The frame-pointer walk alone would skip their callers; the
// collector puts them back from the stack words and .eh_frame.
__attribute__((noinline)) uint64_t CallsFramelessLeaf(uint64_t n) {
  return SpinCharlie(n) + 1;
}
__attribute__((noinline)) size_t CallsLibcLeaf(const char* buffer, size_t n,
                                               int rounds) {
  size_t found = 0;
  for (int i = 0; i < rounds; ++i) {
    found += std::strlen(buffer) +
             (std::memchr(buffer, 'x', n) != nullptr ? 1 : 0);
  }
  return found;
}

// Both unwinders keep the callers of frameless leaves: frame pointers with
// the collector's repair, CFI by itself.
template <typename P>
void CheckFramelessLeavesKeepTheirCaller(const std::string& name) {
  Options options;
  options.output = testing::TestTmpDir() + "/e2e_leaf_" + name + ".pb.gz";
  options.cpu_period = absl::Milliseconds(1);
  P profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  {
    auto self = profiler.RegisterThread("main");
    volatile uint64_t sink = CallsFramelessLeaf(IterationsFor(300'000'000));
    std::vector<char> buffer(1 << 20, 'a');
    buffer.back() = '\0';
    const int64_t t0 = ThreadCpuNow();
    while (ThreadCpuNow() - t0 < 300'000'000) {
      sink = sink + CallsLibcLeaf(buffer.data(), buffer.size(), 50);
    }
  }
  ASSERT_TRUE(profiler.Stop().ok());
  auto samples = testing::ReadWithGoPprofRaw(options.output);
  ASSERT_TRUE(samples.ok()) << samples.status();
  int64_t own_leaf = 0, own_leaf_with_caller = 0;
  int64_t libc_leaf = 0, libc_leaf_with_caller = 0;
  for (const auto& s : *samples) {
    if (s.stack.size() < 1) continue;
    const bool has_caller = s.stack.size() > 1;
    if (s.stack[0].find("SpinCharlie") != std::string::npos) {
      own_leaf += s.values[1];
      if (has_caller && s.stack[1].find("CallsFramelessLeaf") != std::string::npos) {
        own_leaf_with_caller += s.values[1];
      }
    } else if (s.stack[0].find("strlen") != std::string::npos ||
               s.stack[0].find("memchr") != std::string::npos) {
      libc_leaf += s.values[1];
      // glibc's symbols may add an inline frame (memchr in __memchr_avx2).
      for (size_t i = 1; i < s.stack.size() && i <= 2; ++i) {
        if (s.stack[i].find("CallsLibcLeaf") != std::string::npos) {
          libc_leaf_with_caller += s.values[1];
          break;
        }
      }
    }
  }
  std::printf("%s: frameless leaf with caller: %.1f%% of %.3fs; libc leaf: %.1f%% of %.3fs\n",
              name.c_str(),
              own_leaf ? 100.0 * own_leaf_with_caller / own_leaf : 0.0, own_leaf / 1e9,
              libc_leaf ? 100.0 * libc_leaf_with_caller / libc_leaf : 0.0,
              libc_leaf / 1e9);
  ASSERT_GT(own_leaf, 100'000'000);
  ASSERT_GT(libc_leaf, 100'000'000);
  EXPECT_GE(own_leaf_with_caller, 0.95 * own_leaf);
  EXPECT_GE(libc_leaf_with_caller, 0.90 * libc_leaf);
}

TEST_F(ProfilerE2eTest, FramelessLeavesKeepTheirCallerWithFramePointers) {
  CheckFramelessLeavesKeepTheirCaller<FramePointerProfiler>("frame-pointer");
}

TEST_F(ProfilerE2eTest, FramelessLeavesKeepTheirCallerWithCfi) {
  CheckFramelessLeavesKeepTheirCaller<DwarfProfiler>("dwarf");
}

TEST_F(ProfilerE2eTest, GoPprofReadsProfileWithoutWarnings) {
  Options options;
  options.output = testing::TestTmpDir() + "/e2e_top.pb.gz";
  DefaultProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  {
    auto self = profiler.RegisterThread("main");
    volatile uint64_t sink = SpinCharlie(IterationsFor(200'000'000));
    (void)sink;
  }
  ASSERT_TRUE(profiler.Stop().ok());
  auto top = testing::GoPprof("-top " + options.output);
  ASSERT_TRUE(top.ok()) << top.status();
  EXPECT_NE(top->find("SpinCharlie"), std::string::npos) << *top;
  // A CPU profiler's profile opens on CPU: pprof's default_sample_type,
  // not pprof's fallback to the last type (wall-time).
  EXPECT_NE(top->find("Type: cpu-time"), std::string::npos) << *top;
  // pprof reports problems (unknown mappings, bad sample types) on stderr.
  auto errors = testing::GoPprofStderr("-top " + options.output);
  ASSERT_TRUE(errors.ok()) << errors.status();
  EXPECT_EQ(*errors, "") << *errors;
  auto comments = testing::GoPprof("-comments " + options.output);
  ASSERT_TRUE(comments.ok()) << comments.status();
  EXPECT_NE(comments->find("dropped="), std::string::npos) << *comments;
}

}  // namespace
}  // namespace inprof
