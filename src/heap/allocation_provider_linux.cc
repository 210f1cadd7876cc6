#include "inprof/heap/allocation_provider.h"

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "inprof/alloc/alloc_hooks.h"
#include "inprof/alloc/alloc_sampler.h"
#include "inprof/alloc/live_heap_table.h"
#include "inprof/base/fork_guard.h"
#include "inprof/base/profiler_thread.h"

namespace inprof {
namespace {

using internal::AllocGuard;
using internal::AllocHooks;
using internal::AllocSample;
using internal::LiveHeapTable;

constexpr size_t kLiveSlots = 1 << 16;  // 2 MiB (allocation_provider.h)

// Stack ids: the first three stand for samples without a stack.
constexpr uint32_t kUnregisteredId = 0;
constexpr uint32_t kNoStackId = 1;
constexpr uint32_t kTableFullId = 2;
constexpr uint32_t kFirstStackId = 3;

struct FramesHash {
  using is_transparent = void;
  size_t operator()(absl::Span<const uint64_t> frames) const {
    return absl::HashOf(frames);
  }
};
struct FramesEq {
  using is_transparent = void;
  bool operator()(absl::Span<const uint64_t> a, absl::Span<const uint64_t> b) const {
    return a == b;
  }
};

// One stack's allocations since the last flush.
struct StackEntry {
  std::vector<uint64_t> frames;  // empty for the ids below kFirstStackId
  double objects = 0;
  double bytes = 0;
  bool pending = false;  // in `pending`
};

// The process's allocation-profiling state: created at the first Start and
// never destroyed (a wrapper that a thread entered before Stop may still
// call into it; allocation_provider.h).
struct HeapState {
  std::mutex mutex;  // stacks, index, pending: the sampled path and flushes
  std::vector<StackEntry> stacks;
  absl::flat_hash_map<std::vector<uint64_t>, uint32_t, FramesHash, FramesEq> index;
  std::vector<uint32_t> pending;  // ids with allocations since the last flush
  LiveHeapTable live{kLiveSlots};
  std::atomic<size_t (*)(std::span<uintptr_t>) noexcept> unwind{nullptr};
  std::atomic<bool> running{false};

  std::atomic<uint64_t> samples{0};
  std::atomic<uint64_t> samples_unregistered{0};
  std::atomic<uint64_t> samples_untrimmed{0};
  std::atomic<uint64_t> samples_own{0};

