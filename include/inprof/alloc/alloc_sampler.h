// internal: not part of the public API (phase 1 of the allocation profiler,
// docs/allocations_plan.md; not yet wired into Profiler).
//
// The sampling decision for allocations: a per-thread byte countdown drawn
// from an exponential distribution with a process-wide mean. An allocation
// of `size` bytes that crosses the countdown is sampled; because the
// countdown is memoryless, an allocation of `size` bytes is sampled with
// probability p = 1 - exp(-size / mean), and SampleWeight() scales a sample
// to 1/p objects and size/p bytes (Go's runtime and pprof do the same), so
// that sums of weights are unbiased estimates of what was allocated.
//
// Thread-safety: the countdown is per thread (initial-exec TLS, so reading
// it never calls into the loader or allocates); the mean is an atomic.
// ShouldSampleAlloc's unsampled path is a TLS load, a global load, two
// compares and a subtraction: no lock, no system call, no allocation.
// Async-signal-safe: no (a signal handler that allocates is already wrong).
//
// Example:
//   SetAllocSamplingMean(512 * 1024);
//   void* p = real_malloc(n);
//   if (ShouldSampleAlloc(n)) {
//     AllocGuard guard;                      // what follows is never sampled
//     AllocWeight w = SampleWeight(n, ThreadSampleMean());
//     Record(p, n, w.objects, w.bytes);
//   }
#ifndef INPROF_ALLOC_ALLOC_SAMPLER_H_
#define INPROF_ALLOC_ALLOC_SAMPLER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "inprof/base/alloc_guard.h"

namespace inprof::internal {

// AllocThreadState, alloc_thread_state and AllocGuard: base/alloc_guard.h.

// Bumped by each SetAllocSamplingMean: a thread whose countdown was drawn
// for an older generation draws again (an "off" countdown never outlives
// the mean that made it).
extern std::atomic<uint64_t> g_alloc_generation;

// Sets the mean of the byte countdown for every thread; 0 turns sampling
// off. Threads pick it up at their next allocation. Thread-safe.
void SetAllocSamplingMean(uint64_t mean_bytes);
// The mean last set (0: off).
uint64_t AllocSamplingMean();

// The slow path of ShouldSampleAlloc: the countdown crossed, or it was drawn
// for another generation, or the thread has none yet.
bool ShouldSampleAllocSlow(size_t size);

// Whether this allocation of `size` bytes is sampled; advances the calling
// thread's countdown. Never allocates, locks or calls the kernel. Always
// false inside an AllocGuard.
inline bool ShouldSampleAlloc(size_t size) {
  AllocThreadState& t = alloc_thread_state;
  if (__builtin_expect(size < t.countdown &&
                           t.generation == g_alloc_generation.load(std::memory_order_relaxed),
                       1)) {
    t.countdown -= size;
    return false;
  }
  return ShouldSampleAllocSlow(size);
}

// The mean of the countdown that the calling thread's last sample crossed
// (what SampleWeight needs: the mean may have changed since).
inline uint64_t ThreadSampleMean() { return alloc_thread_state.mean; }

// What one sample of an allocation of `size` bytes stands for, when the
// countdown's mean is `mean` bytes: 1/p objects and size/p bytes, with
// p = 1 - exp(-size/mean). mean 0 or size 0 (never sampled): {0, 0}.
struct AllocWeight {
  double objects;
  double bytes;
};
AllocWeight SampleWeight(size_t size, uint64_t mean);

}  // namespace inprof::internal

#endif  // INPROF_ALLOC_ALLOC_SAMPLER_H_
