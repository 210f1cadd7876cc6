#include "inprof/profiler.h"

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inprof/inprof.h"
#include "inprof/base/log.h"
#include "inprof/base/sanitizers.h"
#include "inprof/pprof_reader.h"
#include "util/stat_bounds.h"
#include "util/test_util.h"

namespace inprof {
namespace {

using ::testing::HasSubstr;

using ::inprof::testing::ThreadCpuNow;

// Burns about `ns` of this thread's CPU time, reading its clock every
// `batch` rounds of work (a few microseconds each 2,000); `reads` counts the
// reads.
__attribute__((noinline)) uint64_t BurnCpu(int64_t ns, int batch = 2000,
                                           int64_t* reads = nullptr) {
  const int64_t end = ThreadCpuNow() + ns;
  uint64_t x = 88172645463325252ULL;
  int64_t n = 1;
  for (; ThreadCpuNow() < end; ++n) {
    for (int i = 0; i < batch; ++i) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
    }
  }
  if (reads != nullptr) *reads = n + 1;
  return x;
}

Options TestOptions(const std::string& name) {
  Options options;
  options.output = testing::TestTmpDir() + "/" + name + ".pb.gz";
  std::remove(options.output.c_str());
  return options;
}

size_t CountThreads() {
  size_t n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

// Runs `body` in a forked child and returns its exit status (so tests of
// process-wide state start from a clean signal disposition).
int RunInChild(const std::function<int()>& body) {
  fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) _exit(body());
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(ProfilerTest, WritesCpuProfileOfRegisteredThread) {
  Options options = TestOptions("basic");
  DefaultProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  int64_t inner = 0, outer = 0;  // the thread's CPU inside / around its registration
  {
    const int64_t outer0 = ThreadCpuNow();
    auto self = profiler.RegisterThread("main");
    ASSERT_TRUE(self.active());
    const int64_t t0 = ThreadCpuNow();
    BurnCpu(300'000'000);
    inner = ThreadCpuNow() - t0;
    self.Reset();
    outer = ThreadCpuNow() - outer0;
  }
  ASSERT_TRUE(profiler.Stop().ok());
  auto profile = ReadPprofFile(options.output);
  ASSERT_TRUE(profile.ok()) << profile.status();
  const int cpu = profile->ValueIndex("cpu-time");
  ASSERT_GE(cpu, 0);
  EXPECT_EQ(profile->ValueIndex("cpu-samples"), 0);
  // The only registered thread's CPU is the period times the sample points
  // it crossed from arming to its tail (cpu_time_provider.h): within one
  // period of its registered CPU, deterministically. (It was 200-400 ms
  // for a 300 ms burn, picked by hand.)
  const int64_t period = absl::ToInt64Nanoseconds(options.cpu_period);
  const int64_t total = profile->Total(cpu);
  EXPECT_GT(total, inner - period);
  EXPECT_LT(total, outer + period);
  auto by_thread = profile->ByLabel("thread name", cpu);
  EXPECT_GT(by_thread["main"], inner - period);
  // A signal at least every second point it crossed (perf: one a point;
  // the timer engine: one a scheduler tick it ran, a tick <= 10 ms, the
  // period): a separation from "no sampling", not a statistical bound.
  EXPECT_GE(profiler.stats().samples_taken,
            static_cast<uint64_t>((inner / period - 1) / 2));
  EXPECT_EQ(profiler.stats().samples_taken,
            profiler.stats().samples_recorded + profiler.stats().samples_dropped);
}

std::vector<std::string>* g_logged = nullptr;
void KeepLogged(absl::string_view line) { g_logged->emplace_back(line); }

// An invalid option is said once: at construction (ScopedProfiler said it
// again, prefixed "profiler not started: "). Another Start() error is said
// by ScopedProfiler.
TEST(ProfilerTest, AnInvalidOptionIsSaidOnce) {
  std::vector<std::string> lines;
  g_logged = &lines;
  internal::SetLogSinkForTesting(&KeepLogged);
  {
    Options options;
    options.write_output = false;
    options.max_frames = 0;
    DefaultProfiler profiler(options);
    ScopedProfiler running(profiler);
    EXPECT_FALSE(running.start_status().ok());
  }
  internal::SetLogSinkForTesting(nullptr);
  int said = 0;
  for (const std::string& line : lines) said += line.find("max_frames=0") != std::string::npos;
  EXPECT_EQ(said, 1) << ::testing::PrintToString(lines);
}

TEST(ProfilerTest, SecondProfilerGetsClearError) {
  DefaultProfiler first(TestOptions("first"));
  DefaultProfiler second(TestOptions("second"));
  ASSERT_TRUE(first.Start().ok());
  absl::Status s = second.Start();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("already running"));
  EXPECT_TRUE(first.Stop().ok());
  // Once the first stopped, the second may run.
  EXPECT_TRUE(second.Start().ok());
  EXPECT_TRUE(second.Stop().ok());
}

TEST(ProfilerTest, ThreadsRegisterBeforeAndAfterStart) {
  Options options = TestOptions("before_after");
  DefaultProfiler profiler(options);
  std::atomic<bool> started{false};
  int64_t early_cpu = 0, late_cpu = 0;  // each one's BurnCpu, by its clock
  std::thread early([&] {
    auto r = profiler.RegisterThread("early");
    while (!started.load()) std::this_thread::yield();
    const int64_t t0 = ThreadCpuNow();
    BurnCpu(200'000'000);
    early_cpu = ThreadCpuNow() - t0;
  });
  while (profiler.stats().threads_registered < 1) std::this_thread::yield();
  ASSERT_TRUE(profiler.Start().ok());
  started = true;
  std::thread late([&] {
    auto r = profiler.RegisterThread("late");
    const int64_t t0 = ThreadCpuNow();
    BurnCpu(200'000'000);
    late_cpu = ThreadCpuNow() - t0;
  });
  early.join();
  late.join();
  ASSERT_TRUE(profiler.Stop().ok());
  auto profile = ReadPprofFile(options.output);
  ASSERT_TRUE(profile.ok()) << profile.status();
  auto by_thread = profile->ByLabel("thread name", profile->ValueIndex("cpu-time"));
  // Each armed before its burn (early: by Start()), so each gets its burn's
  // CPU within one period, deterministically (the sample points it
  // crossed; it was > 100 ms of 200, picked by hand).
  const int64_t period = absl::ToInt64Nanoseconds(options.cpu_period);
  EXPECT_GT(by_thread["early"], early_cpu - period);
  EXPECT_GT(by_thread["late"], late_cpu - period);
}

// Unwind tables are built on the collector thread after Start(); until
// they are, walks follow frame pointers, which lose the caller of a libc
// leaf. Tests of where CPU lands in steady state wait for them (the first
// build takes ~50 ms, ~1 s under TSan).
::testing::AssertionResult UnwindTablesReady() {
  if constexpr (requires { DefaultUnwinder::TablesReady(); }) {
    for (int i = 0; i < 60'000 && !DefaultUnwinder::TablesReady(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (!DefaultUnwinder::TablesReady()) {
      return ::testing::AssertionFailure() << "unwind tables not built in 60 s";
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(ProfilerTest, ShortLivedThreadsExitWhileRunning) {
  Options options = TestOptions("churn");
  options.cpu_period = absl::Milliseconds(1);
  DefaultProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  ASSERT_TRUE(UnwindTablesReady());
  // The profile accounts for each thread's CPU from its arming, inside
  // RegisterThread, to the tail its unregistration reads, inside Reset():
  // between what the thread times inside those two calls and outside them.
  // (The calls' own CPU before arming and after the tail is no sample's:
  // under TSan on a loaded machine it was 11% of a 3 ms thread.)
  constexpr int kThreads = 200;
  std::vector<int64_t> inner_of(kThreads), outer_of(kThreads);
  std::atomic<int64_t> inner{0}, outer{0};
  for (int round = 0; round < kThreads / 4; ++round) {
    std::vector<std::thread> threads;
    for (int i = 0; i < 4; ++i) {
      const int index = round * 4 + i;
      threads.emplace_back([&, index] {
        const int64_t outer0 = ThreadCpuNow();
        auto r = profiler.RegisterThread(absl::StrCat("short-", index));
        const int64_t t0 = ThreadCpuNow();
        BurnCpu(3'000'000);
        inner_of[index] = ThreadCpuNow() - t0;
        r.Reset();
        outer_of[index] = ThreadCpuNow() - outer0;
        inner += inner_of[index];
        outer += outer_of[index];
      });
    }
    for (auto& t : threads) t.join();
  }
  ASSERT_TRUE(profiler.Stop().ok());
  EXPECT_EQ(profiler.stats().threads_registered, 200u);
  auto profile = ReadPprofFile(options.output);
  ASSERT_TRUE(profile.ok()) << profile.status();
  const int64_t total = profile->Total(profile->ValueIndex("cpu-time"));
  std::printf("200 threads: %.3f-%.3f s by their clocks, in profile %.3f s\n",
              inner / 1e9, outer / 1e9, total / 1e9);
  // 200 threads x 3 ms, each shorter than a 4 ms scheduler tick.
  EXPECT_GT(inner.load(), 600'000'000);
  // Each thread's CPU in the profile is the period times the sample points
  // its CPU crossed from arming to its tail (cpu_time_provider.h): within
  // one period of its registered CPU, deterministically (a sample a full
  // ring dropped keeps its CPU on the "samples dropped" stack). Any CPU
  // lost or counted twice shows here.
  const int cpu = profile->ValueIndex("cpu-time");
  const auto by_thread = profile->ByLabel("thread name", cpu);
  const int64_t period = absl::ToInt64Nanoseconds(options.cpu_period);
  for (int i = 0; i < kThreads; ++i) {
    const auto it = by_thread.find(absl::StrCat("short-", i));
    const int64_t in_profile = it == by_thread.end() ? 0 : it->second;
    EXPECT_GT(in_profile, inner_of[i] - period) << "thread " << i;
    EXPECT_LT(in_profile, outer_of[i] + period) << "thread " << i;
  }
  // Where it lands: BurnCpu holds each thread's points in its 3 ms, which
  // are within a period of 3 ms each (a signal's delivery can carry one
  // past its end: two periods). Sum of 200 independent terms each within
  // two periods of its mean, variance <= period^2 each (Bernstein, 1e-7):
  // the CPU is on BurnCpu, not on the synthetic tail frame.
  auto cumulative = profile->CumulativeByFunction(cpu);
  int64_t burn = 0;
  for (const auto& [fn, v] : cumulative) {
    if (fn.find("BurnCpu") != std::string::npos) burn += v;
  }
#if defined(INPROF_TSAN)
  // TSan holds an asynchronous signal back to the thread's next
  // interceptor call and then runs the handler with the context it saved,
  // whose frames below (the clock read's, the vDSO's, the `syscall` of
  // the owed sample at unregistration, which TSan's deferral makes
  // frequent) are gone by then: the walk stops at its one frame. Measured:
  // 57-75 ms of the 600 on a lone `__vdso_clock_gettime`, ~20 on a lone
  // `syscall`; counting those as BurnCpu's still left a clean clone at
  // 504 ms against a threshold of 514 (session 40). Where a deferred
  // sample lands is TSan's doing, not inprof's (scripts/sanitizers.sh
  // leaves such placements to the plain and ASan suites): the totals per
  // thread above are asserted under TSan, the placement is not.
  std::printf("on BurnCpu: %.3f s (not asserted under TSan)\n", burn / 1e9);
#else
  const double slack = stats::BernsteinDeviation(
      kThreads * static_cast<double>(period) * period, 2.0 * period);
  EXPECT_GE(static_cast<double>(burn), inner.load() - slack)
      << "allowed " << slack / 1e6 << " ms below the threads' 3 ms each";
#endif
}

// A thread that unregisters itself while the registry lock is taken does
// not wait for it: the collector finishes its unregistration at its next
// pass, after the thread may have exited (its CPU clock then unreadable).
// Its CPU and wall time still end where it unregistered: not short by the
// CPU after its last sample, not long by the wait for the collector.
TEST(ProfilerTest, AThreadThatUnregistersItselfIsCountedUpToThatMoment) {
  Options options = TestOptions("retired_self");
  options.cpu_period = absl::Milliseconds(1);
  options.collect_period = absl::Milliseconds(100);
  DefaultProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  int64_t cpu_ns = 0, wall_ns = 0, wall_in = 0;
  std::atomic<bool> registered{false};
  int64_t cpu_in = 0;
  std::thread thread([&] {
    const int64_t cpu0 = ThreadCpuNow();
    const auto wall0 = std::chrono::steady_clock::now();
    auto registration = profiler.RegisterThread("retires-itself");
    registered = true;
    const int64_t in0 = ThreadCpuNow();
    const auto wall_in0 = std::chrono::steady_clock::now();
    BurnCpu(30'000'000);
    cpu_in = ThreadCpuNow() - in0;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    wall_in = std::chrono::duration_cast<std::chrono::nanoseconds>(
                  std::chrono::steady_clock::now() - wall_in0)
                  .count();
    registration.Reset();
    cpu_ns = ThreadCpuNow() - cpu0;
    wall_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                  std::chrono::steady_clock::now() - wall0)
                  .count();
  });
  // Taken once it has registered, so that it cannot unregister at once;
  // held until it has exited (it does not wait for the lock).
  while (!registered.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  {
    std::lock_guard<std::mutex> lock(profiler.registry_mutex_for_testing());
    thread.join();
  }
  // Two collector passes after the thread is gone.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_TRUE(profiler.Stop().ok());
  auto profile = ReadPprofFile(options.output);
  ASSERT_TRUE(profile.ok()) << profile.status();
  const int64_t cpu =
      profile->ByLabel("thread name", profile->ValueIndex("cpu-time"))["retires-itself"];
  const int64_t wall =
      profile->ByLabel("thread name", profile->ValueIndex("wall-time"))["retires-itself"];
  // What was measured around the registration brackets what it covered,
  // within one period (the sample points its CPU crossed: deterministic).
  const int64_t period = absl::ToInt64Nanoseconds(options.cpu_period);
  EXPECT_GT(cpu, cpu_in - period);
  EXPECT_LT(cpu, cpu_ns + period);
  // Wall time: a visit's weight stands for the interval after it, so a
  // thread's total is at most its span and a round (w1 + (t_n - t_1);
  // sampling/wall_time_provider_test_util.h: WithinSpan), the round at
  // most the longest wait between two visits -- far below the 300 ms it
  // waited for the collector, which must not count. Not below: it lived
  // while this test held the registry lock, so the wall sampler could not
  // visit it at all (0 is right: no sample was taken).
  const int64_t round = static_cast<int64_t>(profiler.stats().wall_longest_round_ns);
  EXPECT_LE(wall, wall_ns + round) << "round " << round / 1e6 << " ms";
  (void)wall_in;
}

// Thousands of threads that each live 1-2 ms, shorter than a scheduler
// tick: each one's CPU reaches the profile through the sample points its
// CPU crossed (the first uniform in its first period), within one period.
TEST(ProfilerTest, ThousandsOfOneToTwoMillisecondThreadsAreAccountedFor) {
  Options options = TestOptions("short_threads");
  options.cpu_period = absl::Milliseconds(1);
  DefaultProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  std::atomic<int64_t> inner{0}, outer{0};
  constexpr int kThreads = 2000;
  std::vector<int64_t> inner_of(kThreads), outer_of(kThreads);
  for (int batch = 0; batch < kThreads / 4; ++batch) {
    std::vector<std::thread> threads;
    for (int i = 0; i < 4; ++i) {
      const int index = batch * 4 + i;
      const int64_t ns = 1'000'000 + (index % 5) * 250'000;
      threads.emplace_back([&, ns, index] {
        // The profile's interval, arming to tail, lies between the clock
        // read inside the registration and the one outside it.
        const int64_t outer0 = ThreadCpuNow();
        auto r = profiler.RegisterThread(absl::StrCat("short-", index));
        const int64_t t0 = ThreadCpuNow();
        BurnCpu(ns);
        inner_of[index] = ThreadCpuNow() - t0;
        r.Reset();
        outer_of[index] = ThreadCpuNow() - outer0;
        inner += inner_of[index];
        outer += outer_of[index];
      });
    }
    for (auto& t : threads) t.join();
  }
  ASSERT_TRUE(profiler.Stop().ok());
  auto profile = ReadPprofFile(options.output);
  ASSERT_TRUE(profile.ok()) << profile.status();
  const int cpu = profile->ValueIndex("cpu-time");
  const auto by_thread = profile->ByLabel("thread name", cpu);
  int64_t in_profile = 0, sampled = 0;  // sampled: on real stacks
  for (const auto& s : profile->samples) {
    const auto name = s.str_labels.find("thread name");
    if (name == s.str_labels.end() || !name->second.starts_with("short-")) continue;
    in_profile += s.values[cpu];
    if (!s.stack.empty() && s.stack[0] != kTailFrame) sampled += s.values[cpu];
  }
  std::printf("%d threads: %.3f-%.3fs by their clocks, in profile %.3fs "
              "(%.1f%% on sampled stacks)\n",
              kThreads, inner / 1e9, outer / 1e9, in_profile / 1e9,
              in_profile ? 100.0 * sampled / in_profile : 0.0);
  // Each thread within one period of its registered CPU: deterministic.
  const int64_t period = absl::ToInt64Nanoseconds(options.cpu_period);
  int outside = 0;
  for (int i = 0; i < kThreads; ++i) {
    const auto it = by_thread.find(absl::StrCat("short-", i));
    const int64_t mine = it == by_thread.end() ? 0 : it->second;
    if (mine <= inner_of[i] - period || mine >= outer_of[i] + period) {
      ADD_FAILURE() << "thread " << i << ": " << mine << " ns in the profile, "
                    << inner_of[i] << "-" << outer_of[i] << " by its clocks";
      if (++outside == 5) break;
    }
  }
}

TEST(ProfilerTest, RegistrationDestroyedOnAnotherThreadIsSafe) {
  DefaultProfiler profiler(TestOptions("foreign_unregister"));
  ASSERT_TRUE(profiler.Start().ok());
  ThreadRegistration moved;
  std::atomic<bool> done{false};
  std::thread worker([&] {
    moved = profiler.RegisterThread("worker");
    BurnCpu(50'000'000);
    done = true;
    BurnCpu(50'000'000);  // still running when main unregisters it
  });
  while (!done.load()) std::this_thread::yield();
  moved.Reset();  // from the main thread
  worker.join();
  EXPECT_TRUE(profiler.Stop().ok());
  EXPECT_FALSE(moved.active());
}

TEST(ProfilerTest, SecondRegistrationOfAThreadIsInert) {
  DefaultProfiler profiler(TestOptions("double_register"));
  auto first = profiler.RegisterThread("a");
  auto second = profiler.RegisterThread("b");
  EXPECT_TRUE(first.active());
  EXPECT_FALSE(second.active());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists);
}

TEST(ProfilerTest, StopIsIdempotentAndRestartWritesAgain) {
  Options options = TestOptions("restart");
  DefaultProfiler profiler(options);
  auto self = profiler.RegisterThread("main");
  const int64_t period = absl::ToInt64Nanoseconds(options.cpu_period);
  for (int i = 0; i < 3; ++i) {
    const int64_t outer0 = ThreadCpuNow();
    ASSERT_TRUE(profiler.Start().ok());
    const int64_t t0 = ThreadCpuNow();
    BurnCpu(50'000'000);
    const int64_t inner = ThreadCpuNow() - t0;
    ASSERT_TRUE(profiler.Stop().ok());
    const int64_t outer = ThreadCpuNow() - outer0;
    ASSERT_TRUE(profiler.Stop().ok());
    auto profile = ReadPprofFile(options.output);
    ASSERT_TRUE(profile.ok()) << profile.status();
    // Each profile covers its own window only: the thread's CPU between
    // Start() and Stop() within one period, deterministically (the sample
    // points it crossed; it was 20-100 ms for a 50 ms burn, picked by hand).
    const int64_t total = profile->Total(profile->ValueIndex("cpu-time"));
    EXPECT_GT(total, inner - period) << "round " << i;
    EXPECT_LT(total, outer + period) << "round " << i;
  }
  EXPECT_EQ(profiler.stats().profiles_written, 3u);
}

TEST(ProfilerTest, SignalsNotSentByInprofAreIgnored) {
  Options options = TestOptions("foreign_signal");
  // CPU samples only, at points an hour of CPU apart: the thread's first
  // point is uniform in its first hour of CPU, so a sample during the
  // kill()s' ~0.2 ms of CPU has a chance of 0.2 ms / 1 h = 6e-8 (and
  // none but the kill()s' signals could make one otherwise).
  options.cpu_period = absl::Hours(1);
  options.wall_period = absl::ZeroDuration();
  DefaultProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  auto self = profiler.RegisterThread("main");
  const auto before = internal::GetDispatchStats().foreign;
  const auto taken = profiler.stats().samples_taken;
  for (int i = 0; i < 100; ++i) ASSERT_EQ(kill(getpid(), SIGPROF), 0);
  ASSERT_TRUE(profiler.Stop().ok());
  EXPECT_GE(internal::GetDispatchStats().foreign, before + 1);
  // kill() samples nothing (the CPU timer of an idle thread never fires).
  EXPECT_EQ(profiler.stats().samples_taken, taken);
}

// A server that blocks every signal in its workers (they inherit the mask
// of the thread that created them; one thread waits in sigwait) would get
// no sample at all of them: their SIGPROF stays pending. RegisterThread
// unblocks SIGPROF, and only it, says so once, and the profile counts it.
TEST(ProfilerTest, ThreadsThatBlockSigprofAreUnblockedWhenTheyRegister) {
  Options options = TestOptions("sigprof_blocked");
  options.cpu_period = absl::Milliseconds(5);
  DefaultProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  bool sigprof_blocked_after = true, sigusr1_blocked_after = false;
  int64_t burn_cpu = 0;  // its BurnCpu, by its clock
  int64_t reads = 0, read_ns = 0;  // BurnCpu's clock reads, and what one costs
  ::testing::internal::CaptureStderr();
  std::thread worker([&] {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, nullptr);
    auto registration = profiler.RegisterThread("masked");
    sigset_t now;
    pthread_sigmask(SIG_SETMASK, nullptr, &now);
    sigprof_blocked_after = sigismember(&now, SIGPROF) == 1;
    sigusr1_blocked_after = sigismember(&now, SIGUSR1) == 1;
    // The cost of a read, the dearest of three rounds of 1,000.
    for (int round = 0; round < 3; ++round) {
      const int64_t r0 = ThreadCpuNow();
      for (int i = 0; i < 999; ++i) ThreadCpuNow();
      read_ns = std::max(read_ns, (ThreadCpuNow() - r0) / 1000);
    }
    const int64_t t0 = ThreadCpuNow();
    BurnCpu(200'000'000, 200'000, &reads);
    burn_cpu = ThreadCpuNow() - t0;
  });
  worker.join();
  const std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(profiler.Stop().ok());
  EXPECT_FALSE(sigprof_blocked_after);
  EXPECT_TRUE(sigusr1_blocked_after);  // the rest of the mask is the host's
  EXPECT_THAT(err, HasSubstr("thread 'masked' registered with SIGPROF blocked"));
  EXPECT_EQ(profiler.stats().threads_sigprof_unblocked, 1u);
  auto profile = ReadPprofFile(options.output);
  ASSERT_TRUE(profile.ok()) << profile.status();
  bool counted = false;
  for (const std::string& c : profile->comments) {
    counted |= c.find("threads registered with SIGPROF blocked, unblocked so "
                      "that they could be sampled=1") != std::string::npos;
  }
  EXPECT_TRUE(counted);
  // Its CPU is on its own stack, sampled, not on the tail frame alone.
  const int cpu = profile->ValueIndex("cpu-time");
  int64_t on_burn = 0, total = 0;
  for (const auto& sample : profile->samples) {
    auto name = sample.str_labels.find("thread name");
    if (name == sample.str_labels.end() || name->second != "masked") continue;
    total += sample.values[cpu];
    for (const std::string& f : sample.stack) {
      if (f.find("BurnCpu") != std::string::npos) {
        on_burn += sample.values[cpu];
        break;
      }
    }
  }
  std::printf("masked: cpu %.3f s, on BurnCpu %.3f s of %.3f s burnt (%lld clock reads of %lld ns)\n",
              total / 1e9, on_burn / 1e9, burn_cpu / 1e9, static_cast<long long>(reads),
              static_cast<long long>(read_ns));
  // Deterministic (it was > 150 ms of 200 and more than half on BurnCpu,
  // picked by hand): its burn crossed at least floor(burn / period) sample
  // points, each carrying a period, on BurnCpu's stack unless their signal
  // came after it returned: at most one period plus one scheduler tick
  // (<= 10 ms at HZ >= 100; the timer engine's lag) of them. In whole
  // periods: a CI run under ASan had 185 ms on BurnCpu of 200.008 ms at
  // 5 ms, 3 periods off, where `burn - period - tick` (185.008) asked for a
  // fraction of a sample more than the lattice can give.
  //
  // Under TSan a sample's stack can also be lost while the thread reads its
  // clock: TSan holds every asynchronous signal back to the next interceptor
  // and then runs the handler with the context it saved, whose frames below
  // BurnCpu's (the interceptor's, the vDSO's) are gone by then; the walk
  // stops after one frame (CI: 5 periods of 40 on `__vdso_clock_gettime`
  // or `syscall` alone, reading the clock every 2,000 rounds). So BurnCpu
  // reads it every 200,000 rounds here, and a sample point falls in a read
  // with chance p = reads * read_ns / burn (~0.3%, measured above): the
  // number lost is binomial, and at most the share BinomialShareHigh gives
  // (chance <= 1e-7) of the crossed points.
  const int64_t period = absl::ToInt64Nanoseconds(options.cpu_period);
  constexpr int64_t kTick = 10'000'000;
  const int64_t crossed = burn_cpu / period;
  const int64_t late = 1 + (kTick + period - 1) / period;
  const double p = std::min(1.0, static_cast<double>(reads * read_ns) /
                                     static_cast<double>(std::max<int64_t>(burn_cpu, 1)));
  const auto in_reads = static_cast<int64_t>(
      std::ceil(stats::BinomialShareHigh(crossed, p) * static_cast<double>(crossed)));
  EXPECT_GT(total, burn_cpu - period);
  EXPECT_GE(on_burn, (crossed - late - in_reads) * period) << "p=" << p << " allowance " << in_reads;
}

TEST(ProfilerTest, HarmlessHandlerRemainsAfterStop) {
  EXPECT_EQ(RunInChild([] {
              DefaultProfiler profiler(TestOptions("after_stop"));
              if (!profiler.Start().ok()) return 1;
              if (!profiler.Stop().ok()) return 2;
              struct sigaction sa;
              sigaction(SIGPROF, nullptr, &sa);
              if (sa.sa_handler == SIG_DFL) return 3;
              raise(SIGPROF);  // would terminate the process with SIG_DFL
              return 0;
            }),
            0);
}

TEST(ProfilerTest, DisabledProfilerCreatesNothing) {
  EXPECT_EQ(RunInChild([] {
              signal(SIGPROF, SIG_DFL);  // the parent's handler is inherited
              Options options = TestOptions("disabled");
              options.enabled = false;
              const size_t threads_before = CountThreads();
              DefaultProfiler profiler(options);
              if (!profiler.Start().ok()) return 1;
              auto self = profiler.RegisterThread("main");
              if (self.active()) return 2;
              BurnCpu(20'000'000);
              if (CountThreads() != threads_before) return 3;
              struct sigaction sa;
              sigaction(SIGPROF, nullptr, &sa);
              if (sa.sa_handler != SIG_DFL) return 4;
              if (!profiler.Stop().ok()) return 5;
              if (access(options.output.c_str(), F_OK) == 0) return 6;
              return 0;
            }),
            0);
}

TEST(ProfilerTest, ForeignSigprofHandlerIsLeftInPlace) {
  EXPECT_EQ(RunInChild([] {
              struct sigaction app;
              std::memset(&app, 0, sizeof(app));
              app.sa_handler = [](int) {};
              sigaction(SIGPROF, &app, nullptr);
              DefaultProfiler profiler(TestOptions("foreign_handler"));
              absl::Status s = profiler.Start();
              if (s.ok()) return 1;
              if (std::string(s.message()).find("SIGPROF") == std::string::npos)
                return 2;
              struct sigaction now;
              sigaction(SIGPROF, nullptr, &now);
              if (now.sa_handler != app.sa_handler) return 3;
              return 0;
            }),
            0);
}

// A ring too small for more than a few samples, and a collector that never
// runs during the burn: drops are counted and their CPU is kept.
TEST(ProfilerTest, DropsWhenRingIsFullAreCountedAndReconciled) {
  using TinyRingProfiler =
      Profiler<FramePointerUnwinder, SpscRecordRing<64>, CpuTimeProvider>;
  Options options = TestOptions("overload");
  options.cpu_period = absl::Milliseconds(1);
  options.collect_period = absl::Seconds(10);
  TinyRingProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  int64_t measured = 0, outer = 0;  // inside / around the registration
  {
    const int64_t outer0 = ThreadCpuNow();
    auto self = profiler.RegisterThread("main");
    const int64_t t0 = ThreadCpuNow();
    BurnCpu(300'000'000);
    measured = ThreadCpuNow() - t0;
    self.Reset();
    outer = ThreadCpuNow() - outer0;
  }
  ASSERT_TRUE(profiler.Stop().ok());
  const ProfilerStats stats = profiler.stats();
  EXPECT_GT(stats.samples_dropped, 0u);
  EXPECT_EQ(stats.samples_taken, stats.samples_recorded + stats.samples_dropped);
  auto profile = ReadPprofFile(options.output);
  ASSERT_TRUE(profile.ok()) << profile.status();
  const int cpu = profile->ValueIndex("cpu-time");
  auto flat = profile->FlatByFunction(cpu);
  EXPECT_GT(flat["[inprof: samples dropped, ring full]"], 0);
  // Dropped samples keep their CPU (on the pseudo-frame), so the total is
  // still the period times the points crossed: within one period of the
  // thread's registered CPU, deterministically (it was +-10%, by hand).
  const int64_t period = absl::ToInt64Nanoseconds(options.cpu_period);
  const int64_t total = profile->Total(cpu);
  EXPECT_GT(total, measured - period);
  EXPECT_LT(total, outer + period);
  bool comment_found = false;
  for (const auto& c : profile->comments) {
    comment_found |= c.find("dropped=" + std::to_string(stats.samples_dropped)) !=
                     std::string::npos;
  }
  EXPECT_TRUE(comment_found);
}

// An unwinder whose module tables take long to build, like a large
// program's first build under a sanitizer: one table each time the test
// allows one (the burning thread allows one per 5 ms of its CPU, and waits
// for it), then, once released, one a millisecond until the build is
// stopped, for 30 s at most. The profiler drains the rings between two
// tables, so a thread sampled at 1 ms meanwhile loses nothing, and Stop()
// ends the build instead of waiting for it. Paced by the test rather than
// by sleeps, so that neither depends on how the machine schedules the
// collector.
struct SlowTablesUnwinder : FramePointerUnwinder {
  static constexpr const char* kName = "slow-tables";
  static inline std::atomic<int> allowed{0};
  static inline std::atomic<bool> released{false};
  static inline std::atomic<int> built{0};
  static inline std::atomic<int> drained{0};  // tables followed by a drain
  static inline std::atomic<int> calls{0};
  static inline std::atomic<bool> stopped_early{false};
  static void RefreshModules(absl::FunctionRef<bool()> between_tables, bool) {
    ++calls;
    std::chrono::steady_clock::time_point give_up{};
    for (;;) {
      while (!released.load() && allowed.load() <= built.load()) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      if (released.load()) {
        const auto now = std::chrono::steady_clock::now();
        if (give_up == std::chrono::steady_clock::time_point{}) {
          give_up = now + std::chrono::seconds(30);
        }
        if (now > give_up) return;  // the whole build: Stop() waited for it
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      ++built;
      if (!between_tables()) {
        stopped_early = true;
        return;
      }
      ++drained;
    }
  }
};
// It has only the between-tables form: the Profiler must find that one
// (a concept that also asked for RefreshModules() hid it once, and this
// test waited 60 s for a build nobody drained).
static_assert(RefreshesModulesBetweenTables<SlowTablesUnwinder>);
static_assert(!RefreshesModules<SlowTablesUnwinder>);

TEST(ProfilerTest, RingsAreDrainedWhileTablesAreBuiltAndStopEndsTheBuild) {
  using SlowTablesProfiler =
      Profiler<SlowTablesUnwinder, DefaultSampleRing, CpuTimeProvider>;
  Options options = TestOptions("slow_tables");
  options.cpu_period = absl::Milliseconds(1);
  options.export_period = absl::ZeroDuration();  // the collector alone builds
  SlowTablesProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  int64_t measured = 0, outer = 0;  // inside / around the registration
  constexpr int kChunks = 80;
  {
    const int64_t outer0 = ThreadCpuNow();
    auto self = profiler.RegisterThread("main");
    const int64_t t0 = ThreadCpuNow();
    for (int i = 1; i <= kChunks; ++i) {
      BurnCpu(5'000'000);
      // One table, and the drain after it, per 5 ms of CPU (~5 samples at
      // 1 ms: the ring holds hundreds). 60 s: a hang check.
      SlowTablesUnwinder::allowed = i;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (SlowTablesUnwinder::drained.load() < i &&
             std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      ASSERT_GE(SlowTablesUnwinder::drained.load(), i) << "no table built";
    }
    measured = ThreadCpuNow() - t0;
    self.Reset();
    outer = ThreadCpuNow() - outer0;
  }
  SlowTablesUnwinder::released = true;
  ASSERT_TRUE(profiler.Stop().ok());
  // The build was under way during the whole burn, and Stop() ended it.
  EXPECT_TRUE(SlowTablesUnwinder::stopped_early.load())
      << "tables built: " << SlowTablesUnwinder::built.load();
  EXPECT_EQ(SlowTablesUnwinder::calls.load(), 1);  // one build, resumed never

  const ProfilerStats stats = profiler.stats();
  EXPECT_EQ(stats.samples_dropped, 0u);
  // 400 ms of CPU at 1 ms: >= 399 sample points, taken one per signal with
  // the perf engine, or with the timer engine one signal per scheduler
  // tick the thread runs at (>= 1 per 10 ms of its CPU at HZ >= 100):
  // >= 39 samples, all recorded by drains between tables (it asserted
  // > 30, below what it computed).
  EXPECT_GE(stats.samples_recorded, static_cast<uint64_t>(measured / 10'000'000 - 1));
  auto profile = ReadPprofFile(options.output);
  ASSERT_TRUE(profile.ok()) << profile.status();
  const int cpu = profile->ValueIndex("cpu-time");
  auto flat = profile->FlatByFunction(cpu);
  EXPECT_EQ(flat["[inprof: samples dropped, ring full]"], 0);
  // The points crossed, a period apart: within one period of the thread's
  // registered CPU, between what it measured inside and around its
  // registration (deterministic; it allowed 1% by hand for the calls
  // around `measured`).
  const int64_t period = absl::ToInt64Nanoseconds(options.cpu_period);
  EXPECT_GT(profile->Total(cpu), measured - period);
  EXPECT_LT(profile->Total(cpu), outer + period);
}

TEST(ProfilerTest, InvalidOptionsMakeStartFailWithoutCrashing) {
  Options options = TestOptions("invalid");
  options.cpu_period = absl::Microseconds(1);
  DefaultProfiler profiler(options);
  absl::Status s = profiler.Start();
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("cpu_period"));
  auto self = profiler.RegisterThread("main");
  EXPECT_TRUE(profiler.Stop().ok());
}

}  // namespace
}  // namespace inprof
