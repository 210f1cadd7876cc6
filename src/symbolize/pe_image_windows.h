// src/symbolize/pe_image_windows.h: the PE image reader of the Windows
// symbolizer (symbolizer_dbghelp_windows.cc): an image's headers, sections,
// CodeView record, export table and COFF symbol table, read from where the
// loader mapped it or from its file, every offset checked.
//
// Defines: NameTable (function names by RVA, for addresses DbgHelp names
// not) and PeImage.
//
// Thread-safety: a PeImage is immutable once made; reads of a mapped one go
// through ReadProcessMemory, so an image unloaded meanwhile reads as an
// error rather than a crash.
#ifndef INPROF_SRC_SYMBOLIZE_PE_IMAGE_WINDOWS_H_
#define INPROF_SRC_SYMBOLIZE_PE_IMAGE_WINDOWS_H_

#ifndef NOMINMAX
#define NOMINMAX
#endif
#include <windows.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace inprof::internal {

// Function names of one image by RVA, from its export table and its COFF
// symbol table, for naming addresses DbgHelp has no symbol for.
class NameTable {
 public:
  struct Entry {
    uint32_t rva;
    int source;  // for one RVA, the lowest wins (exports: 0, COFF: 1)
    std::string name;
  };
  struct Range {
    uint32_t start;
    uint32_t limit;
  };

  NameTable() = default;
  NameTable(std::vector<Entry> entries, std::vector<Range> code)
      : entries_(std::move(entries)), code_(std::move(code)) {
    std::sort(entries_.begin(), entries_.end(),
              [](const Entry& a, const Entry& b) {
                if (a.rva != b.rva) return a.rva < b.rva;
                if (a.source != b.source) return a.source < b.source;
                return a.name < b.name;
              });
    // Aliases (NtClose and ZwClose): the first in that order stays.
    entries_.erase(std::unique(entries_.begin(), entries_.end(),
                               [](const Entry& a, const Entry& b) {
                                 return a.rva == b.rva;
                               }),
                   entries_.end());
    entries_.shrink_to_fit();
  }

  // The nearest name at or below `rva` in the same code section; null when
  // there is none.
  const std::string* Find(uint64_t rva) const {
    const Range* section = nullptr;
    for (const Range& r : code_) {
      if (rva >= r.start && rva < r.limit) section = &r;
    }
    if (section == nullptr) return nullptr;
    auto it = std::upper_bound(
        entries_.begin(), entries_.end(), rva,
        [](uint64_t a, const Entry& e) { return a < e.rva; });
    if (it == entries_.begin()) return nullptr;
    --it;
    return it->rva >= section->start ? &it->name : nullptr;
  }

  bool empty() const { return entries_.empty(); }

 private:
  std::vector<Entry> entries_;  // sorted by rva, one per rva
  std::vector<Range> code_;     // executable sections
};

// The headers and tables of one PE image (PE32 or PE32+): in memory, where
// the loader mapped it (read with ReadProcessMemory, so that an image being
// unloaded meanwhile reads as an error rather than a crash), or in a file,
// whose headers and section data are checked to lie inside it.
class PeImage {
 public:
  static absl::StatusOr<PeImage> InMemory(uint64_t base, uint64_t size,
                                          const std::string& name);

  // `file` must stay open while the image is used.
  static absl::StatusOr<PeImage> OfFile(HANDLE file, const std::string& path);

  uint64_t image_base() const { return image_base_; }
  uint32_t size_of_image() const { return size_of_image_; }

  // Reads `size` bytes at relative virtual address `rva`.
  bool Read(uint64_t rva, void* out, size_t size) const;

  // The image's CodeView (RSDS) record, if any.
  struct CodeView {
    // Its GUID (Data1, Data2 and Data3 as numbers, then Data4's bytes) and
    // age, lowercase hex: the key symbol servers and Breakpad use. Empty
    // when the image has no RSDS record.
    std::string build_id;
    // An RSDS record that names no PDB file: what mingw-w64's ld writes
    // with --build-id.
    bool unnamed_pdb = false;
  };
  CodeView CodeViewRecord() const;

