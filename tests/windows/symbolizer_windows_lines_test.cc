// Symbolizer on DbgHelp under Wine, the second source of
// symbolizer_windows_test (symbolizer_windows_test_util.h): file and line
// from the symbolizer's own .debug_line reader, in the libraries this large
// program links (DWARF 4 and 5 units), where DbgHelp reads no DWARF, in a
// copy of this program mapped at another address than its ImageBase, and
// with corrupt line programs (those lines lost, once reported, no crash).
#include "inprof/symbolizer.h"

#include <windows.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inprof/internal/line_table.h"
#include "inprof/base/log.h"
#include "symbolizer_windows_test_util.h"

namespace inprof::symbolizer_test {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

// --- File and line from .debug_line ------------------------------------------------

TEST(SymbolizerWindowsTest, FunctionsOfTheLinkedLibrariesHaveFileAndLine) {
  // This program links libinprof.a, Abseil and GoogleTest, and mingw-w64's
  // runtime: DWARF 4 units (the project's, -gdwarf-4) and DWARF 5 ones
  // (Debian's mingw-w64 libraries), too much for Wine's DbgHelp in larger
  // programs. The symbolizer reads .debug_line itself.
  Symbolizer s;
  const SymbolizedAddress& find = s.Lookup(MemberAddr(&internal::LineTable::Find), false);
  ASSERT_THAT(find.frames, Not(IsEmpty()));
  EXPECT_THAT(find.frames.back().function, HasSubstr("LineTable::Find"));
  EXPECT_THAT(find.frames.back().file, EndsWith("line_table.cc"));
  EXPECT_GT(find.frames.back().line, 0);
  // A DWARF 5 unit of mingw-w64's runtime (libmingwex).
  unsigned long long (*strtoull_function)(const char*, char**, int) = &strtoull;
  const SymbolizedAddress& crt = s.Lookup(FunctionAddr(strtoull_function), false);
  ASSERT_THAT(crt.frames, Not(IsEmpty()));
  EXPECT_THAT(crt.frames.back().function, HasSubstr("strtoull"));
  EXPECT_THAT(crt.frames.back().file, EndsWith(".c"));
  EXPECT_GT(crt.frames.back().line, 0);
  // The line table's size is part of the cache's.
  EXPECT_GT(s.cached_bytes(), size_t{100} << 10);
}

TEST(SymbolizerWindowsTest, OfRowsSharingAnAddressTheLastGivesTheLine) {
  const CallSite site = CallerAfterARowWithoutCode();
  Symbolizer s;
  const SymbolizedAddress& loc = s.Lookup(site.pc, /*is_return_address=*/true);
  ASSERT_THAT(loc.frames, Not(IsEmpty()));
  EXPECT_THAT(loc.frames.back().function, HasSubstr("CallerAfterARowWithoutCode"));
  EXPECT_THAT(loc.frames.back().file, EndsWith("symbolizer_windows_test.cc"));
  EXPECT_EQ(loc.frames.back().line, site.line);
}

// Every compilation unit's abbreviation offset in `exe` (this program's
// bytes) set far past .debug_abbrev: Wine's DbgHelp, which checks that
// offset, then reads no DWARF at all; .debug_line is intact.
std::string WithoutDwarfForDbgHelp(std::string exe) {
  const size_t header = SectionHeaderOffset(exe, ".debug_info");
  EXPECT_NE(header, 0u);
  if (header == 0) return exe;
  IMAGE_SECTION_HEADER info;
  std::memcpy(&info, exe.data() + header, sizeof info);
  const uint32_t far_away = 0x7ffffff0;
  for (size_t offset = 0; offset + 12 <= info.Misc.VirtualSize;) {
    char* unit = exe.data() + info.PointerToRawData + offset;
    uint32_t length;
    uint16_t version;
    std::memcpy(&length, unit, 4);
    std::memcpy(&version, unit + 4, 2);
    if (length == 0 || length >= 0xfffffff0) break;
    std::memcpy(unit + (version >= 5 ? 8 : 6), &far_away, 4);
    offset += 4 + size_t{length};
  }
  return exe;
}

TEST(SymbolizerWindowsTest, SymbolizeFileHasLinesWhereDbgHelpReadsNoDwarf) {
  // Sets g_known_function_line: this source's tests may run first.
  g_sink = KnownFunction(g_sink);
  TempDir dir;
  const std::string path =
      dir.Write("no_dwarf_for_dbghelp.exe", WithoutDwarfForDbgHelp(ReadFileBytes(ExePath())));
  const CallSite site = CallerOfCapturePc();
  auto frames = Symbolizer::SymbolizeFile(
      path, {FileAddress(FunctionAddr(&KnownFunction)), FileAddress(site.pc - 1),
             FileAddress(MemberAddr(&internal::LineTable::Find))});
  ASSERT_TRUE(frames.ok()) << frames.status();
  ASSERT_EQ(frames->size(), 3u);
  for (const std::vector<SourceFrame>& f : *frames) ASSERT_THAT(f, Not(IsEmpty()));
  // Named from the COFF symbol table (with parameters, unlike DbgHelp).
  EXPECT_THAT((*frames)[0].back().function, HasSubstr("KnownFunction(int)"));
  EXPECT_THAT((*frames)[0].back().file, EndsWith("symbolizer_windows_test.cc"));
  EXPECT_EQ((*frames)[0].back().line, g_known_function_line);
  EXPECT_THAT((*frames)[1].back().function, HasSubstr("CallerOfCapturePc"));
  EXPECT_EQ((*frames)[1].back().line, site.line);
  EXPECT_THAT((*frames)[2].back().file, EndsWith("line_table.cc"));
  EXPECT_GT((*frames)[2].back().line, 0);
}

// A copy of this program's file, mapped as a DLL (no references resolved,
// no code run). This program occupies its ImageBase: the copy is relocated.
class MappedCopy {
 public:
  MappedCopy(TempDir& dir, const std::string& name, const std::string& bytes)
      : path_(dir.Write(name, bytes)) {
    module_ = LoadLibraryExW(Widen(path_).c_str(), nullptr, DONT_RESOLVE_DLL_REFERENCES);
  }
  ~MappedCopy() {
    if (module_ != nullptr) FreeLibrary(module_);
  }
  MappedCopy(const MappedCopy&) = delete;
  MappedCopy& operator=(const MappedCopy&) = delete;

