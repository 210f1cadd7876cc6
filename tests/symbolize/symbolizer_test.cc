#include "inprof/symbolizer.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <elfutils/libdwfl.h>
#include <fcntl.h>
#include <link.h>
#include <netinet/in.h>
#include <sys/auxv.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inprof/base/elf_notes.h"
#include "inprof/internal/process_maps.h"
#include "inprof/internal/line_table.h"
#include "symbolize/symbolizer_test_util.h"
#include "util/test_util.h"

namespace inprof {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::SizeIs;
using symbolizer_test::LoadedLib;
using symbolizer_test::ModuleIndexOf;
using symbolizer_test::TestLibPath;

// --- Code whose symbols the tests look up -----------------------------------

constexpr int kStaticFunctionLine = __LINE__ + 1;
__attribute__((noinline)) int StaticNoinlineFunction(int x) {
  asm volatile("" : "+r"(x));
  return x * 3 + 1;
}

// Returns its own return address: a pc inside whichever function called it.
__attribute__((noinline)) uintptr_t CapturePc() {
  uintptr_t pc = reinterpret_cast<uintptr_t>(__builtin_return_address(0));
  asm volatile("" : "+r"(pc));
  return pc;
}

int g_inline_call_line = 0;
int g_outer_call_line = 0;

__attribute__((always_inline)) inline uintptr_t AlwaysInlinedHelper() {
  // The call and __LINE__ share a line.
  uintptr_t pc = (g_inline_call_line = __LINE__, CapturePc());
  asm volatile("" : "+r"(pc));
  return pc;
}

__attribute__((noinline)) uintptr_t OuterWithInlinedHelper() {
  uintptr_t pc = (g_outer_call_line = __LINE__, AlwaysInlinedHelper());
  asm volatile("" : "+r"(pc));  // keeps the call from being a tail call
  return pc;
}

// -----------------------------------------------------------------------------

std::string ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteFileBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// An ELF note: header, name padded, descriptor padded to `align`.
std::vector<uint8_t> Note(uint32_t type, const std::string& name, const std::string& desc,
                          size_t align, bool pad_last = true) {
  std::vector<uint8_t> out(12);
  const uint32_t namesz = static_cast<uint32_t>(name.size() + 1);
  const uint32_t descsz = static_cast<uint32_t>(desc.size());
  std::memcpy(out.data(), &namesz, 4);
  std::memcpy(out.data() + 4, &descsz, 4);
  std::memcpy(out.data() + 8, &type, 4);
  out.insert(out.end(), name.begin(), name.end());
  out.push_back(0);
  while (out.size() % align != 0) out.push_back(0);
  out.insert(out.end(), desc.begin(), desc.end());
  while (pad_last && out.size() % align != 0) out.push_back(0);
  return out;
}

TEST(ElfNotesTest, BuildIdIsFoundInFourAndEightAlignedSegments) {
  const std::string id = "\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\x10\x11\x12\x13\x14";
  for (size_t align : {4, 8}) {
    // A GNU property note first (type 5; 8-aligned in real binaries),
    // then the build-id (type 3).
    std::vector<uint8_t> notes = Note(5, "GNU", std::string(12, '\x7f'), align);
    const std::vector<uint8_t> build_id = Note(3, "GNU", id, align);
    notes.insert(notes.end(), build_id.begin(), build_id.end());
    EXPECT_EQ(internal::GnuBuildIdFromNotes(notes.data(), notes.size(), align), id)
        << "align " << align;
  }
  // Another vendor's note of type 3 is not a build-id.
  const std::vector<uint8_t> other = Note(3, "XYZ", id, 4);
  EXPECT_EQ(internal::GnuBuildIdFromNotes(other.data(), other.size()), "");
}

TEST(ElfNotesTest, MalformedNotesNeverReadOutsideTheBlock) {
  // Each block is copied into a buffer of exactly its size: ASan reports a
  // read past it.
  auto parse = [](const std::vector<uint8_t>& block, size_t size, size_t align) {
    std::vector<uint8_t> exact(block.begin(), block.begin() + size);
    return internal::GnuBuildIdFromNotes(exact.data(), exact.size(), align);
  };
  // The last note's descriptor ends the block unpadded: the next note
  // would start past the end.
  const std::vector<uint8_t> unpadded = Note(1, "GNU", "abc", 8, /*pad_last=*/false);
  EXPECT_EQ(parse(unpadded, unpadded.size(), 8), "");
  // Truncated in the header, in the name, in the descriptor.
  const std::vector<uint8_t> build_id = Note(3, "GNU", "0123456789abcdef0123", 4);
  for (size_t size : {size_t{0}, size_t{11}, size_t{14}, size_t{20}, build_id.size() - 1}) {
    EXPECT_EQ(parse(build_id, size, 4), "") << "size " << size;
  }
  EXPECT_EQ(parse(build_id, build_id.size(), 4), "0123456789abcdef0123");
  // Sizes near 4 GiB must not wrap to small ones.
  std::vector<uint8_t> huge = build_id;
  const uint32_t big = 0xfffffffd;
  std::memcpy(huge.data() + 4, &big, 4);
  EXPECT_EQ(parse(huge, huge.size(), 4), "");
  std::memcpy(huge.data(), &big, 4);
  EXPECT_EQ(parse(huge, huge.size(), 8), "");
}

TEST(SymbolizerTest, ModuleMapListsMainProgramFirstWithBuildId) {
  Symbolizer symbolizer;
  ASSERT_THAT(symbolizer.modules(), Not(IsEmpty()));
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  ASSERT_GT(n, 0);
  const ModuleInfo& main_module = symbolizer.modules()[0];
  EXPECT_EQ(main_module.path, std::string(exe, n));
  EXPECT_THAT(main_module.build_id, Not(IsEmpty()));
  EXPECT_LT(main_module.start, main_module.limit);
  const uintptr_t fn = reinterpret_cast<uintptr_t>(&StaticNoinlineFunction);
  EXPECT_EQ(symbolizer.Lookup(fn, false).module, 0);
}

TEST(SymbolizerTest, NamesStaticFunctionWithFileAndLine) {
  Symbolizer symbolizer;
  const uintptr_t fn = reinterpret_cast<uintptr_t>(&StaticNoinlineFunction);
  const SymbolizedAddress& result = symbolizer.Lookup(fn, false);
  ASSERT_GE(result.module, 0);
  ASSERT_THAT(result.frames, SizeIs(1));
  const SourceFrame& frame = result.frames[0];
  EXPECT_THAT(frame.function, HasSubstr("StaticNoinlineFunction"));
  EXPECT_THAT(frame.system_name, HasSubstr("StaticNoinlineFunction"));
  EXPECT_THAT(frame.file, EndsWith("symbolizer_test.cc"));
  EXPECT_GE(frame.line, kStaticFunctionLine);
  EXPECT_LE(frame.line, kStaticFunctionLine + 2);

  const Symbolizer::ModuleCapabilities caps =
      symbolizer.Capabilities(result.module);
  EXPECT_TRUE(caps.has_functions);
  EXPECT_TRUE(caps.has_filenames);
  EXPECT_TRUE(caps.has_line_numbers);
}

TEST(SymbolizerTest, ExpandsInlinedFunctionWithItsCallerNext) {
  const uintptr_t pc = OuterWithInlinedHelper();
  Symbolizer symbolizer;
  const SymbolizedAddress& result = symbolizer.Lookup(pc, true);
  ASSERT_GE(result.module, 0);
  ASSERT_THAT(result.frames, SizeIs(2));
  EXPECT_THAT(result.frames[0].function, HasSubstr("AlwaysInlinedHelper"));
  EXPECT_THAT(result.frames[0].file, EndsWith("symbolizer_test.cc"));
  EXPECT_EQ(result.frames[0].line, g_inline_call_line);
  EXPECT_THAT(result.frames[1].function, HasSubstr("OuterWithInlinedHelper"));
  EXPECT_THAT(result.frames[1].file, EndsWith("symbolizer_test.cc"));
  EXPECT_EQ(result.frames[1].line, g_outer_call_line);
  EXPECT_TRUE(symbolizer.Capabilities(result.module).has_inline_frames);
}

// Without system debug info (a Profiler's default), a libc function is
// named from libc's symbol table and its debug info is never read: no file,
// no line, and the module does not claim inline frames.
TEST(SymbolizerTest, SystemLibrariesAreNamedFromTheirSymbolTables) {
  void* fn = dlsym(RTLD_DEFAULT, "getpid");
  ASSERT_NE(fn, nullptr);
  Dl_info info;
  ASSERT_NE(dladdr(fn, &info), 0);
  const std::string libc = info.dli_fname;
  if (libc.rfind("/lib", 0) != 0 && libc.rfind("/usr/lib", 0) != 0) {
    GTEST_SKIP() << "libc is not under /lib or /usr/lib here: " << libc;
  }
  Symbolizer symbolizer;
  symbolizer.set_system_debug_info(false);
  symbolizer.Refresh();
  const SymbolizedAddress& s =
      symbolizer.Lookup(reinterpret_cast<uint64_t>(fn), false);
  ASSERT_GE(s.module, 0);
  ASSERT_THAT(s.frames, SizeIs(1));
  EXPECT_THAT(s.frames[0].function, HasSubstr("getpid"));
  EXPECT_THAT(s.frames[0].file, IsEmpty());
  EXPECT_EQ(s.frames[0].line, 0);
  EXPECT_FALSE(symbolizer.Capabilities(s.module).has_inline_frames);
  EXPECT_TRUE(symbolizer.Capabilities(s.module).has_functions);
}

TEST(SymbolizerTest, ReturnAddressNamesTheCallSite) {
  const uintptr_t pc = OuterWithInlinedHelper();
  Symbolizer symbolizer;
  // As a pc, a return address can already belong to the next line (or the
  // next function); as a return address it names the call.
  const SymbolizedAddress& as_return = symbolizer.Lookup(pc, true);
  ASSERT_THAT(as_return.frames, Not(IsEmpty()));
  EXPECT_EQ(as_return.frames[0].line, g_inline_call_line);
}

TEST(SymbolizerTest, UnmappedAddressHasNoModule) {
  Symbolizer symbolizer;
  const SymbolizedAddress& result = symbolizer.Lookup(0x10, false);
  EXPECT_EQ(result.module, -1);
  EXPECT_THAT(result.frames, IsEmpty());
}

TEST(SymbolizerTest, WithoutSymbolizationOnlyMapsModules) {
  Symbolizer symbolizer(/*symbolize=*/false);
  const uintptr_t fn = reinterpret_cast<uintptr_t>(&StaticNoinlineFunction);
  const SymbolizedAddress& result = symbolizer.Lookup(fn, false);
  EXPECT_EQ(result.module, 0);
  EXPECT_THAT(result.frames, IsEmpty());
  EXPECT_FALSE(symbolizer.Capabilities(0).has_functions);
}

TEST(SymbolizerTest, NamesVdsoFunctions) {
  if (getauxval(AT_SYSINFO_EHDR) == 0) GTEST_SKIP() << "no vDSO";
  Symbolizer symbolizer;
  const int vdso = ModuleIndexOf(symbolizer, "[vdso]");
  ASSERT_GE(vdso, 0);
  const ModuleInfo& module = symbolizer.modules()[vdso];
  bool named = false;
  for (uint64_t a = module.start; a < module.limit && !named; a += 4) {
    const SymbolizedAddress& r = symbolizer.Lookup(a, false);
    EXPECT_EQ(r.module, vdso);
    for (const SourceFrame& f : r.frames) {
      named = named || absl::StrContains(f.function, "clock_gettime");
    }
  }
  EXPECT_TRUE(named) << "no vDSO address resolved to clock_gettime";
}

// PLT stubs carry no symbol; they are named "<function>@plt" as objdump
// prints them. Every stub objdump lists in this test binary is checked.
TEST(SymbolizerTest, NamesPltStubsAsObjdumpDoes) {
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  ASSERT_GT(len, 0);
  self[len] = '\0';
  auto listing = testing::RunCommand(
      "objdump -d -j .plt -j .plt.sec " + testing::ShellQuote(self) +
      " 2>/dev/null | grep '@plt>:$'");
  ASSERT_TRUE(listing.ok()) << listing.status();
  // The executable's load bias (PIE): the first dl_iterate_phdr entry.
  uintptr_t bias = 0;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        *static_cast<uintptr_t*>(out) = info->dlpi_addr;
        return 1;
      },
      &bias);
  Symbolizer symbolizer;
  int checked = 0;
  for (absl::string_view line : absl::StrSplit(*listing, '\n')) {
    // "0000000000012030 <strlen@plt>:"
    const size_t lt = line.find(" <");
    if (lt == absl::string_view::npos || !absl::EndsWith(line, ">:")) continue;
    uint64_t address = 0;
    ASSERT_TRUE(absl::SimpleHexAtoi(line.substr(0, lt), &address)) << line;
    const std::string want(line.substr(lt + 2, line.size() - lt - 4));
    // The stub's first and last byte.
    for (uint64_t at : {address, address + 15}) {
      const SymbolizedAddress& r = symbolizer.Lookup(bias + at, false);
      ASSERT_FALSE(r.frames.empty()) << want << " at 0x" << std::hex << at;
      EXPECT_EQ(r.frames.back().function, want);
    }
    ++checked;
  }
  std::printf("%d PLT stubs named\n", checked);
  EXPECT_GT(checked, 10);
}

