#include "inprof/alloc/alloc_sampler.h"

#include <cmath>
#include <cstdint>

namespace inprof::internal {

std::atomic<uint64_t> g_alloc_generation{1};

namespace {
std::atomic<uint64_t> g_mean{0};
// Distinct seeds for threads (the slow path only, once per thread).
std::atomic<uint64_t> g_seed_counter{0};

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// xorshift64* (Vigna): a multiply and three shifts, no memory but its state.
uint64_t NextRandom(AllocThreadState& t) {
  if (t.rng == 0) {
    const uint64_t seed =
        reinterpret_cast<uintptr_t>(&t) ^
        (g_seed_counter.fetch_add(1, std::memory_order_relaxed) * 0x2545f4914f6cdd1dULL);
    t.rng = SplitMix64(seed) | 1;  // never 0: xorshift's fixed point
  }
  t.rng ^= t.rng >> 12;
  t.rng ^= t.rng << 25;
  t.rng ^= t.rng >> 27;
  return t.rng * 0x2545f4914f6cdd1dULL;
}

// A countdown in whole bytes, >= 1: ceil of an exponential variable with
// the given mean, so P(countdown <= s) = 1 - exp(-s/mean) for whole s.
uint64_t DrawCountdown(AllocThreadState& t, uint64_t mean) {
  if (mean == 0) return UINT64_MAX;
  // u in (0, 1]: 53 random bits, never 0, so log(u) is finite.
  const double u = static_cast<double>((NextRandom(t) >> 11) + 1) * 0x1.0p-53;
  const double x = std::ceil(-std::log(u) * static_cast<double>(mean));
  // -log(2^-53) * mean < 37 * 2^63 only for means below 2^58; clamp.
  if (!(x < 0x1.0p62)) return uint64_t{1} << 62;
  return x < 1.0 ? 1 : static_cast<uint64_t>(x);
}
}  // namespace

void SetAllocSamplingMean(uint64_t mean_bytes) {
  g_mean.store(mean_bytes, std::memory_order_relaxed);
  g_alloc_generation.fetch_add(1, std::memory_order_release);
}

uint64_t AllocSamplingMean() { return g_mean.load(std::memory_order_relaxed); }

bool ShouldSampleAllocSlow(size_t size) {
  AllocThreadState& t = alloc_thread_state;
  if (t.guard > 0) return false;  // countdown parked by AllocGuard
  const uint64_t generation = g_alloc_generation.load(std::memory_order_acquire);
  const uint64_t mean = g_mean.load(std::memory_order_relaxed);
  if (t.generation != generation) {
    // A fresh countdown for the current mean; then this allocation counts
    // against it like any other.
    t.generation = generation;
    t.mean = mean;
    t.countdown = DrawCountdown(t, mean);
    if (size < t.countdown) {
      t.countdown -= size;
      return false;
    }
  }
  if (t.mean == 0) {  // off: park the countdown until the mean changes
    t.countdown = UINT64_MAX;
    return false;
  }
  // Crossed: this allocation is sampled. Its weight and the next
  // countdown both use t.mean, the mean of this generation (ThreadSampleMean).
  t.countdown = DrawCountdown(t, t.mean);
  return true;
}

AllocWeight SampleWeight(size_t size, uint64_t mean) {
  if (mean == 0 || size == 0) return {0.0, 0.0};
  // p = 1 - exp(-size/mean); expm1 keeps its precision when size << mean.
  const double p = -std::expm1(-static_cast<double>(size) / static_cast<double>(mean));
  if (!(p > 0.0)) return {0.0, 0.0};
  return {1.0 / p, static_cast<double>(size) / p};
}

}  // namespace inprof::internal
