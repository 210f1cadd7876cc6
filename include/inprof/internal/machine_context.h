// internal: not part of the public API.
//
// Reads the interrupted registers out of a signal handler's ucontext. This is
// the architecture seam: each supported architecture maps its register names
// to {pc, sp, fp}; others report kMachineContextSupported = false and the
// unwinders degrade to a no-op.
#ifndef INPROF_INTERNAL_MACHINE_CONTEXT_H_
#define INPROF_INTERNAL_MACHINE_CONTEXT_H_

#include <ucontext.h>

#include <cstdint>

namespace inprof {

// The registers a stack walk starts from.
struct RegisterState {
  uintptr_t pc = 0;  // the interrupted instruction
  uintptr_t sp = 0;  // stack pointer at the interruption
  uintptr_t fp = 0;  // frame pointer (rbp / x29)
};

namespace internal {

#if defined(__x86_64__)
inline constexpr bool kMachineContextSupported = true;
inline RegisterState RegistersFromContext(const void* ucontext) noexcept {
  const auto* uc = static_cast<const ucontext_t*>(ucontext);
  return {static_cast<uintptr_t>(uc->uc_mcontext.gregs[REG_RIP]),
          static_cast<uintptr_t>(uc->uc_mcontext.gregs[REG_RSP]),
          static_cast<uintptr_t>(uc->uc_mcontext.gregs[REG_RBP])};
}
#elif defined(__aarch64__)
inline constexpr bool kMachineContextSupported = true;
inline RegisterState RegistersFromContext(const void* ucontext) noexcept {
  const auto* uc = static_cast<const ucontext_t*>(ucontext);
  return {static_cast<uintptr_t>(uc->uc_mcontext.pc),
          static_cast<uintptr_t>(uc->uc_mcontext.sp),
          static_cast<uintptr_t>(uc->uc_mcontext.regs[29])};
}
#else
inline constexpr bool kMachineContextSupported = false;
inline RegisterState RegistersFromContext(const void*) noexcept { return {}; }
#endif

}  // namespace internal
}  // namespace inprof

#endif  // INPROF_INTERNAL_MACHINE_CONTEXT_H_
