// Cost of entering and leaving a label scope (issue goal: tens of
// nanoseconds, no allocation once the strings have been seen).
#include "inprof/labels.h"

#include <string>

#include "benchmark/benchmark.h"
#include "inprof/inprof.h"

namespace inprof {
namespace {

Options BenchOptions() {
  Options options;
  options.output = "/tmp/inprof_labels_benchmark.pb.gz";
  options.cpu_period = absl::Hours(1);
  options.wall_period = absl::ZeroDuration();
  return options;
}

void BM_ScopedLabels_OneString(benchmark::State& state) {
  DefaultProfiler profiler(BenchOptions());
  auto self = profiler.RegisterThread("bench");
  for (auto _ : state) {
    ScopedLabels labels(profiler, {{"endpoint", "/api/users"}});
    benchmark::DoNotOptimize(labels.attached());
  }
}
BENCHMARK(BM_ScopedLabels_OneString);

void BM_ScopedLabels_DatadogTrio(benchmark::State& state) {
  DefaultProfiler profiler(BenchOptions());
  auto self = profiler.RegisterThread("bench");
  int64_t span = 1;
  for (auto _ : state) {
    ScopedLabels labels(profiler, {{kSpanIdLabel, ++span},
                                   {kLocalRootSpanIdLabel, 42},
                                   {kTraceEndpointLabel, "GET /api/users"}});
    benchmark::DoNotOptimize(labels.attached());
  }
}
BENCHMARK(BM_ScopedLabels_DatadogTrio);

void BM_ScopedLabels_Unregistered(benchmark::State& state) {
  for (auto _ : state) {
    ScopedLabels labels({{"endpoint", "/api/users"}});
    benchmark::DoNotOptimize(labels.attached());
  }
}
BENCHMARK(BM_ScopedLabels_Unregistered);

}  // namespace
}  // namespace inprof

BENCHMARK_MAIN();
