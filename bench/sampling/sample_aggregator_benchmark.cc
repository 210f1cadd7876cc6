// Benchmarks for inprof/sample_aggregator.h: what the collector pays per
// drained sample (Add on a known stack, the steady state) and per export
// (Take).
#include "inprof/sample_aggregator.h"

#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "inprof/profile_data.h"

namespace inprof {
namespace {

// Frames per stack: a typical depth for a service's sampled stacks.
constexpr size_t kFrames = 32;

std::vector<ValueType> CpuTypes() {
  return {{"cpu-samples", "count"}, {"cpu-time", "nanoseconds"}};
}

// `count` distinct stacks of kFrames frames laid out back to back. Like real
// stacks they share their outer callers and differ towards the leaf. The
// fixed seed keeps runs comparable.
std::vector<uint64_t> MakeStacks(size_t count) {
  std::mt19937_64 rng(42);
  std::vector<uint64_t> common(kFrames);
  for (uint64_t& pc : common) pc = 0x400000 + (rng() & 0xfffff);
  std::vector<uint64_t> stacks(count * kFrames);
  for (size_t s = 0; s < count; ++s) {
    uint64_t* stack = &stacks[s * kFrames];
    for (size_t f = 0; f < kFrames; ++f) stack[f] = common[f];
    // The leaf half differs; the stack index in frame 0 keeps them distinct.
    for (size_t f = 0; f < kFrames / 2; ++f) {
      stack[f] = 0x500000 + (rng() & 0xfffff);
    }
    stack[0] = 0x700000 + s * 16;
  }
  return stacks;
}

std::span<const uint64_t> StackAt(const std::vector<uint64_t>& stacks,
                                  size_t i) {
  return std::span<const uint64_t>(stacks).subspan(i * kFrames, kFrames);
}

// Arg: distinct stacks. Every stack is known before timing starts, so this
// is the steady state: one hash, one lookup, one compare, two additions.
void BM_SampleAggregator_Add(benchmark::State& state) {
  const auto count = static_cast<size_t>(state.range(0));
  const std::vector<uint64_t> stacks = MakeStacks(count);
  SampleAggregator agg(CpuTypes());
  const uint32_t thread = agg.AddThread(1, "main");
  const int64_t values[] = {1, 10'000'000};
  for (size_t i = 0; i < count; ++i) {
    agg.Add(thread, StackAt(stacks, i), 0, values);
  }
  if (agg.num_stacks() != count) {
    state.SkipWithError("distinct stacks were merged");
    return;
  }
  size_t i = 0;
  for (auto _ : state) {
    agg.Add(thread, StackAt(stacks, i), 0, values);
    if (++i == count) i = 0;
  }
  benchmark::DoNotOptimize(agg.records_added());
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}
BENCHMARK(BM_SampleAggregator_Add)->Range(1, 1 << 14);

// Arg: distinct stacks. Times Take() alone; refilling the aggregate (which
// allocates every stack anew) is excluded.
void BM_SampleAggregator_Take(benchmark::State& state) {
  const auto count = static_cast<size_t>(state.range(0));
  const std::vector<uint64_t> stacks = MakeStacks(count);
  SampleAggregator agg(CpuTypes());
  const uint32_t thread = agg.AddThread(1, "main");
  const int64_t values[] = {1, 10'000'000};
  for (auto _ : state) {
    state.PauseTiming();
    for (size_t i = 0; i < count; ++i) {
      agg.Add(thread, StackAt(stacks, i), 0, values);
    }
    state.ResumeTiming();
    ProfileData data = agg.Take();
    benchmark::DoNotOptimize(data.samples.data());
    if (data.samples.size() != count) {
      state.SkipWithError("Take returned the wrong number of stacks");
      break;
    }
    // The profile's destruction belongs to the exporter, not to Take.
    state.PauseTiming();
    data = ProfileData();
    state.ResumeTiming();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(count));
}
BENCHMARK(BM_SampleAggregator_Take)->Range(64, 1 << 14);

}  // namespace
}  // namespace inprof

BENCHMARK_MAIN();
