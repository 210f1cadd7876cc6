// internal to src/alloc: what the lock hooks (lock_hooks_linux.cc) share
// with the GOT patching in alloc_hooks_linux.cc, which is one mechanism for
// both: one scan, one table of wrappers, one saved-originals map, one dlopen
// wrapper. A symbol's slots are patched while its group is installed
// (dlopen's while either is).
#ifndef INPROF_SRC_ALLOC_GOT_HOOKS_H_
#define INPROF_SRC_ALLOC_GOT_HOOKS_H_

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "inprof/alloc/got_scan.h"

namespace inprof::internal {

// What each wrapper calls: set once per symbol, before any slot points at
// the wrapper, and never changed afterwards.
extern std::atomic<void*> g_hook_real[kAllocSymbolCount];

template <typename Fn>
inline Fn HookReal(AllocSymbol symbol) {
  return reinterpret_cast<Fn>(g_hook_real[symbol].load(std::memory_order_acquire));
}

// The lock wrappers' addresses (lock_hooks_linux.cc), for symbols from
// kSymMutexLock on; 0 for any other.
uintptr_t LockWrapperAddress(AllocSymbol symbol);

// The lock group (alloc_hooks_linux.cc): resolves the originals of every
// symbol not resolved yet and patches the lock functions' slots.
// FailedPrecondition when this process installed it already; in a forked
// child of a process that had, takes it over (*taken_over = true) without
// calling the loader.
absl::Status InstallLockGroup(bool* taken_over);
void UninstallLockGroup();
bool LockGroupInstalled();

}  // namespace inprof::internal

#endif  // INPROF_SRC_ALLOC_GOT_HOOKS_H_
