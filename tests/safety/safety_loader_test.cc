// Safety: a loader-lock storm while sampling at the fastest CPU period.
//
// Registered threads loop dlopen/dlclose of a small module, dl_iterate_phdr,
// and throwing and catching exceptions (the unwinder finds FDEs through the
// loader), while the main thread stops and restarts the profiler so that
// each Stop() symbolizes while modules come and go. The handler must never
// take the loader lock (DESIGN.md), so nothing may hang: a watchdog aborts
// with a message if the storm does not end in time. Every thread must have
// made progress and been sampled.
//
// Duration: 3 s in CI, 30 s with INPROF_SAFETY_FULL=1.
#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "inprof/inprof.h"
#include "safety/safety_util.h"
#include "util/test_util.h"

namespace inprof {
namespace {

__attribute__((noinline)) void Thrower(int depth) {
  if (depth == 0) throw std::runtime_error("storm");
  Thrower(depth - 1);
  asm volatile("");
}

TEST(SafetyLoaderTest, LoaderLockStormWhileSamplingDoesNotHang) {
  const char* lib = std::getenv("INPROF_SYMBOLIZER_TEST_LIB");
  if (lib == nullptr) GTEST_SKIP() << "INPROF_SYMBOLIZER_TEST_LIB not set";
  const int64_t seconds = safety::FullRun() ? 30 : 3;
  safety::Watchdog watchdog(absl::Seconds(seconds + 90), "loader-lock storm");

  Options options;
  options.output = testing::TestTmpDir() + "/safety_loader.pb.gz";
  options.cpu_period = absl::Milliseconds(1);
  DefaultProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());

  struct Worker {
    const char* what;
    std::atomic<uint64_t> iterations{0};
    std::atomic<uint64_t> samples{0};
  };
  Worker workers[4] = {{"dlopen/dlclose"}, {"dlopen/dlclose"},
                       {"dl_iterate_phdr"}, {"throw/catch"}};
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0};
  auto run = [&](int index, auto&& step) {
    return std::thread([&, index, step] {
      auto registration = profiler.RegisterThread(workers[index].what);
      auto* slot = internal::CurrentThreadSlot();
      const uint64_t before = slot->samples_taken.load();
      while (!stop.load(std::memory_order_relaxed)) {
        step();
        workers[index].iterations.fetch_add(1, std::memory_order_relaxed);
      }
      workers[index].samples = slot->samples_taken.load() - before;
    });
  };
  auto dl_step = [&] {
    void* handle = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      ++failures;
      return;
    }
    auto fn = reinterpret_cast<int (*)(int)>(
        dlsym(handle, "InprofTestLibFunction"));
    if (fn == nullptr || fn(1) != 11) ++failures;
    dlclose(handle);
  };
  std::vector<std::thread> threads;
  threads.push_back(run(0, dl_step));
  threads.push_back(run(1, dl_step));
  threads.push_back(run(2, [] {
    int modules = 0;
    dl_iterate_phdr(
        [](dl_phdr_info*, size_t, void* n) {
          ++*static_cast<int*>(n);
          return 0;
        },
        &modules);
    if (modules < 2) std::abort();
  }));
  threads.push_back(run(3, [&] {
    try {
      Thrower(8);
    } catch (const std::runtime_error&) {
      return;
    }
    ++failures;
  }));

  int restarts = 0;
  const int64_t end = safety::MonotonicNow() + seconds * 1'000'000'000;
  while (safety::MonotonicNow() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ASSERT_TRUE(profiler.Stop().ok());  // symbolizes amid the storm
    ASSERT_TRUE(profiler.Start().ok());
    ++restarts;
  }
  stop = true;
  for (auto& t : threads) t.join();
  ASSERT_TRUE(profiler.Stop().ok());

  EXPECT_EQ(failures.load(), 0);
  for (const Worker& w : workers) {
    std::printf("safety_loader: %-16s iterations=%llu samples=%llu\n", w.what,
                static_cast<unsigned long long>(w.iterations.load()),
                static_cast<unsigned long long>(w.samples.load()));
    EXPECT_GT(w.iterations.load(), 0u) << w.what;
    EXPECT_GT(w.samples.load(), 0u) << w.what;
  }
  std::printf("safety_loader: %lld s, %d stop/start with export, %llu samples\n",
              static_cast<long long>(seconds), restarts,
              static_cast<unsigned long long>(profiler.stats().samples_taken));
}

}  // namespace
}  // namespace inprof
