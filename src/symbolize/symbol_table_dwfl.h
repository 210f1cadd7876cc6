// src/symbolize/symbol_table_dwfl.h: a module's symbols by address, the
// index ElfSymbols (elf_symbols_dwfl.cc) looks an address's function up in.
#ifndef INPROF_SRC_SYMBOLIZE_SYMBOL_TABLE_DWFL_H_
#define INPROF_SRC_SYMBOLIZE_SYMBOL_TABLE_DWFL_H_

#include <elfutils/libdwfl.h>
#include <gelf.h>
#include <libelf.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace inprof::internal {

// The module's symbols (.symtab, else .dynsym, plus a MiniDebugInfo table)
// sorted by address, for the symbol "closest" to an address as
// dwfl_module_addrinfo() defines it: the nearest symbol at or below it whose
// st_size covers it, global binding preferred; failing that, the nearest
// sizeless one (assembly labels) in the same section that no sized symbol
// overlaps. dwfl_module_addrinfo() scans the whole table on each call (tens
// of microseconds per address in a large program).
class SymbolTable {
 public:
  explicit SymbolTable(Dwfl_Module* mod) : mod_(mod) {
    const int count = dwfl_module_getsymtab(mod);
    symtab_count_ = count > 0 ? count : 0;
    // Room for every symbol at once: a large table grown by doubling costs
    // its copies and fresh pages each time (on the export's critical path).
    if (count > 0) entries_.reserve(static_cast<size_t>(count) + 64);
    for (int i = 0; i < count; ++i) {
      GElf_Sym sym;
      GElf_Addr value = 0;
      GElf_Word shndx = 0;
      Elf* elf = nullptr;
      Dwarf_Addr bias = 0;
      const char* name =
          dwfl_module_getsym_info(mod, i, &sym, &value, &shndx, &elf, &bias);
      const int type = GELF_ST_TYPE(sym.st_info);
      if (name == nullptr || name[0] == '\0' || sym.st_shndx == SHN_UNDEF ||
          type == STT_SECTION || type == STT_FILE || type == STT_TLS) {
        continue;
      }
      Entry e;
      e.start = value;
      e.size = Clamp32(sym.st_size);
      if (e.size != 0) {
        e.extent = e.size;
      } else if (const uint64_t end =
                     SectionEnd(elf, shndx, value, sym.st_value);
                 end > value) {
        e.extent = Clamp32(end - value);
      }
      e.type = static_cast<uint8_t>(type);
      e.binding = static_cast<uint8_t>(BindingRank(GELF_ST_BIND(sym.st_info)));
      e.order = static_cast<uint32_t>(i);
      entries_.push_back(e);
    }
    AddPltEntries(mod);
    std::sort(entries_.begin(), entries_.end(),
              [](const Entry& a, const Entry& b) {
                return a.start != b.start ? a.start < b.start
                                          : a.order < b.order;
              });
    // reach_[i]: the furthest any symbol in entries_[0..i] extends (sizeless
    // ones count as their own address), for stopping backward scans.
    reach_.resize(entries_.size());
    uint64_t reach = 0;
    for (size_t i = 0; i < entries_.size(); ++i) {
      reach = std::max(reach, entries_[i].start + entries_[i].size);
      reach_[i] = reach;
    }
  }

