// What one export window costs the exporter thread, and how long the cut
// holds the aggregate's lock (the only moment the collector can wait on the
// exporter; sampled threads never do).
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "benchmark/benchmark.h"
#include "inprof/internal/pipeline.h"
#include "inprof/sink.h"
#include "inprof/symbolizer.h"

namespace inprof {
namespace {

class DiscardSink : public ProfileSink {
 public:
  absl::string_view name() const override { return "discard"; }
  absl::Status Consume(std::shared_ptr<const ExportedProfile> p) override {
    bytes = p->pprof.size();
    return absl::OkStatus();
  }
  size_t bytes = 0;
};

// Addresses spread over this program's code, so that symbolization does
// real lookups.
std::vector<uint64_t> CodeAddresses(size_t n) {
  Symbolizer symbolizer(false);
  symbolizer.Refresh();
  const ModuleInfo& m = symbolizer.modules().at(0);
  std::vector<uint64_t> out;
  const uint64_t step = (m.limit - m.start) / (n + 1);
  for (size_t i = 1; i <= n; ++i) out.push_back(m.start + i * step);
  return out;
}

// Four threads, registered once as the profiler does.
std::vector<uint32_t> AddThreads(SampleAggregator& agg) {
  std::vector<uint32_t> threads;
  for (int t = 0; t < 4; ++t) threads.push_back(agg.AddThread(100 + t, "worker"));
  return threads;
}

// `stacks` distinct stacks of depth 16 over the threads.
void Fill(SampleAggregator& agg, const std::vector<uint32_t>& threads,
          const std::vector<uint64_t>& code, int64_t stacks) {
  uint64_t frames[16];
  for (int64_t s = 0; s < stacks; ++s) {
    for (int d = 0; d < 16; ++d) {
      frames[d] = code[(static_cast<size_t>(s) * 7 + d * 13) % code.size()] +
                  static_cast<uint64_t>(s / code.size()) % 3;
    }
    const int64_t values[] = {1, 10'000'000};
    agg.Add(threads[s % 4], std::span<const uint64_t>(frames, 16), 0, values);
  }
}

void ExportWindow(benchmark::State& state, bool symbolize) {
  const int64_t stacks = state.range(0);
  auto sink = std::make_shared<DiscardSink>();
  Options options;
  options.write_output = false;
  options.symbolize = symbolize;
  options.export_period = absl::ZeroDuration();
  options.sinks = {sink};
  internal::Pipeline core(
      options, {{"cpu-samples", "count"}, {"cpu-time", "nanoseconds"}},
      {"cpu-time", "nanoseconds"}, 10'000'000, "bench");
  const std::vector<uint64_t> code = CodeAddresses(2000);
  std::vector<uint32_t> threads;
  {
    internal::Pipeline::Ingesting ingest = core.Ingest();
    threads = AddThreads(ingest.aggregator());
  }
  for (auto _ : state) {
    state.PauseTiming();
    {
      internal::Pipeline::Ingesting ingest = core.Ingest();
      Fill(ingest.aggregator(), threads, code, stacks);
    }
    state.ResumeTiming();
    benchmark::DoNotOptimize(core.Export(ProfilerStats()));
  }
  state.counters["pprof_bytes"] = static_cast<double>(sink->bytes);
}

// Symbolize, encode, gzip, hand to a sink; the symbolizer's cache is warm
// after the first window, as it is for a long-running process.
void BM_Export_Window(benchmark::State& state) { ExportWindow(state, true); }
BENCHMARK(BM_Export_Window)->Range(64, 16384)->Unit(benchmark::kMillisecond);

void BM_Export_WindowUnsymbolized(benchmark::State& state) {
  ExportWindow(state, false);
}
BENCHMARK(BM_Export_WindowUnsymbolized)
    ->Range(64, 16384)
    ->Unit(benchmark::kMillisecond);

// The cut: SampleAggregator::Take() under the lock (timed alone: the refill
// in between is not).
void BM_Export_CutHoldsLock(benchmark::State& state) {
  const std::vector<uint64_t> code = CodeAddresses(2000);
  SampleAggregator agg({{"cpu-samples", "count"}, {"cpu-time", "nanoseconds"}});
  const std::vector<uint32_t> threads = AddThreads(agg);
  for (auto _ : state) {
    Fill(agg, threads, code, state.range(0));
    const auto start = std::chrono::steady_clock::now();
    ProfileData data = agg.Take();
    const auto stop = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(data);
    state.SetIterationTime(std::chrono::duration<double>(stop - start).count());
  }
}
BENCHMARK(BM_Export_CutHoldsLock)
    ->Range(64, 16384)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace inprof

BENCHMARK_MAIN();
