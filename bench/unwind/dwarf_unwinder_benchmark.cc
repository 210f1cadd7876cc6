// Benchmarks for inprof/dwarf_unwinder.h: the cost of one CFI walk over a
// real stack of a given depth next to the frame-pointer walk of the same
// stack (the unwinding part of one sample in the signal handler), the walk
// through frames without frame pointers, and the tables' build time and
// memory per module.
#include "inprof/dwarf_unwinder.h"

#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <random>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "inprof/cpu_time_provider.h"
#include "inprof/frame_pointer_unwinder.h"
#include "inprof/internal/cfi_table.h"
#include "inprof/internal/cfi_walk.h"
#include "inprof/internal/signal_dispatch.h"
#include "inprof/options.h"
#include "inprof/profiler.h"
#include "inprof/spsc_ring.h"
#include "inprof/unwinder.h"

namespace inprof {
namespace {

// Room for the deepest recursion benchmarked plus the frames of the
// benchmark library, main and libc below it.
constexpr size_t kMaxOut = 1024;

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

__attribute__((noinline)) uintptr_t CallerPc() {
  return reinterpret_cast<uintptr_t>(__builtin_return_address(0));
}

enum class Walker { kFramePointer, kDwarf, kDwarfUncached };

// The bottom of the recursion: walks the real stack above it in a loop.
template <Walker W>
__attribute__((noinline)) void UnwindLoop(benchmark::State& state,
                                          size_t depth) {
  StackBounds bounds;
  if (!CurrentStackBounds(bounds)) {
    state.SkipWithError("pthread_getattr_np failed");
    return;
  }
  uintptr_t local = 0;
  benchmark::DoNotOptimize(local);
  const RegisterState regs{
      CallerPc(), reinterpret_cast<uintptr_t>(&local),
      reinterpret_cast<uintptr_t>(__builtin_frame_address(0))};
  std::vector<uintptr_t> out(kMaxOut);
  UnwindResult result;
  for (auto _ : state) {
    if constexpr (W == Walker::kDwarf) {
      result = DwarfUnwinder().UnwindFrom(regs, bounds, out);
    } else if constexpr (W == Walker::kDwarfUncached) {
      // Every lookup searches the rows: the cost of a stack never seen.
      internal::CfiReadGuard guard;
      result = internal::CfiWalk<false>(guard.snapshot(), regs, bounds, out);
    } else {
      result = FramePointerUnwinder().UnwindFrom(regs, bounds, out);
    }
    benchmark::DoNotOptimize(result);
    benchmark::DoNotOptimize(out.data());
  }
  if (result.depth < depth) {
    state.SkipWithError("the walk stopped above the recursion's bottom");
    return;
  }
  state.counters["frames"] = static_cast<double>(result.depth);
  state.counters["truncated"] = result.truncated ? 1 : 0;
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(result.depth));
}

// `remaining` frames with frame pointers (the project's flags), then the
// loop. The work after the call keeps it from becoming a tail call.
template <Walker W>
__attribute__((noinline)) size_t Recurse(benchmark::State& state,
                                         size_t remaining, size_t depth) {
  if (remaining == 0) {
    UnwindLoop<W>(state, depth);
  } else {
    Recurse<W>(state, remaining - 1, depth);
  }
  benchmark::DoNotOptimize(remaining);
  return remaining;
}

// The same recursion compiled without frame pointers: only CFI walks it.
__attribute__((noinline, optimize("omit-frame-pointer"))) size_t
RecurseFrameless(benchmark::State& state, size_t remaining, size_t depth) {
  if (remaining == 0) {
    UnwindLoop<Walker::kDwarf>(state, depth);
  } else {
    RecurseFrameless(state, remaining - 1, depth);
  }
  benchmark::DoNotOptimize(remaining);
  return remaining;
}

// Arg: recursion depth in frames (the walk adds the frames below it:
// benchmark library, main, libc).
void BM_FramePointerUnwinder_Depth(benchmark::State& state) {
  const auto depth = static_cast<size_t>(state.range(0));
  benchmark::DoNotOptimize(Recurse<Walker::kFramePointer>(state, depth, depth));
}
BENCHMARK(BM_FramePointerUnwinder_Depth)->Arg(8)->Arg(32)->Arg(128)->Arg(512);

void BM_DwarfUnwinder_Depth(benchmark::State& state) {
  DwarfUnwinder::RefreshModules();
  const auto depth = static_cast<size_t>(state.range(0));
  benchmark::DoNotOptimize(Recurse<Walker::kDwarf>(state, depth, depth));
}
BENCHMARK(BM_DwarfUnwinder_Depth)->Arg(8)->Arg(32)->Arg(128)->Arg(512);

void BM_DwarfUnwinder_DepthUncached(benchmark::State& state) {
  DwarfUnwinder::RefreshModules();
  const auto depth = static_cast<size_t>(state.range(0));
  benchmark::DoNotOptimize(Recurse<Walker::kDwarfUncached>(state, depth, depth));
}
BENCHMARK(BM_DwarfUnwinder_DepthUncached)->Arg(8)->Arg(32)->Arg(128)->Arg(512);

void BM_DwarfUnwinder_FramelessDepth(benchmark::State& state) {
  DwarfUnwinder::RefreshModules();
  const auto depth = static_cast<size_t>(state.range(0));
  benchmark::DoNotOptimize(RecurseFrameless(state, depth, depth));
}
BENCHMARK(BM_DwarfUnwinder_FramelessDepth)->Arg(8)->Arg(32)->Arg(128)->Arg(512);

// What a collector pass pays when no module was loaded or unloaded.
void BM_DwarfUnwinder_RefreshUnchanged(benchmark::State& state) {
  DwarfUnwinder::RefreshModules();
  for (auto _ : state) DwarfUnwinder::RefreshModules();
}
BENCHMARK(BM_DwarfUnwinder_RefreshUnchanged);

// --- Whole samples: what the unwinder's cost means per signal -----------------

// Sends the profiling signal to this thread with the CPU provider's tag; it
// is handled before the syscall returns. syscall() keeps rbp intact, so the
// frame-pointer walk starts from our caller's frame, as for a timer signal.
__attribute__((noinline)) void SampleLoop(benchmark::State& state) {
  siginfo_t info = {};
  info.si_signo = internal::kProfilingSignal;
  info.si_code = SI_QUEUE;
  info.si_pid = getpid();
  info.si_uid = getuid();
  info.si_value.sival_int = internal::MakeSignalTag(0);
  const pid_t pid = getpid();
  const pid_t tid = gettid();
  for (auto _ : state) {
    if (syscall(SYS_rt_tgsigqueueinfo, pid, tid, info.si_signo, &info) != 0) {
      state.SkipWithError("rt_tgsigqueueinfo failed");
      break;
    }
  }
}

__attribute__((noinline)) size_t RecurseAndSample(benchmark::State& state,
                                                  size_t remaining) {
  if (remaining == 0) {
    SampleLoop(state);
  } else {
    RecurseAndSample(state, remaining - 1);
  }
  benchmark::DoNotOptimize(remaining);
  return remaining;
}

// An 8 MiB ring, so every sample pays for its push (no drops).
template <typename U>
using BenchProfiler = Profiler<U, SpscRecordRing<1 << 20>, CpuTimeProvider>;

// One signal per iteration: delivery, dispatch, clock read, walk, push.
template <typename U>
void WholeSample(benchmark::State& state) {
  Options options;
  options.enabled = true;
  options.output =
      absl::StrCat("/tmp/inprof_dwarf_benchmark.", getpid(), ".pb.gz");
  options.cpu_period = absl::Hours(1);  // only our signals
  options.collect_period = absl::Milliseconds(1);
  options.max_frames = 512;
  options.wall_period = absl::ZeroDuration();
  BenchProfiler<U> profiler(options);
  if (absl::Status s = profiler.Start(); !s.ok()) {
    state.SkipWithError(std::string(s.message()).c_str());
    return;
  }
  ThreadRegistration registration = profiler.RegisterThread("benchmark");
  benchmark::DoNotOptimize(
      RecurseAndSample(state, static_cast<size_t>(state.range(0))));
  const absl::Status stopped = profiler.Stop();
  registration.Reset();
  unlink(options.output.c_str());
  const ProfilerStats stats = profiler.stats();
  const double n = static_cast<double>(state.iterations());
  state.counters["taken_per_signal"] = static_cast<double>(stats.samples_taken) / n;
  state.counters["truncated_per_signal"] =
      static_cast<double>(stats.stacks_truncated) / n;
  if (!stopped.ok()) state.SkipWithError(std::string(stopped.message()).c_str());
}
void BM_FramePointerProfiler_WholeSample(benchmark::State& state) {
  WholeSample<FramePointerUnwinder>(state);
}
void BM_DwarfProfiler_WholeSample(benchmark::State& state) {
  WholeSample<DwarfUnwinder>(state);
}
BENCHMARK(BM_FramePointerProfiler_WholeSample)->Arg(8)->Arg(32)->Arg(128);
BENCHMARK(BM_DwarfProfiler_WholeSample)->Arg(8)->Arg(32)->Arg(128);

// --- Tables -------------------------------------------------------------------

struct ModuleFile {
  std::string path;
  uint64_t text_lo = UINT64_MAX;
  uint64_t text_hi = 0;
};

// The loaded module whose name contains `needle` ("" for the program).
ModuleFile FindModule(const std::string& needle) {
  struct Query {
    const std::string* needle;
    ModuleFile found;
  } q{&needle, {}};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* q = static_cast<Query*>(data);
        const std::string name = info->dlpi_name ? info->dlpi_name : "";
        const bool match = q->needle->empty()
                               ? name.empty()
                               : name.find(*q->needle) != std::string::npos;
        if (!match) return 0;
        ModuleFile m;
        m.path = name.empty() ? "/proc/self/exe" : name;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const auto& ph = info->dlpi_phdr[i];
          if (ph.p_type == PT_LOAD && (ph.p_flags & PF_X)) {
            m.text_lo = std::min<uint64_t>(m.text_lo, ph.p_vaddr);
            m.text_hi = std::max<uint64_t>(m.text_hi, ph.p_vaddr + ph.p_memsz);
          }
        }
        q->found = m;
        return 1;
      },
      &q);
  return q.found;
}

