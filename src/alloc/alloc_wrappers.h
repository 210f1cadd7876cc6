// internal to src/alloc: the allocation wrappers' shared state and inline
// paths, used by the C functions' wrappers (alloc_hooks_linux.cc) and the
// operators' (alloc_operators_linux.cc).
#ifndef INPROF_SRC_ALLOC_ALLOC_WRAPPERS_H_
#define INPROF_SRC_ALLOC_ALLOC_WRAPPERS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "inprof/alloc/alloc_hooks.h"
#include "inprof/alloc/alloc_sampler.h"
#include "inprof/alloc/live_heap_table.h"
#include "src/alloc/got_hooks.h"

namespace inprof::internal {

extern std::atomic<AllocSampleCallback> g_callback;
extern std::atomic<void*> g_context;
extern std::atomic<LiveHeapTable*> g_live;
// Whether the plain operators new and delete are libstdc++'s, which are
// malloc and free (alloc_hooks_linux.cc says why it matters).
extern std::atomic<bool> g_new_is_malloc;
extern std::atomic<uint64_t> g_samples;

// The sampled path (alloc_hooks_linux.cc): a guard first, so that the
// callback's and the table's own allocations pass straight through.
// `caller`: the wrapper's return address, in the code that allocated.
void RecordSample(void* address, size_t size, void* caller);

// The operators' wrappers by symbol (alloc_operators_linux.cc), for kSymNew
// to kSymDeleteArrayAlignedNothrow; 0 for any other.
uintptr_t OperatorWrapperAddress(AllocSymbol symbol);

// An allocation of `size` bytes through `real(args...)`. The countdown
// decides first, so that the unsampled case is a tail call to the original
// (no frame of ours left around the allocator's).
template <typename Fn, typename... Args>
inline __attribute__((always_inline)) void* Allocate(AllocSymbol symbol, size_t size,
                                                     Args... args) {
  const Fn real = HookReal<Fn>(symbol);
  if (__builtin_expect(!ShouldSampleAlloc(size), 1)) return real(args...);
  void* address = real(args...);
  if (address != nullptr) RecordSample(address, size, __builtin_return_address(0));
  return address;
}

// operator new's original allocates through malloc, and libstdc++'s call
// to it goes through a GOT slot that is patched too: counted there again,
// every new would count twice against the countdown, and a sampled new
// could be sampled twice. The original runs under a guard instead, so that
// only the outer call counts (a few nanoseconds: the guard is two
// thread-local writes and a restore).
template <typename Fn, typename... Args>
inline __attribute__((always_inline)) void* AllocateNew(AllocSymbol symbol, size_t size,
                                                        Args... args) {
  const Fn real = HookReal<Fn>(symbol);
  const bool sampled = ShouldSampleAlloc(size);
  void* address;
  {
    AllocGuard nested;
    address = real(args...);
  }
  if (__builtin_expect(sampled, 0) && address != nullptr) {
    RecordSample(address, size, __builtin_return_address(0));
  }
  return address;
}

// operator new's fast path (g_new_is_malloc): malloc once, sampled as
// `size` bytes. Null when malloc failed: the caller then runs the original
// operator, whose new_handler loop and bad_alloc are the program's.
inline __attribute__((always_inline)) void* MallocForNew(size_t size) {
  const auto real = HookReal<void* (*)(size_t)>(kSymMalloc);
  if (__builtin_expect(!ShouldSampleAlloc(size), 1)) return real(size == 0 ? 1 : size);
  void* address = real(size == 0 ? 1 : size);
  if (address != nullptr) RecordSample(address, size, __builtin_return_address(0));
  return address;
}

// Before the original frees `address`: once freed, another thread may get
// the same address back and sample it.
inline void BeforeFree(void* address) {
  if (address == nullptr) return;
  if (LiveHeapTable* live = g_live.load(std::memory_order_acquire)) live->Erase(address);
}

}  // namespace inprof::internal

#endif  // INPROF_SRC_ALLOC_ALLOC_WRAPPERS_H_