  bool ok() const { return module_ != nullptr; }
  const std::string& path() const { return path_; }
  uint64_t base() const { return Addr(module_); }
  // Where `address` of this program is in the copy.
  uint64_t Translate(uint64_t address) const { return base() + (address - ExeBase()); }

 private:
  std::string path_;
  HMODULE module_ = nullptr;
};

TEST(SymbolizerWindowsTest, RelocatedModuleWithoutDwarfForDbgHelpHasLines) {
  // Sets g_known_function_line: this source's tests may run first.
  g_sink = KnownFunction(g_sink);
  TempDir dir;
  MappedCopy copy(dir, "relocated.dll", WithoutDwarfForDbgHelp(ReadFileBytes(ExePath())));
  ASSERT_TRUE(copy.ok()) << "LoadLibraryExW: error " << GetLastError();
  ASSERT_NE(copy.base(), ExeBase());
  Symbolizer s;
  const SymbolizedAddress& loc = s.Lookup(copy.Translate(FunctionAddr(&KnownFunction)), false);
  ASSERT_GE(loc.module, 0);
  EXPECT_EQ(s.modules()[loc.module].start, copy.base());
  ASSERT_THAT(loc.frames, Not(IsEmpty()));
  EXPECT_THAT(loc.frames.back().function, HasSubstr("KnownFunction"));
  EXPECT_THAT(loc.frames.back().file, EndsWith("symbolizer_windows_test.cc"));
  EXPECT_EQ(loc.frames.back().line, g_known_function_line);
  const CallSite site = CallerOfCapturePc();
  const SymbolizedAddress& call = s.Lookup(copy.Translate(site.pc), /*is_return_address=*/true);
  ASSERT_THAT(call.frames, Not(IsEmpty()));
  EXPECT_THAT(call.frames.back().function, HasSubstr("CallerOfCapturePc"));
  EXPECT_EQ(call.frames.back().line, site.line);
  EXPECT_TRUE(s.Capabilities(loc.module).has_line_numbers);
}

// Lines logged meanwhile (inprof's diagnostics).
class CapturedLog {
 public:
  CapturedLog() {
    lines().clear();
    internal::SetLogSinkForTesting([](absl::string_view line) {
      lines().emplace_back(line);
    });
  }
  ~CapturedLog() { internal::SetLogSinkForTesting(nullptr); }
  CapturedLog(const CapturedLog&) = delete;
  CapturedLog& operator=(const CapturedLog&) = delete;

