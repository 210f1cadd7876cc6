// The report commands (`inprof top|collapsed|speedscope|flamegraph|diff`,
// src/cli/report_commands.cc on src/report) on profiles with known content:
// tests/report/data/known.textpb (encoded here with protoc: a raw,
// uncompressed pprof that inprof did not write), a Go program's CPU profile
// and gperftools' converted by go tool pprof. Figures are checked against
// go tool pprof where it is installed; the flame graph pages are loaded in
// headless Chromium by tests/report/browser_check.py, which clicks, hovers
// and types like a person and keeps a screenshot in tests/artifacts/.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inprof/internal/signal_dispatch.h"
#include "util/test_util.h"

namespace inprof {
namespace {

using ::inprof::testing::CommandOutput;
using ::inprof::testing::GoPprof;
using ::inprof::testing::RunCommandSeparately;
using ::inprof::testing::ShellQuote;
using ::inprof::testing::TestTmpDir;
using ::testing::HasSubstr;
using ::testing::Not;

std::string Env(const char* name) { return ::inprof::testing::EnvOrEmpty(name); }

std::string Cli() { return ShellQuote(Env("INPROF_CLI")); }
std::string Data(const std::string& name) {
  return absl::StrCat(Env("INPROF_REPORT_DATA"), "/", name);
}

std::string Dir() {
  static const std::string dir = [] {
    const std::string d = absl::StrCat(TestTmpDir(), "/report");
    mkdir(d.c_str(), 0755);
    return d;
  }();
  return dir;
}

// known.textpb (or base.textpb) encoded: a plain, uncompressed pprof file.
std::string Encoded(const std::string& name) {
  const std::string out = absl::StrCat(Dir(), "/", name, ".pb");
  auto r = RunCommandSeparately(absl::StrCat(
      ShellQuote(Env("INPROF_PROTOC")), " --encode=perftools.profiles.Profile -I",
      ShellQuote(Env("INPROF_PROTO_DIR")), " profile.proto < ",
      ShellQuote(Data(name + ".textpb")), " > ", ShellQuote(out)));
  EXPECT_TRUE(r.ok() && r->exit_code == 0) << (r.ok() ? r->err : "");
  return out;
}

CommandOutput Inprof(const std::string& args) {
  auto r = RunCommandSeparately(absl::StrCat(Cli(), " ", args));
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : CommandOutput{-1, "", ""};
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// `inprof top` rows: function -> (flat, cum) as printed, e.g.
// "      600 ms  60.00%  60.00%       800 ms  80.00%  Multiply".
std::map<std::string, std::pair<std::string, std::string>> TopRows(
    const std::string& out) {
  std::map<std::string, std::pair<std::string, std::string>> rows;
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    std::vector<size_t> pct;
    for (size_t i = 0; i < f.size(); ++i) {
      if (absl::EndsWith(f[i], "%")) pct.push_back(i);
    }
    if (pct.size() != 3 || pct[0] == 0 || pct[2] + 1 >= f.size() ||
        !absl::ascii_isdigit(f[0][0])) {
      continue;  // not a row (the header, a comment)
    }
    auto join = [&](size_t from, size_t to) {
      std::string s;
      for (size_t i = from; i < to; ++i) absl::StrAppend(&s, s.empty() ? "" : " ", f[i]);
      return s;
    };
    rows[join(pct[2] + 1, f.size())] = {join(0, pct[0]), join(pct[1] + 1, pct[2])};
  }
  return rows;
}

TEST(ReportTest, TopAgreesWithGoPprof) {
  const std::string known = Encoded("known");
  CommandOutput r = Inprof(absl::StrCat("top ", ShellQuote(known)));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("cpu-time (nanoseconds), total 1.00 s; 6 of 6 functions"));
  EXPECT_THAT(r.out, HasSubstr("# samples taken=3 recorded=3"));
  auto rows = TopRows(r.out);
  EXPECT_EQ(rows["Multiply"], std::make_pair(std::string("600 ms"), std::string("600 ms")));
  EXPECT_EQ(rows["Compute"], std::make_pair(std::string("0"), std::string("800 ms")));
  EXPECT_EQ(rows["WorkerLoop"], std::make_pair(std::string("0"), std::string("200 ms")));
  EXPECT_THAT(r.out, HasSubstr(" 600 ms  60.00%  60.00%       600 ms  60.00%  Multiply"));
  INPROF_REQUIRE_TOOL("go");
  {
    // go tool pprof's -top on the same file: the same flat and cum per
    // function (its "800ms" is our "800 ms").
    auto top = GoPprof(absl::StrCat("-top ", ShellQuote(known)));
    ASSERT_TRUE(top.ok()) << top.status();
    for (const auto& [fn, v] : rows) {
      const std::string flat = absl::StrReplaceAll(v.first, {{" ", ""}});
      const std::string cum = absl::StrReplaceAll(v.second, {{" ", ""}});
      bool found = false;
      for (absl::string_view line : absl::StrSplit(*top, '\n')) {
        std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
        if (f.size() == 6 && f[5] == fn) {
          found = true;
          EXPECT_EQ(f[0], flat) << fn;
          EXPECT_EQ(f[3], cum) << fn;
        }
      }
      EXPECT_TRUE(found) << fn << " not in go tool pprof -top:\n" << *top;
    }
  }
  // --sample-type and --limit.
  r = Inprof(absl::StrCat("top -t wall-time -n 1 ", ShellQuote(known)));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("wall-time (nanoseconds), total 1.80 s; 1 of 6 functions"));
  EXPECT_THAT(r.out, HasSubstr("1.00 s  55.56%  55.56%       1.00 s  55.56%  ReadInput"));
  EXPECT_THAT(r.out, Not(HasSubstr("Multiply")));
}

