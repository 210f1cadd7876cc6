// The library's instance of FramePointerProfiler (inprof/inprof.h declares
// it extern); see profiler_instance_dwarf.cc.
#include "inprof/inprof.h"

namespace inprof {

template class Profiler<FramePointerUnwinder, DefaultSampleRing, CpuTimeProvider,
                        WallTimeProvider, AllocationProvider, LockWaitProvider>;

}  // namespace inprof
