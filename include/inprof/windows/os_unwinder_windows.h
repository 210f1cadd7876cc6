// inprof/windows/os_unwinder_windows.h: OsUnwinder, Windows x64's own
// unwinder over a stack snapshot.
//
// Walks a thread's stack the way Windows does for exceptions: each frame's
// function is found with RtlLookupFunctionEntry in its module's unwind
// information (.pdata/.xdata, which every x64 compiler emits for every
// function that calls another, with or without frame pointers), and
// RtlVirtualUnwind restores the caller's registers. So stacks are complete
// through code built without frame pointers, as DwarfUnwinder's are on
// Linux. It walks the copy internal::ThreadSnapshotter made while the thread
// was suspended, after the thread was resumed (thread_snapshot_windows.h
// says why), and never reads outside that copy's stack words: a walk that
// would is stopped and marked truncated.
//
// Thread-safety: Unwind() may run on any thread but the sampled one; it
// may take the loader's locks (RtlLookupFunctionEntry), so never while a
// thread is suspended. Not async-signal-safe (Windows has no signals).
//
// Example:
//   inprof::OsUnwinder unwinder;
//   uintptr_t pcs[512];
//   inprof::UnwindResult r = unwinder.Unwind(snapshotter.snapshot(), bounds, pcs);
#ifndef INPROF_WINDOWS_OS_UNWINDER_WINDOWS_H_
#define INPROF_WINDOWS_OS_UNWINDER_WINDOWS_H_

#include <cstdint>
#include <span>

#include "inprof/unwinder.h"

namespace inprof {

class OsUnwinder {
 public:
  static constexpr const char* kName = "windows-unwind-info";
  static constexpr bool Supported() { return true; }

  // `snapshot` is ThreadSnapshotter::snapshot(). Writes the interrupted pc,
  // then return addresses. Truncated when the walk met a frame it cannot
  // step (a return address outside any module's unwind information, a
  // frame that leaves the copied stack) or `out` was full.
  UnwindResult Unwind(const void* snapshot, const StackBounds& bounds,
                      std::span<uintptr_t> out) const noexcept;
};
static_assert(Unwinder<OsUnwinder>);

}  // namespace inprof

#endif  // INPROF_WINDOWS_OS_UNWINDER_WINDOWS_H_
