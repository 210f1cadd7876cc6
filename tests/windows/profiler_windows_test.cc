// The Windows profiler end to end, under Wine: DefaultProfiler on known
// work, the profile read back with inprof's reader. Checks what a user reads:
// where the CPU went per function and per thread against the threads' own
// clocks, complete stacks through code without frame pointers, wall time
// and its thread states, labels, and that threads that exit or register
// while sampled cost nothing but a count.
#include "inprof/profiler.h"

#include <windows.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inprof/inprof.h"
#include "inprof/pprof_reader.h"
#include "windows_workload.h"

namespace inprof {
namespace {

using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() /
                   absl::StrCat("inprof-windows-test-", GetCurrentProcessId());
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

Options TestOptions(const std::string& output) {
  Options options;
  options.output = output;
  options.export_period = absl::ZeroDuration();  // one profile at Stop()
  return options;
}

// The share (percent) of `part` in `total`.
double Share(int64_t part, int64_t total) {
  return total > 0 ? 100.0 * static_cast<double>(part) / static_cast<double>(total) : 0;
}

// Sum of `index` over samples with a frame containing `function` (the
// workload reads its thread's clock in a system call now and then: its
// leaf frames are the Spin functions' and the system's).
int64_t FunctionTotal(const DecodedProfile& p, int index, const std::string& function) {
  int64_t sum = 0;
  for (const auto& s : p.samples) {
    if (std::any_of(s.stack.begin(), s.stack.end(),
                    [&](const std::string& f) { return absl::StrContains(f, function); })) {
      sum += s.values[index];
    }
  }
  return sum;
}

// A thread's CPU in the profile is the sample points (one period P =
// 10 ms apart) its clock crossed while registered; GetThreadTimes counts
// in quanta Q (15.625 ms on Windows, 10 ms under Wine), so the clock read
// at arming and at unregistration may each be a quantum off the ones the
// thread read around its work. Deterministic bound: 2 Q + P.
constexpr int64_t kThreadClockBound = 2 * 15'625'000 + 10'000'000;

TEST(ProfilerWindowsTest, CpuPerFunctionAndThreadMatchesTheThreadsClocks) {
  const std::string path = TempPath("shares.pb.gz");
  std::atomic<int64_t> cpu_a{0}, cpu_b{0}, cpu_c{0};
  {
    DefaultProfiler profiler(TestOptions(path));
    ASSERT_TRUE(profiler.Start().ok());
    // One function per thread: where one thread moves from one function to
    // the next, the sampler (a thread of its own, late on a loaded
    // machine) credits the points crossed before its visit to where it
    // finds the thread, so a boundary inside a thread moves by an amount
    // nothing bounds.
    std::thread a([&] {
      auto registration = profiler.RegisterThread("thread-a");
      ASSERT_TRUE(registration.active()) << registration.status();
      const int64_t start = testing::ThreadCpuNanos();
      testing::BurnA(600'000'000);
      cpu_a = testing::ThreadCpuNanos() - start;
    });
    std::thread b([&] {
      auto registration = profiler.RegisterThread("thread-b");
      const int64_t start = testing::ThreadCpuNanos();
      testing::BurnB(300'000'000);
      cpu_b = testing::ThreadCpuNanos() - start;
    });
    std::thread c([&] {
      auto registration = profiler.RegisterThread("thread-c");
      const int64_t start = testing::ThreadCpuNanos();
      testing::BurnC(300'000'000);
      cpu_c = testing::ThreadCpuNanos() - start;
    });
    a.join();
    b.join();
    c.join();
    ASSERT_TRUE(profiler.Stop().ok());
  }
  auto p = ReadPprofFile(path);
  ASSERT_TRUE(p.ok()) << p.status();
  const int cpu = p->ValueIndex("cpu-time");
  ASSERT_GE(cpu, 0);
  const int64_t total = p->Total(cpu);
  const auto by_thread = p->ByLabel("thread name", cpu);
  ASSERT_TRUE(by_thread.contains("thread-a") && by_thread.contains("thread-b") &&
              by_thread.contains("thread-c"));
  EXPECT_NEAR(by_thread.at("thread-a"), cpu_a.load(), kThreadClockBound);
  EXPECT_NEAR(by_thread.at("thread-b"), cpu_b.load(), kThreadClockBound);
  EXPECT_NEAR(by_thread.at("thread-c"), cpu_c.load(), kThreadClockBound);
  // Per function, the share of what the threads spent there. Each thread
  // within e = 2 Q + P, the three together within 3e, so a share m / M
  // moves by at most (e M + m 3e) / (M (M - 3e)) -- 9.6 points for SpinA,
  // 6.7 for SpinB and SpinC with Windows' quantum: deterministic. (Within
  // a thread, the points the sampler finds outside the Spin function --
  // microseconds of its start and end -- are not counted.)
  const int64_t measured = cpu_a + cpu_b + cpu_c;
  std::printf("clocks a/b/c %.3f/%.3f/%.3f s, profile %.3f/%.3f/%.3f s\n", cpu_a / 1e9,
              cpu_b / 1e9, cpu_c / 1e9, by_thread.at("thread-a") / 1e9,
              by_thread.at("thread-b") / 1e9, by_thread.at("thread-c") / 1e9);
  const double e = static_cast<double>(kThreadClockBound);
  const double m_total = static_cast<double>(measured);
  auto bound = [&](int64_t m) {
    return 100.0 * (e * m_total + static_cast<double>(m) * 3 * e) /
           (m_total * (m_total - 3 * e));
  };
  const std::array<std::pair<const char*, int64_t>, 3> functions{
      {{"SpinA", cpu_a.load()}, {"SpinB", cpu_b.load()}, {"SpinC", cpu_c.load()}}};
  for (const auto& [function, clock] : functions) {
    const double got = Share(FunctionTotal(*p, cpu, function), total);
    const double want = Share(clock, measured);
    std::printf("%s %.1f%% (clock %.1f%%, bound %.1f points)\n", function, got, want,
                bound(clock));
    EXPECT_NEAR(got, want, bound(clock)) << function;
  }
  EXPECT_THAT(p->comments, ::testing::Contains(HasSubstr("cpu engine=thread-times")));
}

TEST(ProfilerWindowsTest, StacksAreCompleteThroughCodeWithoutFramePointers) {
  const std::string path = TempPath("stacks.pb.gz");
  {
    DefaultProfiler profiler(TestOptions(path));
    ASSERT_TRUE(profiler.Start().ok());
    std::thread t([&] {
      auto registration = profiler.RegisterThread("deep");
      testing::BurnDeep(40, 400'000'000);
    });
    t.join();
    ASSERT_TRUE(profiler.Stop().ok());
  }
  auto p = ReadPprofFile(path);
  ASSERT_TRUE(p.ok()) << p.status();
  const int cpu = p->ValueIndex("cpu-samples");
  int64_t in_spin = 0, complete = 0;
  std::string incomplete;  // the first incomplete stack, for the message
  for (const auto& s : p->samples) {
    // From SpinA (the leaf, or under the clock read's system frames) out.
    auto spin = std::find_if(s.stack.begin(), s.stack.end(),
                             [](const std::string& f) { return absl::StrContains(f, "SpinA"); });
    if (spin == s.stack.end()) continue;
    in_spin += s.values[cpu];
    // Then Inner, Middle, Outer, 41 x Recurse, the thread's lambda and
    // the system's thread start.
    std::vector<std::string> want = {"WorkloadInner", "WorkloadMiddle", "WorkloadOuter"};
    for (int i = 0; i <= 40; ++i) want.push_back("WorkloadRecurse");
    want.push_back("BaseThreadInitThunk");
    size_t at = 0;
    for (auto f = spin + 1; f != s.stack.end() && at < want.size(); ++f) {
      if (absl::StrContains(*f, want[at])) ++at;
    }
    if (at == want.size()) {
      complete += s.values[cpu];
    } else if (incomplete.empty()) {
      incomplete = absl::StrJoin(s.stack, " <- ");
    }
  }
  ASSERT_GT(in_spin, 10);
  EXPECT_GE(Share(complete, in_spin), 99.0)
      << complete << " of " << in_spin << " samples in SpinA have the whole chain; one that "
      << "has not: " << incomplete;
}

TEST(ProfilerWindowsTest, WallTimeCoversSleepingAndRunningThreads) {
  const std::string path = TempPath("wall.pb.gz");
  int64_t wall_ns = 0;
  {
    Options options = TestOptions(path);
    DefaultProfiler profiler(options);
    ASSERT_TRUE(profiler.Start().ok());
    const int64_t start = internal::MonotonicNanos();
    std::thread sleeper([&] {
      auto registration = profiler.RegisterThread("sleeper");
      Sleep(600);
    });
    std::thread spinner([&] {
      auto registration = profiler.RegisterThread("spinner");
      testing::BurnA(300'000'000);
    });
    sleeper.join();
    spinner.join();
    wall_ns = internal::MonotonicNanos() - start;
    ASSERT_TRUE(profiler.Stop().ok());
  }
  auto p = ReadPprofFile(path);
  ASSERT_TRUE(p.ok()) << p.status();
  const int wall = p->ValueIndex("wall-time");
  ASSERT_GE(wall, 0);
  const auto by_thread = p->ByLabel("thread name", wall);
  // Each thread's wall time is its registration's span: within 10% of the
  // 600 ms sleep (thread start and exit add a few ms) and at most the run.
  ASSERT_TRUE(by_thread.contains("sleeper"));
  EXPECT_GT(by_thread.at("sleeper"), 540'000'000);
  EXPECT_LT(by_thread.at("sleeper"), wall_ns + 20'000'000);
  // The sleeper's wall time is in Sleep's stack and blocked; the spinner's
  // mostly running, in SpinA.
  int64_t sleeper_blocked = 0, sleeper_total = 0;
  for (const auto& s : p->samples) {
    auto name = s.str_labels.find("thread name");
    if (name == s.str_labels.end() || name->second != "sleeper") continue;
    sleeper_total += s.values[wall];
    auto state = s.str_labels.find("thread state");
    const bool in_sleep = std::any_of(s.stack.begin(), s.stack.end(), [](const std::string& f) {
      return absl::StrContains(f, "Sleep");
    });
    if (state != s.str_labels.end() && state->second == "blocked" && in_sleep) {
      sleeper_blocked += s.values[wall];
    }
  }
  EXPECT_GE(Share(sleeper_blocked, sleeper_total), 90.0);
  EXPECT_GE(Share(FunctionTotal(*p, wall, "SpinA"), by_thread.at("spinner")), 80.0);
}

// Past CpuTimeProvider::kIdleVisitsPerTick registered threads the sampler
// reads only some idle ones a tick: a thread that starts running among 100
// idle ones is still found, its CPU exact and on its own stack.
TEST(ProfilerWindowsTest, ABusyThreadAmongManyIdleOnesKeepsItsCpu) {
  const std::string path = TempPath("many.pb.gz");
  std::atomic<int64_t> busy_cpu{0};
  {
    DefaultProfiler profiler(TestOptions(path));
    ASSERT_TRUE(profiler.Start().ok());
    HANDLE stop = CreateEventA(nullptr, TRUE, FALSE, nullptr);
    std::vector<std::thread> idle;
    for (int i = 0; i < 100; ++i) {
      idle.emplace_back([&] {
        auto registration = profiler.RegisterThread("idle");
        WaitForSingleObject(stop, INFINITE);
      });
    }
    std::thread busy([&] {
      auto registration = profiler.RegisterThread("busy");
      Sleep(100);  // registered, idle, visited round-robin for a while
      const int64_t start = testing::ThreadCpuNanos();
      testing::BurnA(400'000'000);
      busy_cpu = testing::ThreadCpuNanos() - start;
    });
    busy.join();
    SetEvent(stop);
    for (auto& t : idle) t.join();
    CloseHandle(stop);
    ASSERT_TRUE(profiler.Stop().ok());
  }
  auto p = ReadPprofFile(path);
  ASSERT_TRUE(p.ok()) << p.status();
  const int cpu = p->ValueIndex("cpu-time");
  const auto by_thread = p->ByLabel("thread name", cpu);
  ASSERT_TRUE(by_thread.contains("busy"));
  EXPECT_NEAR(by_thread.at("busy"), busy_cpu.load(), kThreadClockBound)
      << absl::StrJoin(p->comments, "; ");
  // Found within 100 / 32 ticks: at most ~4 ticks of its CPU on the stack
  // it was found at, which is SpinA's too.
  EXPECT_GE(Share(FunctionTotal(*p, cpu, "SpinA"), by_thread.at("busy")), 95.0);
}

TEST(ProfilerWindowsTest, LabelsReachTheSamplesOfTheirScope) {
  const std::string path = TempPath("labels.pb.gz");
  {
    DefaultProfiler profiler(TestOptions(path));
    ASSERT_TRUE(profiler.Start().ok());
    std::thread t([&] {
      auto registration = profiler.RegisterThread("labelled");
      {
        ScopedLabels labels(profiler, {{"phase", "first"}, {"request", 7}});
        testing::BurnA(200'000'000);
      }
      ScopedLabels labels(profiler, {{"phase", "second"}});
      testing::BurnB(200'000'000);
    });
    t.join();
    ASSERT_TRUE(profiler.Stop().ok());
  }
  auto p = ReadPprofFile(path);
  ASSERT_TRUE(p.ok()) << p.status();
  const int cpu = p->ValueIndex("cpu-time");
  int64_t a_first = 0, a_total = 0, b_second = 0, b_total = 0;
  auto on_stack = [](const DecodedProfile::Sample& s, const char* function) {
    return std::any_of(s.stack.begin(), s.stack.end(), [&](const std::string& f) {
      return absl::StrContains(f, function);
    });
  };
  for (const auto& s : p->samples) {
    auto phase = s.str_labels.find("phase");
    const std::string value = phase == s.str_labels.end() ? "" : phase->second;
    if (on_stack(s, "SpinA")) {
      a_total += s.values[cpu];
      if (value == "first" && s.num_labels.contains("request")) a_first += s.values[cpu];
    } else if (on_stack(s, "SpinB")) {
      b_total += s.values[cpu];
      if (value == "second" && !s.num_labels.contains("request")) b_second += s.values[cpu];
    }
  }
  std::string some_stacks;  // for the message
  for (size_t i = 0; i < p->samples.size() && i < 4; ++i) {
    absl::StrAppend(&some_stacks, "\n  ", absl::StrJoin(p->samples[i].stack, " <- "));
  }
  EXPECT_GT(a_total, 0) << absl::StrJoin(p->comments, "; ") << some_stacks;
  EXPECT_GT(b_total, 0) << absl::StrJoin(p->comments, "; ") << some_stacks;
  if (a_total == 0 || b_total == 0) return;
  // A sample straddling the scope's end may carry the other phase's labels.
  EXPECT_GE(Share(a_first, a_total), 90.0);
  EXPECT_GE(Share(b_second, b_total), 90.0);
}

TEST(ProfilerWindowsTest, ThreadsThatComeAndGoWhileSampledAreNeverAProblem) {
  const std::string path = TempPath("churn.pb.gz");
  ProfilerStats stats;
  {
    Options options = TestOptions(path);
    options.cpu_period = absl::Milliseconds(1);  // as many ticks as it takes
    options.wall_period = absl::Milliseconds(1);
    DefaultProfiler profiler(options);
    ASSERT_TRUE(profiler.Start().ok());
    std::atomic<bool> stop{false};
    std::thread spinner([&] {
      auto registration = profiler.RegisterThread("steady");
      while (!stop) testing::BurnA(20'000'000);
    });
    // 200 short threads: each registers, spins ~2 ms and exits, some
    // without unregistering first (their registration dies after them).
    std::vector<ThreadRegistration> late;
    std::mutex late_mutex;
    for (int round = 0; round < 20; ++round) {
      std::vector<std::thread> threads;
      for (int i = 0; i < 10; ++i) {
        threads.emplace_back([&, i] {
          auto registration = profiler.RegisterThread(absl::StrCat("short-", i));
          testing::BurnB(2'000'000);
          if (i % 2 == 0) {
            std::lock_guard<std::mutex> lock(late_mutex);
            late.push_back(std::move(registration));
          }
        });
      }
      for (auto& t : threads) t.join();
      std::lock_guard<std::mutex> lock(late_mutex);
      late.clear();  // unregistered from another thread, after their exit
    }
    stop = true;
    spinner.join();
    ASSERT_TRUE(profiler.Stop().ok());
    stats = profiler.stats();
  }
  auto p = ReadPprofFile(path);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(stats.threads_registered, 201u);
  EXPECT_GT(stats.samples_taken, 0u);
  // Every sample is accounted for: recorded, or counted as unsuspended
  // (a thread that exited between its pick and its snapshot).
  EXPECT_EQ(stats.samples_recorded, stats.samples_taken);
  EXPECT_EQ(stats.samples_dropped, 0u);
  if (stats.samples_unsuspended > 0) {
    EXPECT_THAT(p->comments, ::testing::Contains(HasSubstr("could not be suspended")));
  }
}

TEST(ProfilerWindowsTest, NeverSuspendsItsOwnThreadsOrUnregisteredOnes) {
  const std::string path = TempPath("own.pb.gz");
  std::atomic<bool> stop{false};
  std::atomic<int64_t> unregistered_cpu{0};
  // An unregistered busy thread: never in the profile.
  std::thread outsider([&] {
    const int64_t start = testing::ThreadCpuNanos();
    while (!stop) testing::BurnC(10'000'000);
    unregistered_cpu = testing::ThreadCpuNanos() - start;
  });
  {
    DefaultProfiler profiler(TestOptions(path));
    ASSERT_TRUE(profiler.Start().ok());
    auto self = profiler.RegisterThread("main");
    testing::BurnA(200'000'000);
    ASSERT_TRUE(profiler.Stop().ok());
  }
  stop = true;
  outsider.join();
  auto p = ReadPprofFile(path);
  ASSERT_TRUE(p.ok()) << p.status();
  const int cpu = p->ValueIndex("cpu-time");
  const auto by_thread = p->ByLabel("thread name", cpu);
  EXPECT_EQ(by_thread.size(), 1u);
  EXPECT_TRUE(by_thread.contains("main"));
  EXPECT_EQ(FunctionTotal(*p, cpu, "SpinC"), 0);
  EXPECT_GT(unregistered_cpu.load(), 0);
}

TEST(ProfilerWindowsTest, UnnamedThreadsTakeTheirDescription) {
  const std::string path = TempPath("names.pb.gz");
  {
    DefaultProfiler profiler(TestOptions(path));
    ASSERT_TRUE(profiler.Start().ok());
    std::thread t([&] {
      internal::SetCurrentThreadName("described-worker");
      auto registration = profiler.RegisterThread("");
      testing::BurnA(100'000'000);
    });
    t.join();
    ASSERT_TRUE(profiler.Stop().ok());
  }
  auto p = ReadPprofFile(path);
  ASSERT_TRUE(p.ok()) << p.status();
  const auto by_thread = p->ByLabel("thread name", p->ValueIndex("cpu-time"));
  EXPECT_TRUE(by_thread.contains("described-worker"));
}

TEST(ProfilerWindowsTest, LinuxOnlyOptionsSayWhyInOneLine) {
  std::vector<std::string> errors;
  Options options = Options::FromLookup(
      [](const char* name) -> const char* {
        if (std::string(name) == "INPROF_AGENT_SOCKET") return "@agent";
        return nullptr;
      },
      &errors);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_THAT(errors[0], HasSubstr("INPROF_AGENT_SOCKET='@agent'"));
  EXPECT_THAT(errors[0], HasSubstr("not available on Windows"));
  EXPECT_TRUE(options.agent_socket.empty());
}

TEST(ProfilerWindowsTest, DisabledProfilerDoesNothing) {
  const std::string path = TempPath("disabled.pb.gz");
  std::filesystem::remove(path);
  Options options = TestOptions(path);
  options.enabled = false;
  DefaultProfiler profiler(options);
  EXPECT_TRUE(profiler.Start().ok());
  auto registration = profiler.RegisterThread("main");
  EXPECT_FALSE(registration.active());
  EXPECT_FALSE(profiler.running());
  EXPECT_TRUE(profiler.Stop().ok());
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(ProfilerWindowsTest, ASecondProfilerIsRefused) {
  DefaultProfiler first(TestOptions(TempPath("first.pb.gz")));
  DefaultProfiler second(TestOptions(TempPath("second.pb.gz")));
  ASSERT_TRUE(first.Start().ok());
  const absl::Status s = second.Start();
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("another inprof profiler"));
  EXPECT_TRUE(first.Stop().ok());
  EXPECT_TRUE(second.Start().ok());
  EXPECT_TRUE(second.Stop().ok());
}

}  // namespace
}  // namespace inprof
