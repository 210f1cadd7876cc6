// The gperftools drop-in: a program written against <gperftools/profiler.h>
// (tests/gperftools/gperftools_program.cc) linked with inprof-gperftools
// instead of -lprofiler, and the same program linked with the real
// -lprofiler and run with libinprof_preload.so preloaded. The API's calls,
// CPUPROFILE, CPUPROFILE_FREQUENCY and CPUPROFILESIGNAL; the files are
// pprof, read with inprof's reader and go tool pprof.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inprof/pprof_reader.h"
#include "util/stat_bounds.h"
#include "util/test_util.h"

namespace inprof {
namespace {

using ::inprof::testing::CommandOutput;
using ::inprof::testing::GoPprof;
using ::inprof::testing::LeafSum;
using ::inprof::testing::RunCommandSeparately;
using ::inprof::testing::ShellQuote;
using ::inprof::testing::TestTmpDir;
using ::testing::HasSubstr;

std::string Env(const char* name) { return ::inprof::testing::EnvOrEmpty(name); }

struct Variant {
  const char* name;
  std::string program;
  std::string env;  // prefix of the command
};

// The drop-in linked in, and -lprofiler with the preload (when built).
std::vector<Variant> Variants() {
  std::vector<Variant> v;
  v.push_back({"drop-in", Env("INPROF_GPERFTOOLS_PROGRAM"), ""});
  if (!Env("INPROF_GPERFTOOLS_LPROFILER_PROGRAM").empty()) {
    v.push_back({"-lprofiler + preload",
                 Env("INPROF_GPERFTOOLS_LPROFILER_PROGRAM"),
                 absl::StrCat("LD_PRELOAD=", ShellQuote(Env("INPROF_PRELOAD")))});
  }
  return v;
}

std::string Fresh(const std::string& name) {
  const std::string dir = absl::StrCat(TestTmpDir(), "/gperftools_", name);
  (void)RunCommandSeparately(absl::StrCat("rm -rf ", ShellQuote(dir)));
  mkdir(dir.c_str(), 0755);
  return dir;
}

// How far from its length the CPU a profile credits to `regions` stretches
// of one thread's CPU (each a Work function, spinning by the thread's
// clock) may be, in seconds, deterministically: the sample points a
// stretch crossed each carry one period, so it gets its length within one
// period, plus one scheduler tick (<= 10 ms at HZ >= 100) for a point
// whose signal the timer engine delivers at the next tick it runs at
// (tests/sampling/labels_test.cc), plus 1 ms for Burn's overshoot of its
// clock and the calls around it.
double RegionsBound(int regions, double period_s) {
  return regions * (period_s + 0.010 + 0.001);
}

int64_t Cumulative(const DecodedProfile& p, const std::string& function) {
  int64_t best = 0;
  for (const auto& [name, v] :
       p.CumulativeByFunction(p.ValueIndex("cpu-time"))) {
    if (absl::StrContains(name, function)) best = std::max(best, v);
  }
  return best;
}

TEST(GperftoolsTest, ApiStartsStopsAndWritesPprof) {
  INPROF_REQUIRE_TOOL("go");
  for (const Variant& v : Variants()) {
    SCOPED_TRACE(v.name);
    const std::string dir = Fresh(absl::StrCat("api_", v.env.empty()));
    const std::string file = dir + "/app.prof";
    auto r = RunCommandSeparately(absl::StrCat(v.env, " ", ShellQuote(v.program),
                                               " api ", ShellQuote(file)));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->exit_code, 0) << r->out << r->err;
    EXPECT_THAT(r->out, HasSubstr("before: enabled=0 all_threads=0 name= "));
    EXPECT_THAT(r->out, HasSubstr(absl::StrCat("during: enabled=1 all_threads=1 name=", file)));
    EXPECT_THAT(r->out, HasSubstr("after: enabled=0 all_threads=0"));
    int samples = 0;
    const size_t at = r->out.find("working: ");
    ASSERT_NE(at, std::string::npos) << r->out;
    ASSERT_EQ(std::sscanf(r->out.c_str() + at, "working: enabled=1 all_threads=1 name=%*s samples=%d", &samples), 1) << r->out;
    // 3 x 200 ms of CPU at 100 Hz: ~60. At least 19 points each stretch
    // crossed, and a signal at least every second one (perf: one a point;
    // the timer engine: one a tick the thread ran, a tick <= 10 ms, the
    // period): a separation from "not sampling", not a statistical bound.
    EXPECT_GE(samples, 3 * (200 / 10 - 1) / 2);
    auto p = ReadPprofFile(file);
    ASSERT_TRUE(p.ok()) << p.status();
    // Both threads and main, each on its own CPU clock, at gperftools'
    // 100 Hz; nothing after Stop. (+-15%, picked by hand, before.)
    EXPECT_NEAR(Cumulative(*p, "ApiThreadWork") / 1e9, 0.4, RegionsBound(2, 0.010));
    EXPECT_NEAR(Cumulative(*p, "ApiMainWork") / 1e9, 0.2, RegionsBound(1, 0.010));
    EXPECT_EQ(Cumulative(*p, "AfterStopWork"), 0);
    // CPU only, as with gperftools: no wall sampling unless asked for.
    EXPECT_EQ(p->Total(p->ValueIndex("wall-samples")), 0);
    {
      auto top = GoPprof(absl::StrCat("-top ", ShellQuote(file)));
      ASSERT_TRUE(top.ok()) << top.status();
      EXPECT_THAT(*top, HasSubstr("ApiThreadWork"));
    }
  }
}

TEST(GperftoolsTest, CpuprofileProfilesFromLoadToExitAtItsFrequency) {
  for (const Variant& v : Variants()) {
    SCOPED_TRACE(v.name);
    const std::string dir = Fresh(absl::StrCat("env_", v.env.empty()));
    const std::string file = dir + "/env.prof";
    auto r = RunCommandSeparately(absl::StrCat(
        v.env, " CPUPROFILE=", ShellQuote(file),
        " CPUPROFILE_FREQUENCY=1000 CPUPROFILE_PER_THREAD_TIMERS=1 ",
        ShellQuote(v.program), " env"));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->exit_code, 0) << r->err;
    auto p = ReadPprofFile(file);
    ASSERT_TRUE(p.ok()) << p.status() << r->err;
    EXPECT_NEAR(Cumulative(*p, "EnvWork") / 1e9, 0.3, RegionsBound(1, 0.001));
    // 1000 Hz of each thread's CPU: 1 ms periods (gperftools' ITIMER_PROF
    // gives 250 per CPU-second on an HZ=250 kernel).
    EXPECT_EQ(p->period, 1'000'000);
  }
}

