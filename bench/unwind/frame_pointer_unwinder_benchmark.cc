// Benchmarks for inprof/frame_pointer_unwinder.h: the cost of one walk over
// a real stack of a given depth, i.e. the unwinding part of one sample in the
// signal handler.
#include "inprof/frame_pointer_unwinder.h"

#include <pthread.h>

#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "inprof/unwinder.h"

namespace inprof {
namespace {

// Room for the deepest recursion benchmarked plus the frames of the
// benchmark library, main and libc below it.
constexpr size_t kMaxOut = 1024;

// The calling thread's stack, as the profiler captures it at registration.
bool CurrentStackBounds(StackBounds& bounds) {
  pthread_attr_t attr;
  if (pthread_getattr_np(pthread_self(), &attr) != 0) return false;
  void* addr = nullptr;
  size_t size = 0;
  const bool ok = pthread_attr_getstack(&attr, &addr, &size) == 0;
  pthread_attr_destroy(&attr);
  if (!ok) return false;
  bounds.lo = reinterpret_cast<uintptr_t>(addr);
  bounds.hi = bounds.lo + size;
  return true;
}

// A pc inside the caller: the address this call returns to.
__attribute__((noinline)) uintptr_t CallerPc() {
  return reinterpret_cast<uintptr_t>(__builtin_return_address(0));
}

// The bottom of the recursion: walks the real stack above it in a loop.
__attribute__((noinline)) void UnwindLoop(benchmark::State& state,
                                          size_t depth) {
  StackBounds bounds;
  if (!CurrentStackBounds(bounds)) {
    state.SkipWithError("pthread_getattr_np failed");
    return;
  }
  // A local's address stands in for the stack pointer: it lies below this
  // frame's record, as the interrupted sp does in a signal handler.
  uintptr_t local = 0;
  benchmark::DoNotOptimize(local);
  const RegisterState regs{
      CallerPc(), reinterpret_cast<uintptr_t>(&local),
      reinterpret_cast<uintptr_t>(__builtin_frame_address(0))};
  std::vector<uintptr_t> out(kMaxOut);
  const FramePointerUnwinder unwinder;
  UnwindResult result;
  for (auto _ : state) {
    result = unwinder.UnwindFrom(regs, bounds, out);
    benchmark::DoNotOptimize(result);
    benchmark::DoNotOptimize(out.data());
  }
  // pc, this frame's return into Recurse(0), then one per Recurse level.
  if (result.depth < depth) {
    state.SkipWithError("the walk stopped above the recursion's bottom");
    return;
  }
  state.counters["frames"] = static_cast<double>(result.depth);
  state.counters["truncated"] = result.truncated ? 1 : 0;
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(result.depth));
}

// `remaining` real frames (compiled with -fno-omit-frame-pointer like the
// rest of the project), then the benchmark loop. The work after the call
// keeps it from becoming a tail call (which would reuse the frame).
__attribute__((noinline)) size_t Recurse(benchmark::State& state,
                                         size_t remaining, size_t depth) {
  if (remaining == 0) {
    UnwindLoop(state, depth);
  } else {
    Recurse(state, remaining - 1, depth);
  }
  benchmark::DoNotOptimize(remaining);
  return remaining;
}

// Arg: recursion depth in frames.
void BM_FramePointerUnwinder_Depth(benchmark::State& state) {
  const auto depth = static_cast<size_t>(state.range(0));
  benchmark::DoNotOptimize(Recurse(state, depth, depth));
}
BENCHMARK(BM_FramePointerUnwinder_Depth)->Arg(8)->Arg(32)->Arg(128)->Arg(512);

}  // namespace
}  // namespace inprof

BENCHMARK_MAIN();
