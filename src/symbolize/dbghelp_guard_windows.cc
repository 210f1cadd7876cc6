// src/symbolize/dbghelp_guard_windows.cc: see dbghelp_guard_windows.h.
#include "src/symbolize/dbghelp_guard_windows.h"

#include <csignal>

namespace inprof::internal {

ABSL_CONST_INIT absl::Mutex g_dbghelp_mu(absl::kConstInit);

namespace {

template <typename F>
void GetProc(HMODULE module, const char* name, F* f) {
  // Through void (*)(): GCC's -Wcast-function-type accepts that one.
  *f = reinterpret_cast<F>(
      reinterpret_cast<void (*)()>(GetProcAddress(module, name)));
}

}  // namespace

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

namespace {

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

}  // namespace

__attribute__((noinline)) Outcome RunGuarded(bool (*call)(void*), void* arg) {
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

}  // namespace inprof::internal
