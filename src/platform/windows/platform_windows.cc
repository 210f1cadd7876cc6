// The Windows variant of internal/platform.h (and sink.h's WriteFileAtomically).
#include <windows.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "inprof/internal/platform.h"
#include "inprof/internal/profiler_thread.h"
#include "inprof/sink.h"

namespace inprof {
namespace internal {

std::string SystemErrorText(uint32_t error) {
  char buf[256] = {};
  const DWORD n = FormatMessageA(FORMAT_MESSAGE_FROM_SYSTEM | FORMAT_MESSAGE_IGNORE_INSERTS,
                                 nullptr, error, 0, buf, sizeof(buf), nullptr);
  std::string text(buf, n);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == '.')) {
    text.pop_back();
  }
  return absl::StrCat(text.empty() ? "error" : text, " (Windows error ", error, ")");
}

namespace {

absl::Status WindowsError(DWORD error, absl::string_view what) {
  const absl::StatusCode code =
      error == ERROR_FILE_NOT_FOUND || error == ERROR_PATH_NOT_FOUND ? absl::StatusCode::kNotFound
      : error == ERROR_ACCESS_DENIED ? absl::StatusCode::kPermissionDenied
                                     : absl::StatusCode::kUnavailable;
  return absl::Status(code, absl::StrCat(what, ": ", SystemErrorText(error)));
}

}  // namespace

std::string ProgramName() {
  char path[MAX_PATH] = {};
  const DWORD n = GetModuleFileNameA(nullptr, path, sizeof(path));
  std::string name(path, n);
  const size_t slash = name.find_last_of("\\/");
  if (slash != std::string::npos) name.erase(0, slash + 1);
  if (name.size() > 4 && _stricmp(name.c_str() + name.size() - 4, ".exe") == 0) {
    name.resize(name.size() - 4);
  }
  return name.empty() ? "unknown" : name;
}

std::string HostName() {
  char buf[MAX_COMPUTERNAME_LENGTH + 1] = {};
  DWORD size = sizeof(buf);
  if (!GetComputerNameA(buf, &size) || size == 0) return "unknown";
  return std::string(buf, size);
}

int64_t ProcessId() { return GetCurrentProcessId(); }

void SetEnvVar(const char* name, const char* value) {
  // Both the C runtime's copy (getenv) and the process's (child processes).
  _putenv_s(name, value);
  SetEnvironmentVariableA(name, value);
}

void SetCurrentThreadName(const char* name) {
  using SetThreadDescriptionFn = HRESULT(WINAPI*)(HANDLE, PCWSTR);
  static const SetThreadDescriptionFn set = [] {
    for (const char* dll : {"kernelbase.dll", "kernel32.dll"}) {
      if (HMODULE m = GetModuleHandleA(dll)) {
        if (FARPROC f = GetProcAddress(m, "SetThreadDescription")) {
          return reinterpret_cast<SetThreadDescriptionFn>(reinterpret_cast<void*>(f));
        }
      }
    }
    return SetThreadDescriptionFn{nullptr};
  }();
  if (set == nullptr) return;
  wchar_t wide[64] = {};
  MultiByteToWideChar(CP_UTF8, 0, name, -1, wide, 63);
  set(GetCurrentThread(), wide);
}

namespace {

// Every ProfilerThread starts here.
DWORD WINAPI ProfilerThreadEntry(void* arg) {
  std::unique_ptr<std::function<void()>> body(static_cast<std::function<void()>*>(arg));
  (*body)();
  return 0;
}

}  // namespace

ProfilerThread::ProfilerThread(std::function<void()> body) {
  auto* heap_body = new std::function<void()>(std::move(body));
  handle_ = CreateThread(nullptr, 0, &ProfilerThreadEntry, heap_body, 0, nullptr);
  if (handle_ == nullptr) {
    delete heap_body;
    // As std::thread does when the OS refuses a thread.
    throw std::system_error(static_cast<int>(GetLastError()), std::system_category(),
                            "CreateThread");
  }
}

ProfilerThread::~ProfilerThread() {
  if (joinable()) join();
}

void ProfilerThread::join() {
  WaitForSingleObject(static_cast<HANDLE>(handle_), INFINITE);
  CloseHandle(static_cast<HANDLE>(handle_));
  handle_ = nullptr;
}

uintptr_t ProfilerThreadStartAddress() {
  return reinterpret_cast<uintptr_t>(&ProfilerThreadEntry);
}

}  // namespace internal

absl::Status WriteFileAtomically(const std::string& path, absl::string_view bytes) {
  // Same directory as `path`, so that the replacement is a rename. The
  // counter keeps two writers in one process apart.
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = absl::StrCat(path, ".tmp.", GetCurrentProcessId(), ".",
                                       counter.fetch_add(1));
  HANDLE file = CreateFileA(tmp.c_str(), GENERIC_WRITE, 0, nullptr, CREATE_NEW,
                            FILE_ATTRIBUTE_NORMAL, nullptr);
  if (file == INVALID_HANDLE_VALUE) {
    return internal::WindowsError(
        GetLastError(), absl::StrCat("cannot create '", tmp, "' to write '", path, "'"));
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const DWORD chunk =
        static_cast<DWORD>(std::min<size_t>(bytes.size() - done, size_t{1} << 30));
    DWORD written = 0;
    if (!WriteFile(file, bytes.data() + done, chunk, &written, nullptr) || written == 0) {
      const DWORD error = GetLastError();
      CloseHandle(file);
      DeleteFileA(tmp.c_str());
      return internal::WindowsError(
          error, absl::StrCat("cannot write '", tmp, "' for '", path, "'"));
    }
    done += written;
  }
  CloseHandle(file);
  // rename() does not replace an existing file on Windows; this does.
  if (!MoveFileExA(tmp.c_str(), path.c_str(), MOVEFILE_REPLACE_EXISTING)) {
    const DWORD error = GetLastError();
    DeleteFileA(tmp.c_str());
    return internal::WindowsError(
        error, absl::StrCat("cannot rename '", tmp, "' to '", path, "'"));
  }
  return absl::OkStatus();
}

}  // namespace inprof
