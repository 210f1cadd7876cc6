// CpuTimeProvider's engines (perf events, POSIX CPU timers, ITIMER_PROF):
// the period each delivers, where kernel CPU lands, short-lived threads on
// their real stacks, and the perf engine's file-descriptor budget. Profiles
// are read back with inprof's reader and checked against the threads' own
// CPU clocks.
#include "inprof/cpu_time_provider.h"

#include <fcntl.h>
#include <linux/perf_event.h>
#include <sys/syscall.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inprof/inprof.h"
#include "inprof/base/sanitizers.h"
#include "inprof/pprof_reader.h"
#include "util/stat_bounds.h"
#include "util/test_util.h"

namespace inprof {
namespace {

using ::testing::HasSubstr;

using ::inprof::testing::ThreadCpuNow;

__attribute__((noinline)) uint64_t Spin(int64_t ns) {
  const int64_t end = ThreadCpuNow() + ns;
  uint64_t x = 88172645463325252ULL;
  while (ThreadCpuNow() < end) {
    for (int i = 0; i < 200; ++i) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
    }
  }
  return x;
}

// Spin() that also measures the thread's stalls: single loop iterations
// (one clock read and 200 rounds, well under a microsecond) whose thread
// CPU clock advanced by more than `stall_ns`. On a virtual machine whose
// hypervisor does not report steal time (/proc/stat's steal stays 0 on this
// project's CI machines), a vCPU the host took away for a while charges that
// time to the thread that was running, and perf's hrtimer, firing late,
// raises one overflow for the whole stall (hrtimer_forward_now skips the
// missed periods): one sample carrying the stall's CPU delta.
struct SpinStalls {
  int64_t count = 0;
  int64_t ns = 0;
};
__attribute__((noinline)) uint64_t SpinMeasuringStalls(int64_t ns,
                                                       int64_t stall_ns,
                                                       SpinStalls* stalls) {
  int64_t prev = ThreadCpuNow();
  const int64_t end = prev + ns;
  uint64_t x = 88172645463325252ULL;
  while (prev < end) {
    for (int i = 0; i < 200; ++i) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
    }
    const int64_t now = ThreadCpuNow();
    if (now - prev > stall_ns) {
      ++stalls->count;
      stalls->ns += now - prev;
    }
    prev = now;
  }
  return x;
}

// 32 read()s of 64 KiB from /dev/zero: almost all of it kernel CPU. (A
// profiling signal arriving meanwhile makes a read return early with what
// it has: the kernel checks for pending signals between pages.)
//
// `preempted` counts the times the scheduler took the core from the thread
// meanwhile (involuntary context switches, getrusage's ru_nivcsw): the two
// getrusage calls are inside, so the profile and the thread's clock both
// charge them to ReadChunks.
__attribute__((noinline)) void ReadChunks(int fd, char* buffer, int64_t* preempted) {
  rusage before{}, after{};
  getrusage(RUSAGE_THREAD, &before);
  for (int i = 0; i < 32; ++i) {
    if (read(fd, buffer, 64 * 1024) < 0 && errno != EINTR) std::abort();
  }
  getrusage(RUSAGE_THREAD, &after);
  *preempted += after.ru_nivcsw - before.ru_nivcsw;
  asm volatile("" ::: "memory");
}

// Involuntary context switches of the calling thread so far.
int64_t Preemptions() {
  rusage r{};
  getrusage(RUSAGE_THREAD, &r);
  return r.ru_nivcsw;
}

// User-space work of a fixed number of iterations (no clock reads, which
// are system calls for a thread's CPU clock).
__attribute__((noinline)) uint64_t SpinIterations(uint64_t n) {
  uint64_t x = 88172645463325252ULL;
  for (uint64_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
  }
  return x;
}

// Where spins leave their result, so the compiler keeps them; per thread
// (the class test spins on many threads at once).
thread_local volatile uint64_t benchmark_sink;

#if defined(INPROF_ASAN) || defined(INPROF_TSAN)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

Options TestOptions(const std::string& name, CpuEngine engine,
                    absl::Duration period) {
  Options options;
  options.output = testing::TestTmpDir() + "/cpu_" + name + ".pb.gz";
  std::remove(options.output.c_str());
  options.cpu_engine = engine;
  options.cpu_period = period;
  options.wall_period = absl::ZeroDuration();
  options.export_period = absl::ZeroDuration();
  return options;
}

// A counting (not sampling) task-clock perf event on the calling thread:
// the clock the perf engine's periods are counted in. On a VM whose kernel
// has CONFIG_PARAVIRT_TIME_ACCOUNTING (this project's machines), time the
// host steals while the thread is on a CPU advances it but not the thread's
// CPU clock (sum_exec_runtime leaves steal out). -1 if unavailable.
int OpenTaskClock() {
  perf_event_attr attr{};
  attr.size = sizeof(attr);
  attr.type = PERF_TYPE_SOFTWARE;
  attr.config = PERF_COUNT_SW_TASK_CLOCK;
  return static_cast<int>(syscall(SYS_perf_event_open, &attr, 0, -1, -1,
                                  PERF_FLAG_FD_CLOEXEC));
}
int64_t ReadTaskClock(int fd) {
  uint64_t ns = 0;
  if (fd < 0 || read(fd, &ns, sizeof(ns)) != static_cast<ssize_t>(sizeof(ns))) {
    return -1;
  }
  return static_cast<int64_t>(ns);
}

// Whether the kernel offers what the perf engine uses (a sampling
// task-clock event that counts kernel mode too), asked of the kernel itself
// (tests/util), never of CpuTimeProvider::Configure(): a regression there
// fails these tests instead of skipping them.
bool PerfAvailable() { return testing::ProbePerfEvents().kernel; }

