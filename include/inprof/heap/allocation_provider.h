// inprof/heap/allocation_provider.h: sampled allocation and live-heap
// profiling, as a provider of a Profiler (Linux).
//
// AllocationProvider adds six sample types. Four are named as Go's heap
// profile names them: alloc_objects/count and alloc_space/bytes (what was
// allocated in the window, estimated from the samples), inuse_objects/count
// and inuse_space/bytes (what the sampled blocks still allocated at the
// window's end stand for). Two more, peak_inuse_objects/count and
// peak_inuse_space/bytes, are the live heap as it stood when its sampled
// total was highest in the window (over the run for a profile that is one
// window): what held the memory at the peak, which a program that frees
// before it exits no longer shows in inuse_* (inprof/alloc/live_peak.h:
// exact for the samples, O(1) amortized per sampled allocation or free,
// nothing on the unsampled path). It is event-driven (sample_provider.h:
// RecordsEvents): at Start it patches the GOT slots through which every
// loaded object calls the allocator (inprof/alloc/alloc_hooks.h; objects
// dlopen()ed later too) and at Stop it writes them back. Each thread counts
// down bytes drawn from an exponential distribution with mean
// Options::alloc_period (INPROF_ALLOC_PERIOD; 0: off); the allocation that
// crosses it is sampled and weighted by 1/p (p = 1 - exp(-size/period)),
// so that the estimates are unbiased, as Go's runtime does. A sampled
// allocation's stack is walked by the profiler's unwinder, cut at the code
// that called the allocator (allocator and hook frames trimmed), and
// kept while the block lives (LiveHeapTable). A realloc is a free of the
// old block and an allocation of the new size, as jemalloc and tcmalloc
// account it.
//
// alloc_* samples carry the allocating thread (its id and registered name)
// and the labels it had (ScopedLabels); inuse_* samples carry the labels
// and the profiler's "[events]" thread (a live block outlives the thread
// that allocated it). Threads not registered with the profiler are walked
// too, their bounds found once per thread, and their samples carry the
// label "allocating thread"="unregistered" on the "[events]" thread; one
// whose stack cannot be walked (no bounds, a foreign stack) is counted on
// "[inprof: allocations of unregistered threads]". inprof's own threads
// are left out; calls an object makes without a GOT slot (libc's
// internal ones, static linking) are not seen.
//
// Memory: the live table (2 MiB, growing with the sampled live set to at
// most 16 M slots, 64 bytes a live sampled block; past that blocks are
// counted in the comments, not kept), the peak's 40 bytes a stack (2.6 MiB
// mapped, touched as stacks appear) and at most kMaxStacks distinct stacks
// of at most kMaxDepth frames (~9 MiB at the limit), for the process's
// life: the hooks' wrappers may still run after Stop.
//
// Thread-safety: one AllocationProvider may run at a time in a process
// (the GOT is the process's); StartEvents fails for a second. The sampled
// path takes one mutex (never on an unsampled allocation).
//
// Example:
//   using HeapProfiler = inprof::Profiler<inprof::DefaultUnwinder,
//       inprof::DefaultSampleRing, inprof::CpuTimeProvider,
//       inprof::WallTimeProvider, inprof::AllocationProvider>;
//   inprof::Options options = inprof::Options::FromEnv();
//   options.alloc_period = 512 * 1024;
//   HeapProfiler profiler(options);
//   inprof::ScopedProfiler running(profiler);
//   auto self = profiler.RegisterThread("main");
//   // go tool pprof -sample_index=inuse_space inprof.pb.gz (peak_inuse_space:
//   // the heap at its highest)
#ifndef INPROF_HEAP_ALLOCATION_PROVIDER_H_
#define INPROF_HEAP_ALLOCATION_PROVIDER_H_

#include <signal.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "inprof/internal/event_stack_table.h"
#include "inprof/options.h"
#include "inprof/sample_aggregator.h"
#include "inprof/sample_provider.h"

namespace inprof {

class AllocationProvider {
 public:
  static constexpr const char* kName = "alloc";
  static constexpr std::array<SampleTypeSpec, 6> kSampleTypes{{{"alloc_objects", "count"},
                                                               {"alloc_space", "bytes"},
                                                               {"inuse_objects", "count"},
                                                               {"inuse_space", "bytes"},
                                                               {"peak_inuse_objects", "count"},
                                                               {"peak_inuse_space", "bytes"}}};
  static constexpr size_t kPeriodTypeIndex = 1;  // alloc_space: the period is in bytes
  // The live endpoint's heap (SnapshotEvents) has Go's four types: the
  // peak is a window's.
  static constexpr size_t kSnapshotTypes = 4;
  static constexpr bool kArmsConcurrently = true;
  static constexpr bool kUnregistersLate = true;
  static constexpr bool kRecordsEvents = true;

