// inprof/unwinder.h: the Unwinder concept and the types unwinders share.
//
// An unwinder turns the context a signal interrupted into return addresses.
// It runs inside the signal handler, so everything it does must be
// async-signal-safe: no allocation, no locks, no dl_iterate_phdr, no
// libunwind/libgcc, and it must never fault, whatever the stack holds.
//
// Example:
//   static_assert(inprof::Unwinder<inprof::FramePointerUnwinder>);
//   uintptr_t pcs[512];
//   inprof::UnwindResult r = unwinder.Unwind(ucontext, bounds, pcs);
//   // pcs[0] is the interrupted pc; pcs[1..r.depth) are return addresses.
#ifndef INPROF_UNWINDER_H_
#define INPROF_UNWINDER_H_

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>

#include "absl/functional/function_ref.h"

namespace inprof {

// The part of the address space a thread's stack occupies: [lo, hi).
// Captured when the thread registers.
struct StackBounds {
  uintptr_t lo = 0;
  uintptr_t hi = 0;
  bool Contains(uintptr_t address, size_t size) const noexcept {
    return address >= lo && address <= hi && hi - address >= size;
  }
};

// What one walk produced.
struct UnwindResult {
  size_t depth = 0;        // frames written, the interrupted pc included
  bool truncated = false;  // the walk stopped at a bad frame or the limit
  // The walk went through code whose unwind information was not available
  // yet (DwarfUnwinder: a module whose table is still to be built) by a
  // frame-pointer step there, which skips the frames of code built without
  // frame pointers: the stack may miss frames.
  bool provisional = false;
};

// Requirements of an Unwinder U:
//   (1) U::Supported() -> bool: false where it cannot work (architecture,
//       OS); the profiler then records no stacks instead of failing;
//   (2) u.Unwind(const void* ucontext, const StackBounds&, std::span<uintptr_t>)
//       -> UnwindResult, noexcept and async-signal-safe: writes the pc first,
//       then return addresses, callers last; never writes past the span;
//   (3) U::kName: a name for logs and the profile's comments.
template <typename U>
concept Unwinder =
    requires(const U& u, const void* ucontext, const StackBounds& bounds,
             std::span<uintptr_t> out) {
      { U::Supported() } -> std::same_as<bool>;
      { u.Unwind(ucontext, bounds, out) } noexcept -> std::same_as<UnwindResult>;
      { U::kName } -> std::convertible_to<const char*>;
    };

// Optional: an unwinder that can also copy the first words at the
// interrupted stack pointer, so the collector can recover the caller of a
// frameless leaf from call-frame information (internal/leaf_frame_resolver.h).
//   (1) U::kLeafStackWords > 0: how many words it copies;
//   (2) u.CopyLeafStack(const void* ucontext, const StackBounds&,
//       std::span<uint64_t>) noexcept: async-signal-safe; fills the span,
//       zeros for words outside the stack.
template <typename U>
concept CopiesLeafStack =
    Unwinder<U> && (U::kLeafStackWords > 0) &&
    requires(const U& u, const void* ucontext, const StackBounds& bounds,
             std::span<uint64_t> out) {
      { u.CopyLeafStack(ucontext, bounds, out) } noexcept;
    };

// Optional: an unwinder that states the most stack one Unwind call uses,
// so that the signal handler can tell whether the interrupted stack can take
// the walk (a thread on a small sigaltstack or a coroutine's stack cannot:
// its sample is then taken without a stack). An unwinder that does not say
// is assumed to need kUndeclaredUnwinderStackBytes.
//   (1) U::kMaxStackBytes: bytes, below Unwind's caller's frame, that
//       Unwind (and CopyLeafStack) may use at most.
template <typename U>
concept DeclaresStackUse = Unwinder<U> && requires {
  { U::kMaxStackBytes } -> std::convertible_to<size_t>;
};
inline constexpr size_t kUndeclaredUnwinderStackBytes = 16 * 1024;

// Optional: an unwinder whose per-module tables are built off the hot path
// (DwarfUnwinder). A Profiler calls, on its collector thread before each
// drain, U::RefreshModules(absl::FunctionRef<bool()> between_tables, bool
// on_demand) when U has it, with a drain of the rings between two tables'
// builds (the first build takes tens of milliseconds), else
// U::RefreshModules(). Either may exist without the other. Not
// async-signal-safe.
template <typename U>
concept RefreshesModules = Unwinder<U> && requires { U::RefreshModules(); };
template <typename U>
concept RefreshesModulesBetweenTables =
    Unwinder<U> && requires(absl::FunctionRef<bool()> between_tables) {
      U::RefreshModules(between_tables, true);
    };

// Optional: an unwinder that walks by frame pointers until its tables are
// built, and says so. All async-signal-safe:
//   (1) U::TablesReady() -> bool: every module loaded at the first build
//       has its table;
//   (2) U::TablesGeneration() -> uint64_t: changes at each published
//       rebuild (0 before the first);
//   (3) U::WalksWithoutTables() -> uint64_t: walks so far that took
//       frame-pointer steps for want of a table (the profile's comments).
// A blocked thread's stack walked before its tables existed is walked
// again once they do (the wall sampler's resampled episodes).
template <typename U>
concept BuildsTablesLazily = Unwinder<U> && requires {
  { U::TablesReady() } -> std::convertible_to<bool>;
  { U::TablesGeneration() } -> std::convertible_to<uint64_t>;
  { U::WalksWithoutTables() } -> std::convertible_to<uint64_t>;
};

// Optional: an unwinder that can walk a copy of a stack, from a pc and sp
// and no other register (a thread blocked in a system call, its stack
// copied by the wall sampler: no signal needed for its stack).
//   u.UnwindCopy(uintptr_t pc, uintptr_t sp, std::span<const uint64_t>
//   copy, std::span<uintptr_t> out) -> UnwindResult: reads only the copy.
template <typename U>
concept WalksStackCopies =
    Unwinder<U> &&
    requires(const U& u, std::span<const uint64_t> copy, std::span<uintptr_t> out) {
      { u.UnwindCopy(uintptr_t{}, uintptr_t{}, copy, out) } -> std::same_as<UnwindResult>;
    };

}  // namespace inprof

#endif  // INPROF_UNWINDER_H_
