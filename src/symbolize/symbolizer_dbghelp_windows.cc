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
#include "inprof/base/growth_safe_table.h"
#include "inprof/base/log.h"
#include "src/symbolize/dbghelp_guard_windows.h"
#include "src/symbolize/dbghelp_lookup_windows.h"
#include "src/symbolize/dwarf_lines_windows.h"
#include "src/symbolize/pe_image_windows.h"
#include "src/symbolize/win32_text_windows.h"

namespace inprof {
namespace {

using Caps = Symbolizer::ModuleCapabilities;
using internal::CannotRead;
using internal::DbgHelpLock;
using internal::DbgHelpSession;
using internal::FileHandle;
using internal::LoadModule;
using internal::ModuleView;
using internal::NoSearchPath;
using internal::OpenForReading;
using internal::g_dbghelp_mu;
using internal::DwarfLines;
using internal::NameTable;
using internal::Narrow;
using internal::PeImage;
using internal::Resolve;
using internal::Widen;
using internal::WinError;

// One line on stderr ("inprof: ..."); callers warn once per module.
void Warn(const absl::Status& status) {
  std::string line(status.message());
  std::replace(line.begin(), line.end(), '\n', ' ');
  internal::Log(line);
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
  internal::ThrowSafeMap<uint64_t, std::unique_ptr<SymbolizedAddress>> cache;
  internal::ThrowSafeSet<std::string> warned;  // what was warned about
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
  internal::ThrowSafeMap<std::string, int> new_by_key;
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
    decltype(impl_->cache)().swap(impl_->cache);  // also gives the table's memory back
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