// Why the perf cases do not run here.
std::string NoPerf() {
  return "perf events are not available here (" + testing::ProbePerfEvents().reason + ")";
}

bool StackHas(const DecodedProfile::Sample& s, const std::string& fn) {
  for (const std::string& f : s.stack) {
    if (f.find(fn) != std::string::npos) return true;
  }
  return false;
}

std::string Comments(const DecodedProfile& p) {
  std::string all;
  for (const std::string& c : p.comments) all += c + "\n";
  return all;
}

struct EngineCase {
  CpuEngine engine;
  const char* name;
};
const EngineCase kEngines[] = {{CpuEngine::kPerf, "perf"},
                               {CpuEngine::kTimer, "timer"},
                               {CpuEngine::kItimer, "itimer"}};

TEST(CpuTimeProviderTest, EachEngineIsNamedInTheProfile) {
  for (const EngineCase& e : kEngines) {
    if (e.engine == CpuEngine::kPerf && !PerfAvailable()) continue;
    Options options = TestOptions(std::string("named_") + e.name, e.engine,
                                  absl::Milliseconds(1));
    DefaultProfiler profiler(options);
    ASSERT_TRUE(profiler.Start().ok()) << e.name;
    {
      auto r = profiler.RegisterThread("main");
      Spin(20'000'000);
    }
    ASSERT_TRUE(profiler.Stop().ok());
    auto profile = ReadPprofFile(options.output);
    ASSERT_TRUE(profile.ok()) << profile.status();
    EXPECT_THAT(Comments(*profile),
                HasSubstr(std::string("cpu engine=") + e.name + " "))
        << e.name;
  }
  if (!PerfAvailable()) GTEST_SKIP() << "the timer engines passed; " << NoPerf();
}

TEST(CpuTimeProviderTest, ForcedPerfEngineThatIsUnavailableFailsStartClearly) {
  if (PerfAvailable()) {
    // Make it unavailable: no descriptors to spare.
    Options options = TestOptions("perf_unavailable", CpuEngine::kPerf,
                                  absl::Milliseconds(10));
    options.perf_fd_share = 0;
    DefaultProfiler profiler(options);
    absl::Status s = profiler.Start();
    EXPECT_FALSE(s.ok());
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("INPROF_CPU_ENGINE=perf: perf events are not "
                          "available (INPROF_PERF_FD_SHARE=0)"));
  } else {
    Options options = TestOptions("perf_unavailable", CpuEngine::kPerf,
                                  absl::Milliseconds(10));
    DefaultProfiler profiler(options);
    absl::Status s = profiler.Start();
    EXPECT_THAT(std::string(s.message()), HasSubstr("INPROF_CPU_ENGINE=perf"));
  }
}

