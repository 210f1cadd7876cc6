// Safety across fork and exec while profiling:
//   - 1,000 fork+exec / posix_spawn / fork-and-keep-running iterations while
//     registered threads are sampled at the 1 ms period: no child ever dies
//     of a profiling signal (POSIX timers are not inherited by fork; exec
//     resets the handler to SIG_DFL, and nothing sends the child SIGPROF);
//   - what a forked child that keeps running gets: no timers, no samples, a
//     Stop() that forgets the parent's profiler and writes nothing;
//   - the parent's profiler cannot be restarted in the child (Start() says
//     why); a Profiler constructed in the child works;
//   - a child forked while the collector holds the profiler's locks can still
//     unregister its threads and stop;
//   - a pre-fork server under `inprof run --agent`: every child's profile
//     holds its own work (the child's atfork handlers once closed the
//     child's new agent connection, leaving it an empty profile), and the
//     tool says so of a profile that has no samples;
//   - under ASan, a child inherits no poison from the stacks of inprof's
//     threads (which do not exist in it).
//
// Skipped under TSan: ThreadSanitizer does not support fork() in a
// multi-threaded process (the child inherits its runtime's locks in whatever
// state the other threads left them, and it warns or deadlocks).
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inprof/base/profiler_thread.h"
#include "inprof/base/sanitizers.h"
#include "inprof/inprof.h"
#include "inprof/pprof_reader.h"
#include "safety/safety_util.h"
#include "util/test_util.h"

#if defined(INPROF_ASAN)
#include <pthread.h>
#include <sanitizer/asan_interface.h>
#endif

extern char** environ;

namespace inprof {
namespace {

Options SafetyOptions(const std::string& name) {
  Options options;
  options.output = testing::TestTmpDir() + "/safety_" + name + ".pb.gz";
  options.cpu_period = absl::Milliseconds(1);
  std::remove(options.output.c_str());
  return options;
}

std::string DescribeStatus(int status) {
  if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return std::string("signal ") + strsignal(WTERMSIG(status));
  }
  return "status " + std::to_string(status);
}

class SafetyForkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (safety::kTsan) {
      GTEST_SKIP() << "TSan does not support fork() in a multi-threaded "
                      "process";
    }
  }
};

