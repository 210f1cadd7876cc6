// tests/util/test_util.h: helpers shared by inprof's tests.
//
// Defines a scratch directory, a shell-command runner, wrappers around
// `go tool pprof` (including a parser for its -raw output, so that tests can
// check profiles the way users read them) and a `protoc --decode` check.
// The tools are located through the environment tests/meson.build sets:
// INPROF_GO, INPROF_PROTOC, INPROF_PROTO, INPROF_TEST_TMPDIR, INPROF_DWZ,
// INPROF_GOOGLE_PPROF, INPROF_CHROMIUM.
//
// It also says what the machine offers, asked of the machine itself and
// never of the code under test (a regression there must fail, not skip):
// INPROF_REQUIRE_TOOL for the programs a test runs (a skip with the
// package to install; a failure under CI=true, where the test command
// installed them) and ProbePerfEvents() for the kernel's perf events.
//
// Thread-safety: the functions are reentrant but run child processes; call
// them from the test's main thread.
//
// Example:
//   INPROF_REQUIRE_TOOL("go");
//   auto samples = inprof::testing::ReadWithGoPprofRaw(path);
//   ASSERT_TRUE(samples.ok()) << samples.status();
//   EXPECT_THAT((*samples)[0].stack, Contains(HasSubstr("Compute")));
#ifndef INPROF_TESTS_TEST_UTIL_H_
#define INPROF_TESTS_TEST_UTIL_H_

#include <time.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "inprof/pprof_reader.h"

namespace inprof::testing {

// This thread's CPU time (CLOCK_THREAD_CPUTIME_ID) in nanoseconds: what the
// tests compare a profile's CPU against.
inline int64_t ThreadCpuNow() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1'000'000'000LL + ts.tv_nsec;
}

// `s` single-quoted for /bin/sh.
std::string ShellQuote(const std::string& s);

// $INPROF_TEST_TMPDIR (created if missing), else /tmp.
std::string TestTmpDir();

// A fresh, empty directory for one test's files: TestTmpDir()/NAME_PID (two
// runs of a test at once, meson test --repeat, never share one).
std::string FreshTestDir(const std::string& name);

// The files in `dir` whose names end in `suffix`, as paths, sorted.
std::vector<std::string> FilesEndingIn(const std::string& dir, const std::string& suffix);

// The environment variable `name`, or "" when unset (the test's inputs that
// tests/meson.build passes in).
std::string EnvOrEmpty(const char* name);

