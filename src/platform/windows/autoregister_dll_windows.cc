// inprof_autoregister.dll: automatic thread tracking on Windows, for
// programs that cannot call RegisterThread (dd-win-prof's dllmain.cpp; the
// Windows counterpart of `inprof run`'s preload library on Linux).
//
// A program that links this DLL (or loads it) is profiled with
// inprof::DefaultProfiler and the INPROF_* variables of its environment:
// the profiler starts when the DLL is loaded, every thread registers on
// DLL_THREAD_ATTACH under its description (SetThreadDescription; read again
// as it changes) and unregisters on DLL_THREAD_DETACH, and the profile is
// written when the program calls exit() (returning from main does), before
// Windows ends its other threads. A program that ends otherwise
// (ExitProcess, TerminateProcess) writes no profile: the profiler's threads
// are gone by the time the DLL hears of it, and a lock one of them held
// would hang the exit. InprofStop() writes it on demand.
//
// Link with `-linprof_autoregister -Wl,-u,InprofStop` (pkg-config
// inprof-autoregister): a program that uses no symbol of a DLL does not
// import it.
//
// inprof's own threads (sampler, collector, exporter) start at one address
// of inprof's (base/profiler_thread.h) and are never registered, so
// never sampled.
//
// What runs under the loader lock (DllMain) never waits for another
// thread: registration takes only the profiler's registry lock, which no
// holder of keeps while taking the loader lock (profiler_windows.h). The DLL
// pins itself: unloading it would have to join the profiler's threads from
// DllMain, which deadlocks.
#include <windows.h>

#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "inprof/inprof.h"
#include "inprof/base/log.h"
#include "inprof/base/platform.h"
#include "inprof/base/profiler_thread.h"

