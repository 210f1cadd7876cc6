// src/symbolize/elf_symbols_dwfl.cc: see elf_symbols_dwfl.h.
#include "src/symbolize/elf_symbols_dwfl.h"

#include <cxxabi.h>
#include <dwarf.h>
#include <gelf.h>
#include <libelf.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "inprof/base/owned_fd.h"
#include "src/symbolize/symbol_table_dwfl.h"

namespace inprof::internal {

std::string HexBytes(const unsigned char* bytes, size_t size) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(size * 2);
  for (size_t i = 0; i < size; ++i) {
    out.push_back(kHex[bytes[i] >> 4]);
    out.push_back(kHex[bytes[i] & 0xf]);
  }
  return out;
}

absl::Status CannotRead(const std::string& path, absl::string_view reason) {
  return absl::FailedPreconditionError(
      absl::StrCat("cannot read symbols of ", path, ": ", reason));
}

namespace {

// Demangles an Itanium C++ ABI name; returns the input when it is not one.
std::string Demangle(const char* mangled) {
  if (mangled == nullptr) return "";
  if (mangled[0] != '_' || mangled[1] != 'Z') return mangled;
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  if (status != 0 || demangled == nullptr) {
    std::free(demangled);
    return mangled;
  }
  std::string result(demangled);
  std::free(demangled);
  return result;
}

std::string DwflError() {
  const char* msg = dwfl_errmsg(-1);
  return msg != nullptr ? msg : "unknown libdwfl error";
}

// Checks that the ELF headers, program headers, section headers and section
// contents all lie inside the file. libelf maps what it is given; a
// truncated file otherwise shows up later as missing symbols, or not at all.
absl::Status CheckElfFits(int fd, const std::string& path) {
  struct stat st;
  if (fstat(fd, &st) != 0) {
    return CannotRead(path, absl::StrCat("fstat: ", std::strerror(errno)));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  Elf* elf = elf_begin(fd, ELF_C_READ_MMAP, nullptr);
  if (elf == nullptr) {
    return CannotRead(path,
                      absl::StrCat("not an ELF file (", elf_errmsg(-1), ")"));
  }
  absl::Status status;
  auto fits = [size](uint64_t offset, uint64_t length) {
    return offset <= size && length <= size - offset;
  };
  GElf_Ehdr ehdr;
  size_t shnum = 0;
  if (elf_kind(elf) != ELF_K_ELF) {
    status = CannotRead(path, "not an ELF file (bad magic)");
  } else if (gelf_getehdr(elf, &ehdr) == nullptr) {
    status =
        CannotRead(path, absl::StrCat("bad ELF header (", elf_errmsg(-1), ")"));
  } else if (!fits(ehdr.e_phoff, uint64_t{ehdr.e_phnum} * ehdr.e_phentsize)) {
    status = CannotRead(
        path, absl::StrFormat("truncated or corrupt: program headers at "
                              "offset %u exceed the file size %u",
                              ehdr.e_phoff, size));
  } else if (ehdr.e_shoff != 0 &&
             !fits(ehdr.e_shoff, uint64_t{std::max<uint16_t>(ehdr.e_shnum, 1)} *
                                     ehdr.e_shentsize)) {
    // Checked on the raw header: libelf quietly reports no sections when the
    // table lies beyond the end of the file.
    status = CannotRead(
        path, absl::StrFormat("truncated or corrupt: %u section headers at "
                              "offset %u exceed the file size %u",
                              ehdr.e_shnum, ehdr.e_shoff, size));
  } else if (elf_getshdrnum(elf, &shnum) != 0) {
    status = CannotRead(
        path, absl::StrCat("bad section header count (", elf_errmsg(-1), ")"));
  } else if (shnum > 0 &&
             !fits(ehdr.e_shoff, uint64_t{shnum} * ehdr.e_shentsize)) {
    status = CannotRead(
        path, absl::StrFormat("truncated or corrupt: %u section headers at "
                              "offset %u exceed the file size %u",
                              shnum, ehdr.e_shoff, size));
  } else {
    for (Elf_Scn* scn = elf_nextscn(elf, nullptr); scn != nullptr;
         scn = elf_nextscn(elf, scn)) {
      GElf_Shdr shdr;
      if (gelf_getshdr(scn, &shdr) == nullptr) {
        status = CannotRead(
            path, absl::StrCat("bad section header (", elf_errmsg(-1), ")"));
        break;
      }
      if (shdr.sh_type != SHT_NOBITS && !fits(shdr.sh_offset, shdr.sh_size)) {
        status = CannotRead(
            path, absl::StrFormat("truncated or corrupt: section %u ends at "
                                  "offset %u beyond the file size %u",
                                  elf_ndxscn(scn),
                                  shdr.sh_offset + shdr.sh_size, size));
        break;
      }
    }
  }
  elf_end(elf);
  return status;
}

// Name of a subprogram or inlined-subroutine DIE: the demangled linkage name
// when there is one (qualified, with parameters, like the symbol table's),
// else DW_AT_name. Follows DW_AT_abstract_origin and DW_AT_specification.
void DieName(Dwarf_Die* die, std::string* function, std::string* system_name) {
  Dwarf_Attribute attr;
  const char* linkage = nullptr;
  if (dwarf_attr_integrate(die, DW_AT_linkage_name, &attr) != nullptr ||
      dwarf_attr_integrate(die, DW_AT_MIPS_linkage_name, &attr) != nullptr) {
    linkage = dwarf_formstring(&attr);
  }
  if (linkage != nullptr) {
    *function = Demangle(linkage);
    *system_name = linkage;
    return;
  }
  const char* name = nullptr;
  if (dwarf_attr_integrate(die, DW_AT_name, &attr) != nullptr) {
    name = dwarf_formstring(&attr);
  }
  *function = name != nullptr ? name : "";
  *system_name = *function;
}

// DW_AT_call_file / DW_AT_call_line of an inlined-subroutine DIE.
// `lines`: the unit's line table as our reader read it (its file table is
// the one DW_AT_call_file indexes), or null to ask libdw, whose
// dwarf_getsrcfiles decodes the unit's whole line program for it.
void CallSite(Dwarf_Die* inlined, const internal::LineTable* lines,
              std::string* file, int64_t* line) {
  file->clear();
  *line = 0;
  Dwarf_Attribute attr;
  Dwarf_Word value = 0;
  if (dwarf_attr(inlined, DW_AT_call_line, &attr) != nullptr &&
      dwarf_formudata(&attr, &value) == 0 &&
      value <= static_cast<Dwarf_Word>(std::numeric_limits<int64_t>::max())) {
    *line = static_cast<int64_t>(value);
  }
  if (dwarf_attr(inlined, DW_AT_call_file, &attr) == nullptr ||
      dwarf_formudata(&attr, &value) != 0) {
    return;
  }
  if (lines != nullptr) {
    if (const std::string* name = lines->File(value); name != nullptr) {
      *file = *name;
    }
    return;
  }
  Dwarf_Die cu;
  if (dwarf_diecu(inlined, &cu, nullptr, nullptr) == nullptr) return;
  Dwarf_Files* files = nullptr;
  size_t nfiles = 0;
  if (dwarf_getsrcfiles(&cu, &files, &nfiles) != 0 || value >= nfiles) return;
  const char* name = dwarf_filesrc(files, value, nullptr, nullptr);
  if (name != nullptr) *file = name;
}

}  // namespace

// The functions (DW_TAG_subprogram) and inlined instances
// (DW_TAG_inlined_subroutine) of one compilation unit that have code, with
// their address ranges and nesting. dwarf_getscopes() walks the tree on
// every call, which costs milliseconds per address in the CUs of
// template-heavy C++ (measured with bench/symbolizer_benchmark: 3-4 ms per
// address before this index). The index is built in two steps: the CU's
// functions (one walk of the CU's top levels, not of their bodies), then a
// function's inside (its inlined instances and blocks) the first time an
// address falls in it: an export that names a few addresses in a large CU
// reads the few functions it needs (the last export of a short run spent
// 4 ms reading every function body of one CU).
class CuScopes {
 public:
  explicit CuScopes(Dwarf_Die* cu) {
    Collect(cu, -1, 0, &ranges_, /*expand=*/false);
    SortRanges(&ranges_);
  }

