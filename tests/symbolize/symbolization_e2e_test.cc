// End to end: a program profiled by DefaultProfiler, its profile read back
// with `go tool pprof -raw` and `protoc --decode`, checking that every kind of
// function is named with its file and line: a static function, an
// always-inline function (an inline frame of its caller's location), a
// method in a namespace, and a function of a library dlopen()ed after
// Start(). And that INPROF_SYMBOLIZE=0 (Options::symbolize = false) writes
// addresses and mappings with build-ids only (plus the profiler's own named
// pseudo-frames, which have no address).
//
// The assertions are about the sampled (leaf) location and its inline frames,
// not about the callers above it: with frame-pointer unwinding, the caller of
// a leaf that keeps no frame record can be missing from a stack.
#include "inprof/inprof.h"
#include "inprof/base/sanitizers.h"

#include <dlfcn.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "util/test_util.h"

// --- The profiled functions ----------------------------------------------------
// At global scope so that their names are not qualified by the test's
// namespaces. Each is a leaf loop, so its samples have it (or, for the inlined
// one, its caller's location) as the leaf. The __LINE__ markers bracket each
// definition.

constexpr int kStaticSpinFirstLine = __LINE__;
static __attribute__((noinline)) uint64_t StaticSpin(uint64_t n) {
  uint64_t x = n;
  for (uint64_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
  }
  return x;
}
constexpr int kStaticSpinLastLine = __LINE__;

constexpr int kInlinedSpinFirstLine = __LINE__;
__attribute__((always_inline)) inline uint64_t AlwaysInlinedSpin(uint64_t n) {
  uint64_t x = n;
  for (uint64_t i = 0; i < n; ++i) {
    x = (x ^ (x >> 29)) * 0xbf58476d1ce4e5b9ULL + i;
  }
  return x;
}
constexpr int kInlinedSpinLastLine = __LINE__;

constexpr int kCallerFirstLine = __LINE__;
__attribute__((noinline)) uint64_t CallerOfInlinedSpin(uint64_t n) {
  uint64_t x = AlwaysInlinedSpin(n);
  asm volatile("" : "+r"(x));
  return x;
}
constexpr int kCallerLastLine = __LINE__;

namespace e2e_ns {

class Burner {
 public:
  __attribute__((noinline)) uint64_t Method(uint64_t n);

 private:
  uint64_t seed_ = 7;
};

constexpr int kMethodFirstLine = __LINE__;
uint64_t Burner::Method(uint64_t n) {
  uint64_t x = seed_ + n;
  for (uint64_t i = 0; i < n; ++i) {
    x = (x + i) * 0x9e3779b97f4a7c15ULL ^ (x >> 31);
  }
  return x;
}
constexpr int kMethodLastLine = __LINE__;

}  // namespace e2e_ns

// -----------------------------------------------------------------------------

namespace inprof {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::StartsWith;

// CPU burnt in each function. At 1 ms per sample (4 ms at HZ=250 ticks)
// this gives each one dozens of samples.
constexpr int64_t kBurnNs = 300'000'000;
constexpr uint64_t kChunk = 500'000;  // iterations per call, ~0.5 ms

using ::inprof::testing::ThreadCpuNow;

// Calls `spin(kChunk)` until this thread has used `ns` of CPU.
template <typename F>
uint64_t BurnFor(int64_t ns, F spin) {
  const int64_t start = ThreadCpuNow();
  uint64_t sink = 0;
  while (ThreadCpuNow() - start < ns) sink += spin(kChunk);
  return sink;
}

std::string E2eLibPath() {
  const char* path = std::getenv("INPROF_SYMBOLIZATION_E2E_LIB");
  return path != nullptr ? path : "";
}

// A library dlopen()ed by the test, closed at scope exit (after Stop(), so
// that the export still finds it mapped).
class Library {
 public:
  Library() = default;
  ~Library() {
    if (handle_ != nullptr) dlclose(handle_);
  }
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;

  bool Open(const std::string& path) {
    handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    return handle_ != nullptr;
  }
  template <typename Fn>
  Fn Symbol(const char* name) const {
    return reinterpret_cast<Fn>(dlsym(handle_, name));
  }

 private:
  void* handle_ = nullptr;
};

// "path/file.cc:123" -> ("path/file.cc", 123); line -1 when malformed.
std::pair<std::string, int> SplitFileLine(const std::string& file_line) {
  const size_t colon = file_line.rfind(':');
  int line = -1;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(file_line.substr(colon + 1), &line)) {
    return {file_line, -1};
  }
  return {file_line.substr(0, colon), line};
}