  HeapState() {
    stacks.resize(kFirstStackId);
    // A forked child may allocate while another thread of the parent held
    // the lock at the fork (base/fork_guard.h).
    internal::RegisterForkLock(&mutex, internal::kForkRankLeaf);
  }
};

// Whether State() was ever called: a provider that never started reads
// nothing (and allocates no table).
std::atomic<bool> g_state_made{false};

HeapState& State() {
  static HeapState* state = [] {
    AllocGuard guard;
    auto* made = new HeapState;
    g_state_made.store(true, std::memory_order_release);
    return made;
  }();
  return *state;
}

// The id of `frames` (interned), or kTableFullId. mutex held.
uint32_t InternLocked(HeapState& h, absl::Span<const uint64_t> frames) {
  if (auto it = h.index.find(frames); it != h.index.end()) return it->second;
  if (h.stacks.size() >= kFirstStackId + AllocationProvider::kMaxStacks) return kTableFullId;
  const auto id = static_cast<uint32_t>(h.stacks.size());
  StackEntry& entry = h.stacks.emplace_back();
  entry.frames.assign(frames.begin(), frames.end());
  h.index.emplace(entry.frames, id);
  return id;
}

// The sampled path (AllocHooks' callback), on the allocating thread inside
// an AllocGuard: its own allocations are not sampled.
uint64_t OnAllocSample(void* /*context*/, const AllocSample& sample) {
  HeapState& h = State();
  if (internal::IsProfilerThread()) {
    h.samples_own.fetch_add(1, std::memory_order_relaxed);
    return internal::kAllocUntracked;
  }
  h.samples.fetch_add(1, std::memory_order_relaxed);
  // Only a thread registered with the running profiler is walked: its
  // stack's bounds are known (EventContext::unwind checks again).
  internal::ThreadSlotHeader* slot = internal::CurrentThreadSlot();
  const uint64_t active = internal::ActiveSession();
  const bool registered = slot != nullptr && active != 0 &&
                          slot->session.load(std::memory_order_relaxed) == active;
  uintptr_t pcs[AllocationProvider::kMaxDepth + 8];
  size_t depth = 0;
  if (auto unwind = h.unwind.load(std::memory_order_acquire); registered && unwind != nullptr) {
    depth = unwind(std::span<uintptr_t>(pcs, std::size(pcs)));
  }
  // Cut at the code that called the allocator: the walk begins in the
  // unwinder's own frame, then this callback's, the hook's and the
  // wrapper's. A walk that never reaches the caller keeps its frames.
  size_t first = depth;
  for (size_t i = 0; i < depth; ++i) {
    if (pcs[i] == sample.caller) {
      first = i;
      break;
    }
  }
  if (depth > 0 && first == depth) {
    h.samples_untrimmed.fetch_add(1, std::memory_order_relaxed);
    first = 0;
  }
  uint64_t frames[AllocationProvider::kMaxDepth];
  size_t n = 0;
  for (size_t i = first; i < depth && n < AllocationProvider::kMaxDepth; ++i) {
    frames[n++] = pcs[i];
  }
  // The leaf is a return address, and the profile takes its leaf pc as
  // exact (pprof_writer.cc): point it into the call instead.
  if (n > 0 && first > 0) frames[0] -= 1;
  if (!registered) h.samples_unregistered.fetch_add(1, std::memory_order_relaxed);
  uint32_t id;
  std::lock_guard<std::mutex> lock(h.mutex);
  if (n > 0) {
    id = InternLocked(h, absl::Span<const uint64_t>(frames, n));
  } else {
    id = registered ? kNoStackId : kUnregisteredId;
  }
  StackEntry& entry = h.stacks[id];
  entry.objects += sample.weight_objects;
  entry.bytes += sample.weight_bytes;
  if (!entry.pending) {
    entry.pending = true;
    h.pending.push_back(id);
  }
  return id;
}

const char* SyntheticFrame(uint32_t id) {
  switch (id) {
    case kUnregisteredId:
      return AllocationProvider::kUnregisteredFrame;
    case kNoStackId:
      return AllocationProvider::kNoStackFrame;
    default:
      return AllocationProvider::kTableFullFrame;
  }
}

// `values` (4) to stack `id`: a real stack, or its synthetic frame.
void AddTo(SampleAggregator& aggregator, uint32_t thread, size_t value_offset,
           const StackEntry& entry, uint32_t id, std::span<const int64_t> values) {
  if (id >= kFirstStackId) {
    aggregator.Add(thread, entry.frames, value_offset, values);
  } else {
    aggregator.AddSynthetic(thread, SyntheticFrame(id), value_offset, values);
  }
}

}  // namespace

absl::Status AllocationProvider::Configure(const Options& options) {
  period_ = options.alloc_period;
  return absl::OkStatus();
}

std::string AllocationProvider::Describe() const {
  if (period_ == 0) return "";
  return absl::StrCat("allocations: sampled every ", period_,
                      " bytes on average (INPROF_ALLOC_PERIOD)");
}

absl::Status AllocationProvider::StartEvents(const EventContext& context) {
  if (period_ == 0) return absl::OkStatus();
  if (!AllocHooks::Supported()) {
    return absl::UnimplementedError(
        "INPROF_ALLOC_PERIOD: allocation profiling needs GOT patching (Linux x86-64, "
        "aarch64); allocations are not profiled");
  }
  HeapState& h = State();
  AllocGuard guard;
  if (h.running.exchange(true)) {
    return absl::FailedPreconditionError(
        "INPROF_ALLOC_PERIOD: another profiler in this process profiles allocations; "
        "this one does not");
  }
  // Blocks of a previous run whose frees were not seen since.
  std::vector<const void*> stale;
  h.live.ForEach([&](const void* address, const LiveHeapTable::Entry&) {
    stale.push_back(address);
  });
  for (const void* address : stale) h.live.Erase(address);
  h.unwind.store(context.unwind, std::memory_order_release);
  AllocHooks::Options hooks;
  hooks.mean_bytes = period_;
  hooks.callback = &OnAllocSample;
  hooks.live = &h.live;
  if (absl::Status s = AllocHooks::Install(hooks); !s.ok()) {
    h.running.store(false);
    return absl::Status(s.code(), absl::StrCat("INPROF_ALLOC_PERIOD: cannot intercept "
                                               "allocations: ", s.message()));
  }
  started_ = true;
  return absl::OkStatus();
}

void AllocationProvider::StopEvents(bool forked_child) noexcept {
  if (!started_) return;
  started_ = false;
  HeapState& h = State();
  // No thread samples from now on (the countdowns see the new generation).
  internal::SetAllocSamplingMean(0);
  h.unwind.store(nullptr, std::memory_order_release);
  if (!forked_child) {
    AllocGuard guard;
    AllocHooks::Uninstall();
  }
  h.running.store(false);
}

std::string AllocationProvider::FlushEvents(SampleAggregator& aggregator, uint32_t thread,
                                            size_t value_offset, bool window_end) {
  if (!g_state_made.load(std::memory_order_acquire)) return "";
  HeapState& h = State();
  AllocGuard guard;  // what this allocates is never sampled (nor deadlocks on h.mutex)
  // The live table first, outside the lock: per stack, the blocks live now.
  absl::flat_hash_map<uint64_t, std::pair<double, double>> live;
  if (window_end) {
    h.live.ForEach([&](const void*, const LiveHeapTable::Entry& entry) {
      auto& [objects, bytes] = live[entry.tag];
      objects += entry.weight_objects;
      bytes += entry.weight_objects * static_cast<double>(entry.size);
    });
  }
  std::lock_guard<std::mutex> lock(h.mutex);
  for (uint32_t id : h.pending) {
    StackEntry& entry = h.stacks[id];
    entry.pending = false;
    const int64_t values[4] = {std::llround(entry.objects), std::llround(entry.bytes), 0, 0};
    entry.objects = 0;
    entry.bytes = 0;
    if (values[0] == 0 && values[1] == 0) continue;
    AddTo(aggregator, thread, value_offset, entry, id, values);
  }
  h.pending.clear();
  for (const auto& [tag, sums] : live) {
    if (tag >= h.stacks.size()) continue;  // not one of ours
    const int64_t values[4] = {0, 0, std::llround(sums.first), std::llround(sums.second)};
    if (values[2] == 0 && values[3] == 0) continue;
    AddTo(aggregator, thread, value_offset, h.stacks[tag], static_cast<uint32_t>(tag), values);
  }
  const LiveHeapTable::Stats table = h.live.stats();
  return absl::StrCat(
      "allocations sampled=", h.samples.load(std::memory_order_relaxed),
      " (since the first Start), of threads not registered=",
      h.samples_unregistered.load(std::memory_order_relaxed), " (on \"",
      kUnregisteredFrame, "\"), walks that did not reach the allocating code=",
      h.samples_untrimmed.load(std::memory_order_relaxed), ", of inprof's threads (left out)=",
      h.samples_own.load(std::memory_order_relaxed), ", distinct stacks=",
      h.stacks.size() - kFirstStackId, " of ", kMaxStacks,
      ", live blocks the table could not keep=", table.overflows, " of ",
      table.inserts + table.overflows);
}

AllocationProvider::Stats AllocationProvider::stats() {
  if (!g_state_made.load(std::memory_order_acquire)) return {};
  HeapState& h = State();
  Stats s;
  s.samples = h.samples.load(std::memory_order_relaxed);
  s.samples_unregistered = h.samples_unregistered.load(std::memory_order_relaxed);
  s.samples_untrimmed = h.samples_untrimmed.load(std::memory_order_relaxed);
  s.samples_own = h.samples_own.load(std::memory_order_relaxed);
  s.live_overflows = h.live.stats().overflows;
  {
    AllocGuard guard;
    std::lock_guard<std::mutex> lock(h.mutex);
    s.stacks = h.stacks.size() - kFirstStackId;
  }
  return s;
}

}  // namespace inprof