  // Appends the chain at DWARF address `pc`: inlined instances innermost
  // first, then the enclosing function. Empty when no function covers pc.
  void Chain(uint64_t pc, std::vector<Dwarf_Die>* chain) {
    int node = Innermost(ranges_, pc);
    if (node >= 0 && !nodes_[node].inlined) {
      if (!nodes_[node].expanded) Expand(node);
      const int inner = Innermost(inner_[nodes_[node].inner], pc);
      if (inner >= 0) node = inner;
    }
    for (int n = node; n >= 0; n = nodes_[n].parent) {
      chain->push_back(nodes_[n].die);
      if (!nodes_[n].inlined) break;
    }
  }

 private:
  struct Node {
    Dwarf_Die die;
    int parent;        // index into nodes_; -1: none
    bool inlined;      // DW_TAG_inlined_subroutine, else a subprogram
    bool expanded;     // its inside is indexed (in inner_[inner])
    size_t inner;
    size_t first_range;  // [first_range, end_range) in node_ranges_
    size_t end_range;
  };
  struct Range {
    uint64_t low;
    uint64_t high;  // exclusive
    int node;
  };

  // Deeper nesting only comes from corrupt DWARF; stop before the stack
  // does.
  static constexpr int kMaxDepth = 256;

  static void SortRanges(std::vector<Range>* ranges) {
    std::sort(ranges->begin(), ranges->end(),
              [](const Range& a, const Range& b) {
                return a.low != b.low ? a.low < b.low : a.node < b.node;
              });
  }