namespace {

DWORD g_tls = TLS_OUT_OF_INDEXES;
inprof::DefaultProfiler* g_profiler = nullptr;  // never deleted: see above
bool g_started = false;

// Where the calling thread started (ThreadQuerySetWin32StartAddress).
uintptr_t ThreadStartAddress() {
  using QueryFn = LONG(NTAPI*)(HANDLE, int, PVOID, ULONG, PULONG);
  static const QueryFn query = reinterpret_cast<QueryFn>(reinterpret_cast<void*>(
      GetProcAddress(GetModuleHandleA("ntdll.dll"), "NtQueryInformationThread")));
  uintptr_t start = 0;
  constexpr int kThreadQuerySetWin32StartAddress = 9;
  if (query == nullptr ||
      query(GetCurrentThread(), kThreadQuerySetWin32StartAddress, &start, sizeof(start),
            nullptr) != 0) {
    return 0;
  }
  return start;
}

void RegisterCurrentThread() {
  if (g_profiler == nullptr || g_tls == TLS_OUT_OF_INDEXES) return;
  // inprof's own threads (sampler, collector, exporter) are never sampled.
  if (ThreadStartAddress() == inprof::internal::ProfilerThreadStartAddress()) return;
  if (TlsGetValue(g_tls) != nullptr) return;
  // No name: the thread's description, read now and again later (a thread
  // usually names itself after it started).
  auto* registration = new inprof::ThreadRegistration(g_profiler->RegisterThread(""));
  TlsSetValue(g_tls, registration);
}

void UnregisterCurrentThread() {
  if (g_tls == TLS_OUT_OF_INDEXES) return;
  auto* registration = static_cast<inprof::ThreadRegistration*>(TlsGetValue(g_tls));
  if (registration == nullptr) return;
  TlsSetValue(g_tls, nullptr);
  delete registration;
}

void StopProfiler() {
  if (g_profiler == nullptr || !g_started) return;
  g_started = false;
  g_profiler->Stop().IgnoreError();  // logged by Stop()
}

// Run by the C runtime's exit(), before ExitProcess ends the other threads.
void __cdecl StopAtExit() { StopProfiler(); }

// Whether the program (the .exe) imports a DLL whose name starts with
// `prefix` (case-insensitive).
bool ProgramImports(const char* prefix) {
  auto* base = reinterpret_cast<const uint8_t*>(GetModuleHandleA(nullptr));
  const auto* dos = reinterpret_cast<const IMAGE_DOS_HEADER*>(base);
  const auto* nt = reinterpret_cast<const IMAGE_NT_HEADERS*>(base + dos->e_lfanew);
  const IMAGE_DATA_DIRECTORY& dir =
      nt->OptionalHeader.DataDirectory[IMAGE_DIRECTORY_ENTRY_IMPORT];
  if (dir.VirtualAddress == 0) return false;
  for (const auto* import = reinterpret_cast<const IMAGE_IMPORT_DESCRIPTOR*>(
           base + dir.VirtualAddress);
       import->Name != 0; ++import) {
    const char* name = reinterpret_cast<const char*>(base + import->Name);
    if (_strnicmp(name, prefix, strlen(prefix)) == 0) return true;
  }
  return false;
}

// exit()'s list is the one of the C runtime the program uses (msvcrt, or
// the Universal CRT): a DLL's own atexit() runs at DLL_PROCESS_DETACH,
// after the other threads are gone, and another runtime's list never runs.
void RegisterStopAtExit() {
  using AtExitFn = int(__cdecl*)(void(__cdecl*)());
  const bool ucrt = ProgramImports("ucrtbase") || ProgramImports("api-ms-win-crt-");
  const char* crt = ucrt ? "ucrtbase.dll" : "msvcrt.dll";
  HMODULE module = GetModuleHandleA(crt);
  auto fn = module == nullptr ? nullptr
                              : reinterpret_cast<AtExitFn>(reinterpret_cast<void*>(
                                    GetProcAddress(module, ucrt ? "_crt_atexit" : "atexit")));
  if (fn != nullptr && fn(&StopAtExit) == 0) return;
  inprof::internal::Log(absl::StrCat("inprof_autoregister.dll: cannot hook ", crt,
                                     "'s exit(); call InprofStop() to write the profile"));
}

void OnProcessAttach(HMODULE self) {
  HMODULE pinned = nullptr;
  GetModuleHandleExA(GET_MODULE_HANDLE_EX_FLAG_FROM_ADDRESS | GET_MODULE_HANDLE_EX_FLAG_PIN,
                     reinterpret_cast<LPCSTR>(self), &pinned);
  inprof::Options options = inprof::Options::FromEnv();
  if (!options.enabled) return;
  g_tls = TlsAlloc();
  if (g_tls == TLS_OUT_OF_INDEXES) {
    inprof::internal::Log("inprof_autoregister.dll: TlsAlloc failed; not profiling");
    return;
  }
  g_profiler = new inprof::DefaultProfiler(std::move(options));
  RegisterCurrentThread();  // the thread loading the DLL: main, at start-up
  const absl::Status status = g_profiler->Start();
  if (!status.ok()) {
    inprof::internal::Log(absl::StrCat("profiler not started: ", status.message()));
    return;
  }
  g_started = true;
  RegisterStopAtExit();
}

}  // namespace

// Writes the profile now and stops profiling (idempotent). For programs that
// end without exit().
extern "C" __declspec(dllexport) void InprofStop() { StopProfiler(); }

extern "C" BOOL WINAPI DllMain(HINSTANCE instance, DWORD reason, LPVOID /*reserved*/) {
  switch (reason) {
    case DLL_PROCESS_ATTACH:
      OnProcessAttach(instance);
      break;
    case DLL_THREAD_ATTACH:
      RegisterCurrentThread();
      break;
    case DLL_THREAD_DETACH:
      UnregisterCurrentThread();
      break;
    case DLL_PROCESS_DETACH:
      // exit() stopped the profiler already; after ExitProcess nothing
      // here is safe to touch (see the top of the file).
      break;
  }
  return TRUE;
}