  // The symbol's name and type (STT_*), or nullptr.
  const char* Find(uint64_t addr, int* type) const {
    auto it = std::upper_bound(
        entries_.begin(), entries_.end(), addr,
        [](uint64_t a, const Entry& e) { return a < e.start; });
    if (it == entries_.begin()) return nullptr;
    const size_t last = static_cast<size_t>(it - entries_.begin()) - 1;
    // Any symbol at or below addr ending past a sizeless one hides it.
    const uint64_t min_label = reach_[last];
    const Entry* sized = nullptr;
    const Entry* sizeless = nullptr;
    for (size_t i = last + 1; i-- > 0;) {
      if (reach_[i] <= addr) break;  // nothing at or before i reaches addr
      const Entry& e = entries_[i];
      if (sized != nullptr && e.start < sized->start) break;
      if (e.size != 0 && addr - e.start < e.size) {
        if (sized == nullptr || Better(e, *sized)) sized = &e;
      }
    }
    if (sized == nullptr) {
      for (size_t i = last + 1; i-- > 0;) {
        const Entry& e = entries_[i];
        if (e.start < min_label) break;
        if (sizeless != nullptr && e.start < sizeless->start) break;
        if (e.size == 0 && addr - e.start < e.extent &&
            (sizeless == nullptr || e.binding > sizeless->binding ||
             (e.binding == sizeless->binding && e.order < sizeless->order))) {
          sizeless = &e;
        }
      }
    }
    const Entry* best = sized != nullptr ? sized : sizeless;
    if (best == nullptr) return nullptr;
    *type = best->type;
    return NameOf(*best);
  }

 private:
  // 24 bytes: a system library's table holds 10,000 of them (libc with its
  // debug file), built at the last export of every short run, where the
  // fresh pages and the sort cost more than reading the symbols. The name
  // is read back from the module's table for the one symbol a lookup
  // returns.
  struct Entry {
    uint64_t start = 0;
    uint32_t size = 0;    // st_size; 0: a sizeless label
    uint32_t extent = 0;  // sized: size; sizeless: to its section's end
    uint32_t order = 0;   // index in the module's table; PLT stubs after it
    uint8_t type = 0;     // STT_*
    uint8_t binding = 0;  // higher is preferred
  };
  static_assert(sizeof(Entry) == 24);

  static uint32_t Clamp32(uint64_t v) {
    return v > UINT32_MAX ? UINT32_MAX : static_cast<uint32_t>(v);
  }

  // libelf's string for a symbol of the table (stable while the module is
  // open), or the PLT stub's own name.
  const char* NameOf(const Entry& e) const {
    if (e.order >= symtab_count_) {
      return plt_names_[e.order - symtab_count_].c_str();
    }
    GElf_Sym sym;
    GElf_Addr value = 0;
    GElf_Word shndx = 0;
    Elf* elf = nullptr;
    Dwarf_Addr bias = 0;
    return dwfl_module_getsym_info(mod_, static_cast<int>(e.order), &sym,
                                   &value, &shndx, &elf, &bias);
  }

