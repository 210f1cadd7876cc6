// A whole program for comparing heap profilers: two threads allocate at
// eight call sites of different sizes and allocators (~4.5 GB in all; a
// buffer grown by realloc, reallocarray, and 8 M small new[]/delete[]
// among them), free most blocks at once and keep every 16th until the process
// exits. The program counts its own truth per site and prints it, so that
// a profile's per-site figures can be checked against it
// (bench/alloc/compare_heap_profilers.py runs it plain, under inprof,
// jemalloc's sampled profiler and heaptrack, and prints the errors).
//
//   alloc_sites none|inprof
//
// none: no profiler in the process (also the mode that jemalloc's
// LD_PRELOAD and heaptrack run). inprof: a Profiler with CpuTimeProvider
// and AllocationProvider, Options::FromEnv() with alloc_period 512 KiB
// unless INPROF_ALLOC_PERIOD is set; both workers are registered, and
// Stop() (the last window's export to INPROF_OUTPUT) runs while the kept
// blocks are still allocated, so inuse_* shows them.
//
// Output, one line per site, then one for the process:
//   TRUTH site=SiteA48B alloc_bytes=... alloc_objects=... live_bytes=... live_objects=...
//   RESULT mode=... wall_ms=... process_cpu_ms=... maxrss_kib=...
// The kept blocks are never freed: the process exits with them allocated,
// which is what jemalloc's prof_final dump and heaptrack's "leaked" see.
#include <sys/resource.h>
#include <time.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "inprof/heap/allocation_provider.h"
#include "inprof/inprof.h"

namespace {

constexpr int kThreads = 2;
constexpr int kRounds = 80;  // per thread; every site allocates in each
constexpr int kKeepEvery = 16;

// Writes the whole block (what a program does with memory it asks for:
// the kept blocks are resident), opaque to the optimizer.
void Touch(void* p, size_t size) {
  std::memset(p, 0x5a, size);
  asm volatile("" : : "r"(p) : "memory");
}

// The five sites: noinline, so that each is the leaf frame of its stacks.
__attribute__((noinline)) void* SiteA48B() {
  void* p = ::operator new(48);
  Touch(p, 48);
  return p;
}
__attribute__((noinline)) void* SiteB1KiB() {
  void* p = std::malloc(1024);
  Touch(p, 1024);
  return p;
}
__attribute__((noinline)) void* SiteC16KiB() {
  void* p = std::calloc(1, 16 * 1024);
  static_cast<volatile char*>(p)[0] = 1;  // calloc wrote it
  return p;
}
__attribute__((noinline)) void* SiteD256KiB() {
  char* p = new char[256 * 1024];
  Touch(p, 256 * 1024);
  return p;
}
__attribute__((noinline)) void* SiteE4MiB() {
  void* p = std::malloc(4 * 1024 * 1024);
  Touch(p, 4 * 1024 * 1024);
  return p;
}

// A buffer grown by realloc from 128 B to 64 KiB, doubling: 1 malloc and 9
// reallocs a call (what the profile should count: 10 allocations, 130,944
// bytes; one 64 KiB block live when kept).
__attribute__((noinline)) void* SiteFReallocGrow() {
  void* p = std::malloc(128);
  for (size_t size = 256; size <= 64 * 1024; size *= 2) p = std::realloc(p, size);
  Touch(p, 64 * 1024);
  return p;
}
__attribute__((noinline)) void* SiteGReallocarray() {
  void* p = reallocarray(nullptr, 512, 64);  // 32 KiB
  Touch(p, 32 * 1024);
  return p;
}
__attribute__((noinline)) void* SiteHNewArray48() {
  char* p = new char[48];
  Touch(p, 48);
  return p;
}

// The program's own work between allocations, so that allocating is a
// share of its time as in a real program, not all of it: 256 dependent
// multiply-adds per block and one per 8 bytes (most of the ~4 s of CPU).
__attribute__((noinline)) uint64_t Compute(size_t size, uint64_t x) {
  for (size_t i = 0; i < 256 + size / 8; ++i) x = x * 6364136223846793005ULL + 1442695040888963407ULL;
  return x;
}

enum Free { kDelete, kFree, kDeleteArray };

struct Site {
  const char* name;
  void* (*alloc)();
  size_t size;  // the block a call returns
  int per_round;  // per thread
  Free free;
  // What one call allocates in all, when more than its block (realloc
  // growth): bytes and allocations (0: size, 1).
  size_t call_bytes = 0;
  int call_objects = 1;
};
constexpr Site kSites[] = {
    {"SiteA48B", &SiteA48B, 48, 50000, kDelete},
    {"SiteB1KiB", &SiteB1KiB, 1024, 3750, kFree},
    {"SiteC16KiB", &SiteC16KiB, 16 * 1024, 188, kFree},
    {"SiteD256KiB", &SiteD256KiB, 256 * 1024, 12, kDeleteArray},
    {"SiteE4MiB", &SiteE4MiB, 4 * 1024 * 1024, 1, kFree},
    {"SiteFReallocGrow", &SiteFReallocGrow, 64 * 1024, 60, kFree, 131072 - 128, 10},
    {"SiteGReallocarray", &SiteGReallocarray, 32 * 1024, 100, kFree},
    {"SiteHNewArray48", &SiteHNewArray48, 48, 50000, kDeleteArray},
};
constexpr size_t kNumSites = std::size(kSites);

void Release(const Site& site, void* p) {
  switch (site.free) {
    case kDelete:
      ::operator delete(p);
      break;
    case kFree:
      std::free(p);
      break;
    case kDeleteArray:
      delete[] static_cast<char*>(p);
      break;
  }
}

// One thread's truth, and the blocks it keeps (reserved up front: the
// vectors never allocate inside the loop, so no other stack allocates).
struct Worker {
  uint64_t objects[kNumSites] = {};
  uint64_t kept[kNumSites] = {};
  std::vector<void*> keep;
  uint64_t sink = 1;
};

void Work(Worker& w) {
  for (int round = 0; round < kRounds; ++round) {
    for (size_t s = 0; s < kNumSites; ++s) {
      const Site& site = kSites[s];
      for (int i = 0; i < site.per_round; ++i) {
        void* p = site.alloc();
        w.sink = Compute(site.size, w.sink);
        if (w.objects[s]++ % kKeepEvery == 0) {
          w.keep.push_back(p);
          ++w.kept[s];
        } else {
          Release(site, p);
        }
      }
    }
  }
}

double NowMs(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}


using HeapProfiler = inprof::Profiler<inprof::DefaultUnwinder, inprof::DefaultSampleRing,
                                      inprof::CpuTimeProvider, inprof::AllocationProvider>;

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "none";
  if (mode != "none" && mode != "inprof") {
    std::fprintf(stderr, "usage: alloc_sites none|inprof\n");
    return 2;
  }
  const double wall0 = NowMs(CLOCK_MONOTONIC);
  Worker workers[kThreads];
  size_t keep_per_thread = 0;
  for (const Site& site : kSites) {
    keep_per_thread += (site.per_round * kRounds + kKeepEvery - 1) / kKeepEvery;
  }
  for (Worker& w : workers) w.keep.reserve(keep_per_thread);