  bool Covers(int node, uint64_t pc) const {
    for (size_t i = nodes_[node].first_range; i < nodes_[node].end_range;
         ++i) {
      if (node_ranges_[i].low <= pc && pc < node_ranges_[i].high) return true;
    }
    return false;
  }

  // The innermost node of `ranges` (sorted) covering pc, or -1. Ranges nest
  // (a scope's code lies inside its parent's), so it is the last range
  // starting at or before pc or one of that range's ancestors.
  int Innermost(const std::vector<Range>& ranges, uint64_t pc) const {
    auto it = std::upper_bound(
        ranges.begin(), ranges.end(), pc,
        [](uint64_t a, const Range& r) { return a < r.low; });
    // A few ranges back, in case a sibling's range begins inside a scope
    // split into several ranges.
    for (int tries = 0; tries < 8 && it != ranges.begin(); ++tries) {
      --it;
      for (int n = it->node; n >= 0; n = nodes_[n].parent) {
        if (Covers(n, pc)) return n;
      }
    }
    return -1;
  }

  // Indexes the inside of function `node`.
  void Expand(int node) {
    std::vector<Range> inner;
    Dwarf_Die die = nodes_[node].die;  // nodes_ grows below
    Collect(&die, node, 1, &inner, /*expand=*/true);
    SortRanges(&inner);
    nodes_[node].expanded = true;
    nodes_[node].inner = inner_.size();
    inner_.push_back(std::move(inner));
  }

