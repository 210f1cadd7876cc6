#include "inprof/windows/os_unwinder_windows.h"

#include <windows.h>

#include "inprof/internal/thread_snapshot_windows.h"
#include "inprof/internal/unwind_snapshot_windows.h"

namespace inprof {
namespace internal {

void RelocateStackPointers(UnwindSnapshot& s) noexcept {
  const uint64_t lo = s.original_sp;
  const uint64_t hi = s.original_sp + s.size;
  const uint64_t to = reinterpret_cast<uint64_t>(s.copy);
  auto move = [&](DWORD64& v) {
    if (v >= lo && v < hi) v = v - lo + to;
  };
  move(s.context.Rsp);
  move(s.context.Rbp);
  move(s.context.Rbx);
  move(s.context.Rsi);
  move(s.context.Rdi);
  move(s.context.R12);
  move(s.context.R13);
  move(s.context.R14);
  move(s.context.R15);
  // The stack pointer is 8-aligned at every instruction of x64 code.
  auto* words = reinterpret_cast<DWORD64*>(s.copy);
  for (size_t i = 0; i < s.size / sizeof(DWORD64); ++i) move(words[i]);
}

}  // namespace internal

namespace {

// x64 UNWIND_INFO's header (the PE format's layout).
struct UnwindInfoHeader {
  uint8_t version_and_flags;
  uint8_t prolog_size;
  uint8_t code_count;
  uint8_t frame_register_and_offset;  // register: low 4 bits
};

// The general-purpose register numbered as in UNWIND_INFO (0 = rax ... 15).
DWORD64 Register(const CONTEXT& c, int n) {
  const DWORD64* regs = &c.Rax;  // Rax..R15 are consecutive in CONTEXT
  return regs[n];
}

}  // namespace

UnwindResult OsUnwinder::Unwind(const void* snapshot, const StackBounds& /*bounds*/,
                                std::span<uintptr_t> out) const noexcept {
  const auto& s = *static_cast<const internal::UnwindSnapshot*>(snapshot);
  UnwindResult r;
  if (out.empty() || !s.has_context) return r;
  out[r.depth++] = s.context.Rip;
  if (s.size == 0) {
    r.truncated = true;  // registers only: no stack to walk
    return r;
  }
  CONTEXT c = s.context;
  const uint64_t lo = reinterpret_cast<uint64_t>(s.copy);
  const uint64_t hi = lo + s.size;
  for (bool first = true;; first = false) {
    const uint64_t pc = c.Rip;
    const uint64_t sp = c.Rsp;
    if (sp < lo || sp + sizeof(DWORD64) > hi) {
      // Past the copy: the stack's end (a whole copy), or the copy's
      // limit (a deep stack).
      r.truncated = s.size == internal::ThreadSnapshotter::kMaxStackBytes;
      break;
    }
    DWORD64 image_base = 0;
    // A return address right after a call that ends its function belongs
    // to the next one: such a caller is found at pc - 1.
    PRUNTIME_FUNCTION fn = RtlLookupFunctionEntry(pc, &image_base, nullptr);
    if (fn == nullptr && !first) fn = RtlLookupFunctionEntry(pc - 1, &image_base, nullptr);
    if (fn == nullptr) {
      if (!first) {
        // Every x64 function that calls has unwind information: a return
        // address without it is JIT code or a corrupt stack.
        r.truncated = true;
        break;
      }
      // The interrupted function is a leaf (no unwind information): its
      // return address is on top of the stack.
      c.Rip = *reinterpret_cast<const DWORD64*>(sp);
      c.Rsp = sp + sizeof(DWORD64);
    } else {
      // A frame addressed through a frame register takes its base from that
      // register: it must point into the copy, or the walk would read
      // wherever a corrupt value points.
      const auto* info = reinterpret_cast<const UnwindInfoHeader*>(
          image_base + fn->UnwindData);
      const int frame_register = info->frame_register_and_offset & 0x0f;
      const bool in_prolog = first && pc - (image_base + fn->BeginAddress) < info->prolog_size;
      if (frame_register != 0 && !in_prolog) {
        const DWORD64 frame = Register(c, frame_register);
        if (frame < lo || frame >= hi) {
          r.truncated = true;
          break;
        }
      }
      PVOID handler_data = nullptr;
      DWORD64 establisher = 0;
      RtlVirtualUnwind(UNW_FLAG_NHANDLER, image_base, pc, fn, &c, &handler_data,
                       &establisher, nullptr);
    }
    if (c.Rip == 0) break;  // the outermost frame (RtlUserThreadStart)
    if (c.Rsp <= sp) {
      r.truncated = true;  // no progress: a corrupt frame
      break;
    }
    if (r.depth == out.size()) {
      r.truncated = true;
      break;
    }
    out[r.depth++] = c.Rip;
  }
  return r;
}

}  // namespace inprof
