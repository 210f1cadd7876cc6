// internal: not part of the public API.
//
// gperftools' variables (CPUPROFILE, CPUPROFILE_FREQUENCY, CPUPROFILESIGNAL,
// HEAPPROFILE)
// on inprof's automatic profiler: read by `inprof run's preload and by the
// gperftools drop-in (src/gperftools/profiler_api.cc).
#ifndef INPROF_GPERFTOOLS_GPERFTOOLS_ENV_H_
#define INPROF_GPERFTOOLS_GPERFTOOLS_ENV_H_

#include <string>

#include "inprof/options.h"

namespace inprof::gperftools {

// gperftools profiles CPU only, and its ITIMER_PROF never signals a thread
// that is blocked: unless INPROF_WALL_PERIOD asks for wall time, the
// drop-in samples CPU time only, so that a program moved from gperftools
// sees no new EINTRs from its blocking calls.
void ApplyGperftoolsDefaults(Options& options);

// When CPUPROFILE is set: points `options` at it (one profile per run) with
// the period of CPUPROFILE_FREQUENCY, and returns true.
bool ApplyEnvironment(Options& options);

// When CPUPROFILE is set: initialises the automatic profiler and starts it
// now, or on CPUPROFILESIGNAL; returns true. False (nothing done) otherwise.
bool StartFromEnvironment(Options options, const std::string& report,
                          bool children);

// When HEAPPROFILE is set and INPROF_ALLOC_PERIOD is not: allocations are
// sampled every 512 KiB on average. Before run::Init.
void ApplyHeapProfileDefaults(Options& options);

// When HEAPPROFILE is set: HeapProfilerStart(HEAPPROFILE), and a dump at
// exit. After run::Init (and the CPU profile's start, if any).
void StartHeapFromEnvironment();

}  // namespace inprof::gperftools

#endif  // INPROF_GPERFTOOLS_GPERFTOOLS_ENV_H_
