// inprof and the host's file descriptors (DESIGN.md, "Hard rules of the
// host"): inprof never uses or closes a descriptor number it cannot prove
// is still its own, and leaves the program the descriptors its
// RLIMIT_NOFILE allows.
//   - Linked in: a program that closes every descriptor it inherited
//     (close_range, as daemons do) after Start() and opens its own files
//     finds them open, unchanged and unwritten after Stop(): with perf
//     events, kept /proc files and the symbolizer's files, with an agent
//     link, with the live endpoint. The upload client and the leaf
//     resolver keep no descriptor between calls.
//   - Under `inprof run`: such a program still ends on SIGTERM (143) and its
//     files get no byte from inprof; its descriptors never turn into
//     inprof's files while it runs. A forked child ends on the SIGTERM sent
//     to it.
//   - A program that lowers RLIMIT_NOFILE and starts threads opens as many
//     files under `inprof run` as alone.
//
// The programs run in a forked child (linked in) or as
// safety_descriptors_target (under `inprof run`).
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inprof/inprof.h"
#include "safety/safety_util.h"
#include "util/test_util.h"

namespace inprof {
namespace {

using ::inprof::testing::CommandOutput;
using ::inprof::testing::RunCommandSeparately;
using ::inprof::testing::ShellQuote;
using ::inprof::testing::TestTmpDir;
using ::testing::HasSubstr;

std::string FreshDir(const std::string& name) {
  const std::string dir = absl::StrCat(TestTmpDir(), "/descriptors_", name);
  (void)RunCommandSeparately(absl::StrCat("rm -rf ", ShellQuote(dir)));
  mkdir(dir.c_str(), 0755);
  return dir;
}

std::string Cli() { return ::inprof::testing::EnvOrEmpty("INPROF_CLI"); }
std::string Target() {
  return ::inprof::testing::EnvOrEmpty("INPROF_DESCRIPTORS_TARGET");
}

// The preload library cannot be loaded into a program without the
// sanitizer's runtime loaded first.
#define SKIP_UNDER_SANITIZERS()                                          \
  if (safety::kSanitized) {                                              \
    GTEST_SKIP() << "`inprof run` needs the sanitizer's runtime preloaded " \
                    "first; the plain suite runs this";                  \
  }

// Opened by the program: "opened K" from the target.
int Opened(const std::string& prefix, const std::string& args) {
  auto r = RunCommandSeparately(
      absl::StrCat(prefix, " ", ShellQuote(Target()), " ", args));
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return -1;
  EXPECT_EQ(r->exit_code, 0) << r->err;
  int opened = -1;
  if (std::sscanf(r->out.c_str(), "opened %d", &opened) != 1) {
    ADD_FAILURE() << "no count in '" << r->out << "': " << r->err;
  }
  return opened;
}

// A program that lowers RLIMIT_NOFILE to 16 and runs 12 threads opens as
// many files under `inprof run` as alone (8 of 8), with each engine, with
// and without wall sampling.
TEST(SafetyDescriptorsTest, UnderInprofRunAProgramThatLowersItsDescriptorLimitKeepsItsDescriptors) {
  SKIP_UNDER_SANITIZERS();
  const int alone = Opened("", "rlimit 16 12");
  ASSERT_EQ(alone, 8);
  const std::string dir = FreshDir("run_rlimit");
  for (const char* flags : {"", "--engine timer", "--engine timer --no-wall",
                            "--engine itimer"}) {
    SCOPED_TRACE(flags);
    EXPECT_EQ(Opened(absl::StrCat(ShellQuote(Cli()), " run -q ", flags, " -o ",
                                  ShellQuote(dir + "/p-%p.pb.gz"), " --"),
                     "rlimit 16 12"),
              alone);
  }
}

}  // namespace
}  // namespace inprof