// The perf engine's hrtimer fires after each `period` of the thread's CPU,
// whatever the scheduler tick (the timer engine delivers at most one sample
// per tick: 250 per CPU-second at HZ=250).
TEST(CpuTimeProviderTest, PerfEngineDeliversOneSamplePerPeriodOfCpu) {
  if (!PerfAvailable()) GTEST_SKIP() << NoPerf();
  Options options = TestOptions("perf_rate", CpuEngine::kPerf,
                                absl::Milliseconds(1));
  DefaultProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  int64_t used = 0;
  int64_t perf_clock = -1;  // the task clock over the same stretch
  SpinStalls stalls;
  const int task_clock = OpenTaskClock();
  {
    auto r = profiler.RegisterThread("main");
    const int64_t p0 = ReadTaskClock(task_clock);
    const int64_t t0 = ThreadCpuNow();
    benchmark_sink = SpinMeasuringStalls(500'000'000, 500'000, &stalls);
    used = ThreadCpuNow() - t0;
    const int64_t p1 = ReadTaskClock(task_clock);
    if (p0 >= 0 && p1 >= 0) perf_clock = p1 - p0;
  }
  if (task_clock >= 0) close(task_clock);
  ASSERT_TRUE(profiler.Stop().ok());
  auto profile = ReadPprofFile(options.output);
  ASSERT_TRUE(profile.ok()) << profile.status();
  const int64_t samples = profile->Total(profile->ValueIndex("cpu-samples"));
  const int64_t cpu_ns = profile->Total(profile->ValueIndex("cpu-time"));
  // The CPU the thread had outside stalls, where each period ends in its
  // own overflow; a stall ends in at most one.
  const int64_t unstalled = used - stalls.ns;
  std::printf("perf engine at 1ms: %lld samples in %.3f CPU-s = %.0f/s; "
              "%lld stalls over 0.5 ms took %.1f ms; profile's cpu-time "
              "%.3f s; task clock %.3f s\n",
              static_cast<long long>(samples), used / 1e9, samples / (used / 1e9),
              static_cast<long long>(stalls.count), stalls.ns / 1e6,
              cpu_ns / 1e9, perf_clock / 1e9);
  // No skip when the machine stalled the thread much: the lower bound
  // below is on the unstalled CPU, what was measured, however little.
  // About one per millisecond of CPU: the period is counted in the thread's
  // own CPU time, so load on the machine does not stretch it. But the
  // event's overflows fall on the lattice points themselves (the first
  // period is the first point's offset), and an overflow that its handler
  // finds a hair before the point (the perf task clock against
  // CLOCK_THREAD_CPUTIME_ID) takes no point and records nothing; the next
  // takes two (the profile's CPU below stays exact). How often depends on
  // the machine: in 11 clean-clone suites (plain and ASan+UBSan) 480-501
  // samples for 500 ms of CPU (480 beside two busy loops), and 474 beside a
  // build and two fuzzers, where the 95% this asserted before failed.
  // Not a statistical bound but a separation: an engine limited to the
  // scheduler's tick (the timer engine at HZ=250, itimer) delivers at most
  // 25% of the periods at 1 ms, so 80% still tells perf from them, with
  // room for nearly four times the merges of the worst run measured.
  EXPECT_GE(samples, static_cast<int64_t>(0.8 * unstalled / 1e6));
  // At most one per millisecond of the task clock the periods are counted
  // in: the thread's CPU plus any time the host stole while it was on a
  // CPU (CI measured 508 samples for 500 ms of thread CPU on a loaded VM).
  EXPECT_LE(samples,
            static_cast<int64_t>(1.01 * std::max(used, perf_clock) / 1e6) + 1);
  // Every sample counts each period of CPU since the previous one: stalls
  // included, the profile's CPU is the thread's registered CPU within one
  // period (deterministic: 1 ms of 500), and what registration adds to
  // `used` is tens of microseconds.
  EXPECT_NEAR(cpu_ns / 1e9, used / 1e9, 0.05 * used / 1e9);
}

// A thread alternating read() of 64 KiB from /dev/zero (kernel CPU) and
// user-space spinning: the CPU of the system calls is charged to their
// caller (ReadChunk), in the share the thread's own clock measured.
void CheckKernelShare(CpuEngine engine, const char* name,
                      absl::Duration period, int64_t cpu_ns) {
  Options options = TestOptions(std::string("kernel_") + name, engine, period);
  DefaultProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  int64_t in_reads = 0, total = 0;
  int64_t preempted_in_reads = 0, preempted = 0;
  absl::Duration wall;
  {
    auto r = profiler.RegisterThread("main");
    const int fd = open("/dev/zero", O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    std::vector<char> buffer(64 * 1024);
    const absl::Time w0 = absl::Now();
    const int64_t p0 = Preemptions();
    const int64_t t0 = ThreadCpuNow();
    int64_t t = t0;
    while (t - t0 < cpu_ns) {
      ReadChunks(fd, buffer.data(), &preempted_in_reads);
      // The window holds about one clock read (a system call for a
      // thread's CPU clock, charged to ThreadCpuNow in the profile): 32
      // reads per window keep that under a point.
      const int64_t after_reads = ThreadCpuNow();
      in_reads += after_reads - t;
      benchmark_sink = SpinIterations(80'000);
      t = ThreadCpuNow();
    }
    total = ThreadCpuNow() - t0;
    wall = absl::Now() - w0;
    preempted = Preemptions() - p0;
    close(fd);
  }
  ASSERT_TRUE(profiler.Stop().ok());
  auto profile = ReadPprofFile(options.output);
  ASSERT_TRUE(profile.ok()) << profile.status();
  const int cpu = profile->ValueIndex("cpu-time");
  const int count = profile->ValueIndex("cpu-samples");
  int64_t profiled_reads = 0, profiled = 0, samples = 0;
  double squares = 0;  // sum of squared sample weights
  double heaviest = 0;  // the largest weight of one sample
  for (const DecodedProfile::Sample& s : profile->samples) {
    if (s.values[cpu] == 0) continue;
    profiled += s.values[cpu];
    samples += s.values[count];
    // A sample row may merge several samples of one stack; each weighs
    // its row's CPU over its count.
    const double w = static_cast<double>(s.values[cpu]) / std::max<int64_t>(s.values[count], 1);
    squares += w * w * static_cast<double>(std::max<int64_t>(s.values[count], 1));
    heaviest = std::max(heaviest, w);
    if (StackHas(s, "ReadChunks")) profiled_reads += s.values[cpu];
  }
  ASSERT_GT(profiled, 0);
  // The total: the sample points the thread's CPU crossed (perf, timer:
  // within one period of its registered CPU) or the CPU between its
  // samples (itimer: exact); registration adds microseconds to `total`.
  EXPECT_NEAR(static_cast<double>(profiled), static_cast<double>(total),
              static_cast<double>(absl::ToInt64Nanoseconds(period)) + 0.01 * total)
      << name;
  if (engine == CpuEngine::kItimer) {
    // The process-wide timer's signal goes to the process: generated while
    // this thread waits for a core, it is delivered when the thread runs
    // again -- inside a read(), where a busy machine preempts it most, at
    // the read's return -- and each sample carries all the CPU since the
    // thread's previous one. Beside two busy loops it put 83% of the CPU
    // on the reads (25.9% by the clock): a bias with the load, not a
    // sampling error, so the itimer share is measured by
    // bench/sampling/cpu_engine_accuracy.py (kernel), and here only the
    // total above.
    return;
  }
  const double truth = 100.0 * in_reads / total;
  const double measured = 100.0 * profiled_reads / profiled;
  // A share estimated from samples of unequal weight w_i (the tick-limited
  // timer's carry several periods): the CPU on the reads is sum w_i X_i,
  // X_i ~ Bernoulli(p) whether sample i lands in a read, independent terms
  // each within the heaviest weight of its mean, variance sum w_i^2 p (1 -
  // p). Bernstein (stats::BernsteinDeviation, 1e-7 a side) over the
  // profile's CPU gives the share's deviation in points (it was 5 sigma of
  // the normal approximation, (sum w)^2 / sum w^2 samples, Kish: ~5.7
  // sigma now, plus 10.7 heaviest weights over the CPU, 0.7 points at
  // 1 ms), on top of the 3 points the placement of samples around each
  // read may be off by (a sample's skid past a read's return).
  const double n_eff = static_cast<double>(profiled) * static_cast<double>(profiled) /
                       std::max(squares, 1.0);
  const double p = truth / 100.0;
  const double deviation =
      100.0 * stats::BernsteinDeviation(squares * p * (1 - p), heaviest) /
      static_cast<double>(profiled);
  // The time the thread waited for a core while it read and spun.
  const double waited = 1.0 - static_cast<double>(total) /
                                  std::max<double>(1.0, absl::ToDoubleNanoseconds(wall));
  // Under contention the share is biased, not noisy: beside two busy loops
  // (ASan suite, 2026-11-26) perf at 1 ms put 41.5% of the CPU on the
  // reads for 28.0% by the clock, 13.5 points against 8.8 allowed; the
  // thread is preempted more inside read() than in its spin, and where the
  // kernel then delivers the overflow is the open "kernel CPU under load"
  // work (bench/sampling/cpu_engine_accuracy.py kernel measures it). It
  // used to be asserted only when the thread had a core 3/4 of the time,
  // which beside a build was seldom. Now it is bounded by what happened.
  // The bias goes one way, onto the reads: a preemption inside a read
  // holds back at most the one sample pending when the thread lost its
  // core (a periodic engine has one timer per thread) until the thread
  // runs again, still inside the read, and that sample weighs at most the
  // heaviest sample of the profile. The thread counts its preemptions
  // inside the reads (getrusage around them), so the share may exceed the
  // truth by that CPU more; below the truth the bound stays that of a
  // quiet machine, which is what fails a profile that loses kernel CPU or
  // charges it elsewhere, whatever the load. Measured beside two busy
  // loops (2 cores): see docs/test_command.md.
  const double moved = 100.0 * static_cast<double>(preempted_in_reads) * heaviest /
                       static_cast<double>(profiled);
  std::printf("%-6s %-5s kernel share: thread clock %.1f%%, profile %.1f%% "
              "(%lld samples, %.0f effective, bound %.1f points; waited "
              "for a core %.0f%% of the time; preempted %lld times, %lld in "
              "reads, heaviest sample %.1f ms: %.1f points)\n",
              name, absl::FormatDuration(period).c_str(), truth, measured,
              static_cast<long long>(samples), n_eff, deviation, 100 * waited,
              static_cast<long long>(preempted),
              static_cast<long long>(preempted_in_reads), heaviest / 1e6, moved);
  EXPECT_GE(measured, truth - (3.0 + deviation)) << name;
  EXPECT_LE(measured, truth + 3.0 + deviation + moved) << name;
}

TEST(CpuTimeProviderTest, KernelCpuIsChargedToItsCallerWithEveryEngine) {
  for (const EngineCase& e : kEngines) {
    if (e.engine == CpuEngine::kPerf && !PerfAvailable()) continue;
    CheckKernelShare(e.engine, e.name, absl::Milliseconds(1), 1'500'000'000);
  }
  if (!PerfAvailable()) GTEST_SKIP() << "the timer engines passed; " << NoPerf();
  CheckKernelShare(CpuEngine::kPerf, "perf", absl::Milliseconds(10),
                   3'000'000'000);
}

// 2,000 registered threads living 1-2 ms of CPU each: their CPU lands on
// their real stacks, and the profile's total is their CPU within sampling
// error. Each thread's CPU in the profile is the period times the sample
// points its CPU crossed (internal/cpu_lattice.h): within one period of its
// CPU, mean equal to it, variance period^2 f (1 - f) (f: the fractional part
// of CPU / period).
void CheckShortThreads(CpuEngine engine, absl::Duration period) {
  Options options = TestOptions("short_threads", engine, period);
  DefaultProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  const double p = static_cast<double>(absl::ToInt64Nanoseconds(period));
  std::mutex mu;
  int64_t measured = 0, outer = 0;
  double variance = 0, min_spin_share = 1;
  constexpr int kThreads = 2000;
  for (int batch = 0; batch < kThreads / 4; ++batch) {
    std::vector<std::thread> threads;
    for (int i = 0; i < 4; ++i) {
      const int64_t ns = 1'000'000 + ((batch * 4 + i) % 5) * 250'000;
      threads.emplace_back([&, ns] {
        // The thread's CPU while registered runs from its arming, inside
        // RegisterThread, to the tail taken inside Reset(): between what
        // the thread can time inside and outside those two calls.
        const int64_t outer0 = ThreadCpuNow();
        auto r = profiler.RegisterThread("short");
        const int64_t t0 = ThreadCpuNow();
        Spin(ns);
        const int64_t inside = ThreadCpuNow() - t0;
        r.Reset();
        const int64_t around = ThreadCpuNow() - outer0;
        // The largest variance any CPU between the two could have.
        double v = 0;
        for (double c = static_cast<double>(inside); c <= around; c += p / 64) {
          const double f = c / p - std::floor(c / p);
          v = std::max(v, f * (1 - f));
        }
        std::lock_guard<std::mutex> lock(mu);
        measured += inside;
        outer += around;
        variance += p * p * (v > 0 ? v : 0.25);
        min_spin_share = std::min(min_spin_share,
                                  static_cast<double>(inside) / around);
      });
    }
    for (auto& t : threads) t.join();
  }
  ASSERT_TRUE(profiler.Stop().ok());
  auto profile = ReadPprofFile(options.output);
  ASSERT_TRUE(profile.ok()) << profile.status();
  const int cpu = profile->ValueIndex("cpu-time");
  const int count = profile->ValueIndex("cpu-samples");
  int64_t in_profile = 0, samples = 0, on_stacks = 0;
  for (const DecodedProfile::Sample& s : profile->samples) {
    auto it = s.str_labels.find("thread name");
    if (it == s.str_labels.end() || it->second != "short") continue;
    in_profile += s.values[cpu];
    samples += s.values[count];
    if (StackHas(s, "Spin")) on_stacks += s.values[count];
  }
  const double share = samples ? static_cast<double>(on_stacks) / samples : 0;
  // Each sample falls in Spin with a chance of at least the smallest share
  // of a thread's registered CPU that Spin took (a sum of independent
  // draws: never less concentrated than a binomial with that chance).
  const double min_share = stats::BinomialShareLow(samples, min_spin_share);
  // The total: a sum of 2,000 independent terms (Bernstein, 1e-7 each side).
  const double deviation = stats::BernsteinDeviation(variance, p);
  std::printf("%s %s: %d threads, %.3f-%.3fs by their clocks, in profile "
              "%.3fs (allowed %.3f-%.3fs); %lld samples, %.1f%% on their real "
              "stacks (allowed >= %.1f%%)\n",
              CpuEngineName(engine), absl::FormatDuration(period).c_str(),
              kThreads, measured / 1e9, outer / 1e9, in_profile / 1e9,
              (measured - deviation) / 1e9, (outer + deviation) / 1e9,
              static_cast<long long>(samples), 100 * share, 100 * min_share);
  EXPECT_GE(share, min_share);
  EXPECT_GE(static_cast<double>(in_profile), measured - deviation);
  EXPECT_LE(static_cast<double>(in_profile), outer + deviation);
}

TEST(CpuTimeProviderTest, ShortLivedThreadsStayOnTheirRealStacks) {
  if (!PerfAvailable()) GTEST_SKIP() << NoPerf();
  CheckShortThreads(CpuEngine::kPerf, absl::Milliseconds(10));
  CheckShortThreads(CpuEngine::kPerf, absl::Milliseconds(1));
}

// 20,000 threads that each use 2-50% of a 1 ms period, in four classes:
// each class is sampled in proportion to its CPU, however short its
// threads. A thread's first sample point is uniform in (0, period] of its
// CPU after arming, so it is sampled (once: it lives less than a period)
// with a chance of its registered CPU over the period, independently of
// the others: a class's sample count is a sum of independent Bernoulli
// draws with mean sum(CPU) / period, which lies between what its threads
// timed inside and outside RegisterThread/Reset. The bounds below hold it
// with a chance of at most 1e-7 each side (stat_bounds.h; 8e-7 for the
// four classes), and the ratio
// printed is what README quotes. The signal handler's own CPU after a
// thread's last point crosses no point but is in what the threads timed:
// a few microseconds a sample here (the threads' CPU from arming to exit
// and their points agreed within 2.4%, measured), ~0.2 ms under TSan, which
// therefore skips this test (scripts/sanitizers.sh).
TEST(CpuTimeProviderTest, ShortThreadsAreSampledInProportionToTheirCpu) {
  if (!PerfAvailable()) GTEST_SKIP() << NoPerf();
  const absl::Duration period = absl::Milliseconds(1);
  Options options = TestOptions("short_classes", CpuEngine::kPerf, period);
  options.symbolize = false;
  DefaultProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  const double p = static_cast<double>(absl::ToInt64Nanoseconds(period));
  constexpr int kClasses = 4;
  constexpr int64_t kBurnNs[kClasses] = {20'000, 100'000, 250'000, 500'000};
  const int threads_per_class = kSanitized ? 1'250 : 5'000;
  std::array<std::atomic<int64_t>, kClasses> inner{}, outer{};
  std::atomic<int> next{0};
  std::vector<std::thread> spawners;
  for (int s = 0; s < 2; ++s) {
    spawners.emplace_back([&] {
      for (int i; (i = next.fetch_add(1)) < kClasses * threads_per_class;) {
        const int c = i % kClasses;
        std::thread([&, c] {
          const int64_t outer0 = ThreadCpuNow();
          auto r = profiler.RegisterThread(absl::StrCat("class-", c));
          const int64_t t0 = ThreadCpuNow();
          benchmark_sink = Spin(kBurnNs[c]);
          inner[c] += ThreadCpuNow() - t0;
          r.Reset();
          outer[c] += ThreadCpuNow() - outer0;
        }).join();
      }
    });
  }
  for (auto& t : spawners) t.join();
  ASSERT_TRUE(profiler.Stop().ok());
  auto profile = ReadPprofFile(options.output);
  ASSERT_TRUE(profile.ok()) << profile.status();
  // The sample points each class's CPU crossed: its CPU in the profile
  // over the period (a point whose signal was still in flight as its
  // thread unregistered is credited by the tail: counted too).
  const auto cpu = profile->ByLabel("thread name", profile->ValueIndex("cpu-time"));
  for (int c = 0; c < kClasses; ++c) {
    const auto it = cpu.find(absl::StrCat("class-", c));
    const int64_t n = it == cpu.end() ? 0 : it->second / static_cast<int64_t>(p);
    const double low = stats::PoissonLow(inner[c] / p);
    const double high = stats::PoissonHigh(outer[c] / p);
    std::printf("class %d (%3lld us of a 1 ms period): %lld samples; CPU / "
                "period %.0f-%.0f (ratio %.3f-%.3f); allowed %.0f-%.0f\n",
                c, static_cast<long long>(kBurnNs[c] / 1000),
                static_cast<long long>(n), inner[c] / p, outer[c] / p,
                n / (outer[c] / p), n / (inner[c] / p), low, high);
    EXPECT_GE(static_cast<double>(n), low) << "class " << c;
    EXPECT_LE(static_cast<double>(n), high) << "class " << c;
  }
}

// Two-step arming (sample_provider.h: ArmsInTwoSteps), the provider's part:
// a thread prepared on its own thread and never armed (it ended before the
// sampler's thread came to it) still owes exactly the lattice points its
// CPU crossed since the preparation: its first point was drawn in
// (0, period] of CPU then, so the points are within one of CPU / period,
// whatever the draw (deterministic). OwesSample asks for the stack it
// unregisters from (it was never sampled), and DisarmThread forgets the
// preparation (no event was opened: nothing to close).
TEST(CpuTimeProviderTest, APreparedThreadNeverArmedOwesTheCpuSinceItsPreparation) {
  if (!PerfAvailable()) GTEST_SKIP() << NoPerf();
  constexpr int64_t kPeriod = 10'000'000;
  CpuTimeProvider provider;
  Options options;
  options.cpu_engine = CpuEngine::kPerf;
  options.cpu_period = absl::Nanoseconds(kPeriod);
  ASSERT_TRUE(provider.Configure(options).ok());
  internal::ThreadSlotHeader thread;
  ASSERT_EQ(pthread_getcpuclockid(pthread_self(), &thread.cpu_clock), 0);
  thread.tid = static_cast<pid_t>(syscall(SYS_gettid));
  CpuTimeProvider::ThreadData data;
  const int64_t before = ThreadCpuNow();
  ASSERT_TRUE(provider.PrepareThread(thread, data));
  const int64_t after = ThreadCpuNow();
  EXPECT_FALSE(provider.PrepareThread(thread, data)) << "prepared twice";
  EXPECT_EQ(thread.perf_fd.load(), -1) << "PrepareThread opened an event";
  Spin(5 * kPeriod + kPeriod / 2);
  EXPECT_TRUE(CpuTimeProvider::OwesSample(thread, data));
  provider.DisarmThread(thread, data);
  EXPECT_FALSE(data.prepared);
  const int64_t end = ThreadCpuNow();
  int64_t values[2] = {};
  ASSERT_TRUE(provider.TakeTail(thread, data, values));
  const int64_t tail_end = ThreadCpuNow();
  // Points crossed between the preparation's clock read (between `before`
  // and `after`) and the tail's (between `end` and `tail_end`).
  EXPECT_GE(values[1], (end - after) / kPeriod * kPeriod - kPeriod) << values[1];
  EXPECT_LE(values[1], (tail_end - before) / kPeriod * kPeriod + kPeriod) << values[1];
  EXPECT_EQ(values[1] % kPeriod, 0);
  // Other engines arm at once (their arming is cheap).
  CpuTimeProvider timer;
  options.cpu_engine = CpuEngine::kTimer;
  ASSERT_TRUE(timer.Configure(options).ok());
  CpuTimeProvider::ThreadData timer_data;
  EXPECT_FALSE(timer.PrepareThread(thread, timer_data));
}

// Two-step arming in a profiler: with the burst threshold at 0, every
// thread registering while it runs is prepared on its own thread and armed
// by the ticker's (the wall sampler's thread; a wall period of an hour
// keeps it from visiting). Each thread waits until all are armed, then
// spins: its CPU in the profile is within one period of what it used while
// registered (the lattice, above; deterministic), and its samples during
// the spin are on Spin: every point its CPU crossed in the spin but the
// last (whose signal may still be in flight as it unregisters) is signalled
// there, so at least that CPU less two periods is on Spin.
TEST(CpuTimeProviderTest, ThreadsArmedByTheSamplerAreSampledFromTheirRegistration) {
  if (!PerfAvailable()) GTEST_SKIP() << NoPerf();
  const absl::Duration period = absl::Milliseconds(10);
  const int64_t p = absl::ToInt64Nanoseconds(period);
  Options options = TestOptions("two_step", CpuEngine::kPerf, period);
  options.wall_period = absl::Hours(1);
  DefaultProfiler profiler(options);
  profiler.SetBurstThreadsForTesting(0);
  ASSERT_TRUE(profiler.Start().ok());
  constexpr int kThreads = 6;
  std::array<int64_t, kThreads> inner{}, outer{};
  std::mutex mu;
  std::condition_variable cv;
  int registered = 0;
  bool go = false;
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      const int64_t outer0 = ThreadCpuNow();
      auto r = profiler.RegisterThread(absl::StrCat("two-step-", i));
      {
        std::unique_lock<std::mutex> lock(mu);
        ++registered;
        cv.notify_all();
        cv.wait(lock, [&] { return go; });
      }
      const int64_t t0 = ThreadCpuNow();
      benchmark_sink = Spin(6 * p);
      inner[i] = ThreadCpuNow() - t0;
      r.Reset();
      outer[i] = ThreadCpuNow() - outer0;
    });
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return registered == kThreads; });
  }
  // The ticker arms them within microseconds; a minute is for a machine
  // that stalls.
  const absl::Time deadline = absl::Now() + absl::Minutes(1);
  while (profiler.stats().threads_armed_by_sampler < kThreads && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  const uint64_t armed = profiler.stats().threads_armed_by_sampler;
  {
    std::lock_guard<std::mutex> lock(mu);
    go = true;
  }
  cv.notify_all();
  for (auto& t : threads) t.join();
  ASSERT_TRUE(profiler.Stop().ok());
  EXPECT_EQ(armed, static_cast<uint64_t>(kThreads));
  auto profile = ReadPprofFile(options.output);
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_THAT(Comments(*profile), HasSubstr("threads armed by the sampler thread"));
  const int cpu = profile->ValueIndex("cpu-time");
  for (int i = 0; i < kThreads; ++i) {
    const std::string name = absl::StrCat("two-step-", i);
    int64_t total = 0, on_spin = 0;
    for (const DecodedProfile::Sample& s : profile->samples) {
      auto it = s.str_labels.find("thread name");
      if (it == s.str_labels.end() || it->second != name) continue;
      total += s.values[cpu];
      if (StackHas(s, "Spin")) on_spin += s.values[cpu];
    }
    std::printf("%s: %.1f ms in the profile, %.1f ms on Spin; its CPU %.1f-%.1f ms\n",
                name.c_str(), total / 1e6, on_spin / 1e6, inner[i] / 1e6, outer[i] / 1e6);
    EXPECT_GE(total, inner[i] - p) << name;
    EXPECT_LE(total, outer[i] + p) << name;
#if !defined(INPROF_TSAN)
    // Not under TSan: it delivers an asynchronous signal only at its next
    // interceptor call (scripts/sanitizers.sh), after the spin (measured:
    // 20-50 of 60 ms on Spin). The totals and the arming hold under it.
    EXPECT_GE(on_spin, inner[i] - 2 * p) << name;
#endif
  }
}

// More threads at once than INPROF_PERF_THREADS: the perf engine arms that
// many, the rest are sampled by the timer engine (a perf event costs its
// thread at each context switch; options.h). Deterministic: the four
// threads hold their registrations until all four are registered, and a
// thread is armed inside RegisterThread (never left to the ticker's armer,
// whatever the other threads registering meanwhile).
TEST(CpuTimeProviderTest, PerfEngineArmsAtMostPerfThreadsAtOnce) {
  if (!PerfAvailable()) GTEST_SKIP() << NoPerf();
  Options options = TestOptions("perf_threads", CpuEngine::kAuto, absl::Milliseconds(10));
  options.perf_threads = 2;
  constexpr int kThreads = 4;
  DefaultProfiler profiler(options);
  profiler.SetBurstThreadsForTesting(kThreads);
  ASSERT_TRUE(profiler.Start().ok());
  std::mutex mu;
  std::condition_variable cv;
  int registered = 0;
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&] {
      auto r = profiler.RegisterThread("worker");
      std::unique_lock<std::mutex> lock(mu);
      ++registered;
      cv.notify_all();
      cv.wait(lock, [&] { return registered == kThreads; });
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(profiler.Stop().ok());
  auto profile = ReadPprofFile(options.output);
  ASSERT_TRUE(profile.ok()) << profile.status();
  const std::string comments = Comments(*profile);
  EXPECT_THAT(comments, HasSubstr("cpu engine=perf"));
  EXPECT_THAT(comments, HasSubstr("threads armed: perf=2 timer=2 itimer=0 (2 moved from perf"));
  EXPECT_THAT(comments, HasSubstr("held back 2 times at 2 descriptors (INPROF_PERF_THREADS)"));
}

// More threads than the perf engine's descriptor budget (a share of those
// free under RLIMIT_NOFILE): the rest are sampled by the timer engine, the
// host can still open what it had, and every thread is in the profile.
// A thread that unregisters itself is signalled once more for a sample
// point its CPU crossed whose signal has not come (OwesSample): the stack
// it unregisters from stands in for the CPU just before it. Only for a
// point crossed within the last period, or a thread never sampled: points
// crossed longer ago are CPU whose signals never came (the timer engine on
// a loaded machine went 0.5 s of a thread's CPU without a signal), and
// the unregistration stack, the same each time, took them all (14% of a
// 5 s profile of the kernel-share workload once, all of it from its
// ReadChunks and spinning); they now go to the tail, on the thread's last
// sampled stack. Deterministic: the provider's own functions on crafted
// state, against this thread's CPU clock.
TEST(CpuTimeProviderTest, OwedSampleAtUnregistrationTakesOnlyRecentPoints) {
  constexpr int64_t kPeriod = 1'000'000;
  internal::ThreadSlotHeader thread;
  ASSERT_EQ(pthread_getcpuclockid(pthread_self(), &thread.cpu_clock), 0);
  siginfo_t info{};
  info.si_code = SI_TIMER;
  int64_t values[2] = {};
  for (const CpuEngine engine : {CpuEngine::kTimer, CpuEngine::kPerf}) {
    SCOPED_TRACE(CpuEngineName(engine));
    // Sampled once, then 3 periods of CPU without a signal: three points
    // owed, the oldest crossed 2.5 periods before unregistering.
    CpuTimeProvider::ThreadData sampled;
    sampled.signal_engine.store(engine);
    sampled.period_ns.store(kPeriod);
    sampled.last_cpu_ns.store(-1);  // as ArmThread leaves it
    sampled.next_due_ns.store(ThreadCpuNow() - kPeriod / 2);
    ASSERT_TRUE(CpuTimeProvider::OnSignal(thread, sampled, info, values));
    EXPECT_EQ(values[1], kPeriod);
    Spin(3 * kPeriod);
    EXPECT_FALSE(CpuTimeProvider::OwesSample(thread, sampled));
    // The tail takes them all (TakeTail: to the last sampled stack).
    sampled.tail_pending = true;
    sampled.tail_engine = engine;
    CpuTimeProvider provider;
    ASSERT_TRUE(provider.TakeTail(thread, sampled, values));
    EXPECT_GE(values[1], 3 * kPeriod);

    // One point owed, crossed moments ago: the unregistration stack takes it.
    CpuTimeProvider::ThreadData recent;
    recent.signal_engine.store(engine);
    recent.period_ns.store(kPeriod);
    recent.last_cpu_ns.store(ThreadCpuNow() - kPeriod);
    recent.next_due_ns.store(ThreadCpuNow() - kPeriod / 100);
    EXPECT_TRUE(CpuTimeProvider::OwesSample(thread, recent));

    // Never sampled: its own stack is the only one it has, however long ago
    // its points were crossed.
    CpuTimeProvider::ThreadData never;
    never.signal_engine.store(engine);
    never.period_ns.store(kPeriod);
    never.last_cpu_ns.store(-1);
    never.next_due_ns.store(ThreadCpuNow() - 3 * kPeriod);
    EXPECT_TRUE(CpuTimeProvider::OwesSample(thread, never));

    // Nothing owed.
    never.next_due_ns.store(ThreadCpuNow() + kPeriod);
    EXPECT_FALSE(CpuTimeProvider::OwesSample(thread, never));
  }
}

// A wall sample takes the CPU points no CPU signal took (TakeSwallowed:
// SIGPROF is not queued, so a perf overflow's signal raised while the wall
// signal was pending is discarded). Only points whose own signal is
// overdue: a wall signal to a thread that waited for a core is delivered
// where the scheduler took it off (clock_gettime, read), and taking every
// point crossed there put 12-17% of a loaded perf profile on
// clock_gettime. A POSIX timer's signal is queued behind a pending one, so
// the timer engine's points are left to it. Deterministic, as above.
TEST(CpuTimeProviderTest, WallSampleTakesOnlyOverdueCpuPoints) {
  constexpr int64_t kPeriod = 1'000'000;
  internal::ThreadSlotHeader thread;
  ASSERT_EQ(pthread_getcpuclockid(pthread_self(), &thread.cpu_clock), 0);
  int64_t values[2] = {};
  for (const CpuEngine engine : {CpuEngine::kPerf, CpuEngine::kTimer}) {
    SCOPED_TRACE(CpuEngineName(engine));
    CpuTimeProvider::ThreadData data;
    data.signal_engine.store(engine);
    data.period_ns.store(kPeriod);
    data.last_cpu_ns.store(-1);
    // One point crossed moments ago: its own signal may be coming.
    data.next_due_ns.store(ThreadCpuNow() - kPeriod / 100);
    EXPECT_FALSE(CpuTimeProvider::TakeSwallowed(thread, data, values));
    // The oldest untaken point crossed more than a period ago: overdue.
    data.next_due_ns.store(ThreadCpuNow() - 2 * kPeriod - kPeriod / 2);
    EXPECT_EQ(CpuTimeProvider::TakeSwallowed(thread, data, values),
              engine == CpuEngine::kPerf);
    if (engine == CpuEngine::kPerf) {
      EXPECT_EQ(values[1], 3 * kPeriod);
    }
  }
}

TEST(CpuTimeProviderTest, PerfEngineKeepsWithinItsDescriptorBudget) {
  if (!PerfAvailable()) GTEST_SKIP() << NoPerf();
  fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    rlimit limit{256, 256};
    if (setrlimit(RLIMIT_NOFILE, &limit) != 0) _exit(10);
    Options options = TestOptions("fd_budget", CpuEngine::kAuto,
                                  absl::Milliseconds(1));
    options.perf_fd_share = 25;
    DefaultProfiler profiler(options);
    if (!profiler.Start().ok()) _exit(11);
    constexpr int kThreads = 1000;
    std::mutex mu;
    std::condition_variable cv;
    int ready = 0;
    bool go = false;
    std::atomic<int64_t> measured{0}, outer{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) {
      threads.emplace_back([&] {
        // The thread's CPU while registered (waking up 1,000 threads on one
        // condition variable costs some too) runs from its arming, inside
        // RegisterThread, to the tail taken inside Reset(): between what
        // the thread can time inside and outside those two calls.
        const int64_t outer0 = ThreadCpuNow();
        auto r = profiler.RegisterThread("worker");
        const int64_t t0 = ThreadCpuNow();
        Spin(2'000'000);
        {
          std::unique_lock<std::mutex> lock(mu);
          ++ready;
          cv.notify_all();
          cv.wait(lock, [&] { return go; });
        }
        measured += ThreadCpuNow() - t0;
        r.Reset();
        outer += ThreadCpuNow() - outer0;
      });
    }
    {
      // All 1,000 registered at once: the host can still open files.
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return ready == kThreads; });
    }
    std::vector<int> fds;
    for (int i = 0; i < 150; ++i) {
      const int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
      if (fd < 0) _exit(12);  // EMFILE because of inprof
      fds.push_back(fd);
    }
    for (int fd : fds) close(fd);
    {
      std::lock_guard<std::mutex> lock(mu);
      go = true;
    }
    cv.notify_all();
    for (auto& t : threads) t.join();
    if (!profiler.Stop().ok()) _exit(13);
    auto profile = ReadPprofFile(options.output);
    if (!profile.ok()) _exit(14);
    const std::string comments = Comments(*profile);
    std::printf("%s", comments.c_str());
    if (comments.find("cpu engine=perf") == std::string::npos) _exit(15);
    if (comments.find("moved from perf to timer") == std::string::npos) {
      _exit(16);
    }
    const int64_t cpu =
        profile->ByLabel("thread name",
                         profile->ValueIndex("cpu-time"))["worker"];
    std::printf("workers: %.3f-%.3f s of CPU by their clocks, %.3f s in "
                "the profile\n", measured / 1e9, outer / 1e9, cpu / 1e9);
    std::fflush(stdout);
    // Each worker's CPU in the profile is within one period of its
    // registered CPU, mean equal to it: a sum of 1,000 independent terms,
    // variance <= period^2 / 4 each (Bernstein, 1e-7 each side).
    const double period = static_cast<double>(absl::ToInt64Nanoseconds(options.cpu_period));
    const double slack = stats::BernsteinDeviation(kThreads * period * period / 4, period);
    if (cpu < measured.load() - slack || cpu > outer.load() + slack) _exit(17);
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace inprof
