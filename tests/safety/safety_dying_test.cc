// A program that ends without exit() or a return from main, under `inprof
// run` (tests/run/run_target.cc, unmodified):
//   - quick_exit, _exit and _Exit write the profile (at_quick_exit; the
//     preload interposes _exit and _Exit and has the profile written first,
//     for a bounded time), also from a SIGTERM handler and in a forked child
//     that ends with _exit(0);
//   - SIGTERM sent to a forked child ends that child, not its parent (the
//     child once wrote its end signal into its parent's pipe);
//   - a program killed by SIGSEGV or abort() cannot write its profile, and
//     the tool says that, naming the signal and what to do (it said "see
//     the messages above", and there were none); with --agent, what it
//     advises, the profile is written.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <dirent.h>

#include <algorithm>
#include <tuple>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inprof/pprof_reader.h"
#include "util/test_util.h"

namespace inprof {
namespace {

using ::inprof::testing::CommandOutput;
using ::inprof::testing::RunCommandSeparately;
using ::inprof::testing::ShellQuote;
using ::testing::HasSubstr;
using ::testing::Not;

std::string Cli() { return ::inprof::testing::EnvOrEmpty("INPROF_CLI"); }
std::string Target() { return ::inprof::testing::EnvOrEmpty("INPROF_RUN_TARGET"); }

std::string FreshDir(const std::string& name) {
  return ::inprof::testing::FreshTestDir("dying_" + name);
}

std::vector<std::string> Profiles(const std::string& dir) {
  return ::inprof::testing::FilesEndingIn(dir, ".pb.gz");
}

// `inprof run -o DIR/p-%p.pb.gz -- run_target ARGS`; sh reports a program
// killed by a signal as 128 + the signal.
CommandOutput RunTarget(const std::string& dir, const std::string& args) {
  auto r = RunCommandSeparately(absl::StrCat(
      ShellQuote(Cli()), " run -o ", ShellQuote(dir + "/p-%p.pb.gz"), " -- ",
      ShellQuote(Target()), " ", args));
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : CommandOutput{};
}

int64_t CumulativeCpu(const std::string& path, const std::string& function) {
  auto p = ReadPprofFile(path);
  if (!p.ok()) return -1;
  for (const auto& [name, v] : p->CumulativeByFunction(p->ValueIndex("cpu-time"))) {
    if (absl::StrContains(name, function)) return v;
  }
  return 0;
}

struct Ending {
  const char* how;
  int exit_code;
};

TEST(SafetyDyingTest, QuickExitAndUnderscoreExitWriteTheProfile) {
  for (const Ending& e : {Ending{"quick_exit", 6}, Ending{"_exit", 7}, Ending{"_Exit", 8}}) {
    SCOPED_TRACE(e.how);
    const std::string dir = FreshDir(e.how);
    CommandOutput r = RunTarget(dir, absl::StrCat("end ", e.how, " ", ShellQuote(dir + "/pid")));
    EXPECT_EQ(r.exit_code, e.exit_code) << r.err;
    const auto profiles = Profiles(dir);
    ASSERT_EQ(profiles.size(), 1u) << r.err;
    EXPECT_THAT(r.err, HasSubstr("inprof run: wrote "));
    // EndWork burned 200 ms of CPU before the end: testing::CpuRegionFloor's
    // bound, deterministic (here and below; it was 150 ms, by hand).
    EXPECT_GE(CumulativeCpu(profiles[0], "EndWork"), testing::CpuRegionFloor(200)) << r.err;
  }
}

TEST(SafetyDyingTest, UnderscoreExitFromASignalHandlerWritesTheProfile) {
  const std::string dir = FreshDir("handler_exit");
  const std::string pidfile = dir + "/pid";
  // The program waits for SIGTERM once it wrote its pid; its handler calls
  // _exit(9).
  const std::string cmd = absl::StrCat(
      ShellQuote(Cli()), " run -o ", ShellQuote(dir + "/p-%p.pb.gz"), " -- ",
      ShellQuote(Target()), " end handler-_exit ", ShellQuote(pidfile), " & ",
      "for i in $(seq 300); do [ -s ", ShellQuote(pidfile), " ] && break; sleep 0.01; done; ",
      "kill -TERM $(cat ", ShellQuote(pidfile), "); wait $!");
  auto r = RunCommandSeparately(cmd);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 9) << r->err;
  const auto profiles = Profiles(dir);
  ASSERT_EQ(profiles.size(), 1u) << r->err;
  EXPECT_GE(CumulativeCpu(profiles[0], "EndWork"), testing::CpuRegionFloor(200)) << r->err;
}

TEST(SafetyDyingTest, AForkedChildThatEndsWithUnderscoreExitWritesItsProfile) {
  const std::string dir = FreshDir("fork_exit");
  CommandOutput r = RunTarget(dir, "fork-_exit");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto profiles = Profiles(dir);
  ASSERT_EQ(profiles.size(), 2u) << r.err;
  int64_t child_cpu = 0;
  for (const std::string& path : profiles) child_cpu += CumulativeCpu(path, "ForkChildWork");
  EXPECT_GE(child_cpu, testing::CpuRegionFloor(150)) << r.err;  // ForkChildWork(150)
}

TEST(SafetyDyingTest, SigtermToAForkedChildEndsTheChildNotItsParent) {
  const std::string dir = FreshDir("term_child");
  CommandOutput r = RunTarget(dir, "term-child");
  // 0: the child died of SIGTERM and the parent went on (11: the child did
  // not die of it; 128 + 14: it hung).
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Profiles(dir).size(), 2u) << r.err;
}