TEST(SymbolizerTest, FindsLibraryDlopenedAfterConstructionOnRefresh) {
  const std::string lib_path = TestLibPath();
  ASSERT_THAT(lib_path, Not(IsEmpty())) << "INPROF_SYMBOLIZER_TEST_LIB unset";
  Symbolizer symbolizer;
  ASSERT_EQ(ModuleIndexOf(symbolizer, lib_path), -1);
  const uintptr_t main_fn =
      reinterpret_cast<uintptr_t>(&StaticNoinlineFunction);
  const SymbolizedAddress* main_before = &symbolizer.Lookup(main_fn, false);

  LoadedLib lib(lib_path);
  ASSERT_TRUE(lib.ok()) << dlerror();
  const uintptr_t fn = lib.Symbol("InprofTestLibFunction");
  ASSERT_NE(fn, 0u);
  // Before Refresh() the library is unknown.
  EXPECT_EQ(symbolizer.Lookup(fn, false).module, -1);

  symbolizer.Refresh();
  const int module = ModuleIndexOf(symbolizer, lib_path);
  ASSERT_GE(module, 0);
  EXPECT_THAT(symbolizer.modules()[module].build_id, Not(IsEmpty()));
  const SymbolizedAddress& result = symbolizer.Lookup(fn, false);
  EXPECT_EQ(result.module, module);
  ASSERT_THAT(result.frames, Not(IsEmpty()));
  EXPECT_EQ(result.frames.back().function, "InprofTestLibFunction");
  EXPECT_THAT(result.frames.back().file, EndsWith("symbolizer_test_lib.cc"));

  // A file-local function of the library is named from .symtab.
  using AddressFn = uintptr_t (*)();
  auto static_address =
      reinterpret_cast<AddressFn>(lib.Symbol("InprofTestLibStaticAddress"));
  ASSERT_NE(static_address, nullptr);
  const SymbolizedAddress& helper = symbolizer.Lookup(static_address(), false);
  ASSERT_THAT(helper.frames, Not(IsEmpty()));
  EXPECT_THAT(helper.frames.back().function, HasSubstr("LibStaticHelper"));

  // The main program's cached result survived the module-map rebuild.
  EXPECT_EQ(&symbolizer.Lookup(main_fn, false), main_before);

  lib.Close();
  symbolizer.Refresh();
  if (ModuleIndexOf(symbolizer, lib_path) == -1) {
    EXPECT_EQ(symbolizer.Lookup(fn, false).module, -1);
  }
  EXPECT_EQ(symbolizer.Lookup(main_fn, false).module, 0);
  EXPECT_THAT(symbolizer.Lookup(main_fn, false).frames, Not(IsEmpty()));
}

