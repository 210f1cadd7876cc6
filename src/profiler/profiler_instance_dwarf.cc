// The library's instance of DwarfProfiler (inprof/inprof.h declares it
// extern): compiled here once, not in every source of a program that uses
// it. One composition per source, so that the two build in parallel (one
// source with both took 41 s under ASan, the library's longest).
#include "inprof/inprof.h"

namespace inprof {

template class Profiler<DwarfUnwinder, DefaultSampleRing, CpuTimeProvider,
                        WallTimeProvider, AllocationProvider, LockWaitProvider>;

}  // namespace inprof
