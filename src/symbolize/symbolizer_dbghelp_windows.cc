// Symbolizer on DbgHelp, for Windows x64 (cross-built with mingw-w64).
//
// The module map is the loader's list (EnumProcessModules): one module per
// loaded PE image, [base, base + SizeOfImage), file offset 0, its build-id
// the CodeView (RSDS) record's GUID and age as symbol servers spell them.
// Each Symbolizer has DbgHelp sessions of its own under private handle
// values (not GetCurrentProcess(), so that the host's own DbgHelp session
// is left alone) and loads each module into one explicitly, on the first
// lookup in it. Where DbgHelp knows no symbol, the nearest function at or
// below the address in its section, from the module's export table and
// COFF symbol table (read from its file), names it. DbgHelp is not
// thread-safe: every call here holds g_dbghelp_mu, sets our symbol options
// only for that long (they are process-wide), and runs under a guard that
// turns a fault inside DbgHelp (a corrupt file) into an error.
//
// File and line come from the module's own DWARF where its PE file has a
// .debug_line section (what mingw-w64 writes with -g): DbgHelp reads no
// DWARF on Windows, and Wine's faults on large programs that mix DWARF 4
// and 5 units. At the first lookup in a module, every line program is
// decoded (internal::LineTable, the ELF symbolizer's reader) and indexed
// by address; DbgHelp is then asked for no line the tables have. DWARF
// addresses are link-time ones: the file's ImageBase plus the RVA, whatever
// base the module was loaded at. The tables count in cached_bytes() (about
// 4.5 bytes per byte of .debug_line) and go with the cache when Refresh()
// empties it. Names still come from DbgHelp where it works, else from the
// export and COFF symbol tables.
//
// Wine 8's DbgHelp, unlike Windows' (PDBs only), reads mingw-w64's DWARF,
// version 4 only (build with -gdwarf-4); and:
// - it names functions by their scope-qualified DW_AT_name, without
//   parameters ("ns::Class::Method", where libdwfl gives
//   "ns::Class::Method(int)");
// - it ignores the COFF symbol table of an image with DWARF: code built
//   without -g gets its (mangled, demangled here) names from our fallback;
// - of line-table rows at one address it keeps the first, so a statement
//   without code just before a call can give the call's address its line;
// - its inline-frame API works, but only the innermost inlined frame has a
//   file:line (Wine keeps no DW_AT_call_line), and SymGetLineFromAddrW64
//   finds none inside inlined code;
// - in some builtin DLLs (ntdll.dll) SymFromAddrW finds nothing: the export
//   table names them;
// - looking for the PDB an RSDS record names, it takes every file whose
//   name ends with that name, and an empty one (ld --build-id) matches all
//   files, which it misreads into heap corruption: see LoadModule;
// - on some corrupt DWARF it asserts, that is abort()s: see RunGuarded.

#include "inprof/symbolizer.h"

#ifndef NOMINMAX
#define NOMINMAX
#endif
#include <windows.h>
// windows.h first: dbghelp.h and psapi.h use its types.
#include <dbghelp.h>
#include <psapi.h>

#include <cxxabi.h>

#include <algorithm>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <cwchar>
#include <iterator>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "inprof/internal/log.h"
#include "src/symbolize/dbghelp_guard_windows.h"
#include "src/symbolize/dwarf_lines_windows.h"
#include "src/symbolize/pe_image_windows.h"
#include "src/symbolize/win32_text_windows.h"

namespace inprof {
namespace {

using Caps = Symbolizer::ModuleCapabilities;
using internal::CannotRead;
using internal::DbgHelpLock;
using internal::GetInlineApi;
using internal::Guarded;
using internal::InlineApi;
using internal::Outcome;
using internal::g_dbghelp_mu;
using internal::DwarfLines;
using internal::NameTable;
using internal::Narrow;
using internal::PeImage;
using internal::Widen;
using internal::WinError;

// --- Strings ---------------------------------------------------------------

// Demangles an Itanium C++ ABI name (mingw-w64's); returns the input when it
// is not one.
std::string Demangle(const std::string& name) {
  if (name.size() < 2 || name[0] != '_' || name[1] != 'Z') return name;
  int status = 0;
  char* demangled = abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status);
  if (status != 0 || demangled == nullptr) {
    std::free(demangled);
    return name;
  }
  std::string result(demangled);
  std::free(demangled);
  return result;
}

// The readable name of a symbol as an object file spells it: Itanium names
// demangled, MSVC-decorated ones ("?...") undecorated. Holds the DbgHelp
// lock for UnDecorateSymbolNameW.
std::string FunctionName(const std::string& raw)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_dbghelp_mu) {
  if (raw.empty() || raw[0] != '?') return Demangle(raw);
  std::wstring wide;
  if (!Widen(raw, &wide)) return raw;
  wchar_t buf[4096];
  const wchar_t* decorated = wide.c_str();
  DWORD n = 0;
  const Outcome outcome = Guarded([&] {
    n = UnDecorateSymbolNameW(
        decorated, buf, static_cast<DWORD>(std::size(buf)),
        UNDNAME_NO_MS_KEYWORDS | UNDNAME_NO_FUNCTION_RETURNS |
            UNDNAME_NO_ALLOCATION_MODEL | UNDNAME_NO_ALLOCATION_LANGUAGE |
            UNDNAME_NO_ACCESS_SPECIFIERS | UNDNAME_NO_MEMBER_TYPE |
            UNDNAME_NO_THROW_SIGNATURES);
    return n > 0;
  });
  return outcome == Outcome::kOk ? Narrow(buf, wcsnlen(buf, n)) : raw;
}

