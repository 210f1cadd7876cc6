// The cost of the allocation hooks (src/alloc): malloc(48) + free through
// the benchmark's own PLT, with its GOT slots unpatched, patched and
// unsampled (mean 512 KiB: one 48-byte allocation in ~11,000 is sampled,
// and mean 0: off), patched and always sampled (mean 1, into a live table;
// and with the table telling a LivePeak, for the peak_inuse_* types),
// and free of a sampled block alone; then `new char[48]` + `delete[]` and
// malloc(48) + free with every loaded object patched (libstdc++'s operator
// new[] calls operator new and malloc through slots of its own: the chain
// a real program pays) beside a live table holding 20,000 sampled blocks
// (a 10 GiB heap at the 512 KiB default). Report medians:
//   alloc_hooks_benchmark --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <cstdlib>
#include <vector>

#include "benchmark/benchmark.h"
#include "inprof/alloc/alloc_hooks.h"
#include "inprof/alloc/live_heap_table.h"
#include "inprof/alloc/live_peak.h"

namespace {

using inprof::internal::AllocHooks;
using inprof::internal::AllocSample;
using inprof::internal::LiveHeapTable;

// Only the benchmark program's own slots: what it calls is what is timed.
bool MainProgramOnly(const char* path) { return path[0] == '\0'; }

uint64_t NoteSample(void*, const AllocSample& sample) {
  benchmark::DoNotOptimize(sample.address);
  return 0;
}

LiveHeapTable& Live() {
  static LiveHeapTable* live = new LiveHeapTable(1 << 16);  // 2 MiB
  return *live;
}

void Install(uint64_t mean) {
  AllocHooks::Options options;
  options.mean_bytes = mean;
  options.object_filter = MainProgramOnly;
  options.callback = NoteSample;
  options.live = &Live();
  if (!AllocHooks::Install(options).ok()) std::abort();
}

// 20,000 entries at addresses inside one live block of ours: never an
// address malloc hands out while it lives.
void PopulateLive() {
  static char* block = [] {
    constexpr size_t kEntries = 20'000;
    char* b = static_cast<char*>(std::malloc(kEntries * 64));
    for (size_t i = 0; i < kEntries; ++i) {
      Live().Insert(b + i * 64, {48, 10922.0, 0});
    }
    return b;
  }();
  benchmark::DoNotOptimize(block);
}

void InstallEverywhere(uint64_t mean) {
  PopulateLive();
  AllocHooks::Options options;
  options.mean_bytes = mean;
  options.callback = NoteSample;
  options.live = &Live();
  if (!AllocHooks::Install(options).ok()) std::abort();
}

void NewDeleteLoop(benchmark::State& state) {
  for (auto _ : state) {
    char* p = new char[48];
    benchmark::DoNotOptimize(p);
    delete[] p;
  }
}

void BM_AllocHooks_NewDeleteArray_Unpatched(benchmark::State& state) {
  PopulateLive();
  NewDeleteLoop(state);
}
BENCHMARK(BM_AllocHooks_NewDeleteArray_Unpatched);

void BM_AllocHooks_NewDeleteArray_PatchedEverywhereUnsampled(benchmark::State& state) {
  InstallEverywhere(512 * 1024);
  NewDeleteLoop(state);
  AllocHooks::Uninstall();
}
BENCHMARK(BM_AllocHooks_NewDeleteArray_PatchedEverywhereUnsampled);

void MallocFreeLoop(benchmark::State& state);

void BM_AllocHooks_MallocFree_PatchedEverywhereUnsampled(benchmark::State& state) {
  InstallEverywhere(512 * 1024);
  MallocFreeLoop(state);
  AllocHooks::Uninstall();
}
BENCHMARK(BM_AllocHooks_MallocFree_PatchedEverywhereUnsampled);

void MallocFreeLoop(benchmark::State& state) {
  for (auto _ : state) {
    void* p = std::malloc(48);
    benchmark::DoNotOptimize(p);
    std::free(p);
  }
}

void BM_AllocHooks_MallocFree_Unpatched(benchmark::State& state) { MallocFreeLoop(state); }
BENCHMARK(BM_AllocHooks_MallocFree_Unpatched);

void BM_AllocHooks_MallocFree_PatchedUnsampled(benchmark::State& state) {
  Install(512 * 1024);
  MallocFreeLoop(state);
  AllocHooks::Uninstall();
}
BENCHMARK(BM_AllocHooks_MallocFree_PatchedUnsampled);

void BM_AllocHooks_MallocFree_PatchedOff(benchmark::State& state) {
  Install(0);
  MallocFreeLoop(state);
  AllocHooks::Uninstall();
}
BENCHMARK(BM_AllocHooks_MallocFree_PatchedOff);

void BM_AllocHooks_MallocFree_PatchedSampled(benchmark::State& state) {
  Install(1);
  MallocFreeLoop(state);
  AllocHooks::Uninstall();
}
BENCHMARK(BM_AllocHooks_MallocFree_PatchedSampled);

// The same with the live table telling a LivePeak (the peak_inuse_*
// types): what the peak adds to each sampled allocation and free.
void BM_AllocHooks_MallocFree_PatchedSampledWithPeak(benchmark::State& state) {
  static inprof::internal::LivePeak* peak = new inprof::internal::LivePeak(1 << 16);
  Live().SetPeak(peak);
  Install(1);
  MallocFreeLoop(state);
  AllocHooks::Uninstall();
  Live().SetPeak(nullptr);
}
BENCHMARK(BM_AllocHooks_MallocFree_PatchedSampledWithPeak);

// free alone, of blocks that were all sampled (in the live table), against
// free of unsampled blocks through the same patched slot.
void FreeBatches(benchmark::State& state, uint64_t mean) {
  constexpr int kBatch = 1000;
  std::vector<void*> blocks(kBatch);
  Install(mean);
  for (auto _ : state) {
    state.PauseTiming();
    for (void*& p : blocks) p = std::malloc(48);
    state.ResumeTiming();
    for (void* p : blocks) std::free(p);
  }
  AllocHooks::Uninstall();
  state.SetItemsProcessed(state.iterations() * kBatch);
}
void BM_AllocHooks_Free_Sampled(benchmark::State& state) { FreeBatches(state, 1); }
BENCHMARK(BM_AllocHooks_Free_Sampled);
void BM_AllocHooks_Free_Unsampled(benchmark::State& state) { FreeBatches(state, 0); }
BENCHMARK(BM_AllocHooks_Free_Unsampled);

}  // namespace

BENCHMARK_MAIN();