TEST(SymbolizerTest, RefreshWithoutChangesKeepsModulesAndCache) {
  Symbolizer symbolizer;
  const uintptr_t fn = reinterpret_cast<uintptr_t>(&StaticNoinlineFunction);
  const std::vector<ModuleInfo> before = symbolizer.modules();
  const SymbolizedAddress* cached = &symbolizer.Lookup(fn, false);
  symbolizer.Refresh();
  ASSERT_EQ(symbolizer.modules().size(), before.size());
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_EQ(symbolizer.modules()[i].path, before[i].path);
    EXPECT_EQ(symbolizer.modules()[i].start, before[i].start);
  }
  EXPECT_EQ(&symbolizer.Lookup(fn, false), cached);
}

TEST(SymbolizerTest, UnreadableModuleWarnsOnceAndKeepsItsModule) {
  const std::string lib_path = TestLibPath();
  ASSERT_THAT(lib_path, Not(IsEmpty())) << "INPROF_SYMBOLIZER_TEST_LIB unset";
  const std::string copy =
      absl::StrCat(testing::TestTmpDir(), "/deleted_lib_", getpid(), ".so");
  WriteFileBytes(copy, ReadFileBytes(lib_path));
  LoadedLib lib(copy);
  ASSERT_TRUE(lib.ok()) << dlerror();
  ASSERT_EQ(unlink(copy.c_str()), 0);
  const uintptr_t fn = lib.Symbol("InprofTestLibFunction");
  ASSERT_NE(fn, 0u);

  Symbolizer symbolizer;
  ::testing::internal::CaptureStderr();
  const SymbolizedAddress first = symbolizer.Lookup(fn, false);
  const SymbolizedAddress second = symbolizer.Lookup(fn + 1, false);
  const std::string err = ::testing::internal::GetCapturedStderr();

  const int module = ModuleIndexOf(symbolizer, copy);
  ASSERT_GE(module, 0);
  EXPECT_EQ(first.module, module);
  EXPECT_EQ(second.module, module);
  EXPECT_THAT(first.frames, IsEmpty());
  EXPECT_THAT(second.frames, IsEmpty());
  const std::string expected =
      absl::StrCat("inprof: cannot read symbols of ", copy, ": ");
  EXPECT_THAT(err, HasSubstr(expected));
  EXPECT_EQ(err.find(expected), err.rfind(expected)) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  EXPECT_FALSE(symbolizer.Capabilities(module).has_functions);
}