// One line on stderr ("inprof: ..."); callers warn once per module.
void Warn(const absl::Status& status) {
  std::string line(status.message());
  std::replace(line.begin(), line.end(), '\n', ' ');
  internal::Log(line);
}

// --- DbgHelp lookups -------------------------------------------------------

// One DbgHelp session: SymInitializeW under a handle value of its own (the
// address of a byte it owns, which no real handle equals), without invading
// the process: modules are loaded explicitly. Every call goes through
// Call(), which marks the session poisoned when DbgHelp faults.
class DbgHelpSession {
 public:
  DbgHelpSession() = default;
  DbgHelpSession(const DbgHelpSession&) = delete;
  DbgHelpSession& operator=(const DbgHelpSession&) = delete;
  // The owner calls End() (under the lock) before it goes.
  ~DbgHelpSession() = default;

  HANDLE handle() const { return reinterpret_cast<HANDLE>(token_.get()); }
  bool started() const { return started_; }
  // Whether DbgHelp faulted in a call of this session.
  bool poisoned() const { return poisoned_; }
  // Whether calls may be made.
  bool usable() const { return started_ && !poisoned_; }

  // `search_path`: null for DbgHelp's default.
  absl::Status Start(const std::wstring* search_path)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_dbghelp_mu) {
    if (started_) return absl::OkStatus();
    const HANDLE h = handle();
    const wchar_t* path = search_path != nullptr ? search_path->c_str() : nullptr;
    const Outcome outcome =
        Guarded([&] { return SymInitializeW(h, path, FALSE) != FALSE; });
    if (outcome != Outcome::kOk) {
      return absl::InternalError(absl::StrCat(
          "DbgHelp: SymInitializeW: ", outcome == Outcome::kFaulted
                                           ? "faulted"
                                           : WinError(GetLastError())));
    }
    started_ = true;
    return absl::OkStatus();
  }

  // Runs `call` (a lambda returning bool, see Guarded) unless the session
  // is not usable; a fault poisons the session.
  template <typename F>
  bool Call(F&& call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_dbghelp_mu) {
    if (!usable()) return false;
    const Outcome outcome = Guarded(call);
    if (outcome == Outcome::kFaulted) poisoned_ = true;
    return outcome == Outcome::kOk;
  }

  // SymCleanup, except for a poisoned session, which is left as it is.
  void End() ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_dbghelp_mu) {
    const HANDLE h = handle();
    Call([&] { return SymCleanup(h) != FALSE; });
    if (poisoned_) {
      // DbgHelp may still hold the handle value: keep the byte.
      static_cast<void>(token_.release());
    }
    started_ = false;
  }

 private:
  std::unique_ptr<char> token_ = std::make_unique<char>();
  bool started_ = false;
  bool poisoned_ = false;
};

// An open file, closed on destruction.
class FileHandle {
 public:
  FileHandle() = default;
  explicit FileHandle(HANDLE h) : h_(h) {}
  FileHandle(FileHandle&& other) noexcept
      : h_(std::exchange(other.h_, INVALID_HANDLE_VALUE)) {}
  FileHandle& operator=(FileHandle&& other) noexcept {
    if (this != &other) {
      Close();
      h_ = std::exchange(other.h_, INVALID_HANDLE_VALUE);
    }
    return *this;
  }
  ~FileHandle() { Close(); }
  HANDLE get() const { return h_; }
  bool valid() const { return h_ != INVALID_HANDLE_VALUE; }

 private:
  void Close() {
    if (valid()) CloseHandle(h_);
    h_ = INVALID_HANDLE_VALUE;
  }
  HANDLE h_ = INVALID_HANDLE_VALUE;
};

FileHandle OpenForReading(const std::wstring& path) {
  return FileHandle(CreateFileW(
      path.c_str(), GENERIC_READ,
      FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE, nullptr,
      OPEN_EXISTING, FILE_ATTRIBUTE_NORMAL, nullptr));
}

// The search path of sessions holding images whose CodeView record names no
// PDB: empty, so that no directory is searched (see LoadModule).
const std::wstring& NoSearchPath() {
  static const std::wstring empty;
  return empty;
}