// gperftools writes ProfilerStart's file and CPUPROFILE as given: "%p",
// "%t" and "%%" are characters of the name, not inprof's pattern (before,
// they were expanded: app-12345-...). HEAPPROFILE's prefix was already
// taken as given; it stays so.
TEST(GperftoolsTest, PercentSignsInFileNamesAreWrittenAsGiven) {
  for (const Variant& v : Variants()) {
    SCOPED_TRACE(v.name);
    const std::string dir = Fresh(absl::StrCat("percent_", v.env.empty()));
    const std::string api = dir + "/api-%p-%t-%%.prof";
    auto r = RunCommandSeparately(absl::StrCat(v.env, " ", ShellQuote(v.program), " api ",
                                               ShellQuote(api)));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->exit_code, 0) << r->out << r->err;
    const std::string env = dir + "/env-%p-%%.prof";
    r = RunCommandSeparately(absl::StrCat(v.env, " CPUPROFILE=", ShellQuote(env), " ",
                                          ShellQuote(v.program), " env"));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->exit_code, 0) << r->err;
    auto ls = RunCommandSeparately(absl::StrCat("ls -A ", ShellQuote(dir)));
    ASSERT_TRUE(ls.ok());
    EXPECT_EQ(ls->out, "api-%p-%t-%%.prof\nenv-%p-%%.prof\n");
    EXPECT_TRUE(ReadPprofFile(api).ok());
    EXPECT_TRUE(ReadPprofFile(env).ok());
  }
}