TEST(ProcessMapsTest, ParsesWhatTheKernelWrites) {
  auto maps = internal::ParseProcessMaps(
      "55d0c0a00000-55d0c0a02000 r--p 00000000 08:01 1048602                    /usr/bin/cat\n"
      "55d0c0a02000-55d0c0a07000 r-xp 00002000 08:01 1048602                    /usr/bin/cat\n"
      "7f1e2c000000-7f1e2c021000 rw-p 00000000 00:00 0 \n"
      "7f1e2d1a0000-7f1e2d1c5000 r-xp 00026000 fd:00 42   /tmp/a lib with spaces.so (deleted)\n"
      "7ffc8a1f2000-7ffc8a1f4000 r-xp 00000000 00:00 0                          [vdso]\n");
  ASSERT_TRUE(maps.ok()) << maps.status();
  ASSERT_THAT(*maps, SizeIs(5));
  EXPECT_EQ((*maps)[1].start, 0x55d0c0a02000u);
  EXPECT_EQ((*maps)[1].limit, 0x55d0c0a07000u);
  EXPECT_TRUE((*maps)[1].executable);
  EXPECT_FALSE((*maps)[0].executable);
  EXPECT_EQ((*maps)[1].offset, 0x2000u);
  EXPECT_EQ((*maps)[1].dev_major, 8u);
  EXPECT_EQ((*maps)[1].inode, 1048602u);
  EXPECT_EQ((*maps)[1].path, "/usr/bin/cat");
  EXPECT_EQ((*maps)[2].path, "");
  EXPECT_EQ((*maps)[3].path, "/tmp/a lib with spaces.so");
  EXPECT_TRUE((*maps)[3].deleted);
  EXPECT_EQ((*maps)[3].dev_major, 0xfdu);
  EXPECT_EQ((*maps)[4].path, "[vdso]");

  auto bad = internal::ParseProcessMaps(
      "55d0c0a00000-55d0c0a02000 r--p 00000000 08:01 1 /a\nnot a maps line\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "maps line 2: expected START-END in hex: \"not a maps line\"");
  EXPECT_FALSE(internal::ParseProcessMaps("2000-1000 r--p 0 08:01 1 /a").ok());
  EXPECT_FALSE(internal::ParseProcessMaps("1000-2000 r-- 0 08:01 1 /a").ok());
  EXPECT_FALSE(internal::ParseProcessMaps("1000-2000 r--p 0 0801 1 /a").ok());
  auto mine = internal::ReadProcessMaps(getpid());
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_THAT(*mine, Not(IsEmpty()));
}

