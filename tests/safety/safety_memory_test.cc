// Safety under memory pressure: a program that limits its address space
// (RLIMIT_AS: `ulimit -v`, batch schedulers, overcommit-off hosts), fills
// its heap until malloc returns NULL, works on while it is full, frees
// everything and exits. Alone it exits 0; with inprof in it, inprof's own
// threads must never let their allocation failures (std::bad_alloc) end it.
// Before, the collector thread threw from the DWARF unwinder's module scan
// (inside dl_iterate_phdr) and from its tables, and the program ended in
// std::terminate: 5 of 8 runs under `inprof run`.
//
// The scenario runs in a forked child (safety::RunInChild) with the
// default composition (DWARF unwinding, CPU and wall time, a 1 ms CPU
// period and a 10 ms collector so that its passes meet the full heap), and
// once with allocation sampling on at period 1 (every allocation sampled:
// the sampled path itself meets the full heap). Each child must exit 0,
// and say it found the heap full.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "inprof/inprof.h"
#include "safety/safety_util.h"
#include "util/test_util.h"

namespace inprof {
namespace {

enum Result {
  kOk = 0,
  kStartFailed = 10,
  kNoLimit,
  kNeverFull,
  kStopFailed,
  kWrongStatus,   // a registration failed, but not for want of memory
  kNotCounted,    // one failed for want of memory, and stats() do not say so
};

// The process's address space now, in bytes (/proc/self/statm's first
// field, in pages).
size_t AddressSpaceBytes() {
  std::ifstream statm("/proc/self/statm");
  size_t pages = 0;
  statm >> pages;
  return pages * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

// Distinct stacks by depth, so that the collector keeps meeting new ones
// (its aggregate grows) while the heap is full.
__attribute__((noinline)) uint64_t Recurse(int depth, uint64_t x) {
  if (depth == 0) {
    for (int i = 0; i < 2000; ++i) x = x * 6364136223846793005ULL + 1;
    return x;
  }
  const uint64_t r = Recurse(depth - 1, x + static_cast<uint64_t>(depth));
  asm volatile("" : : "r"(r) : "memory");
  return r;
}

int FullHeapScenario(uint64_t alloc_period) {
  Options options;
  options.output = testing::FreshTestDir("safety_memory") + "/profile.pb.gz";
  options.cpu_period = absl::Milliseconds(1);
  options.collect_period = absl::Milliseconds(10);
  options.alloc_period = alloc_period;
  DefaultProfiler profiler(options);
  if (!profiler.Start().ok()) return kStartFailed;
  auto self = profiler.RegisterThread("main");
  std::atomic<bool> full{false};
  std::atomic<bool> stop{false};
  // Worker 0 registers again once the heap is full, under a name too long
  // for a string's inline buffer: the registration needs the heap.
  std::atomic<bool> again_active{true};
  std::atomic<int> again_code{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < 2; ++t) {
    workers.emplace_back([&, t] {
      auto registration = profiler.RegisterThread("worker");
      uint64_t x = static_cast<uint64_t>(t);
      while (!full.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (t == 0) {
        registration.Reset();
        registration = profiler.RegisterThread("worker registered again with the heap full");
        again_active.store(registration.active());
        again_code.store(static_cast<int>(registration.status().code()));
      }
      for (int i = 0; !stop.load(); ++i) x = Recurse(i % 300, x);
      asm volatile("" : : "r"(x) : "memory");
    });
  }
  // The blocks, in room reserved before the limit.
  std::vector<void*> blocks;
  blocks.reserve(1 << 20);
  rlimit limit{};
  limit.rlim_cur = limit.rlim_max = AddressSpaceBytes() + (64u << 20);
  if (setrlimit(RLIMIT_AS, &limit) != 0) return kNoLimit;
  size_t sizes[] = {1 << 20, 64 << 10, 4 << 10, 256, 32};
  size_t held = 0;
  for (size_t size : sizes) {
    while (blocks.size() < blocks.capacity()) {
      void* p = std::malloc(size);
      if (p == nullptr) break;
      static_cast<volatile char*>(p)[0] = 1;
      blocks.push_back(p);
      held += size;
    }
  }
  if (held == 0 || blocks.size() == blocks.capacity()) return kNeverFull;
  full.store(true);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  stop.store(true);
  for (std::thread& w : workers) w.join();
  for (void* p : blocks) std::free(p);
  limit.rlim_cur = limit.rlim_max = RLIM_INFINITY;
  setrlimit(RLIMIT_AS, &limit);
  if (!profiler.Stop().ok()) return kStopFailed;
  // A registration that failed says why, and the profiler counts it (the
  // profile's comments carry the count: pipeline.cc).
  std::fprintf(stderr, "a registration with the heap full: %s\n",
               again_active.load()
                   ? "active"
                   : absl::StatusCodeToString(static_cast<absl::StatusCode>(again_code.load()))
                         .c_str());
  if (!again_active.load()) {
    if (again_code.load() != static_cast<int>(absl::StatusCode::kResourceExhausted)) {
      return kWrongStatus;
    }
    if (profiler.stats().registrations_without_memory == 0) return kNotCounted;
  }
  return kOk;
}

std::string Explain(int rc) {
  if (rc == 128 + SIGABRT) return "aborted (an exception escaped an inprof thread?)";
  if (rc == 128 + SIGSEGV) return "SIGSEGV";
  if (rc == 128 + SIGALRM) return "hung";
  if (rc == kWrongStatus) return "a registration failed with a status other than ResourceExhausted";
  if (rc == kNotCounted) return "a registration failed for want of memory, uncounted";
  return "see the exit code";
}

TEST(SafetyMemoryTest, AProgramWithAFullHeapRunsOnAndExits) {
  // The sanitizers reserve terabytes of address space for their shadow
  // memory: an RLIMIT_AS near the program's size cannot be set under them.
  if (safety::kSanitized) GTEST_SKIP() << "a sanitizer's shadow memory needs an unlimited RLIMIT_AS";
  // Three runs each way: before the fix most runs aborted.
  for (int run = 0; run < 3; ++run) {
    const int rc = safety::RunInChild([] { return FullHeapScenario(0); }, 120);
    EXPECT_EQ(rc, kOk) << "run " << run << ": " << Explain(rc);
  }
  for (int run = 0; run < 2; ++run) {
    const int rc = safety::RunInChild([] { return FullHeapScenario(1); }, 120);
    EXPECT_EQ(rc, kOk) << "every allocation sampled, run " << run << ": " << Explain(rc);
  }
}

}  // namespace
}  // namespace inprof
