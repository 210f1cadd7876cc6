// Benchmarks for inprof/pprof_writer.h: the exporter's cost per profile once
// the symbolizer is warm (the steady state of a periodic export): building
// the pprof message from 5,000 distinct stacks of 30 real addresses,
// serializing it, and gzip-compressing it.
#include "inprof/pprof_writer.h"

#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "inprof/profile_data.h"
#include "inprof/symbolizer.h"

namespace inprof {
namespace {

constexpr size_t kStacks = 5'000;
constexpr size_t kFrames = 30;
// Distinct code addresses the stacks draw from: a service's hot code.
constexpr size_t kPool = 4'000;

// `count` distinct addresses spread over this program's executable segment.
std::vector<uint64_t> CodeAddresses(size_t count) {
  Symbolizer symbolizer(/*symbolize=*/false);
  const ModuleInfo& main_module = symbolizer.modules()[0];
  const uint64_t step = (main_module.limit - main_module.start) / count;
  std::vector<uint64_t> out;
  for (size_t i = 0; i < count; ++i) out.push_back(main_module.start + i * step);
  return out;
}

// Stacks that, like real ones, share outer callers and differ towards the
// leaf; frame 0 differs between every stack. Fixed seed: comparable runs.
ProfileData MakeProfile() {
  const std::vector<uint64_t> pool = CodeAddresses(kPool);
  std::mt19937_64 rng(7);
  ProfileData data;
  data.sample_types = {{"cpu-samples", "count"}, {"cpu-time", "nanoseconds"}};
  data.period_type = {"cpu-time", "nanoseconds"};
  data.period = 10'000'000;
  data.threads.push_back({.tid = 1, .name = "main"});
  data.threads.push_back({.tid = 2, .name = "worker"});
  std::vector<uint64_t> outer(kFrames);
  for (uint64_t& a : outer) a = pool[rng() % pool.size()];
  for (size_t s = 0; s < kStacks; ++s) {
    ProfileSample sample;
    sample.thread = static_cast<uint32_t>(s % data.threads.size());
    sample.frames = outer;
    for (size_t f = 0; f < kFrames / 2; ++f) {
      sample.frames[f] = pool[rng() % pool.size()];
    }
    sample.frames[0] = pool[s % pool.size()] + s / pool.size();
    const int64_t count = 1 + static_cast<int64_t>(rng() % 20);
    sample.values = {count, count * 10'000'000};
    data.samples.push_back(std::move(sample));
  }
  return data;
}

void BM_PprofWriter_Export5000Stacks(benchmark::State& state) {
  const ProfileData data = MakeProfile();
  Symbolizer symbolizer;
  if (!EncodePprof(data, symbolizer).ok()) {  // warms the symbolizer
    state.SkipWithError("EncodePprof failed");
    return;
  }
  size_t compressed_bytes = 0;
  size_t encoded_bytes = 0;
  for (auto _ : state) {
    absl::StatusOr<std::string> encoded = EncodePprof(data, symbolizer);
    absl::StatusOr<std::string> compressed = GzipCompress(*encoded);
    encoded_bytes = encoded->size();
    compressed_bytes = compressed->size();
    benchmark::DoNotOptimize(compressed->data());
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(kStacks));
  state.counters["pprof_bytes"] = static_cast<double>(encoded_bytes);
  state.counters["gzip_bytes"] = static_cast<double>(compressed_bytes);
}
BENCHMARK(BM_PprofWriter_Export5000Stacks)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace inprof

BENCHMARK_MAIN();