// Another process, for ForProcess: this test binary re-executed with
// INPROF_REMOTE_CHILD_LIB set dlopen()s that library, writes the addresses
// of InprofTestLibFunction and of the library's static helper to stdout,
// and waits until its stdin closes (a global constructor: before gtest's
// main).
__attribute__((constructor)) void RemoteChildMain() {
  const char* lib = std::getenv("INPROF_REMOTE_CHILD_LIB");
  if (lib == nullptr) return;
  void* handle = dlopen(lib, RTLD_NOW);
  if (handle == nullptr) _exit(3);
  const auto fn = reinterpret_cast<uintptr_t>(dlsym(handle, "InprofTestLibFunction"));
  auto static_address = reinterpret_cast<uintptr_t (*)()>(
      dlsym(handle, "InprofTestLibStaticAddress"));
  if (fn == 0 || static_address == nullptr) _exit(4);
  const std::string line = absl::StrCat(fn, " ", static_address(), "\n");
  if (write(1, line.data(), line.size()) != static_cast<ssize_t>(line.size())) _exit(5);
  char c;
  while (read(0, &c, 1) > 0) {
  }
  _exit(0);
}

// The agent's view (library mode): addresses of another process, read from its
// /proc/PID/maps, with the library it loaded replaced on disk before the
// symbolizer looked, and still after the process exited.
TEST(SymbolizerTest, AnotherProcessIsSymbolizedFromItsMapsAlsoAfterItExited) {
  const std::string lib_path = TestLibPath();
  ASSERT_THAT(lib_path, Not(IsEmpty())) << "INPROF_SYMBOLIZER_TEST_LIB unset";
  // A copy that only the child loads: its addresses exist only there.
  const std::string copy =
      absl::StrCat(testing::TestTmpDir(), "/remote_lib_", getpid(), ".so");
  WriteFileBytes(copy, ReadFileBytes(lib_path));
  int to_child[2], from_child[2];
  ASSERT_EQ(pipe2(to_child, O_CLOEXEC), 0);
  ASSERT_EQ(pipe2(from_child, O_CLOEXEC), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    dup2(to_child[0], 0);
    dup2(from_child[1], 1);
    setenv("INPROF_REMOTE_CHILD_LIB", copy.c_str(), 1);
    execl("/proc/self/exe", "symbolizer_test", nullptr);
    _exit(127);
  }
  close(to_child[0]);
  close(from_child[1]);
  std::string line;
  char c;
  while (read(from_child[0], &c, 1) == 1 && c != '\n') line += c;
  close(from_child[0]);
  std::vector<std::string> fields = absl::StrSplit(line, ' ');
  uint64_t fn = 0, helper = 0;
  ASSERT_EQ(fields.size(), 2u) << "child said \"" << line << "\"";
  ASSERT_TRUE(absl::SimpleAtoi(fields[0], &fn));
  ASSERT_TRUE(absl::SimpleAtoi(fields[1], &helper));

  // Replaced on disk (a new inode at the same path, as a package upgrade
  // does): the symbolizer must read what the child mapped.
  const std::string other = copy + ".new";
  WriteFileBytes(other, ReadFileBytes("/proc/self/exe"));
  ASSERT_EQ(rename(other.c_str(), copy.c_str()), 0);

  auto symbolizer = Symbolizer::ForProcess(child);
  ASSERT_TRUE(symbolizer.ok()) << symbolizer.status();
  const int module = ModuleIndexOf(**symbolizer, copy);
  ASSERT_GE(module, 0) << "the child's library is not in its module map";
  const SymbolizedAddress& at_fn = (*symbolizer)->Lookup(fn, false);
  EXPECT_EQ(at_fn.module, module);
  ASSERT_THAT(at_fn.frames, Not(IsEmpty()));
  EXPECT_EQ(at_fn.frames.back().function, "InprofTestLibFunction");
  EXPECT_FALSE((*symbolizer)->modules()[module].build_id.empty());
  // Its vDSO, read from this process's (the same kernel's) image, placed
  // where the child has it.
  if (getauxval(AT_SYSINFO_EHDR) != 0) {
    const int vdso = ModuleIndexOf(**symbolizer, "[vdso]");
    ASSERT_GE(vdso, 0);
    const ModuleInfo m = (*symbolizer)->modules()[vdso];
    bool named = false;
    for (uint64_t a = m.start; a < m.limit && !named; a += 4) {
      for (const SourceFrame& f : (*symbolizer)->Lookup(a, false).frames) {
        named = named || absl::StrContains(f.function, "clock_gettime");
      }
    }
    EXPECT_TRUE(named) << "no address of the child's vDSO named clock_gettime";
  }
  // Not in this process: the same address means nothing here (or
  // something else).
  Symbolizer self;
  const SymbolizedAddress& here = self.Lookup(fn, false);
  EXPECT_TRUE(here.frames.empty() || here.frames.back().function != "InprofTestLibFunction");

  // The child exits; a lookup of an address not looked up before still
  // reads the library it mapped.
  close(to_child[1]);
  // Exited but not reaped (a zombie, as when its parent is busy): its maps
  // read empty, which must not empty the module map.
  siginfo_t exited;
  ASSERT_EQ(waitid(P_PID, child, &exited, WEXITED | WNOWAIT), 0);
  (*symbolizer)->Refresh();
  EXPECT_EQ(ModuleIndexOf(**symbolizer, copy), module) << "forgotten while a zombie";
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  (*symbolizer)->Refresh();
  const SymbolizedAddress& at_helper = (*symbolizer)->Lookup(helper, false);
  EXPECT_EQ(at_helper.module, module);
  ASSERT_THAT(at_helper.frames, Not(IsEmpty()));
  EXPECT_THAT(at_helper.frames.back().function, HasSubstr("LibStaticHelper"));
  EXPECT_THAT(at_helper.frames.back().file, HasSubstr("symbolizer_test_lib.cc"));
  unlink(copy.c_str());

  auto gone = Symbolizer::ForProcess(child);
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.status().message(),
            absl::StrCat("cannot read /proc/", child, "/maps: No such file or directory"));
}

