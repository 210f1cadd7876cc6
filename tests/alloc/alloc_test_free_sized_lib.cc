// A module for alloc_hooks_test that defines C23's free_sized and
// free_aligned_sized (glibc 2.36 has neither; they free as free does) and
// calls them through its own slots, standing in for a libc that has them.
#include <cstddef>
#include <cstdlib>

#define EXPORT extern "C" __attribute__((visibility("default")))

namespace {
int g_called = 0;
}  // namespace

EXPORT void free_sized(void* p, size_t) {
  ++g_called;
  std::free(p);
}
EXPORT void free_aligned_sized(void* p, size_t, size_t) {
  ++g_called;
  std::free(p);
}
// Through this module's PLT (the definitions above are preemptible).
EXPORT __attribute__((noinline)) void LibFreeSized(void* p, size_t n) { free_sized(p, n); }
EXPORT __attribute__((noinline)) void LibFreeAlignedSized(void* p, size_t a, size_t n) {
  free_aligned_sized(p, a, n);
}
EXPORT int SizedFreesCalled() { return g_called; }
