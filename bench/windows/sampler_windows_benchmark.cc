// What one Windows sample costs, under Wine or on Windows: reading a
// thread's counters (every registered thread, every tick), suspending it
// and copying its stack (the part the thread waits for), and walking the
// copy with the OS's unwinder, by stack depth.
//
//   bash scripts/windows.sh bench
#include <windows.h>

#include <atomic>
#include <thread>

#include "benchmark/benchmark.h"
#include "inprof/internal/thread_snapshot_windows.h"
#include "inprof/windows/os_unwinder_windows.h"
#include "inprof/windows/sample_provider_windows.h"

namespace {

volatile uint64_t g_sink;

__attribute__((noinline)) void Recurse(int depth, const std::atomic<bool>& stop) {
  if (depth > 0) {
    Recurse(depth - 1, stop);
    g_sink = g_sink + 1;
    return;
  }
  while (!stop.load(std::memory_order_relaxed)) g_sink = g_sink + 1;
}

// A thread spinning `depth` frames deep, with a handle to sample it.
class SpinningThread {
 public:
  explicit SpinningThread(int depth) {
    thread_ = std::thread([this, depth] {
      ULONG_PTR lo = 0, hi = 0;
      GetCurrentThreadStackLimits(&lo, &hi);
      bounds_ = inprof::StackBounds{lo, hi};
      DuplicateHandle(GetCurrentProcess(), GetCurrentThread(), GetCurrentProcess(), &handle_,
                      THREAD_SUSPEND_RESUME | THREAD_GET_CONTEXT | THREAD_QUERY_INFORMATION,
                      FALSE, 0);
      ready_ = true;
      Recurse(depth, stop_);
    });
    while (!ready_) Sleep(1);
    Sleep(20);
  }
  ~SpinningThread() {
    stop_ = true;
    thread_.join();
    CloseHandle(handle_);
  }
  HANDLE handle() const { return handle_; }
  const inprof::StackBounds& bounds() const { return bounds_; }

 private:
  std::atomic<bool> ready_{false}, stop_{false};
  HANDLE handle_ = nullptr;
  inprof::StackBounds bounds_;
  std::thread thread_;
};

void BM_ThreadTimes_Read(benchmark::State& state) {
  SpinningThread t(8);
  for (auto _ : state) {
    benchmark::DoNotOptimize(inprof::internal::ReadThreadTimes(t.handle()));
  }
}
BENCHMARK(BM_ThreadTimes_Read);

void BM_ThreadSnapshot_Capture(benchmark::State& state) {
  SpinningThread t(static_cast<int>(state.range(0)));
  inprof::internal::ThreadSnapshotter snapshotter;
  for (auto _ : state) {
    benchmark::DoNotOptimize(snapshotter.Capture(t.handle(), t.bounds()));
  }
  state.counters["stack_bytes"] = static_cast<double>(snapshotter.stack_bytes());
}
BENCHMARK(BM_ThreadSnapshot_Capture)->Arg(8)->Arg(64)->Arg(512);

void BM_OsUnwinder_Unwind(benchmark::State& state) {
  SpinningThread t(static_cast<int>(state.range(0)));
  inprof::internal::ThreadSnapshotter snapshotter;
  if (snapshotter.Capture(t.handle(), t.bounds()) != inprof::internal::SnapshotOutcome::kOk) {
    state.SkipWithError("cannot snapshot the thread");
    return;
  }
  inprof::OsUnwinder unwinder;
  uintptr_t frames[600];
  size_t depth = 0;
  for (auto _ : state) {
    depth = unwinder.Unwind(snapshotter.snapshot(), t.bounds(), frames).depth;
    benchmark::DoNotOptimize(frames);
  }
  state.counters["frames"] = static_cast<double>(depth);
}
BENCHMARK(BM_OsUnwinder_Unwind)->Arg(8)->Arg(64)->Arg(512);

}  // namespace

BENCHMARK_MAIN();
