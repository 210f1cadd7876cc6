// The symbolizer with debug info apart from the module: a separate debug
// file found by .gnu_debuglink or build-id, a dwz alt file, no descriptor
// kept, and never a debuginfod request. Linked into symbolizer_test
// (tests/meson.build).
#include "inprof/symbolizer.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "symbolize/symbolizer_test_util.h"
#include "util/test_util.h"

namespace inprof {
namespace {

using symbolizer_test::LoadedLib;
using symbolizer_test::ModuleIndexOf;
using symbolizer_test::TestLibPath;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

// --- Separate debug info ------------------------------------------------------

std::string ToolPath(const char* env, const char* fallback) {
  const char* path = std::getenv(env);
  return path != nullptr && path[0] != '\0' ? path : fallback;
}

// Sets an environment variable of this test process for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name); old != nullptr) old_ = old;
    had_ = std::getenv(name) != nullptr;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

// Copies of the test library split into a stripped library (no .symtab, no
// DWARF: strip --strip-debug --strip-unneeded) and its debug file (objcopy
// --only-keep-debug), as distributions ship them, in a scratch directory.
class SeparateDebugInfoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    lib_path_ = TestLibPath();
    ASSERT_THAT(lib_path_, Not(IsEmpty())) << "INPROF_SYMBOLIZER_TEST_LIB unset";
    dir_ = absl::StrCat(
        testing::TestTmpDir(), "/split_debug_", getpid(), "_",
        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    ASSERT_TRUE(Run(absl::StrCat("rm -rf ", Q(dir_), " && mkdir -p ",
                                 Q(dir_ + "/.debug")))
                    .ok());
  }
  void TearDown() override {
    if (!dir_.empty()) (void)Run(absl::StrCat("rm -rf ", Q(dir_)));
  }

  static std::string Q(const std::string& s) { return testing::ShellQuote(s); }

  static absl::Status Run(const std::string& cmd) {
    return testing::RunCommand(cmd).status();
  }

  // Writes `stripped` (a copy of the test library without symbols or debug
  // info) and `debug_file` (what was stripped).
  absl::Status Split(const std::string& stripped,
                     const std::string& debug_file) {
    const std::string objcopy = ToolPath("INPROF_OBJCOPY", "objcopy");
    const std::string strip = ToolPath("INPROF_STRIP", "strip");
    return Run(absl::StrCat("cp ", Q(lib_path_), " ", Q(stripped), " && ",
                            Q(objcopy), " --only-keep-debug ", Q(stripped), " ",
                            Q(debug_file), " && ", Q(strip),
                            " --strip-debug --strip-unneeded ", Q(stripped)));
  }

  // Adds a .gnu_debuglink naming `debug_file` (its base name and CRC) to
  // `stripped`. Runs in `dir_` so that relative paths resolve there.
  absl::Status AddDebuglink(const std::string& stripped,
                            const std::string& debug_file) {
    const std::string objcopy = ToolPath("INPROF_OBJCOPY", "objcopy");
    return Run(absl::StrCat("cd ", Q(dir_), " && ", Q(objcopy),
                            " --add-gnu-debuglink=", Q(debug_file), " ",
                            Q(stripped)));
  }

  // Expects `symbolizer` to name the library's file-local LibStaticHelper
  // with its file and line, which only the debug file can tell.
  static void ExpectNamesStaticHelper(Symbolizer& symbolizer,
                                      const LoadedLib& lib) {
    using AddressFn = uintptr_t (*)();
    using LineFn = int (*)();
    auto static_address =
        reinterpret_cast<AddressFn>(lib.Symbol("InprofTestLibStaticAddress"));
    auto static_line =
        reinterpret_cast<LineFn>(lib.Symbol("InprofTestLibStaticLine"));
    ASSERT_NE(static_address, nullptr);
    ASSERT_NE(static_line, nullptr);
    const SymbolizedAddress& r = symbolizer.Lookup(static_address(), false);
    ASSERT_GE(r.module, 0);
    ASSERT_THAT(r.frames, Not(IsEmpty()));
    const SourceFrame& f = r.frames.back();
    EXPECT_THAT(f.function, HasSubstr("LibStaticHelper"));
    EXPECT_THAT(f.file, EndsWith("symbolizer_test_lib.cc"));
    EXPECT_GE(f.line, static_line());
    EXPECT_LE(f.line, static_line() + 2);
    const Symbolizer::ModuleCapabilities caps =
        symbolizer.Capabilities(r.module);
    EXPECT_TRUE(caps.has_functions);
    EXPECT_TRUE(caps.has_filenames);
    EXPECT_TRUE(caps.has_line_numbers);
    EXPECT_TRUE(caps.has_inline_frames);
  }