TEST(ReportTest, TopByThreadAndByLabel) {
  const std::string known = Encoded("known");
  CommandOutput r = Inprof(absl::StrCat("top --by thread ", ShellQuote(known)));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("2 of 2 threads by thread"));
  EXPECT_THAT(r.out, HasSubstr("800 ms  80.00%  80.00%  main\n"));
  EXPECT_THAT(r.out, HasSubstr("200 ms  20.00% 100.00%  worker\n"));
  r = Inprof(absl::StrCat("top --by thread --sample-type wall-time ", ShellQuote(known)));
  EXPECT_THAT(r.out, HasSubstr("1.00 s  55.56%  55.56%  worker\n"));
  r = Inprof(absl::StrCat("top --by label:endpoint ", ShellQuote(known)));
  EXPECT_THAT(r.out, HasSubstr("600 ms  60.00%  60.00%  /a\n"));
  EXPECT_THAT(r.out, HasSubstr("200 ms  20.00%  80.00%  (no label)\n"));
  EXPECT_THAT(r.out, HasSubstr("200 ms  20.00% 100.00%  /b\n"));
  // Filters: one thread, one label value.
  r = Inprof(absl::StrCat("top --thread worker ", ShellQuote(known)));
  EXPECT_THAT(r.out, HasSubstr("total 200 ms; 2 of 2 functions"));
  r = Inprof(absl::StrCat("top --label endpoint=/b ", ShellQuote(known)));
  EXPECT_THAT(r.out, HasSubstr("total 200 ms; 3 of 3 functions"));
  EXPECT_THAT(r.out, HasSubstr("Add"));
}

TEST(ReportTest, CollapsedIsFoldedStacksRootFirst) {
  const std::string known = Encoded("known");
  CommandOutput r = Inprof(absl::StrCat("collapsed ", ShellQuote(known)));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out,
            "WorkerLoop;ReadInput 200000000\n"
            "main;Compute;Add 200000000\n"
            "main;Compute;Multiply 600000000\n");
  r = Inprof(absl::StrCat("collapsed -t wall-time --thread worker ", ShellQuote(known)));
  EXPECT_EQ(r.out, "WorkerLoop;ReadInput 1000000000\n");
  const std::string out = Dir() + "/known.folded";
  r = Inprof(absl::StrCat("collapsed --label endpoint=/a -o ", ShellQuote(out), " ",
                       ShellQuote(known)));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ReadFile(out), "main;Compute;Multiply 600000000\n");
  EXPECT_THAT(r.err, HasSubstr("inprof collapsed: wrote " + out));
}