// The samples whose leaf frame's name contains `function`.
std::vector<testing::RawSample> WithLeaf(
    const std::vector<testing::RawSample>& samples,
    const std::string& function) {
  std::vector<testing::RawSample> out;
  for (const auto& s : samples) {
    if (!s.stack.empty() && absl::StrContains(s.stack[0], function)) {
      out.push_back(s);
    }
  }
  return out;
}

// Expects frame `i` of `s` to be in `file_suffix` between lines
// [first, last]. Under clang with a sanitizer, line 0 too: clang gives the
// checks it adds the line "none" (0; addr2line prints "?" there), and a
// sample lands in them.
void ExpectFrameLine(const testing::RawSample& s, size_t i,
                     const std::string& file_suffix, int first, int last) {
  ASSERT_LT(i, s.file_lines.size());
  const auto [file, line] = SplitFileLine(s.file_lines[i]);
  EXPECT_THAT(file, EndsWith(file_suffix)) << s.stack[i];
#if defined(__clang__) && (defined(INPROF_ASAN) || defined(INPROF_TSAN))
  if (line == 0) return;
#endif
  EXPECT_GE(line, first) << s.stack[i] << " at " << s.file_lines[i];
  EXPECT_LE(line, last) << s.stack[i] << " at " << s.file_lines[i];
}

// The parts of `protoc --decode` text output the tests look at.
struct ProfileText {
  std::vector<std::string> strings;  // string_table
  // Top-level messages by field name ("mapping", "location", "function"):
  // each one's scalar fields, repeated ones joined by ','; nested messages
  // counted under "<name>{}".
  std::map<std::string, std::vector<std::map<std::string, std::string>>>
      messages;
};

// Parses protoc's text format as printed for perftools.profiles.Profile.
ProfileText ParseProfileText(const std::string& text) {
  ProfileText out;
  std::map<std::string, std::string>* current = nullptr;
  int depth = 0;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    absl::string_view line = absl::StripAsciiWhitespace(raw);
    if (line.empty()) continue;
    if (absl::EndsWith(line, "{")) {
      std::string name(absl::StripAsciiWhitespace(line.substr(0, line.size() - 1)));
      if (depth == 0) {
        out.messages[name].emplace_back();
        current = &out.messages[name].back();
      } else if (current != nullptr) {
        int count = 0;
        (void)absl::SimpleAtoi((*current)[name + "{}"], &count);
        (*current)[name + "{}"] = absl::StrCat(count + 1);
      }
      ++depth;
      continue;
    }
    if (line == "}") {
      if (--depth == 0) current = nullptr;
      continue;
    }
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) continue;
    std::string key(line.substr(0, colon));
    std::string value(absl::StripAsciiWhitespace(line.substr(colon + 1)));
    if (depth == 0 && key == "string_table") {
      // "..." with C escapes; the strings checked here are plain ASCII.
      std::string unquoted;
      absl::CUnescape(value.substr(1, value.size() - 2), &unquoted);
      out.strings.push_back(unquoted);
    } else if (depth == 1 && current != nullptr) {
      std::string& slot = (*current)[key];
      slot = slot.empty() ? value : absl::StrCat(slot, ",", value);
    }
  }
  return out;
}

// The string a message's string-table field names ("" when unset).
std::string StringField(const ProfileText& p,
                        const std::map<std::string, std::string>& message,
                        const std::string& field) {
  auto it = message.find(field);
  int64_t index = 0;
  if (it == message.end() || !absl::SimpleAtoi(it->second, &index) ||
      index < 0 || static_cast<size_t>(index) >= p.strings.size()) {
    return "";
  }
  return p.strings[static_cast<size_t>(index)];
}

const std::map<std::string, std::string>* MappingOf(const ProfileText& p,
                                                    const std::string& path) {
  auto it = p.messages.find("mapping");
  if (it == p.messages.end()) return nullptr;
  for (const auto& m : it->second) {
    if (StringField(p, m, "filename") == path) return &m;
  }
  return nullptr;
}

bool IsLowerHex(const std::string& s) {
  for (char c : s) {
    if (!absl::ascii_isdigit(c) && (c < 'a' || c > 'f')) return false;
  }
  return !s.empty();
}

