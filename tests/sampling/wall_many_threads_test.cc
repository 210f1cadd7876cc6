// tests/sampling/wall_many_threads_test.cc: the wall time of many threads,
// fewer of which each wake-up visits than there are, that end together
// before Stop(): the profile holds every thread-second of their lives in
// it, on their own stacks, and each stack's share within the spread the
// profile states for it.
//
// Part of wall_time_provider_test (tests/meson.build); runs alone.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "inprof/inprof.h"
#include "inprof/pprof_reader.h"
#include "sampling/wall_time_provider_test_util.h"

namespace inprof::wall_time_provider_test {
namespace {

// Where the threads wait: 5 ms naps until told to end.
__attribute__((noinline)) void NapUntilTold(const std::atomic<bool>& end) {
  while (!end.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  asm volatile("" : : : "memory");  // not a tail call
}

// 300 threads registered before Start(), visited 1 a tick at 2 ms (each
// wake-up visits at most 10 of them: the threads' time since the last
// wake-up is handed out to those visits, wall_time_provider.h), and ended
// together before Stop(), after every thread was visited 4 times over on
// average. Before, the time from the last wake-up before their end to
// their end had no taker (a window in which 10,000 threads ended held
// 0.72-0.85 of their time in it); now each thread's tail credits it, over
// its chance of a visit since it was armed, which after a whole round is
// 1. Deterministic: every wake-up hands out the time of the threads still
// there exactly (their count integrated from Start()), and each ended
// thread's tail its own time since the last one, so the profile's total
// lies between the threads' lives measured inside and outside Start() and
// their registrations' ends (the time a wake-up could not hand out, with
// no thread left, is counted, and added back), within 1 ms of rounding.
TEST(WallManyThreadsTest, ThreadsEndingTogetherKeepEveryThreadSecondOnTheirStacks) {
  constexpr int kThreads = 300;
  Options options = WallOptions("wall_many_end");
  options.wall_period = absl::Milliseconds(2);
  options.wall_threads_per_tick = 1;
  DefaultProfiler profiler(options);
  std::atomic<bool> end{false};
  std::atomic<int> registered{0};
  std::vector<int64_t> inner_end(kThreads), outer_end(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      auto registration = profiler.RegisterThread(absl::StrCat("napper-", i));
      registered.fetch_add(1);
      NapUntilTold(end);
      inner_end[i] = MonotonicNow();
      registration.Reset();
      outer_end[i] = MonotonicNow();
    });
  }
  while (registered.load() < kThreads) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const int64_t before_start = MonotonicNow();
  ASSERT_TRUE(profiler.Start().ok());
  const int64_t after_start = MonotonicNow();
  // Four visits a thread: every thread was weighed (its chance 1).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (profiler.stats().wall_visits < 4u * kThreads &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_GE(profiler.stats().wall_visits, 4u * kThreads) << "the sampler made too few visits";
  end.store(true);
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE(profiler.Stop().ok());
  const ProfilerStats stats = profiler.stats();

