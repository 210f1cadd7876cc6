// The symbolizer's own DWARF line-table reader (internal/line_table.h),
// against libdw on real binaries and on malformed programs. Linked into
// symbolizer_test (tests/meson.build).
#include "inprof/internal/line_table.h"

#include <dlfcn.h>
#include <elfutils/libdwfl.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "inprof/symbolizer.h"
#include "symbolize/symbolizer_test_util.h"

namespace inprof {
namespace {

using symbolizer_test::TestLibPath;

// What the symbolizer's own line-table reader answers, against libdw's
// dwfl_module_getsrc, at every row address of every unit of `path` (and one
// byte either side). Returns the number of addresses compared; counts the
// units our reader declined (libdw answers those in the symbolizer).
struct LineTableComparison {
  size_t addresses = 0;
  size_t units = 0;
  size_t declined = 0;
  size_t mismatches = 0;
};

LineTableComparison CompareLineTablesWithLibdw(const std::string& path) {
  LineTableComparison result;
  static const Dwfl_Callbacks callbacks = {
      .find_elf = dwfl_build_id_find_elf,
      .find_debuginfo = dwfl_standard_find_debuginfo,
      .section_address = dwfl_offline_section_address,
      .debuginfo_path = nullptr,
  };
  Dwfl* dwfl = dwfl_begin(&callbacks);
  if (dwfl == nullptr) return result;
  dwfl_report_begin(dwfl);
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  Dwfl_Module* mod = fd < 0 ? nullptr
                            : dwfl_report_offline(dwfl, path.c_str(), path.c_str(), fd);
  dwfl_report_end(dwfl, nullptr, nullptr);
  if (mod == nullptr) {
    dwfl_end(dwfl);
    return result;
  }
  absl::flat_hash_map<Dwarf_Off, std::unique_ptr<internal::LineTable>> tables;
  auto ours = [&](Dwarf_Addr address, std::string* file, int* line) {
    Dwarf_Addr bias = 0;
    Dwarf_Die* cu = dwfl_module_addrdie(mod, address, &bias);
    if (cu == nullptr) return false;
    auto [it, inserted] = tables.try_emplace(dwarf_dieoffset(cu));
    if (inserted) {
      ++result.units;
      auto table = internal::LineTable::ReadUnit(cu);
      if (table.ok()) {
        it->second = std::make_unique<internal::LineTable>(*std::move(table));
      } else {
        ++result.declined;
      }
    }
    if (it->second == nullptr) return false;
    const std::string* f = nullptr;
    if (!it->second->Find(address - bias, &f, line)) return false;
    *file = f != nullptr ? *f : "";
    return true;
  };
  auto theirs = [&](Dwarf_Addr address, std::string* file, int* line) {
    Dwfl_Line* l = dwfl_module_getsrc(mod, address);
    if (l == nullptr) return false;
    const char* f = dwfl_lineinfo(l, nullptr, line, nullptr, nullptr, nullptr);
    *file = f != nullptr ? f : "";
    return true;
  };
  Dwarf_Addr bias = 0;
  for (Dwarf_Die* cu = dwfl_module_nextcu(mod, nullptr, &bias); cu != nullptr;
       cu = dwfl_module_nextcu(mod, cu, &bias)) {
    Dwarf_Lines* lines = nullptr;
    size_t count = 0;
    if (dwarf_getsrclines(cu, &lines, &count) != 0) continue;
    // The file table, entry by entry (DW_AT_call_file's names).
    Dwarf_Files* files = nullptr;
    size_t nfiles = 0;
    auto own = internal::LineTable::ReadUnit(cu);
    if (own.ok() && dwarf_getsrcfiles(cu, &files, &nfiles) == 0) {
      if (own->files() != nfiles) {
        ++result.mismatches;
        ADD_FAILURE() << path << ": " << own->files() << " files, libdw "
                      << nfiles;
      }
      for (size_t i = 0; i < nfiles && i < own->files(); ++i) {
        const char* name = dwarf_filesrc(files, i, nullptr, nullptr);
        if (name != nullptr && *own->File(i) != name &&
            ++result.mismatches <= 5) {
          ADD_FAILURE() << path << ": file " << i << " is " << *own->File(i)
                        << ", libdw's " << name;
        }
      }
    }
    for (size_t i = 0; i < count; ++i) {
      Dwarf_Addr row = 0;
      if (dwarf_lineaddr(dwarf_onesrcline(lines, i), &row) != 0) continue;
      for (Dwarf_Addr address : {row + bias - 1, row + bias, row + bias + 1}) {
        std::string our_file, their_file;
        int our_line = 0, their_line = 0;
        const bool our_found = ours(address, &our_file, &our_line);
        const bool their_found = theirs(address, &their_file, &their_line);
        ++result.addresses;
        if (our_found != their_found ||
            (our_found && (our_file != their_file || our_line != their_line))) {
          if (++result.mismatches <= 5) {
            ADD_FAILURE() << path << " at 0x" << std::hex << address << std::dec
                          << ": ours " << (our_found ? our_file : "none") << ":"
                          << our_line << ", libdw's "
                          << (their_found ? their_file : "none") << ":"
                          << their_line;
          }
        }
      }
    }
  }
  dwfl_end(dwfl);
  return result;
}

// libc's separate debug file (libc6-dbg: DWARF 5, compressed sections), if
// this machine has it.
std::string LibcDebugFile() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&std::abort), &info) == 0) return "";
  Symbolizer probe(/*symbolize=*/false);
  for (const ModuleInfo& m : probe.modules()) {
    if (m.path != info.dli_fname || m.build_id.size() < 4) continue;
    const std::string file = absl::StrCat("/usr/lib/debug/.build-id/",
                                          m.build_id.substr(0, 2), "/",
                                          m.build_id.substr(2), ".debug");
    return access(file.c_str(), R_OK) == 0 ? file : "";
  }
  return "";
}