TEST(ReportTest, SpeedscopeFileHasOneProfilePerThread) {
  const std::string known = Encoded("known");
  const std::string out = Dir() + "/known.speedscope.json";
  CommandOutput r = Inprof(absl::StrCat("speedscope ", ShellQuote(known), " -o ", ShellQuote(out)));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Checked with Python's JSON parser against speedscope's schema: frames,
  // sampled profiles whose samples index the frames, weights that sum to
  // endValue.
  auto check = RunCommandSeparately(absl::StrCat(
      "python3 -c ", ShellQuote(R"PY(
import json, sys
d = json.load(open(sys.argv[1]))
assert d["$schema"] == "https://www.speedscope.app/file-format-schema.json"
names = [f["name"] for f in d["shared"]["frames"]]
out = []
for p in d["profiles"]:
    assert p["type"] == "sampled" and p["unit"] == "nanoseconds"
    assert len(p["samples"]) == len(p["weights"])
    assert sum(p["weights"]) == p["endValue"]
    stacks = sorted(";".join(names[i] for i in s) for s in p["samples"])
    out.append("%s %d %s" % (p["name"], p["endValue"], "|".join(stacks)))
print("\n".join(out))
)PY"), " ", ShellQuote(out)));
  ASSERT_TRUE(check.ok());
  EXPECT_EQ(check->exit_code, 0) << check->err;
  EXPECT_EQ(check->out,
            "main (cpu-time) 800000000 main;Compute;Add|main;Compute;Multiply\n"
            "worker (cpu-time) 200000000 WorkerLoop;ReadInput\n");
}

TEST(ReportTest, ReadsGoAndGperftoolsProfiles) {
  // A Go program's CPU profile (runtime/pprof, gzip) and gperftools' legacy
  // profile converted by `go tool pprof -proto`.
  CommandOutput r = Inprof(absl::StrCat("top ", ShellQuote(Data("go_cpu.pb.gz"))));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("cpu (nanoseconds), total 200 ms"));
  EXPECT_THAT(r.out, HasSubstr("main.spinGo"));
  r = Inprof(absl::StrCat("collapsed -t samples ", ShellQuote(Data("go_cpu.pb.gz"))));
  EXPECT_THAT(r.out, HasSubstr("main.main;main.spinGo "));
  r = Inprof(absl::StrCat("top ", ShellQuote(Data("gperftools_cpu.pb.gz"))));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("cpu (nanoseconds), total 128 ms"));
  const std::string page = Dir() + "/go.html";
  r = Inprof(absl::StrCat("flamegraph ", ShellQuote(Data("go_cpu.pb.gz")), " -o ",
                       ShellQuote(page)));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(ReadFile(page), HasSubstr("\"main.spinGo\""));
}

TEST(ReportTest, CorruptOrWrongInputIsOneClearLine) {
  const std::string garbage = Dir() + "/garbage.pb.gz";
  {
    std::ofstream f(garbage, std::ios::binary);
    f << "\x1f\x8b\x08\x00 this is not a gzip stream";
  }
  const std::string text = Dir() + "/notes.txt";
  {
    std::ofstream f(text);
    f << "just some notes\n";
  }
  const std::string empty = Dir() + "/empty.pb";
  { std::ofstream f(empty); }
  for (const std::string& bad : {garbage, text, empty, Dir() + "/missing.pb.gz"}) {
    for (const char* cmd : {"top", "collapsed", "flamegraph -o /dev/null"}) {
      SCOPED_TRACE(absl::StrCat(cmd, " ", bad));
      CommandOutput r = Inprof(absl::StrCat(cmd, " ", ShellQuote(bad)));
      EXPECT_EQ(r.exit_code, 1);
      EXPECT_EQ(r.out, "");
      // One line that names the command and the file.
      EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
      const std::string name(absl::string_view(cmd).substr(0, absl::string_view(cmd).find(' ')));
      EXPECT_THAT(r.err, HasSubstr(absl::StrCat("inprof ", name, ": ")));
      EXPECT_THAT(r.err, HasSubstr(bad));
    }
  }
  // What each says, without the reader's internals.
  EXPECT_EQ(Inprof(absl::StrCat("top ", ShellQuote(empty))).err,
            absl::StrCat("inprof top: ", empty, ": empty file, not a pprof profile\n"));
  EXPECT_EQ(Inprof(absl::StrCat("top ", ShellQuote(Dir() + "/missing.pb.gz"))).err,
            absl::StrCat("inprof top: ", Dir(),
                         "/missing.pb.gz: cannot open: No such file or directory\n"));
  for (const std::string& bad : {garbage, text}) {
    const std::string err = Inprof(absl::StrCat("top ", ShellQuote(bad))).err;
    EXPECT_THAT(err, HasSubstr(absl::StrCat("inprof top: ", bad, ": not a pprof profile: ")));
    EXPECT_THAT(err, Not(HasSubstr("DecodePprof")));
  }
  const std::string known = Encoded("known");
  CommandOutput r = Inprof(absl::StrCat("top -t heap ", ShellQuote(known)));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("no sample type 'heap' in the profile (it has: cpu-time, wall-time)"));
  r = Inprof(absl::StrCat("top --by color ", ShellQuote(known)));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--by 'color': expected thread or label:KEY"));
  r = Inprof(absl::StrCat("diff ", ShellQuote(known)));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("expected two profiles, BASE and NEW"));
  r = Inprof(absl::StrCat("flamegraph ", ShellQuote(known), " -o /nonexistent-dir/x.html"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("cannot write '/nonexistent-dir/x.html'"));
}