class SymbolizationE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    INPROF_REQUIRE_TOOL("go");
    lib_path_ = E2eLibPath();
    ASSERT_THAT(lib_path_, Not(IsEmpty()))
        << "INPROF_SYMBOLIZATION_E2E_LIB unset";
    // The library must be loaded after Start(), not before.
    ASSERT_EQ(dlopen(lib_path_.c_str(), RTLD_NOW | RTLD_NOLOAD), nullptr);
  }

  // Profiles the four functions (the library's after dlopen()ing it, once
  // the profiler runs) for `burn_ns` of CPU each and writes `options.output`.
  void ProfileWorkload(const Options& options, int64_t burn_ns,
                       Library* lib) {
    DefaultProfiler profiler(options);
    ASSERT_TRUE(profiler.Start().ok());
    {
      auto self = profiler.RegisterThread("main");
      volatile uint64_t sink = 0;
      sink = sink + BurnFor(burn_ns, StaticSpin);
      sink = sink + BurnFor(burn_ns, CallerOfInlinedSpin);
      e2e_ns::Burner burner;
      sink = sink +
             BurnFor(burn_ns, [&burner](uint64_t n) { return burner.Method(n); });
      ASSERT_TRUE(lib->Open(lib_path_)) << dlerror();
      auto lib_spin = lib->Symbol<uint64_t (*)(uint64_t)>("InprofE2eLibSpin");
      ASSERT_NE(lib_spin, nullptr);
      sink = sink + BurnFor(burn_ns, lib_spin);
    }
    ASSERT_TRUE(profiler.Stop().ok());
  }

  std::string lib_path_;
};

TEST_F(SymbolizationE2eTest, NamesEachKindOfFunctionWithFileAndLine) {
  Options options;
  options.output = testing::TestTmpDir() + "/symbolization_e2e.pb.gz";
  options.cpu_period = absl::Milliseconds(1);
  Library lib;
  ProfileWorkload(options, kBurnNs, &lib);
  if (HasFatalFailure()) return;

  std::string pprof_stderr;
  auto samples = testing::ReadWithGoPprofRaw(options.output, &pprof_stderr);
  ASSERT_TRUE(samples.ok()) << samples.status();
  constexpr char kFile[] = "symbolization_e2e_test.cc";

  // A static function: named (from .symtab / DWARF), file and a line inside
  // its body, its mangled name as system_name.
  const auto statics = WithLeaf(*samples, "StaticSpin");
  ASSERT_THAT(statics, Not(IsEmpty())) << "no sample has StaticSpin as leaf";
  for (const auto& s : statics) {
    EXPECT_EQ(s.stack[0], "StaticSpin(unsigned long)");
    EXPECT_THAT(s.system_names[0], StartsWith("_ZL10StaticSpinm"));
    ExpectFrameLine(s, 0, kFile, kStaticSpinFirstLine, kStaticSpinLastLine);
  }

  // The always-inline function: an inline frame of its caller, in the same
  // location, innermost first, each with its own line.
  const auto inlined = WithLeaf(*samples, "AlwaysInlinedSpin");
  ASSERT_THAT(inlined, Not(IsEmpty()))
      << "no sample has AlwaysInlinedSpin as leaf";
  for (const auto& s : inlined) {
    ASSERT_GE(s.stack.size(), 2u);
    EXPECT_EQ(s.stack[0], "AlwaysInlinedSpin(unsigned long)");
    EXPECT_EQ(s.stack[1], "CallerOfInlinedSpin(unsigned long)");
    EXPECT_EQ(s.location_ids[0], s.location_ids[1])
        << "the inlined function is not an inline frame of its caller";
    ExpectFrameLine(s, 0, kFile, kInlinedSpinFirstLine, kInlinedSpinLastLine);
    ExpectFrameLine(s, 1, kFile, kCallerFirstLine, kCallerLastLine);
  }

  // A method in a namespace: qualified demangled name, mangled system_name.
  const auto methods = WithLeaf(*samples, "Burner::Method");
  ASSERT_THAT(methods, Not(IsEmpty())) << "no sample has Burner::Method";
  for (const auto& s : methods) {
    EXPECT_EQ(s.stack[0], "e2e_ns::Burner::Method(unsigned long)");
    EXPECT_EQ(s.system_names[0], "_ZN6e2e_ns6Burner6MethodEm");
    ExpectFrameLine(s, 0, kFile, e2e_ns::kMethodFirstLine,
                    e2e_ns::kMethodLastLine);
  }

  // The function of the library loaded after Start().
  const auto lib_spins = WithLeaf(*samples, "InprofE2eLibSpin");
  ASSERT_THAT(lib_spins, Not(IsEmpty())) << "no sample has InprofE2eLibSpin";
  auto first_line = lib.Symbol<int (*)()>("InprofE2eLibSpinFirstLine");
  auto last_line = lib.Symbol<int (*)()>("InprofE2eLibSpinLastLine");
  ASSERT_NE(first_line, nullptr);
  ASSERT_NE(last_line, nullptr);
  for (const auto& s : lib_spins) {
    EXPECT_EQ(s.stack[0], "InprofE2eLibSpin");
    ExpectFrameLine(s, 0, "symbolization_e2e_lib.cc", first_line(),
                    last_line());
  }

  // The mappings say truthfully what was found.
  auto text = testing::ProtocDecode(options.output);
  ASSERT_TRUE(text.ok()) << text.status();
  const ProfileText profile = ParseProfileText(*text);
  const auto* lib_mapping = MappingOf(profile, lib_path_);
  ASSERT_NE(lib_mapping, nullptr) << "no mapping for " << lib_path_;
  EXPECT_TRUE(IsLowerHex(StringField(profile, *lib_mapping, "build_id")));
  for (const char* flag : {"has_functions", "has_filenames",
                           "has_line_numbers", "has_inline_frames"}) {
    auto it = lib_mapping->find(flag);
    EXPECT_TRUE(it != lib_mapping->end() && it->second == "true") << flag;
  }
  EXPECT_THAT(profile.messages.at("function"), Not(IsEmpty()));
}