// Loads the image at `path` into `session` at [base, base + size).
//
// Wine 8's DbgHelp looks for the PDB that an RSDS record names in the
// image's directory and in the search path, taking every file whose name
// ends with that name as a candidate. An empty name (what mingw-w64's ld
// --build-id writes) matches every file, and reading a file that is not a
// PDB frees uninitialized pointers (pdb_fetch_file_info), corrupting the
// heap. So an `unnamed_pdb` image goes to DbgHelp as an open file (kept in
// *file while loaded) under its bare name, leaving no directory to search,
// into a session whose search path is NoSearchPath().
absl::Status LoadModule(DbgHelpSession& session, const std::wstring& path,
                        bool unnamed_pdb, uint64_t base, uint32_t size,
                        FileHandle* file)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_dbghelp_mu) {
  std::wstring image_name = path;
  if (unnamed_pdb) {
    *file = OpenForReading(path);
    if (!file->valid()) {
      return absl::FailedPreconditionError(WinError(GetLastError()));
    }
    const size_t slash = path.find_last_of(L"\\/");
    if (slash != std::wstring::npos) image_name = path.substr(slash + 1);
  }
  const HANDLE h = session.handle();
  const HANDLE image_file = unnamed_pdb ? file->get() : nullptr;
  const wchar_t* name = image_name.c_str();
  DWORD error = ERROR_SUCCESS;
  const bool loaded = session.Call([&] {
    SetLastError(ERROR_SUCCESS);
    const DWORD64 b = SymLoadModuleExW(h, image_file, name, nullptr, base,
                                       size, nullptr, 0);
    error = GetLastError();
    // 0 with ERROR_SUCCESS: DbgHelp had it already.
    return b != 0 || error == ERROR_SUCCESS;
  });
  if (!loaded) {
    *file = FileHandle();
    return absl::FailedPreconditionError(absl::StrCat(
        "DbgHelp: SymLoadModuleExW: ",
        session.poisoned() ? "faulted" : WinError(error)));
  }
  return absl::OkStatus();
}

// SymFromAddrW (or, with `inline_context`, SymFromInlineContextW).
bool SymbolAt(DbgHelpSession& session, uint64_t address,
              const DWORD* inline_context, std::string* raw)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_dbghelp_mu) {
  struct {
    SYMBOL_INFOW info;
    WCHAR more[MAX_SYM_NAME];
  } buf;
  std::memset(&buf, 0, sizeof buf);
  buf.info.SizeOfStruct = sizeof(SYMBOL_INFOW);
  buf.info.MaxNameLen = MAX_SYM_NAME;
  const HANDLE h = session.handle();
  const InlineApi& api = GetInlineApi();
  const bool ok = session.Call([&] {
    DWORD64 displacement = 0;
    return (inline_context != nullptr
                ? api.from_inline_context(h, address, *inline_context,
                                          &displacement, &buf.info)
                : SymFromAddrW(h, address, &displacement, &buf.info)) != FALSE;
  });
  if (!ok) return false;
  const size_t len = std::min<size_t>(buf.info.NameLen, MAX_SYM_NAME);
  *raw = Narrow(buf.info.Name, wcsnlen(buf.info.Name, len));
  return !raw->empty();
}

// SymGetLineFromAddrW64 (or SymGetLineFromInlineContextW).
bool LineAt(DbgHelpSession& session, uint64_t module_base, uint64_t address,
            const DWORD* inline_context, std::string* file, int64_t* line)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_dbghelp_mu) {
  IMAGEHLP_LINEW64 info;
  std::memset(&info, 0, sizeof info);
  info.SizeOfStruct = sizeof info;
  const HANDLE h = session.handle();
  const InlineApi& api = GetInlineApi();
  const bool ok = session.Call([&] {
    DWORD displacement = 0;
    return (inline_context != nullptr
                ? api.line_from_inline_context(h, address, *inline_context,
                                               module_base, &displacement,
                                               &info)
                : SymGetLineFromAddrW64(h, address, &displacement, &info)) !=
           FALSE;
  });
  if (!ok) return false;
  *file = info.FileName != nullptr
              ? Narrow(info.FileName, wcsnlen(info.FileName, 32768))
              : "";
  *line = info.LineNumber;
  return true;
}

void SetName(const std::string& raw, SourceFrame* frame)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_dbghelp_mu) {
  frame->system_name = raw;
  frame->function = FunctionName(raw);
}

// What one lookup needs of a module.
struct ModuleView {
  DbgHelpSession* session = nullptr;  // null: DbgHelp did not load it
  uint64_t base = 0;                  // where DbgHelp has it
  bool use_debug_info = true;
  // Its export and COFF symbol tables (read on first use).
  absl::FunctionRef<const NameTable*()> fallback_names;
  // Its DWARF line tables; null when it has none (or its debug info is not
  // to be used).
  const DwarfLines* dwarf = nullptr;
};

