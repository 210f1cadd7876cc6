// internal: not part of the public API.
//
// The snapshot ThreadSnapshotter fills and OsUnwinder walks (both
// thread_snapshot_windows.h): the suspended thread's registers and a copy
// of its stack. Includes <windows.h>: for the two .cc files and tests.
#ifndef INPROF_INTERNAL_UNWIND_SNAPSHOT_WINDOWS_H_
#define INPROF_INTERNAL_UNWIND_SNAPSHOT_WINDOWS_H_

#include <windows.h>

#include <cstddef>
#include <cstdint>

namespace inprof::internal {

struct UnwindSnapshot {
  CONTEXT context;           // after RelocateStackPointers: into `copy`
  bool has_context = false;
  uint8_t* copy = nullptr;   // capacity + kGuardBytes readable bytes
  size_t capacity = 0;
  size_t size = 0;           // bytes copied; 0: registers only
  uint64_t original_sp = 0;  // where copy[0] was in the thread's stack

  // Readable, zeroed bytes after `capacity`: a frame that straddles the
  // end of a truncated copy reads zeros there, never unmapped memory.
  static constexpr size_t kGuardBytes = size_t{1} << 20;
};

// Makes the copy self-contained: every register and every aligned stack
// word holding an address inside [original_sp, original_sp + size) is moved
// by the copy's offset, so that an unwinder following saved frame pointers
// and stack pointers stays inside the copy.
void RelocateStackPointers(UnwindSnapshot& snapshot) noexcept;

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_UNWIND_SNAPSHOT_WINDOWS_H_