  // Adds the scopes under `parent_die` to nodes_ and their ranges to
  // *ranges; without `expand`, a function's inside is left for Expand().
  void Collect(Dwarf_Die* parent_die, int parent, int depth,
               std::vector<Range>* ranges, bool expand) {
    if (depth > kMaxDepth) return;
    Dwarf_Die child;
    if (dwarf_child(parent_die, &child) != 0) return;
    do {
      const int tag = dwarf_tag(&child);
      int node = parent;
      switch (tag) {
        case DW_TAG_subprogram:
        case DW_TAG_inlined_subroutine: {
          const size_t first = node_ranges_.size();
          Dwarf_Addr base = 0, start = 0, end = 0;
          ptrdiff_t offset = 0;
          while ((offset = dwarf_ranges(&child, offset, &base, &start, &end)) >
                 0) {
            if (start < end) {
              node_ranges_.push_back(
                  {start, end, static_cast<int>(nodes_.size())});
            }
          }
          // Declarations and abstract instances have no code of their own
          // and nothing concrete inside.
          if (node_ranges_.size() == first) continue;
          node = static_cast<int>(nodes_.size());
          nodes_.push_back({child, parent, tag == DW_TAG_inlined_subroutine,
                            expand, 0, first, node_ranges_.size()});
          ranges->insert(ranges->end(), node_ranges_.begin() + first,
                         node_ranges_.end());
          if (!expand) continue;  // its inside: on first use
          break;
        }
        case DW_TAG_lexical_block:
        case DW_TAG_namespace:
        case DW_TAG_module:
        case DW_TAG_class_type:
        case DW_TAG_structure_type:
        case DW_TAG_union_type:
        case DW_TAG_try_block:
        case DW_TAG_catch_block:
          break;  // may hold functions: look inside
        default:
          continue;  // types, variables, parameters: no code inside
      }
      Collect(&child, node, depth + 1, ranges, expand);
    } while (dwarf_siblingof(&child, &child) == 0);
  }

