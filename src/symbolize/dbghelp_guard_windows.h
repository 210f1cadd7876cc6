// src/symbolize/dbghelp_guard_windows.h: calling DbgHelp safely, for the
// Windows symbolizer. DbgHelp is not thread-safe and its symbol options are
// process-wide: every call holds g_dbghelp_mu with inprof's options set
// (DbgHelpLock), and runs under a guard that turns a fault or an assertion
// inside DbgHelp (a corrupt file) into an outcome (Guarded).
//
// Thread-safety: as above; GetInlineApi is safe from any thread.
#ifndef INPROF_SRC_SYMBOLIZE_DBGHELP_GUARD_WINDOWS_H_
#define INPROF_SRC_SYMBOLIZE_DBGHELP_GUARD_WINDOWS_H_

#ifndef NOMINMAX
#define NOMINMAX
#endif
#include <windows.h>
// windows.h first: dbghelp.h uses its types.
#include <dbghelp.h>

#include <type_traits>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace inprof::internal {

// Serializes every DbgHelp call in the process that goes through inprof.
extern absl::Mutex g_dbghelp_mu;

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
const InlineApi& GetInlineApi();

// DbgHelp trusts the files it reads: Wine's DWARF reader follows offsets and
// lengths from .debug_* sections without checking them against the
// section, so a corrupt file whose headers are sound makes it read outside
// its mapping. Each DbgHelp call runs under a guard: a fault inside it
// returns to the guard (a vectored exception handler jumps back to where
// the guard started, abandoning DbgHelp's frames), and the caller then
// treats the session as poisoned: not called again, and leaked rather than
// cleaned up, as its state is whatever the fault left.
enum class Outcome { kOk, kFailed, kFaulted };

// Runs `call(arg)`, a DbgHelp call that writes its results through `arg`.
// No object with a destructor may live in the frames it abandons on a
// fault: `call` only passes plain data to DbgHelp.
Outcome RunGuarded(bool (*call)(void*), void* arg)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_dbghelp_mu);

// RunGuarded for a lambda returning bool (capturing plain data by
// reference).
template <typename Call>
Outcome Guarded(Call&& call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_dbghelp_mu) {
  using C = std::remove_reference_t<Call>;
  return RunGuarded([](void* c) -> bool { return (*static_cast<C*>(c))(); },
                    &call);
}

}  // namespace inprof::internal

#endif  // INPROF_SRC_SYMBOLIZE_DBGHELP_GUARD_WINDOWS_H_
