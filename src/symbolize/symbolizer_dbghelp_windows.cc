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
#include "inprof/internal/byte_cursor.h"
#include "inprof/internal/line_table.h"
#include "inprof/internal/log.h"

namespace inprof {
namespace {

using Caps = Symbolizer::ModuleCapabilities;

// Serializes every DbgHelp call in the process that goes through this file.
ABSL_CONST_INIT absl::Mutex g_dbghelp_mu(absl::kConstInit);

// C++ names undecorated, line numbers loaded, symbols read on first use,
// never a dialog box, and _NT_SYMBOL_PATH (which may name a symbol server,
// that is the network) ignored.
constexpr DWORD kSymOptions = SYMOPT_UNDNAME | SYMOPT_LOAD_LINES |
                              SYMOPT_DEFERRED_LOADS |
                              SYMOPT_FAIL_CRITICAL_ERRORS |
                              SYMOPT_NO_PROMPTS | SYMOPT_IGNORE_NT_SYMPATH;

// Holds g_dbghelp_mu and our symbol options; gives the host's back.
class ABSL_SCOPED_LOCKABLE DbgHelpLock {
 public:
  DbgHelpLock() ABSL_EXCLUSIVE_LOCK_FUNCTION(g_dbghelp_mu) {
    g_dbghelp_mu.Lock();
    saved_options_ = SymGetOptions();
    SymSetOptions(kSymOptions);
  }
  ~DbgHelpLock() ABSL_UNLOCK_FUNCTION() {
    SymSetOptions(saved_options_);
    g_dbghelp_mu.Unlock();
  }
  DbgHelpLock(const DbgHelpLock&) = delete;
  DbgHelpLock& operator=(const DbgHelpLock&) = delete;

