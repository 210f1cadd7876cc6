// tests/windows/windows_workload.h: CPU work in known functions for the
// Windows suite, compiled without frame pointers (windows_workload.cc) so
// that complete stacks prove the unwinder reads unwind information.
#ifndef INPROF_TESTS_WINDOWS_WINDOWS_WORKLOAD_H_
#define INPROF_TESTS_WINDOWS_WINDOWS_WORKLOAD_H_

#include <cstdint>

namespace inprof::testing {

// The calling thread's CPU time (GetThreadTimes), in nanoseconds.
int64_t ThreadCpuNanos();

// Each spins until the calling thread has used `cpu_ns` more CPU, through
// WorkloadOuter -> WorkloadMiddle -> WorkloadInner -> the Burn function.
void BurnA(int64_t cpu_ns);
void BurnB(int64_t cpu_ns);
void BurnC(int64_t cpu_ns);
// Recurses `depth` frames of WorkloadRecurse, then burns in BurnA.
void BurnDeep(int depth, int64_t cpu_ns);

}  // namespace inprof::testing

#endif  // INPROF_TESTS_WINDOWS_WINDOWS_WORKLOAD_H_