TEST(SymbolizerTest, SymbolizeFileNamesFunctionsOfAFileOnDisk) {
  const std::string lib_path = TestLibPath();
  ASSERT_THAT(lib_path, Not(IsEmpty())) << "INPROF_SYMBOLIZER_TEST_LIB unset";
  LoadedLib lib(lib_path);
  ASSERT_TRUE(lib.ok()) << dlerror();
  const uint64_t file_address =
      lib.Symbol("InprofTestLibFunction") - lib.Bias();
  auto frames = Symbolizer::SymbolizeFile(lib_path, {file_address});
  ASSERT_TRUE(frames.ok()) << frames.status();
  ASSERT_THAT(*frames, SizeIs(1));
  ASSERT_THAT((*frames)[0], Not(IsEmpty()));
  EXPECT_EQ((*frames)[0].back().function, "InprofTestLibFunction");
}

TEST(SymbolizerTest, SymbolizeFileFailsNamingAMissingFile) {
  const std::string path = testing::TestTmpDir() + "/no_such_file.so";
  auto frames = Symbolizer::SymbolizeFile(path, {0x1000});
  ASSERT_FALSE(frames.ok());
  EXPECT_THAT(frames.status().message(), HasSubstr(path));
}

TEST(SymbolizerTest, RefreshEmptiesTheCacheWhenOverItsCap) {
  Symbolizer symbolizer;
  EXPECT_EQ(symbolizer.max_cached_bytes(), Symbolizer::kDefaultMaxCachedBytes);
  EXPECT_EQ(symbolizer.cached_addresses(), 0u);
  EXPECT_EQ(symbolizer.cached_bytes(), 0u);
  const uintptr_t fn = reinterpret_cast<uintptr_t>(&StaticNoinlineFunction);
  for (uintptr_t i = 0; i < 8; ++i) symbolizer.Lookup(fn + i, false);
  EXPECT_EQ(symbolizer.cached_addresses(), 8u);
  // Each entry holds at least its frame, whose names are longer than a
  // std::string keeps inline.
  EXPECT_GE(symbolizer.cached_bytes(),
            8 * (sizeof(SymbolizedAddress) + sizeof(SourceFrame) +
                 sizeof("StaticNoinlineFunction")));
  const size_t bytes_of_eight = symbolizer.cached_bytes();
  // A repeated lookup is a cache hit and adds nothing.
  symbolizer.Lookup(fn, false);
  EXPECT_EQ(symbolizer.cached_bytes(), bytes_of_eight);

  // At or under the cap, Refresh() keeps everything.
  symbolizer.set_max_cached_bytes(bytes_of_eight);
  symbolizer.Refresh();
  EXPECT_EQ(symbolizer.cached_addresses(), 8u);
  EXPECT_EQ(symbolizer.cached_bytes(), bytes_of_eight);

  // Over it, Refresh() empties the cache.
  symbolizer.Lookup(fn + 8, false);
  EXPECT_EQ(symbolizer.cached_addresses(), 9u);
  EXPECT_GT(symbolizer.cached_bytes(), bytes_of_eight);
  symbolizer.Refresh();
  EXPECT_EQ(symbolizer.cached_addresses(), 0u);
  EXPECT_EQ(symbolizer.cached_bytes(), 0u);

  // Lookups after the purge symbolize as before.
  const SymbolizedAddress& again = symbolizer.Lookup(fn, false);
  ASSERT_THAT(again.frames, Not(IsEmpty()));
  EXPECT_THAT(again.frames[0].function, HasSubstr("StaticNoinlineFunction"));
  EXPECT_EQ(symbolizer.cached_addresses(), 1u);
}