 private:
  DWORD saved_options_ = 0;
};

// DbgHelp's inline-frame functions (DbgHelp 6.2+, missing from mingw-w64's
// dbghelp.h), looked up in the DbgHelp this file is linked against.
struct InlineApi {
  DWORD(WINAPI* include_inline_trace)(HANDLE, DWORD64) = nullptr;
  BOOL(WINAPI* query_inline_trace)
  (HANDLE, DWORD64, DWORD, DWORD64, DWORD64, LPDWORD, LPDWORD) = nullptr;
  BOOL(WINAPI* from_inline_context)
  (HANDLE, DWORD64, ULONG, PDWORD64, PSYMBOL_INFOW) = nullptr;
  BOOL(WINAPI* line_from_inline_context)
  (HANDLE, DWORD64, ULONG, DWORD64, PDWORD, PIMAGEHLP_LINEW64) = nullptr;
  bool ok() const {
    return include_inline_trace != nullptr && query_inline_trace != nullptr &&
           from_inline_context != nullptr &&
           line_from_inline_context != nullptr;
  }
};

template <typename F>
void GetProc(HMODULE module, const char* name, F* f) {
  // Through void (*)(): GCC's -Wcast-function-type accepts that one.
  *f = reinterpret_cast<F>(
      reinterpret_cast<void (*)()>(GetProcAddress(module, name)));
}

const InlineApi& GetInlineApi() {
  static const InlineApi api = [] {
    InlineApi a;
    HMODULE dbghelp = nullptr;
    // The module SymFromAddrW comes from (it is imported: its address is
    // DbgHelp's own), whatever file that DbgHelp was loaded from.
    if (!GetModuleHandleExW(GET_MODULE_HANDLE_EX_FLAG_FROM_ADDRESS |
                                GET_MODULE_HANDLE_EX_FLAG_UNCHANGED_REFCOUNT,
                            reinterpret_cast<LPCWSTR>(&SymFromAddrW),
                            &dbghelp)) {
      dbghelp = GetModuleHandleW(L"dbghelp.dll");
    }
    if (dbghelp == nullptr) return a;
    GetProc(dbghelp, "SymAddrIncludeInlineTrace", &a.include_inline_trace);
    GetProc(dbghelp, "SymQueryInlineTrace", &a.query_inline_trace);
    GetProc(dbghelp, "SymFromInlineContextW", &a.from_inline_context);
    GetProc(dbghelp, "SymGetLineFromInlineContextW",
            &a.line_from_inline_context);
    return a;
  }();
  return api;
}

// --- Faults inside DbgHelp ---------------------------------------------------

// DbgHelp trusts the files it reads: Wine's DWARF reader follows offsets and
// lengths from .debug_* sections without checking them against the
// section, so a corrupt file whose headers are sound makes it read outside
// its mapping. Each DbgHelp call runs under a guard: a fault inside it
// returns to the guard (a vectored exception handler jumps back to where
// the guard started, abandoning DbgHelp's frames), and the caller then
// treats the session as poisoned: not called again, and leaked rather than
// cleaned up, as its state is whatever the fault left.
enum class Outcome { kOk, kFailed, kFaulted };

struct FaultGuard {
  void* jump[5];  // __builtin_setjmp's buffer
};
thread_local FaultGuard* t_fault_guard = nullptr;

LONG CALLBACK ReturnToGuard(EXCEPTION_POINTERS* info) {
  FaultGuard* guard = t_fault_guard;
  if (guard == nullptr) return EXCEPTION_CONTINUE_SEARCH;
  switch (info->ExceptionRecord->ExceptionCode) {
    case EXCEPTION_ACCESS_VIOLATION:
    case EXCEPTION_IN_PAGE_ERROR:
    case EXCEPTION_ARRAY_BOUNDS_EXCEEDED:
    case EXCEPTION_DATATYPE_MISALIGNMENT:
    case EXCEPTION_INT_DIVIDE_BY_ZERO:
    case EXCEPTION_ILLEGAL_INSTRUCTION:
      t_fault_guard = nullptr;
      __builtin_longjmp(guard->jump, 1);
    default:
      return EXCEPTION_CONTINUE_SEARCH;
  }
}

// Wine's DbgHelp also asserts on some inconsistent DWARF (a repeated
// abbreviation code, say): ucrtbase's _assert, whose abort() raises SIGABRT
// before it ends the process. Under Wine, a guarded call installs a
// SIGABRT handler in ucrtbase for its duration that returns to the guard;
// an abort() on another thread meanwhile goes to the handler that was
// there before.
using SignalHandler = void(__cdecl*)(int);
struct UcrtSignals {
  SignalHandler(__cdecl* signal)(int, SignalHandler) = nullptr;
  int(__cdecl* raise)(int) = nullptr;
};
const UcrtSignals& GetUcrtSignals() {
  static const UcrtSignals signals = [] {
    UcrtSignals s;
    const HMODULE ntdll = GetModuleHandleW(L"ntdll.dll");
    const HMODULE ucrt = GetModuleHandleW(L"ucrtbase.dll");
    if (ntdll == nullptr || ucrt == nullptr ||
        GetProcAddress(ntdll, "wine_get_version") == nullptr) {
      return s;  // not Wine: DbgHelp's asserts are not compiled in
    }
    GetProc(ucrt, "signal", &s.signal);
    GetProc(ucrt, "raise", &s.raise);
    if (s.signal == nullptr || s.raise == nullptr) s = UcrtSignals();
    return s;
  }();
  return signals;
}
SignalHandler g_previous_abort_handler = SIG_DFL;  // under g_dbghelp_mu

void __cdecl ReturnToGuardOnAbort(int sig) {
  if (FaultGuard* guard = t_fault_guard; guard != nullptr) {
    t_fault_guard = nullptr;
    __builtin_longjmp(guard->jump, 1);
  }
  // Another thread's abort(): what it would have done without us.
  const UcrtSignals& ucrt = GetUcrtSignals();
  const SignalHandler previous = g_previous_abort_handler;
  ucrt.signal(sig, previous);
  if (previous != SIG_DFL && previous != SIG_IGN && previous != SIG_ERR) {
    previous(sig);
  } else if (previous != SIG_IGN) {
    ucrt.raise(sig);
  }
}

// Runs `call(arg)`, a DbgHelp call that writes its results through `arg`.
// No object with a destructor may live in the frames it abandons on a
// fault: `call` only passes plain data to DbgHelp.
__attribute__((noinline)) Outcome RunGuarded(bool (*call)(void*), void* arg)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_dbghelp_mu) {
  static const bool installed =
      AddVectoredExceptionHandler(/*First=*/1, ReturnToGuard) != nullptr;
  if (!installed) return call(arg) ? Outcome::kOk : Outcome::kFailed;
  const UcrtSignals& ucrt = GetUcrtSignals();
  if (ucrt.signal != nullptr) {
    g_previous_abort_handler = ucrt.signal(SIGABRT, ReturnToGuardOnAbort);
  }
  FaultGuard guard;
  Outcome outcome;
  if (__builtin_setjmp(guard.jump) == 0) {
    t_fault_guard = &guard;
    outcome = call(arg) ? Outcome::kOk : Outcome::kFailed;
    t_fault_guard = nullptr;
  } else {
    outcome = Outcome::kFaulted;
  }
  if (ucrt.signal != nullptr) ucrt.signal(SIGABRT, g_previous_abort_handler);
  return outcome;
}

// RunGuarded for a lambda returning bool (capturing plain data by
// reference).
template <typename Call>
Outcome Guarded(Call&& call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_dbghelp_mu) {
  using C = std::remove_reference_t<Call>;
  return RunGuarded([](void* c) -> bool { return (*static_cast<C*>(c))(); },
                    &call);
}

// --- Strings ---------------------------------------------------------------

std::string Narrow(const wchar_t* s, size_t n) {
  if (n == 0) return "";
  const int size = WideCharToMultiByte(CP_UTF8, 0, s, static_cast<int>(n),
                                       nullptr, 0, nullptr, nullptr);
  if (size <= 0) return "";
  std::string out(static_cast<size_t>(size), '\0');
  WideCharToMultiByte(CP_UTF8, 0, s, static_cast<int>(n), out.data(), size,
                      nullptr, nullptr);
  return out;
}

std::string Narrow(const std::wstring& s) { return Narrow(s.data(), s.size()); }

// UTF-8 to UTF-16; false when `s` is not valid UTF-8 or holds a NUL.
bool Widen(absl::string_view s, std::wstring* out) {
  out->clear();
  if (s.empty()) return true;
  if (s.find('\0') != absl::string_view::npos || s.size() > (1u << 30)) {
    return false;
  }
  const int size = MultiByteToWideChar(CP_UTF8, MB_ERR_INVALID_CHARS, s.data(),
                                       static_cast<int>(s.size()), nullptr, 0);
  if (size <= 0) return false;
  out->resize(static_cast<size_t>(size));
  MultiByteToWideChar(CP_UTF8, MB_ERR_INVALID_CHARS, s.data(),
                      static_cast<int>(s.size()), out->data(), size);
  return true;
}

// FormatMessage's text for a Win32 error code, on one line.
std::string WinError(DWORD code) {
  wchar_t* buf = nullptr;
  const DWORD n = FormatMessageW(
      FORMAT_MESSAGE_ALLOCATE_BUFFER | FORMAT_MESSAGE_FROM_SYSTEM |
          FORMAT_MESSAGE_IGNORE_INSERTS,
      nullptr, code, 0, reinterpret_cast<LPWSTR>(&buf), 0, nullptr);
  std::string text = n > 0 && buf != nullptr ? Narrow(buf, n) : "";
  if (buf != nullptr) LocalFree(buf);
  for (char& c : text) {
    if (c == '\r' || c == '\n') c = ' ';
  }
  text = std::string(absl::StripAsciiWhitespace(text));
  if (!absl::StrContains(text, absl::StrCat(code))) {
    absl::StrAppend(&text, text.empty() ? "" : " ", "(error ", code, ")");
  }
  return text;
}

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

absl::Status CannotRead(const std::string& path, absl::string_view reason) {
  return absl::FailedPreconditionError(
      absl::StrCat("cannot read symbols of ", path, ": ", reason));
}

// One line on stderr ("inprof: ..."); callers warn once per module.
void Warn(const absl::Status& status) {
  std::string line(status.message());
  std::replace(line.begin(), line.end(), '\n', ' ');
  internal::Log(line);
}

// --- PE images -------------------------------------------------------------

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
                                          const std::string& name) {
    PeImage image;
    image.memory_base_ = base;
    image.limit_ = size;
    absl::Status status = image.ParseHeaders(name);
    if (!status.ok()) return status;
    return image;
  }

  // `file` must stay open while the image is used.
  static absl::StatusOr<PeImage> OfFile(HANDLE file, const std::string& path) {
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

  uint64_t image_base() const { return image_base_; }
  uint32_t size_of_image() const { return size_of_image_; }

  // Reads `size` bytes at relative virtual address `rva`.
  bool Read(uint64_t rva, void* out, size_t size) const {
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
  CodeView CodeViewRecord() const {
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

  // The sections holding code, by RVA.
  std::vector<NameTable::Range> CodeRanges() const {
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

  // Appends the named exports that are code (not forwarders, not data).
  void Exports(std::vector<NameTable::Entry>* out) const {
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

  // Appends the functions of the COFF symbol table (external and static;
  // what mingw-w64's ld keeps unless stripped). A file's only: the loader
  // does not map the table.
  void CoffFunctions(std::vector<NameTable::Entry>* out) const {
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

  // A section of a file image: where its contents lie in the file.
  struct FileSection {
    uint64_t offset = 0;
    uint64_t size = 0;
  };
  // The section named `name` of a file image; false when there is none.
  // Names longer than 8 characters (mingw-w64's ".debug_line_str") are
  // stored as "/N", N the offset of the name in the COFF string table.
  // CheckFileFits made sure the contents lie inside the file.
  bool FindSection(absl::string_view name, FileSection* out) const {
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
  bool ReadRaw(uint64_t offset, void* out, size_t size) const {
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

  bool ReadString(uint64_t rva, std::string* out) const {
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

  const IMAGE_DATA_DIRECTORY& Directory(int index) const {
    static const IMAGE_DATA_DIRECTORY kNone{};
    return static_cast<uint32_t>(index) < directory_count_ ? directories_[index]
                                                           : kNone;
  }

  absl::Status ParseHeaders(const std::string& name) {
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
    size_t directories_offset = 0;
    if (magic == IMAGE_NT_OPTIONAL_HDR64_MAGIC) {
      IMAGE_OPTIONAL_HEADER64 h{};
      directories_offset = offsetof(IMAGE_OPTIONAL_HEADER64, DataDirectory);
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
    } else if (magic == IMAGE_NT_OPTIONAL_HDR32_MAGIC) {
      IMAGE_OPTIONAL_HEADER32 h{};
      directories_offset = offsetof(IMAGE_OPTIONAL_HEADER32, DataDirectory);
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
    } else {
      return CannotRead(
          name, absl::StrFormat("not a PE image (optional header magic %#x)",
                                magic));
    }
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

  // What DbgHelp will read of a file: section contents and the COFF symbol
  // table with its string table (which holds the names of mingw's
  // .debug_* sections) must lie inside it.
  absl::Status CheckFileFits(const std::string& path) const {
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

  // A section's name, "/N" names looked up in the COFF string table (a
  // file's only); "" when it cannot be read.
  std::string FullSectionName(const IMAGE_SECTION_HEADER& s) const {
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

  static std::string SectionName(const IMAGE_SECTION_HEADER& s) {
    std::string name(reinterpret_cast<const char*>(s.Name),
                     strnlen(reinterpret_cast<const char*>(s.Name),
                             IMAGE_SIZEOF_SHORT_NAME));
    for (char& c : name) {
      if (!absl::ascii_isprint(static_cast<unsigned char>(c))) c = '?';
    }
    return name;
  }

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

// --- DWARF line tables -------------------------------------------------------

using Cursor = internal::ByteCursor;

// The DWARF 5 standard's constants (section 7) that the unit reader below
// uses: mingw-w64 has no <dwarf.h>.
enum : uint64_t {
  kAtStmtList = 0x10,
  kAtCompDir = 0x1b,
  kFormAddr = 0x01,
  kFormBlock2 = 0x03,
  kFormBlock4 = 0x04,
  kFormData2 = 0x05,
  kFormData4 = 0x06,
  kFormData8 = 0x07,
  kFormString = 0x08,
  kFormBlock = 0x09,
  kFormBlock1 = 0x0a,
  kFormData1 = 0x0b,
  kFormFlag = 0x0c,
  kFormSdata = 0x0d,
  kFormStrp = 0x0e,
  kFormUdata = 0x0f,
  kFormRefAddr = 0x10,
  kFormRef1 = 0x11,
  kFormRef2 = 0x12,
  kFormRef4 = 0x13,
  kFormRef8 = 0x14,
  kFormRefUdata = 0x15,
  kFormIndirect = 0x16,
  kFormSecOffset = 0x17,
  kFormExprloc = 0x18,
  kFormFlagPresent = 0x19,
  kFormStrx = 0x1a,
  kFormAddrx = 0x1b,
  kFormRefSup4 = 0x1c,
  kFormStrpSup = 0x1d,
  kFormData16 = 0x1e,
  kFormLineStrp = 0x1f,
  kFormRefSig8 = 0x20,
  kFormImplicitConst = 0x21,
  kFormLoclistx = 0x22,
  kFormRnglistx = 0x23,
  kFormRefSup8 = 0x24,
  kFormStrx1 = 0x25,
  kFormStrx4 = 0x28,
  kFormAddrx1 = 0x29,
  kFormAddrx4 = 0x2c,
  kFormGnuAddrIndex = 0x1f01,
  kFormGnuStrIndex = 0x1f02,
  kFormGnuRefAlt = 0x1f20,
  kFormGnuStrpAlt = 0x1f21,
};

// Moves `c` past an attribute value of `form`; false for a form it does not
// know or a value running past the cursor's end.
bool SkipForm(Cursor& c, uint64_t form, unsigned offset_size,
              unsigned address_size, unsigned version, int depth = 0) {
  uint64_t n = 0;
  switch (form) {
    case kFormFlagPresent:
    case kFormImplicitConst:
      return true;
    case kFormData1:
    case kFormRef1:
    case kFormFlag:
      return c.Skip(1);
    case kFormData2:
    case kFormRef2:
      return c.Skip(2);
    case kFormData4:
    case kFormRef4:
    case kFormRefSup4:
      return c.Skip(4);
    case kFormData8:
    case kFormRef8:
    case kFormRefSig8:
    case kFormRefSup8:
      return c.Skip(8);
    case kFormData16:
      return c.Skip(16);
    case kFormAddr:
      return c.Skip(address_size);
    case kFormRefAddr:
      return c.Skip(version <= 2 ? address_size : offset_size);
    case kFormStrp:
    case kFormLineStrp:
    case kFormSecOffset:
    case kFormStrpSup:
    case kFormGnuRefAlt:
    case kFormGnuStrpAlt:
      return c.Skip(offset_size);
    case kFormSdata:
    case kFormUdata:
    case kFormRefUdata:
    case kFormStrx:
    case kFormAddrx:
    case kFormLoclistx:
    case kFormRnglistx:
    case kFormGnuAddrIndex:
    case kFormGnuStrIndex:
      return c.SkipLeb();
    case kFormString: {
      const char* ignored;
      return c.CString(&ignored);
    }
    case kFormBlock1:
      return c.Fixed(1, &n) && c.Skip(n);
    case kFormBlock2:
      return c.Fixed(2, &n) && c.Skip(n);
    case kFormBlock4:
      return c.Fixed(4, &n) && c.Skip(n);
    case kFormBlock:
    case kFormExprloc:
      return c.Uleb(&n) && c.Skip(n);
    case kFormIndirect:
      return depth < 4 && c.Uleb(&n) &&
             SkipForm(c, n, offset_size, address_size, version, depth + 1);
    default:
      if (form >= kFormStrx1 && form <= kFormStrx4) {
        return c.Skip(form - kFormStrx1 + 1);
      }
      if (form >= kFormAddrx1 && form <= kFormAddrx4) {
        return c.Skip(form - kFormAddrx1 + 1);
      }
      return false;
  }
}

// What a compilation unit tells about its line program.
struct UnitLines {
  std::string comp_dir;  // empty: unknown
  uint8_t address_size = 8;
};

// The line programs of one module (its PE file's .debug_line), decoded,
// with an index by address: "file:line" without DbgHelp, which on Windows
// reads no DWARF and in Wine 8 faults on large programs mixing DWARF 4 and
// 5 units. Addresses are link-time ones (the file's ImageBase plus RVA).
// Immutable once read.
class DwarfLines {
 public:
  // The tables of `image` (a file's); null when it has no .debug_line or
  // none of its programs covers code of the image. `*error` gets one line
  // (without the module's name) when something could not be read.
  static std::unique_ptr<DwarfLines> Read(const PeImage& image,
                                          std::string* error) {
    error->clear();
    PeImage::FileSection line_section;
    if (!image.FindSection(".debug_line", &line_section) ||
        line_section.size == 0) {
      return nullptr;
    }
    // Sections read whole are capped: a larger one is corrupt or absurd.
    constexpr uint64_t kMaxSection = uint64_t{1} << 30;
    auto read_section = [&](absl::string_view name,
                            std::vector<uint8_t>* out) -> bool {
      PeImage::FileSection s;
      if (!image.FindSection(name, &s)) return true;  // absent: empty
      if (s.size > kMaxSection) {
        *error = absl::StrCat(name, ": ", s.size, " bytes, over the limit");
        return false;
      }
      out->resize(static_cast<size_t>(s.size));
      if (!image.ReadAt(s.offset, out->data(), out->size())) {
        *error = absl::StrCat(name, ": cannot read ", s.size,
                              " bytes at file offset ", s.offset);
        out->clear();
        return false;
      }
      return true;
    };
    std::vector<uint8_t> debug_line, debug_line_str, debug_str;
    if (!read_section(".debug_line", &debug_line) ||
        !read_section(".debug_line_str", &debug_line_str) ||
        !read_section(".debug_str", &debug_str)) {
      return nullptr;
    }
    const absl::flat_hash_map<uint64_t, UnitLines> units =
        ReadUnits(image, debug_str, debug_line_str);
    const internal::LineSections sections{
        .debug_line = debug_line,
        .debug_line_str = debug_line_str,
        .debug_str = debug_str,
    };

    auto lines = std::unique_ptr<DwarfLines>(new DwarfLines());
    lines->image_base_ = image.image_base();
    const uint64_t image_limit = image.image_base() + image.size_of_image();
    size_t programs = 0, refused = 0;
    std::string first_refusal;
    const uint64_t size = debug_line.size();
    uint64_t offset = 0;
    while (offset < size && size - offset >= 4) {
      Cursor c{debug_line.data() + offset, debug_line.data() + size};
      uint64_t unit_length = 0;
      unsigned length_size = 4;
      c.Fixed(4, &unit_length);
      if (unit_length == 0xffffffff) {
        length_size = 12;
        if (!c.Fixed(8, &unit_length)) {
          *error = absl::StrFormat(
              ".debug_line: truncated program header at offset %#x", offset);
          break;
        }
      } else if (unit_length >= 0xfffffff0) {
        *error = absl::StrFormat(
            ".debug_line: reserved unit length %#x at offset %#x", unit_length,
            offset);
        break;
      }
      if (unit_length == 0) {  // padding
        offset += length_size;
        continue;
      }
      if (unit_length > size - offset - length_size) {
        *error = absl::StrFormat(
            ".debug_line: the program at offset %#x (%u bytes) runs past the "
            "section's end (%u bytes)",
            offset, unit_length, size);
        break;
      }
      ++programs;
      auto unit = units.find(offset);
      const char* comp_dir = unit != units.end() && !unit->second.comp_dir.empty()
                                 ? unit->second.comp_dir.c_str()
                                 : nullptr;
      const uint8_t address_size =
          unit != units.end() ? unit->second.address_size : 8;
      absl::StatusOr<internal::LineTable> table =
          internal::LineTable::Read(sections, offset, comp_dir, address_size);
      if (!table.ok()) {
        if (refused++ == 0) {
          first_refusal = absl::StrFormat("at offset %#x: %s", offset,
                                          table.status().message());
        }
      } else {
        auto [lo, hi] = table->AddressRange();
        // Sequences of code the linker discarded (duplicate COMDATs) lie
        // at 0: only what lies inside the image counts.
        const bool rows_below = lo < image.image_base();
        lo = std::max(lo, image.image_base());
        hi = std::min(hi, image_limit);
        if (lo < hi) {
          lines->bytes_ += TableBytes(*table, unit_length);
          lines->spans_.push_back(
              {lo, hi, static_cast<uint32_t>(lines->tables_.size()),
               rows_below});
          lines->tables_.push_back(std::move(*table));
        }
      }
      offset += length_size + unit_length;
    }
    if (refused > 0 && error->empty()) {
      *error = absl::StrFormat("%u of %u line programs unreadable (%s)",
                               refused, programs, first_refusal);
    }
    if (lines->tables_.empty()) return nullptr;
    lines->tables_.shrink_to_fit();
    std::sort(lines->spans_.begin(), lines->spans_.end(),
              [](const Span& a, const Span& b) { return a.lo < b.lo; });
    lines->max_hi_.reserve(lines->spans_.size());
    uint64_t max_hi = 0;
    for (const Span& s : lines->spans_) {
      max_hi = std::max(max_hi, s.hi);
      lines->max_hi_.push_back(max_hi);
    }
    lines->bytes_ += sizeof(DwarfLines) +
                     lines->tables_.capacity() * sizeof(internal::LineTable) +
                     lines->spans_.capacity() * sizeof(Span) +
                     lines->max_hi_.capacity() * sizeof(uint64_t);
    return lines;
  }

  uint64_t image_base() const { return image_base_; }

  // Estimated heap bytes held.
  size_t bytes() const { return bytes_; }

  // The file and line of link-time address `address`; false where no table
  // covers it. Where several do (overlapping sequences), the one whose
  // covering row is closest below the address answers.
  bool Find(uint64_t address, std::string* file, int64_t* line) const {
    auto it = std::upper_bound(
        spans_.begin(), spans_.end(), address,
        [](uint64_t a, const Span& s) { return a < s.lo; });
    const std::string* best_file = nullptr;
    int best_line = 0;
    const Span* best = nullptr;
    uint64_t best_distance = 0;
    for (size_t i = static_cast<size_t>(it - spans_.begin()); i-- > 0;) {
      if (max_hi_[i] <= address) break;  // no span at or before i reaches it
      const Span& s = spans_[i];
      if (address >= s.hi) continue;
      const internal::LineTable& table = tables_[s.table];
      const std::string* f = nullptr;
      int l = 0;
      if (!table.Find(address, &f, &l)) continue;
      // A row of discarded code, below the image, answers for every address
      // up to the table's next row when it is the last of its sequence
      // without being its end (a zero-length row): not an answer. Then the
      // row before the image gives the same answer, and does all the way up.
      if (s.rows_below) {
        const std::string* below_file = nullptr;
        int below_line = 0;
        if (table.Find(s.lo - 1, &below_file, &below_line) &&
            below_file == f && below_line == l &&
            RowStart(s, address, f, l) == s.lo) {
          continue;
        }
      }
      if (best == nullptr) {
        best = &s;
        best_file = f;
        best_line = l;
        continue;
      }
      // Rare: sequences of two units overlap. Distances are computed only
      // then.
      if (best_distance == 0) {
        best_distance = address - RowStart(*best, address, best_file, best_line) + 1;
      }
      const uint64_t distance = address - RowStart(s, address, f, l) + 1;
      if (distance < best_distance ||
          (distance == best_distance && s.table < best->table)) {
        best = &s;
        best_file = f;
        best_line = l;
        best_distance = distance;
      }
    }
    if (best == nullptr) return false;
    *file = best_file != nullptr ? SourcePath(*best_file) : "";
    *line = best_line;
    return true;
  }

 private:
  struct Span {
    uint64_t lo;  // [lo, hi): where the table's rows lie, inside the image
    uint64_t hi;
    uint32_t table;
    bool rows_below;  // the table has rows below the image (discarded code)
  };

  DwarfLines() = default;

  // The compile directory and address size of each unit of .debug_info,
  // by its DW_AT_stmt_list: directory 0 of a DWARF 2-4 line table. Only
  // each unit's header and first DIE are read.
  static absl::flat_hash_map<uint64_t, UnitLines> ReadUnits(
      const PeImage& image, const std::vector<uint8_t>& debug_str,
      const std::vector<uint8_t>& debug_line_str) {
    absl::flat_hash_map<uint64_t, UnitLines> units;
    PeImage::FileSection info, abbrev_section;
    if (!image.FindSection(".debug_info", &info) ||
        !image.FindSection(".debug_abbrev", &abbrev_section) ||
        abbrev_section.size > (uint64_t{64} << 20)) {
      return units;
    }
    std::vector<uint8_t> abbrev(static_cast<size_t>(abbrev_section.size));
    if (!image.ReadAt(abbrev_section.offset, abbrev.data(), abbrev.size())) {
      return units;
    }
    std::vector<uint8_t> chunk;
    for (uint64_t offset = 0; offset + 11 <= info.size;) {
      // The unit's header and first DIE: the unit's start, read again up
      // to 1 MiB of it when its first DIE did not fit.
      uint64_t want = std::min<uint64_t>(info.size - offset, 4096);
      UnitHead head;
      for (int attempt = 0; attempt < 2; ++attempt) {
        chunk.resize(static_cast<size_t>(want));
        if (!image.ReadAt(info.offset + offset, chunk.data(), chunk.size())) {
          return units;
        }
        head = UnitHead();
        if (!ReadUnitHead(chunk, info.size - offset, abbrev, debug_str,
                          debug_line_str, &head)) {
          return units;  // no unit boundary to go on from
        }
        const uint64_t whole =
            std::min<uint64_t>(head.size, uint64_t{1} << 20);
        if (head.complete || whole <= want) break;
        want = whole;
      }
      if (head.has_stmt_list) units.emplace(head.stmt_list, std::move(head.lines));
      offset += head.size;
    }
    return units;
  }

  struct UnitHead {
    uint64_t size = 0;  // of the whole unit, its length field included
    bool complete = false;  // its first DIE's attributes were all read
    bool has_stmt_list = false;
    uint64_t stmt_list = 0;
    UnitLines lines;
  };

  // Reads the header and first DIE of the unit that `bytes` (its first
  // bytes, `left` bytes of .debug_info from its start) begins. False when
  // the header gives no size to go on from.
  static bool ReadUnitHead(const std::vector<uint8_t>& bytes, uint64_t left,
                           const std::vector<uint8_t>& abbrev,
                           const std::vector<uint8_t>& debug_str,
                           const std::vector<uint8_t>& debug_line_str,
                           UnitHead* out) {
    Cursor c{bytes.data(), bytes.data() + bytes.size()};
    uint64_t unit_length = 0, version = 0;
    unsigned offset_size = 4;
    if (!c.Fixed(4, &unit_length)) return false;
    if (unit_length == 0xffffffff) {
      if (!c.Fixed(8, &unit_length)) return false;
      offset_size = 8;
    } else if (unit_length >= 0xfffffff0) {
      return false;
    }
    const uint64_t header = offset_size == 8 ? 12 : 4;
    if (unit_length == 0 || left < header || unit_length > left - header) {
      return false;
    }
    out->size = header + unit_length;
    if (c.left() > unit_length) c.end = c.p + unit_length;
    // From here on a unit this cannot read is skipped (complete: nothing
    // more to read in it).
    out->complete = true;
    if (!c.Fixed(2, &version) || version < 2 || version > 5) return true;
    uint64_t abbrev_offset = 0, address_size = 0, unit_type = 1;
    if (version >= 5) {
      if (!c.Fixed(1, &unit_type) || !c.Fixed(1, &address_size) ||
          !c.Fixed(offset_size, &abbrev_offset)) {
        return true;
      }
      if (unit_type == 4 || unit_type == 5) {  // skeleton, split: a dwo_id
        if (!c.Skip(8)) return true;
      } else if (unit_type != 1 && unit_type != 3) {  // type units
        return true;
      }
    } else if (!c.Fixed(offset_size, &abbrev_offset) ||
               !c.Fixed(1, &address_size)) {
      return true;
    }
    if (address_size != 4 && address_size != 8) return true;
    out->lines.address_size = static_cast<uint8_t>(address_size);
    uint64_t code = 0;
    if (!c.Uleb(&code) || code == 0 || abbrev_offset >= abbrev.size()) {
      return true;
    }
    // The abbreviation: looked for from the start of the unit's table.
    Cursor a{abbrev.data() + abbrev_offset, abbrev.data() + abbrev.size()};
    for (int entries = 0;; ++entries) {
      uint64_t entry_code = 0, tag = 0, name = 0, form = 0;
      if (entries > 100000 || !a.Uleb(&entry_code) || entry_code == 0 ||
          !a.Uleb(&tag) || !a.Skip(1)) {
        return true;
      }
      if (entry_code == code) break;
      while (true) {
        if (!a.Uleb(&name) || !a.Uleb(&form)) return true;
        if (name == 0 && form == 0) break;
        if (form == kFormImplicitConst && !a.SkipLeb()) return true;
      }
    }
    // Its attributes, up to DW_AT_stmt_list and DW_AT_comp_dir. A value
    // this cannot read (past the bytes read, or of a form it does not
    // know) leaves the DIE incomplete.
    out->complete = false;
    const unsigned asize = static_cast<unsigned>(address_size);
    const unsigned v = static_cast<unsigned>(version);
    bool has_comp_dir = false;
    while (!(out->has_stmt_list && has_comp_dir)) {
      uint64_t name = 0, form = 0;
      if (!a.Uleb(&name) || !a.Uleb(&form)) break;
      if (name == 0 && form == 0) {
        out->complete = true;
        break;
      }
      if (form == kFormImplicitConst && !a.SkipLeb()) break;
      if (name == kAtStmtList &&
          (form == kFormSecOffset || form == kFormData4 || form == kFormData8)) {
        const size_t n = form == kFormSecOffset ? offset_size
                         : form == kFormData4   ? 4
                                                : 8;
        if (!c.Fixed(n, &out->stmt_list)) break;
        out->has_stmt_list = true;
      } else if (name == kAtCompDir &&
                 (form == kFormString || form == kFormStrp ||
                  form == kFormLineStrp)) {
        const char* dir = nullptr;
        uint64_t at = 0;
        if (form == kFormString) {
          if (!c.CString(&dir)) break;
        } else {
          if (!c.Fixed(offset_size, &at)) break;
          dir = internal::StringAt(form == kFormStrp ? debug_str : debug_line_str, at);
        }
        if (dir != nullptr) out->lines.comp_dir = dir;
        has_comp_dir = true;
      } else if (!SkipForm(c, form, offset_size, asize, v)) {
        break;
      }
    }
    // Stopped far from the end of what was read: a form this does not
    // know, which more bytes would not help with.
    if ((out->has_stmt_list && has_comp_dir) || c.left() >= 256) {
      out->complete = true;
    }
    return true;
  }

  // Estimated heap bytes of `table`, read from a program of `program_bytes`
  // (the reader reserves a 16-byte row per 4 bytes of program).
  static size_t TableBytes(const internal::LineTable& table,
                           uint64_t program_bytes) {
    size_t bytes = static_cast<size_t>(program_bytes / 4 * 16) +
                   table.files() * sizeof(std::string);
    for (size_t i = 0; i < table.files(); ++i) {
      const std::string* f = table.File(i);
      if (f != nullptr && f->capacity() > std::string().capacity()) {
        bytes += f->capacity() + 1;
      }
    }
    return bytes;
  }

  // The lowest address from which up to `address` `span`'s table gives
  // (`file`, `line`) throughout: where the covering row (or its run of
  // rows with that line) starts.
  uint64_t RowStart(const Span& span, uint64_t address, const std::string* file,
                    int line) const {
    const internal::LineTable& table = tables_[span.table];
    auto same = [&](uint64_t x) {
      const std::string* f = nullptr;
      int l = 0;
      return table.Find(x, &f, &l) && f == file && l == line;
    };
    uint64_t good = address;  // same(good)
    uint64_t bad = 0;         // !same(bad), bad < good
    for (uint64_t step = 1;; step *= 2) {
      if (good - span.lo < step) {
        if (same(span.lo)) return span.lo;
        bad = span.lo;
        break;
      }
      if (!same(good - step)) {
        bad = good - step;
        break;
      }
      good -= step;
    }
    while (good - bad > 1) {
      const uint64_t mid = bad + (good - bad) / 2;
      if (same(mid)) {
        good = mid;
      } else {
        bad = mid;
      }
    }
    return good;
  }

  // A file name as the table gives it, except that the reader joins a
  // directory in front of any name not starting with '/': a Windows
  // absolute name ("C:\src\a.c", "C:/src/a.c") inside it is the whole path.
  static std::string SourcePath(const std::string& name) {
    if (name.find(':') == std::string::npos) return name;
    auto separator = [](char c) { return c == '/' || c == '\\'; };
    for (size_t i = name.size() >= 3 ? name.size() - 3 : 0; i >= 1; --i) {
      if (separator(name[i - 1]) &&
          absl::ascii_isalpha(static_cast<unsigned char>(name[i])) &&
          name[i + 1] == ':' && separator(name[i + 2])) {
        return name.substr(i);
      }
    }
    return name;
  }

  uint64_t image_base_ = 0;
  std::vector<internal::LineTable> tables_;
  std::vector<Span> spans_;       // sorted by lo
  std::vector<uint64_t> max_hi_;  // max_hi_[i]: the highest hi of spans_[0..i]
  size_t bytes_ = 0;
};

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