TEST(GperftoolsTest, WallTimeOnlyWhenInprofWallPeriodAsksForIt) {
  for (const Variant& v : Variants()) {
    SCOPED_TRACE(v.name);
    const std::string dir = Fresh(absl::StrCat("wall_", v.env.empty()));
    const std::string file = dir + "/wall.prof";
    auto r = RunCommandSeparately(absl::StrCat(
        v.env, " CPUPROFILE=", ShellQuote(file),
        " INPROF_WALL_PERIOD=10ms ", ShellQuote(v.program), " env"));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->exit_code, 0) << r->err;
    auto p = ReadPprofFile(file);
    ASSERT_TRUE(p.ok()) << p.status() << r->err;
    // 0.3 s of CPU takes at least 0.3 s of wall time, all of it between
    // Start (before main) and Stop (at exit); each visit credits the wall
    // time since the last one, however late the sampler runs, and Stop's
    // last visit the rest: at least 0.3 s less the wait for the first visit
    // (one 10 ms period), deterministically (it was 0.25, picked by hand).
    EXPECT_GT(p->Total(p->ValueIndex("wall-samples")), 0);
    EXPECT_GE(p->Total(p->ValueIndex("wall-time")) / 1e9, 0.3 - 0.010);
    EXPECT_NEAR(Cumulative(*p, "EnvWork") / 1e9, 0.3, RegionsBound(1, 0.010));
  }
}

TEST(GperftoolsTest, CpuprofilesignalTogglesProfiling) {
  for (const Variant& v : Variants()) {
    SCOPED_TRACE(v.name);
    const std::string dir = Fresh(absl::StrCat("signal_", v.env.empty()));
    const std::string file = dir + "/sig.prof";
    auto r = RunCommandSeparately(absl::StrCat(
        v.env, " CPUPROFILE=", ShellQuote(file), " CPUPROFILESIGNAL=12 ",
        ShellQuote(v.program), " signal"));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->exit_code, 0) << r->err;
    auto p = ReadPprofFile(file + ".0");
    ASSERT_TRUE(p.ok()) << p.status() << r->err;
    // The program waits for each toggle to take effect (a thread of its
    // own handles it): all of SignalledWork is profiled, none of
    // UnsignalledWork. One region at 100 Hz: within a 10 ms period plus
    // one scheduler tick (<= 10 ms) of its 200 ms, deterministically.
    EXPECT_NEAR(Cumulative(*p, "SignalledWork") / 1e9, 0.2, RegionsBound(1, 0.010));
    EXPECT_EQ(Cumulative(*p, "UnsignalledWork"), 0);
  }
}

TEST(GperftoolsTest, DisabledMakesTheApiANoOp) {
  const std::string dir = Fresh("disabled");
  const std::string file = dir + "/off.prof";
  auto r = RunCommandSeparately(absl::StrCat(
      "INPROF_ENABLED=0 ", ShellQuote(Env("INPROF_GPERFTOOLS_PROGRAM")),
      " api ", ShellQuote(file)));
  ASSERT_TRUE(r.ok());
  // ProfilerStart fails (returns 0): the program says so with its code.
  EXPECT_EQ(r->exit_code, 10) << r->err;
  EXPECT_NE(access(file.c_str(), F_OK), 0);
}

// The heap program's two sites against their truth, at a 64 KiB period:
// within stats::SampledAllocationRange (1e-7 a side; four sides per call:
// 4e-7).
void ExpectHeapSites(const DecodedProfile& p) {
  const int alloc_space = p.ValueIndex("alloc_space");
  const int inuse_space = p.ValueIndex("inuse_space");
  ASSERT_GE(alloc_space, 0);
  ASSERT_GE(inuse_space, 0);
  const struct {
    const char* site;
    int index;
    int n;
    double size;
  } checks[] = {{"HeapFreedSite", alloc_space, 1000, 65536.0},
                {"HeapLiveSite", inuse_space, 4000, 4096.0}};
  for (const auto& c : checks) {
    const stats::EstimateRange range = stats::SampledAllocationRange(c.n, c.size, 65536.0);
    const double truth = c.n * c.size;
    const double got = static_cast<double>(LeafSum(p, c.index, c.site));
    EXPECT_GE(got, range.low * truth) << c.site << ": " << got << " of " << truth;
    EXPECT_LE(got, range.high * truth) << c.site << ": " << got << " of " << truth;
  }
  EXPECT_EQ(LeafSum(p, inuse_space, "HeapFreedSite"), 0);
}