TEST(LineTableTest, AnswersLikeLibdwAtEveryRowOfRealBinaries) {
  std::vector<std::string> paths = {"/proc/self/exe", TestLibPath()};
  const char* dwarf4 = std::getenv("INPROF_LINE_TABLE_DWARF4_LIB");
  ASSERT_NE(dwarf4, nullptr) << "INPROF_LINE_TABLE_DWARF4_LIB unset";
  paths.push_back(dwarf4);
  const std::string libc_debug = LibcDebugFile();
  if (!libc_debug.empty()) paths.push_back(libc_debug);
  for (const std::string& path : paths) {
    const LineTableComparison c = CompareLineTablesWithLibdw(path);
    std::printf("%s: %zu addresses in %zu units, %zu declined, %zu differ\n",
                path.c_str(), c.addresses, c.units, c.declined, c.mismatches);
    EXPECT_GT(c.addresses, 50u) << path;
    EXPECT_EQ(c.declined, 0u) << path;
    EXPECT_EQ(c.mismatches, 0u) << path;
  }
}

TEST(LineTableTest, MalformedProgramsAreErrorsNotCrashes) {
  // A DWARF 4 header, then a program cut at every length: each is an
  // error or a table, never a read past the section.
  std::vector<uint8_t> unit = {
      0, 0, 0, 0,  // unit_length, set below
      4, 0,        // version 4
      0, 0, 0, 0,  // header_length, set below
      1, 1, 1, static_cast<uint8_t>(-5), 14, 13,  // min_len, max_ops, is_stmt, base, range, opcode_base
      0, 1, 1, 1, 1, 0, 0, 0, 1, 0, 0, 1,         // standard opcode lengths
      'd', 0, 0,                                  // directories: "d"
      'f', '.', 'c', 0, 1, 0, 0, 0,               // files: "f.c" in "d"
  };
  const size_t header_end = unit.size();
  const uint8_t program[] = {
      0, 9, 2, 0x00, 0x10, 0, 0, 0, 0, 0, 0,  // set_address 0x1000
      1,                                      // copy: 0x1000 line 1
      3, 2,                                   // advance_line: 3
      0x21,                                   // special: 0x1001 line 4
      2, 4,                                   // advance_pc: 0x1005
      0, 1, 1};                               // end_sequence
  unit.insert(unit.end(), std::begin(program), std::end(program));
  unit[6] = static_cast<uint8_t>(header_end - 10);
  for (size_t cut = 0; cut <= unit.size(); ++cut) {
    std::vector<uint8_t> bytes(unit.begin(), unit.begin() + static_cast<ptrdiff_t>(cut));
    if (cut >= 4) bytes[0] = static_cast<uint8_t>(cut - 4);
    internal::LineSections sections{
        .debug_line = bytes, .debug_line_str = {}, .debug_str = {}};
    auto table = internal::LineTable::Read(sections, 0, "/src", 8);
    if (cut == unit.size()) {
      ASSERT_TRUE(table.ok()) << table.status();
      const std::string* file = nullptr;
      int line = 0;
      ASSERT_TRUE(table->Find(0x1000, &file, &line));
      ASSERT_NE(file, nullptr);
      EXPECT_EQ(*file, "d/f.c");
      EXPECT_EQ(line, 1);
      EXPECT_FALSE(table->Find(0xfff, &file, &line));
      ASSERT_TRUE(table->Find(0x1003, &file, &line));
      EXPECT_EQ(line, 4);
      EXPECT_FALSE(table->Find(0x1005, &file, &line));
    } else if (cut < header_end) {
      EXPECT_FALSE(table.ok()) << "cut at " << cut;
    }
  }
}

}  // namespace
}  // namespace inprof