  // Distinct stacks kept at most, and frames per stack.
  static constexpr size_t kMaxStacks = 1 << 16;
  static constexpr size_t kMaxDepth = 128;

  // The label a sample of a thread that never registered carries (its
  // stack is walked all the same; it has no labels of its own).
  static constexpr const char* kUnregisteredLabel[2] = {"allocating thread", "unregistered"};

  // Where samples without a stack go.
  static constexpr const char* kUnregisteredFrame =
      "[inprof: allocations of unregistered threads]";
  static constexpr const char* kNoStackFrame =
      "[inprof: allocation stack not walked (small or foreign stack)]";
  static constexpr const char* kTableFullFrame =
      "[inprof: allocation stacks beyond the table's limit]";

  // A registered thread's sampled allocations not yet drained (values:
  // objects, bytes), in its slot (internal/event_stack_table.h): written by
  // the thread and read by the collector (DrainThreadEvents), both under
  // the provider's lock.
  using ThreadData = internal::EventThreadData;

  // Process-wide counters since the first Start.
  struct Stats {
    uint64_t samples = 0;               // allocations sampled
    uint64_t samples_unregistered = 0;  // of threads not registered
    uint64_t samples_untrimmed = 0;     // whose walk did not reach the caller
    uint64_t samples_own = 0;           // of inprof's own threads (left out)
    uint64_t samples_threadless = 0;    // on "[events]": no room in the thread's slot
    uint64_t samples_no_room = 0;       // not recorded: too little (or a foreign) stack
    uint64_t stacks = 0;                // distinct stacks kept
    uint64_t live_overflows = 0;        // sampled blocks the live table could not keep
    // Estimates from the samples' weights, in bytes: allocated (by the
    // threads it profiles), and of the sampled blocks the live table keeps,
    // freed since and still allocated now (inuse_space, without the walk
    // over the table a profile makes). The gperftools drop-in's dump
    // intervals read them.
    uint64_t alloc_bytes = 0;
    uint64_t freed_bytes = 0;
    uint64_t inuse_bytes = 0;
  };

  absl::Status Configure(const Options& options);
  int64_t Period() const { return static_cast<int64_t>(period_); }
  absl::Status ArmThread(ThreadContext&, ThreadData&, int) { return absl::OkStatus(); }
  void DisarmThread(ThreadContext&, ThreadData&) noexcept {}
  static bool OnSignal(ThreadContext&, ThreadData&, const siginfo_t&,
                       std::span<int64_t>) noexcept {
    return false;
  }
  // "allocations: sampled every 512 KiB on average" (empty when off).
  std::string Describe() const;

  // sample_provider.h: RecordsEvents. StartEvents does nothing when the
  // period is 0; FailedPrecondition when another one runs, Unimplemented
  // where GOT patching is not supported.
  absl::Status StartEvents(const EventContext& context);
  void StopEvents(bool forked_child) noexcept;
  // Returns the window's comment line (the counters; empty before the
  // first Start).
  std::string FlushEvents(SampleAggregator& aggregator, uint32_t thread, size_t value_offset,
                          bool window_end);

  // sample_provider.h: SnapshotsEvents. Per stack: alloc_* since Start
  // (the windows' sums: flushed, drained or still pending), inuse_* now.
  bool SnapshotEvents(SampleAggregator& aggregator, uint32_t thread, size_t value_offset);

  // sample_provider.h: ReportsLiveState. Per stack: inuse_* now (the
  // alloc_* columns zero), for the stacks whose live sums changed since the
  // previous call (every stack that had any when `all`).
  void AddLiveState(SampleAggregator& aggregator, uint32_t thread, size_t value_offset,
                    bool all);

  // sample_provider.h: DrainsThreadEvents.
  static void DrainThreadEvents(ThreadData& data, ThreadEventVisitor visit);

  static Stats stats();

 private:
  uint64_t period_ = 0;
  std::string period_source_;  // Options::alloc_period_source, or what names it
  bool started_ = false;
};

static_assert(SampleProvider<AllocationProvider>);
static_assert(RecordsEvents<AllocationProvider>);
static_assert(SnapshotsEvents<AllocationProvider>);

}  // namespace inprof

#endif  // INPROF_HEAP_ALLOCATION_PROVIDER_H_