  // Expects `symbolizer` not to know LibStaticHelper's name (the stripped
  // library alone does not have it).
  static void ExpectDoesNotNameStaticHelper(Symbolizer& symbolizer,
                                            const LoadedLib& lib) {
    using AddressFn = uintptr_t (*)();
    auto static_address =
        reinterpret_cast<AddressFn>(lib.Symbol("InprofTestLibStaticAddress"));
    ASSERT_NE(static_address, nullptr);
    const SymbolizedAddress& r = symbolizer.Lookup(static_address(), false);
    ASSERT_GE(r.module, 0);
    for (const SourceFrame& f : r.frames) {
      EXPECT_THAT(f.function, Not(HasSubstr("LibStaticHelper")));
      EXPECT_THAT(f.file, IsEmpty());
    }
  }

  std::string lib_path_;
  std::string dir_;
};

// The same scratch directory and checks for a library whose units libdw
// cannot find by itself.
using UnitLookupTest = SeparateDebugInfoTest;

// clang writes no .debug_aranges by default (and a GCC program that links
// clang-built objects has it for its own units only); libdw 0.188 then
// finds no unit for any address, so neither file, line nor inline frames.
// The units' own address ranges must serve: here the test library with
// its .debug_aranges removed.
TEST_F(UnitLookupTest, NamesFileLineAndInlineFramesWithoutDebugAranges) {
  const std::string copy = dir_ + "/libnoaranges.so";
  ASSERT_TRUE(Run(absl::StrCat("cp ", Q(lib_path_), " ", Q(copy), " && ",
                               Q(ToolPath("INPROF_OBJCOPY", "objcopy")),
                               " --remove-section=.debug_aranges ", Q(copy)))
                  .ok());
  Symbolizer symbolizer;
  LoadedLib lib(copy);
  ASSERT_TRUE(lib.ok()) << dlerror();
  symbolizer.Refresh();
  ASSERT_GE(ModuleIndexOf(symbolizer, copy), 0);
  ExpectNamesStaticHelper(symbolizer, lib);
}

TEST_F(SeparateDebugInfoTest, FindsDebugFileNamedByDebuglinkInDotDebugDir) {
  const std::string stripped = dir_ + "/libsplit.so";
  ASSERT_TRUE(Split(stripped, dir_ + "/.debug/libsplit.so.debug").ok());
  ASSERT_TRUE(AddDebuglink(stripped, ".debug/libsplit.so.debug").ok());

  Symbolizer symbolizer;  // before the dlopen, as in a running profiler
  LoadedLib lib(stripped);
  ASSERT_TRUE(lib.ok()) << dlerror();
  symbolizer.Refresh();
  ASSERT_GE(ModuleIndexOf(symbolizer, stripped), 0);
  ExpectNamesStaticHelper(symbolizer, lib);

  // Control: with nowhere to look, the stripped library alone cannot name it.
  Symbolizer blind;
  blind.SetDebugInfoPath("/nonexistent-inprof-debug");
  ExpectDoesNotNameStaticHelper(blind, lib);
}

TEST_F(SeparateDebugInfoTest, FindsDebugFileNamedByDebuglinkNextToTheLibrary) {
  const std::string stripped = dir_ + "/libsplit.so";
  ASSERT_TRUE(Split(stripped, dir_ + "/libsplit.debug").ok());
  ASSERT_TRUE(AddDebuglink(stripped, "libsplit.debug").ok());

  Symbolizer symbolizer;
  LoadedLib lib(stripped);
  ASSERT_TRUE(lib.ok()) << dlerror();
  symbolizer.Refresh();
  ExpectNamesStaticHelper(symbolizer, lib);
}

TEST_F(SeparateDebugInfoTest, IgnoresDebugFileOfAnotherBuild) {
  const std::string stripped = dir_ + "/libsplit.so";
  ASSERT_TRUE(Split(stripped, dir_ + "/.debug/libsplit.so.debug").ok());
  ASSERT_TRUE(AddDebuglink(stripped, ".debug/libsplit.so.debug").ok());
  // Same name, other contents: the debug info of this test program, whose
  // build-id differs (and so does the CRC the debuglink recorded).
  ASSERT_TRUE(Run(absl::StrCat(Q(ToolPath("INPROF_OBJCOPY", "objcopy")),
                               " --only-keep-debug /proc/self/exe ",
                               Q(dir_ + "/.debug/libsplit.so.debug")))
                  .ok());

  Symbolizer symbolizer;
  LoadedLib lib(stripped);
  ASSERT_TRUE(lib.ok()) << dlerror();
  symbolizer.Refresh();
  ExpectDoesNotNameStaticHelper(symbolizer, lib);
}

// The descriptors this process has open on `path` (through /proc/self/fd).
int DescriptorsOn(const std::string& path) {
  int count = 0;
  if (DIR* dir = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(dir)) {
      char target[PATH_MAX] = {};
      const std::string link = absl::StrCat("/proc/self/fd/", e->d_name);
      const ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
      if (n > 0 && path == std::string(target, static_cast<size_t>(n))) ++count;
    }
    closedir(dir);
  }
  return count;
}

