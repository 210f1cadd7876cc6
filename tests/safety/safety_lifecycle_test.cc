// Safety of the profiler's life cycle in the host process:
//   - foreign SIGPROF handlers (plain, SA_SIGINFO, SIG_IGN, installed while
//     running) and threads that block SIGPROF;
//   - start/stop hammered with signals in flight: never "Profiling timer
//     expired", and a harmless handler stays after Stop;
//   - the kill switch INPROF_ENABLED=0 read by Options::FromEnv(): no thread,
//     POSIX timer, signal handler, fd or file is created;
//   - overload: a stalled collector and full rings; the drops are counted
//     and the totals reconcile in the profile as `go tool pprof` shows it.
//
// Tests that change the process's SIGPROF disposition run in a forked child
// (safety::RunInChild), so each starts from a known disposition.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inprof/inprof.h"
#include "inprof/pprof_reader.h"
#include "safety/safety_util.h"
#include "util/test_util.h"

namespace inprof {
namespace {

using ::testing::HasSubstr;

Options SafetyOptions(const std::string& name) {
  Options options;
  options.output = testing::TestTmpDir() + "/safety_" + name + ".pb.gz";
  options.cpu_period = absl::Milliseconds(1);
  std::remove(options.output.c_str());
  return options;
}

// Turns wall-time sampling off where the profiler has it, so that sample
// counts are CPU samples only.
template <typename O>
void CpuOnly(O& options) {
  if constexpr (requires { options.wall_period; }) {
    options.wall_period = absl::ZeroDuration();
  }
}

bool HandlerIsDefault() {
  struct sigaction sa;
  sigaction(SIGPROF, nullptr, &sa);
  return (sa.sa_flags & SA_SIGINFO) == 0 && sa.sa_handler == SIG_DFL;
}

// --- 8. foreign handlers ----------------------------------------------------

std::atomic<int> g_app_handler_calls{0};
void AppHandler(int) { ++g_app_handler_calls; }
void AppSigInfoHandler(int, siginfo_t*, void*) { ++g_app_handler_calls; }

TEST(SafetyLifecycleTest, ForeignHandlerMakesStartFailAndIsLeftInPlace) {
  for (const bool siginfo : {false, true}) {
    SCOPED_TRACE(siginfo ? "SA_SIGINFO handler" : "plain handler");
    EXPECT_EQ(safety::RunInChild(
                  [siginfo]() -> int {
                    struct sigaction app {};
                    if (siginfo) {
                      app.sa_sigaction = &AppSigInfoHandler;
                      app.sa_flags = SA_SIGINFO;
                    } else {
                      app.sa_handler = &AppHandler;
                    }
                    sigaction(SIGPROF, &app, nullptr);
                    DefaultProfiler profiler(SafetyOptions("foreign"));
                    const absl::Status s = profiler.Start();
                    if (s.ok()) return 1;
                    if (s.code() != absl::StatusCode::kFailedPrecondition) return 2;
                    if (std::string(s.message()).find("SIGPROF") ==
                        std::string::npos) {
                      return 3;
                    }
                    auto self = profiler.RegisterThread("main");
                    safety::BurnCpu(20'000'000);
                    // The application still owns SIGPROF and gets it.
                    struct sigaction now;
                    sigaction(SIGPROF, nullptr, &now);
                    if (siginfo ? now.sa_sigaction != app.sa_sigaction
                                : now.sa_handler != app.sa_handler) {
                      return 4;
                    }
                    raise(SIGPROF);
                    if (g_app_handler_calls.load() != 1) return 5;
                    if (!profiler.Stop().ok()) return 6;
                    return 0;
                  },
                  30),
              0);
  }
}

// SIG_IGN is not a handler: inprof takes SIGPROF over (its handler ignores
// signals it did not send, as SIG_IGN did), and keeps it after Stop.
TEST(SafetyLifecycleTest, IgnoredSigprofIsTakenOverAndStillIgnoresForeignSignals) {
  EXPECT_EQ(safety::RunInChild(
                []() -> int {
                  signal(SIGPROF, SIG_IGN);
                  Options options = SafetyOptions("sig_ign");
                  DefaultProfiler profiler(options);
                  if (!profiler.Start().ok()) return 1;
                  auto self = profiler.RegisterThread("main");
                  kill(getpid(), SIGPROF);  // still ignored: no death
                  safety::BurnCpu(50'000'000);
                  self.Reset();
                  if (!profiler.Stop().ok()) return 2;
                  if (profiler.stats().samples_taken == 0) return 3;
                  if (HandlerIsDefault()) return 4;
                  kill(getpid(), SIGPROF);
                  return 0;
                },
                30),
            0);
}

// An application that installs its own SIGPROF handler while inprof runs
// takes the timers' signals; nothing crashes, Stop works, and a later
// Start() refuses with a clear status.
TEST(SafetyLifecycleTest, HandlerReplacedWhileRunning) {
  EXPECT_EQ(safety::RunInChild(
                []() -> int {
                  DefaultProfiler profiler(SafetyOptions("replaced"));
                  if (!profiler.Start().ok()) return 1;
                  auto self = profiler.RegisterThread("main");
                  safety::BurnCpu(20'000'000);
                  struct sigaction app {};
                  app.sa_sigaction = &AppSigInfoHandler;
                  app.sa_flags = SA_SIGINFO | SA_RESTART;
                  sigaction(SIGPROF, &app, nullptr);
                  safety::BurnCpu(50'000'000);
                  if (g_app_handler_calls.load() == 0) return 2;
                  self.Reset();
                  if (!profiler.Stop().ok()) return 3;
                  const absl::Status again = profiler.Start();
                  if (again.ok()) return 4;
                  if (std::string(again.message()).find("SIGPROF") ==
                      std::string::npos) {
                    return 5;
                  }
                  struct sigaction now;
                  sigaction(SIGPROF, nullptr, &now);
                  if (now.sa_sigaction != &AppSigInfoHandler) return 6;
                  return 0;
                },
                30),
            0);
}

// A thread that blocks SIGPROF piles up pending timer signals; Stop() does
// not wait for it, and when it unblocks after Stop the late signal is
// ignored. It blocks it after registering (RegisterThread unblocks SIGPROF
// in a thread that blocks it: ProfilerTest).
TEST(SafetyLifecycleTest, ThreadBlockingSigprofNeitherHangsStopNorDies) {
  DefaultProfiler profiler(SafetyOptions("blocked_sigprof"));
  ASSERT_TRUE(profiler.Start().ok());
  std::atomic<int> phase{0};
  uint64_t taken = 0;
  std::thread t([&] {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPROF);
    auto registration = profiler.RegisterThread("blocks-sigprof");
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    const uint64_t before = internal::CurrentThreadSlot()->samples_taken.load();
    safety::BurnCpu(50'000'000);
    safety::SendProfilingSignal(safety::Gettid(), true);  // pending too
    taken = internal::CurrentThreadSlot()->samples_taken.load() - before;
    phase = 1;
    while (phase.load() != 2) std::this_thread::yield();
    pthread_sigmask(SIG_UNBLOCK, &set, nullptr);  // after Stop
    safety::BurnCpu(5'000'000);
  });
  while (phase.load() != 1) std::this_thread::yield();
  {
    safety::Watchdog watchdog(absl::Seconds(30), "Stop with SIGPROF blocked");
    ASSERT_TRUE(profiler.Stop().ok());
  }
  phase = 2;
  t.join();
  EXPECT_EQ(taken, 0u);
}

// --- 9. start/stop hammer ---------------------------------------------------

// A tmpfs directory for the many profiles the hammer writes.
std::string FastDir() {
  const std::string shm = "/dev/shm/inprof-safety-" + std::to_string(getpid());
  if (mkdir(shm.c_str(), 0700) == 0 || errno == EEXIST) return shm;
  return testing::TestTmpDir();
}

TEST(SafetyLifecycleTest, StartStopHammerWithSignalsInFlight) {
  // Each Stop() writes a profile (~1 ms on tmpfs without symbolization);
  // 2,000 cycles in CI, 10,000 with INPROF_SAFETY_FULL=1.
  const int cycles = static_cast<int>(safety::Scaled(2'000, 10'000));
  safety::Watchdog watchdog(absl::Minutes(safety::FullRun() ? 15 : 4),
                            "start/stop hammer");
  const std::string dir = FastDir();
  Options options = SafetyOptions("hammer");
  options.output = dir + "/hammer.pb.gz";
  options.symbolize = false;
  safety::ProbedProfiler profiler(options);
  std::atomic<bool> stop{false};
  std::atomic<pid_t> tids[2] = {};
  // The signallers start once the first Start() installed inprof's handler
  // (Stop() leaves a harmless one): before it, SIGPROF's default action
  // would end the process, as it did when this test ran alone.
  std::atomic<bool> armed{false};
  auto wait_armed = [&] {
    while (!armed.load() && !stop.load()) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  };
  std::vector<std::thread> threads;
  // On two cores, signal sources that leave the controlling thread CPU:
  // a burner under the 1 ms timer, a thread that signals itself in bursts,
  // and one that sends both kinds of SIGPROF to the other two.
  threads.emplace_back([&] {
    auto registration = profiler.RegisterThread("burner");
    tids[0] = safety::Gettid();
    while (!stop.load()) safety::BurnCpu(1'000'000);
  });
  threads.emplace_back([&] {
    auto registration = profiler.RegisterThread("self-signaller");
    tids[1] = safety::Gettid();
    wait_armed();
    while (!stop.load()) {
      for (int i = 0; i < 50; ++i) {
        safety::SendProfilingSignal(safety::Gettid(), true);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  threads.emplace_back([&] {
    uint64_t i = 0;
    wait_armed();
    while (!stop.load()) {
      const pid_t tid = tids[i % 2].load();
      if (tid != 0) safety::SendProfilingSignal(tid, (i & 4) == 0);
      if (++i % 8 == 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
  });
  const int64_t t0 = safety::MonotonicNow();
  int failed = 0;
  for (int i = 0; i < cycles; ++i) {
    failed += !profiler.Start().ok();
    armed = true;
    failed += !profiler.Stop().ok();
  }
  const double seconds = (safety::MonotonicNow() - t0) / 1e9;
  stop = true;
  for (auto& t : threads) t.join();
  std::printf("safety_hammer: %d start/stop cycles in %.1f s, %llu samples, "
              "%llu profiles written\n",
              cycles, seconds,
              static_cast<unsigned long long>(profiler.stats().samples_taken),
              static_cast<unsigned long long>(profiler.stats().profiles_written));
  EXPECT_EQ(failed, 0);
  EXPECT_EQ(profiler.stats().profiles_written, static_cast<uint64_t>(cycles));
  EXPECT_GT(profiler.stats().samples_taken, 0u);
  // After Stop a harmless handler remains: a late or foreign SIGPROF is
  // ignored instead of terminating the process.
  EXPECT_FALSE(HandlerIsDefault());
  raise(SIGPROF);
  safety::SendProfilingSignal(safety::Gettid(), true);
  std::remove(options.output.c_str());
  if (dir != testing::TestTmpDir()) rmdir(dir.c_str());
}

// --- 11. kill switch --------------------------------------------------------

struct Footprint {
  int threads, timers, fds;
  bool default_handler;
};
Footprint MeasureFootprint() {
  return {safety::CountThreads(), safety::CountPosixTimers(),
          safety::CountFds(), HandlerIsDefault()};
}

// Runs a whole profiling session configured by FromEnv() with
// INPROF_ENABLED=`enabled`; returns the footprint seen while it ran.
Footprint SessionFootprint(const char* enabled, const std::string& output,
                           bool* wrote_file) {
  setenv("INPROF_ENABLED", enabled, 1);
  setenv("INPROF_OUTPUT", output.c_str(), 1);
  setenv("INPROF_CPU_PERIOD", "1ms", 1);
  Footprint during{};
  {
    DefaultProfiler profiler(Options::FromEnv());
    ScopedProfiler running(profiler);
    auto self = profiler.RegisterThread("main");
    std::thread worker([&] {
      auto registration = profiler.RegisterThread("worker");
      safety::BurnCpu(20'000'000);
      during = MeasureFootprint();
    });
    worker.join();
    safety::BurnCpu(20'000'000);
  }
  *wrote_file = access(output.c_str(), F_OK) == 0;
  return during;
}

// Creates and joins one thread, so that threads a runtime starts with the
// first pthread_create (TSan's background thread) exist before counting.
void StartRuntimeThreads() { std::thread([] {}).join(); }

TEST(SafetyLifecycleTest, KillSwitchFromEnvironmentCreatesNothing) {
  if (safety::kTsan) {
    GTEST_SKIP() << "runs each case in a forked child; TSan does not support "
                    "fork() in a multi-threaded process";
  }
  if (safety::CountPosixTimers() < 0) {
    GTEST_SKIP() << "/proc/self/timers missing (CONFIG_CHECKPOINT_RESTORE)";
  }
  const std::string output = testing::TestTmpDir() + "/safety_killswitch.pb.gz";
  for (const char* value : {"0", "false", "OFF", " no "}) {
    SCOPED_TRACE(std::string("INPROF_ENABLED='") + value + "'");
    std::remove(output.c_str());
    EXPECT_EQ(safety::RunInChild(
                  [&]() -> int {
                    signal(SIGPROF, SIG_DFL);  // the parent's is inherited
                    StartRuntimeThreads();
                    const Footprint before = MeasureFootprint();
                    bool wrote = false;
                    const Footprint during =
                        SessionFootprint(value, output, &wrote);
                    const Footprint after = MeasureFootprint();
                    // +1 thread: the worker measuring itself.
                    if (during.threads != before.threads + 1) return 1;
                    if (during.timers != before.timers) return 2;
                    if (!during.default_handler || !after.default_handler) return 3;
                    if (during.fds != before.fds || after.fds != before.fds) return 4;
                    if (wrote) return 5;
                    if (after.threads != before.threads) return 6;
                    return 0;
                  },
                  30),
              0);
  }
  // Control: the same session enabled creates what the switch prevents.
  std::remove(output.c_str());
  EXPECT_EQ(safety::RunInChild(
                [&]() -> int {
                  signal(SIGPROF, SIG_DFL);
                  StartRuntimeThreads();
                  const Footprint before = MeasureFootprint();
                  bool wrote = false;
                  const Footprint during = SessionFootprint("1", output, &wrote);
                  if (during.threads <= before.threads + 1) return 1;  // collector
                  // Two threads: a perf event or a timer each.
                  if (during.timers + during.fds < before.timers + before.fds + 2) {
                    return 2;
                  }
                  if (during.default_handler) return 3;
                  if (!wrote) return 4;
                  return 0;
                },
                30),
            0);
}

// --- 12. overload -----------------------------------------------------------

TEST(SafetyLifecycleTest, OverloadDropsAreCountedAndReconcileInPprof) {
  using TinyRingProfiler =
      Profiler<FramePointerUnwinder, SpscRecordRing<64>, CpuTimeProvider,
               safety::ProbeProvider>;
  Options options = SafetyOptions("overload");
  CpuOnly(options);
  options.collect_period = absl::Seconds(10);  // the collector stalls
  TinyRingProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  int64_t measured = 0, outer = 0;  // inside / around the registration
  {
    const int64_t outer0 = safety::ThreadCpuNow();
    auto self = profiler.RegisterThread("main");
    const int64_t t0 = safety::ThreadCpuNow();
    // The CPU provider gives ~300 samples in 300 ms; 3,000 probe samples
    // (self-signals) overflow the 64-word ring many times over.
    const pid_t tid = safety::Gettid();
    for (int i = 0; i < 3'000; ++i) {
      safety::SendProfilingSignal(tid, true, /*provider=*/1);
    }
    safety::BurnCpu(300'000'000);
    measured = safety::ThreadCpuNow() - t0;
    self.Reset();
    outer = safety::ThreadCpuNow() - outer0;
  }
  ASSERT_TRUE(profiler.Stop().ok());
  const ProfilerStats stats = profiler.stats();
  EXPECT_GT(stats.samples_dropped, 2'000u);
  EXPECT_EQ(stats.samples_taken, stats.samples_recorded + stats.samples_dropped);

  // The profile as pprof reads it: sample counts (the CPU provider's and
  // the probe's) reconcile with the comment.
  auto profile = ReadPprofFile(options.output);
  ASSERT_TRUE(profile.ok()) << profile.status();
  const int count = profile->ValueIndex("cpu-samples");
  const int probes = profile->ValueIndex("probe-samples");
  const int cpu = profile->ValueIndex("cpu-time");
  ASSERT_GE(count, 0);
  ASSERT_GE(probes, 0);
  const std::string kDropped = "[inprof: samples dropped, ring full]";
  int64_t dropped_in_profile = 0;
  for (const int index : {count, probes}) {
    const auto flat = profile->FlatByFunction(index);
    if (flat.contains(kDropped)) dropped_in_profile += flat.at(kDropped);
  }
  EXPECT_EQ(profile->Total(count) + profile->Total(probes),
            static_cast<int64_t>(stats.samples_taken));
  EXPECT_EQ(dropped_in_profile, static_cast<int64_t>(stats.samples_dropped));
  // Dropped samples keep their CPU: the total is the period times the
  // points the thread's CPU crossed, within one period of its registered
  // CPU, deterministically (it was +-10%, by hand).
  const int64_t period = absl::ToInt64Nanoseconds(options.cpu_period);
  EXPECT_GT(profile->Total(cpu), measured - period);
  EXPECT_LT(profile->Total(cpu), outer + period);

  INPROF_REQUIRE_TOOL("go");
  auto comments = testing::GoPprof("-comments " + options.output);
  ASSERT_TRUE(comments.ok()) << comments.status();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      *comments, m,
      std::regex(R"(samples taken=(\d+) recorded=(\d+) dropped=(\d+))")))
      << *comments;
  const uint64_t taken = std::stoull(m[1]), recorded = std::stoull(m[2]),
                 dropped = std::stoull(m[3]);
  EXPECT_EQ(taken, recorded + dropped) << *comments;
  EXPECT_EQ(taken, stats.samples_taken);
  EXPECT_EQ(dropped, stats.samples_dropped);
  // And pprof's own sum of the sample counts agrees with the comment.
  auto raw = testing::ReadWithGoPprofRaw(options.output);
  ASSERT_TRUE(raw.ok()) << raw.status();
  int64_t pprof_count = 0, pprof_dropped = 0;
  for (const auto& s : *raw) {
    const int64_t n = s.values.at(static_cast<size_t>(count)) +
                      s.values.at(static_cast<size_t>(probes));
    pprof_count += n;
    if (!s.stack.empty() && s.stack[0] == kDropped) pprof_dropped += n;
  }
  EXPECT_EQ(pprof_count, static_cast<int64_t>(taken));
  EXPECT_EQ(pprof_dropped, static_cast<int64_t>(dropped));
  std::printf("safety_overload: taken=%llu recorded=%llu dropped=%llu; pprof "
              "sums %lld samples, %lld under the dropped frame\n",
              static_cast<unsigned long long>(taken),
              static_cast<unsigned long long>(recorded),
              static_cast<unsigned long long>(dropped),
              static_cast<long long>(pprof_count),
              static_cast<long long>(pprof_dropped));
}

}  // namespace
}  // namespace inprof
