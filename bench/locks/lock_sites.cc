// A whole program for checking lock-wait profiles against the truth: at
// four call sites, threads take a mutex of their own site and hold it for a
// site-specific time (a short spin, a longer spin, a sleep, and a
// std::shared_mutex taken for writing against readers), a fixed number of
// times each (the same work profiled or not: the process's CPU compares).
// The program counts its own truth per site: every lock call it makes
// first tries the lock (try_lock); a try that fails counts one contention
// and the lock call that follows is timed (its delay).
//
//   lock_sites none|inprof [scale]   (scale: the iterations x, default 1)
//
// none: no profiler in the process. inprof: DefaultProfiler with
// Options::FromEnv(), lock_period 1ms unless INPROF_LOCK_PERIOD is set,
// every worker registered; after Stop() the program reads the profile it
// wrote (INPROF_OUTPUT, default lock_sites.pb.gz) and prints each site's
// profiled contentions and delay beside the truth.
//
// Output, one line per site, then one for the process:
//   SITE site=SiteSpinShort truth_contentions=... truth_delay_ms=...
//        profile_contentions=... profile_delay_ms=... (inprof only, same line)
//   RESULT mode=... wall_ms=... process_cpu_ms=...
// The truth's waits include the try that found the lock busy; inprof's
// wrapper tries again, and a lock freed between the two tries is no wait
// to it: its contentions may be a little below the truth's, never above
// but for the sampling's spread.
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "inprof/inprof.h"
#include "inprof/pprof_reader.h"

namespace {

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

void Spin(int64_t ns) {
  const int64_t end = NowNs() + ns;
  while (NowNs() < end) {
  }
}

struct Truth {
  std::atomic<int64_t> contentions{0};
  std::atomic<int64_t> delay_ns{0};
};

constexpr int kSites = 4;
const char* const kSiteNames[kSites] = {"SiteSpinShort", "SiteSpinLong", "SiteSleep",
                                        "SiteWriter"};
Truth g_truth[kSites];

// Locks `m` as a program would, counting the truth around it.
template <typename M>
inline __attribute__((always_inline)) void CountedLock(M& m, Truth& truth) {
  if (m.try_lock()) return;
  const int64_t start = NowNs();
  m.lock();
  truth.contentions.fetch_add(1, std::memory_order_relaxed);
  truth.delay_ns.fetch_add(NowNs() - start, std::memory_order_relaxed);
}

std::mutex g_short, g_long, g_sleep;
std::shared_mutex g_rw;

__attribute__((noinline)) void SiteSpinShort() {
  CountedLock(g_short, g_truth[0]);
  Spin(2'000);  // 2 us
  g_short.unlock();
}
__attribute__((noinline)) void SiteSpinLong() {
  CountedLock(g_long, g_truth[1]);
  Spin(200'000);  // 200 us
  g_long.unlock();
}
__attribute__((noinline)) void SiteSleep() {
  CountedLock(g_sleep, g_truth[2]);
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  g_sleep.unlock();
}
__attribute__((noinline)) void SiteWriter() {
  CountedLock(g_rw, g_truth[3]);
  Spin(100'000);  // 100 us
  g_rw.unlock();
}
__attribute__((noinline)) void Reader() {
  std::shared_lock lock(g_rw);
  Spin(50'000);
}

int64_t ProcessCpuMs() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1000 +
         (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1000;
}

int64_t StackSum(const inprof::DecodedProfile& p, int index, const char* site) {
  int64_t sum = 0;
  for (const auto& s : p.samples) {
    for (const std::string& frame : s.stack) {
      if (absl::StrContains(frame, site)) {
        sum += s.values[index];
        break;
      }
    }
  }
  return sum;
}

}  // namespace

int main(int argc, char** argv) {
  const bool profiled = argc > 1 && std::strcmp(argv[1], "inprof") == 0;
  const int scale = argc > 2 ? std::max(1, std::atoi(argv[2])) : 1;
  inprof::Options options = inprof::Options::FromEnv();
  if (options.lock_period == absl::ZeroDuration()) options.lock_period = absl::Milliseconds(1);
  if (std::getenv("INPROF_OUTPUT") == nullptr) options.output = "lock_sites.pb.gz";
  inprof::DefaultProfiler profiler(options);
  if (profiled && !profiler.Start().ok()) return 1;
  const int64_t start = NowNs();
  std::vector<std::thread> threads;
  auto worker = [&](void (*site)(), int iterations) {
    threads.emplace_back([&, site, iterations] {
      // Not started (none): an inactive registration, no work.
      auto self = profiler.RegisterThread("worker");
      for (int i = 0; i < iterations * scale; ++i) site();
    });
  };
  // About a second of each site's hold times, serialized.
  for (int i = 0; i < 3; ++i) worker(SiteSpinShort, 150'000);
  for (int i = 0; i < 2; ++i) worker(SiteSpinLong, 2'500);
  for (int i = 0; i < 2; ++i) worker(SiteSleep, 250);
  worker(SiteWriter, 5'000);
  for (int i = 0; i < 2; ++i) worker(Reader, 20'000);
  for (std::thread& t : threads) t.join();
  const int64_t wall_ms = (NowNs() - start) / 1'000'000;
  if (profiled && !profiler.Stop().ok()) return 1;
  const int64_t cpu_ms = ProcessCpuMs();
  absl::StatusOr<inprof::DecodedProfile> p =
      profiled ? inprof::ReadPprofFile(options.output) : absl::NotFoundError("none");
  for (int s = 0; s < kSites; ++s) {
    std::printf("SITE site=%s truth_contentions=%lld truth_delay_ms=%.1f", kSiteNames[s],
                static_cast<long long>(g_truth[s].contentions.load()),
                g_truth[s].delay_ns.load() / 1e6);
    if (p.ok()) {
      const int c = p->ValueIndex("contentions");
      const int d = p->ValueIndex("delay");
      std::printf(" profile_contentions=%lld profile_delay_ms=%.1f",
                  static_cast<long long>(StackSum(*p, c, kSiteNames[s])),
                  StackSum(*p, d, kSiteNames[s]) / 1e6);
    }
    std::printf("\n");
  }
  std::printf("RESULT mode=%s wall_ms=%lld process_cpu_ms=%lld\n", profiled ? "inprof" : "none",
              static_cast<long long>(wall_ms), static_cast<long long>(cpu_ms));
  return 0;
}