// The file and line of `address` in the module's DWARF line tables.
bool DwarfLineAt(const ModuleView& m, uint64_t address, std::string* file,
                 int64_t* line) {
  return m.dwarf != nullptr &&
         m.dwarf->Find(address - m.base + m.dwarf->image_base(), file, line);
}

// Frames at `address`, innermost first; records in `caps` what was found.
std::vector<SourceFrame> Resolve(const ModuleView& m, uint64_t address,
                                 Caps* caps)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_dbghelp_mu) {
  std::vector<SourceFrame> frames;
  const InlineApi& api = GetInlineApi();
  DbgHelpSession* const s = m.session;
  if (s != nullptr && m.use_debug_info && api.ok()) {
    // The depth of inlined calls at the address; each inline context names
    // one, innermost first, with its own line. The function they are
    // inlined into follows, with the line of the outermost call (which
    // SymGetLineFromAddrW64 gives on Windows, and nothing on Wine).
    const HANDLE h = s->handle();
    DWORD depth = 0;
    DWORD context = 0;
    DWORD frame_index = 0;
    if (s->Call([&] {
          depth = api.include_inline_trace(h, address);
          return depth > 0;
        }) &&
        depth < 256 && s->Call([&] {
          return api.query_inline_trace(h, address, 0, address, address,
                                        &context, &frame_index) != FALSE;
        })) {
      for (DWORD i = 0; i < depth; ++i) {
        const DWORD c = context + i;
        SourceFrame frame;
        std::string raw;
        if (SymbolAt(*s, address, &c, &raw)) SetName(raw, &frame);
        LineAt(*s, m.base, address, &c, &frame.file, &frame.line);
        frames.push_back(std::move(frame));
      }
      caps->has_inline_frames = true;
      // The line table's row at the address is the innermost frame's: where
      // a module has DWARF, its own reader gives it (Wine's DbgHelp takes
      // the first of several rows at one address, not the last).
      std::string file;
      int64_t line = 0;
      if (DwarfLineAt(m, address, &file, &line)) {
        frames.front().file = std::move(file);
        frames.front().line = line;
      }
    }
  }
  SourceFrame outer;
  std::string raw;
  if (s != nullptr && SymbolAt(*s, address, nullptr, &raw)) {
    SetName(raw, &outer);
  } else if (const NameTable* names = m.fallback_names(); names != nullptr) {
    if (const std::string* name = names->Find(address - m.base);
        name != nullptr) {
      SetName(*name, &outer);
    }
  }
  // With inlined frames, the outer frame's line is that of the outermost
  // call (DbgHelp's, where it knows it); without, the row's.
  if (!(frames.empty() &&
        DwarfLineAt(m, address, &outer.file, &outer.line)) &&
      s != nullptr && m.use_debug_info) {
    LineAt(*s, m.base, address, nullptr, &outer.file, &outer.line);
  }
  if (!frames.empty() || !outer.function.empty() || !outer.file.empty()) {
    frames.push_back(std::move(outer));
  }
  for (const SourceFrame& f : frames) {
    if (!f.function.empty()) caps->has_functions = true;
    if (!f.file.empty()) caps->has_filenames = true;
    if (f.line > 0) caps->has_line_numbers = true;
  }
  return frames;
}

size_t EntryBytes(const SymbolizedAddress& entry) {
  auto string_bytes = [](const std::string& s) {
    // Strings up to the small-string capacity live inside the object.
    return s.capacity() > std::string().capacity() ? s.capacity() + 1 : 0;
  };
  size_t bytes = sizeof(SymbolizedAddress) + sizeof(uint64_t) +
                 sizeof(std::unique_ptr<SymbolizedAddress>) +
                 entry.frames.capacity() * sizeof(SourceFrame);
  for (const SourceFrame& f : entry.frames) {
    bytes += string_bytes(f.function) + string_bytes(f.system_name) +
             string_bytes(f.file);
  }
  return bytes;
}

// The Windows directory with a trailing backslash ("C:\windows\").
const std::wstring& WindowsDirectory() {
  static const std::wstring dir = [] {
    wchar_t buf[MAX_PATH + 1];
    const UINT n = GetWindowsDirectoryW(buf, MAX_PATH + 1);
    if (n == 0 || n > MAX_PATH) return std::wstring();
    std::wstring d(buf, n);
    if (d.back() != L'\\') d.push_back(L'\\');
    return d;
  }();
  return dir;
}

// Whether `path` lies under the Windows directory (system DLLs).
bool IsSystemModule(const std::wstring& path) {
  const std::wstring& dir = WindowsDirectory();
  std::wstring p = path;
  if (p.rfind(L"\\\\?\\", 0) == 0) p.erase(0, 4);
  return !dir.empty() && p.size() > dir.size() &&
         _wcsnicmp(p.c_str(), dir.c_str(), dir.size()) == 0;
}

