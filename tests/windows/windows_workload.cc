// Built with -fomit-frame-pointer (tests/windows/meson.build): no function
// here keeps a frame-pointer chain, so only the modules' unwind information
// leads a walk from the Burn functions back to the thread's start.
#include "windows_workload.h"

#include <windows.h>

namespace inprof::testing {
namespace {

volatile uint64_t g_sink;

enum class Which { kA, kB, kC };

// The spin itself: arithmetic, with the clock read every ~1M iterations
// (about 1 ms here): GetThreadTimes costs Wine tens of microseconds (a
// server call), which at every 50k iterations was half the CPU.
#define INPROF_BURN_BODY(salt)                                  \
  const int64_t until = ThreadCpuNanos() + cpu_ns;              \
  uint64_t x = salt;                                            \
  do {                                                          \
    for (int i = 0; i < 1000000; ++i) x = x * 6364136223846793005ULL + i; \
    g_sink = x;                                                 \
  } while (ThreadCpuNanos() < until);

__attribute__((noinline)) void SpinA(int64_t cpu_ns) { INPROF_BURN_BODY(1) }
__attribute__((noinline)) void SpinB(int64_t cpu_ns) { INPROF_BURN_BODY(2) }
__attribute__((noinline)) void SpinC(int64_t cpu_ns) { INPROF_BURN_BODY(3) }

// The volatile writes after each call keep the calls from being tail calls
// (a tail call leaves no frame to find).
__attribute__((noinline)) void WorkloadInner(Which which, int64_t cpu_ns) {
  switch (which) {
    case Which::kA: SpinA(cpu_ns); break;
    case Which::kB: SpinB(cpu_ns); break;
    case Which::kC: SpinC(cpu_ns); break;
  }
  g_sink = g_sink + 1;
}
__attribute__((noinline)) void WorkloadMiddle(Which which, int64_t cpu_ns) {
  WorkloadInner(which, cpu_ns);
  g_sink = g_sink + 2;
}
__attribute__((noinline)) void WorkloadOuter(Which which, int64_t cpu_ns) {
  WorkloadMiddle(which, cpu_ns);
  g_sink = g_sink + 3;
}

__attribute__((noinline)) void WorkloadRecurse(int depth, int64_t cpu_ns) {
  if (depth <= 0) {
    WorkloadOuter(Which::kA, cpu_ns);
    g_sink = g_sink + 4;
  } else {
    volatile char pad[64];  // a frame of some size
    pad[0] = static_cast<char>(depth);
    WorkloadRecurse(depth - 1, cpu_ns);
    g_sink = g_sink + pad[0];
  }
}

}  // namespace

int64_t ThreadCpuNanos() {
  FILETIME created, exited, kernel, user;
  GetThreadTimes(GetCurrentThread(), &created, &exited, &kernel, &user);
  auto ns = [](const FILETIME& f) {
    return static_cast<int64_t>((static_cast<uint64_t>(f.dwHighDateTime) << 32) |
                                f.dwLowDateTime) * 100;
  };
  return ns(kernel) + ns(user);
}

void BurnA(int64_t cpu_ns) { WorkloadOuter(Which::kA, cpu_ns); }
void BurnB(int64_t cpu_ns) { WorkloadOuter(Which::kB, cpu_ns); }
void BurnC(int64_t cpu_ns) { WorkloadOuter(Which::kC, cpu_ns); }
void BurnDeep(int depth, int64_t cpu_ns) { WorkloadRecurse(depth, cpu_ns); }

}  // namespace inprof::testing