// A profile from outside with hostile values: two samples of INT64_MAX
// (their sum leaves int64: before, top printed a total of -2 ns, wrapped,
// computed with undefined behaviour) and a negative value (before, shown as
// it came). Every view refuses the file in one line that names it and says
// which; the profile of known content beside it is still read.
std::string EncodedText(const std::string& name, const std::string& text) {
  const std::string source = absl::StrCat(Dir(), "/", name, ".textpb");
  std::ofstream(source) << text;
  const std::string out = absl::StrCat(Dir(), "/", name, ".pb");
  auto r = RunCommandSeparately(absl::StrCat(
      ShellQuote(Env("INPROF_PROTOC")), " --encode=perftools.profiles.Profile -I",
      ShellQuote(Env("INPROF_PROTO_DIR")), " profile.proto < ", ShellQuote(source),
      " > ", ShellQuote(out)));
  EXPECT_TRUE(r.ok() && r->exit_code == 0) << (r.ok() ? r->err : "");
  return out;
}

TEST(ReportTest, ValuesThatOverflowOrAreNegativeAreRefusedInOneLine) {
  constexpr char kProfile[] = R"(
sample_type { type: 1 unit: 2 }
sample { location_id: [1] value: [%s] }
sample { location_id: [2] value: [%s] }
location { id: 1 address: 0x1000 line { function_id: 1 } }
location { id: 2 address: 0x1100 line { function_id: 2 } }
function { id: 1 name: 3 }
function { id: 2 name: 4 }
string_table: ["", "cpu-time", "nanoseconds", "Hot", "Cold"]
)";
  const std::string huge = EncodedText(
      "huge", absl::StrReplaceAll(kProfile, {{"%s", "9223372036854775807"}}));
  std::string negative_text = kProfile;
  negative_text.replace(negative_text.find("%s"), 2, "1000");
  negative_text.replace(negative_text.find("%s"), 2, "-5");
  const std::string negative = EncodedText("negative", negative_text);
  const std::string known = Encoded("known");
  struct Case {
    std::string file, says;
  };
  for (const Case& c :
       {Case{huge, "the cpu-time values add up to more than 9223372036854775807"},
        Case{negative, "sample 2 has a negative cpu-time value (-5)"}}) {
    for (const std::string& cmd :
         {absl::StrCat("top ", ShellQuote(c.file)), absl::StrCat("collapsed ", ShellQuote(c.file)),
          absl::StrCat("speedscope -o /dev/null ", ShellQuote(c.file)),
          absl::StrCat("flamegraph -o /dev/null ", ShellQuote(c.file)),
          absl::StrCat("diff -o /dev/null ", ShellQuote(known), " ", ShellQuote(c.file)),
          absl::StrCat("diff -o /dev/null ", ShellQuote(c.file), " ", ShellQuote(known))}) {
      SCOPED_TRACE(cmd);
      CommandOutput r = Inprof(cmd);
      EXPECT_EQ(r.exit_code, 1) << r.out;
      EXPECT_EQ(r.out, "");
      EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
      EXPECT_THAT(r.err, HasSubstr(absl::StrCat(c.file, ": ", c.says))) << r.err;
    }
  }
  // One value of INT64_MAX alone is shown as it is.
  std::string one_text = kProfile;
  one_text.replace(one_text.find("%s"), 2, "9223372036854775807");
  one_text.replace(one_text.find("%s"), 2, "0");
  CommandOutput r = Inprof(absl::StrCat("collapsed ", ShellQuote(EncodedText("one", one_text))));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "Hot 9223372036854775807\n");
}

