// A shared module with an allocator of its own (a bump arena: free is a
// no-op that only accepts the arena's blocks), for alloc_hooks_test's
// RTLD_DEEPBIND case: loaded with RTLD_NOW | RTLD_DEEPBIND, its calls to
// malloc and free bind to these definitions, not to glibc's. A block of
// the arena freed by glibc (what forwarding its slots to the global
// allocator did) crashes the process.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#define EXPORT extern "C" __attribute__((visibility("default")))

namespace {
alignas(16) char g_arena[1 << 20];
size_t g_used = 0;
bool Owns(const void* p) {
  return p >= g_arena && p < g_arena + sizeof g_arena;
}
}  // namespace

EXPORT void* malloc(size_t n) {
  n = (n + 15) & ~size_t{15};
  if (g_used + n > sizeof g_arena) return nullptr;
  void* p = g_arena + g_used;
  g_used += n;
  return p;
}
EXPORT void free(void* p) {
  if (p != nullptr && !Owns(p)) abort();  // not ours: the hooks mixed allocators
}
EXPORT void* calloc(size_t n, size_t s) {
  void* p = malloc(n * s);
  if (p != nullptr) std::memset(p, 0, n * s);
  return p;
}

// Through this module's PLT: bound to the definitions above.
EXPORT __attribute__((noinline)) void* DeepMalloc(size_t n) { return malloc(n); }
EXPORT __attribute__((noinline)) void DeepFree(void* p) { free(p); }
EXPORT int DeepOwns(const void* p) { return Owns(p) ? 1 : 0; }