TEST(SymbolizerTest, CacheAccountingDropsUnloadedModules) {
  const std::string lib_path = TestLibPath();
  ASSERT_THAT(lib_path, Not(IsEmpty())) << "INPROF_SYMBOLIZER_TEST_LIB unset";
  const std::string copy =
      absl::StrCat(testing::TestTmpDir(), "/cache_lib_", getpid(), ".so");
  WriteFileBytes(copy, ReadFileBytes(lib_path));
  Symbolizer symbolizer;
  const uintptr_t main_fn =
      reinterpret_cast<uintptr_t>(&StaticNoinlineFunction);
  symbolizer.Lookup(main_fn, false);
  const size_t main_bytes = symbolizer.cached_bytes();
  {
    LoadedLib lib(copy);
    ASSERT_TRUE(lib.ok()) << dlerror();
    symbolizer.Refresh();
    symbolizer.Lookup(lib.Symbol("InprofTestLibFunction"), false);
    EXPECT_EQ(symbolizer.cached_addresses(), 2u);
    EXPECT_GT(symbolizer.cached_bytes(), main_bytes);
  }
  symbolizer.Refresh();
  unlink(copy.c_str());
  if (ModuleIndexOf(symbolizer, copy) != -1) {
    GTEST_SKIP() << "the loader kept the library mapped after dlclose";
  }
  EXPECT_EQ(symbolizer.cached_addresses(), 1u);
  EXPECT_EQ(symbolizer.cached_bytes(), main_bytes);
}