// <gperftools/heap-profiler.h> with glibc's malloc: HeapProfilerStart,
// HeapProfilerDump (PREFIX.0001.heap, a pprof go tool pprof reads),
// HeapProfilerStop (a later dump writes nothing), IsHeapProfilerRunning.
TEST(GperftoolsTest, HeapProfilerApiDumpsTheHeapWithGlibcMalloc) {
  const std::string dir = Fresh("heap_api");
  const std::string prefix = dir + "/app";
  auto r = RunCommandSeparately(absl::StrCat("INPROF_ALLOC_PERIOD=64KiB ",
                                             ShellQuote(Env("INPROF_GPERFTOOLS_HEAP_PROGRAM")),
                                             " api ", ShellQuote(prefix)));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->exit_code, 0) << r->out << r->err;
  EXPECT_THAT(r->out, HasSubstr("before: running=0"));
  EXPECT_THAT(r->out, HasSubstr("started: running=1"));
  EXPECT_THAT(r->out, HasSubstr("after: running=0"));
  EXPECT_THAT(r->err, HasSubstr(absl::StrCat("dumping heap profile to ", prefix,
                                             ".0001.heap (test)")));
  EXPECT_NE(access((prefix + ".0002.heap").c_str(), F_OK), 0);  // the dump after Stop
  auto p = ReadPprofFile(prefix + ".0001.heap");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->period, 65536);
  ExpectHeapSites(*p);
  INPROF_REQUIRE_TOOL("go");
  {
    auto top = GoPprof(absl::StrCat("-sample_index=inuse_space -top ",
                                    ShellQuote(prefix + ".0001.heap")));
    ASSERT_TRUE(top.ok()) << top.status();
    EXPECT_THAT(*top, HasSubstr("HeapLiveSite"));
  }
}

// HEAPPROFILE profiles from load to exit (PREFIX.0001.heap at exit, with
// what was still allocated then), sampling every 512 KiB unless
// INPROF_ALLOC_PERIOD says otherwise; without either, HeapProfilerStart
// works as gperftools' does, at 512 KiB (it said one line and did nothing).
TEST(GperftoolsTest, HeapprofileProfilesFromLoadToExit) {
  const std::string program = ShellQuote(Env("INPROF_GPERFTOOLS_HEAP_PROGRAM"));
  {
    const std::string prefix = Fresh("heap_env") + "/env";
    auto r = RunCommandSeparately(absl::StrCat("HEAPPROFILE=", ShellQuote(prefix),
                                               " INPROF_ALLOC_PERIOD=64KiB ", program, " env"));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->exit_code, 0) << r->err;
    EXPECT_THAT(r->out, HasSubstr("env: running=1"));
    EXPECT_THAT(r->err, HasSubstr(".0001.heap (exiting)"));
    auto p = ReadPprofFile(prefix + ".0001.heap");
    ASSERT_TRUE(p.ok()) << p.status() << r->err;
    ExpectHeapSites(*p);
  }
  {
    const std::string prefix = Fresh("heap_default") + "/default";
    auto r = RunCommandSeparately(absl::StrCat("HEAPPROFILE=", ShellQuote(prefix), " ",
                                               program, " env"));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->exit_code, 0) << r->err;
    auto p = ReadPprofFile(prefix + ".0001.heap");
    ASSERT_TRUE(p.ok()) << p.status() << r->err;
    EXPECT_EQ(p->period, 512 * 1024);  // Go's and jemalloc's mean
  }
  {
    const std::string prefix = Fresh("heap_off") + "/off";
    auto r = RunCommandSeparately(absl::StrCat(program, " api ", ShellQuote(prefix)));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->exit_code, 0) << r->err;
    EXPECT_THAT(r->out, HasSubstr("started: running=1"));
    EXPECT_THAT(r->out, HasSubstr("after: running=0"));
    auto p = ReadPprofFile(prefix + ".0001.heap");
    ASSERT_TRUE(p.ok()) << p.status() << r->err;
    EXPECT_EQ(p->period, 512 * 1024);
    // The live site: 4,000 x 4 KiB, within its sampled range at 512 KiB
    // (expected ~31 samples; two sides at 1e-8).
    const int inuse_space = p->ValueIndex("inuse_space");
    ASSERT_GE(inuse_space, 0);
    const stats::EstimateRange range =
        stats::SampledAllocationRange(4000, 4096.0, 524288.0, 1e-8);
    const double got = static_cast<double>(LeafSum(*p, inuse_space, "HeapLiveSite"));
    EXPECT_GE(got, range.low * 4000 * 4096.0) << got;
    EXPECT_LE(got, range.high * 4000 * 4096.0) << got;
  }
}