  // PLT stubs have no symbols of their own; name them "<function>@plt" as
  // objdump and perf do. Entry i of .rela.plt (a JUMP_SLOT relocation naming
  // a .dynsym symbol) is the stub at .plt.sec + 16 i when the object has
  // that section (IBT builds), else .plt + 16 (i + 1) (.plt's first entry
  // calls the resolver). Lazily bound or not, the stubs are where they are.
  void AddPltEntries(Dwfl_Module* mod) {
    Dwarf_Addr bias = 0;
    Elf* elf = dwfl_module_getelf(mod, &bias);
    if (elf == nullptr) return;
    size_t shstrndx = 0;
    if (elf_getshdrstrndx(elf, &shstrndx) != 0) return;
    Elf_Scn* rela = nullptr;
    GElf_Shdr rela_hdr{}, plt_hdr{}, plt_sec_hdr{};
    bool have_plt = false, have_plt_sec = false;
    for (Elf_Scn* scn = elf_nextscn(elf, nullptr); scn != nullptr;
         scn = elf_nextscn(elf, scn)) {
      GElf_Shdr hdr;
      if (gelf_getshdr(scn, &hdr) == nullptr) continue;
      const char* name = elf_strptr(elf, shstrndx, hdr.sh_name);
      if (name == nullptr) continue;
      if (std::strcmp(name, ".rela.plt") == 0 && hdr.sh_type == SHT_RELA) {
        rela = scn;
        rela_hdr = hdr;
      } else if (std::strcmp(name, ".plt") == 0) {
        plt_hdr = hdr;
        have_plt = true;
      } else if (std::strcmp(name, ".plt.sec") == 0) {
        plt_sec_hdr = hdr;
        have_plt_sec = true;
      }
    }
    if (rela == nullptr || (!have_plt && !have_plt_sec)) return;
    Elf_Scn* dynsym = elf_getscn(elf, rela_hdr.sh_link);
    GElf_Shdr dynsym_hdr;
    Elf_Data* rela_data = elf_getdata(rela, nullptr);
    Elf_Data* sym_data = dynsym != nullptr ? elf_getdata(dynsym, nullptr) : nullptr;
    if (rela_data == nullptr || sym_data == nullptr ||
        gelf_getshdr(dynsym, &dynsym_hdr) == nullptr ||
        rela_hdr.sh_entsize == 0) {
      return;
    }
    constexpr uint64_t kStub = 16;
    const uint64_t base =
        have_plt_sec ? plt_sec_hdr.sh_addr : plt_hdr.sh_addr + kStub;
    const uint64_t limit = have_plt_sec ? plt_sec_hdr.sh_addr + plt_sec_hdr.sh_size
                                        : plt_hdr.sh_addr + plt_hdr.sh_size;
    const size_t n = rela_hdr.sh_size / rela_hdr.sh_entsize;
    for (size_t i = 0; i < n; ++i) {
      GElf_Rela r;
      if (gelf_getrela(rela_data, static_cast<int>(i), &r) == nullptr) break;
      const uint64_t start = base + kStub * i;
      if (start + kStub > limit) break;
      if (GELF_R_TYPE(r.r_info) != R_X86_64_JUMP_SLOT) continue;
      GElf_Sym sym;
      if (gelf_getsym(sym_data, static_cast<int>(GELF_R_SYM(r.r_info)), &sym) ==
          nullptr) {
        continue;
      }
      const char* name = elf_strptr(elf, dynsym_hdr.sh_link, sym.st_name);
      if (name == nullptr || name[0] == '\0') continue;
      Entry e;
      e.start = start + bias;
      e.size = kStub;
      e.extent = kStub;
      e.type = STT_FUNC;
      e.binding = static_cast<uint8_t>(BindingRank(STB_LOCAL));
      e.order = symtab_count_ + static_cast<uint32_t>(plt_names_.size());
      plt_names_.push_back(absl::StrCat(name, "@plt"));
      entries_.push_back(e);
    }
  }

  static int BindingRank(int bind) {
    switch (bind) {
      case STB_GLOBAL:
        return 3;
      case STB_WEAK:
        return 2;
      case STB_LOCAL:
        return 1;
      default:
        return 0;
    }
  }

  // Between two sized symbols at the same address that both cover it: the
  // global one, then the smaller, then the first in the table.
  static bool Better(const Entry& a, const Entry& b) {
    if (a.binding != b.binding) return a.binding > b.binding;
    if (a.size != b.size) return a.size < b.size;
    return a.order < b.order;
  }

  // End of the section holding a sizeless symbol, in the symbol's adjusted
  // address space; absolute symbols cover only their own address.
  static uint64_t SectionEnd(Elf* elf, GElf_Word shndx, uint64_t value,
                             uint64_t st_value) {
    if (shndx == SHN_UNDEF || shndx >= SHN_LORESERVE || elf == nullptr) {
      return value + 1;
    }
    GElf_Shdr shdr;
    Elf_Scn* scn = elf_getscn(elf, shndx);
    if (scn == nullptr || gelf_getshdr(scn, &shdr) == nullptr ||
        st_value < shdr.sh_addr) {
      return value + 1;
    }
    return value + (shdr.sh_addr + shdr.sh_size - st_value);
  }

  Dwfl_Module* mod_;
  uint32_t symtab_count_ = 0;
  std::vector<std::string> plt_names_;  // "<function>@plt", by order
  std::vector<Entry> entries_;  // by address, then table order
  std::vector<uint64_t> reach_;
};

}  // namespace inprof::internal

#endif  // INPROF_SRC_SYMBOLIZE_SYMBOL_TABLE_DWFL_H_