  std::vector<Node> nodes_;
  std::vector<Range> node_ranges_;  // grouped by node
  std::vector<Range> ranges_;       // the CU's functions', sorted by low
  std::vector<std::vector<Range>> inner_;  // an expanded function's inside
};

absl::StatusOr<std::unique_ptr<ElfSymbols>> ElfSymbols::Open(
    int fd, const std::string& path, const std::string& expected_build_id,
    const Dwfl_Callbacks* callbacks) {
  absl::Status fits = CheckElfFits(fd, path);
  if (!fits.ok()) {
    close(fd);
    return fits;
  }
  Dwfl* dwfl = dwfl_begin(callbacks);
  if (dwfl == nullptr) {
    close(fd);
    return CannotRead(path, DwflError());
  }
  auto symbols = std::unique_ptr<ElfSymbols>(new ElfSymbols(dwfl));
  SessionFiles& files = symbols->files_;
  files.debuginfo_path = callbacks->debuginfo_path;
  dwfl_report_begin(dwfl);
  Dwfl_Module* mod = dwfl_report_elf(dwfl, path.c_str(), path.c_str(), fd,
                                     /*base=*/0, /*add_p_vaddr=*/true);
  if (mod == nullptr) {
    close(fd);  // consumed only on success
    return CannotRead(path, DwflError());
  }
  // libdwfl holds `fd` from here on: detached now if it can be (see
  // SessionFiles), else tracked.
  Dwarf_Addr main_bias = 0;
  files.main_elf = dwfl_module_getelf(mod, &main_bias);
  const internal::FdIdentity identity = internal::IdentifyFd(fd);
  if (!Detach(files.main_elf, fd, identity, files)) {
    files.held.push_back({fd, identity, /*debug=*/false});
  }
  if (dwfl_report_end(dwfl, nullptr, nullptr) != 0) {
    return CannotRead(path, DwflError());
  }
  void** userdata = nullptr;
  dwfl_module_info(mod, &userdata, nullptr, nullptr, nullptr, nullptr,
                   nullptr, nullptr);
  if (userdata != nullptr) *userdata = &files;
  symbols->mod_ = mod;
  if (!expected_build_id.empty()) {
    const unsigned char* bits = nullptr;
    GElf_Addr vaddr = 0;
    const int len = dwfl_module_build_id(mod, &bits, &vaddr);
    if (len > 0) {
      std::string on_disk = HexBytes(bits, static_cast<size_t>(len));
      if (on_disk != expected_build_id) {
        return CannotRead(
            path,
            absl::StrCat("build-id on disk ", on_disk,
                         " differs from the loaded one ", expected_build_id,
                         " (file replaced after loading)"));
      }
    }
  }
  return symbols;
}

ElfSymbols::~ElfSymbols() {
  // dwfl_end() closes the descriptors libdwfl still holds: only if each
  // is still inprof's (see SessionFiles).
  for (const SessionFiles::Held& held : files_.held) {
    if (!internal::IsStillOurs(held.fd, held.identity)) {
      internal::NoteDescriptorTaken(
          held.fd, "a module file libdwfl holds; its session is left "
                   "allocated rather than let libdwfl close that number");
      return;
    }
  }
  dwfl_end(dwfl_);
  for (Elf* elf : files_.detached) elf_end(elf);
  if (files_.alt != nullptr) dwarf_end(files_.alt);
  if (files_.alt_elf != nullptr) elf_end(files_.alt_elf);
}

std::vector<SourceFrame> ElfSymbols::Lookup(uint64_t addr, Caps* caps) {
  std::vector<SourceFrame> frames;

  // Out-of-line function: the symbol table (.symtab covers static
  // functions; .dynsym when stripped).
  std::string sym_function, sym_system;
  {
    if (symbols_ == nullptr) {
      symbols_ = std::make_unique<SymbolTable>(mod_);
      // A debug file libdwfl opened for its .symtab: that table's Elf.
      if (!files_.held.empty()) {
        GElf_Sym sym;
        GElf_Addr value = 0;
        GElf_Word shndx = 0;
        Elf* elf = nullptr;
        Dwarf_Addr bias = 0;
        if (dwfl_module_getsymtab(mod_) > 0 &&
            dwfl_module_getsym_info(mod_, 0, &sym, &value, &shndx, &elf,
                                    &bias) != nullptr) {
          SettleDebugFile(files_, elf);
        }
      }
    }
    int type = STT_NOTYPE;
    const char* name = symbols_->Find(addr, &type);
    // Code symbols only: data, section and version symbols (such as the
    // vDSO's "LINUX_2.6" at offset 0) would misname the address.
    if (name != nullptr && name[0] != '\0' &&
        (type == STT_FUNC || type == STT_GNU_IFUNC || type == STT_NOTYPE)) {
      sym_system = name;
      sym_function = Demangle(name);
    }
  }

  Dwarf_Addr cu_bias = 0;
  Dwarf_Die* const cu =
      use_debug_info_ ? FindUnit(addr, &cu_bias) : nullptr;
  // A debug file libdwfl opened for its DWARF (loaded by now): its Elf.
  if (use_debug_info_ && !files_.held.empty()) {
    Dwarf_Addr dw_bias = 0;
    if (Dwarf* dw = dwfl_module_getdwarf(mod_, &dw_bias); dw != nullptr) {
      SettleDebugFile(files_, dwarf_getelf(dw));
    }
  }

  const internal::LineTable* const lines =
      cu != nullptr ? LinesOf(cu) : nullptr;

  // Innermost file:line from the unit's line table.
  std::string line_file;
  int64_t line_number = 0;
  if (cu != nullptr) {
    if (lines != nullptr) {
      const std::string* file = nullptr;
      int lineno = 0;
      if (lines->Find(addr - cu_bias, &file, &lineno)) {
        if (file != nullptr) line_file = *file;
        line_number = lineno > 0 ? lineno : 0;
      }
    } else if (Dwarf_Line* line = dwarf_getsrc_die(cu, addr - cu_bias);
               line != nullptr) {
      // libdw's own reading of the unit found (dwfl_module_getsrc would
      // look the unit up again through .debug_aranges).
      int lineno = 0;
      const char* file = dwarf_linesrc(line, nullptr, nullptr);
      if (file != nullptr) line_file = file;
      if (dwarf_lineno(line, &lineno) == 0 && lineno > 0) line_number = lineno;
    }
  }

  // Chain of inlined subroutines and the enclosing subprogram, innermost
  // first, from the CU's scope index.
  std::vector<Dwarf_Die> chain;
  const bool have_dwarf = cu != nullptr;
  if (cu != nullptr) ScopesOf(cu).Chain(addr - cu_bias, &chain);

  if (chain.empty()) {
    if (!sym_function.empty() || !line_file.empty()) {
      frames.push_back({.function = sym_function,
                        .system_name = sym_system,
                        .file = line_file,
                        .line = line_number});
    }
  } else {
    std::string file = line_file;
    int64_t line = line_number;
    for (size_t i = 0; i < chain.size(); ++i) {
      SourceFrame frame;
      const bool outermost =
          i + 1 == chain.size() && dwarf_tag(&chain[i]) == DW_TAG_subprogram;
      if (outermost && !sym_function.empty()) {
        frame.function = sym_function;
        frame.system_name = sym_system;
      } else {
        DieName(&chain[i], &frame.function, &frame.system_name);
      }
      frame.file = file;
      frame.line = line;
      frames.push_back(std::move(frame));
      if (dwarf_tag(&chain[i]) == DW_TAG_inlined_subroutine) {
        CallSite(&chain[i], lines, &file, &line);
      }
    }
    // No enclosing subprogram DIE (unusual DWARF): the symbol is the caller.
    if (dwarf_tag(&chain.back()) == DW_TAG_inlined_subroutine) {
      frames.push_back({.function = sym_function,
                        .system_name = sym_system,
                        .file = file,
                        .line = line});
    }
  }

  for (const SourceFrame& f : frames) {
    if (!f.function.empty()) caps->has_functions = true;
    if (!f.file.empty()) caps->has_filenames = true;
    if (f.line > 0) caps->has_line_numbers = true;
  }
  // Debug info was read, so the inline chain (possibly of length one) is
  // complete for this address.
  if (have_dwarf) caps->has_inline_frames = true;
  return frames;
}

ElfSymbols::ElfSymbols(Dwfl* dwfl) : dwfl_(dwfl) {}

Dwarf_Die* ElfSymbols::FindUnit(Dwarf_Addr addr, Dwarf_Addr* bias) {
  if (Dwarf_Die* cu = dwfl_module_addrdie(mod_, addr, bias); cu != nullptr) {
    return cu;
  }
  if (!unit_ranges_read_) {
    unit_ranges_read_ = true;
    Dwarf_Addr unit_bias = 0;
    for (Dwarf_Die* cu = dwfl_module_nextcu(mod_, nullptr, &unit_bias);
         cu != nullptr; cu = dwfl_module_nextcu(mod_, cu, &unit_bias)) {
      Dwarf_Addr base = 0, start = 0, end = 0;
      for (ptrdiff_t next = dwarf_ranges(cu, 0, &base, &start, &end); next > 0;
           next = dwarf_ranges(cu, next, &base, &start, &end)) {
        if (start < end) {
          unit_ranges_.push_back({start + unit_bias, end + unit_bias, cu, unit_bias});
        }
      }
    }
    std::sort(unit_ranges_.begin(), unit_ranges_.end(),
              [](const UnitRange& a, const UnitRange& b) { return a.start < b.start; });
  }
  // The last range starting at or below `addr`. Units' ranges do not
  // overlap in a linked object; where they would, this may miss, as
  // libdw's own lookup then does.
  auto after = std::upper_bound(
      unit_ranges_.begin(), unit_ranges_.end(), addr,
      [](Dwarf_Addr a, const UnitRange& r) { return a < r.start; });
  if (after == unit_ranges_.begin()) return nullptr;
  const UnitRange& range = *std::prev(after);
  if (addr >= range.end) return nullptr;
  *bias = range.bias;
  return range.cu;
}

CuScopes& ElfSymbols::ScopesOf(Dwarf_Die* cu) {
  std::unique_ptr<CuScopes>& slot = cu_scopes_[dwarf_dieoffset(cu)];
  if (slot == nullptr) slot = std::make_unique<CuScopes>(cu);
  return *slot;
}

const internal::LineTable* ElfSymbols::LinesOf(Dwarf_Die* cu) {
  auto [it, inserted] = line_tables_.try_emplace(dwarf_dieoffset(cu));
  if (inserted) {
    absl::StatusOr<internal::LineTable> table = internal::LineTable::ReadUnit(cu);
    if (table.ok()) {
      it->second = std::make_unique<internal::LineTable>(*std::move(table));
    }
  }
  return it->second.get();
}

}  // namespace inprof::internal