// The CPU profile's engine line names where the allocation period came
// from: HEAPPROFILE's default (before, it named INPROF_ALLOC_PERIOD, which
// was not set), or INPROF_ALLOC_PERIOD when that set it.
TEST(GperftoolsTest, TheEngineLineNamesWhatSetTheAllocationPeriod) {
  const std::string program = ShellQuote(Env("INPROF_GPERFTOOLS_HEAP_PROGRAM"));
  for (const bool from_variable : {false, true}) {
    SCOPED_TRACE(from_variable);
    const std::string dir = Fresh(absl::StrCat("heap_source_", from_variable));
    auto r = RunCommandSeparately(absl::StrCat(
        "HEAPPROFILE=", ShellQuote(dir + "/heap"), " CPUPROFILE=", ShellQuote(dir + "/cpu.prof"),
        from_variable ? " INPROF_ALLOC_PERIOD=512KiB " : " ", program, " env"));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->exit_code, 0) << r->err;
    auto p = ReadPprofFile(dir + "/cpu.prof");
    ASSERT_TRUE(p.ok()) << p.status() << r->err;
    std::string line;
    for (const std::string& c : p->comments) {
      if (absl::StrContains(c, "allocations: sampled every")) line = c;
    }
    EXPECT_THAT(line, HasSubstr(from_variable ? "524288 bytes on average (INPROF_ALLOC_PERIOD)"
                                              : "524288 bytes on average (HEAPPROFILE)"))
        << absl::StrJoin(p->comments, "\n");
  }
}

// GetHeapProfile: "" while heap profiling is off; then gperftools' legacy
// text. gperftools' own pprof (google-pprof) reads it with the binary,
// symbolized through its MAPPED_LIBRARIES section: each site's bytes in the
// column it belongs to, within stats::SampledAllocationRange (four sides:
// 4e-7). go tool pprof parses it too: its values, and its source lines
// with -lines (Go's own cmd/pprof finds no C++ function names for this
// format: its function view reads [gperftools_heap_program]).
TEST(GperftoolsTest, GetHeapProfileIsTheLegacyTextPprofReads) {
  const std::string binary = Env("INPROF_GPERFTOOLS_HEAP_PROGRAM");
  const std::string file = Fresh("heap_text") + "/heap.txt";
  auto r = RunCommandSeparately(absl::StrCat("INPROF_ALLOC_PERIOD=64KiB ", ShellQuote(binary),
                                             " text ", ShellQuote(file)));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->exit_code, 0) << r->out << r->err;
  EXPECT_THAT(r->out, HasSubstr("before start: empty"));
  std::string text;
  {
    FILE* f = std::fopen(file.c_str(), "r");
    ASSERT_NE(f, nullptr);
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
    std::fclose(f);
  }
  EXPECT_TRUE(absl::StartsWith(text, "heap profile: ")) << text.substr(0, 200);
  EXPECT_THAT(text, HasSubstr("] @ heapprofile\n"));
  EXPECT_THAT(text, HasSubstr("\nMAPPED_LIBRARIES:\n"));
  INPROF_REQUIRE_TOOL("go");
  {
    auto top = GoPprof(absl::StrCat("-sample_index=inuse_space -top ", ShellQuote(binary), " ",
                                    ShellQuote(file)));
    ASSERT_TRUE(top.ok()) << top.status();
    EXPECT_THAT(*top, HasSubstr("Type: inuse_space"));
    auto lines = GoPprof(absl::StrCat("-sample_index=inuse_space -lines -top ",
                                      ShellQuote(binary), " ", ShellQuote(file)));
    ASSERT_TRUE(lines.ok()) << lines.status();
    EXPECT_THAT(*lines, HasSubstr("gperftools_heap_program.cc:")) << *lines;
  }
  INPROF_REQUIRE_TOOL("google-pprof");
  const std::string google_pprof = testing::ToolPath("google-pprof");
  for (const auto& [column, site, n, size] :
       {std::tuple{"--inuse_space", "HeapLiveSite", 4000, 4096.0},
        std::tuple{"--alloc_space", "HeapFreedSite", 1000, 65536.0}}) {
    auto top = RunCommandSeparately(absl::StrCat(ShellQuote(google_pprof), " --text --show_bytes ",
                                                 column, " ", ShellQuote(binary), " ",
                                                 ShellQuote(file)));
    ASSERT_TRUE(top.ok()) << top.status();
    // "flat flat% sum% cum cum% name", bytes: the site's flat bytes.
    int64_t flat = -1;
    for (absl::string_view line : absl::StrSplit(top->out, '\n')) {
      if (!absl::StrContains(line, site)) continue;
      std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (!f.empty()) (void)absl::SimpleAtoi(f[0], &flat);
    }
    const stats::EstimateRange range = stats::SampledAllocationRange(n, size, 65536.0);
    const double truth = n * size;
    EXPECT_GE(flat, range.low * truth) << column << " " << site << "\n" << top->out << top->err;
    EXPECT_LE(flat, range.high * truth) << column << " " << site << "\n" << top->out;
  }
}

