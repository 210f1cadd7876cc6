// src/symbolize/elf_symbols_dwfl.h: one ELF object's symbols and debug
// info for the Linux symbolizer (symbolizer_dwfl.cc): ElfSymbols, whose
// lookups name an address's frames from the symbol table, the line table
// and the inline chain. Its indexes: SymbolTable (symbol_table_dwfl.h) and
// CuScopes (elf_symbols_dwfl.cc's own).
//
// Also the "cannot read symbols of PATH: REASON" error and the hex form of
// a build-id, which the process scan (process_scan_linux.cc) and the
// symbolizer share.
//
// Thread-safety: an ElfSymbols is used by one thread at a time (its
// Symbolizer's, which is not thread-safe); the functions are reentrant.
#ifndef INPROF_SRC_SYMBOLIZE_ELF_SYMBOLS_DWFL_H_
#define INPROF_SRC_SYMBOLIZE_ELF_SYMBOLS_DWFL_H_

#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "inprof/base/growth_safe_table.h"
#include "inprof/internal/line_table.h"
#include "inprof/symbolizer.h"
#include "src/symbolize/debug_files_dwfl.h"

namespace inprof::internal {

// `size` bytes as lowercase hex (how build-ids are kept and compared).
std::string HexBytes(const unsigned char* bytes, size_t size);

// FailedPrecondition: "cannot read symbols of PATH: REASON".
absl::Status CannotRead(const std::string& path, absl::string_view reason);

class SymbolTable;  // a module's symbols by address
class CuScopes;     // a compilation unit's functions and inlined instances

// Symbols and debug info of one ELF object: a Dwfl session with one module
// placed at bias 0.
class ElfSymbols {
 public:
  // Takes ownership of `fd` in all cases. `path` names the object in errors
  // and is where .gnu_debuglink files are looked for; `expected_build_id`
  // (if non-empty) must match the file's, so that a file replaced on disk
  // after loading is not used to name the old code. `callbacks` (from
  // MakeCallbacks) must outlive the session.
  static absl::StatusOr<std::unique_ptr<ElfSymbols>> Open(
      int fd, const std::string& path, const std::string& expected_build_id,
      const Dwfl_Callbacks* callbacks);

  ~ElfSymbols();
  // False: names from the symbol table only; the debug info (and a separate
  // debug file) is never opened.
  void set_use_debug_info(bool on) { use_debug_info_ = on; }
  ElfSymbols(const ElfSymbols&) = delete;
  ElfSymbols& operator=(const ElfSymbols&) = delete;

  using Caps = Symbolizer::ModuleCapabilities;

  // Frames at file virtual address `addr`, innermost first; records in
  // `caps` what kinds of information were found.
  std::vector<SourceFrame> Lookup(uint64_t addr, Caps* caps);

 private:
  explicit ElfSymbols(Dwfl* dwfl);
  bool use_debug_info_ = true;

  // The scope index of `cu`, built on first use.
  CuScopes& ScopesOf(Dwarf_Die* cu);

  // The compilation unit whose address ranges hold `addr` (a Dwfl address),
  // with its bias; null when none does. libdw answers from .debug_aranges,
  // which clang does not write by default (and a GCC program that links
  // clang-built objects has it for its own units only): libdw 0.188 then
  // finds no unit for any address. On libdw's first miss the units'
  // ranges (DW_AT_low_pc/high_pc or DW_AT_ranges) are read once into
  // cu_ranges_ and searched from then on.
  Dwarf_Die* FindUnit(Dwarf_Addr addr, Dwarf_Addr* bias);

  // The line table of `cu`, read on first use by our own reader; null
  // where that reader declined the unit (libdw's dwfl_module_getsrc then
  // answers).
  const internal::LineTable* LinesOf(Dwarf_Die* cu);

  Dwfl* dwfl_;
  Dwfl_Module* mod_ = nullptr;
  SessionFiles files_;  // the module's userdata points here
  std::unique_ptr<SymbolTable> symbols_;  // built on first use
  internal::ThrowSafeMap<Dwarf_Off, std::unique_ptr<internal::LineTable>>
      line_tables_;
  // By CU DIE offset. Dwarf_Dies stay valid while dwfl_ lives.
  internal::ThrowSafeMap<Dwarf_Off, std::unique_ptr<CuScopes>> cu_scopes_;
  // Every unit's address ranges, by start (Dwfl addresses); see FindUnit.
  struct UnitRange {
    Dwarf_Addr start;
    Dwarf_Addr end;  // exclusive
    Dwarf_Die* cu;
    Dwarf_Addr bias;
  };
  std::vector<UnitRange> unit_ranges_;
  bool unit_ranges_read_ = false;
};

}  // namespace inprof::internal

#endif  // INPROF_SRC_SYMBOLIZE_ELF_SYMBOLS_DWFL_H_
