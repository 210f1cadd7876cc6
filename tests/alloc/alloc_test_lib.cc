// A shared module for alloc_hooks_test: each function makes one call to an
// intercepted symbol through this module's own PLT (JUMP_SLOT) or takes its
// address through the GOT (GLOB_DAT), so that the test sees exactly what the
// hooks forward. Built twice: alloc_test_lib (loaded at the test's start)
// and alloc_test_late_lib (dlopen()ed only after Install).
#include <dlfcn.h>
#include <malloc.h>

#include <cstdlib>
#include <new>

#define EXPORT extern "C" __attribute__((visibility("default"), noinline))

EXPORT void* LibMalloc(size_t n) { return malloc(n); }
EXPORT void LibFree(void* p) { free(p); }
EXPORT void* LibCalloc(size_t n, size_t s) { return calloc(n, s); }
EXPORT void* LibRealloc(void* p, size_t n) { return realloc(p, n); }
EXPORT void* LibReallocarray(void* p, size_t n, size_t s) { return reallocarray(p, n, s); }
EXPORT int LibPosixMemalign(void** out, size_t a, size_t n) { return posix_memalign(out, a, n); }
EXPORT void* LibAlignedAlloc(size_t a, size_t n) { return aligned_alloc(a, n); }
EXPORT void* LibMemalign(size_t a, size_t n) { return memalign(a, n); }
EXPORT void* LibValloc(size_t n) { return valloc(n); }
EXPORT void* LibPvalloc(size_t n) { return pvalloc(n); }

EXPORT void* LibNew(size_t n) { return ::operator new(n); }
EXPORT void* LibNewArray(size_t n) { return ::operator new[](n); }
EXPORT void* LibNewNothrow(size_t n) { return ::operator new(n, std::nothrow); }
EXPORT void* LibNewArrayNothrow(size_t n) { return ::operator new[](n, std::nothrow); }
EXPORT void* LibNewAligned(size_t n, size_t a) { return ::operator new(n, std::align_val_t(a)); }
EXPORT void* LibNewArrayAligned(size_t n, size_t a) {
  return ::operator new[](n, std::align_val_t(a));
}
EXPORT void* LibNewAlignedNothrow(size_t n, size_t a) {
  return ::operator new(n, std::align_val_t(a), std::nothrow);
}
EXPORT void* LibNewArrayAlignedNothrow(size_t n, size_t a) {
  return ::operator new[](n, std::align_val_t(a), std::nothrow);
}
EXPORT void LibDelete(void* p) { ::operator delete(p); }
EXPORT void LibDeleteArray(void* p) { ::operator delete[](p); }
EXPORT void LibDeleteSized(void* p, size_t n) { ::operator delete(p, n); }
EXPORT void LibDeleteArraySized(void* p, size_t n) { ::operator delete[](p, n); }
EXPORT void LibDeleteAligned(void* p, size_t a) { ::operator delete(p, std::align_val_t(a)); }
EXPORT void LibDeleteArrayAligned(void* p, size_t a) {
  ::operator delete[](p, std::align_val_t(a));
}
EXPORT void LibDeleteSizedAligned(void* p, size_t n, size_t a) {
  ::operator delete(p, n, std::align_val_t(a));
}
EXPORT void LibDeleteArraySizedAligned(void* p, size_t n, size_t a) {
  ::operator delete[](p, n, std::align_val_t(a));
}
EXPORT void LibDeleteNothrow(void* p) { ::operator delete(p, std::nothrow); }
EXPORT void LibDeleteArrayNothrow(void* p) { ::operator delete[](p, std::nothrow); }
EXPORT void LibDeleteAlignedNothrow(void* p, size_t a) {
  ::operator delete(p, std::align_val_t(a), std::nothrow);
}
EXPORT void LibDeleteArrayAlignedNothrow(void* p, size_t a) {
  ::operator delete[](p, std::align_val_t(a), std::nothrow);
}

EXPORT void* LibDlopen(const char* path, int mode) { return dlopen(path, mode); }
EXPORT void* LibDlmopen(long lmid, const char* path, int mode) {
  return dlmopen(static_cast<Lmid_t>(lmid), path, mode);
}

// The address malloc has in this module's GOT (a GLOB_DAT relocation).
using MallocFn = void* (*)(size_t);
EXPORT MallocFn LibMallocAddress() {
  MallocFn volatile fn = &malloc;
  return fn;
}
