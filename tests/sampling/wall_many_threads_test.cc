// tests/sampling/wall_many_threads_test.cc: the wall time of many threads,
// fewer of which each wake-up visits than there are, that end together
// before Stop(): the profile holds every thread-second of their lives in
// it, on their own stacks.
//
// Part of wall_time_provider_test (tests/meson.build); runs alone.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
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

}  // namespace
}  // namespace inprof::wall_time_provider_test
