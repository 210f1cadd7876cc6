#include "inprof/internal/line_table.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "inprof/base/byte_cursor.h"
#include "inprof/base/dwarf_constants.h"

namespace inprof::internal {
namespace {

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(".debug_line: ", what));
}

absl::Status Unsupported(absl::string_view what) {
  return absl::UnimplementedError(absl::StrCat(".debug_line: ", what));
}

using Cursor = ByteCursor;

// One DWARF 5 directory or file entry field: its string (dwarf::kLnctPath) or
// number (dwarf::kLnctDirectoryIndex), and the cursor moved past it. Forms
// this reader does not know are Unimplemented (libdw reads them).
struct FieldValue {
  const char* string = nullptr;
  bool has_number = false;
  uint64_t number = 0;
};

absl::Status ReadField(Cursor& c, uint64_t form, unsigned offset_size,
                       const LineSections& sections, FieldValue* value) {
  uint64_t v = 0;
  switch (form) {
    case dwarf::kFormString:
      if (!c.CString(&value->string)) return Invalid("unterminated string");
      return absl::OkStatus();
    case dwarf::kFormLineStrp:
    case dwarf::kFormStrp: {
      if (!c.Fixed(offset_size, &v)) return Invalid("truncated string offset");
      value->string = StringAt(
          form == dwarf::kFormStrp ? sections.debug_str : sections.debug_line_str, v);
      if (value->string == nullptr) return Unsupported("string offset");
      return absl::OkStatus();
    }
    case dwarf::kFormUdata:
      if (!c.Uleb(&v)) return Invalid("truncated number");
      value->has_number = true;
      value->number = v;
      return absl::OkStatus();
    case dwarf::kFormData1:
    case dwarf::kFormData2:
    case dwarf::kFormData4:
    case dwarf::kFormData8: {
      const size_t n = form == dwarf::kFormData1   ? 1
                       : form == dwarf::kFormData2 ? 2
                       : form == dwarf::kFormData4 ? 4
                                                   : 8;
      if (!c.Fixed(n, &v)) return Invalid("truncated number");
      value->has_number = true;
      value->number = v;
      return absl::OkStatus();
    }
    case dwarf::kFormData16:
      if (c.left() < 16) return Invalid("truncated data16");
      c.p += 16;
      return absl::OkStatus();
    case dwarf::kFormBlock:
      if (!c.Uleb(&v) || v > c.left()) return Invalid("truncated block");
      c.p += v;
      return absl::OkStatus();
    default:
      return Unsupported(absl::StrCat("form 0x", absl::Hex(form)));
  }
}

// "dir/name" unless `name` is absolute or the directory is unknown, as
// libdw builds a line table's file names.
std::string JoinPath(const char* dir, const char* name) {
  if (name[0] == '/' || dir == nullptr) return name;
  return absl::StrCat(dir, "/", name);
}

