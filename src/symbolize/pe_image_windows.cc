// src/symbolize/pe_image_windows.cc: see pe_image_windows.h.
#include "src/symbolize/pe_image_windows.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "src/symbolize/win32_text_windows.h"

namespace inprof::internal {

absl::StatusOr<PeImage> PeImage::InMemory(uint64_t base, uint64_t size,
                                        const std::string& name) {
  PeImage image;
  image.memory_base_ = base;
  image.limit_ = size;
  absl::Status status = image.ParseHeaders(name);
  if (!status.ok()) return status;
  return image;
}

absl::StatusOr<PeImage> PeImage::OfFile(HANDLE file, const std::string& path) {
  PeImage image;
  image.file_ = file;
  LARGE_INTEGER size;
  if (!GetFileSizeEx(file, &size)) {
    return CannotRead(path, WinError(GetLastError()));
  }
  image.limit_ = static_cast<uint64_t>(size.QuadPart);
  absl::Status status = image.ParseHeaders(path);
  if (!status.ok()) return status;
  status = image.CheckFileFits(path);
  if (!status.ok()) return status;
  return image;
}

bool PeImage::Read(uint64_t rva, void* out, size_t size) const {
  if (file_ == nullptr) return ReadRaw(rva, out, size);
  if (rva + size <= size_of_headers_) return ReadRaw(rva, out, size);
  for (const IMAGE_SECTION_HEADER& s : sections_) {
    const uint64_t va = s.VirtualAddress;
    if (rva >= va && rva - va + size <= s.SizeOfRawData) {
      return ReadRaw(uint64_t{s.PointerToRawData} + (rva - va), out, size);
    }
  }
  return false;
}

PeImage::CodeView PeImage::CodeViewRecord() const {
  const IMAGE_DATA_DIRECTORY& dir = Directory(IMAGE_DIRECTORY_ENTRY_DEBUG);
  const size_t count =
      std::min<size_t>(dir.Size / sizeof(IMAGE_DEBUG_DIRECTORY), 64);
  for (size_t i = 0; i < count; ++i) {
    IMAGE_DEBUG_DIRECTORY entry;
    if (!Read(uint64_t{dir.VirtualAddress} + i * sizeof entry, &entry,
              sizeof entry)) {
      break;
    }
    if (entry.Type != IMAGE_DEBUG_TYPE_CODEVIEW || entry.SizeOfData < 24) {
      continue;
    }
    struct {
      char signature[4];
      uint32_t data1;
      uint16_t data2;
      uint16_t data3;
      uint8_t data4[8];
      uint32_t age;
      char pdb_name_start;
    } rsds;
    static_assert(offsetof(decltype(rsds), pdb_name_start) == 24);
    const size_t want = std::min<size_t>(entry.SizeOfData, 25);
    std::memset(&rsds, 0, sizeof rsds);
    const bool read =
        (file_ != nullptr && entry.PointerToRawData != 0)
            ? ReadRaw(entry.PointerToRawData, &rsds, want)
            : entry.AddressOfRawData != 0 &&
                  Read(entry.AddressOfRawData, &rsds, want);
    if (!read || std::memcmp(rsds.signature, "RSDS", 4) != 0) continue;
    CodeView cv;
    cv.build_id =
        absl::StrFormat("%08x%04x%04x", rsds.data1, rsds.data2, rsds.data3);
    for (uint8_t b : rsds.data4) absl::StrAppendFormat(&cv.build_id, "%02x", b);
    absl::StrAppendFormat(&cv.build_id, "%x", rsds.age);
    cv.unnamed_pdb = rsds.pdb_name_start == '\0';
    return cv;
  }
  return {};
}

std::vector<NameTable::Range> PeImage::CodeRanges() const {
  std::vector<NameTable::Range> code;
  for (const IMAGE_SECTION_HEADER& s : sections_) {
    if ((s.Characteristics & (IMAGE_SCN_MEM_EXECUTE | IMAGE_SCN_CNT_CODE)) ==
        0) {
      continue;
    }
    const uint64_t size =
        s.Misc.VirtualSize != 0 ? s.Misc.VirtualSize : s.SizeOfRawData;
    const uint64_t limit =
        std::min<uint64_t>(uint64_t{s.VirtualAddress} + size, UINT32_MAX);
    if (limit > s.VirtualAddress) {
      code.push_back({s.VirtualAddress, static_cast<uint32_t>(limit)});
    }
  }
  return code;
}

void PeImage::Exports(std::vector<NameTable::Entry>* out) const {
  const std::vector<NameTable::Range> code = CodeRanges();
  const IMAGE_DATA_DIRECTORY& dir = Directory(IMAGE_DIRECTORY_ENTRY_EXPORT);
  IMAGE_EXPORT_DIRECTORY exports;
  if (dir.VirtualAddress == 0 || dir.Size < sizeof exports ||
      code.empty() || !Read(dir.VirtualAddress, &exports, sizeof exports)) {
    return;
  }
  constexpr uint32_t kMaxExports = 1u << 20;
  const uint32_t functions = exports.NumberOfFunctions;
  const uint32_t names = exports.NumberOfNames;
  if (functions > kMaxExports || names > kMaxExports) return;
  std::vector<uint32_t> function_rvas(functions);
  std::vector<uint32_t> name_rvas(names);
  std::vector<uint16_t> ordinals(names);
  if (!Read(exports.AddressOfFunctions, function_rvas.data(),
            functions * sizeof(uint32_t)) ||
      !Read(exports.AddressOfNames, name_rvas.data(),
            names * sizeof(uint32_t)) ||
      !Read(exports.AddressOfNameOrdinals, ordinals.data(),
            names * sizeof(uint16_t))) {
    return;
  }
  // The names normally lie inside the export directory: read it once.
  std::string blob;
  if (dir.Size <= (64u << 20)) {
    blob.resize(dir.Size);
    if (!Read(dir.VirtualAddress, blob.data(), blob.size())) blob.clear();
  }
  const uint64_t dir_start = dir.VirtualAddress;
  const uint64_t dir_limit = dir_start + dir.Size;
  for (uint32_t i = 0; i < names; ++i) {
    if (ordinals[i] >= functions) continue;
    const uint32_t rva = function_rvas[ordinals[i]];
    if (rva >= dir_start && rva < dir_limit) continue;  // a forwarder
    if (!InRanges(code, rva)) continue;
    std::string name;
    const uint64_t name_rva = name_rvas[i];
    if (!blob.empty() && name_rva >= dir_start && name_rva < dir_limit) {
      const size_t pos = name_rva - dir_start;
      const size_t end = blob.find('\0', pos);
      if (end == std::string::npos) continue;
      name = blob.substr(pos, end - pos);
    } else if (!ReadString(name_rva, &name)) {
      continue;
    }
    if (!name.empty()) out->push_back({rva, 0, std::move(name)});
  }
}

void PeImage::CoffFunctions(std::vector<NameTable::Entry>* out) const {
  constexpr size_t kSymbolSize = 18;  // IMAGE_SIZEOF_SYMBOL
  constexpr uint64_t kMaxTable = uint64_t{256} << 20;
  if (file_ == nullptr || symbol_table_ == 0 || symbol_count_ == 0) return;
  const uint64_t table_size = uint64_t{symbol_count_} * kSymbolSize;
  uint32_t strings_size = 0;
  if (table_size > kMaxTable ||
      !ReadRaw(symbol_table_ + table_size, &strings_size,
               sizeof strings_size) ||
      strings_size > kMaxTable) {
    return;
  }
  std::string table(table_size, '\0');
  std::string strings(std::max<uint32_t>(strings_size, 4), '\0');
  if (!ReadRaw(symbol_table_, table.data(), table.size()) ||
      !ReadRaw(symbol_table_ + table_size, strings.data(), strings_size)) {
    return;
  }
  const std::vector<NameTable::Range> code = CodeRanges();
  for (uint64_t i = 0; i < symbol_count_; ++i) {
    const char* p = table.data() + i * kSymbolSize;
    uint32_t value;
    int16_t section;
    uint16_t type;
    uint8_t storage_class, aux;
    std::memcpy(&value, p + 8, 4);
    std::memcpy(&section, p + 12, 2);
    std::memcpy(&type, p + 14, 2);
    storage_class = static_cast<uint8_t>(p[16]);
    aux = static_cast<uint8_t>(p[17]);
    const bool function = (type & 0xf0) == (IMAGE_SYM_DTYPE_FUNCTION << 4);
    if (function && section > 0 &&
        static_cast<size_t>(section) <= sections_.size() &&
        (storage_class == IMAGE_SYM_CLASS_EXTERNAL ||
         storage_class == IMAGE_SYM_CLASS_STATIC)) {
      const uint64_t rva =
          uint64_t{sections_[section - 1].VirtualAddress} + value;
      std::string name;
      uint32_t zeroes;
      std::memcpy(&zeroes, p, 4);
      if (zeroes != 0) {
        name.assign(p, strnlen(p, 8));
      } else {
        uint32_t offset;
        std::memcpy(&offset, p + 4, 4);
        if (offset >= 4 && offset < strings_size) {
          name.assign(strings.data() + offset,
                      strnlen(strings.data() + offset, strings_size - offset));
        }
      }
      if (!name.empty() && rva <= UINT32_MAX && InRanges(code, rva)) {
        out->push_back({static_cast<uint32_t>(rva), 1, std::move(name)});
      }
    }
    i += aux;  // auxiliary records follow their symbol
  }
}

bool PeImage::FindSection(absl::string_view name, FileSection* out) const {
  if (file_ == nullptr) return false;
  for (const IMAGE_SECTION_HEADER& s : sections_) {
    if (FullSectionName(s) != name) continue;
    // VirtualSize is the exact size; SizeOfRawData is rounded up to the
    // file alignment (and smaller when the tail is uninitialized).
    const uint64_t raw = s.SizeOfRawData;
    const uint64_t virtual_size = s.Misc.VirtualSize;
    out->offset = s.PointerToRawData;
    out->size = virtual_size != 0 ? std::min(virtual_size, raw) : raw;
    return true;
  }
  return false;
}

bool PeImage::ReadRaw(uint64_t offset, void* out, size_t size) const {
  if (offset > limit_ || size > limit_ - offset) return false;
  if (size == 0) return true;
  if (file_ == nullptr) {
    SIZE_T n = 0;
    return ReadProcessMemory(
               GetCurrentProcess(),
               reinterpret_cast<const void*>(memory_base_ + offset), out,
               size, &n) &&
           n == size;
  }
  auto* p = static_cast<char*>(out);
  while (size > 0) {
    OVERLAPPED at{};
    at.Offset = static_cast<DWORD>(offset);
    at.OffsetHigh = static_cast<DWORD>(offset >> 32);
    const DWORD chunk = static_cast<DWORD>(std::min<size_t>(size, 1u << 30));
    DWORD n = 0;
    if (!ReadFile(file_, p, chunk, &n, &at) || n == 0) return false;
    p += n;
    offset += n;
    size -= n;
  }
  return true;
}

bool PeImage::ReadString(uint64_t rva, std::string* out) const {
  out->clear();
  char chunk[64];
  while (out->size() < 4096) {
    // Near the end of a section a whole chunk may not be readable.
    size_t n = sizeof chunk;
    while (n > 0 && !Read(rva + out->size(), chunk, n)) n /= 2;
    if (n == 0) return false;
    const size_t len = strnlen(chunk, n);
    out->append(chunk, len);
    if (len < n) return true;
  }
  return false;
}

absl::Status PeImage::ParseHeaders(const std::string& name) {
  auto truncated = [&](absl::string_view what, uint64_t offset) {
    return CannotRead(
        name, absl::StrFormat("truncated or corrupt: %s at offset %u "
                              "exceeds the %s size %u",
                              what, offset, file_ ? "file" : "image",
                              limit_));
  };
  IMAGE_DOS_HEADER dos;
  if (!ReadRaw(0, &dos, sizeof dos)) {
    return CannotRead(name, absl::StrFormat("not a PE image (%u bytes, "
                                            "shorter than a DOS header)",
                                            limit_));
  }
  if (dos.e_magic != IMAGE_DOS_SIGNATURE) {
    return CannotRead(name, "not a PE image (no MZ signature)");
  }
  const uint64_t nt = static_cast<uint32_t>(dos.e_lfanew);
  DWORD signature = 0;
  IMAGE_FILE_HEADER header;
  if (!ReadRaw(nt, &signature, sizeof signature) ||
      !ReadRaw(nt + 4, &header, sizeof header)) {
    return truncated("the PE header", nt);
  }
  if (signature != IMAGE_NT_SIGNATURE) {
    return CannotRead(
        name, absl::StrFormat("not a PE image (no PE signature at offset %u)",
                              nt));
  }
  const uint64_t optional = nt + 4 + sizeof header;
  WORD magic = 0;
  if (!ReadRaw(optional, &magic, sizeof magic)) {
    return truncated("the optional header", optional);
  }
  // What is read of the optional header is the same in PE32 and PE32+
  // (IMAGE_OPTIONAL_HEADER32/64); its offsets and ImageBase's width differ.
  size_t directories_offset = 0;
  auto read_optional = [&](auto header_type) -> absl::Status {
    using H = typename decltype(header_type)::type;
    H h{};
    directories_offset = offsetof(H, DataDirectory);
    if (header.SizeOfOptionalHeader < directories_offset) {
      return CannotRead(name, "corrupt PE header (optional header too small)");
    }
    if (!ReadRaw(optional, &h, directories_offset)) {
      return truncated("the optional header", optional);
    }
    image_base_ = h.ImageBase;
    checksum_ = h.CheckSum;
    size_of_image_ = h.SizeOfImage;
    size_of_headers_ = h.SizeOfHeaders;
    directory_count_ = h.NumberOfRvaAndSizes;
    return absl::OkStatus();
  };
  absl::Status optional_read;
  if (magic == IMAGE_NT_OPTIONAL_HDR64_MAGIC) {
    optional_read = read_optional(std::type_identity<IMAGE_OPTIONAL_HEADER64>{});
  } else if (magic == IMAGE_NT_OPTIONAL_HDR32_MAGIC) {
    optional_read = read_optional(std::type_identity<IMAGE_OPTIONAL_HEADER32>{});
  } else {
    return CannotRead(
        name, absl::StrFormat("not a PE image (optional header magic %#x)",
                              magic));
  }
  if (!optional_read.ok()) return optional_read;
  if (size_of_image_ == 0) {
    return CannotRead(name, "corrupt PE header (SizeOfImage is 0)");
  }
  directory_count_ = std::min<uint32_t>(
      {directory_count_, IMAGE_NUMBEROF_DIRECTORY_ENTRIES,
       static_cast<uint32_t>((header.SizeOfOptionalHeader -
                              directories_offset) /
                             sizeof(IMAGE_DATA_DIRECTORY))});
  if (!ReadRaw(optional + directories_offset, directories_,
               directory_count_ * sizeof(IMAGE_DATA_DIRECTORY))) {
    return truncated("the data directories", optional + directories_offset);
  }
  const uint64_t section_table = optional + header.SizeOfOptionalHeader;
  sections_.resize(header.NumberOfSections);
  if (!ReadRaw(section_table, sections_.data(),
               sections_.size() * sizeof(IMAGE_SECTION_HEADER))) {
    return CannotRead(
        name, absl::StrFormat("truncated or corrupt: %u section headers at "
                              "offset %u exceed the %s size %u",
                              header.NumberOfSections, section_table,
                              file_ ? "file" : "image", limit_));
  }
  timestamp_ = header.TimeDateStamp;
  symbol_table_ = header.PointerToSymbolTable;
  symbol_count_ = header.NumberOfSymbols;
  return absl::OkStatus();
}

absl::Status PeImage::CheckFileFits(const std::string& path) const {
  for (size_t i = 0; i < sections_.size(); ++i) {
    const IMAGE_SECTION_HEADER& s = sections_[i];
    const uint64_t end = uint64_t{s.PointerToRawData} + s.SizeOfRawData;
    if (s.SizeOfRawData != 0 && end > limit_) {
      return CannotRead(
          path,
          absl::StrFormat("truncated or corrupt: section %u (%s) ends at "
                          "offset %u beyond the file size %u",
                          i + 1, SectionName(s), end, limit_));
    }
  }
  if (symbol_table_ != 0 && symbol_count_ != 0) {
    const uint64_t strings = uint64_t{symbol_table_} + 18 * uint64_t{symbol_count_};
    uint32_t strings_size = 0;
    if (!ReadRaw(strings, &strings_size, sizeof strings_size) ||
        strings + strings_size > limit_) {
      return CannotRead(
          path, absl::StrFormat("truncated or corrupt: the COFF symbol "
                                "table at offset %u (%u symbols and their "
                                "names) exceeds the file size %u",
                                symbol_table_, symbol_count_, limit_));
    }
  }
  return absl::OkStatus();
}

std::string PeImage::FullSectionName(const IMAGE_SECTION_HEADER& s) const {
  const char* raw = reinterpret_cast<const char*>(s.Name);
  std::string name(raw, strnlen(raw, IMAGE_SIZEOF_SHORT_NAME));
  if (name.size() < 2 || name[0] != '/') return name;
  uint64_t offset = 0;
  for (size_t i = 1; i < name.size(); ++i) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(name[i]))) return name;
    offset = offset * 10 + static_cast<uint64_t>(name[i] - '0');
  }
  if (file_ == nullptr || symbol_table_ == 0) return "";
  const uint64_t strings =
      uint64_t{symbol_table_} + 18 * uint64_t{symbol_count_};
  uint32_t strings_size = 0;
  if (!ReadRaw(strings, &strings_size, sizeof strings_size) || offset < 4 ||
      offset >= strings_size) {
    return "";
  }
  // Long enough for every name this file looks for.
  char buf[64];
  const size_t n = std::min<uint64_t>(sizeof buf, strings_size - offset);
  if (!ReadRaw(strings + offset, buf, n)) return "";
  return std::string(buf, strnlen(buf, n));
}

std::string PeImage::SectionName(const IMAGE_SECTION_HEADER& s) {
  std::string name(reinterpret_cast<const char*>(s.Name),
                   strnlen(reinterpret_cast<const char*>(s.Name),
                           IMAGE_SIZEOF_SHORT_NAME));
  for (char& c : name) {
    if (!absl::ascii_isprint(static_cast<unsigned char>(c))) c = '?';
  }
  return name;
}

}  // namespace inprof::internal
