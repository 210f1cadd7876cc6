// A whole program for the peak of the live heap: it grows its heap to a
// high-water mark at five call sites, frees part of it, grows another site
// to below the mark, then frees everything before it exits -- a batch
// program's shape, whose exit heap is empty. It counts its own live bytes
// per site and keeps them as they stood when its live total was highest,
// so that a profiler's peak per site can be checked against that truth
// (bench/alloc/compare_peak.py runs it plain, under `inprof run --alloc`
// and under heaptrack). It links no profiler: `inprof run` (LD_PRELOAD)
// and heaptrack attach from outside.
//
//   peak_sites [SCALE]     SCALE (default 1) multiplies every count
//
// Phases (SCALE 1):
//   1. a worker thread (it ends) allocates SiteB: 2,000 x new char[20,000]
//      (40 MB), kept;
//   2. the main thread allocates SiteA: 20,000 x malloc(3,000) (60 MB) and
//      SiteE: 1,000,000 x new 48 B (48 MB), interleaved, and churns
//      20,000,000 x malloc(64)/free at SiteF (nothing kept): the peak,
//      148 MB live, is the end of this phase;
//   3. frees SiteA and SiteE, grows SiteC: 500 buffers by realloc to
//      64 KiB (32 MB), below the peak;
//   4. frees everything.
//
// Output, one line per site, then one for the process:
//   TRUTH site=SiteA peak_bytes=... peak_objects=... end_bytes=0
//   RESULT wall_ms=... process_cpu_ms=... maxrss_kib=...
#include <sys/resource.h>
#include <time.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

enum Site { kA, kB, kC, kE, kF, kSites };
const char* const kNames[kSites] = {"SiteA", "SiteB", "SiteC", "SiteE", "SiteF"};

// Live bytes and blocks per site now and at the highest total so far. The
// phases that change them run on one thread at a time (the worker is
// joined before the main thread starts), so no lock is needed.
struct Truth {
  int64_t bytes[kSites] = {};
  int64_t objects[kSites] = {};
  int64_t total = 0;
  int64_t peak_total = 0;
  int64_t peak_bytes[kSites] = {};
  int64_t peak_objects[kSites] = {};

  void Add(Site s, int64_t size) {
    bytes[s] += size;
    objects[s] += 1;
    total += size;
    if (total > peak_total) {
      peak_total = total;
      std::memcpy(peak_bytes, bytes, sizeof(bytes));
      std::memcpy(peak_objects, objects, sizeof(objects));
    }
  }
  void Remove(Site s, int64_t size) {
    bytes[s] -= size;
    objects[s] -= 1;
    total -= size;
  }
} g_truth;

void Touch(void* p, size_t size) {
  std::memset(p, 0x5a, size);
  asm volatile("" : : "r"(p) : "memory");
}

__attribute__((noinline)) void* SiteA() {
  void* p = std::malloc(3000);
  Touch(p, 3000);
  return p;
}
__attribute__((noinline)) char* SiteB() {
  char* p = new char[20'000];
  Touch(p, 20'000);
  return p;
}
__attribute__((noinline)) void* SiteC() {
  void* p = std::malloc(1024);
  for (size_t size = 2048; size <= 64 * 1024; size *= 2) p = std::realloc(p, size);
  Touch(p, 64 * 1024);
  return p;
}
__attribute__((noinline)) void* SiteE() {
  void* p = ::operator new(48);
  Touch(p, 48);
  return p;
}
__attribute__((noinline)) void SiteF() {
  void* p = std::malloc(64);
  Touch(p, 64);
  std::free(p);
}

double Seconds(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  const int scale = argc > 1 ? std::atoi(argv[1]) : 1;
  if (scale < 1 || scale > 100) {
    std::fprintf(stderr, "usage: %s [SCALE 1..100]\n", argv[0]);
    return 2;
  }
  const double wall0 = Seconds(CLOCK_MONOTONIC);
  const int n_a = 20'000 * scale, n_b = 2'000 * scale, n_c = 500 * scale;
  const int n_e = 1'000'000 * scale, n_f = 20'000'000 * scale;
  std::vector<char*> b;
  b.reserve(n_b);
  std::thread([&] {
    for (int i = 0; i < n_b; ++i) {
      b.push_back(SiteB());
      g_truth.Add(kB, 20'000);
    }
  }).join();
  std::vector<void*> a, c, e;
  a.reserve(n_a);
  e.reserve(n_e);
  c.reserve(n_c);
  const int e_per_a = n_e / n_a, f_per_a = n_f / n_a;
  for (int i = 0; i < n_a; ++i) {
    a.push_back(SiteA());
    g_truth.Add(kA, 3000);
    for (int k = 0; k < e_per_a; ++k) {
      e.push_back(SiteE());
      g_truth.Add(kE, 48);
    }
    for (int k = 0; k < f_per_a; ++k) SiteF();  // live for a moment: never the peak
  }
  for (void* p : a) {
    std::free(p);
    g_truth.Remove(kA, 3000);
  }
  for (void* p : e) {
    ::operator delete(p);
    g_truth.Remove(kE, 48);
  }
  for (int i = 0; i < n_c; ++i) {
    c.push_back(SiteC());
    g_truth.Add(kC, 64 * 1024);
  }
  for (char* p : b) {
    delete[] p;
    g_truth.Remove(kB, 20'000);
  }
  for (void* p : c) {
    std::free(p);
    g_truth.Remove(kC, 64 * 1024);
  }
  for (int s = 0; s < kSites; ++s) {
    std::printf("TRUTH site=%s peak_bytes=%lld peak_objects=%lld end_bytes=%lld\n", kNames[s],
                static_cast<long long>(g_truth.peak_bytes[s]),
                static_cast<long long>(g_truth.peak_objects[s]),
                static_cast<long long>(g_truth.bytes[s]));
  }
  rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  const double cpu = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                     static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
  std::printf("RESULT wall_ms=%.0f process_cpu_ms=%.0f maxrss_kib=%ld\n",
              (Seconds(CLOCK_MONOTONIC) - wall0) * 1e3, cpu * 1e3, ru.ru_maxrss);
  return 0;
}
