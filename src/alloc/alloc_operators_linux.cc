// The wrappers of operator new and delete (alloc_hooks.h), patched into
// the slots of every form the C++ library defines.
#include <new>

#include "src/alloc/alloc_wrappers.h"

namespace inprof::internal {
namespace {

// operator new and delete: exceptions from the throwing forms' originals
// pass through the wrapper unchanged (it has nothing to clean up).
void* NewWrapper(size_t size) {
  if (__builtin_expect(g_new_is_malloc.load(std::memory_order_relaxed), 1)) {
    if (void* p = MallocForNew(size); __builtin_expect(p != nullptr, 1)) return p;
  }
  return AllocateNew<void* (*)(size_t)>(kSymNew, size, size);
}
void* NewArrayWrapper(size_t size) {
  if (__builtin_expect(g_new_is_malloc.load(std::memory_order_relaxed), 1)) {
    if (void* p = MallocForNew(size); __builtin_expect(p != nullptr, 1)) return p;
  }
  return AllocateNew<void* (*)(size_t)>(kSymNewArray, size, size);
}
void* NewNothrowWrapper(size_t size, const std::nothrow_t& tag) noexcept {
  if (__builtin_expect(g_new_is_malloc.load(std::memory_order_relaxed), 1)) {
    if (void* p = MallocForNew(size); __builtin_expect(p != nullptr, 1)) return p;
  }
  return AllocateNew<void* (*)(size_t, const std::nothrow_t&) noexcept>(kSymNewNothrow, size, size,
                                                                     tag);
}
void* NewArrayNothrowWrapper(size_t size, const std::nothrow_t& tag) noexcept {
  if (__builtin_expect(g_new_is_malloc.load(std::memory_order_relaxed), 1)) {
    if (void* p = MallocForNew(size); __builtin_expect(p != nullptr, 1)) return p;
  }
  return AllocateNew<void* (*)(size_t, const std::nothrow_t&) noexcept>(kSymNewArrayNothrow, size,
                                                                     size, tag);
}
void* NewAlignedWrapper(size_t size, std::align_val_t align) {
  return AllocateNew<void* (*)(size_t, std::align_val_t)>(kSymNewAligned, size, size, align);
}
void* NewArrayAlignedWrapper(size_t size, std::align_val_t align) {
  return AllocateNew<void* (*)(size_t, std::align_val_t)>(kSymNewArrayAligned, size, size, align);
}
void* NewAlignedNothrowWrapper(size_t size, std::align_val_t align,
                               const std::nothrow_t& tag) noexcept {
  return AllocateNew<void* (*)(size_t, std::align_val_t, const std::nothrow_t&) noexcept>(
      kSymNewAlignedNothrow, size, size, align, tag);
}
void* NewArrayAlignedNothrowWrapper(size_t size, std::align_val_t align,
                                    const std::nothrow_t& tag) noexcept {
  return AllocateNew<void* (*)(size_t, std::align_val_t, const std::nothrow_t&) noexcept>(
      kSymNewArrayAlignedNothrow, size, size, align, tag);
}
void DeleteWrapper(void* p) noexcept {
  BeforeFree(p);
  if (__builtin_expect(g_new_is_malloc.load(std::memory_order_relaxed), 1)) {
    HookReal<void (*)(void*)>(kSymFree)(p);
    return;
  }
  HookReal<void (*)(void*) noexcept>(kSymDelete)(p);
}
void DeleteArrayWrapper(void* p) noexcept {
  BeforeFree(p);
  if (__builtin_expect(g_new_is_malloc.load(std::memory_order_relaxed), 1)) {
    HookReal<void (*)(void*)>(kSymFree)(p);
    return;
  }
  HookReal<void (*)(void*) noexcept>(kSymDeleteArray)(p);
}
void DeleteSizedWrapper(void* p, size_t size) noexcept {
  BeforeFree(p);
  if (__builtin_expect(g_new_is_malloc.load(std::memory_order_relaxed), 1)) {
    HookReal<void (*)(void*)>(kSymFree)(p);
    return;
  }
  HookReal<void (*)(void*, size_t) noexcept>(kSymDeleteSized)(p, size);
}
void DeleteArraySizedWrapper(void* p, size_t size) noexcept {
  BeforeFree(p);
  if (__builtin_expect(g_new_is_malloc.load(std::memory_order_relaxed), 1)) {
    HookReal<void (*)(void*)>(kSymFree)(p);
    return;
  }
  HookReal<void (*)(void*, size_t) noexcept>(kSymDeleteArraySized)(p, size);
}
void DeleteAlignedWrapper(void* p, std::align_val_t align) noexcept {
  BeforeFree(p);
  HookReal<void (*)(void*, std::align_val_t) noexcept>(kSymDeleteAligned)(p, align);
}
void DeleteArrayAlignedWrapper(void* p, std::align_val_t align) noexcept {
  BeforeFree(p);
  HookReal<void (*)(void*, std::align_val_t) noexcept>(kSymDeleteArrayAligned)(p, align);
}
void DeleteSizedAlignedWrapper(void* p, size_t size, std::align_val_t align) noexcept {
  BeforeFree(p);
  HookReal<void (*)(void*, size_t, std::align_val_t) noexcept>(kSymDeleteSizedAligned)(p, size,
                                                                                    align);
}
void DeleteArraySizedAlignedWrapper(void* p, size_t size, std::align_val_t align) noexcept {
  BeforeFree(p);
  HookReal<void (*)(void*, size_t, std::align_val_t) noexcept>(kSymDeleteArraySizedAligned)(
      p, size, align);
}
void DeleteNothrowWrapper(void* p, const std::nothrow_t& tag) noexcept {
  BeforeFree(p);
  if (__builtin_expect(g_new_is_malloc.load(std::memory_order_relaxed), 1)) {
    HookReal<void (*)(void*)>(kSymFree)(p);
    return;
  }
  HookReal<void (*)(void*, const std::nothrow_t&) noexcept>(kSymDeleteNothrow)(p, tag);
}
void DeleteArrayNothrowWrapper(void* p, const std::nothrow_t& tag) noexcept {
  BeforeFree(p);
  if (__builtin_expect(g_new_is_malloc.load(std::memory_order_relaxed), 1)) {
    HookReal<void (*)(void*)>(kSymFree)(p);
    return;
  }
  HookReal<void (*)(void*, const std::nothrow_t&) noexcept>(kSymDeleteArrayNothrow)(p, tag);
}
void DeleteAlignedNothrowWrapper(void* p, std::align_val_t align,
                                 const std::nothrow_t& tag) noexcept {
  BeforeFree(p);
  HookReal<void (*)(void*, std::align_val_t, const std::nothrow_t&) noexcept>(
      kSymDeleteAlignedNothrow)(p, align, tag);
}
void DeleteArrayAlignedNothrowWrapper(void* p, std::align_val_t align,
                                      const std::nothrow_t& tag) noexcept {
  BeforeFree(p);
  HookReal<void (*)(void*, std::align_val_t, const std::nothrow_t&) noexcept>(
      kSymDeleteArrayAlignedNothrow)(p, align, tag);
}

template <typename Fn>
uintptr_t Address(Fn* fn) {
  return reinterpret_cast<uintptr_t>(fn);
}

}  // namespace

uintptr_t OperatorWrapperAddress(AllocSymbol symbol) {
  static const uintptr_t kAt[] = {
      Address(NewWrapper), Address(NewArrayWrapper), Address(NewNothrowWrapper),
      Address(NewArrayNothrowWrapper), Address(NewAlignedWrapper),
      Address(NewArrayAlignedWrapper), Address(NewAlignedNothrowWrapper),
      Address(NewArrayAlignedNothrowWrapper),
      Address(DeleteWrapper), Address(DeleteArrayWrapper), Address(DeleteSizedWrapper),
      Address(DeleteArraySizedWrapper), Address(DeleteAlignedWrapper),
      Address(DeleteArrayAlignedWrapper), Address(DeleteSizedAlignedWrapper),
      Address(DeleteArraySizedAlignedWrapper), Address(DeleteNothrowWrapper),
      Address(DeleteArrayNothrowWrapper), Address(DeleteAlignedNothrowWrapper),
      Address(DeleteArrayAlignedNothrowWrapper),
  };
  static_assert(std::size(kAt) == kSymDeleteArrayAlignedNothrow - kSymNew + 1);
  if (symbol < kSymNew || symbol > kSymDeleteArrayAlignedNothrow) return 0;
  return kAt[symbol - kSymNew];
}

}  // namespace inprof::internal