TEST_F(SafetyForkTest, ChildrenNeverDieOfAProfilingSignal) {
  // 1,000 in CI and in the full run (~3 s); 250 under ASan.
  const int iterations = static_cast<int>(safety::Scaled(1'000, 1'000));
  safety::Watchdog watchdog(absl::Minutes(5), "fork/exec loop");
  safety::ProbedProfiler profiler(SafetyOptions("fork_exec"));
  ASSERT_TRUE(profiler.Start().ok());
  std::atomic<bool> stop{false};
  std::vector<std::thread> burners;
  for (int i = 0; i < 2; ++i) {
    burners.emplace_back([&] {
      auto registration = profiler.RegisterThread("burner");
      while (!stop.load()) safety::BurnCpu(2'000'000);
    });
  }
  auto self = profiler.RegisterThread("forker");
  const pid_t forker = safety::Gettid();
  // The forking thread is also signalled while it forks.
  std::thread signaller([&] {
    while (!stop.load()) {
      safety::SendProfilingSignal(forker, true);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });

  std::map<std::string, int> outcomes;
  const char* true_argv[] = {"/bin/true", nullptr};
  const char* busy_argv[] = {
      "/bin/sh", "-c", "i=0; while [ $i -lt 2000 ]; do i=$((i+1)); done",
      nullptr};
  for (int i = 0; i < iterations; ++i) {
    int status = 0;
    pid_t pid = -1;
    const char** argv = i % 50 == 0 ? busy_argv : true_argv;
    switch (i % 3) {
      case 0:  // fork + exec
        pid = fork();
        if (pid == 0) {
          execv(argv[0], const_cast<char**>(argv));
          _exit(127);
        }
        break;
      case 1:  // posix_spawn (clone(CLONE_VFORK) + exec in glibc)
        ASSERT_EQ(posix_spawn(&pid, argv[0], nullptr, nullptr,
                              const_cast<char**>(argv), environ),
                  0);
        break;
      case 2:  // fork, keep running with the inherited handler, exit
        pid = fork();
        if (pid == 0) {
          safety::BurnCpu(2'000'000);
          _exit(0);
        }
        break;
    }
    ASSERT_GT(pid, 0);
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ++outcomes[DescribeStatus(status)];
  }
  stop = true;
  signaller.join();
  for (auto& t : burners) t.join();
  self.Reset();
  ASSERT_TRUE(profiler.Stop().ok());
  for (const auto& [what, n] : outcomes) {
    std::printf("safety_fork_exec: %d children: %s\n", n, what.c_str());
  }
  EXPECT_THAT(outcomes, ::testing::ElementsAre(::testing::Pair("exit 0",
                                                               iterations)));
  EXPECT_GT(profiler.stats().samples_taken, 0u);
}

// Regression: Stop() in the child used to detach the parent's ticker
// thread, which throws in the child (the thread does not exist there).
TEST_F(SafetyForkTest, ForkedChildGetsNoTimersNoSamplesAndWritesNothing) {
  Options options = SafetyOptions("forked_child");
  DefaultProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  auto self = profiler.RegisterThread("parent");
  safety::BurnCpu(20'000'000);
  const int code = safety::RunInChild(
      [&]() -> int {
        // The child holds a copy of the parent's profiler object...
        if (!profiler.running()) return 10;
        // ...but no timer: POSIX timers are not inherited across fork.
        if (safety::CountPosixTimers() > 0) return 11;
        internal::ThreadSlotHeader* slot = internal::CurrentThreadSlot();
        if (slot == nullptr) return 12;
        const uint64_t before = slot->samples_taken.load();
        safety::BurnCpu(100'000'000);
        if (slot->samples_taken.load() != before) return 13;
        // Stop() forgets the parent's profiler and writes nothing.
        if (!profiler.Stop().ok()) return 15;
        if (profiler.running()) return 16;
        if (access(options.output.c_str(), F_OK) == 0) return 17;
        // The parent's profiler cannot be restarted here...
        const absl::Status restart = profiler.Start();
        if (restart.code() != absl::StatusCode::kFailedPrecondition ||
            !absl::StrContains(restart.message(),
                               "a forked child must construct its own")) {
          return 18;
        }
        // ...and the inherited registration is gone: the thread may register
        // with a profiler of its own, which samples and writes its profile.
        {
          Options child_options = options;
          child_options.output = options.output + ".child";
          DefaultProfiler child(child_options);
          if (!child.Start().ok()) return 19;
          auto registration = child.RegisterThread("child-main");
          if (!registration.active()) return 20;
          safety::BurnCpu(100'000'000);
          registration.Reset();
          if (!child.Stop().ok()) return 21;
          auto profile = ReadPprofFile(child_options.output);
          if (!profile.ok()) return 22;
          if (profile->Total(profile->ValueIndex("cpu-time")) <= 0) return 23;
          std::remove(child_options.output.c_str());
        }
        // A late SIGPROF in the child is harmless.
        raise(SIGPROF);
        return 0;
      },
      /*timeout_s=*/30);
  EXPECT_EQ(code, 0) << "see the numbered checks in the child";
  self.Reset();
  ASSERT_TRUE(profiler.Stop().ok());
  auto profile = ReadPprofFile(options.output);
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_GT(profile->Total(profile->ValueIndex("cpu-time")), 0);
}

// Built only under ASan, the one runtime that poisons a stack's redzones.
#if defined(INPROF_ASAN)
// Parks in a frame whose local buffer ASan surrounds with poisoned redzones.
__attribute__((noinline)) void ParkWithALocalBuffer(
    std::atomic<bool>* parked, const std::atomic<bool>* release) {
  char buffer[256];
  std::snprintf(buffer, sizeof(buffer), "%p", static_cast<void*>(buffer));
  parked->store(true);
  while (!release->load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Regression: under ASan, the poison around the frames that inprof's threads
// had live at fork() outlived those threads in the child. Once glibc unmapped
// such a stack and libelf mapped a file there, the child's symbolizer met a
// false ASan error (and a failed CHECK describing it): 1 child in ~10 of
// ForkedChildGetsNoTimersNoSamplesAndWritesNothing. Deterministic: the child
// reads the shadow of a thread parked in such a frame at fork().
TEST_F(SafetyForkTest, ChildrenInheritNoPoisonFromInprofsThreadStacks) {
  std::atomic<uintptr_t> lo{0};
  std::atomic<uintptr_t> hi{0};
  std::atomic<bool> parked{false};
  std::atomic<bool> release{false};
  internal::ProfilerThread thread([&] {
    pthread_attr_t attr;
    void* addr = nullptr;
    size_t size = 0;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
      if (pthread_attr_getstack(&attr, &addr, &size) == 0) {
        lo = reinterpret_cast<uintptr_t>(addr);
        hi = lo + size;
      }
      pthread_attr_destroy(&attr);
    }
    ParkWithALocalBuffer(&parked, &release);
  });
  while (!parked.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // The thread is released before any assertion: a joinable thread must
  // not outlive the test.
  const bool known = hi.load() > lo.load();
  bool poisoned_in_parent = false;
  int code = -1;
  if (known) {
    void* const stack = reinterpret_cast<void*>(lo.load());
    const size_t size = hi.load() - lo.load();
    poisoned_in_parent = __asan_region_is_poisoned(stack, size) != nullptr;
    code = safety::RunInChild(
        [&]() -> int {
          return __asan_region_is_poisoned(stack, size) == nullptr ? 0 : 2;
        },
        /*timeout_s=*/30);
  }
  release = true;
  thread.join();
  ASSERT_TRUE(known) << "pthread_getattr_np gave no stack";
  // Without this the test could not fail: the parked frame is poisoned here.
  EXPECT_TRUE(poisoned_in_parent);
  EXPECT_EQ(code, 0) << "2: the dead thread's stack is still poisoned in "
                        "the child";
}
#endif  // INPROF_ASAN

// Children forked at random points of the collector's work (it drains every
// 1 ms here), of the wall ticker's and of other threads' registrations
// unregister their inherited thread, register a new one and stop the
// inherited profiler; a child that hangs on a lock held at fork time by a
// thread that does not exist in it is killed by its alarm and counted.
// Regression: before base/fork_guard.h, ~13% of the children hung in
// ThreadRegistration::Reset() on the registry lock.
TEST_F(SafetyForkTest, ChildForkedWhileCollectorRunsCanStop) {
  if (safety::kAsan) {
    // GCC 12's libasan (LLVM 14's runtime) takes no allocator locks around
    // fork(): a child forked while a burner or the collector is inside
    // malloc hangs in its first allocation (a clean-clone ASan run: 1 of 75
    // children hung; the plain build's 300 never do, and every lock of
    // inprof's is in base/fork_guard.h). LLVM 18 added the atfork
    // handlers (llvm-project PR 75290). The plain build runs this test.
    GTEST_SKIP() << "this libasan does not lock its allocator across fork()";
  }
  const int iterations = static_cast<int>(safety::Scaled(300, 2'000));
  Options options = SafetyOptions("fork_locks");
  options.collect_period = absl::Milliseconds(1);
  DefaultProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  std::atomic<bool> stop{false};
  std::vector<std::thread> burners;
  for (int i = 0; i < 3; ++i) {
    burners.emplace_back([&] {
      while (!stop.load()) {
        auto registration = profiler.RegisterThread("burner");
        safety::BurnCpu(3'000'000);
      }
    });
  }
  auto self = profiler.RegisterThread("forker");
  std::map<std::string, int> outcomes;
  for (int i = 0; i < iterations; ++i) {
    const int code = safety::RunInChild(
        [&]() -> int {
          self.Reset();  // takes the registry lock
          // A thread registered in the child gets no timer and no samples.
          int result = 0;
          std::thread t([&] {
            auto r = profiler.RegisterThread("child-thread");
            auto* s = internal::CurrentThreadSlot();
            const uint64_t b = s != nullptr ? s->samples_taken.load() : 0;
            safety::BurnCpu(5'000'000);
            if (s != nullptr && s->samples_taken.load() != b) result = 2;
          });
          t.join();
          if (result != 0) return result;
          if (!profiler.Stop().ok()) return 1;
          return 0;
        },
        /*timeout_s=*/2);
    ++outcomes[code == 0 ? "stopped"
                         : code == 128 + SIGALRM ? "hung (killed by alarm)"
                                                 : "exit " + std::to_string(code)];
    std::this_thread::sleep_for(std::chrono::microseconds(300));
  }
  stop = true;
  for (auto& t : burners) t.join();
  self.Reset();
  ASSERT_TRUE(profiler.Stop().ok());
  for (const auto& [what, n] : outcomes) {
    std::printf("safety_fork_locks: %d children %s\n", n, what.c_str());
  }
  EXPECT_THAT(outcomes,
              ::testing::ElementsAre(::testing::Pair("stopped", iterations)));
}

// `inprof run --agent` on a pre-fork server: 6 children forked at once, each
// spinning 200 ms of CPU in ForkChildWork. The preload's atfork handler
// starts a child's profiler (which connects to the agent) before the agent
// link's handler runs; that handler closed the child's new connection, and
// 5 of 6 children got empty profiles (all of them with the fallback off).
TEST_F(SafetyForkTest, PreforkedChildrenUnderTheAgentKeepTheirSamples) {
  if (safety::kSanitized) {
    GTEST_SKIP() << "the preload library needs the sanitizer's runtime "
                    "loaded before it (scripts/sanitizers.sh)";
  }
  const std::string cli = testing::EnvOrEmpty("INPROF_CLI");
  const std::string target = testing::EnvOrEmpty("INPROF_RUN_TARGET");
  if (cli.empty() || target.empty()) GTEST_SKIP() << "INPROF_CLI / INPROF_RUN_TARGET not set";
  constexpr int kChildren = 6;
  for (const char* fallback : {"on", "off"}) {
    SCOPED_TRACE(absl::StrCat("INPROF_AGENT_FALLBACK=", fallback));
    const std::string dir = testing::FreshTestDir(absl::StrCat("prefork_", fallback));
    auto run = testing::RunCommandSeparately(absl::StrCat(
        "INPROF_AGENT_FALLBACK=", fallback, " ", testing::ShellQuote(cli),
        " run --agent -o ", testing::ShellQuote(dir + "/prefork-%p.pb.gz"), " -- ",
        testing::ShellQuote(target), " prefork ", kChildren));
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_EQ(run->exit_code, 0) << run->err;
    // The parent and each child: one line each, naming its file.
    std::vector<std::string> files;
    for (absl::string_view line : absl::StrSplit(run->err, '\n', absl::SkipEmpty())) {
      if (!absl::StrContains(line, ", run_target")) continue;
      const size_t at = line.find("wrote ");
      ASSERT_NE(at, absl::string_view::npos) << line;
      files.emplace_back(line.substr(at + 6, line.find(" (pid") - at - 6));
    }
    EXPECT_EQ(files.size(), size_t{kChildren + 1}) << run->err;
    // Each child's 200 ms of CPU at the 10 ms period: ~20 samples. Any
    // child profile under 100 ms is one whose connection was lost.
    int children_with_work = 0;
    std::vector<int64_t> child_ms;
    for (const std::string& path : files) {
      auto profile = ReadPprofFile(path);
      ASSERT_TRUE(profile.ok()) << path << ": " << profile.status();
      const int cpu = profile->ValueIndex("cpu-time");
      int64_t work = 0;
      for (const auto& [function, ns] : profile->CumulativeByFunction(cpu)) {
        if (absl::StrContains(function, "ForkChildWork")) work += ns;
      }
      if (profile->Total(cpu) > 0 && work == 0) continue;  // the parent
      child_ms.push_back(work / 1'000'000);
      if (work >= 100'000'000) ++children_with_work;
    }
    EXPECT_EQ(children_with_work, kChildren)
        << "ForkChildWork ms per child profile: " << ::testing::PrintToString(child_ms)
        << "\n" << run->err;
    // The connection is inprof's own business: nothing says the program
    // closed it.
    EXPECT_THAT(run->err, ::testing::Not(::testing::HasSubstr("is no longer inprof's")));
  }
  // A process that ends before its first sample: its "wrote" line says the
  // profile is empty, and only then. Without the wall sampler and at a 10 s
  // CPU period, a start-up of a few ms of CPU is sampled with probability
  // ~5e-4; the line is checked against the file either way.
  const std::string dir = testing::FreshTestDir("prefork_empty");
  auto run = testing::RunCommandSeparately(absl::StrCat(
      "INPROF_WALL_PERIOD=0 INPROF_CPU_PERIOD=10s ", testing::ShellQuote(cli),
      " run --agent -o ", testing::ShellQuote(dir + "/empty-%p.pb.gz"),
      " -- ", testing::ShellQuote(target), " spin 0"));
  ASSERT_TRUE(run.ok()) << run.status();
  int lines = 0;
  for (absl::string_view line : absl::StrSplit(run->err, '\n', absl::SkipEmpty())) {
    const size_t at = line.find("wrote ");
    if (at == absl::string_view::npos) continue;
    ++lines;
    const std::string path(line.substr(at + 6, line.find(" (pid") - at - 6));
    auto profile = ReadPprofFile(path);
    ASSERT_TRUE(profile.ok()) << path << ": " << profile.status();
    EXPECT_EQ(absl::StrContains(line, "holds no samples"), profile->samples.empty()) << line;
  }
  EXPECT_EQ(lines, 1) << run->err;
}

}  // namespace
}  // namespace inprof