// Runs browser_check.py MODE PAGE [--screenshot tests/artifacts/NAME.png]
// in Chromium (INPROF_CHROMIUM, as tests/meson.build found it).
void BrowserCheck(const std::string& mode, const std::string& page,
                  const std::string& screenshot) {
  INPROF_REQUIRE_TOOL("chromium");
  std::string cmd = absl::StrCat("python3 ", ShellQuote(Env("INPROF_BROWSER_CHECK")), " ",
                                 mode, " ", ShellQuote(page));
  if (!screenshot.empty()) {
    const std::string dir = Env("INPROF_TEST_ARTIFACTS");
    mkdir(dir.c_str(), 0755);
    absl::StrAppend(&cmd, " --screenshot ", ShellQuote(absl::StrCat(dir, "/", screenshot)));
  }
  auto r = RunCommandSeparately(cmd);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 0) << r->out << r->err;
  std::printf("%s", r->out.c_str());
}

// The page is one file with nothing fetched from elsewhere.
void ExpectSelfContained(const std::string& html) {
  EXPECT_THAT(html, Not(HasSubstr("<script src")));
  EXPECT_THAT(html, Not(HasSubstr("<link")));
  EXPECT_THAT(html, Not(HasSubstr("@import")));
  EXPECT_THAT(html, Not(HasSubstr("url(http")));
  EXPECT_THAT(html, Not(HasSubstr("/*INPROF_DATA*/")));
}

TEST(ReportTest, FlamegraphPageInABrowser) {
  const std::string known = Encoded("known");
  CommandOutput r = Inprof(absl::StrCat("flamegraph ", ShellQuote(known)));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Default output: the profile's name with .html.
  const std::string page = Dir() + "/known.html";
  EXPECT_THAT(r.err, HasSubstr("inprof flamegraph: wrote " + page));
  const std::string html = ReadFile(page);
  ExpectSelfContained(html);
  EXPECT_THAT(html, HasSubstr("\"Multiply\""));
  BrowserCheck("known", page, "flamegraph.png");
}

TEST(ReportTest, DiffPageInABrowser) {
  const std::string base = Encoded("base");
  const std::string known = Encoded("known");
  const std::string page = Dir() + "/diff.html";
  CommandOutput r = Inprof(absl::StrCat("diff ", ShellQuote(base), " ", ShellQuote(known),
                                     " -o ", ShellQuote(page)));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ExpectSelfContained(ReadFile(page));
  BrowserCheck("diff", page, "diff.png");
}

// What is asserted: the page draws the frames and answers each input (a
// search, the sample type, a zoom, a thread filter) with a new render, the
// search's match count shown, within 60 s each (a hang check, not a
// speed bound: a test asserts no absolute time). The render times
// browser_check.py prints are information, as it says ("info:").
TEST(ReportTest, LargeFlamegraphDrawsAndAnswersEveryInput) {
  // 100,000 distinct stacks, 20-40 frames deep (tests/report/large_profile.py
  // writes them). Under
  // a sanitizer the tool is 5 times slower (50 s of the ASan suite's 260):
  // 20,000 stacks take it through the same code, the plain suite keeps the
  // page's worst case.
  const int stacks = internal::kUnderSanitizer ? 20'000 : 100'000;
  const std::string pb = Dir() + "/large.pb";
  auto g = RunCommandSeparately(absl::StrCat("python3 ", ShellQuote(Env("INPROF_LARGE_PROFILE")),
                                             " ", stacks, " ", ShellQuote(pb)));
  ASSERT_TRUE(g.ok() && g->exit_code == 0) << (g.ok() ? g->err : g.status().ToString());
  const std::string page = Dir() + "/large.html";
  CommandOutput r = Inprof(absl::StrCat("flamegraph ", ShellQuote(pb), " -o ", ShellQuote(page)));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = Inprof(absl::StrCat("collapsed ", ShellQuote(pb), " | wc -l"));
  EXPECT_EQ(absl::StripAsciiWhitespace(r.out), absl::StrCat(stacks));
  BrowserCheck("large", page, "");
}

}  // namespace
}  // namespace inprof
