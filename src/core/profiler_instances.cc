// The library's instances of the recommended compositions (inprof/inprof.h
// declares them extern): compiled here once, not in every source of a
// program that uses them.
#include "inprof/inprof.h"

namespace inprof {

template class Profiler<DwarfUnwinder, DefaultSampleRing, CpuTimeProvider,
                        WallTimeProvider>;
template class Profiler<FramePointerUnwinder, DefaultSampleRing, CpuTimeProvider,
                        WallTimeProvider>;

}  // namespace inprof
