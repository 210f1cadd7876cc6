// inprof/symbolizer.h: turns addresses into modules, functions and lines.
//
// Defines the process's module map (every loaded ELF object, with its
// executable segments and GNU build-id) and a Symbolizer that resolves
// addresses against it with elfutils' libdwfl: .symtab names (static
// functions included), demangled C++ names, file:line and inlined frames.
// Results are cached per address across exports.
//
// Thread-safety: not thread-safe; the exporter owns one. Never call it from a
// signal handler (it allocates and reads files).
//
// Example:
//   inprof::Symbolizer symbolizer;
//   symbolizer.Refresh();                       // picks up dlopen'ed modules
//   const auto& loc = symbolizer.Lookup(pc, /*is_return_address=*/true);
//   for (const auto& f : loc.frames) printf("%s %s:%lld\n", ...);
#ifndef INPROF_SYMBOLIZER_H_
#define INPROF_SYMBOLIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace inprof {

// One executable mapping of a loaded module.
struct ModuleInfo {
  std::string path;         // file name as the loader reports it
  std::string build_id;     // GNU build-id, lowercase hex; empty if none
  uint64_t start = 0;       // first address of the executable segment
  uint64_t limit = 0;       // one past its last address
  uint64_t file_offset = 0; // offset in the file that `start` maps
};

// One function frame at an address; inlined callees come before callers.
struct SourceFrame {
  std::string function;     // demangled name; empty when unknown
  std::string system_name;  // symbol as in the object (mangled)
  std::string file;         // source file; empty when unknown
  int64_t line = 0;         // 0 when unknown
};

struct SymbolizedAddress {
  int module = -1;                  // index into modules(); -1: unmapped
  std::vector<SourceFrame> frames;  // empty: no name known (module+offset)
};

class Symbolizer {
 public:
  // With symbolize == false only the module map is read (addresses plus
  // mappings with build-ids, for symbolizing later with go tool pprof).
  explicit Symbolizer(bool symbolize = true);
  ~Symbolizer();
  Symbolizer(const Symbolizer&) = delete;
  Symbolizer& operator=(const Symbolizer&) = delete;

  // Re-reads the module list when modules were loaded or unloaded since the
  // last call (cheap otherwise). Keeps cached results of unchanged modules.
  void Refresh();

  // The modules known after the last Refresh().
  const std::vector<ModuleInfo>& modules() const;

  // Resolves one address. `is_return_address` looks the line up at
  // address - 1 so that it names the call site. Cached. The reference stays
  // valid until the next Refresh() (or destruction).
  const SymbolizedAddress& Lookup(uint64_t address, bool is_return_address);

  // Whether function names / file:line / inline frames were found for the
  // module (for pprof's Mapping.has_* flags).
  struct ModuleCapabilities {
    bool has_functions = false;
    bool has_filenames = false;
    bool has_line_numbers = false;
    bool has_inline_frames = false;
  };
  ModuleCapabilities Capabilities(int module) const;

  // Symbolizes addresses of the ELF file at `path`, which need not be loaded:
  // `file_addresses` are virtual addresses as the file's program headers lay
  // it out (a runtime address minus the load bias), looked up exactly (no
  // return-address adjustment). One frame list per address, as in
  // SymbolizedAddress::frames. Fails, naming `path`, when the file cannot be
  // read as an ELF object (missing, truncated, corrupt). For tools and tests.
  static absl::StatusOr<std::vector<std::vector<SourceFrame>>> SymbolizeFile(
      const std::string& path, const std::vector<uint64_t>& file_addresses);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace inprof

#endif  // INPROF_SYMBOLIZER_H_