  HeapProfiler* profiler = nullptr;
  if (mode == "inprof") {
    inprof::Options options = inprof::Options::FromEnv();
    if (std::getenv("INPROF_ALLOC_PERIOD") == nullptr) options.alloc_period = 512 * 1024;
    profiler = new HeapProfiler(options);
    if (absl::Status s = profiler->Start(); !s.ok()) {
      std::fprintf(stderr, "alloc_sites: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  {
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        if (profiler != nullptr) {
          auto self = profiler->RegisterThread("worker" + std::to_string(t));
          Work(workers[t]);
        } else {
          Work(workers[t]);
        }
      });
    }
    for (auto& thread : threads) thread.join();
  }
  if (profiler != nullptr) {
    // The kept blocks are still allocated: the last window's inuse_* is them.
    if (absl::Status s = profiler->Stop(); !s.ok()) {
      std::fprintf(stderr, "alloc_sites: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  for (size_t s = 0; s < kNumSites; ++s) {
    uint64_t objects = 0, kept = 0;
    for (const Worker& w : workers) {
      objects += w.objects[s];
      kept += w.kept[s];
    }
    std::printf(
        "TRUTH site=%s alloc_bytes=%llu alloc_objects=%llu live_bytes=%llu live_objects=%llu\n",
        kSites[s].name,
        static_cast<unsigned long long>(
            objects * (kSites[s].call_bytes != 0 ? kSites[s].call_bytes : kSites[s].size)),
        static_cast<unsigned long long>(objects * kSites[s].call_objects),
        static_cast<unsigned long long>(kept * kSites[s].size),
        static_cast<unsigned long long>(kept));
  }
  rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  const double cpu_ms = ru.ru_utime.tv_sec * 1e3 + ru.ru_utime.tv_usec / 1e3 +
                        ru.ru_stime.tv_sec * 1e3 + ru.ru_stime.tv_usec / 1e3;
  std::printf("RESULT mode=%s wall_ms=%.1f process_cpu_ms=%.1f maxrss_kib=%ld sink=%llu\n",
              mode.c_str(), NowMs(CLOCK_MONOTONIC) - wall0, cpu_ms, inprof::bench::PeakRssKib(),
              static_cast<unsigned long long>((workers[0].sink ^ workers[1].sink) & 1));
  // The kept blocks (and the profiler) are left to the process's exit.
  return 0;
}
