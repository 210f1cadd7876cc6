// inprof/inprof.h: everything an application needs, and the recommended
// compositions.
//
//   inprof::DefaultProfiler       CPU- and wall-time sampling, CFI (.eh_frame)
//                                 unwinding on x86-64, frame pointers elsewhere.
//   inprof::DwarfProfiler         the same, always with CFI unwinding.
//   inprof::FramePointerProfiler  the same, always with frame-pointer unwinding.
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

#include <type_traits>

#if defined(_WIN32)
#include "inprof/labels.h"
#include "inprof/options.h"
#include "inprof/profiler.h"
#include "inprof/spsc_ring.h"
#include "inprof/windows/cpu_time_provider_windows.h"
#include "inprof/windows/os_unwinder_windows.h"
#include "inprof/windows/wall_time_provider_windows.h"

namespace inprof {

// Windows x64 (dd-win-prof's design): the OS's own unwinder over each
// module's unwind information, which every x64 compiler emits, so stacks
// are complete with or without frame pointers; CPU time from the threads'
// clocks, wall time from the sampler's visits.
using DefaultUnwinder = OsUnwinder;
using DefaultProfiler = Profiler<DefaultUnwinder, DefaultSampleRing,
                                 CpuTimeProvider, WallTimeProvider>;
// On Windows the unwind information is the CFI: the same composition.
using DwarfProfiler = DefaultProfiler;

}  // namespace inprof

#else
#include "inprof/cpu_time_provider.h"
#include "inprof/dwarf_unwinder.h"
#include "inprof/frame_pointer_unwinder.h"
#include "inprof/heap/allocation_provider.h"
#include "inprof/labels.h"
#include "inprof/locks/lock_wait_provider.h"
#include "inprof/options.h"
#include "inprof/profiler.h"
#include "inprof/spsc_ring.h"
#include "inprof/wall_time_provider.h"

namespace inprof {

// The unwinder of DefaultProfiler, chosen by measurement
// (docs/measurements.md, "Which unwinder"): CFI on x86-64 Linux, where
// Debian's and most vendors' libraries have no frame pointers and a
// frame-pointer walk loses every caller above them, for at most ~1 us more
// per sample; frame pointers elsewhere.
using DefaultUnwinder =
    std::conditional_t<DwarfUnwinder::Supported(), DwarfUnwinder,
                       FramePointerUnwinder>;

// The recommended composition: the default unwinder, a 32 KiB ring per
// thread, per-thread CPU-time and wall-time sampling, and sampled
// allocation and live-heap profiling (AllocationProvider), which is off
// unless INPROF_ALLOC_PERIOD (Options::alloc_period) is set: off, it patches
// nothing and costs nothing on an allocation (README, "Where memory goes",
// says why it is not on by default), and lock waits (LockWaitProvider),
// off unless INPROF_LOCK_PERIOD (Options::lock_period) is set.
using DefaultProfiler = Profiler<DefaultUnwinder, DefaultSampleRing,
                                 CpuTimeProvider, WallTimeProvider,
                                 AllocationProvider, LockWaitProvider>;

// The same with CFI (.eh_frame) unwinding on every architecture it supports:
// complete stacks through code built without frame pointers.
using DwarfProfiler = Profiler<DwarfUnwinder, DefaultSampleRing,
                               CpuTimeProvider, WallTimeProvider,
                               AllocationProvider, LockWaitProvider>;

// The same with frame-pointer unwinding: the cheapest walk (no tables, no
// work at Start()), complete only through code built with
// -fno-omit-frame-pointer (which the inprof pkg-config file adds); callers of
// leaves without a frame record are put back from .eh_frame by the collector.
using FramePointerProfiler = Profiler<FramePointerUnwinder, DefaultSampleRing,
                                      CpuTimeProvider, WallTimeProvider,
                                      AllocationProvider, LockWaitProvider>;

// Both compositions are compiled once, in the library
// (src/profiler/profiler_instance_dwarf.cc and _frame_pointer.cc): a program's
// sources that use them instantiate nothing of Profiler's out of their own (11% of a test
// source under ASan, docs/test_command.md). Other compositions are
// instantiated where they are used, as templates are.
extern template class Profiler<DwarfUnwinder, DefaultSampleRing, CpuTimeProvider,
                               WallTimeProvider, AllocationProvider, LockWaitProvider>;
extern template class Profiler<FramePointerUnwinder, DefaultSampleRing,
                               CpuTimeProvider, WallTimeProvider,
                               AllocationProvider, LockWaitProvider>;

}  // namespace inprof

#endif  // !_WIN32

#endif  // INPROF_INPROF_H_