  // The sections holding code, by RVA.
  std::vector<NameTable::Range> CodeRanges() const;

  // Appends the named exports that are code (not forwarders, not data).
  void Exports(std::vector<NameTable::Entry>* out) const;

  // Appends the functions of the COFF symbol table (external and static;
  // what mingw-w64's ld keeps unless stripped). A file's only: the loader
  // does not map the table.
  void CoffFunctions(std::vector<NameTable::Entry>* out) const;

  // A section of a file image: where its contents lie in the file.
  struct FileSection {
    uint64_t offset = 0;
    uint64_t size = 0;
  };
  // The section named `name` of a file image; false when there is none.
  // Names longer than 8 characters (mingw-w64's ".debug_line_str") are
  // stored as "/N", N the offset of the name in the COFF string table.
  // CheckFileFits made sure the contents lie inside the file.
  bool FindSection(absl::string_view name, FileSection* out) const;

  // Reads `size` bytes at `offset` of a file image (or of a mapped one).
  bool ReadAt(uint64_t offset, void* out, size_t size) const {
    return ReadRaw(offset, out, size);
  }

  // Whether `other` is the same build of the image (the file a loaded
  // module came from, not one replaced on disk since).
  bool SameBuildAs(const PeImage& other) const {
    return timestamp_ == other.timestamp_ && checksum_ == other.checksum_ &&
           size_of_image_ == other.size_of_image_ &&
           CodeViewRecord().build_id == other.CodeViewRecord().build_id;
  }

 private:
  PeImage() = default;

  static bool InRanges(const std::vector<NameTable::Range>& ranges,
                       uint64_t rva) {
    for (const NameTable::Range& r : ranges) {
      if (rva >= r.start && rva < r.limit) return true;
    }
    return false;
  }

  // Reads at an offset in the file, or in the mapped image.
  bool ReadRaw(uint64_t offset, void* out, size_t size) const;

  bool ReadString(uint64_t rva, std::string* out) const;

  const IMAGE_DATA_DIRECTORY& Directory(int index) const {
    static const IMAGE_DATA_DIRECTORY kNone{};
    return static_cast<uint32_t>(index) < directory_count_ ? directories_[index]
                                                           : kNone;
  }

  absl::Status ParseHeaders(const std::string& name);

  // What DbgHelp will read of a file: section contents and the COFF symbol
  // table with its string table (which holds the names of mingw's
  // .debug_* sections) must lie inside it.
  absl::Status CheckFileFits(const std::string& path) const;

  // A section's name, "/N" names looked up in the COFF string table (a
  // file's only); "" when it cannot be read.
  std::string FullSectionName(const IMAGE_SECTION_HEADER& s) const;

  static std::string SectionName(const IMAGE_SECTION_HEADER& s);

  uint64_t memory_base_ = 0;  // in memory: where the image is mapped
  HANDLE file_ = nullptr;     // in a file: the open file
  uint64_t limit_ = 0;        // the file's size, or SizeOfImage
  uint64_t image_base_ = 0;
  uint32_t timestamp_ = 0;
  uint32_t checksum_ = 0;
  uint32_t size_of_image_ = 0;
  uint32_t size_of_headers_ = 0;
  uint32_t symbol_table_ = 0;
  uint32_t symbol_count_ = 0;
  uint32_t directory_count_ = 0;
  IMAGE_DATA_DIRECTORY directories_[IMAGE_NUMBEROF_DIRECTORY_ENTRIES] = {};
  std::vector<IMAGE_SECTION_HEADER> sections_;
};

}  // namespace inprof::internal

#endif  // INPROF_SRC_SYMBOLIZE_PE_IMAGE_WINDOWS_H_
