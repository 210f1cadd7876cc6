// The Windows registry's view of a thread (thread_slot_windows.h): its id,
// a handle to suspend and time it, its stack, its description.
#include <windows.h>

#include <atomic>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "inprof/base/platform.h"
#include "inprof/internal/thread_slot_windows.h"

namespace inprof::internal {
namespace {

thread_local ThreadSlotHeader* tls_slot = nullptr;

// GetThreadDescription exists from Windows 10 1607 on: looked up, not linked.
using GetThreadDescriptionFn = HRESULT(WINAPI*)(HANDLE, PWSTR*);
GetThreadDescriptionFn LookupGetThreadDescription() {
  for (const char* dll : {"kernelbase.dll", "kernel32.dll"}) {
    if (HMODULE m = GetModuleHandleA(dll)) {
      if (FARPROC f = GetProcAddress(m, "GetThreadDescription")) {
        return reinterpret_cast<GetThreadDescriptionFn>(reinterpret_cast<void*>(f));
      }
    }
  }
  return nullptr;
}

}  // namespace

ThreadSlotHeader* CurrentThreadSlot() noexcept { return tls_slot; }
void SetCurrentThreadSlot(ThreadSlotHeader* slot) noexcept { tls_slot = slot; }

uint64_t NewSessionId() noexcept {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1);
}

uint32_t CurrentTid() noexcept { return GetCurrentThreadId(); }

absl::StatusOr<CurrentThreadInfo> DescribeCurrentThread() {
  CurrentThreadInfo info;
  info.tid = GetCurrentThreadId();
  HANDLE handle = OpenThread(THREAD_SUSPEND_RESUME | THREAD_GET_CONTEXT |
                                 THREAD_QUERY_INFORMATION,
                             FALSE, info.tid);
  if (handle == nullptr) {
    return absl::PermissionDeniedError(absl::StrCat(
        "OpenThread(", info.tid, "): ", SystemErrorText(GetLastError())));
  }
  ULONG_PTR lo = 0, hi = 0;
  GetCurrentThreadStackLimits(&lo, &hi);
  info.handle = handle;
  info.stack = StackBounds{static_cast<uintptr_t>(lo), static_cast<uintptr_t>(hi)};
  return info;
}

void CloseThreadHandle(void* handle) noexcept {
  if (handle != nullptr) CloseHandle(static_cast<HANDLE>(handle));
}

std::string ThreadDescription(void* handle) {
  static const GetThreadDescriptionFn get = LookupGetThreadDescription();
  if (get == nullptr || handle == nullptr) return "";
  PWSTR wide = nullptr;
  if (FAILED(get(static_cast<HANDLE>(handle), &wide)) || wide == nullptr) return "";
  const int n = WideCharToMultiByte(CP_UTF8, 0, wide, -1, nullptr, 0, nullptr, nullptr);
  std::string name;
  if (n > 1) {
    name.resize(static_cast<size_t>(n - 1));
    WideCharToMultiByte(CP_UTF8, 0, wide, -1, name.data(), n, nullptr, nullptr);
  }
  LocalFree(wide);
  return name;
}

}  // namespace inprof::internal
