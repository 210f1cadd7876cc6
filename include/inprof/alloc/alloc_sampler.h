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

namespace inprof::internal {

// One thread's sampling state. Zero-initialized (a new thread's first
// allocation takes the slow path, which draws its first countdown).
struct AllocThreadState {
  uint64_t countdown;   // bytes left before the next sample
  uint64_t generation;  // the g_alloc_generation the countdown was drawn for
  uint64_t rng;         // xorshift64* state; 0: not seeded yet
  uint64_t mean;        // the mean the current countdown was drawn with
  uint32_t guard;       // > 0: inside the sampled path or the hooks' own work
};

// Initial-exec: the executable (or a preloaded library) owns it, so a
// thread's first access never goes through __tls_get_addr. __thread, not
// thread_local: an extern thread_local is reached through a TLS wrapper
// function (a check and a call for possible dynamic initialization) on
// every access from another translation unit.
extern __thread AllocThreadState alloc_thread_state
    __attribute__((tls_model("initial-exec")));
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

// While one lives on a thread, that thread's allocations are never sampled
// (its countdown is parked at its maximum and restored afterwards): the
// sampled path's own work and the hooks' bookkeeping reach the allocator
// unrecorded. Nests.
class AllocGuard {
 public:
  AllocGuard() : saved_(alloc_thread_state.countdown) {
    alloc_thread_state.countdown = UINT64_MAX;
    ++alloc_thread_state.guard;
  }
  ~AllocGuard() {
    --alloc_thread_state.guard;
    alloc_thread_state.countdown = saved_;
  }
  AllocGuard(const AllocGuard&) = delete;
  AllocGuard& operator=(const AllocGuard&) = delete;

  // Whether the calling thread is inside one.
  static bool Active() { return alloc_thread_state.guard > 0; }

 private:
  uint64_t saved_;
};

}  // namespace inprof::internal

#endif  // INPROF_ALLOC_ALLOC_SAMPLER_H_
