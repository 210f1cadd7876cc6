// The cost of the lock hooks (src/alloc/lock_hooks_linux.cc): an
// uncontended std::mutex lock+unlock and an uncontended std::shared_mutex
// read lock+unlock through the benchmark's own PLT, with its GOT slots
// unpatched and patched (period 1 ms: the wrapper's try-first path), and a
// contended std::mutex (two threads, one short critical section each)
// unpatched and patched at a period of 1 ns, where every wait that finds
// the lock busy is timed and sampled into a callback. Report medians:
//   lock_hooks_benchmark --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <shared_mutex>
#include <thread>

#include "benchmark/benchmark.h"
#include "inprof/alloc/lock_hooks.h"

namespace {

using inprof::internal::LockHooks;
using inprof::internal::LockWait;

void NoteWait(void*, const LockWait& wait) { benchmark::DoNotOptimize(wait.delay_ns); }

void Install(uint64_t period_ns) {
  LockHooks::Options options;
  options.period_ns = period_ns;
  options.callback = NoteWait;
  if (!LockHooks::Install(options).ok()) std::abort();
}

std::mutex g_mutex;
std::shared_mutex g_shared;

void MutexLoop(benchmark::State& state) {
  for (auto _ : state) {
    g_mutex.lock();
    benchmark::ClobberMemory();
    g_mutex.unlock();
  }
}

void SharedLoop(benchmark::State& state) {
  for (auto _ : state) {
    g_shared.lock_shared();
    benchmark::ClobberMemory();
    g_shared.unlock_shared();
  }
}

void BM_LockHooks_Mutex_Unpatched(benchmark::State& state) { MutexLoop(state); }
void BM_LockHooks_Mutex_Patched(benchmark::State& state) {
  Install(1'000'000);
  MutexLoop(state);
  LockHooks::Uninstall();
}
void BM_LockHooks_SharedRead_Unpatched(benchmark::State& state) { SharedLoop(state); }
void BM_LockHooks_SharedRead_Patched(benchmark::State& state) {
  Install(1'000'000);
  SharedLoop(state);
  LockHooks::Uninstall();
}

// Two threads on one mutex: the hooks are installed by thread 0 before the
// loop (the others wait at the loop's start barrier).
void BM_LockHooks_Contended_Unpatched(benchmark::State& state) { MutexLoop(state); }
void BM_LockHooks_Contended_SampledEveryWait(benchmark::State& state) {
  if (state.thread_index() == 0) Install(1);
  MutexLoop(state);
  if (state.thread_index() == 0) {
    state.counters["timed_waits"] = static_cast<double>(LockHooks::stats().waits);
    LockHooks::Uninstall();
  }
}

BENCHMARK(BM_LockHooks_Mutex_Unpatched);
BENCHMARK(BM_LockHooks_Mutex_Patched);
BENCHMARK(BM_LockHooks_SharedRead_Unpatched);
BENCHMARK(BM_LockHooks_SharedRead_Patched);
BENCHMARK(BM_LockHooks_Contended_Unpatched)->Threads(2)->UseRealTime();
BENCHMARK(BM_LockHooks_Contended_SampledEveryWait)->Threads(2)->UseRealTime();

}  // namespace

// A program whose locks matter has threads: glibc locks a mutex of a
// process that never started one with a plain store instead of an atomic
// instruction (__libc_single_threaded), which pthread_mutex_trylock does not
// do. A thread that only sleeps makes the process multi-threaded from the
// start, so that both sides are measured as such a program runs them.
int main(int argc, char** argv) {
  std::thread([] {
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
  }).detach();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