// libdwfl closes a session's descriptors when the session ends, by number,
// and the program may have closed and reused that number meanwhile (a
// daemon's close_range): the symbolizer keeps none open, neither the
// module's file nor its separate debug file, while still reading both.
TEST_F(SeparateDebugInfoTest, KeepsNoDescriptorOfAModuleOrItsDebugFile) {
  const std::string stripped = dir_ + "/libsplit.so";
  const std::string debug_file = dir_ + "/.debug/libsplit.so.debug";
  ASSERT_TRUE(Split(stripped, debug_file).ok());
  ASSERT_TRUE(AddDebuglink(stripped, ".debug/libsplit.so.debug").ok());

  Symbolizer symbolizer;
  LoadedLib lib(stripped);
  ASSERT_TRUE(lib.ok()) << dlerror();
  symbolizer.Refresh();
  ExpectNamesStaticHelper(symbolizer, lib);  // read from both files
  EXPECT_EQ(DescriptorsOn(stripped), 0);
  EXPECT_EQ(DescriptorsOn(debug_file), 0);
}

// A dwz alt file (the DWARF several objects share, named by their
// .gnu_debugaltlink) is read, and no descriptor of it stays open: libdwfl
// and libdw would keep the one they open and close that number at the
// session's end.
TEST_F(SeparateDebugInfoTest, ReadsADwzAltFileWithoutKeepingItsDescriptor) {
  INPROF_REQUIRE_TOOL("dwz");
  const std::string dwz = testing::ToolPath("dwz");
  const std::vector<std::string> libs =
      absl::StrSplit(ToolPath("INPROF_DWZ_TEST_LIBS", ""), ':');
  ASSERT_EQ(libs.size(), 2u) << "INPROF_DWZ_TEST_LIBS unset";
  const std::string one = dir_ + "/libdwzone.so";
  const std::string two = dir_ + "/libdwztwo.so";
  const std::string common = dir_ + "/common.debug";
  ASSERT_TRUE(Run(absl::StrCat("cp ", Q(libs[0]), " ", Q(one), " && cp ",
                               Q(libs[1]), " ", Q(two), " && ", Q(dwz),
                               " -m ", Q(common), " -M ", Q(common), " ",
                               Q(one), " ", Q(two)))
                  .ok());

  Symbolizer symbolizer;
  LoadedLib lib(one);
  ASSERT_TRUE(lib.ok()) << dlerror();
  symbolizer.Refresh();
  const uintptr_t entry = lib.Symbol("InprofDwzEntryOne");
  ASSERT_NE(entry, 0u);
  Dl_info info;
  void* extra = nullptr;
  ASSERT_NE(dladdr1(reinterpret_cast<void*>(entry), &info, &extra,
                    RTLD_DL_SYMENT),
            0);
  const auto* sym = static_cast<const ElfW(Sym)*>(extra);
  ASSERT_NE(sym, nullptr);
  // The inlined function's DWARF (its name included) is in the alt file.
  bool named_inline = false;
  for (uintptr_t a = entry; a < entry + sym->st_size && !named_inline; ++a) {
    for (const SourceFrame& f : symbolizer.Lookup(a, false).frames) {
      if (absl::StrContains(f.function, "DwzSharedInline")) named_inline = true;
    }
  }
  EXPECT_TRUE(named_inline);
  EXPECT_EQ(DescriptorsOn(common), 0);
  EXPECT_EQ(DescriptorsOn(one), 0);
}