// A DWARF 2-4 file entry (the header's file table, dwarf::kLneDefineFile):
// name, directory index, modification time, length. libdw reads the
// index as 64 bits in the table and as 32 in dwarf::kLneDefineFile.
absl::Status ReadFileEntry(Cursor& c, const std::vector<const char*>& dirs,
                           bool index_as_32_bits, std::string* path) {
  const char* name = nullptr;
  uint64_t dir = 0, mtime = 0, length = 0;
  if (!c.CString(&name)) return Invalid("unterminated file name");
  if (!c.Uleb(&dir)) return Invalid("truncated file entry");
  if (index_as_32_bits) dir = static_cast<uint32_t>(dir);
  if (dir >= dirs.size()) return Invalid("directory index out of range");
  if (!c.Uleb(&mtime) || !c.Uleb(&length)) return Invalid("truncated file entry");
  *path = JoinPath(dirs[dir], name);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LineTable> LineTable::Read(const LineSections& sections,
                                          uint64_t offset, const char* comp_dir,
                                          uint8_t address_size) {
  if (offset >= sections.debug_line.size()) return Invalid("offset past the section");
  Cursor c{sections.debug_line.data() + offset,
           sections.debug_line.data() + sections.debug_line.size()};
  uint64_t unit_length = 0;
  if (!c.Fixed(4, &unit_length)) return Invalid("truncated header");
  unsigned offset_size = 4;
  if (unit_length == 0xffffffff) {
    if (!c.Fixed(8, &unit_length)) return Invalid("truncated header");
    offset_size = 8;
  }
  if (unit_length > c.left()) return Invalid("unit longer than the section");
  c.end = c.p + unit_length;

  uint64_t version = 0;
  if (!c.Fixed(2, &version)) return Invalid("truncated header");
  if (version < 2 || version > 5) {
    return Unsupported(absl::StrCat("version ", version));
  }
  if (version >= 5) {
    uint64_t line_address_size = 0, segment_selector_size = 0;
    if (!c.Fixed(1, &line_address_size) || !c.Fixed(1, &segment_selector_size)) {
      return Invalid("truncated header");
    }
    if (line_address_size != address_size || segment_selector_size != 0) {
      return Invalid("address size differs from the unit's");
    }
  }
  uint64_t header_length = 0;
  if (!c.Fixed(offset_size, &header_length)) return Invalid("truncated header");
  const uint8_t* const header_start = c.p;

  uint64_t minimum_instr_len = 0;
  if (!c.Fixed(1, &minimum_instr_len)) return Invalid("truncated header");
  uint64_t max_ops_per_instr = 1;
  if (version >= 4) {
    if (!c.Fixed(1, &max_ops_per_instr) || max_ops_per_instr == 0) {
      return Invalid("maximum operations per instruction");
    }
  }
  uint64_t default_is_stmt = 0, line_base_byte = 0, line_range = 0,
           opcode_base = 0;
  if (!c.Fixed(1, &default_is_stmt) || !c.Fixed(1, &line_base_byte) ||
      !c.Fixed(1, &line_range) || !c.Fixed(1, &opcode_base)) {
    return Invalid("truncated header");
  }
  const int line_base = static_cast<int8_t>(line_base_byte);
  // standard_opcode_lengths[op] for op >= 1 (libdw indexes it the same way,
  // extended opcode numbers included).
  const uint8_t* const standard_opcode_lengths = c.p - 1;
  if (opcode_base == 0 || c.left() < opcode_base - 1) {
    return Invalid("truncated opcode lengths");
  }
  c.p += opcode_base - 1;
  auto opcode_length = [&](unsigned op, uint8_t* out) {
    const uint8_t* at = standard_opcode_lengths + op;
    if (at < header_start || at >= c.end) return false;
    *out = *at;
    return true;
  };

  LineTable table;
  std::vector<const char*> dirs;
  if (version < 5) {
    dirs.push_back(comp_dir);
    while (true) {
      if (c.p >= c.end) return Invalid("truncated directory table");
      if (*c.p == '\0') {
        ++c.p;
        break;
      }
      const char* dir = nullptr;
      if (!c.CString(&dir)) return Invalid("unterminated directory");
      dirs.push_back(dir);
    }
    table.files_.push_back("???");
    if (c.p >= c.end) return Invalid("truncated file table");
    while (c.p < c.end && *c.p != '\0') {
      std::string path;
      absl::Status s = ReadFileEntry(c, dirs, /*index_as_32_bits=*/false, &path);
      if (!s.ok()) return s;
      table.files_.push_back(std::move(path));
    }
    if (c.p >= c.end || *c.p != '\0') return Invalid("unterminated file table");
    ++c.p;
  } else {
    // Directory, then file entries: a format (content type, form pairs),
    // a count, the entries.
    for (int pass = 0; pass < 2; ++pass) {
      const bool files = pass == 1;
      uint64_t nforms = 0;
      if (!c.Fixed(1, &nforms)) return Invalid("truncated entry format");
      std::vector<std::pair<uint64_t, uint64_t>> format;
      int path_field = -1, dir_field = -1;
      for (uint64_t i = 0; i < nforms; ++i) {
        uint64_t type = 0, form = 0;
        if (!c.Uleb(&type) || !c.Uleb(&form)) return Invalid("truncated entry format");
        if (type == dwarf::kLnctPath) path_field = static_cast<int>(i);
        if (files && type == dwarf::kLnctDirectoryIndex) dir_field = static_cast<int>(i);
        format.emplace_back(type, form);
      }
      if (nforms > 0 && (path_field < 0 || (files && dir_field < 0))) {
        return Invalid("entry format without a path or directory");
      }
      uint64_t count = 0;
      if (!c.Uleb(&count)) return Invalid("truncated entry count");
      if (nforms == 0 && count != 0) return Invalid("entries without a format");
      if (nforms != 0 && count > c.left() / nforms) return Invalid("entry count");
      for (uint64_t n = 0; n < count; ++n) {
        FieldValue path, dir;
        for (uint64_t i = 0; i < nforms; ++i) {
          FieldValue v;
          absl::Status s = ReadField(c, format[i].second, offset_size, sections, &v);
          if (!s.ok()) return s;
          if (static_cast<int>(i) == path_field) path = v;
          if (static_cast<int>(i) == dir_field) dir = v;
        }
        if (path.string == nullptr) return Unsupported("entry path form");
        if (!files) {
          dirs.push_back(path.string);
          continue;
        }
        if (!dir.has_number) return Unsupported("directory index form");
        if (dir.number >= dirs.size()) return Invalid("directory index out of range");
        // Entry 0 is the unit's primary file; DWARF 5 indexes from 0.
        table.files_.push_back(JoinPath(dirs[dir.number], path.string));
      }
      if (files && count == 0) table.files_.push_back("???");
    }
  }
  const uint64_t header_read = static_cast<uint64_t>(c.p - header_start);
  if (header_read + 4 == header_length && c.left() >= 4) {
    c.p += 4;  // CUBIN: an offset into .debug_str (NVIDIA extensions)
  }
  if (static_cast<uint64_t>(c.p - header_start) != header_length) {
    return Invalid("header length differs from its contents");
  }

  // The program. Registers as DWARF 5 6.2.2; rows checked for the ranges
  // libdw stores them in (it rejects the whole table otherwise).
  struct State {
    uint64_t address = 0;
    uint32_t op_index = 0;
    uint32_t file = 1;
    int64_t line = 1;
    uint32_t column = 0;
    uint8_t is_stmt = 0;
    uint32_t isa = 0;
    uint32_t discriminator = 0;
  };
  const State initial{.is_stmt = static_cast<uint8_t>(default_is_stmt)};
  State state = initial;
  // About one row for every four or five bytes of program.
  table.rows_.reserve(c.left() / 4);
  std::vector<size_t> sequence_starts = {0};
  // In 32-bit arithmetic, as libdw computes it.
  const uint32_t min_len = static_cast<uint32_t>(minimum_instr_len);
  const uint32_t max_ops = static_cast<uint32_t>(max_ops_per_instr);
  auto advance_pc = [&](uint32_t op_advance) {
    const uint32_t ops = state.op_index + op_advance;
    state.address += static_cast<uint32_t>(min_len * (ops / max_ops));
    state.op_index = ops % max_ops;
  };
  auto add_row = [&](bool end_sequence) {
    if (state.line < std::numeric_limits<int>::min() ||
        state.line > std::numeric_limits<int>::max() || state.column > 0xffff ||
        state.op_index > 0xff || state.isa > 0xff || state.is_stmt > 1 ||
        state.discriminator >= (1u << 24)) {
      return false;
    }
    if (state.file > Row::kMaxFile) return false;  // (libdw would take it)
    table.rows_.push_back({.address = state.address,
                           .line = static_cast<int32_t>(state.line),
                           .file = state.file,
                           .end_sequence = end_sequence ? 1u : 0u});
    if (end_sequence) sequence_starts.push_back(table.rows_.size());
    return true;
  };
  while (c.p < c.end) {
    const unsigned opcode = *c.p++;
    uint8_t len = 0;
    uint64_t u = 0;
    int64_t sv = 0;
    if (opcode >= opcode_base) {
      if (line_range == 0) return Invalid("line range 0");
      state.line += line_base + static_cast<int>((opcode - opcode_base) % line_range);
      advance_pc(static_cast<uint32_t>((opcode - opcode_base) / line_range));
      if (!add_row(false)) return Invalid("row out of range");
      state.discriminator = 0;
    } else if (opcode == 0) {
      if (c.left() < 2) return Invalid("truncated extended opcode");
      const uint8_t ext_len = *c.p++;
      if (c.left() < ext_len) return Invalid("truncated extended opcode");
      const unsigned sub = *c.p++;
      switch (sub) {
        case dwarf::kLneEndSequence:
          if (!add_row(true)) return Invalid("row out of range");
          state = initial;
          break;
        case dwarf::kLneSetAddress:
          state.op_index = 0;
          if (address_size != 4 && address_size != 8) {
            return Unsupported("address size");
          }
          if (!c.Fixed(address_size, &state.address)) return Invalid("truncated address");
          break;
        case dwarf::kLneDefineFile: {
          std::string path;
          absl::Status s = ReadFileEntry(c, dirs, /*index_as_32_bits=*/true, &path);
          if (!s.ok()) return s;
          table.files_.push_back(std::move(path));
          break;
        }
        case dwarf::kLneSetDiscriminator:
          if (!opcode_length(sub, &len) || len != 1) return Invalid("opcode length");
          if (!c.Uleb(&u)) return Invalid("truncated operand");
          state.discriminator = static_cast<uint32_t>(u);
          break;
        case dwarf::kLneNvidiaInlinedCall:
          if (!c.Uleb(&u) || !c.Uleb(&u)) return Invalid("truncated operand");
          break;
        case dwarf::kLneNvidiaSetFunctionName:
          if (!c.Uleb(&u)) return Invalid("truncated operand");
          break;
        default:
          // Unknown: skipped by its length (which counts the sub-opcode).
          if (static_cast<size_t>(c.end - (c.p - 1)) < ext_len) {
            return Invalid("truncated extended opcode");
          }
          c.p += ext_len - 1;
          break;
      }
    } else if (opcode <= dwarf::kLnsSetIsa) {
      if (!opcode_length(opcode, &len)) return Invalid("opcode length");
      const uint8_t want =
          (opcode == dwarf::kLnsAdvancePc || opcode == dwarf::kLnsAdvanceLine ||
           opcode == dwarf::kLnsSetFile || opcode == dwarf::kLnsSetColumn ||
           opcode == dwarf::kLnsFixedAdvancePc || opcode == dwarf::kLnsSetIsa)
              ? 1
              : 0;
      if (len != want) return Invalid("opcode length");
      switch (opcode) {
        case dwarf::kLnsCopy:
          if (!add_row(false)) return Invalid("row out of range");
          state.discriminator = 0;
          break;
        case dwarf::kLnsAdvancePc:
          if (!c.Uleb(&u)) return Invalid("truncated operand");
          advance_pc(static_cast<uint32_t>(u));
          break;
        case dwarf::kLnsAdvanceLine:
          if (!c.Sleb(&sv)) return Invalid("truncated operand");
          state.line += static_cast<int32_t>(sv);
          break;
        case dwarf::kLnsSetFile:
          if (!c.Uleb(&u)) return Invalid("truncated operand");
          state.file = static_cast<uint32_t>(u);
          break;
        case dwarf::kLnsSetColumn:
          if (!c.Uleb(&u)) return Invalid("truncated operand");
          state.column = static_cast<uint32_t>(u);
          break;
        case dwarf::kLnsNegateStmt:
          state.is_stmt = static_cast<uint8_t>(1 - state.is_stmt);
          break;
        case dwarf::kLnsSetBasicBlock:
        case dwarf::kLnsSetPrologueEnd:
        case dwarf::kLnsSetEpilogueBegin:
          break;
        case dwarf::kLnsConstAddPc:
          if (line_range == 0) return Invalid("line range 0");
          advance_pc(static_cast<uint32_t>((255 - opcode_base) / line_range));
          break;
        case dwarf::kLnsFixedAdvancePc:
          if (!c.Fixed(2, &u)) return Invalid("truncated operand");
          state.address += u;
          state.op_index = 0;
          break;
        case dwarf::kLnsSetIsa:
          if (!c.Uleb(&u)) return Invalid("truncated operand");
          state.isa = static_cast<uint32_t>(u);
          break;
      }
    } else {
      // A standard opcode this reader does not know: its operands skipped.
      if (!opcode_length(opcode, &len)) return Invalid("opcode length");
      for (unsigned n = len; n > 0; --n) {
        if (!c.Uleb(&u)) return Invalid("truncated operand");
      }
    }
  }

  table.SortLikeLibdw(std::move(sequence_starts));
  // The highest address ends a sequence even where the compiler forgot.
  if (!table.rows_.empty()) table.rows_.back().end_sequence = 1;
  return table;
}

void LineTable::SortLikeLibdw(std::vector<size_t> starts) {
  auto less = [](const Row& a, const Row& b) {
    if (a.address != b.address) return a.address < b.address;
    return a.end_sequence > b.end_sequence;  // ties: program order (stable)
  };
  if (starts.back() != rows_.size()) starts.push_back(rows_.size());
  // Sequences: [starts[i], starts[i + 1]). Each is ascending as a rule; a
  // zero-length last row puts its end before the row at its address.
  const size_t count = starts.size() - 1;
  for (size_t i = 0; i < count; ++i) {
    auto first = rows_.begin() + static_cast<ptrdiff_t>(starts[i]);
    auto last = rows_.begin() + static_cast<ptrdiff_t>(starts[i + 1]);
    if (!std::is_sorted(first, last, less)) std::stable_sort(first, last, less);
  }
  std::vector<size_t> order(count);
  for (size_t i = 0; i < count; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return less(rows_[starts[a]], rows_[starts[b]]);
  });
  // Already in order (the sequences neither overlap nor touch): done.
  bool sorted = true;
  for (size_t i = 0; i + 1 < count && sorted; ++i) {
    sorted = order[i] < order[i + 1] &&
             less(rows_[starts[order[i] + 1] - 1], rows_[starts[order[i + 1]]]);
  }
  if (sorted) return;
  // Concatenate them by their first rows; a run of sequences that overlap
  // (or touch: ties are decided by program order) is put back in program
  // order and merged.
  std::vector<Row> out;
  out.reserve(rows_.size());
  size_t i = 0;
  while (i < count) {
    size_t j = i + 1;
    const Row* max_last = &rows_[starts[order[i] + 1] - 1];
    while (j < count && !less(*max_last, rows_[starts[order[j]]])) {
      const Row* last = &rows_[starts[order[j] + 1] - 1];
      if (less(*max_last, *last)) max_last = last;
      ++j;
    }
    const size_t cluster_begin = out.size();
    if (j - i > 1) std::sort(order.begin() + static_cast<ptrdiff_t>(i),
                             order.begin() + static_cast<ptrdiff_t>(j));
    for (size_t k = i; k < j; ++k) {
      out.insert(out.end(), rows_.begin() + static_cast<ptrdiff_t>(starts[order[k]]),
                 rows_.begin() + static_cast<ptrdiff_t>(starts[order[k] + 1]));
    }
    if (j - i > 1) {
      std::stable_sort(out.begin() + static_cast<ptrdiff_t>(cluster_begin),
                       out.end(), less);
    }
    i = j;
  }
  rows_ = std::move(out);
}

bool LineTable::Find(uint64_t address, const std::string** file,
                     int* line) const {
  if (rows_.empty()) return false;
  size_t l = 0, u = rows_.size() - 1;
  while (l < u) {
    const size_t idx = u - (u - l) / 2;
    if (address < rows_[idx].address) {
      u = idx - 1;
    } else {
      l = idx;
    }
  }
  const Row& row = rows_[l];
  if (row.end_sequence != 0 || row.address > address) return false;
  *line = row.line;
  *file = row.file < files_.size() ? &files_[row.file] : nullptr;
  return true;
}

std::pair<uint64_t, uint64_t> LineTable::AddressRange() const {
  if (rows_.empty()) return {0, 0};
  uint64_t hi = 0;
  for (const Row& row : rows_) hi = std::max(hi, row.address);
  return {rows_.front().address, hi};
}

}  // namespace inprof::internal
