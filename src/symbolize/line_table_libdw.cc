// LineTable::ReadUnit: a unit's line table found through libdw (Linux).
#include <dwarf.h>
#include <elfutils/libdw.h>
#include <gelf.h>
#include <libelf.h>

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "inprof/internal/line_table.h"

namespace inprof::internal {
namespace {

absl::Status Unsupported(absl::string_view what) {
  return absl::UnimplementedError(absl::StrCat(".debug_line: ", what));
}

// The data of section `name` of the ELF file holding `dwarf`'s sections
// (libdw has already decompressed the ones it uses); empty when absent.
std::span<const uint8_t> SectionData(Elf* elf, size_t shstrndx, const char* name) {
  Elf_Scn* scn = nullptr;
  while ((scn = elf_nextscn(elf, scn)) != nullptr) {
    GElf_Shdr shdr;
    if (gelf_getshdr(scn, &shdr) == nullptr) continue;
    const char* n = elf_strptr(elf, shstrndx, shdr.sh_name);
    if (n == nullptr || std::strcmp(n, name) != 0) continue;
    if ((shdr.sh_flags & SHF_COMPRESSED) != 0 || shdr.sh_type == SHT_NOBITS) {
      return {};
    }
    Elf_Data* data = elf_getdata(scn, nullptr);
    if (data == nullptr || data->d_buf == nullptr) return {};
    return {static_cast<const uint8_t*>(data->d_buf), data->d_size};
  }
  return {};
}

}  // namespace

absl::StatusOr<LineTable> LineTable::ReadUnit(Dwarf_Die* cudie) {
  if (cudie == nullptr || cudie->cu == nullptr) return Unsupported("no unit");
  uint8_t unit_type = 0;
  Dwarf_Half version = 0;
  if (dwarf_cu_info(cudie->cu, &version, &unit_type, nullptr, nullptr, nullptr,
                    nullptr, nullptr) != 0) {
    return Unsupported("unit header");
  }
  if (unit_type == DW_UT_split_compile || unit_type == DW_UT_split_type ||
      unit_type == DW_UT_skeleton) {
    return Unsupported("split unit");
  }
  Dwarf_Attribute attr;
  Dwarf_Word stmt_list = 0;
  if (dwarf_attr(cudie, DW_AT_stmt_list, &attr) == nullptr ||
      dwarf_formudata(&attr, &stmt_list) != 0) {
    return Unsupported("no DW_AT_stmt_list");
  }
  const char* comp_dir = dwarf_formstring(dwarf_attr(cudie, DW_AT_comp_dir, &attr));
  uint8_t address_size = 0;
  Dwarf_Die result;
  if (dwarf_diecu(cudie, &result, &address_size, nullptr) == nullptr) {
    return Unsupported("unit header");
  }
  Dwarf* dwarf = dwarf_cu_getdwarf(cudie->cu);
  Elf* elf = dwarf != nullptr ? dwarf_getelf(dwarf) : nullptr;
  size_t shstrndx = 0;
  if (elf == nullptr || elf_getshdrstrndx(elf, &shstrndx) != 0) {
    return Unsupported("no ELF file");
  }
  LineSections sections{.debug_line = SectionData(elf, shstrndx, ".debug_line"),
                        .debug_line_str = SectionData(elf, shstrndx, ".debug_line_str"),
                        .debug_str = SectionData(elf, shstrndx, ".debug_str")};
  if (sections.debug_line.empty()) return Unsupported("no .debug_line");
  return Read(sections, stmt_list, comp_dir, address_size);
}

}  // namespace inprof::internal
