// src/symbolize/dwarf_lines_windows.h: file and line from a PE module's own
// DWARF (.debug_line), for the Windows symbolizer: DbgHelp reads no DWARF
// on Windows, and Wine 8's faults on large programs that mix DWARF 4 and 5
// units. Each line program is decoded by internal::LineTable (the ELF
// symbolizer's reader); the compilation units say each program's
// directory and address size.
//
// Thread-safety: a DwarfLines is immutable once read.
#ifndef INPROF_SRC_SYMBOLIZE_DWARF_LINES_WINDOWS_H_
#define INPROF_SRC_SYMBOLIZE_DWARF_LINES_WINDOWS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "inprof/base/growth_safe_table.h"
#include "inprof/internal/line_table.h"
#include "src/symbolize/pe_image_windows.h"

namespace inprof::internal {

// What a compilation unit tells about its line program.
struct UnitLines {
  std::string comp_dir;  // empty: unknown
  uint8_t address_size = 8;
};

// The line programs of one module (its PE file's .debug_line), decoded,
// with an index by address: "file:line" without DbgHelp, which on Windows
// reads no DWARF and in Wine 8 faults on large programs mixing DWARF 4 and
// 5 units. Addresses are link-time ones (the file's ImageBase plus RVA).
// Immutable once read.
class DwarfLines {
 public:
  // The tables of `image` (a file's); null when it has no .debug_line or
  // none of its programs covers code of the image. `*error` gets one line
  // (without the module's name) when something could not be read.
  static std::unique_ptr<DwarfLines> Read(const PeImage& image,
                                          std::string* error);

  uint64_t image_base() const { return image_base_; }

  // Estimated heap bytes held.
  size_t bytes() const { return bytes_; }

  // The file and line of link-time address `address`; false where no table
  // covers it. Where several do (overlapping sequences), the one whose
  // covering row is closest below the address answers.
  bool Find(uint64_t address, std::string* file, int64_t* line) const;

 private:
  struct Span {
    uint64_t lo;  // [lo, hi): where the table's rows lie, inside the image
    uint64_t hi;
    uint32_t table;
    bool rows_below;  // the table has rows below the image (discarded code)
  };

  DwarfLines() = default;

  // The compile directory and address size of each unit of .debug_info,
  // by its DW_AT_stmt_list: directory 0 of a DWARF 2-4 line table. Only
  // each unit's header and first DIE are read.
  static internal::ThrowSafeMap<uint64_t, UnitLines> ReadUnits(
      const PeImage& image, const std::vector<uint8_t>& debug_str,
      const std::vector<uint8_t>& debug_line_str);

  struct UnitHead {
    uint64_t size = 0;  // of the whole unit, its length field included
    bool complete = false;  // its first DIE's attributes were all read
    bool has_stmt_list = false;
    uint64_t stmt_list = 0;
    UnitLines lines;
  };

  // Reads the header and first DIE of the unit that `bytes` (its first
  // bytes, `left` bytes of .debug_info from its start) begins. False when
  // the header gives no size to go on from.
  static bool ReadUnitHead(const std::vector<uint8_t>& bytes, uint64_t left,
                           const std::vector<uint8_t>& abbrev,
                           const std::vector<uint8_t>& debug_str,
                           const std::vector<uint8_t>& debug_line_str,
                           UnitHead* out);

  // Estimated heap bytes of `table`, read from a program of `program_bytes`
  // (the reader reserves a 16-byte row per 4 bytes of program).
  static size_t TableBytes(const internal::LineTable& table,
                           uint64_t program_bytes);

  // The lowest address from which up to `address` `span`'s table gives
  // (`file`, `line`) throughout: where the covering row (or its run of
  // rows with that line) starts.
  uint64_t RowStart(const Span& span, uint64_t address, const std::string* file,
                    int line) const;

  // A file name as the table gives it, except that the reader joins a
  // directory in front of any name not starting with '/': a Windows
  // absolute name ("C:\src\a.c", "C:/src/a.c") inside it is the whole path.
  static std::string SourcePath(const std::string& name);

  uint64_t image_base_ = 0;
  std::vector<internal::LineTable> tables_;
  std::vector<Span> spans_;       // sorted by lo
  std::vector<uint64_t> max_hi_;  // max_hi_[i]: the highest hi of spans_[0..i]
  size_t bytes_ = 0;
};

}  // namespace inprof::internal

#endif  // INPROF_SRC_SYMBOLIZE_DWARF_LINES_WINDOWS_H_
