// Benchmarks for inprof/symbolizer.h: what an export pays to name the
// addresses of its stacks, the first time (cold: module sessions opened,
// symbol tables and DWARF read) and on later exports (warm: cache hits).
//
// The addresses are 10,000 distinct ones spread evenly over the executable
// segments of this program (DWARF: file:line and inline frames) and of
// libstdc++ (.symtab/.dynsym only on a machine without its debug package).
#include "inprof/symbolizer.h"

#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

#include "absl/strings/match.h"

namespace inprof {
namespace {

constexpr size_t kAddresses = 10'000;

// `count` distinct addresses spread evenly over `module`'s segment.
void SpreadOver(const ModuleInfo& module, size_t count,
                std::vector<uint64_t>* out) {
  const uint64_t size = module.limit - module.start;
  const uint64_t step = size / count > 0 ? size / count : 1;
  for (size_t i = 0; i < count && i * step < size; ++i) {
    out->push_back(module.start + i * step);
  }
}

// Half in this program's text, half in libstdc++'s (all in this program's
// when libstdc++ is not loaded as a shared library).
std::vector<uint64_t> BenchmarkAddresses() {
  Symbolizer symbolizer(/*symbolize=*/false);
  const std::vector<ModuleInfo>& modules = symbolizer.modules();
  const ModuleInfo* libstdcxx = nullptr;
  for (const ModuleInfo& m : modules) {
    if (absl::StrContains(m.path, "libstdc++")) libstdcxx = &m;
  }
  std::vector<uint64_t> addresses;
  if (libstdcxx != nullptr) {
    SpreadOver(modules[0], kAddresses / 2, &addresses);
    SpreadOver(*libstdcxx, kAddresses - addresses.size(), &addresses);
  } else {
    SpreadOver(modules[0], kAddresses, &addresses);
  }
  return addresses;
}

// A new Symbolizer per iteration: module map scan, libdwfl sessions opened,
// symbols and DWARF read, every address resolved for the first time.
void BM_Symbolizer_Cold(benchmark::State& state) {
  const std::vector<uint64_t> addresses = BenchmarkAddresses();
  size_t named = 0;
  for (auto _ : state) {
    Symbolizer symbolizer;
    for (uint64_t a : addresses) {
      const SymbolizedAddress& r = symbolizer.Lookup(a, true);
      named += r.frames.empty() ? 0 : 1;
      benchmark::DoNotOptimize(&r);
    }
  }
  state.SetItemsProcessed(state.iterations() *
                          static_cast<int64_t>(addresses.size()));
  state.counters["named_fraction"] =
      static_cast<double>(named) /
      static_cast<double>(state.iterations() * addresses.size());
}
BENCHMARK(BM_Symbolizer_Cold)->Unit(benchmark::kMillisecond);

// What the last export of a short run pays: a fresh Symbolizer (system
// libraries named from their symbol tables, the Profiler's default) and a
// handful of addresses, as in a profile of a program that did little: one
// in this program (file:line from its DWARF), a few in libc and libstdc++.
__attribute__((noinline)) void FewAddressesMarker() { benchmark::ClobberMemory(); }

void BM_Symbolizer_FewAddressesFresh(benchmark::State& state) {
  std::vector<uint64_t> addresses = {
      reinterpret_cast<uint64_t>(&FewAddressesMarker) + 1,
      reinterpret_cast<uint64_t>(&std::getenv) + 4,
      reinterpret_cast<uint64_t>(&std::qsort) + 4,
      reinterpret_cast<uint64_t>(&clock_gettime) + 4,
  };
  {
    Symbolizer probe(/*symbolize=*/false);
    for (const ModuleInfo& m : probe.modules()) {
      if (absl::StrContains(m.path, "libstdc++")) {
        addresses.push_back(m.start + (m.limit - m.start) / 3);
        addresses.push_back(m.start + (m.limit - m.start) / 2);
      }
    }
  }
  size_t named = 0;
  for (auto _ : state) {
    Symbolizer symbolizer;
    symbolizer.set_system_debug_info(false);
    for (uint64_t a : addresses) {
      const SymbolizedAddress& r = symbolizer.Lookup(a, true);
      named += r.frames.empty() ? 0 : 1;
      benchmark::DoNotOptimize(&r);
    }
  }
  state.counters["named_fraction"] =
      static_cast<double>(named) /
      static_cast<double>(state.iterations() * addresses.size());
}
BENCHMARK(BM_Symbolizer_FewAddressesFresh)->Unit(benchmark::kMillisecond);

// The same addresses on a Symbolizer that has seen them: one hash lookup
// each, as in every export after the first.
void BM_Symbolizer_Warm(benchmark::State& state) {
  const std::vector<uint64_t> addresses = BenchmarkAddresses();
  Symbolizer symbolizer;
  for (uint64_t a : addresses) symbolizer.Lookup(a, true);
  for (auto _ : state) {
    for (uint64_t a : addresses) {
      benchmark::DoNotOptimize(&symbolizer.Lookup(a, true));
    }
  }
  state.SetItemsProcessed(state.iterations() *
                          static_cast<int64_t>(addresses.size()));
  state.counters["cached_addresses"] =
      static_cast<double>(symbolizer.cached_addresses());
  state.counters["cached_bytes_per_address"] =
      static_cast<double>(symbolizer.cached_bytes()) /
      static_cast<double>(symbolizer.cached_addresses());
}
BENCHMARK(BM_Symbolizer_Warm)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace inprof

BENCHMARK_MAIN();