TEST_F(SymbolizationE2eTest, WithoutSymbolizationWritesAddressesAndBuildIds) {
  Options options;
  options.output = testing::TestTmpDir() + "/symbolization_e2e_raw.pb.gz";
  options.cpu_period = absl::Milliseconds(1);
  options.symbolize = false;
  Library lib;
  ProfileWorkload(options, kBurnNs / 3, &lib);
  if (HasFatalFailure()) return;

  auto text = testing::ProtocDecode(options.output);
  ASSERT_TRUE(text.ok()) << text.status();
  const ProfileText profile = ParseProfileText(*text);
  // No function is named from the binaries: the only functions are the
  // profiler's own pseudo-frames ("[inprof: CPU since the thread's last
  // sample]"), which have no address.
  if (profile.messages.count("function") != 0) {
    for (const auto& f : profile.messages.at("function")) {
      EXPECT_THAT(StringField(profile, f, "name"), StartsWith("[inprof: "));
    }
  }
  EXPECT_THAT(*text, Not(HasSubstr("has_functions: true")));
  EXPECT_THAT(*text, Not(HasSubstr("has_filenames: true")));

  // Every other location is a bare address, nearly all inside a mapping.
  ASSERT_EQ(profile.messages.count("location"), 1u);
  size_t addresses = 0;
  size_t mapped = 0;
  for (const auto& loc : profile.messages.at("location")) {
    auto address = loc.find("address");
    if (address == loc.end()) continue;  // a pseudo-frame
    ++addresses;
    EXPECT_EQ(loc.count("line{}"), 0u) << "the location of an address has lines";
    if (loc.count("mapping_id") != 0) ++mapped;
  }
  EXPECT_GT(addresses, 0u);
  EXPECT_GE(mapped * 10, addresses * 9) << mapped << " of " << addresses;

  // The program and the library loaded after Start() have mappings with
  // their GNU build-ids, for symbolizing later.
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  ASSERT_GT(n, 0);
  for (const std::string& path : {std::string(exe, n), lib_path_}) {
    const auto* mapping = MappingOf(profile, path);
    ASSERT_NE(mapping, nullptr) << "no mapping for " << path;
    const std::string build_id = StringField(profile, *mapping, "build_id");
    EXPECT_TRUE(IsLowerHex(build_id)) << path << ": '" << build_id << "'";
    EXPECT_GE(build_id.size(), 16u) << path;
  }

  // go tool pprof still opens it (it may symbolize it from the binaries).
  auto samples = testing::ReadWithGoPprofRaw(options.output);
  ASSERT_TRUE(samples.ok()) << samples.status();
  EXPECT_THAT(*samples, Not(IsEmpty()));
}

}  // namespace
}  // namespace inprof