// Build time and memory of one module's table.
void BuildTable(benchmark::State& state, const std::string& needle) {
  const ModuleFile m = FindModule(needle);
  if (m.text_hi <= m.text_lo) {
    state.SkipWithError("module not loaded");
    return;
  }
  size_t rows = 0, bytes = 0, rules = 0;
  for (auto _ : state) {
    auto table = internal::BuildCfiTableFromFile(m.path, m.text_lo, m.text_hi);
    if (!table.ok()) {
      state.SkipWithError(std::string(table.status().message()).c_str());
      return;
    }
    rows = (*table)->rows();
    rules = (*table)->distinct_rules();
    bytes = (*table)->MemoryBytes();
  }
  state.counters["rows"] = static_cast<double>(rows);
  state.counters["rules"] = static_cast<double>(rules);
  state.counters["table_bytes"] = static_cast<double>(bytes);
  state.counters["text_bytes"] = static_cast<double>(m.text_hi - m.text_lo);
  state.counters["bytes_per_row"] =
      rows > 0 ? static_cast<double>(bytes) / static_cast<double>(rows) : 0;
  state.counters["table_per_text"] =
      static_cast<double>(bytes) / static_cast<double>(m.text_hi - m.text_lo);
}
void BM_DwarfUnwinder_BuildTable_Program(benchmark::State& state) {
  BuildTable(state, "");
}
void BM_DwarfUnwinder_BuildTable_Libc(benchmark::State& state) {
  BuildTable(state, "libc.so");
}
void BM_DwarfUnwinder_BuildTable_Libstdcxx(benchmark::State& state) {
  BuildTable(state, "libstdc++");
}
BENCHMARK(BM_DwarfUnwinder_BuildTable_Program)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DwarfUnwinder_BuildTable_Libc)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DwarfUnwinder_BuildTable_Libstdcxx)->Unit(benchmark::kMillisecond);

