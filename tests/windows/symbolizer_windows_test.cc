// Symbolizer on DbgHelp under Wine: functions of this test by name, file and
// line (inlined frames included), code without debug info named from the
// COFF symbol table, the module map (sorted, with the test program's
// CodeView build-id), system DLLs named from their exports, the cache and
// its cap, DLLs loaded and unloaded between Refresh() calls, and
// SymbolizeFile on this program's file and on missing, garbage and
// truncated files (an error naming the file, never a crash). File and line
// from the symbolizer's own .debug_line reader: the program's second source,
// symbolizer_windows_lines_test.cc; what the two share:
// symbolizer_windows_test_util.h.
#include "inprof/symbolizer.h"

#include <windows.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "symbolizer_windows_test_util.h"

// A function without debug info (top-level asm has none), as a library
// built without -g has them: only the COFF symbol table names it.
asm(R"(
  .text
  .globl _ZN6inprof11NoDebugInfoEi
  .def _ZN6inprof11NoDebugInfoEi; .scl 2; .type 32; .endef
  .p2align 4
_ZN6inprof11NoDebugInfoEi:
  leal 1(%rcx), %eax
  ret
)");

namespace inprof {
int NoDebugInfo(int x);

namespace symbolizer_test {

// --- Code whose symbols the tests look up -----------------------------------

volatile int g_sink = 0;
int g_known_function_line = 0;

// Everything up to the first statement on one line: the entry address has
// that line whatever the optimization level.
__attribute__((noinline)) int KnownFunction(int x) { g_known_function_line = __LINE__;
  asm volatile("" : "+r"(x));
  return x * 3 + 1;
}

// Returns its own return address: a pc inside whichever function called it.
__attribute__((noinline)) uintptr_t CapturePc() {
  uintptr_t pc = reinterpret_cast<uintptr_t>(__builtin_return_address(0));
  asm volatile("" : "+r"(pc));
  return pc;
}

// The call of CapturePc() and the __LINE__ next to it share a line, and the
// statement before it has code of its own: Wine's DbgHelp keeps only the
// first line-table row of an address, so a statement without code (a bare
// declaration) before the call would name the call's address instead.
__attribute__((noinline)) CallSite CallerOfCapturePc() {
  g_sink = g_sink + 1;
  const uintptr_t pc = CapturePc(); const int line = __LINE__;
  g_sink = g_sink + 1;
  return CallSite{pc, line};
}

// As CallerOfCapturePc, but a line-table row without code (the empty asm
// statement's) shares the call's address: Wine's DbgHelp, which keeps the
// first row of an address, would give the asm statement's line.
__attribute__((noinline)) CallSite CallerAfterARowWithoutCode() {
  g_sink = g_sink + 1;
  asm volatile("");
  const uintptr_t pc = CapturePc(); const int line = __LINE__;
  g_sink = g_sink + 1;
  return CallSite{pc, line};
}

// Inlined into its caller at every optimization level.
inline __attribute__((always_inline)) CallSite InlinedHelper() {
  g_sink = g_sink + 1;
  const uintptr_t pc = CapturePc(); const int line = __LINE__;
  g_sink = g_sink + 1;
  return CallSite{pc, line};
}

__attribute__((noinline)) CallSite OuterOfInlinedHelper() {
  g_sink = g_sink + 2;
  const CallSite site = InlinedHelper();
  g_sink = g_sink + 2;
  return site;
}

namespace testns {
struct Widget {
  __attribute__((noinline)) int Method(int x);
};
int Widget::Method(int x) {
  asm volatile("" : "+r"(x));
  return x + 2;
}
}  // namespace testns

namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

// --- Helpers -------------------------------------------------------------------

std::string BaseNameLower(const std::string& path) {
  const size_t slash = path.find_last_of("\\/");
  return absl::AsciiStrToLower(slash == std::string::npos ? path : path.substr(slash + 1));
}

uint64_t ExportAddr(const wchar_t* module, const char* name) {
  HMODULE m = GetModuleHandleW(module);
  if (m == nullptr) return 0;
  return FunctionAddr(GetProcAddress(m, name));
}

// The test program's CodeView build-id as this test reads it: "" when the
// linker wrote no RSDS record.
std::string OwnBuildId() {
  const auto* base = reinterpret_cast<const unsigned char*>(GetModuleHandleW(nullptr));
  const auto* dos = reinterpret_cast<const IMAGE_DOS_HEADER*>(base);
  const auto* nt = reinterpret_cast<const IMAGE_NT_HEADERS64*>(base + dos->e_lfanew);
  const IMAGE_DATA_DIRECTORY& dir =
      nt->OptionalHeader.DataDirectory[IMAGE_DIRECTORY_ENTRY_DEBUG];
  const auto* entries =
      reinterpret_cast<const IMAGE_DEBUG_DIRECTORY*>(base + dir.VirtualAddress);
  for (size_t i = 0; i < dir.Size / sizeof(IMAGE_DEBUG_DIRECTORY); ++i) {
    if (entries[i].Type != IMAGE_DEBUG_TYPE_CODEVIEW || entries[i].AddressOfRawData == 0 ||
        entries[i].SizeOfData < 24) {
      continue;
    }
    const unsigned char* cv = base + entries[i].AddressOfRawData;
    if (std::memcmp(cv, "RSDS", 4) != 0) continue;
    GUID guid;
    uint32_t age;
    std::memcpy(&guid, cv + 4, sizeof guid);
    std::memcpy(&age, cv + 20, sizeof age);
    std::string id = absl::StrFormat("%08x%04x%04x", static_cast<uint32_t>(guid.Data1),
                                     guid.Data2, guid.Data3);
    for (unsigned char b : guid.Data4) absl::StrAppendFormat(&id, "%02x", b);
    absl::StrAppendFormat(&id, "%x", age);
    return id;
  }
  return "";
}

int ModuleNamed(const Symbolizer& s, const std::string& base_name) {
  for (size_t i = 0; i < s.modules().size(); ++i) {
    if (BaseNameLower(s.modules()[i].path) == base_name) return static_cast<int>(i);
  }
  return -1;
}

// --- Tests -----------------------------------------------------------------------

TEST(SymbolizerWindowsTest, FunctionEntryHasNameFileAndLine) {
  g_sink = KnownFunction(g_sink);
  ASSERT_GT(g_known_function_line, 0);
  Symbolizer s;
  const SymbolizedAddress& loc = s.Lookup(FunctionAddr(&KnownFunction), false);
  ASSERT_GE(loc.module, 0);
  EXPECT_EQ(s.modules()[loc.module].path, ExePath());
  ASSERT_THAT(loc.frames, Not(IsEmpty()));
  const SourceFrame& f = loc.frames.back();
  EXPECT_THAT(f.function, HasSubstr("KnownFunction"));
  EXPECT_THAT(f.function, Not(HasSubstr("_Z")));
  EXPECT_FALSE(f.system_name.empty());
  EXPECT_THAT(f.file, EndsWith("symbolizer_windows_test.cc"));
  EXPECT_EQ(f.line, g_known_function_line);
}

TEST(SymbolizerWindowsTest, ReturnAddressNamesTheCallerAndTheCallLine) {
  const CallSite site = CallerOfCapturePc();
  Symbolizer s;
  const SymbolizedAddress& loc = s.Lookup(site.pc, /*is_return_address=*/true);
  ASSERT_THAT(loc.frames, Not(IsEmpty()));
  EXPECT_THAT(loc.frames.back().function, HasSubstr("CallerOfCapturePc"));
  EXPECT_THAT(loc.frames.back().file, EndsWith("symbolizer_windows_test.cc"));
  EXPECT_EQ(loc.frames.back().line, site.line);
}

TEST(SymbolizerWindowsTest, MethodNamesAreQualifiedAndDemangled) {
  testns::Widget w;
  g_sink = w.Method(g_sink);
  Symbolizer s;
  // A pointer to a non-virtual member function starts with the function's
  // address in the Itanium C++ ABI (GCC's on Windows too).
  int (testns::Widget::*method)(int) = &testns::Widget::Method;
  uint64_t address = 0;
  static_assert(sizeof method >= sizeof address);
  std::memcpy(&address, &method, sizeof address);
  const SymbolizedAddress& m = s.Lookup(address, false);
  ASSERT_THAT(m.frames, Not(IsEmpty()));
  EXPECT_THAT(m.frames.back().function, HasSubstr("Widget::Method"));
  EXPECT_THAT(m.frames.back().function, Not(HasSubstr("_Z")));
}

TEST(SymbolizerWindowsTest, FunctionsWithoutDebugInfoAreNamedFromTheSymbolTable) {
  ASSERT_EQ(NoDebugInfo(41), 42);
  Symbolizer s;
  const SymbolizedAddress& loc = s.Lookup(FunctionAddr(&NoDebugInfo) + 2, false);
  ASSERT_GE(loc.module, 0);
  EXPECT_EQ(s.modules()[loc.module].path, ExePath());
  ASSERT_THAT(loc.frames, Not(IsEmpty()));
  EXPECT_EQ(loc.frames.back().function, "inprof::NoDebugInfo(int)");
  EXPECT_EQ(loc.frames.back().system_name, "_ZN6inprof11NoDebugInfoEi");
  EXPECT_EQ(loc.frames.back().line, 0);
  // So are the test framework's functions, with debug info or without.
  const SymbolizedAddress& gtest = s.Lookup(
      FunctionAddr(static_cast<void (*)(int*, char**)>(&testing::InitGoogleTest)), false);
  ASSERT_THAT(gtest.frames, Not(IsEmpty()));
  EXPECT_THAT(gtest.frames.back().function, HasSubstr("InitGoogleTest"));
  EXPECT_THAT(gtest.frames.back().function, Not(HasSubstr("_Z")));
}

TEST(SymbolizerWindowsTest, InlinedFramesComeBeforeTheirCaller) {
  const CallSite site = OuterOfInlinedHelper();
  Symbolizer s;
  const SymbolizedAddress& loc = s.Lookup(site.pc, /*is_return_address=*/true);
  ASSERT_GE(loc.frames.size(), 2u);
  EXPECT_THAT(loc.frames[0].function, HasSubstr("InlinedHelper"));
  EXPECT_THAT(loc.frames[0].file, EndsWith("symbolizer_windows_test.cc"));
  EXPECT_EQ(loc.frames[0].line, site.line);
  EXPECT_THAT(loc.frames.back().function, HasSubstr("OuterOfInlinedHelper"));
  EXPECT_TRUE(s.Capabilities(loc.module).has_inline_frames);
}

TEST(SymbolizerWindowsTest, ModulesAreSortedAndIncludeExeAndSystemDlls) {
  Symbolizer s;
  const std::vector<ModuleInfo>& modules = s.modules();
  ASSERT_FALSE(modules.empty());
  for (size_t i = 0; i < modules.size(); ++i) {
    EXPECT_LT(modules[i].start, modules[i].limit) << modules[i].path;
    EXPECT_EQ(modules[i].file_offset, 0u);
    EXPECT_FALSE(modules[i].path.empty());
    if (i > 0) {
      EXPECT_LE(modules[i - 1].limit, modules[i].start) << modules[i].path;
    }
    for (char c : modules[i].build_id) {
      EXPECT_TRUE(std::isxdigit(static_cast<unsigned char>(c)) && !std::isupper(c))
          << modules[i].build_id;
    }
  }
  const int exe = ModuleNamed(s, BaseNameLower(ExePath()));
  ASSERT_GE(exe, 0);
  EXPECT_EQ(modules[exe].path, ExePath());
  EXPECT_EQ(modules[exe].start, Addr(GetModuleHandleW(nullptr)));
  EXPECT_GE(ModuleNamed(s, "ntdll.dll"), 0);
  EXPECT_GE(ModuleNamed(s, "kernel32.dll"), 0);
  // The exe's build-id: the CodeView record's GUID and age, when the linker
  // wrote one (mingw-w64's ld does with --build-id).
  const std::string own = OwnBuildId();
  EXPECT_EQ(modules[exe].build_id, own);
  if (!own.empty()) {
    EXPECT_GE(own.size(), 33u);
  }
  // Every lookup inside the exe names it.
  EXPECT_EQ(s.Lookup(FunctionAddr(&KnownFunction), false).module, exe);
}

TEST(SymbolizerWindowsTest, AddressInNoModuleHasNoModuleAndNoFrames) {
  void* page = VirtualAlloc(nullptr, 4096, MEM_COMMIT | MEM_RESERVE, PAGE_READWRITE);
  ASSERT_NE(page, nullptr);
  Symbolizer s;
  for (uint64_t address : {Addr(page), Addr(page) + 100, uint64_t{16}}) {
    const SymbolizedAddress& loc = s.Lookup(address, false);
    EXPECT_EQ(loc.module, -1) << address;
    EXPECT_THAT(loc.frames, IsEmpty()) << address;
  }
  VirtualFree(page, 0, MEM_RELEASE);
}

TEST(SymbolizerWindowsTest, SystemDllFunctionsGetNames) {
  Symbolizer s;
  const uint64_t tick = ExportAddr(L"kernel32.dll", "GetTickCount");
  ASSERT_NE(tick, 0u);
  const SymbolizedAddress& a = s.Lookup(tick, false);
  ASSERT_GE(a.module, 0);
  EXPECT_EQ(BaseNameLower(s.modules()[a.module].path), "kernel32.dll");
  ASSERT_THAT(a.frames, Not(IsEmpty()));
  EXPECT_THAT(a.frames.back().function, HasSubstr("GetTickCount"));
  EXPECT_TRUE(s.Capabilities(a.module).has_functions);

  // Wine's DbgHelp has no symbol inside ntdll's functions: the export table
  // names them.
  const uint64_t version = ExportAddr(L"ntdll.dll", "RtlGetVersion");
  ASSERT_NE(version, 0u);
  const SymbolizedAddress& b = s.Lookup(version + 1, false);
  ASSERT_GE(b.module, 0);
  EXPECT_EQ(BaseNameLower(s.modules()[b.module].path), "ntdll.dll");
  ASSERT_THAT(b.frames, Not(IsEmpty()));
  EXPECT_THAT(b.frames.back().function, HasSubstr("RtlGetVersion"));
}

TEST(SymbolizerWindowsTest, SystemDllsWithoutDebugInfoStillGetNames) {
  Symbolizer s;
  s.set_system_debug_info(false);
  const SymbolizedAddress& loc = s.Lookup(ExportAddr(L"kernel32.dll", "GetTickCount"), false);
  ASSERT_THAT(loc.frames, Not(IsEmpty()));
  EXPECT_THAT(loc.frames.back().function, HasSubstr("GetTickCount"));
  EXPECT_EQ(loc.frames.back().line, 0);
  EXPECT_FALSE(s.Capabilities(loc.module).has_line_numbers);
  // The program itself is no system module: file:line as before.
  const SymbolizedAddress& own = s.Lookup(FunctionAddr(&KnownFunction), false);
  ASSERT_THAT(own.frames, Not(IsEmpty()));
  EXPECT_GT(own.frames.back().line, 0);
}

TEST(SymbolizerWindowsTest, WithoutSymbolizeOnlyTheModuleIsKnown) {
  Symbolizer s(/*symbolize=*/false);
  const SymbolizedAddress& loc = s.Lookup(FunctionAddr(&KnownFunction), false);
  ASSERT_GE(loc.module, 0);
  EXPECT_EQ(s.modules()[loc.module].path, ExePath());
  EXPECT_THAT(loc.frames, IsEmpty());
  EXPECT_FALSE(s.Capabilities(loc.module).has_functions);
}

TEST(SymbolizerWindowsTest, CapabilitiesOfTheProgram) {
  Symbolizer s;
  EXPECT_FALSE(s.Capabilities(-1).has_functions);
  EXPECT_FALSE(s.Capabilities(1 << 20).has_functions);
  const SymbolizedAddress& loc = s.Lookup(FunctionAddr(&KnownFunction), false);
  const Symbolizer::ModuleCapabilities caps = s.Capabilities(loc.module);
  EXPECT_TRUE(caps.has_functions);
  EXPECT_TRUE(caps.has_filenames);
  EXPECT_TRUE(caps.has_line_numbers);
}

TEST(SymbolizerWindowsTest, CacheIsEmptiedByRefreshOverTheCap) {
  Symbolizer s;
  const SymbolizedAddress& first = s.Lookup(FunctionAddr(&KnownFunction), false);
  const SymbolizedAddress& again = s.Lookup(FunctionAddr(&KnownFunction), false);
  EXPECT_EQ(&first, &again);
  s.Lookup(FunctionAddr(&CapturePc), false);
  EXPECT_EQ(s.cached_addresses(), 2u);
  EXPECT_GT(s.cached_bytes(), 0u);
  s.Refresh();  // under the default cap: kept
  EXPECT_EQ(s.cached_addresses(), 2u);
  EXPECT_EQ(s.max_cached_bytes(), Symbolizer::kDefaultMaxCachedBytes);
  s.set_max_cached_bytes(1);
  EXPECT_EQ(s.max_cached_bytes(), 1u);
  s.Refresh();
  EXPECT_EQ(s.cached_addresses(), 0u);
  EXPECT_EQ(s.cached_bytes(), 0u);
  // Resolved again afterwards.
  const SymbolizedAddress& later = s.Lookup(FunctionAddr(&KnownFunction), false);
  ASSERT_THAT(later.frames, Not(IsEmpty()));
  EXPECT_THAT(later.frames.back().function, HasSubstr("KnownFunction"));
}

TEST(SymbolizerWindowsTest, RefreshPicksUpLoadedAndUnloadedDlls) {
  // A DLL this program has not loaded.
  const wchar_t* dll = nullptr;
  for (const wchar_t* candidate : {L"version.dll", L"shlwapi.dll", L"imagehlp.dll"}) {
    if (GetModuleHandleW(candidate) == nullptr) {
      dll = candidate;
      break;
    }
  }
  ASSERT_NE(dll, nullptr);
  const std::string name = Narrow(dll);
  Symbolizer s;
  ASSERT_LT(ModuleNamed(s, name), 0);
  const size_t before = s.modules().size();
  s.Lookup(FunctionAddr(&KnownFunction), false);

  HMODULE h = LoadLibraryW(dll);
  ASSERT_NE(h, nullptr);
  // Not refreshed yet: the old list.
  EXPECT_EQ(s.modules().size(), before);
  s.Refresh();
  const int index = ModuleNamed(s, name);
  ASSERT_GE(index, 0);
  EXPECT_EQ(s.modules()[index].start, Addr(h));
  const IMAGE_NT_HEADERS64* nt = reinterpret_cast<const IMAGE_NT_HEADERS64*>(
      reinterpret_cast<const char*>(h) + reinterpret_cast<const IMAGE_DOS_HEADER*>(h)->e_lfanew);
  EXPECT_EQ(s.modules()[index].limit, Addr(h) + nt->OptionalHeader.SizeOfImage);
  // An address inside it: its entry point.
  const uint64_t inside = Addr(h) + nt->OptionalHeader.AddressOfEntryPoint;
  EXPECT_EQ(s.Lookup(inside, false).module, index);
  // The program's result survived the Refresh, renumbered if need be.
  const SymbolizedAddress& own = s.Lookup(FunctionAddr(&KnownFunction), false);
  EXPECT_EQ(s.modules()[own.module].path, ExePath());
  EXPECT_EQ(s.cached_addresses(), 2u);

  ASSERT_TRUE(FreeLibrary(h));
  ASSERT_EQ(GetModuleHandleW(dll), nullptr) << "still loaded";
  s.Refresh();
  EXPECT_LT(ModuleNamed(s, name), 0);
  // The unloaded DLL's result is gone; the program's stays.
  EXPECT_EQ(s.cached_addresses(), 1u);
  EXPECT_EQ(s.Lookup(inside, false).module, -1);
}

TEST(SymbolizerWindowsTest, SetDebugInfoPathKeepsSymbolizing) {
  Symbolizer s;
  TempDir dir;
  s.SetDebugInfoPath(absl::StrCat(dir.path(), ";srv*", dir.path(), "*https://example.invalid"));
  const SymbolizedAddress& loc = s.Lookup(FunctionAddr(&KnownFunction), false);
  ASSERT_THAT(loc.frames, Not(IsEmpty()));
  EXPECT_THAT(loc.frames.back().function, HasSubstr("KnownFunction"));
  s.SetDebugInfoPath("");  // after the session started: applied to it
  EXPECT_THAT(s.Lookup(FunctionAddr(&CapturePc), false).frames, Not(IsEmpty()));
}

TEST(SymbolizerWindowsTest, SymbolizeFileReadsTheProgramsFile) {
  Symbolizer s(/*symbolize=*/false);
  const int exe = ModuleNamed(s, BaseNameLower(ExePath()));
  ASSERT_GE(exe, 0);
  const auto* base = reinterpret_cast<const unsigned char*>(GetModuleHandleW(nullptr));
  const auto* nt = reinterpret_cast<const IMAGE_NT_HEADERS64*>(
      base + reinterpret_cast<const IMAGE_DOS_HEADER*>(base)->e_lfanew);
  // The file's own ImageBase, not where the loader put it (ASLR may differ).
  const uint64_t image_base = nt->OptionalHeader.ImageBase;
  const uint64_t rva = FunctionAddr(&KnownFunction) - Addr(base);
  const CallSite site = CallerOfCapturePc();
  const uint64_t no_debug_info = FunctionAddr(&NoDebugInfo) + 2 - Addr(base);
  auto frames = Symbolizer::SymbolizeFile(
      ExePath(), {image_base + rva, image_base + (site.pc - 1 - Addr(base)), 1,
                  image_base + no_debug_info});
  ASSERT_TRUE(frames.ok()) << frames.status();
  ASSERT_EQ(frames->size(), 4u);
  ASSERT_THAT((*frames)[0], Not(IsEmpty()));
  EXPECT_THAT((*frames)[0].back().function, HasSubstr("KnownFunction"));
  EXPECT_THAT((*frames)[0].back().file, EndsWith("symbolizer_windows_test.cc"));
  ASSERT_THAT((*frames)[1], Not(IsEmpty()));
  EXPECT_THAT((*frames)[1].back().function, HasSubstr("CallerOfCapturePc"));
  EXPECT_EQ((*frames)[1].back().line, site.line);
  EXPECT_THAT((*frames)[2], IsEmpty());  // outside the image
  ASSERT_THAT((*frames)[3], Not(IsEmpty()));
  EXPECT_EQ((*frames)[3].back().function, "inprof::NoDebugInfo(int)");
}

TEST(SymbolizerWindowsTest, SymbolizeFileFailsNamingBadFiles) {
  TempDir dir;
  std::mt19937 random(20240501);
  std::string garbage(8192, '\0');
  for (char& c : garbage) c = static_cast<char>(random());
  std::string mz_garbage = garbage;
  mz_garbage[0] = 'M';
  mz_garbage[1] = 'Z';
  const std::string exe_bytes = ReadFileBytes(ExePath());
  ASSERT_GT(exe_bytes.size(), 8192u);
  std::string bad_pe_signature = exe_bytes.substr(0, 4096);
  const uint32_t e_lfanew =
      reinterpret_cast<const IMAGE_DOS_HEADER*>(bad_pe_signature.data())->e_lfanew;
  bad_pe_signature[e_lfanew] = 'X';

  const std::vector<std::pair<std::string, std::string>> files = {
      {dir.path() + "\\does_not_exist.exe", ""},
      {dir.Write("empty.exe", ""), "not a PE image"},
      {dir.Write("garbage.exe", garbage), "not a PE image"},
      {dir.Write("mz_garbage.exe", mz_garbage), ""},
      {dir.Write("headers_only.exe", exe_bytes.substr(0, 4096)), "truncated"},
      {dir.Write("half.exe", exe_bytes.substr(0, exe_bytes.size() / 2)), "truncated"},
      {dir.Write("bad_signature.exe", bad_pe_signature), "no PE signature"},
  };
  for (const auto& [path, reason] : files) {
    auto result = Symbolizer::SymbolizeFile(path, {0x140001000});
    ASSERT_FALSE(result.ok()) << path;
    EXPECT_THAT(result.status().message(), HasSubstr(path));
    EXPECT_THAT(result.status().message(), HasSubstr(reason));
    EXPECT_THAT(result.status().message(), Not(HasSubstr("\n")));
    EXPECT_THAT(result.status().message(), Not(HasSubstr("\r")));
  }
  EXPECT_FALSE(Symbolizer::SymbolizeFile("", {1}).ok());
  EXPECT_FALSE(Symbolizer::SymbolizeFile(std::string("bad\xff.exe"), {1}).ok());
}

TEST(SymbolizerWindowsTest, SymbolizeFileSurvivesCorruptDebugInfo) {
  // Sound headers, nonsense DWARF: .debug_abbrev moved to the end of the
  // file, all continuation bytes up to a page end, so that Wine's DWARF
  // reader runs off the file's mapping. The fault becomes an error naming
  // the file, every time. Whether DbgHelp gets that far depends on what it
  // is asked: it was its line lookup that ran off the mapping, and the
  // symbolizer no longer asks it for lines that .debug_line has. So where
  // DbgHelp reads nothing without faulting, the results come from the
  // symbolizer's own readers: the COFF symbol table and .debug_line.
  const uint64_t known_function = FileAddress(FunctionAddr(&KnownFunction));
  TempDir dir;
  std::string bytes = ReadFileBytes(ExePath());
  const size_t header = SectionHeaderOffset(bytes, ".debug_abbrev");
  ASSERT_NE(header, 0u);
  IMAGE_SECTION_HEADER section;
  std::memcpy(&section, bytes.data() + header, sizeof section);
  ASSERT_GT(section.SizeOfRawData, 0u);
  const size_t end = (bytes.size() + section.SizeOfRawData + 4095) / 4096 * 4096;
  bytes.resize(end, '\x80');  // endless LEB128 numbers
  section.PointerToRawData = static_cast<DWORD>(end - section.SizeOfRawData);
  std::memcpy(bytes.data() + header, &section, sizeof section);
  const std::string path = dir.Write("corrupt_dwarf.exe", bytes);
  for (int i = 0; i < 2; ++i) {
    auto result = Symbolizer::SymbolizeFile(path, {0x140001000, known_function});
    if (!result.ok()) {
      EXPECT_THAT(result.status().message(), HasSubstr(path));
      EXPECT_THAT(result.status().message(), HasSubstr("corrupt"));
      continue;
    }
    ASSERT_EQ(result->size(), 2u);
    ASSERT_THAT((*result)[1], Not(IsEmpty()));
    EXPECT_THAT((*result)[1].back().function, HasSubstr("KnownFunction"));
    EXPECT_THAT((*result)[1].back().file, EndsWith("symbolizer_windows_test.cc"));
    EXPECT_EQ((*result)[1].back().line, g_known_function_line);
  }
  // The program's own file still symbolizes afterwards.
  auto own = Symbolizer::SymbolizeFile(ExePath(), {1});
  EXPECT_TRUE(own.ok()) << own.status();
}

TEST(SymbolizerWindowsTest, ForProcessIsUnimplemented) {
  auto s = Symbolizer::ForProcess(static_cast<pid_t>(GetCurrentProcessId()));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kUnimplemented);
}

TEST(SymbolizerWindowsTest, SeveralSymbolizersCoexist) {
  Symbolizer a;
  Symbolizer b;
  const SymbolizedAddress& la = a.Lookup(FunctionAddr(&KnownFunction), false);
  {
    Symbolizer c;
    EXPECT_THAT(c.Lookup(FunctionAddr(&KnownFunction), false).frames, Not(IsEmpty()));
  }
  const SymbolizedAddress& lb = b.Lookup(FunctionAddr(&CapturePc), false);
  ASSERT_THAT(la.frames, Not(IsEmpty()));
  ASSERT_THAT(lb.frames, Not(IsEmpty()));
  EXPECT_THAT(la.frames.back().function, HasSubstr("KnownFunction"));
  EXPECT_THAT(lb.frames.back().function, HasSubstr("CapturePc"));
}

}  // namespace
}  // namespace symbolizer_test
}  // namespace inprof
