// The Windows variant of base/platform.h (WriteFileAtomically included).
#include <windows.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "inprof/base/platform.h"
#include "inprof/base/profiler_thread.h"

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

namespace {

// How long a write into a pipe may wait for its reader to take more bytes
// (as on Linux): the exporter thread must never wait without a limit.
constexpr DWORD kOutputStallMs = 10'000;

// Writes all of `bytes` to `file`, a pipe opened with FILE_FLAG_OVERLAPPED,
// waiting at most kOutputStallMs for each chunk.
absl::Status WriteToPipeBounded(HANDLE file, absl::string_view bytes,
                                const std::string& path) {
  HANDLE event = CreateEventA(nullptr, TRUE, FALSE, nullptr);
  if (event == nullptr) {
    return internal::WindowsError(GetLastError(),
                                  absl::StrCat("cannot write '", path, "'"));
  }
  absl::Status status;
  size_t done = 0;
  while (done < bytes.size() && status.ok()) {
    const DWORD chunk =
        static_cast<DWORD>(std::min<size_t>(bytes.size() - done, size_t{1} << 20));
    OVERLAPPED ov = {};
    ov.hEvent = event;
    ResetEvent(event);
    DWORD written = 0;
    if (!WriteFile(file, bytes.data() + done, chunk, nullptr, &ov) &&
        GetLastError() != ERROR_IO_PENDING) {
      status = internal::WindowsError(GetLastError(),
                                      absl::StrCat("cannot write '", path, "'"));
      break;
    }
    if (WaitForSingleObject(event, kOutputStallMs) == WAIT_TIMEOUT) {
      CancelIo(file);
      GetOverlappedResult(file, &ov, &written, TRUE);
      status = absl::DeadlineExceededError(absl::StrCat(
          "'", path, "': its reader took nothing for ", kOutputStallMs / 1000,
          " s; gave up after ", done + written, " of ", bytes.size(), " bytes"));
      break;
    }
    if (!GetOverlappedResult(file, &ov, &written, FALSE) || written == 0) {
      status = internal::WindowsError(GetLastError(),
                                      absl::StrCat("cannot write '", path, "'"));
      break;
    }
    done += written;
  }
  CloseHandle(event);
  return status;
}

// Writes all of `bytes` to `file` (a character device such as NUL or CON).
absl::Status WriteAll(HANDLE file, absl::string_view bytes, const std::string& path,
                      const std::string& what) {
  size_t done = 0;
  while (done < bytes.size()) {
    const DWORD chunk =
        static_cast<DWORD>(std::min<size_t>(bytes.size() - done, size_t{1} << 30));
    DWORD written = 0;
    if (!WriteFile(file, bytes.data() + done, chunk, &written, nullptr) || written == 0) {
      return internal::WindowsError(
          GetLastError(), absl::StrCat("cannot write '", what, "' for '", path, "'"));
    }
    done += written;
  }
  return absl::OkStatus();
}

// An unguessable temporary name next to `path` (see the Linux variant).
std::string TemporaryName(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  LARGE_INTEGER now = {};
  QueryPerformanceCounter(&now);
  const uint64_t mixed = (static_cast<uint64_t>(now.QuadPart) ^
                          (reinterpret_cast<uintptr_t>(&counter) << 16)) *
                         0x9e3779b97f4a7c15ull;
  return absl::StrCat(path, ".tmp.", GetCurrentProcessId(), ".", counter.fetch_add(1),
                      ".", absl::Hex(mixed, absl::kZeroPad16));
}

}  // namespace

absl::Status WriteFileAtomically(const std::string& path, absl::string_view bytes) {
  if (path.empty()) return absl::InvalidArgumentError("empty output path");
  // What is at `path` now. A link or junction is neither followed nor
  // replaced, a directory refused; a device (NUL, CON) or a named pipe is
  // written into as what it is.
  const DWORD attributes = GetFileAttributesA(path.c_str());
  if (attributes != INVALID_FILE_ATTRIBUTES) {
    if ((attributes & FILE_ATTRIBUTE_REPARSE_POINT) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "'", path, "' is a symbolic link or junction; inprof writes neither "
          "through nor over a link: not written (name the file itself)"));
    }
    if ((attributes & FILE_ATTRIBUTE_DIRECTORY) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("'", path, "' is a directory, not a regular file; not written"));
    }
  }
  HANDLE existing = CreateFileA(path.c_str(), GENERIC_WRITE,
                                FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE,
                                nullptr, OPEN_EXISTING,
                                FILE_FLAG_OPEN_REPARSE_POINT | FILE_FLAG_OVERLAPPED, nullptr);
  if (existing != INVALID_HANDLE_VALUE) {
    const DWORD type = GetFileType(existing);
    if (type == FILE_TYPE_PIPE) {
      absl::Status status = WriteToPipeBounded(existing, bytes, path);
      CloseHandle(existing);
      return status;
    }
    CloseHandle(existing);
    if (type == FILE_TYPE_CHAR) {
      // Character devices do not stall; written synchronously.
      HANDLE device = CreateFileA(path.c_str(), GENERIC_WRITE,
                                  FILE_SHARE_READ | FILE_SHARE_WRITE, nullptr,
                                  OPEN_EXISTING, 0, nullptr);
      if (device == INVALID_HANDLE_VALUE) {
        return internal::WindowsError(GetLastError(),
                                      absl::StrCat("cannot open '", path, "'"));
      }
      absl::Status status = WriteAll(device, bytes, path, path);
      CloseHandle(device);
      return status;
    }
    if (type != FILE_TYPE_DISK) {
      return absl::FailedPreconditionError(
          absl::StrCat("'", path, "' is not a regular file; not written"));
    }
  }
  // Same directory as `path`, so that the replacement is a rename.
  // CREATE_NEW: never opens what someone planted under the temporary name.
  std::string tmp;
  HANDLE file = INVALID_HANDLE_VALUE;
  for (int attempt = 0; attempt < 16 && file == INVALID_HANDLE_VALUE; ++attempt) {
    tmp = TemporaryName(path);
    file = CreateFileA(tmp.c_str(), GENERIC_WRITE, 0, nullptr, CREATE_NEW,
                       FILE_ATTRIBUTE_NORMAL, nullptr);
    if (file == INVALID_HANDLE_VALUE && GetLastError() != ERROR_FILE_EXISTS) break;
  }
  if (file == INVALID_HANDLE_VALUE) {
    return internal::WindowsError(
        GetLastError(), absl::StrCat("cannot write '", path, "' (creating '", tmp, "')"));
  }
  if (absl::Status written = WriteAll(file, bytes, path, tmp); !written.ok()) {
    CloseHandle(file);
    DeleteFileA(tmp.c_str());
    return written;
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