// A debug-info search path without symbol-server entries ("srv*...",
// "symsrv*...", which would download inside the host process).
std::string OfflineSearchPath(absl::string_view path) {
  std::vector<absl::string_view> kept;
  for (absl::string_view entry : absl::StrSplit(path, ';')) {
    const std::string lower = absl::AsciiStrToLower(entry);
    if (absl::StartsWith(lower, "srv*") || absl::StartsWith(lower, "symsrv*")) {
      continue;
    }
    kept.push_back(entry);
  }
  return absl::StrJoin(kept, ";");
}

// The file name of a loaded module; empty when it is gone.
std::wstring ModulePath(HMODULE module) {
  std::wstring buf(MAX_PATH, L'\0');
  for (;;) {
    const DWORD n = GetModuleFileNameW(module, buf.data(),
                                       static_cast<DWORD>(buf.size()));
    if (n == 0) return L"";
    if (n < buf.size()) {
      buf.resize(n);
      return buf;
    }
    if (buf.size() >= 32768) return L"";
    buf.resize(buf.size() * 2);
  }
}

// One loaded module as the loader lists it.
struct LoadedModule {
  HMODULE handle;
  uint64_t base;
  uint64_t size;
};

// The loader's modules, sorted by base; false when they cannot be listed.
bool ListModules(std::vector<LoadedModule>* out) {
  out->clear();
  const HANDLE self = GetCurrentProcess();
  std::vector<HMODULE> handles(256);
  for (int attempt = 0;; ++attempt) {
    DWORD needed = 0;
    const DWORD bytes = static_cast<DWORD>(handles.size() * sizeof(HMODULE));
    if (!EnumProcessModules(self, handles.data(), bytes, &needed)) return false;
    if (needed <= bytes) {
      handles.resize(needed / sizeof(HMODULE));
      break;
    }
    if (attempt == 8) return false;
    handles.resize(needed / sizeof(HMODULE) + 16);
  }
  for (HMODULE h : handles) {
    MODULEINFO info;
    if (!GetModuleInformation(self, h, &info, sizeof info)) continue;
    const uint64_t base = reinterpret_cast<uint64_t>(info.lpBaseOfDll);
    out->push_back({h, base, info.SizeOfImage});
  }
  std::sort(out->begin(), out->end(),
            [](const LoadedModule& a, const LoadedModule& b) {
              return a.base < b.base;
            });
  return true;
}

}  // namespace

struct Symbolizer::Impl {
  struct Module {
    std::wstring wpath;
    bool system = false;          // under the Windows directory
    bool unnamed_pdb = false;     // its CodeView record names no PDB
    bool load_attempted = false;  // LoadModule was called
    bool loaded = false;          // DbgHelp has it
    bool use_debug_info = true;   // decided when loaded
    FileHandle file;              // what DbgHelp maps (unnamed_pdb modules)
    bool fallback_names_read = false;
    std::unique_ptr<NameTable> fallback_names;  // null: none or unreadable
    bool dwarf_read = false;
    std::unique_ptr<DwarfLines> dwarf;  // null: none; counted in cached_bytes
    Caps caps;
  };

  Impl() = default;
  ~Impl() {
    // Before the modules' files close.
    if (session.started() || unnamed_pdb_session.started()) {
      DbgHelpLock lock;
      session.End();
      unnamed_pdb_session.End();
    }
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  bool symbolize = true;
  bool system_debug_info = true;
  bool scanned = false;
  std::wstring search_path;  // SetDebugInfoPath's, in UTF-16
  bool search_path_set = false;
  size_t max_cached_bytes = kDefaultMaxCachedBytes;
  size_t cached_bytes = 0;
  std::vector<ModuleInfo> modules;  // sorted by start
  std::vector<Module> states;       // parallel to modules
  std::vector<std::pair<uint64_t, uint64_t>> listed;  // (base, size) listed
  // Keyed by the address looked up (address - 1 for return addresses).
  // unique_ptr keeps references returned by Lookup stable across rehashes.
  absl::flat_hash_map<uint64_t, std::unique_ptr<SymbolizedAddress>> cache;
  absl::flat_hash_set<std::string> warned;  // what was warned about
  // Modules whose CodeView record names no PDB go to the second session
  // (see LoadModule); the others to the first, which searches the debug
  // info path.
  DbgHelpSession session;
  DbgHelpSession unnamed_pdb_session;
  bool session_failed = false;

  void Rebuild();
  int FindModule(uint64_t address) const;
  DbgHelpSession& SessionOf(const Module& m) {
    return m.unnamed_pdb ? unnamed_pdb_session : session;
  }
  // Starts the session and loads module `i` into it; false when DbgHelp
  // cannot be used for it.
  bool EnsureLoaded(int i) ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_dbghelp_mu);
  const NameTable* FallbackNamesOf(int i);
  // Module `i`'s DWARF line tables, read on first use; null when it has
  // none.
  const DwarfLines* DwarfLinesOf(int i);
};

