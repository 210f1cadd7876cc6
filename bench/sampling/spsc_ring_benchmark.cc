// Benchmarks for inprof/spsc_ring.h: the cost of one push and pop on a
// single thread (what a signal handler plus the collector pay per sample when
// nothing contends), and the throughput between two threads (the indices'
// cache lines bouncing between cores).
#include "inprof/spsc_ring.h"

#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

namespace inprof {
namespace {

// The ring a profiled thread owns (32 KiB); large enough that a push/pop pair
// on one thread never finds it full.
using RecordRing = DefaultSampleRing;
using TypedRing = SpscRing<uint64_t, 1024>;

void BM_SpscRing_PushPop(benchmark::State& state) {
  auto ring = std::make_unique<TypedRing>();
  uint64_t value = 0;
  for (auto _ : state) {
    if (!ring->TryPush(value++)) {
      state.SkipWithError("push failed on an empty ring");
      break;
    }
    std::optional<uint64_t> out = ring->TryPop();
    benchmark::DoNotOptimize(out);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}
BENCHMARK(BM_SpscRing_PushPop);

// Arg: payload words per record (a sample is 3 words of header and values
// plus one word per frame).
void BM_SpscRecordRing_PushPop(benchmark::State& state) {
  const auto words = static_cast<size_t>(state.range(0));
  auto ring = std::make_unique<RecordRing>();
  std::vector<uint64_t> record(words);
  for (size_t i = 0; i < words; ++i) record[i] = 0x401000 + i * 16;
  std::vector<uint64_t> out(words);
  for (auto _ : state) {
    if (!ring->TryPush(record)) {
      state.SkipWithError("push failed on an empty ring");
      break;
    }
    const size_t n = ring->TryPop(out);
    benchmark::DoNotOptimize(n);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * words *
                                               sizeof(uint64_t)));
}
BENCHMARK(BM_SpscRecordRing_PushPop)->Arg(4)->Arg(16)->Arg(64)->Arg(512);

// Items moved per iteration of the two-thread benchmarks; large enough that
// the per-iteration bookkeeping of the benchmark loop is noise.
constexpr int64_t kBatch = 4096;

// A producer thread pushes 1..N while the benchmark thread pops them; both
// spin (yielding, since the machine may have only 2 cores) when the ring is
// full or empty. The consumer's sum checks that nothing was lost or
// duplicated.
void BM_SpscRing_TwoThreads(benchmark::State& state) {
  auto ring = std::make_unique<TypedRing>();
  const uint64_t total =
      static_cast<uint64_t>(state.max_iterations) * static_cast<uint64_t>(kBatch);
  std::thread producer([&ring, total] {
    for (uint64_t v = 1; v <= total; ++v) {
      while (!ring->TryPush(v)) std::this_thread::yield();
    }
  });
  uint64_t sum = 0;
  for (auto _ : state) {
    for (int64_t i = 0; i < kBatch; ++i) {
      std::optional<uint64_t> v;
      while (!(v = ring->TryPop())) std::this_thread::yield();
      sum += *v;
    }
  }
  producer.join();
  const uint64_t popped = static_cast<uint64_t>(state.iterations()) *
                          static_cast<uint64_t>(kBatch);
  if (popped == total && sum != total * (total + 1) / 2) {
    state.SkipWithError("checksum mismatch: items lost or duplicated");
  }
  state.SetItemsProcessed(static_cast<int64_t>(popped));
  // Drops count refused pushes; here they are the producer's retries.
  state.counters["full_retries"] = benchmark::Counter(
      static_cast<double>(ring->dropped()), benchmark::Counter::kAvgIterations);
}
BENCHMARK(BM_SpscRing_TwoThreads)->UseRealTime();

// The same with variable-length records. Arg: payload words per record.
void BM_SpscRecordRing_TwoThreads(benchmark::State& state) {
  const auto words = static_cast<size_t>(state.range(0));
  auto ring = std::make_unique<RecordRing>();
  const uint64_t total =
      static_cast<uint64_t>(state.max_iterations) * static_cast<uint64_t>(kBatch);
  std::thread producer([&ring, total, words] {
    std::vector<uint64_t> record(words);
    for (uint64_t v = 1; v <= total; ++v) {
      record[0] = v;
      while (!ring->TryPush(record)) std::this_thread::yield();
    }
  });
  std::vector<uint64_t> out(words);
  uint64_t sum = 0;
  for (auto _ : state) {
    for (int64_t i = 0; i < kBatch; ++i) {
      while (ring->TryPop(out) == 0) std::this_thread::yield();
      sum += out[0];
    }
  }
  producer.join();
  const uint64_t popped = static_cast<uint64_t>(state.iterations()) *
                          static_cast<uint64_t>(kBatch);
  if (popped == total && sum != total * (total + 1) / 2) {
    state.SkipWithError("checksum mismatch: records lost or duplicated");
  }
  state.SetItemsProcessed(static_cast<int64_t>(popped));
  state.SetBytesProcessed(
      static_cast<int64_t>(popped * words * sizeof(uint64_t)));
}
BENCHMARK(BM_SpscRecordRing_TwoThreads)->Arg(4)->Arg(64)->UseRealTime();

}  // namespace
}  // namespace inprof

BENCHMARK_MAIN();
