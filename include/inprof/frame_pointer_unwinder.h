// inprof/frame_pointer_unwinder.h: walks the frame-pointer chain.
//
// Code built with -fno-omit-frame-pointer keeps a linked list of frame
// records on the stack: [fp] holds the caller's fp, [fp + 8] the return
// address (x86-64 and AArch64 alike). The walk follows it from the
// interrupted registers and checks every step before reading memory: the
// record must lie inside the thread's stack bounds, be 8-byte aligned and sit
// strictly above the previous one, so a corrupt or foreign frame pointer ends
// the walk (reported as truncated) and can never fault or loop.
//
// Thread-safety: stateless; Unwind is async-signal-safe and never allocates.
//
// Example:
//   inprof::FramePointerUnwinder unwinder;
//   uintptr_t pcs[64];
//   auto r = unwinder.UnwindFrom({pc, sp, fp}, {stack_lo, stack_hi}, pcs);
#ifndef INPROF_FRAME_POINTER_UNWINDER_H_
#define INPROF_FRAME_POINTER_UNWINDER_H_

#include <cstddef>
#include <cstdint>
#include <span>

#include "inprof/internal/machine_context.h"
#include "inprof/unwinder.h"

namespace inprof {

class FramePointerUnwinder {
 public:
  static constexpr const char* kName = "frame-pointer";

  // True on architectures whose registers we can read (x86-64, AArch64).
  static constexpr bool Supported() noexcept {
    return internal::kMachineContextSupported;
  }

  // Walks from a signal handler's ucontext. Async-signal-safe.
  UnwindResult Unwind(const void* ucontext, const StackBounds& bounds,
                      std::span<uintptr_t> out) const noexcept {
    return UnwindFrom(internal::RegistersFromContext(ucontext), bounds, out);
  }

  // The walk is one loop over registers, inlined into its caller at -O2
  // (no frame of its own). DeclaresStackUse.
  static constexpr size_t kMaxStackBytes = 256;

  // Words copied at the interrupted sp for the collector's frameless-leaf
  // repair (see internal/leaf_frame_resolver.h).
  static constexpr size_t kLeafStackWords = 8;

  // Copies up to out.size() words starting at the interrupted sp; words
  // beyond the stack bounds are zero. Async-signal-safe. The words may lie
  // in another function's AddressSanitizer redzones: reading them is the
  // point, so ASan is told not to check.
  __attribute__((no_sanitize_address)) void CopyLeafStack(const void* ucontext, const StackBounds& bounds,
                     std::span<uint64_t> out) const noexcept {
    const uintptr_t sp = internal::RegistersFromContext(ucontext).sp;
    for (size_t i = 0; i < out.size(); ++i) {
      const uintptr_t at = sp + i * sizeof(uint64_t);
      out[i] = (sp & 7) == 0 && bounds.Contains(at, sizeof(uint64_t))
                   ? *reinterpret_cast<const uint64_t*>(at)
                   : 0;
    }
  }

  // Walks from explicit registers (tests, benchmarks, other unwinders'
  // fallbacks). Async-signal-safe. Reads frame records anywhere in the
  // thread's stack, ASan's redzones included (a signal landing inside an
  // ASan interceptor walks through instrumented frames): not instrumented.
  __attribute__((no_sanitize_address)) UnwindResult UnwindFrom(const RegisterState& regs, const StackBounds& bounds,
                          std::span<uintptr_t> out) const noexcept {
    UnwindResult result;
    if (out.empty()) return result;
    out[result.depth++] = regs.pc;
    uintptr_t fp = regs.fp;
    // A frame record must sit at or above the interrupted stack pointer.
    uintptr_t lowest = regs.sp;
    while (true) {
      if (fp == 0) return result;  // the outermost frame: a complete walk
      if ((fp & 7) != 0 || fp < lowest ||
          !bounds.Contains(fp, 2 * sizeof(uintptr_t))) {
        result.truncated = true;
        return result;
      }
      const auto* record = reinterpret_cast<const uintptr_t*>(fp);
      const uintptr_t next_fp = record[0];
      const uintptr_t return_address = record[1];
      if (return_address == 0) return result;  // thread entry convention
      if (result.depth == out.size()) {
        result.truncated = true;
        return result;
      }
      out[result.depth++] = return_address;
      // Strictly increasing: a cycle or a downward pointer ends the walk.
      lowest = fp + 2 * sizeof(uintptr_t);
      if (next_fp != 0 && next_fp < lowest) {
        result.truncated = true;
        return result;
      }
      fp = next_fp;
    }
  }
};

static_assert(Unwinder<FramePointerUnwinder>);
static_assert(CopiesLeafStack<FramePointerUnwinder>);
static_assert(DeclaresStackUse<FramePointerUnwinder>);

}  // namespace inprof

#endif  // INPROF_FRAME_POINTER_UNWINDER_H_