void Symbolizer::Impl::Rebuild() {
  std::vector<LoadedModule> loaded;
  if (!ListModules(&loaded)) {
    scanned = true;
    return;  // the previous list stays
  }
  std::vector<std::pair<uint64_t, uint64_t>> now;
  now.reserve(loaded.size());
  for (const LoadedModule& m : loaded) now.emplace_back(m.base, m.size);
  if (scanned && now == listed) return;
  scanned = true;
  listed = std::move(now);

  auto key = [](const ModuleInfo& m) {
    return absl::StrCat(m.path, "|", m.start, "|", m.limit, "|", m.build_id);
  };
  std::vector<ModuleInfo> new_modules;
  std::vector<Module> new_states;
  for (const LoadedModule& m : loaded) {
    Module state;
    state.wpath = ModulePath(m.handle);
    if (state.wpath.empty()) continue;  // unloaded meanwhile
    state.system = IsSystemModule(state.wpath);
    ModuleInfo info;
    info.path = Narrow(state.wpath);
    info.start = m.base;
    info.limit = m.base + m.size;
    info.file_offset = 0;
    if (absl::StatusOr<PeImage> image =
            PeImage::InMemory(m.base, m.size, info.path);
        image.ok()) {
      PeImage::CodeView cv = image->CodeViewRecord();
      info.build_id = std::move(cv.build_id);
      state.unnamed_pdb = cv.unnamed_pdb;
    }
    new_modules.push_back(std::move(info));
    new_states.push_back(std::move(state));
  }

  // Carry over what is known of modules still loaded at the same place;
  // unload the others from DbgHelp.
  absl::flat_hash_map<std::string, int> new_by_key;
  for (size_t i = 0; i < new_modules.size(); ++i) {
    new_by_key[key(new_modules[i])] = static_cast<int>(i);
  }
  std::vector<int> remap(modules.size(), -1);
  for (size_t i = 0; i < modules.size(); ++i) {
    auto it = new_by_key.find(key(modules[i]));
    if (it != new_by_key.end()) {
      remap[i] = it->second;
      new_states[it->second] = std::move(states[i]);
      continue;
    }
    if (states[i].dwarf != nullptr) cached_bytes -= states[i].dwarf->bytes();
    if (states[i].loaded) {
      DbgHelpLock lock;
      DbgHelpSession& s = SessionOf(states[i]);
      const HANDLE h = s.handle();
      const uint64_t base = modules[i].start;
      s.Call([&] { return SymUnloadModule64(h, base) != FALSE; });
    }
  }

  // Renumber cached results of modules that are still there; drop those of
  // unloaded modules and of unmapped addresses (a new module may cover them).
  for (auto it = cache.begin(); it != cache.end();) {
    const int old_module = it->second->module;
    const int new_module = old_module >= 0 ? remap[old_module] : -1;
    if (new_module < 0) {
      cached_bytes -= EntryBytes(*it->second);
      cache.erase(it++);
    } else {
      it->second->module = new_module;
      ++it;
    }
  }
  modules = std::move(new_modules);
  states = std::move(new_states);  // closes the files of unloaded modules
}

int Symbolizer::Impl::FindModule(uint64_t address) const {
  auto it = std::upper_bound(
      modules.begin(), modules.end(), address,
      [](uint64_t a, const ModuleInfo& m) { return a < m.start; });
  if (it == modules.begin()) return -1;
  --it;
  return address < it->limit ? static_cast<int>(it - modules.begin()) : -1;
}

bool Symbolizer::Impl::EnsureLoaded(int i) {
  Module& state = states[i];
  if (state.load_attempted) return state.loaded;
  state.load_attempted = true;
  DbgHelpSession& s = SessionOf(state);
  if (!s.started()) {
    if (session_failed) return false;
    const std::wstring* path = state.unnamed_pdb ? &NoSearchPath()
                               : search_path_set  ? &search_path
                                                  : nullptr;
    absl::Status started = s.Start(path);
    if (!started.ok()) {
      session_failed = true;  // DbgHelp unusable: the export tables name
      Warn(started);
      return false;
    }
  }
  // DbgHelp faulted in this session (warned about then): not called again.
  if (s.poisoned()) return false;
  const ModuleInfo& info = modules[i];
  absl::Status status =
      LoadModule(s, state.wpath, state.unnamed_pdb, info.start,
                 static_cast<uint32_t>(info.limit - info.start), &state.file);
  state.loaded = status.ok();
  if (!state.loaded && warned.insert(info.path).second) {
    Warn(CannotRead(info.path, status.message()));
  }
  state.use_debug_info = system_debug_info || !state.system;
  return state.loaded;
}

