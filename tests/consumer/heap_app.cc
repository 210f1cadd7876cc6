// A program that profiles its allocations, built the way README's "Where
// memory goes" says: against the installed headers and libraries through
// pkg-config's inprof-heap (consumer_test.sh). It keeps 16 MiB allocated
// at one site until the profiler stops, so the profile's inuse_space has
// that site.
#include <cstdlib>
#include <vector>

#include <inprof/heap/allocation_provider.h>
#include <inprof/inprof.h>

namespace {

using HeapProfiler = inprof::Profiler<inprof::DefaultUnwinder, inprof::DefaultSampleRing,
                                      inprof::CpuTimeProvider, inprof::AllocationProvider>;

__attribute__((noinline)) void* ConsumerAllocates() {
  void* p = std::malloc(16 * 1024);
  asm volatile("" : : "r"(p) : "memory");
  return p;
}

}  // namespace

int main() {
  std::vector<void*> kept;
  {
    HeapProfiler profiler(inprof::Options::FromEnv());
    inprof::ScopedProfiler running(profiler);
    auto self = profiler.RegisterThread("main");
    for (int i = 0; i < 1024; ++i) kept.push_back(ConsumerAllocates());
  }
  for (void* p : kept) std::free(p);
  return 0;
}