// What a command printed, separately per stream.
struct CommandOutput {
  int exit_code = 0;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs `cmd` with /bin/sh and returns its output whatever its exit status;
// fails only when the command cannot be run at all.
absl::StatusOr<CommandOutput> RunCommandSeparately(const std::string& cmd);

// Runs `cmd` with /bin/sh; returns stdout and stderr interleaved. Fails on a
// non-zero exit status, with the output in the message.
absl::StatusOr<std::string> RunCommand(const std::string& cmd);

// Whether $INPROF_GO names a go binary. A test that needs it says so with
// INPROF_REQUIRE_TOOL("go") rather than asking this.
bool GoPprofAvailable();

// Whether this is a CI run: $CI set to anything but "", "0" or "false"
// (.ci/run's machines set CI=true). There every tool a test uses must be
// installed (the test command installs them), so a missing one fails.
bool InCi();

// The path of a tool the tests run: "go", "dwz", "google-pprof" or
// "chromium", as tests/meson.build found it ($INPROF_GO, $INPROF_DWZ,
// $INPROF_GOOGLE_PPROF, $INPROF_CHROMIUM); "" when it is not installed.
// "libcurl" and "libmicrohttpd", the libraries inprof loads at run time:
// their soname when this process can dlopen() it.
std::string ToolPath(const std::string& tool);

// "" when ToolPath(tool) is there; otherwise one line naming the tool and
// the Debian package that installs it.
std::string MissingTool(const std::string& tool);

// Makes the calling test (a void function: the test body, SetUp, or a
// helper whose caller checks HasFatalFailure()/IsSkipped()) need `tool`:
// without it the test is skipped with MissingTool()'s line, or fails under
// CI (InCi()). Every test that runs an optional tool says so this way, so
// that a machine without it lists the test as skipped (scripts/quickstart.sh
// prints the list) instead of passing it with its checks left out.
#define INPROF_REQUIRE_TOOL(tool)                                            \
  do {                                                                       \
    const std::string inprof_missing_tool_ = ::inprof::testing::MissingTool(tool); \
    if (!inprof_missing_tool_.empty()) {                                     \
      if (::inprof::testing::InCi()) {                                       \
        GTEST_FAIL() << "CI=true: " << inprof_missing_tool_;                 \
      }                                                                      \
      GTEST_SKIP() << inprof_missing_tool_;                                  \
    }                                                                        \
  } while (0)

// What the kernel lets this process do with perf events, asked with
// perf_event_open directly (never through CpuTimeProvider::Configure(), the
// code under test): a sampling task-clock event on the calling thread, as
// the perf engine opens. Probed once per process.
struct PerfProbe {
  bool user = false;    // an event counting user mode opens
  bool kernel = false;  // one counting kernel mode too (perf_event_paranoid
                        // <= 1, or CAP_PERFMON)
  std::string reason;   // why not, when !kernel: the errno of the open
};
const PerfProbe& ProbePerfEvents();

// Runs "$INPROF_GO tool pprof <args_and_path>" and returns its stdout with
// its stderr (warnings) appended, so that a search for "arning" sees them.
// Fails on a non-zero exit status, with stderr in the message.
absl::StatusOr<std::string> GoPprof(const std::string& args_and_path);

// Like GoPprof but returns what pprof printed on stderr (its warnings, such
// as failed local symbolization); empty means no warnings.
absl::StatusOr<std::string> GoPprofStderr(const std::string& args_and_path);

// One sample as `go tool pprof -raw` prints it.
struct RawSample {
  std::vector<int64_t> values;
  // Function names, leaf first, inline frames expanded innermost first; a
  // location without function reads "0x<address>".
  std::vector<std::string> stack;
  // The same frames' "file:line" ("" when pprof shows no line).
  std::vector<std::string> file_lines;
  // The same frames' Function.system_name ("" without a function).
  std::vector<std::string> system_names;
  // The same frames' pprof location id: a location's inline frames share
  // one, its caller's frames have the next location's.
  std::vector<uint64_t> location_ids;
  // String and numeric labels, e.g. {"thread name": "main"}; several values
  // of one key are joined with a space.
  std::map<std::string, std::string> labels;
};

// Runs `go tool pprof -raw <profile_path>` and parses its Samples and
// Locations sections. If `pprof_stderr` is not null, stores what pprof
// printed on stderr there.
absl::StatusOr<std::vector<RawSample>> ReadWithGoPprofRaw(
    const std::string& profile_path, std::string* pprof_stderr = nullptr);

// Parses text in the format of `go tool pprof -raw` (exposed for tests of the
// parser itself).
absl::StatusOr<std::vector<RawSample>> ParseGoPprofRaw(const std::string& raw);

// Gunzips `profile_path` (if compressed) and decodes it with
// `$INPROF_PROTOC --decode=perftools.profiles.Profile`; returns the text
// format, or an error with protoc's complaint.
absl::StatusOr<std::string> ProtocDecode(const std::string& profile_path);

// ProtocDecode() reduced to a status.
absl::Status ProtocDecodeOk(const std::string& profile_path);


// One HTTP/1.1 response as HttpFetch() read it.
struct HttpReply {
  int status = 0;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  std::string error;  // transport failure; empty when a response came
  // The first header called `name` (any case); "" if none.
  std::string header(const std::string& name) const;
};

// Sends `method target` to `address` ("127.0.0.1:PORT") over a fresh
// connection (Connection: close) and reads the response to its end (at
// most 120 s without data). Enough for the live endpoint's tests. The Host
// header is `host`, or `address` when null.
HttpReply HttpFetch(const std::string& address, const std::string& method,
                    const std::string& target, const char* host = nullptr);

// What a profile carries at least on a function that burned `ms` of one
// thread's CPU in one go (at least `ms`, measured on the thread's clock), at
// a CPU period of `period_ms`: the sample points it crossed, less those
// whose signal was handled after it returned: a period's with the perf
// engine, a period's and a scheduler tick's (<= 10 ms at HZ >= 100) with
// the timer engine. Deterministic: no draw is involved.
inline int64_t CpuRegionFloor(int64_t ms, int64_t period_ms = 10) {
  return (ms - period_ms - 10) * 1'000'000;
}

// And at most: the sample points crossed from a period and a tick before
// it began (a signal handled late lands in it) to its end, each a period,
// plus the last check of its clock (< 1 ms). Deterministic as the floor.
inline int64_t CpuRegionCeiling(int64_t ms, int64_t period_ms = 10) {
  return (ms + 2 * period_ms + 10 + 1) * 1'000'000;
}

// values[index] summed over the samples whose leaf function's name
// contains `site`.
int64_t LeafSum(const DecodedProfile& profile, int index, const std::string& site);

}  // namespace inprof::testing

#endif  // INPROF_TESTS_TEST_UTIL_H_