const NameTable* Symbolizer::Impl::FallbackNamesOf(int i) {
  Module& state = states[i];
  if (state.fallback_names_read) return state.fallback_names.get();
  state.fallback_names_read = true;
  const ModuleInfo& info = modules[i];
  absl::StatusOr<PeImage> image =
      PeImage::InMemory(info.start, info.limit - info.start, info.path);
  if (!image.ok()) return nullptr;
  std::vector<NameTable::Entry> entries;
  image->Exports(&entries);
  // The COFF symbol table is in the file only, if it is still the one
  // loaded.
  const FileHandle file = OpenForReading(state.wpath);
  if (file.valid()) {
    absl::StatusOr<PeImage> on_disk = PeImage::OfFile(file.get(), info.path);
    if (on_disk.ok() && on_disk->SameBuildAs(*image)) {
      on_disk->CoffFunctions(&entries);
    }
  }
  if (!entries.empty()) {
    state.fallback_names =
        std::make_unique<NameTable>(std::move(entries), image->CodeRanges());
  }
  return state.fallback_names.get();
}

const DwarfLines* Symbolizer::Impl::DwarfLinesOf(int i) {
  Module& state = states[i];
  if (state.dwarf_read) return state.dwarf.get();
  state.dwarf_read = true;
  if (!system_debug_info && state.system) return nullptr;
  const ModuleInfo& info = modules[i];
  absl::StatusOr<PeImage> image =
      PeImage::InMemory(info.start, info.limit - info.start, info.path);
  if (!image.ok()) return nullptr;
  // The tables are in the file only, if it is still the one loaded.
  const FileHandle file = OpenForReading(state.wpath);
  if (!file.valid()) return nullptr;
  absl::StatusOr<PeImage> on_disk = PeImage::OfFile(file.get(), info.path);
  if (!on_disk.ok() || !on_disk->SameBuildAs(*image)) return nullptr;
  std::string error;
  state.dwarf = DwarfLines::Read(*on_disk, &error);
  if (!error.empty() &&
      warned.insert(absl::StrCat(info.path, "|.debug_line")).second) {
    Warn(CannotRead(info.path, error));
  }
  if (state.dwarf != nullptr) cached_bytes += state.dwarf->bytes();
  return state.dwarf.get();
}

Symbolizer::Symbolizer(bool symbolize) : impl_(std::make_unique<Impl>()) {
  impl_->symbolize = symbolize;
  impl_->Rebuild();
}

Symbolizer::~Symbolizer() = default;

// Another process's symbolizer: not on Windows (ForProcess says so).
Symbolizer::Symbolizer(pid_t /*pid*/, bool symbolize)
    : impl_(std::make_unique<Impl>()) {
  impl_->symbolize = symbolize;
}

absl::StatusOr<std::unique_ptr<Symbolizer>> Symbolizer::ForProcess(
    pid_t /*pid*/, bool /*symbolize*/) {
  return absl::UnimplementedError(
      "Symbolizer::ForProcess: not available on Windows");
}

void Symbolizer::Refresh() {
  if (impl_->cached_bytes > impl_->max_cached_bytes) {
    impl_->cache = {};  // also gives the table's memory back
    // The modules' line tables too: read again on their next lookup.
    for (Impl::Module& state : impl_->states) {
      state.dwarf.reset();
      state.dwarf_read = false;
    }
    impl_->cached_bytes = 0;
  }
  impl_->Rebuild();  // a no-op when the loader lists the same modules
}

const std::vector<ModuleInfo>& Symbolizer::modules() const {
  return impl_->modules;
}

void Symbolizer::set_system_debug_info(bool on) {
  impl_->system_debug_info = on;
}

// On Windows the path is DbgHelp's symbol search path: ';'-separated
// directories, searched for the PDBs that modules' CodeView records name
// (after the module's own directory). Symbol-server entries are dropped.
void Symbolizer::SetDebugInfoPath(absl::string_view path) {
  std::wstring wide;
  if (!Widen(OfflineSearchPath(path), &wide)) {
    Warn(absl::InvalidArgumentError(
        "debug info path: not valid UTF-8; keeping the previous one"));
    return;
  }
  impl_->search_path = std::move(wide);
  impl_->search_path_set = true;
  if (impl_->session.started()) {
    DbgHelpLock lock;
    const HANDLE h = impl_->session.handle();
    const wchar_t* search_path = impl_->search_path.c_str();
    impl_->session.Call(
        [&] { return SymSetSearchPathW(h, search_path) != FALSE; });
  }
}

size_t Symbolizer::cached_addresses() const { return impl_->cache.size(); }

size_t Symbolizer::cached_bytes() const { return impl_->cached_bytes; }

size_t Symbolizer::max_cached_bytes() const {
  return impl_->max_cached_bytes;
}

void Symbolizer::set_max_cached_bytes(size_t max) {
  impl_->max_cached_bytes = max;
}

