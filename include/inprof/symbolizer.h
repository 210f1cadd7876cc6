// inprof/symbolizer.h: turns addresses into modules, functions and lines.
//
// Defines the process's module map (every loaded ELF object, with its
// executable segments and GNU build-id) and a Symbolizer that resolves
// addresses against it with elfutils' libdwfl: .symtab names (static
// functions included), demangled C++ names, file:line and inlined frames.
// Results are cached per address across exports, up to a byte cap. Per
// module, the first lookup also builds a sorted symbol table and, per
// compilation unit touched, an index of functions and inlined instances;
// those stay while the module is loaded (bounded by its size: ~4 MiB for
// all CUs of an 8 MiB test binary with full debug info).
//
// Separate debug info is found offline only, in the debug-info path (default
// ":.debug:/usr/lib/debug", libdwfl's): /usr/lib/debug/.build-id/xx/yyyy.debug
// by GNU build-id, then the file that .gnu_debuglink names, next to the
// module, in its .debug/ subdirectory or under /usr/lib/debug/<its dir>/. A
// candidate is used only when its build-id (or, without one, the debuglink
// CRC) matches. debuginfod is never consulted, whatever DEBUGINFOD_URLS says:
// libdwfl's standard search would dlopen libdebuginfod and download from the
// network inside the host process.
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

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

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
  // last call (cheap otherwise). Keeps cached results of unchanged modules,
  // unless the cache holds more than max_cached_bytes(): then it is emptied,
  // so that a long-running process's memory stays bounded.
  void Refresh();

  // The modules known after the last Refresh().
  const std::vector<ModuleInfo>& modules() const;

  // Directories searched for separate debug info, in libdwfl's debuginfo_path
  // syntax: ':'-separated; "" is the module's directory, a relative entry a
  // subdirectory of it, an absolute one a root holding .build-id/ and a copy
  // of the module's directory tree. Applies to modules whose debug info is
  // looked for after the call. Default: ":.debug:/usr/lib/debug".
  void SetDebugInfoPath(absl::string_view path);

  // Whether system libraries (paths under /lib/, /usr/lib/, /lib64/,
  // /usr/lib64/) are symbolized with their debug info (file:line, inline
  // frames) or from their symbol tables only. Default true here; a Profiler
  // sets Options::system_debug_info (default false). Applies to modules
  // opened after the call.
  void set_system_debug_info(bool on);

  // Addresses whose results are cached (each Lookup() of a new address adds
  // one; Refresh() drops those of unloaded modules).
  size_t cached_addresses() const;

  // Estimated heap bytes held by the cached results (entries, frames,
  // names). About 1.4 KiB per address in C++ code with inline frames
  // (bench/symbolizer_benchmark), so the default cap keeps ~45,000.
  size_t cached_bytes() const;

  // Cache cap that Refresh() enforces. Within one export the cache may
  // exceed it by that export's new addresses. After a purge, addresses are
  // resolved again (about 10 us each, bench/symbolizer_benchmark).
  static constexpr size_t kDefaultMaxCachedBytes = size_t{64} << 20;
  size_t max_cached_bytes() const;
  void set_max_cached_bytes(size_t max);

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

  // A symbolizer of another process's addresses (the agent's, in library mode):
  // its modules come from /proc/PID/maps, each file opened as the process
  // mapped it (/proc/PID/map_files/; by path only when its device and
  // inode match), and kept open: Refresh() picks up what the process maps
  // later, and once the process is gone its last module map stays and
  // symbolizes on. Needs the right to read the process's maps (same user,
  // or root). The error names /proc/PID/maps.
  static absl::StatusOr<std::unique_ptr<Symbolizer>> ForProcess(pid_t pid,
                                                                bool symbolize = true);

  // Symbolizes addresses of the ELF file at `path`, which need not be loaded:
  // `file_addresses` are virtual addresses as the file's program headers lay
  // it out (a runtime address minus the load bias), looked up exactly (no
  // return-address adjustment). One frame list per address, as in
  // SymbolizedAddress::frames. Fails, naming `path`, when the file cannot be
  // read as an ELF object (missing, truncated, corrupt). For tools and tests.
  static absl::StatusOr<std::vector<std::vector<SourceFrame>>> SymbolizeFile(
      const std::string& path, const std::vector<uint64_t>& file_addresses);

 private:
  Symbolizer(pid_t pid, bool symbolize);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace inprof

#endif  // INPROF_SYMBOLIZER_H_