// gperftools' dump intervals (HEAP_PROFILE_*), each alone. At
// INPROF_ALLOC_PERIOD=1 every allocation of 1 MiB is sampled with weight 1
// (p = 1 - exp(-2^20)), so the estimates the intervals read are the truth
// and which dumps happen is deterministic. The program waits for the
// interval dump before it exits (and writes the exit dump after it).
TEST(GperftoolsTest, HeapProfileIntervalsDumpAsGperftoolsDoes) {
  const std::string program = ShellQuote(Env("INPROF_GPERFTOOLS_HEAP_PROGRAM"));
  const struct {
    const char* name;
    const char* variables;
    const char* args;
    const char* reason;  // in the first dump's line
    // At least this much of the site's alloc_space and inuse_space in the
    // first dump: what triggered it, less 1 MiB for the program's other
    // blocks (a few KiB).
    int64_t min_alloc_mib, min_inuse_mib;
    const char* also_said;  // another line on stderr
  } cases[] = {
      // 40 MiB allocated and freed: one dump past 32 MiB, no second (that
      // would need 64), then the exit dump.
      {"heap_alloc_interval",
       "HEAP_PROFILE_ALLOCATION_INTERVAL=33554432 HEAP_PROFILE_INUSE_INTERVAL=0", "40 freed",
       " MB allocated cumulatively, ", 31, 0, ""},
      {"heap_inuse_interval",
       "HEAP_PROFILE_ALLOCATION_INTERVAL=0 HEAP_PROFILE_INUSE_INTERVAL=16777216", "20 live",
       " MB currently in use)", 15, 15, ""},
      // Nothing allocated: time alone. A variable that is no number is one
      // line naming it, and its default.
      {"heap_time_interval",
       "HEAP_PROFILE_ALLOCATION_INTERVAL=0 HEAP_PROFILE_INUSE_INTERVAL=lots "
       "HEAP_PROFILE_TIME_INTERVAL=1",
       "0 live", " sec since the last dump)", 0, 0,
       "HEAP_PROFILE_INUSE_INTERVAL='lots': expected a whole number of bytes (0: never); "
       "using 104857600"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string prefix = Fresh(c.name) + "/app";
    auto r = RunCommandSeparately(absl::StrCat("HEAPPROFILE=", ShellQuote(prefix),
                                               " INPROF_ALLOC_PERIOD=1 ", c.variables, " ",
                                               program, " intervals ", c.args));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->exit_code, 0) << r->out << r->err;
    EXPECT_THAT(r->err, HasSubstr(absl::StrCat("dumping heap profile to ", prefix, ".0001.heap (")));
    EXPECT_THAT(r->err, HasSubstr(c.reason));
    EXPECT_THAT(r->err, HasSubstr(c.also_said));
    // The exit dump last: the second file, but with time as the interval,
    // where a stalled program may see a second interval dump first.
    int last = 1;
    while (access(absl::StrFormat("%s.%04d.heap", prefix, last + 1).c_str(), F_OK) == 0) ++last;
    EXPECT_THAT(r->err, HasSubstr(absl::StrFormat("%s.%04d.heap (exiting)", prefix, last)));
    if (c.min_alloc_mib > 0) {
      EXPECT_EQ(last, 2) << r->err;
    }
    auto p = ReadPprofFile(prefix + ".0001.heap");
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->period, 1);
    EXPECT_GE(LeafSum(*p, p->ValueIndex("alloc_space"), "HeapMiBSite"), c.min_alloc_mib << 20);
    EXPECT_GE(LeafSum(*p, p->ValueIndex("inuse_space"), "HeapMiBSite"), c.min_inuse_mib << 20);
  }
}