const SymbolizedAddress& Symbolizer::Lookup(uint64_t address,
                                            bool is_return_address) {
  // A return address follows its call; address - 1 is inside the call, which
  // names the right function and line even when the call is the last
  // instruction of a function.
  const uint64_t lookup =
      is_return_address && address > 0 ? address - 1 : address;
  std::unique_ptr<SymbolizedAddress>& slot = impl_->cache[lookup];
  if (slot != nullptr) return *slot;
  slot = std::make_unique<SymbolizedAddress>();
  slot->module = impl_->FindModule(lookup);
  if (slot->module >= 0 && impl_->symbolize) {
    const int i = slot->module;
    // Read without the DbgHelp lock, which other symbolizers wait on.
    const DwarfLines* dwarf = impl_->DwarfLinesOf(i);
    DbgHelpLock lock;
    const bool loaded = impl_->EnsureLoaded(i);
    Impl::Module& state = impl_->states[i];
    DbgHelpSession& session = impl_->SessionOf(state);
    auto fallback_names = [this, i] { return impl_->FallbackNamesOf(i); };
    const ModuleView view{
        .session = loaded ? &session : nullptr,
        .base = impl_->modules[i].start,
        .use_debug_info = state.use_debug_info,
        .fallback_names = fallback_names,
        .dwarf = dwarf,
    };
    const bool was_poisoned = session.poisoned();
    slot->frames = Resolve(view, lookup, &state.caps);
    if (session.poisoned() && !was_poisoned) {
      Warn(CannotRead(impl_->modules[i].path,
                      "DbgHelp faulted reading its debug info (Wine's does on "
                      "large GCC programs); from now on names come from the "
                      "modules' COFF and export tables, lines from their "
                      "DWARF line tables"));
    }
  }
  impl_->cached_bytes += EntryBytes(*slot);
  return *slot;
}

Symbolizer::ModuleCapabilities Symbolizer::Capabilities(int module) const {
  if (module < 0 || static_cast<size_t>(module) >= impl_->states.size()) {
    return {};
  }
  return impl_->states[module].caps;
}

absl::StatusOr<std::vector<std::vector<SourceFrame>>> Symbolizer::SymbolizeFile(
    const std::string& path, const std::vector<uint64_t>& file_addresses) {
  std::wstring wpath;
  if (path.empty() || !Widen(path, &wpath)) {
    return CannotRead(path, "not a valid UTF-8 file name");
  }
  const FileHandle file = OpenForReading(wpath);
  if (!file.valid()) return CannotRead(path, WinError(GetLastError()));
  absl::StatusOr<PeImage> image = PeImage::OfFile(file.get(), path);
  if (!image.ok()) return image.status();
  const uint64_t base = image->image_base();
  const uint64_t limit = base + image->size_of_image();

  bool names_read = false;
  NameTable names;
  auto fallback_names = [&]() -> const NameTable* {
    if (!names_read) {
      names_read = true;
      std::vector<NameTable::Entry> entries;
      image->Exports(&entries);
      image->CoffFunctions(&entries);
      names = NameTable(std::move(entries), image->CodeRanges());
    }
    return &names;
  };

  std::string dwarf_error;
  const std::unique_ptr<DwarfLines> dwarf = DwarfLines::Read(*image, &dwarf_error);
  if (!dwarf_error.empty()) Warn(CannotRead(path, dwarf_error));

  const bool unnamed_pdb = image->CodeViewRecord().unnamed_pdb;
  std::vector<std::vector<SourceFrame>> result;
  result.reserve(file_addresses.size());
  DbgHelpLock lock;
  DbgHelpSession session;
  absl::Status started =
      session.Start(unnamed_pdb ? &NoSearchPath() : nullptr);
  if (!started.ok()) return CannotRead(path, started.message());
  // At the image's preferred base, so that file addresses are addresses.
  FileHandle dbghelp_file;
  absl::Status loaded =
      LoadModule(session, wpath, unnamed_pdb, base, image->size_of_image(),
                 &dbghelp_file);
  if (!loaded.ok()) {
    session.End();
    return CannotRead(path, loaded.message());
  }
  Caps caps;
  const ModuleView view{.session = &session,
                        .base = base,
                        .use_debug_info = true,
                        .fallback_names = fallback_names,
                        .dwarf = dwarf.get()};
  for (uint64_t address : file_addresses) {
    if (address < base || address >= limit) {
      result.emplace_back();
      continue;
    }
    result.push_back(Resolve(view, address, &caps));
  }
  const HANDLE h = session.handle();
  session.Call([&] { return SymUnloadModule64(h, base) != FALSE; });
  session.End();
  if (session.poisoned()) {
    return CannotRead(path, "DbgHelp faulted reading its debug info "
                            "(truncated or corrupt)");
  }
  return result;
}

}  // namespace inprof
