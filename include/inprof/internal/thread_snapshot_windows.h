// internal: not part of the public API.
//
// What the Windows sampler takes of a thread while it is suspended: its
// registers and a copy of its stack. Nothing else runs while the thread is
// stopped (SuspendThread, GetThreadContext, a copy, ResumeThread): the
// thread may hold the heap lock, the loader lock or DbgHelp's lock, and
// walking a stack is not lock-free: RtlLookupFunctionEntry takes the
// loader's locks in Wine (LdrFindEntryForAddress, the dynamic function
// tables' critical section) and the inverted function table's lock on
// Windows. So the walk (os_unwinder_windows.h) runs on the copy, after the
// thread is resumed: the copy's words that point into the thread's stack
// are rewritten to point into the copy, so that frame pointers and saved
// registers lead the unwinder through the copy, never back to the live
// stack.
//
// Thread-safety: one snapshotter per sampler thread. Capture() allocates
// nothing and takes no lock.
//
// Example:
//   internal::ThreadSnapshotter snapshotter;           // allocates its buffer
//   if (snapshotter.Capture(handle, bounds) == internal::SnapshotOutcome::kOk) {
//     OsUnwinder().Unwind(snapshotter.snapshot(), bounds, frames);
//   }
#ifndef INPROF_INTERNAL_THREAD_SNAPSHOT_WINDOWS_H_
#define INPROF_INTERNAL_THREAD_SNAPSHOT_WINDOWS_H_

#include <cstddef>
#include <cstdint>

#include "inprof/unwinder.h"

namespace inprof::internal {

enum class SnapshotOutcome {
  kOk,             // registers and stack copied (all of it, or kMaxStackBytes)
  kNoStack,        // registers only: the stack pointer was outside the
                   // thread's registered stack (a fiber, a corrupt rsp)
  kCannotSuspend,  // SuspendThread failed: the thread has exited, or the
                   // handle lacks the right
  kNoContext,      // GetThreadContext failed (the thread was resumed)
};

const char* SnapshotOutcomeName(SnapshotOutcome outcome);

class ThreadSnapshotter {
 public:
  // The deepest part of a stack copied: 256 KiB holds 512 frames of up to
  // 512 bytes each; a deeper stack's walk is marked truncated.
  static constexpr size_t kMaxStackBytes = size_t{256} << 10;

  // Allocates the copy's buffer (the only allocation).
  ThreadSnapshotter();
  ~ThreadSnapshotter();
  ThreadSnapshotter(const ThreadSnapshotter&) = delete;
  ThreadSnapshotter& operator=(const ThreadSnapshotter&) = delete;

  // Suspends the thread behind `handle` (a HANDLE with THREAD_SUSPEND_RESUME
  // and THREAD_GET_CONTEXT), reads its registers, copies its stack from the
  // stack pointer up to `bounds.hi` (at most kMaxStackBytes), calls
  // `while_suspended(arg)` (which must not allocate or take locks: it may
  // copy memory the thread owns, such as its labels), and resumes it. Never
  // the calling thread.
  using SuspendedFn = void (*)(void* arg) noexcept;
  SnapshotOutcome Capture(void* handle, const StackBounds& bounds,
                          SuspendedFn while_suspended = nullptr,
                          void* arg = nullptr) noexcept;

  // The last snapshot, as the `ucontext` argument of OsUnwinder::Unwind().
  // Valid until the next Capture(). After kNoStack it holds the registers
  // only (the walk gives the pc).
  const void* snapshot() const noexcept;
  // The interrupted pc of the last snapshot.
  uint64_t pc() const noexcept;
  // Bytes of stack the last snapshot copied.
  size_t stack_bytes() const noexcept;

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_THREAD_SNAPSHOT_WINDOWS_H_
