// src/symbolize/dbghelp_lookup_windows.cc: see dbghelp_lookup_windows.h.
#include "src/symbolize/dbghelp_lookup_windows.h"

// windows.h first: dbghelp.h uses its types.
#include <dbghelp.h>

#include <cxxabi.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <cwchar>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "inprof/symbolizer.h"
#include "src/symbolize/dbghelp_guard_windows.h"
#include "src/symbolize/dwarf_lines_windows.h"
#include "src/symbolize/pe_image_windows.h"
#include "src/symbolize/win32_text_windows.h"

namespace inprof::internal {
namespace {

using Caps = Symbolizer::ModuleCapabilities;

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

}  // namespace

// --- DbgHelp lookups -------------------------------------------------------

FileHandle OpenForReading(const std::wstring& path) {
  return FileHandle(CreateFileW(
      path.c_str(), GENERIC_READ,
      FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE, nullptr,
      OPEN_EXISTING, FILE_ATTRIBUTE_NORMAL, nullptr));
}

const std::wstring& NoSearchPath() {
  static const std::wstring empty;
  return empty;
}

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

namespace {

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

// The file and line of `address` in the module's DWARF line tables.
bool DwarfLineAt(const ModuleView& m, uint64_t address, std::string* file,
                 int64_t* line) {
  return m.dwarf != nullptr &&
         m.dwarf->Find(address - m.base + m.dwarf->image_base(), file, line);
}

}  // namespace

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

}  // namespace inprof::internal
