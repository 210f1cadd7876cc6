// inprof/inprof.h: everything an application needs, and the recommended
// compositions.
//
//   inprof::DefaultProfiler   frame-pointer unwinding, CPU- and wall-time sampling.
//   inprof::DwarfProfiler     the same with CFI (.eh_frame) unwinding.
//
// Example:
//   #include <inprof/inprof.h>
//   int main() {
//     inprof::DefaultProfiler profiler(inprof::Options::FromEnv());
//     inprof::ScopedProfiler running(profiler);
//     auto self = profiler.RegisterThread("main");
//     Work();
//   }   // the profile is written to $INPROF_OUTPUT (inprof.pb.gz)
#ifndef INPROF_INPROF_H_
#define INPROF_INPROF_H_

#include "inprof/cpu_time_provider.h"
#include "inprof/dwarf_unwinder.h"
#include "inprof/frame_pointer_unwinder.h"
#include "inprof/labels.h"
#include "inprof/options.h"
#include "inprof/profiler.h"
#include "inprof/spsc_ring.h"
#include "inprof/wall_time_provider.h"

namespace inprof {

// The recommended composition: frame-pointer unwinding (build the profiled
// code with -fno-omit-frame-pointer, which the inprof pkg-config file adds),
// a 32 KiB ring per thread, per-thread CPU-time and wall-time sampling.
using DefaultProfiler = Profiler<FramePointerUnwinder, DefaultSampleRing,
                                 CpuTimeProvider, WallTimeProvider>;

// DefaultProfiler with CFI unwinding: complete stacks through code built
// without frame pointers (system libraries, -fomit-frame-pointer builds).
using DwarfProfiler = Profiler<DwarfUnwinder, DefaultSampleRing,
                               CpuTimeProvider, WallTimeProvider>;

}  // namespace inprof

#endif  // INPROF_INPROF_H_