// A child of a process under HEAPPROFILE -- forked, or exec'd with the
// variable inherited -- profiles its own heap into PREFIX_<pid>.NNNN.heap,
// as gperftools names a child's files, and never writes its parent's: the
// parent's files hold the parent's heap only. At INPROF_ALLOC_PERIOD=1
// every block has weight 1, so the sums are exact: the parent's 4,000
// blocks of 4 KiB still live at its exit dump, the child's 8 MiB at its
// own. The child waits for its own interval dump
// (HEAP_PROFILE_INUSE_INTERVAL=4 MiB: the checker of its own) and exits
// non-zero without it.
TEST(GperftoolsTest, HeapProfilesOfChildrenAreTheirOwn) {
  const std::string program = ShellQuote(Env("INPROF_GPERFTOOLS_HEAP_PROGRAM"));
  for (const char* how : {"", " exec"}) {
    SCOPED_TRACE(*how != '\0' ? "exec'd child" : "forked child");
    const std::string prefix = Fresh(*how != '\0' ? "heap_exec_child" : "heap_fork_child") + "/app";
    auto r = RunCommandSeparately(absl::StrCat(
        "HEAPPROFILE=", ShellQuote(prefix),
        " INPROF_ALLOC_PERIOD=1 HEAP_PROFILE_ALLOCATION_INTERVAL=0 "
        "HEAP_PROFILE_INUSE_INTERVAL=4194304 ",
        program, " fork", how));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->exit_code, 0) << r->out << r->err;
    int child = 0;
    for (absl::string_view line : absl::StrSplit(r->out, '\n')) {
      if (absl::ConsumePrefix(&line, "child ")) (void)absl::SimpleAtoi(line, &child);
    }
    ASSERT_GT(child, 0) << r->out;
    const std::string own = absl::StrCat(prefix, "_", child);
    EXPECT_THAT(r->err, HasSubstr(absl::StrCat("dumping heap profile to ", own, ".0001.heap (")));
    // Each process's dumps, in order; its last is its exit dump.
    for (const auto& [files, site, other, bytes] :
         {std::tuple{prefix, "HeapLiveSite", "HeapMiBSite", int64_t{4000 * 4096}},
          std::tuple{own, "HeapMiBSite", "HeapLiveSite", int64_t{8} << 20}}) {
      int last = 0;
      while (access(absl::StrFormat("%s.%04d.heap", files, last + 1).c_str(), F_OK) == 0) ++last;
      ASSERT_GE(last, 1) << files << "\n" << r->err;
      for (int n = 1; n <= last; ++n) {
        auto p = ReadPprofFile(absl::StrFormat("%s.%04d.heap", files, n));
        ASSERT_TRUE(p.ok()) << p.status();
        // Nothing of the other process's: not its allocations, not its
        // live blocks (the parent's, still allocated in the child, were
        // allocated before the child's profiler started).
        EXPECT_EQ(LeafSum(*p, p->ValueIndex("alloc_space"), other), 0) << files << " " << n;
        EXPECT_EQ(LeafSum(*p, p->ValueIndex("inuse_space"), other), 0) << files << " " << n;
        if (n == last) {
          EXPECT_EQ(LeafSum(*p, p->ValueIndex("inuse_space"), site), bytes) << files << " " << n;
        }
      }
    }
  }
}

}  // namespace
}  // namespace inprof
