// internal: not part of the public API.
//
// A compilation unit's DWARF line table (.debug_line, versions 2 to 5),
// decoded by the symbolizer itself into 16 bytes a row.
//
// libdw's dwarf_getsrclines allocates every row of a unit separately and
// sorts them with qsort: 6-8 ms for a 14,000-row unit, which made it the
// largest single cost of a short profiled run's last export. This reader
// decodes the same program into one vector and answers exactly what
// dwfl_module_getsrc answers (same row order, same tie-breaking, same file
// names built from the directory and file tables): the symbolizer's test
// compares the two on every row of real binaries. Anything it does not
// model (a form it does not read, a split unit, data libdw would reject)
// is an error, and the symbolizer then asks libdw for that unit.
//
// Thread-safety: a LineTable is immutable once read.
#ifndef INPROF_INTERNAL_LINE_TABLE_H_
#define INPROF_INTERNAL_LINE_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#if !defined(_WIN32)
#include <elfutils/libdw.h>
#endif

#include "absl/status/statusor.h"

namespace inprof::internal {

// The sections a line program refers to (empty when absent).
struct LineSections {
  std::span<const uint8_t> debug_line;
  std::span<const uint8_t> debug_line_str;
  std::span<const uint8_t> debug_str;
};

class LineTable {
 public:
  // The line program at `offset` in `sections.debug_line`. `comp_dir` (may
  // be null) is directory 0 of a DWARF 2-4 table; `address_size` the CU's.
  static absl::StatusOr<LineTable> Read(const LineSections& sections,
                                        uint64_t offset, const char* comp_dir,
                                        uint8_t address_size);

#if !defined(_WIN32)
  // The unit `cudie` names (a CU DIE of libdw): its DW_AT_stmt_list,
  // DW_AT_comp_dir and address size, and the sections of its Dwarf
  // (line_table_libdw.cc).
  static absl::StatusOr<LineTable> ReadUnit(Dwarf_Die* cudie);
#endif

  // The lowest address a row covers and one past the highest end of
  // sequence ({0, 0} for an empty table): where Find() can answer.
  std::pair<uint64_t, uint64_t> AddressRange() const;

  // The source line of unit-relative address `address`, as
  // dwfl_module_getsrc + dwfl_lineinfo give it: false where no row covers
  // it; `*file` null where the row's file index is out of range.
  bool Find(uint64_t address, const std::string** file, int* line) const;

  // Entry `index` of the unit's file table (what DW_AT_decl_file and
  // DW_AT_call_file index; dwarf_filesrc's names), or null.
  const std::string* File(uint64_t index) const {
    return index < files_.size() ? &files_[index] : nullptr;
  }
  size_t files() const { return files_.size(); }

 private:
  struct Row {
    static constexpr uint32_t kMaxFile = (1u << 31) - 1;
    uint64_t address;
    int32_t line;
    uint32_t file : 31;
    uint32_t end_sequence : 1;
  };
  static_assert(sizeof(Row) == 16);
  // Sorts rows_ (in program order, sequences beginning at
  // `sequence_starts`) by address, an end of sequence before other rows at
  // its address, then program order: libdw's order, which decides what an
  // address between two sequences or at a shared address resolves to.
  void SortLikeLibdw(std::vector<size_t> sequence_starts);

  std::vector<Row> rows_;
  std::vector<std::string> files_;
};

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_LINE_TABLE_H_
