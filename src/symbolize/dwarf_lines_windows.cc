// src/symbolize/dwarf_lines_windows.cc: see dwarf_lines_windows.h.
#include "src/symbolize/dwarf_lines_windows.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "inprof/base/byte_cursor.h"
#include "inprof/base/dwarf_constants.h"

namespace inprof::internal {
namespace {

using Cursor = internal::ByteCursor;

// Moves `c` past an attribute value of `form`; false for a form it does not
// know or a value running past the cursor's end.
bool SkipForm(Cursor& c, uint64_t form, unsigned offset_size,
              unsigned address_size, unsigned version, int depth = 0) {
  uint64_t n = 0;
  switch (form) {
    case dwarf::kFormFlagPresent:
    case dwarf::kFormImplicitConst:
      return true;
    case dwarf::kFormData1:
    case dwarf::kFormRef1:
    case dwarf::kFormFlag:
      return c.Skip(1);
    case dwarf::kFormData2:
    case dwarf::kFormRef2:
      return c.Skip(2);
    case dwarf::kFormData4:
    case dwarf::kFormRef4:
    case dwarf::kFormRefSup4:
      return c.Skip(4);
    case dwarf::kFormData8:
    case dwarf::kFormRef8:
    case dwarf::kFormRefSig8:
    case dwarf::kFormRefSup8:
      return c.Skip(8);
    case dwarf::kFormData16:
      return c.Skip(16);
    case dwarf::kFormAddr:
      return c.Skip(address_size);
    case dwarf::kFormRefAddr:
      return c.Skip(version <= 2 ? address_size : offset_size);
    case dwarf::kFormStrp:
    case dwarf::kFormLineStrp:
    case dwarf::kFormSecOffset:
    case dwarf::kFormStrpSup:
    case dwarf::kFormGnuRefAlt:
    case dwarf::kFormGnuStrpAlt:
      return c.Skip(offset_size);
    case dwarf::kFormSdata:
    case dwarf::kFormUdata:
    case dwarf::kFormRefUdata:
    case dwarf::kFormStrx:
    case dwarf::kFormAddrx:
    case dwarf::kFormLoclistx:
    case dwarf::kFormRnglistx:
    case dwarf::kFormGnuAddrIndex:
    case dwarf::kFormGnuStrIndex:
      return c.SkipLeb();
    case dwarf::kFormString: {
      const char* ignored;
      return c.CString(&ignored);
    }
    case dwarf::kFormBlock1:
      return c.Fixed(1, &n) && c.Skip(n);
    case dwarf::kFormBlock2:
      return c.Fixed(2, &n) && c.Skip(n);
    case dwarf::kFormBlock4:
      return c.Fixed(4, &n) && c.Skip(n);
    case dwarf::kFormBlock:
    case dwarf::kFormExprloc:
      return c.Uleb(&n) && c.Skip(n);
    case dwarf::kFormIndirect:
      return depth < 4 && c.Uleb(&n) &&
             SkipForm(c, n, offset_size, address_size, version, depth + 1);
    default:
      if (form >= dwarf::kFormStrx1 && form <= dwarf::kFormStrx4) {
        return c.Skip(form - dwarf::kFormStrx1 + 1);
      }
      if (form >= dwarf::kFormAddrx1 && form <= dwarf::kFormAddrx4) {
        return c.Skip(form - dwarf::kFormAddrx1 + 1);
      }
      return false;
  }
}

}  // namespace

std::unique_ptr<DwarfLines> DwarfLines::Read(const PeImage& image,
                                        std::string* error) {
  error->clear();
  PeImage::FileSection line_section;
  if (!image.FindSection(".debug_line", &line_section) ||
      line_section.size == 0) {
    return nullptr;
  }
  // Sections read whole are capped: a larger one is corrupt or absurd.
  constexpr uint64_t kMaxSection = uint64_t{1} << 30;
  auto read_section = [&](absl::string_view name,
                          std::vector<uint8_t>* out) -> bool {
    PeImage::FileSection s;
    if (!image.FindSection(name, &s)) return true;  // absent: empty
    if (s.size > kMaxSection) {
      *error = absl::StrCat(name, ": ", s.size, " bytes, over the limit");
      return false;
    }
    out->resize(static_cast<size_t>(s.size));
    if (!image.ReadAt(s.offset, out->data(), out->size())) {
      *error = absl::StrCat(name, ": cannot read ", s.size,
                            " bytes at file offset ", s.offset);
      out->clear();
      return false;
    }
    return true;
  };
  std::vector<uint8_t> debug_line, debug_line_str, debug_str;
  if (!read_section(".debug_line", &debug_line) ||
      !read_section(".debug_line_str", &debug_line_str) ||
      !read_section(".debug_str", &debug_str)) {
    return nullptr;
  }
  const internal::ThrowSafeMap<uint64_t, UnitLines> units =
      ReadUnits(image, debug_str, debug_line_str);
  const internal::LineSections sections{
      .debug_line = debug_line,
      .debug_line_str = debug_line_str,
      .debug_str = debug_str,
  };

  auto lines = std::unique_ptr<DwarfLines>(new DwarfLines());
  lines->image_base_ = image.image_base();
  const uint64_t image_limit = image.image_base() + image.size_of_image();
  size_t programs = 0, refused = 0;
  std::string first_refusal;
  const uint64_t size = debug_line.size();
  uint64_t offset = 0;
  while (offset < size && size - offset >= 4) {
    Cursor c{debug_line.data() + offset, debug_line.data() + size};
    uint64_t unit_length = 0;
    unsigned length_size = 4;
    c.Fixed(4, &unit_length);
    if (unit_length == 0xffffffff) {
      length_size = 12;
      if (!c.Fixed(8, &unit_length)) {
        *error = absl::StrFormat(
            ".debug_line: truncated program header at offset %#x", offset);
        break;
      }
    } else if (unit_length >= 0xfffffff0) {
      *error = absl::StrFormat(
          ".debug_line: reserved unit length %#x at offset %#x", unit_length,
          offset);
      break;
    }
    if (unit_length == 0) {  // padding
      offset += length_size;
      continue;
    }
    if (unit_length > size - offset - length_size) {
      *error = absl::StrFormat(
          ".debug_line: the program at offset %#x (%u bytes) runs past the "
          "section's end (%u bytes)",
          offset, unit_length, size);
      break;
    }
    ++programs;
    auto unit = units.find(offset);
    const char* comp_dir = unit != units.end() && !unit->second.comp_dir.empty()
                               ? unit->second.comp_dir.c_str()
                               : nullptr;
    const uint8_t address_size =
        unit != units.end() ? unit->second.address_size : 8;
    absl::StatusOr<internal::LineTable> table =
        internal::LineTable::Read(sections, offset, comp_dir, address_size);
    if (!table.ok()) {
      if (refused++ == 0) {
        first_refusal = absl::StrFormat("at offset %#x: %s", offset,
                                        table.status().message());
      }
    } else {
      auto [lo, hi] = table->AddressRange();
      // Sequences of code the linker discarded (duplicate COMDATs) lie
      // at 0: only what lies inside the image counts.
      const bool rows_below = lo < image.image_base();
      lo = std::max(lo, image.image_base());
      hi = std::min(hi, image_limit);
      if (lo < hi) {
        lines->bytes_ += TableBytes(*table, unit_length);
        lines->spans_.push_back(
            {lo, hi, static_cast<uint32_t>(lines->tables_.size()),
             rows_below});
        lines->tables_.push_back(std::move(*table));
      }
    }
    offset += length_size + unit_length;
  }
  if (refused > 0 && error->empty()) {
    *error = absl::StrFormat("%u of %u line programs unreadable (%s)",
                             refused, programs, first_refusal);
  }
  if (lines->tables_.empty()) return nullptr;
  lines->tables_.shrink_to_fit();
  std::sort(lines->spans_.begin(), lines->spans_.end(),
            [](const Span& a, const Span& b) { return a.lo < b.lo; });
  lines->max_hi_.reserve(lines->spans_.size());
  uint64_t max_hi = 0;
  for (const Span& s : lines->spans_) {
    max_hi = std::max(max_hi, s.hi);
    lines->max_hi_.push_back(max_hi);
  }
  lines->bytes_ += sizeof(DwarfLines) +
                   lines->tables_.capacity() * sizeof(internal::LineTable) +
                   lines->spans_.capacity() * sizeof(Span) +
                   lines->max_hi_.capacity() * sizeof(uint64_t);
  return lines;
}

bool DwarfLines::Find(uint64_t address, std::string* file, int64_t* line) const {
  auto it = std::upper_bound(
      spans_.begin(), spans_.end(), address,
      [](uint64_t a, const Span& s) { return a < s.lo; });
  const std::string* best_file = nullptr;
  int best_line = 0;
  const Span* best = nullptr;
  uint64_t best_distance = 0;
  for (size_t i = static_cast<size_t>(it - spans_.begin()); i-- > 0;) {
    if (max_hi_[i] <= address) break;  // no span at or before i reaches it
    const Span& s = spans_[i];
    if (address >= s.hi) continue;
    const internal::LineTable& table = tables_[s.table];
    const std::string* f = nullptr;
    int l = 0;
    if (!table.Find(address, &f, &l)) continue;
    // A row of discarded code, below the image, answers for every address
    // up to the table's next row when it is the last of its sequence
    // without being its end (a zero-length row): not an answer. Then the
    // row before the image gives the same answer, and does all the way up.
    if (s.rows_below) {
      const std::string* below_file = nullptr;
      int below_line = 0;
      if (table.Find(s.lo - 1, &below_file, &below_line) &&
          below_file == f && below_line == l &&
          RowStart(s, address, f, l) == s.lo) {
        continue;
      }
    }
    if (best == nullptr) {
      best = &s;
      best_file = f;
      best_line = l;
      continue;
    }
    // Rare: sequences of two units overlap. Distances are computed only
    // then.
    if (best_distance == 0) {
      best_distance = address - RowStart(*best, address, best_file, best_line) + 1;
    }
    const uint64_t distance = address - RowStart(s, address, f, l) + 1;
    if (distance < best_distance ||
        (distance == best_distance && s.table < best->table)) {
      best = &s;
      best_file = f;
      best_line = l;
      best_distance = distance;
    }
  }
  if (best == nullptr) return false;
  *file = best_file != nullptr ? SourcePath(*best_file) : "";
  *line = best_line;
  return true;
}

internal::ThrowSafeMap<uint64_t, UnitLines> DwarfLines::ReadUnits(
    const PeImage& image, const std::vector<uint8_t>& debug_str,
    const std::vector<uint8_t>& debug_line_str) {
  internal::ThrowSafeMap<uint64_t, UnitLines> units;
  PeImage::FileSection info, abbrev_section;
  if (!image.FindSection(".debug_info", &info) ||
      !image.FindSection(".debug_abbrev", &abbrev_section) ||
      abbrev_section.size > (uint64_t{64} << 20)) {
    return units;
  }
  std::vector<uint8_t> abbrev(static_cast<size_t>(abbrev_section.size));
  if (!image.ReadAt(abbrev_section.offset, abbrev.data(), abbrev.size())) {
    return units;
  }
  std::vector<uint8_t> chunk;
  for (uint64_t offset = 0; offset + 11 <= info.size;) {
    // The unit's header and first DIE: the unit's start, read again up
    // to 1 MiB of it when its first DIE did not fit.
    uint64_t want = std::min<uint64_t>(info.size - offset, 4096);
    UnitHead head;
    for (int attempt = 0; attempt < 2; ++attempt) {
      chunk.resize(static_cast<size_t>(want));
      if (!image.ReadAt(info.offset + offset, chunk.data(), chunk.size())) {
        return units;
      }
      head = UnitHead();
      if (!ReadUnitHead(chunk, info.size - offset, abbrev, debug_str,
                        debug_line_str, &head)) {
        return units;  // no unit boundary to go on from
      }
      const uint64_t whole =
          std::min<uint64_t>(head.size, uint64_t{1} << 20);
      if (head.complete || whole <= want) break;
      want = whole;
    }
    if (head.has_stmt_list) units.emplace(head.stmt_list, std::move(head.lines));
    offset += head.size;
  }
  return units;
}

bool DwarfLines::ReadUnitHead(const std::vector<uint8_t>& bytes, uint64_t left,
                         const std::vector<uint8_t>& abbrev,
                         const std::vector<uint8_t>& debug_str,
                         const std::vector<uint8_t>& debug_line_str,
                         UnitHead* out) {
  Cursor c{bytes.data(), bytes.data() + bytes.size()};
  uint64_t unit_length = 0, version = 0;
  unsigned offset_size = 4;
  if (!c.Fixed(4, &unit_length)) return false;
  if (unit_length == 0xffffffff) {
    if (!c.Fixed(8, &unit_length)) return false;
    offset_size = 8;
  } else if (unit_length >= 0xfffffff0) {
    return false;
  }
  const uint64_t header = offset_size == 8 ? 12 : 4;
  if (unit_length == 0 || left < header || unit_length > left - header) {
    return false;
  }
  out->size = header + unit_length;
  if (c.left() > unit_length) c.end = c.p + unit_length;
  // From here on a unit this cannot read is skipped (complete: nothing
  // more to read in it).
  out->complete = true;
  if (!c.Fixed(2, &version) || version < 2 || version > 5) return true;
  uint64_t abbrev_offset = 0, address_size = 0, unit_type = 1;
  if (version >= 5) {
    if (!c.Fixed(1, &unit_type) || !c.Fixed(1, &address_size) ||
        !c.Fixed(offset_size, &abbrev_offset)) {
      return true;
    }
    if (unit_type == 4 || unit_type == 5) {  // skeleton, split: a dwo_id
      if (!c.Skip(8)) return true;
    } else if (unit_type != 1 && unit_type != 3) {  // type units
      return true;
    }
  } else if (!c.Fixed(offset_size, &abbrev_offset) ||
             !c.Fixed(1, &address_size)) {
    return true;
  }
  if (address_size != 4 && address_size != 8) return true;
  out->lines.address_size = static_cast<uint8_t>(address_size);
  uint64_t code = 0;
  if (!c.Uleb(&code) || code == 0 || abbrev_offset >= abbrev.size()) {
    return true;
  }
  // The abbreviation: looked for from the start of the unit's table.
  Cursor a{abbrev.data() + abbrev_offset, abbrev.data() + abbrev.size()};
  for (int entries = 0;; ++entries) {
    uint64_t entry_code = 0, tag = 0, name = 0, form = 0;
    if (entries > 100000 || !a.Uleb(&entry_code) || entry_code == 0 ||
        !a.Uleb(&tag) || !a.Skip(1)) {
      return true;
    }
    if (entry_code == code) break;
    while (true) {
      if (!a.Uleb(&name) || !a.Uleb(&form)) return true;
      if (name == 0 && form == 0) break;
      if (form == dwarf::kFormImplicitConst && !a.SkipLeb()) return true;
    }
  }
  // Its attributes, up to DW_AT_stmt_list and DW_AT_comp_dir. A value
  // this cannot read (past the bytes read, or of a form it does not
  // know) leaves the DIE incomplete.
  out->complete = false;
  const unsigned asize = static_cast<unsigned>(address_size);
  const unsigned v = static_cast<unsigned>(version);
  bool has_comp_dir = false;
  while (!(out->has_stmt_list && has_comp_dir)) {
    uint64_t name = 0, form = 0;
    if (!a.Uleb(&name) || !a.Uleb(&form)) break;
    if (name == 0 && form == 0) {
      out->complete = true;
      break;
    }
    if (form == dwarf::kFormImplicitConst && !a.SkipLeb()) break;
    if (name == dwarf::kAtStmtList &&
        (form == dwarf::kFormSecOffset || form == dwarf::kFormData4 ||
         form == dwarf::kFormData8)) {
      const size_t n = form == dwarf::kFormSecOffset ? offset_size
                       : form == dwarf::kFormData4   ? 4
                                              : 8;
      if (!c.Fixed(n, &out->stmt_list)) break;
      out->has_stmt_list = true;
    } else if (name == dwarf::kAtCompDir &&
               (form == dwarf::kFormString || form == dwarf::kFormStrp ||
                form == dwarf::kFormLineStrp)) {
      const char* dir = nullptr;
      uint64_t at = 0;
      if (form == dwarf::kFormString) {
        if (!c.CString(&dir)) break;
      } else {
        if (!c.Fixed(offset_size, &at)) break;
        dir = internal::StringAt(form == dwarf::kFormStrp ? debug_str : debug_line_str, at);
      }
      if (dir != nullptr) out->lines.comp_dir = dir;
      has_comp_dir = true;
    } else if (!SkipForm(c, form, offset_size, asize, v)) {
      break;
    }
  }
  // Stopped far from the end of what was read: a form this does not
  // know, which more bytes would not help with.
  if ((out->has_stmt_list && has_comp_dir) || c.left() >= 256) {
    out->complete = true;
  }
  return true;
}

size_t DwarfLines::TableBytes(const internal::LineTable& table,
                         uint64_t program_bytes) {
  size_t bytes = static_cast<size_t>(program_bytes / 4 * 16) +
                 table.files() * sizeof(std::string);
  for (size_t i = 0; i < table.files(); ++i) {
    const std::string* f = table.File(i);
    if (f != nullptr && f->capacity() > std::string().capacity()) {
      bytes += f->capacity() + 1;
    }
  }
  return bytes;
}

uint64_t DwarfLines::RowStart(const Span& span, uint64_t address, const std::string* file,
                  int line) const {
  const internal::LineTable& table = tables_[span.table];
  auto same = [&](uint64_t x) {
    const std::string* f = nullptr;
    int l = 0;
    return table.Find(x, &f, &l) && f == file && l == line;
  };
  uint64_t good = address;  // same(good)
  uint64_t bad = 0;         // !same(bad), bad < good
  for (uint64_t step = 1;; step *= 2) {
    if (good - span.lo < step) {
      if (same(span.lo)) return span.lo;
      bad = span.lo;
      break;
    }
    if (!same(good - step)) {
      bad = good - step;
      break;
    }
    good -= step;
  }
  while (good - bad > 1) {
    const uint64_t mid = bad + (good - bad) / 2;
    if (same(mid)) {
      good = mid;
    } else {
      bad = mid;
    }
  }
  return good;
}

std::string DwarfLines::SourcePath(const std::string& name) {
  if (name.find(':') == std::string::npos) return name;
  auto separator = [](char c) { return c == '/' || c == '\\'; };
  for (size_t i = name.size() >= 3 ? name.size() - 3 : 0; i >= 1; --i) {
    if (separator(name[i - 1]) &&
        absl::ascii_isalpha(static_cast<unsigned char>(name[i])) &&
        name[i + 1] == ':' && separator(name[i + 2])) {
      return name.substr(i);
    }
  }
  return name;
}

}  // namespace inprof::internal
