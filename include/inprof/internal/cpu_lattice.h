// internal: not part of the public API.
//
// The sample points of a thread's CPU time: a lattice of one period whose
// phase is drawn uniformly for each thread, as Go's runtime draws each
// thread's first CPU-timer expiry (runtime/os_linux.go,
// setThreadCPUProfiler). A sample is worth one period for each lattice
// point the thread's CPU clock crossed since the previous sample, so
//   - a thread that uses a tenth of a period has a one-in-ten chance of one
//     sample worth a full period: its expected CPU in the profile is its CPU,
//     however short it lives, and no stack is favoured by where it falls in
//     a thread's life;
//   - a late signal (a loaded machine, a timer that fires at scheduler ticks,
//     a signal the kernel coalesced with another) loses nothing: the next
//     sample counts every point crossed meanwhile;
//   - a thread's CPU in the profile differs from its clock by less than one
//     period, and the difference has mean zero.
//
// Plain integers: platform-free, shared by the Linux engines (whose handler
// calls it, async-signal-safely) and the Windows sampler.
#ifndef INPROF_INTERNAL_CPU_LATTICE_H_
#define INPROF_INTERNAL_CPU_LATTICE_H_

#include <cstdint>

namespace inprof::internal {

// The number of lattice points in (..., now] not yet taken, given the next
// one `*next_due` and the spacing `period` (> 0); advances `*next_due` past
// `now`. 0 while now < *next_due. Async-signal-safe.
inline int64_t TakeLatticePoints(int64_t now, int64_t* next_due,
                                 int64_t period) noexcept {
  if (now < *next_due) return 0;
  const int64_t points = (now - *next_due) / period + 1;
  *next_due += points * period;
  return points;
}

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_CPU_LATTICE_H_