  // Those naming `path` and containing `text`.
  static int Count(const std::string& path, const std::string& text) {
    return static_cast<int>(std::count_if(lines().begin(), lines().end(), [&](const std::string& l) {
      return absl::StrContains(l, path) && absl::StrContains(l, text);
    }));
  }
  static std::vector<std::string>& lines() {
    static std::vector<std::string> captured;
    return captured;
  }
};

// The offset in `exe` of its .debug_line's contents and their size.
std::pair<size_t, size_t> DebugLine(const std::string& exe) {
  const size_t header = SectionHeaderOffset(exe, ".debug_line");
  EXPECT_NE(header, 0u);
  if (header == 0) return {0, 0};
  IMAGE_SECTION_HEADER section;
  std::memcpy(&section, exe.data() + header, sizeof section);
  return {section.PointerToRawData, section.Misc.VirtualSize};
}

TEST(SymbolizerWindowsTest, ACorruptLineProgramCostsItsOwnLinesOnly) {
  // Sets g_known_function_line: this source's tests may run first.
  g_sink = KnownFunction(g_sink);
  // The first line program (the C runtime's startup code) claims DWARF
  // version 99: refused, reported once, the others read.
  std::string bytes = ReadFileBytes(ExePath());
  const auto [offset, size] = DebugLine(bytes);
  ASSERT_GT(size, 6u);
  bytes[offset + 4] = 99;
  bytes[offset + 5] = 0;
  TempDir dir;
  MappedCopy copy(dir, "corrupt_line.dll", bytes);
  ASSERT_TRUE(copy.ok()) << "LoadLibraryExW: error " << GetLastError();
  CapturedLog log;
  Symbolizer s;
  const SymbolizedAddress& loc = s.Lookup(copy.Translate(FunctionAddr(&KnownFunction)), false);
  ASSERT_THAT(loc.frames, Not(IsEmpty()));
  EXPECT_THAT(loc.frames.back().function, HasSubstr("KnownFunction"));
  EXPECT_THAT(loc.frames.back().file, EndsWith("symbolizer_windows_test.cc"));
  EXPECT_EQ(loc.frames.back().line, g_known_function_line);
  s.Lookup(copy.Translate(FunctionAddr(&CapturePc)), false);
  s.set_max_cached_bytes(1);
  s.Refresh();  // over the cap: the tables are read again
  s.Lookup(copy.Translate(FunctionAddr(&KnownFunction)), false);
  EXPECT_EQ(CapturedLog::Count(copy.path(), "version 99"), 1) << absl::StrJoin(CapturedLog::lines(), "\n");
  for (const std::string& line : CapturedLog::lines()) {
    EXPECT_THAT(std::string(absl::StripSuffix(line, "\n")), Not(HasSubstr("\n")));
  }
}

TEST(SymbolizerWindowsTest, LineProgramsPastTheSectionEnd) {
  // A line program whose length runs past the section's end: it and those
  // after it are lost, reported once; names stay.
  std::string bytes = ReadFileBytes(ExePath());
  const auto [offset, size] = DebugLine(bytes);
  ASSERT_GT(size, 4u);
  const uint32_t huge = 0x7fffffff;
  std::memcpy(bytes.data() + offset, &huge, 4);
  TempDir dir;
  MappedCopy copy(dir, "line_past_end.dll", bytes);
  ASSERT_TRUE(copy.ok()) << "LoadLibraryExW: error " << GetLastError();
  CapturedLog log;
  Symbolizer s;
  for (int i = 0; i < 2; ++i) {
    const SymbolizedAddress& loc =
        s.Lookup(copy.Translate(FunctionAddr(&KnownFunction)) + i, false);
    ASSERT_THAT(loc.frames, Not(IsEmpty()));
    EXPECT_THAT(loc.frames.back().function, HasSubstr("KnownFunction"));
  }
  EXPECT_EQ(CapturedLog::Count(copy.path(), "runs past the section"), 1)
      << absl::StrJoin(CapturedLog::lines(), "\n");
}

TEST(SymbolizerWindowsTest, SymbolizeFileSurvivesRandomlyCorruptLinePrograms) {
  const std::string exe = ReadFileBytes(ExePath());
  const auto [offset, size] = DebugLine(exe);
  ASSERT_GT(size, 0u);
  const CallSite site = CallerOfCapturePc();
  const std::vector<uint64_t> addresses = {FileAddress(FunctionAddr(&KnownFunction)),
                                           FileAddress(site.pc - 1),
                                           FileAddress(MemberAddr(&internal::LineTable::Find))};
  std::mt19937 random(20240502);
  TempDir dir;
  CapturedLog log;  // quiet
  for (int round = 0; round < 6; ++round) {
    std::string bytes = exe;
    // Bytes changed at random; in odd rounds, a run of them.
    if (round % 2 == 0) {
      for (int i = 0; i < 200; ++i) bytes[offset + random() % size] = static_cast<char>(random());
    } else {
      const size_t start = random() % size;
      for (size_t i = start; i < std::min(size, start + 4096); ++i) {
        bytes[offset + i] = static_cast<char>(random());
      }
    }
    const std::string path = dir.Write(absl::StrCat("random_line_", round, ".exe"), bytes);
    auto frames = Symbolizer::SymbolizeFile(path, addresses);
    if (!frames.ok()) {  // DbgHelp faulted on them
      EXPECT_THAT(frames.status().message(), HasSubstr(path));
      continue;
    }
    ASSERT_EQ(frames->size(), addresses.size());
    ASSERT_THAT((*frames)[0], Not(IsEmpty()));
    EXPECT_THAT((*frames)[0].back().function, HasSubstr("KnownFunction"));
  }
}

}  // namespace
}  // namespace inprof::symbolizer_test