// Copies of a real ELF file, truncated or with random bytes overwritten, must
// never crash the symbolizer: they either symbolize (possibly to nothing) or
// fail with a status that names the file.
TEST(SymbolizerTest, CorruptedElfFilesNeverCrash) {
  const std::string lib_path = TestLibPath();
  ASSERT_THAT(lib_path, Not(IsEmpty())) << "INPROF_SYMBOLIZER_TEST_LIB unset";
  const std::string original = ReadFileBytes(lib_path);
  ASSERT_GT(original.size(), 1024u);
  uint64_t function_address = 0;
  {
    LoadedLib lib(lib_path);
    ASSERT_TRUE(lib.ok()) << dlerror();
    function_address = lib.Symbol("InprofTestLibFunction") - lib.Bias();
  }
  const std::vector<uint64_t> addresses = {0,
                                           1,
                                           function_address,
                                           function_address + 3,
                                           function_address + 64,
                                           0x1000,
                                           0x7fffffff,
                                           ~uint64_t{0}};

  std::mt19937_64 rng(20240601);  // fixed seed: failures reproduce
  const std::string path =
      absl::StrCat(testing::TestTmpDir(), "/corrupt_elf_", getpid(), ".so");
  int truncated_failures = 0;
  int corrupted_failures = 0;
  constexpr int kTruncations = 100;
  constexpr int kCorruptions = 300;
  for (int i = 0; i < kTruncations + kCorruptions; ++i) {
    std::string bytes = original;
    const bool truncate = i < kTruncations;
    if (truncate) {
      bytes.resize(rng() % original.size());
    } else {
      // Aim a third of the damage at the headers, a third at the section
      // header table (at the end of the file) and a third anywhere (mostly
      // debug info).
      const int edits = 1 + static_cast<int>(rng() % 32);
      for (int e = 0; e < edits; ++e) {
        size_t pos;
        switch (rng() % 3) {
          case 0:
            pos = rng() % 1024;
            break;
          case 1:
            pos = bytes.size() - 1 - rng() % 2048;
            break;
          default:
            pos = rng() % bytes.size();
        }
        bytes[pos] = static_cast<char>(rng());
      }
    }
    WriteFileBytes(path, bytes);
    SCOPED_TRACE(absl::StrCat("variant ", i,
                              truncate ? " (truncated to " : " (", bytes.size(),
                              " bytes)"));
    auto frames = Symbolizer::SymbolizeFile(path, addresses);
    if (frames.ok()) {
      EXPECT_FALSE(truncate) << "a truncated file symbolized";
      EXPECT_THAT(*frames, SizeIs(addresses.size()));
    } else {
      EXPECT_THAT(frames.status().message(), HasSubstr(path));
      (truncate ? truncated_failures : corrupted_failures)++;
    }
  }
  unlink(path.c_str());
  EXPECT_EQ(truncated_failures, kTruncations);
  EXPECT_GT(corrupted_failures, 0);

  // The undamaged file still symbolizes.
  auto frames = Symbolizer::SymbolizeFile(lib_path, {function_address});
  ASSERT_TRUE(frames.ok()) << frames.status();
  ASSERT_THAT((*frames)[0], Not(IsEmpty()));
}

}  // namespace
}  // namespace inprof

namespace inprof {
namespace {

// The symbol-table lookup (system libraries, named without their DWARF)
// gives the symbol dwfl_module_addrinfo() gives, at 3,000 addresses spread
// over libc's and libstdc++'s code (with libc6-dbg: libc's 10,000-symbol
// table from its debug file; dwfl_module_addrinfo scans it at every call,
// hence not more), and also names the PLT stubs, which have no symbol,
// "<function>@plt".
TEST(SymbolizerTest, SymbolTableNamesWhatDwflModuleAddrinfoNames) {
  Symbolizer symbolizer;
  symbolizer.set_system_debug_info(false);
  symbolizer.Refresh();
  char* debuginfo_path = nullptr;
  Dwfl_Callbacks callbacks{};
  callbacks.find_elf = dwfl_linux_proc_find_elf;
  // Not dwfl_standard_find_debuginfo: it loads libdebuginfod into the
  // process, which a later test checks the symbolizer never does.
  callbacks.find_debuginfo = dwfl_build_id_find_debuginfo;
  callbacks.debuginfo_path = &debuginfo_path;
  Dwfl* dwfl = dwfl_begin(&callbacks);
  ASSERT_NE(dwfl, nullptr);
  ASSERT_EQ(dwfl_linux_proc_report(dwfl, getpid()), 0);
  ASSERT_EQ(dwfl_report_end(dwfl, nullptr, nullptr), 0);
  int libraries = 0;
  for (const ModuleInfo& m : symbolizer.modules()) {
    if (!absl::StrContains(m.path, "/libc.so.") &&
        !absl::StrContains(m.path, "/libstdc++.so.")) {
      continue;
    }
    ++libraries;
    size_t same = 0, plt = 0;
    // Odd, so that addresses fall at every alignment; the first 4 KiB (the
    // PLT) every 13 bytes.
    const uint64_t stride = ((m.limit - m.start) / 3000) | 1;
    for (uint64_t addr = m.start; addr < m.limit;
         addr += addr - m.start < 4096 ? 13 : stride) {
      Dwfl_Module* mod = dwfl_addrmodule(dwfl, addr);
      ASSERT_NE(mod, nullptr) << m.path;
      GElf_Off offset = 0;
      GElf_Sym sym;
      const char* want = dwfl_module_addrinfo(mod, addr, &offset, &sym,
                                              nullptr, nullptr, nullptr);
      const SymbolizedAddress& got = symbolizer.Lookup(addr, false);
      const std::string name =
          got.frames.empty() ? "" : got.frames[0].system_name;
      if (want == nullptr) {
        if (!name.empty()) {
          EXPECT_THAT(name, EndsWith("@plt")) << m.path << "+0x" << std::hex
                                              << addr - m.start;
          ++plt;
        }
        continue;
      }
      ASSERT_EQ(name, want) << m.path << "+0x" << std::hex << addr - m.start;
      ++same;
    }
    std::printf("%s: %zu addresses named alike, %zu PLT stubs\n",
                m.path.c_str(), same, plt);
    EXPECT_GT(same, 1000u) << m.path;
    EXPECT_GT(plt, 0u) << m.path;
  }
  dwfl_end(dwfl);
  EXPECT_EQ(libraries, 2);
}

}  // namespace
}  // namespace inprof