// /usr/lib/debug/.build-id/xx/yyyy.debug cannot be written by a test; the
// same lookup (libdwfl's dwfl_build_id_find_debuginfo) runs under every
// absolute entry of the debug-info path, so a scratch root stands in for
// /usr/lib/debug.
TEST_F(SeparateDebugInfoTest, FindsDebugFileByBuildIdUnderTheDebugInfoPath) {
  const std::string stripped = dir_ + "/libsplit.so";
  const std::string staged = dir_ + "/staged.debug";
  ASSERT_TRUE(Split(stripped, staged).ok());

  Symbolizer symbolizer;
  const std::string root = dir_ + "/root";
  symbolizer.SetDebugInfoPath(root);
  LoadedLib lib(stripped);
  ASSERT_TRUE(lib.ok()) << dlerror();
  symbolizer.Refresh();
  const int module = ModuleIndexOf(symbolizer, stripped);
  ASSERT_GE(module, 0);
  const std::string id = symbolizer.modules()[module].build_id;
  ASSERT_GT(id.size(), 2u);
  const std::string build_id_dir =
      absl::StrCat(root, "/.build-id/", id.substr(0, 2));
  ASSERT_TRUE(Run(absl::StrCat("mkdir -p ", Q(build_id_dir), " && mv ",
                               Q(staged), " ",
                               Q(absl::StrCat(build_id_dir, "/", id.substr(2),
                                              ".debug"))))
                  .ok());
  ExpectNamesStaticHelper(symbolizer, lib);

  // The default path (":.debug:/usr/lib/debug") does not have it.
  Symbolizer by_default;
  ExpectDoesNotNameStaticHelper(by_default, lib);
}

// libdwfl's standard search ends by asking debuginfod (dlopen'ing
// libdebuginfod and downloading) when DEBUGINFOD_URLS is set; the profiler
// must never touch the network behind the host's back. The URL points at a
// socket of this test: any request would show up as a connection.
TEST_F(SeparateDebugInfoTest, NeverAsksDebuginfodForMissingDebugInfo) {
  const std::string stripped = dir_ + "/libnodebug.so";
  ASSERT_TRUE(Split(stripped, dir_ + "/discarded.debug").ok());
  ASSERT_EQ(unlink((dir_ + "/discarded.debug").c_str()), 0);

  const int server =
      socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  ASSERT_GE(server, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ASSERT_EQ(bind(server, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(server, 16), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(getsockname(server, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);

  ScopedEnv urls("DEBUGINFOD_URLS", absl::StrCat("http://127.0.0.1:", port));
  // Should a regression ask anyway, fail in seconds rather than hang.
  ScopedEnv timeout("DEBUGINFOD_TIMEOUT", "2");
  ScopedEnv cache("DEBUGINFOD_CACHE_PATH", dir_ + "/debuginfod-cache");

  LoadedLib lib(stripped);
  ASSERT_TRUE(lib.ok()) << dlerror();
  Symbolizer symbolizer;
  // The exported function is still named, from .dynsym.
  const SymbolizedAddress& exported =
      symbolizer.Lookup(lib.Symbol("InprofTestLibFunction"), false);
  ASSERT_THAT(exported.frames, Not(IsEmpty()));
  EXPECT_EQ(exported.frames.back().function, "InprofTestLibFunction");
  EXPECT_THAT(exported.frames.back().file, IsEmpty());
  ExpectDoesNotNameStaticHelper(symbolizer, lib);

  const int client = accept(server, nullptr, nullptr);
  const int accept_errno = errno;
  EXPECT_EQ(client, -1) << "the symbolizer connected to DEBUGINFOD_URLS";
  EXPECT_TRUE(accept_errno == EAGAIN || accept_errno == EWOULDBLOCK);
  if (client >= 0) close(client);
  close(server);
  EXPECT_EQ(dlopen("libdebuginfod.so.1", RTLD_LAZY | RTLD_NOLOAD), nullptr)
      << "libdebuginfod was loaded into the process";
}

}  // namespace
}  // namespace inprof
