// A Windows program that knows nothing of inprof but is linked with
// inprof_autoregister.dll: its threads are profiled anyway
// (autoregister_windows_test.cc runs it).
#include <windows.h>

#include <cstdint>
#include <thread>

namespace {

int64_t ThreadCpuNanos() {
  FILETIME created, exited, kernel, user;
  GetThreadTimes(GetCurrentThread(), &created, &exited, &kernel, &user);
  auto ns = [](const FILETIME& f) {
    return static_cast<int64_t>((static_cast<uint64_t>(f.dwHighDateTime) << 32) |
                                f.dwLowDateTime) * 100;
  };
  return ns(kernel) + ns(user);
}

volatile uint64_t g_sink;

__attribute__((noinline)) void Spin(int64_t cpu_ns, uint64_t salt) {
  const int64_t until = ThreadCpuNanos() + cpu_ns;
  uint64_t x = salt;
  do {
    for (int i = 0; i < 1000000; ++i) x = x * 6364136223846793005ULL + i;
    g_sink = x;
  } while (ThreadCpuNanos() < until);
}

// The writes after each call keep them from being tail calls, which would
// leave no frame of theirs on the stack.
__attribute__((noinline)) void AutoBurnNamed() {
  Spin(300'000'000, 1);
  g_sink = g_sink + 1;
}
__attribute__((noinline)) void AutoBurnRaw() {
  Spin(200'000'000, 2);
  g_sink = g_sink + 2;
}
__attribute__((noinline)) void AutoBurnMain() {
  Spin(100'000'000, 3);
  g_sink = g_sink + 3;
}

DWORD WINAPI RawThread(void*) {
  AutoBurnRaw();
  return 0;
}

}  // namespace

int main() {
  using SetDescription = HRESULT(WINAPI*)(HANDLE, PCWSTR);
  auto set_description = reinterpret_cast<SetDescription>(reinterpret_cast<void*>(
      GetProcAddress(GetModuleHandleA("kernelbase.dll"), "SetThreadDescription")));
  std::thread named([&] {
    if (set_description != nullptr) set_description(GetCurrentThread(), L"named-worker");
    AutoBurnNamed();
  });
  HANDLE raw = CreateThread(nullptr, 0, &RawThread, nullptr, 0, nullptr);
  AutoBurnMain();
  named.join();
  WaitForSingleObject(raw, INFINITE);
  CloseHandle(raw);
  return 0;  // exit(): the DLL writes the profile
}