// One lookup in a module without its table: .eh_frame_hdr's binary search
// and the FDE's program run up to the pc (what a walk pays on a cache miss
// of a pending table, CfiModuleTable::PendingFromFile), against the built
// table's uncached search. Pcs: every row start of the built table, in a
// shuffled order (each lookup a miss).
template <bool kDirect>
void LookupWithoutTable(benchmark::State& state, const std::string& needle) {
  const ModuleFile m = FindModule(needle);
  auto built = internal::BuildCfiTableFromFile(m.path, m.text_lo, m.text_hi);
  auto direct = internal::CfiModuleTable::PendingFromFile(m.text_lo, m.text_hi, m.path,
                                                          m.path, "");
  if (!built.ok() || !direct->direct()) {
    state.SkipWithError("no table or no .eh_frame_hdr");
    return;
  }
  std::vector<uint64_t> pcs;
  for (const internal::CfiRow& row : (*built)->Rows()) pcs.push_back(row.pc);
  std::mt19937_64 rng(1);
  std::shuffle(pcs.begin(), pcs.end(), rng);
  size_t i = 0;
  uint64_t sum = 0;
  for (auto _ : state) {
    const uint64_t pc = pcs[i++ % pcs.size()];
    sum += kDirect ? direct->FindWordDirect(pc) : (*built)->FindWordUncached(pc);
  }
  benchmark::DoNotOptimize(sum);
  state.counters["pcs"] = static_cast<double>(pcs.size());
}
void BM_DwarfUnwinder_LookupFromEhFrame_Libc(benchmark::State& state) {
  LookupWithoutTable<true>(state, "libc.so");
}
void BM_DwarfUnwinder_LookupInTable_Libc(benchmark::State& state) {
  LookupWithoutTable<false>(state, "libc.so");
}
void BM_DwarfUnwinder_LookupFromEhFrame_Program(benchmark::State& state) {
  LookupWithoutTable<true>(state, "");
}
void BM_DwarfUnwinder_LookupInTable_Program(benchmark::State& state) {
  LookupWithoutTable<false>(state, "");
}
BENCHMARK(BM_DwarfUnwinder_LookupFromEhFrame_Libc);
BENCHMARK(BM_DwarfUnwinder_LookupInTable_Libc);
BENCHMARK(BM_DwarfUnwinder_LookupFromEhFrame_Program);
BENCHMARK(BM_DwarfUnwinder_LookupInTable_Program);

}  // namespace
}  // namespace inprof

BENCHMARK_MAIN();