TEST(SafetyDyingTest, AProgramKilledBySignalIsSaidSoWithWhatToDo) {
  for (const auto& [how, sig, name] :
       {std::tuple<const char*, int, const char*>{"segv", SIGSEGV, "SIGSEGV (Segmentation fault)"},
        {"abort", SIGABRT, "SIGABRT (Aborted)"}}) {
    SCOPED_TRACE(how);
    const std::string dir = FreshDir(how);
    CommandOutput r = RunTarget(dir, absl::StrCat("end ", how, " ", ShellQuote(dir + "/pid")));
    EXPECT_EQ(r.exit_code, 128 + sig) << r.err;
    EXPECT_TRUE(Profiles(dir).empty()) << r.err;
    EXPECT_THAT(r.err, HasSubstr(absl::StrCat("'run_target' (pid ")));
    EXPECT_THAT(r.err, HasSubstr(absl::StrCat(") was killed by ", name,
                                              " before inprof could write its profile; "
                                              "with --agent its samples are kept")));
    EXPECT_THAT(r.err, Not(HasSubstr("see the messages above")));
  }
}

// A profile that cannot be written is said once, by the process, and the
// tool says which process it was (the failure was logged twice, once
// prefixed "at exit:", and the tool said "see the messages above").
TEST(SafetyDyingTest, AProfileThatCannotBeWrittenIsSaidOnce) {
  const std::string dir = FreshDir("unwritable");
  // A file name longer than NAME_MAX (255): the directory is writable, the
  // file cannot be created.
  const std::string output = dir + "/" + std::string(300, 'x') + "-%p.pb.gz";
  auto r = RunCommandSeparately(absl::StrCat(
      ShellQuote(Cli()), " run -o ", ShellQuote(output), " -- ",
      ShellQuote(Target()), " spin 50"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 0) << r->err;
  // The process's lines ("inprof: ..."), not the tool's ("inprof run: ...").
  int said = 0;
  for (absl::string_view line : absl::StrSplit(r->err, '\n')) {
    said += absl::StartsWith(line, "inprof: ") && absl::StrContains(line, dir + "/xxx");
  }
  EXPECT_EQ(said, 1) << r->err;
  EXPECT_THAT(r->err, HasSubstr("inprof run: 'run_target' (pid "));
  // The tool repeats the error the process reported in its run report.
  EXPECT_THAT(r->err, HasSubstr(") could not write its profile: file: cannot write "));
  EXPECT_THAT(r->err, HasSubstr("File name too long"));
}

// What the message above advises: with an agent, the samples of a program
// that dies are in shared memory, and the agent writes its profile.
TEST(SafetyDyingTest, WithAnAgentAProgramKilledBySignalStillGetsItsProfile) {
  const std::string dir = FreshDir("segv_agent");
  auto r = RunCommandSeparately(absl::StrCat(
      ShellQuote(Cli()), " run --agent -o ", ShellQuote(dir + "/p-%p.pb.gz"), " -- ",
      ShellQuote(Target()), " end segv ", ShellQuote(dir + "/pid")));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 128 + SIGSEGV) << r->err;
  const auto profiles = Profiles(dir);
  ASSERT_EQ(profiles.size(), 1u) << r->err;
  EXPECT_GE(CumulativeCpu(profiles[0], "EndWork"), testing::CpuRegionFloor(200)) << r->err;
}

}  // namespace
}  // namespace inprof