  int64_t low = 0, high = 0;
  for (int i = 0; i < kThreads; ++i) {
    low += inner_end[i] - after_start;
    high += outer_end[i] - before_start;
  }
  auto profile = ReadPprofFile(options.output);
  ASSERT_TRUE(profile.ok()) << profile.status();
  const int wall = profile->ValueIndex("wall-time");
  ASSERT_GE(wall, 0);
  int64_t total = 0, pseudo = 0;
  for (const auto& [name, ns] : profile->ByLabel("thread name", wall)) {
    if (absl::StartsWith(name, "napper-")) total += ns;
  }
  for (const auto& sample : profile->samples) {
    if (!sample.stack.empty() && absl::StartsWith(sample.stack.front(), "[inprof:")) {
      pseudo += sample.values[wall];
    }
  }
  std::printf("wall %.3f s, lives %.3f-%.3f s, unattributed %.3f s, pseudo-frames %.3f s, "
              "visits %llu\n",
              total / 1e9, low / 1e9, high / 1e9, stats.wall_unattributed_ns / 1e9,
              pseudo / 1e9, static_cast<unsigned long long>(stats.wall_visits));
  constexpr int64_t kRounding = 1'000'000;
  EXPECT_GE(total + static_cast<int64_t>(stats.wall_unattributed_ns), low - kRounding);
  EXPECT_LE(total, high + kRounding);
  // On real stacks: a thread's time goes to a pseudo-frame only when it
  // had no wall sample at its end, and each of these was visited.
  EXPECT_LE(pseudo, total / 20);
}

// Where the split threads wait: naps of the lengths given, in one of two
// functions.
__attribute__((noinline)) void NapInA(int64_t us) {
  std::this_thread::sleep_for(std::chrono::microseconds(us));
  asm volatile("" : : : "memory");
}
__attribute__((noinline)) void NapInB(int64_t us) {
  std::this_thread::sleep_for(std::chrono::microseconds(us));
  asm volatile("nop" : : : "memory");  // not folded into A (identical code)
}

// The estimator's spread, bounded from the profile's own account of it. 200
// threads alternate naps in NapInA (1-5 ms, uniform) and NapInB (1-9 ms),
// each counting its own time in each; the wall sampler visits 1 thread a
// 2 ms tick (a round: ~0.4 s), so each visit weighs a share of the
// threads' time (Horvitz-Thompson), and a stack's wall time is a sum of
// random draws: a visit lands in A with the chance that its thread is in A
// then. The total is exact (the test above); the split is not, and the
// profile's comments say by how much (ProfilerStats::wall_weight_sq_ms2,
// S = sum of the squared weights w_i). Expected: the time each thread
// counted in A, and in B. Bound: the visits' outcomes X_i (in A or not)
// are independent given the weights -- one thread is visited a round
// apart, ~80 naps of random lengths later, and the threads nap
// independently -- so Hoeffding's inequality gives
// P(|sum w_i X_i - E| >= t) <= 2 exp(-2 t^2 / S); t = sqrt(S ln(4e6) / 2)
// = 2.76 sqrt(S) makes it 5e-7 for A and for B, 10^-6 together. S is
// taken 5% larger: a napper that the sampler follows (one that ran
// throughout the interval since its arming, under load) keeps its own
// account, whose intervals (a round each, at most 1/200 of S a thread) are
// not in S; the 5% covers 10 such threads. The time a thread spends
// between its naps (its clock reads) is in neither count nor stack: 1 us a
// nap is allowed for it. At ~4,000 visits of ~0.4 s, S ~ 640 s^2 and t ~
// 70 s of ~1,000 thread-seconds, about 15% of A's or B's time.
TEST(WallManyThreadsTest, EachStacksWallTimeIsItsThreadsTimeThereWithinTheSamplingBound) {
  constexpr int kThreads = 200;
  constexpr uint64_t kVisits = 4000;
  Options options = WallOptions("wall_many_split");
  options.wall_period = absl::Milliseconds(2);
  options.wall_threads_per_tick = 1;
  DefaultProfiler profiler(options);
  std::atomic<bool> go{false}, end{false};
  std::atomic<int> registered{0};
  std::vector<int64_t> in_a(kThreads), in_b(kThreads), naps(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      auto registration = profiler.RegisterThread(absl::StrCat("split-", i));
      registered.fetch_add(1);
      std::mt19937 rng(1234 + i);
      std::uniform_int_distribution<int64_t> a_us(1000, 5000), b_us(1000, 9000);
      while (!go.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      while (!end.load()) {
        int64_t t0 = MonotonicNow();
        NapInA(a_us(rng));
        int64_t t1 = MonotonicNow();
        in_a[i] += t1 - t0;
        NapInB(b_us(rng));
        in_b[i] += MonotonicNow() - t1;
        naps[i] += 2;
      }
    });
  }
  while (registered.load() < kThreads) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(profiler.Start().ok());
  go.store(true);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (profiler.stats().wall_visits < kVisits && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  end.store(true);
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE(profiler.Stop().ok());
  const ProfilerStats stats = profiler.stats();
  ASSERT_GE(stats.wall_visits, kVisits) << "the sampler made too few visits";

  int64_t truth_a = 0, truth_b = 0, all_naps = 0;
  for (int i = 0; i < kThreads; ++i) {
    truth_a += in_a[i];
    truth_b += in_b[i];
    all_naps += naps[i];
  }
  auto profile = ReadPprofFile(options.output);
  ASSERT_TRUE(profile.ok()) << profile.status();
  const int wall = profile->ValueIndex("wall-time");
  ASSERT_GE(wall, 0);
  int64_t est_a = 0, est_b = 0, total = 0;
  for (const auto& sample : profile->samples) {
    auto name = sample.str_labels.find("thread name");
    if (name == sample.str_labels.end() || !absl::StartsWith(name->second, "split-")) continue;
    total += sample.values[wall];
    for (const std::string& frame : sample.stack) {
      if (absl::StrContains(frame, "NapInA")) {
        est_a += sample.values[wall];
        break;
      }
      if (absl::StrContains(frame, "NapInB")) {
        est_b += sample.values[wall];
        break;
      }
    }
  }
  ASSERT_GT(stats.wall_weight_sq_ms2, 0u) << "no estimated wall samples: the bound is unknown";
  const double s_ns2 = 1.05 * static_cast<double>(stats.wall_weight_sq_ms2) * 1e12;
  const double t_ns = std::sqrt(s_ns2 * std::log(4e6) / 2) + 1e3 * static_cast<double>(all_naps);
  std::printf("A %.3f s of %.3f, B %.3f s of %.3f, all %.3f s; bound +-%.3f s "
              "(S %llu ms^2, %llu visits)\n",
              est_a / 1e9, truth_a / 1e9, est_b / 1e9, truth_b / 1e9, total / 1e9, t_ns / 1e9,
              static_cast<unsigned long long>(stats.wall_weight_sq_ms2),
              static_cast<unsigned long long>(stats.wall_visits));
  EXPECT_LE(std::abs(static_cast<double>(est_a - truth_a)), t_ns);
  EXPECT_LE(std::abs(static_cast<double>(est_b - truth_b)), t_ns);
  // The profile's comment gives the same spread, for any stack.
  bool said = false;
  for (const std::string& comment : profile->comments) {
    said |= absl::StrContains(comment, "wall-time sampling error");
  }
  EXPECT_TRUE(said);
}

}  // namespace
}  // namespace inprof::wall_time_provider_test
