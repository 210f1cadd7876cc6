#include "inprof/internal/thread_snapshot_windows.h"

#include <windows.h>

#include <cstring>

#include "inprof/internal/unwind_snapshot_windows.h"

namespace inprof::internal {

const char* SnapshotOutcomeName(SnapshotOutcome outcome) {
  switch (outcome) {
    case SnapshotOutcome::kOk:
      return "ok";
    case SnapshotOutcome::kNoStack:
      return "stack pointer outside the thread's stack";
    case SnapshotOutcome::kCannotSuspend:
      return "cannot suspend the thread";
    case SnapshotOutcome::kNoContext:
      return "cannot read the thread's registers";
  }
  return "unknown";
}

struct ThreadSnapshotter::Impl {
  UnwindSnapshot snapshot;
};

ThreadSnapshotter::ThreadSnapshotter() : impl_(new Impl) {
  // Committed now, written by the copies: a page of the buffer costs memory
  // only once a stack that deep was copied.
  impl_->snapshot.copy = static_cast<uint8_t*>(
      VirtualAlloc(nullptr, kMaxStackBytes + UnwindSnapshot::kGuardBytes,
                   MEM_RESERVE | MEM_COMMIT, PAGE_READWRITE));
  impl_->snapshot.capacity = impl_->snapshot.copy != nullptr ? kMaxStackBytes : 0;
}

ThreadSnapshotter::~ThreadSnapshotter() {
  if (impl_->snapshot.copy != nullptr) {
    VirtualFree(impl_->snapshot.copy, 0, MEM_RELEASE);
  }
  delete impl_;
}

SnapshotOutcome ThreadSnapshotter::Capture(void* handle, const StackBounds& bounds,
                                           SuspendedFn while_suspended,
                                           void* arg) noexcept {
  UnwindSnapshot& s = impl_->snapshot;
  s.size = 0;
  s.original_sp = 0;
  s.has_context = false;
  if (SuspendThread(static_cast<HANDLE>(handle)) == static_cast<DWORD>(-1)) {
    return SnapshotOutcome::kCannotSuspend;
  }
  // SuspendThread is asynchronous; GetThreadContext returns once the thread
  // is actually stopped.
  std::memset(&s.context, 0, sizeof(s.context));
  s.context.ContextFlags = CONTEXT_CONTROL | CONTEXT_INTEGER;
  if (!GetThreadContext(static_cast<HANDLE>(handle), &s.context)) {
    ResumeThread(static_cast<HANDLE>(handle));
    return SnapshotOutcome::kNoContext;
  }
  s.has_context = true;
  SnapshotOutcome outcome = SnapshotOutcome::kNoStack;
  const uint64_t sp = s.context.Rsp;
  // Everything from the stack pointer to the stack's base is committed
  // (the stack grows down, its guard page below the lowest use).
  if (s.capacity > 0 && sp >= bounds.lo && sp < bounds.hi) {
    size_t n = static_cast<size_t>(bounds.hi - sp);
    if (n > s.capacity) n = s.capacity;
    std::memcpy(s.copy, reinterpret_cast<const void*>(sp), n);
    s.original_sp = sp;
    s.size = n;
    outcome = SnapshotOutcome::kOk;
  }
  if (while_suspended != nullptr) while_suspended(arg);
  ResumeThread(static_cast<HANDLE>(handle));
  if (outcome == SnapshotOutcome::kOk) RelocateStackPointers(s);
  return outcome;
}

const void* ThreadSnapshotter::snapshot() const noexcept { return &impl_->snapshot; }

uint64_t ThreadSnapshotter::pc() const noexcept {
  return impl_->snapshot.has_context ? impl_->snapshot.context.Rip : 0;
}

size_t ThreadSnapshotter::stack_bytes() const noexcept { return impl_->snapshot.size; }

}  // namespace inprof::internal
