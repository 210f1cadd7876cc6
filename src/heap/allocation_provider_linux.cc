#include "inprof/heap/allocation_provider.h"

#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "inprof/alloc/alloc_hooks.h"
#include "inprof/alloc/alloc_sampler.h"
#include "inprof/alloc/live_heap_table.h"
#include "inprof/alloc/live_peak.h"
#include "inprof/base/fork_guard.h"
#include "inprof/base/growth_safe_table.h"
#include "inprof/base/profiler_thread.h"
#include "inprof/internal/event_stack.h"
#include "inprof/internal/event_stack_table.h"
#include "inprof/internal/label_table.h"
#include "inprof/internal/signal_dispatch.h"
#include "inprof/internal/thread_info.h"

namespace inprof {

// Library mode reports its live heap to the agent (agent_forwarding.h).
static_assert(ReportsLiveState<AllocationProvider>);
namespace {

using internal::AllocGuard;
using internal::AllocHooks;
using internal::AllocSample;
using internal::LiveHeapTable;

// The live table: 2 MiB at first, growing with the sampled live set up to
// 16 M slots (512 MiB at the limit, reached only at ~8 M live sampled
// blocks: a 4 TiB heap at the 512 KiB default; allocation_provider.h).
constexpr size_t kLiveSlots = 1 << 16;
constexpr size_t kMaxLiveSlots = 1 << 24;

// The provider's columns: alloc_*, inuse_*, peak_inuse_* (objects, bytes).
constexpr size_t kValues = AllocationProvider::kSampleTypes.size();
static_assert(kValues == 6);

// Stack ids: the first three stand for samples without a stack.
constexpr uint32_t kUnregisteredId = 0;
constexpr uint32_t kNoStackId = 1;
constexpr uint32_t kTableFullId = 2;
constexpr uint32_t kFirstStackId = 3;

// One interned (labels, stack): key = [number of label words, the
// canonical label words, the frames]. Its allocations not yet flushed on
// the "[events]" thread (unregistered threads, a thread slot without room) are
// summed here.
struct StackEntry : internal::EventStackEntry {
  // Everything flushed or drained for it since Start (SnapshotEvents: the
  // live endpoint's alloc_* totals, as Go's heap profile has them).
  double total_objects = 0;
  double total_bytes = 0;
  // The live sums AddLiveState last reported for it (library mode), and
  // whether it ever reported more than zero since Start.
  double live_objects_sent = 0;
  double live_bytes_sent = 0;
  // And its peak_inuse_* of the interval before that call.
  double peak_objects_sent = 0;
  double peak_bytes_sent = 0;
  bool live_reported = false;
};

// The process's allocation-profiling state: created at the first Start and
// never destroyed (a wrapper that a thread entered before Stop may still
// call into it; allocation_provider.h).
struct HeapState {
  // The interned stacks and what is pending on "[events]"; its mutex is
  // taken by the sampled path and the flushes.
  internal::EventStackTable<StackEntry> table{kFirstStackId, AllocationProvider::kMaxStacks,
                                              kTableFullId, 0x853c49e6748fea9bULL};
  LiveHeapTable live{kLiveSlots, kMaxLiveSlots};
  // The live heap at its highest in the window (peak_inuse_*), told of
  // every entry the live table gains and loses; one cell per stack id.
  internal::LivePeak peak{kFirstStackId + AllocationProvider::kMaxStacks};
  std::atomic<size_t (*)(std::span<uintptr_t>) noexcept> unwind{nullptr};
  std::atomic<void* (*)(ThreadContext&) noexcept> thread_data{nullptr};
  std::atomic<std::atomic<uint64_t>*> activity{nullptr};
  std::atomic<bool> running{false};
  // libc's code ([lo, hi): its executable segment; 0, 0 when not found),
  // where an allocation may have been made under pthread_getattr_np.
  uintptr_t libc_text_lo = 0;
  uintptr_t libc_text_hi = 0;
  // The label words of kUnregisteredLabel (interned at the first Start).
  uint64_t unregistered_label[2] = {0, 0};

  std::atomic<uint64_t> samples{0};
  std::atomic<uint64_t> samples_unregistered{0};
  std::atomic<uint64_t> samples_untrimmed{0};
  std::atomic<uint64_t> samples_own{0};
  std::atomic<uint64_t> samples_threadless{0};
  std::atomic<uint64_t> samples_no_room{0};  // OnAllocSample: too little stack
  std::atomic<uint64_t> samples_no_memory{0};  // OnAllocSample: std::bad_alloc
  std::atomic<uint64_t> no_room_bytes{0};    // and their weight_bytes, rounded
  std::atomic<uint64_t> alloc_bytes{0};  // the samples' weight_bytes, rounded

  HeapState() {
    live.SetPeak(&peak);
    // A forked child may allocate while another thread of the parent held
    // the lock at the fork (base/fork_guard.h).
    internal::RegisterForkLock(&table.mutex, internal::kForkRankLeaf);
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

// The live table's blocks summed per stack id: (objects, bytes) as
// weighted. Without the mutex (the table is lock-free).
using LiveSums = internal::ThrowSafeMap<uint64_t, std::pair<double, double>>;
LiveSums LiveSumsByStack(HeapState& h) {
  LiveSums live;
  h.live.ForEach([&](const void*, const LiveHeapTable::Entry& entry) {
    auto& [objects, bytes] = live[entry.tag];
    objects += entry.weight_objects;
    bytes += entry.weight_objects * static_cast<double>(entry.size);
  });
  return live;
}

// The window's peak so far per stack id: (id, objects, bytes). Without the
// mutex (LivePeak has its own).
struct PeakSum {
  uint64_t id;
  double objects;
  double bytes;
};
using PeakSums = std::vector<PeakSum>;
PeakSums PeakSumsByStack(HeapState& h) {
  PeakSums peak;
  h.peak.ForEachPeak([&](uint64_t id, double objects, double bytes) {
    peak.push_back({id, objects, bytes});
  });
  return peak;
}

// What a flush, drain or snapshot hands to the aggregator after the
// table's lock (event_stack_table.h, EventRow: the lock is a leaf).
using Row = internal::EventRow<kValues>;

Row RowOf(const StackEntry& entry, uint64_t id, const int64_t (&values)[kValues]) {
  Row row{entry.frames(), entry.labels(), static_cast<uint32_t>(id), {}};
  std::copy(values, values + kValues, row.values);
  return row;
}

// The peak_inuse_* columns of `peak`, into `rows`. mutex held.
void AddPeakRowsLocked(HeapState& h, const PeakSums& peak, std::vector<Row>& rows) {
  for (const PeakSum& p : peak) {
    if (p.id >= h.table.entries.size()) continue;  // not one of ours
    const int64_t values[kValues] = {0, 0, 0, 0, h.table.RoundLocked(p.objects),
                                     h.table.RoundLocked(p.bytes)};
    if (values[4] == 0 && values[5] == 0) continue;
    rows.push_back(RowOf(h.table.entries[p.id], p.id, values));
  }
}

// The executable segment of the object that defines pthread_getattr_np
// (libc.so.6; libpthread.so.0 on an old glibc).
void LibcText(uintptr_t* lo, uintptr_t* hi) {
  Dl_info info;
  void* fn = dlsym(RTLD_DEFAULT, "pthread_getattr_np");
  if (fn == nullptr || dladdr(fn, &info) == 0 || info.dli_fbase == nullptr) return;
  struct Find {
    uintptr_t fn;
    uintptr_t lo = 0, hi = 0;
  } find{reinterpret_cast<uintptr_t>(fn)};
  dl_iterate_phdr(
      [](dl_phdr_info* object, size_t, void* data) {
        auto& f = *static_cast<Find*>(data);
        for (int i = 0; i < object->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = object->dlpi_phdr[i];
          if (ph.p_type != PT_LOAD || (ph.p_flags & PF_X) == 0) continue;
          const uintptr_t lo = object->dlpi_addr + ph.p_vaddr;
          if (f.fn >= lo && f.fn < lo + ph.p_memsz) {
            f.lo = lo;
            f.hi = lo + ph.p_memsz;
            return 1;
          }
        }
        return 0;
      },
      &find);
  *lo = find.lo;
  *hi = find.hi;
}

// What the sampled path may use of the allocating thread's stack past
// OnAllocSample's check: OnAllocSampleBody's frame (~1.5 KiB: the key and
// the walk share one buffer), interning a new stack (malloc, absl's hash
// map) and the provider's lock; the walk itself checks its own room
// (EventContext::unwind). With less, the sample is counted, not recorded:
// a thread near its stack's end, or a signal handler on a small
// alternate stack that allocates, ran out of stack here (4.5 KiB were
// needed and none checked).
constexpr size_t kSampledPathStackBytes = 8 * 1024;

// The sampled path's body: see OnAllocSample.
__attribute__((noinline)) uint64_t OnAllocSampleBody(HeapState& h, const AllocSample& sample,
                                                     const internal::EventThread& thread) {
  h.alloc_bytes.fetch_add(static_cast<uint64_t>(std::min(sample.weight_bytes, 1.8e19) + 0.5),
                          std::memory_order_relaxed);
  internal::ThreadSlotHeader* const slot = thread.slot;
  const bool registered = thread.registered;
  // The key: the thread's labels, canonical, then the frames, walked into
  // the key's own tail and cut at the code that called the allocator.
  // Every thread is walked where it allocates: a registered one within its
  // slot's bounds, any other within its own, found once (EventContext).
  uint64_t key[internal::EventKeyWords(AllocationProvider::kMaxDepth)];
  internal::EventKeyInput input;
  input.unwind = h.unwind.load(std::memory_order_acquire);
  input.caller = sample.caller;
  input.thread = thread;
  input.unregistered_label = h.unregistered_label;
  const internal::EventKey built =
      internal::BuildEventKey(input, key, AllocationProvider::kMaxDepth);
  if (built.untrimmed) h.samples_untrimmed.fetch_add(1, std::memory_order_relaxed);
  const size_t n = built.depth;
  if (!registered) h.samples_unregistered.fetch_add(1, std::memory_order_relaxed);
  uint32_t id;
  std::lock_guard<std::mutex> lock(h.table.mutex);
  if (n > 0) {
    id = h.table.InternLocked(absl::Span<const uint64_t>(key, built.length));
  } else {
    id = registered ? kNoStackId : kUnregisteredId;
  }
  // A registered thread's own samples stay in its slot, for its thread.
  if (auto data_of = h.thread_data.load(std::memory_order_acquire);
      registered && id >= kFirstStackId && data_of != nullptr) {
    auto& data = *static_cast<AllocationProvider::ThreadData*>(data_of(*slot));
    if (h.table.AddToThreadLocked(data, *slot, id, sample.weight_objects, sample.weight_bytes,
                                  h.activity.load(std::memory_order_relaxed))) {
      return id;
    }
    h.samples_threadless.fetch_add(1, std::memory_order_relaxed);
  }
  h.table.AddPendingLocked(id, sample.weight_objects, sample.weight_bytes);
  return id;
}

// The sampled path (AllocHooks' callback), on the allocating thread inside
// an AllocGuard: its own allocations are not sampled. Checks the room left
// on the thread's stack first, as the signal handler does, in a small frame
// of its own.
uint64_t OnAllocSample(void* /*context*/, const AllocSample& sample) {
  HeapState& h = State();
  if (internal::IsProfilerThread()) {
    h.samples_own.fetch_add(1, std::memory_order_relaxed);
    return internal::kAllocUntracked;
  }
  h.samples.fetch_add(1, std::memory_order_relaxed);
  // A thread that never registered has its bounds looked up once, and only
  // for an allocation made outside libc: pthread_getattr_np allocates while
  // it holds the thread's own lock, and a lookup from inside it deadlocked
  // (an ASan thread's start, a runtime reading its own stack size).
  const internal::EventThread thread =
      internal::EventThreadOf(kSampledPathStackBytes, sample.caller, h.libc_text_lo,
                              h.libc_text_hi);
  if (!thread.room) {
    // Not on its own stack (a signal's alternate stack, a coroutine's: the
    // room is unknown) or near its end: counted, in the comments.
    h.samples_no_room.fetch_add(1, std::memory_order_relaxed);
    h.no_room_bytes.fetch_add(
        static_cast<uint64_t>(std::min(sample.weight_bytes, 1.8e19) + 0.5),
        std::memory_order_relaxed);
    return internal::kAllocUntracked;
  }
  // Inside the program's malloc: no exception may leave. With the heap
  // exhausted the sample is lost (counted); the tables are as they were.
  try {
    return OnAllocSampleBody(h, sample, thread);
  } catch (const std::bad_alloc&) {
    h.samples_no_memory.fetch_add(1, std::memory_order_relaxed);
    return internal::kAllocUntracked;
  }
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

void AddRows(SampleAggregator& aggregator, uint32_t thread, size_t value_offset,
             const std::vector<Row>& rows) {
  internal::AddEventRows(aggregator, thread, value_offset, kFirstStackId, &SyntheticFrame, rows);
}

}  // namespace

absl::Status AllocationProvider::Configure(const Options& options) {
  period_ = options.alloc_period;
  period_source_ = options.alloc_period_source.empty() ? "Options::alloc_period"
                                                       : options.alloc_period_source;
  return absl::OkStatus();
}

std::string AllocationProvider::Describe() const {
  if (period_ == 0) return "";
  return absl::StrCat("allocations: sampled every ", period_,
                      " bytes on average (", period_source_, ")");
}

absl::Status AllocationProvider::StartEvents(const EventContext& context) {
  if (period_ == 0) return absl::OkStatus();
  if (!AllocHooks::Supported()) {
    return absl::UnimplementedError(
        absl::StrCat(period_source_, ": allocation profiling needs GOT patching (Linux x86-64, "
        "aarch64); allocations are not profiled"));
  }
  HeapState& h = State();
  AllocGuard guard;
  if (h.running.exchange(true)) {
    return absl::FailedPreconditionError(
        absl::StrCat(period_source_, ": another profiler in this process profiles allocations; "
        "this one does not"));
  }
  // Blocks of a previous run whose frees were not seen since.
  std::vector<const void*> stale;
  h.live.ForEach([&](const void* address, const LiveHeapTable::Entry&) {
    stale.push_back(address);
  });
  for (const void* address : stale) h.live.Erase(address);
  h.peak.StartWindow();
  {
    std::lock_guard<std::mutex> lock(h.table.mutex);
    for (StackEntry& entry : h.table.entries) {
      entry.total_objects = entry.total_bytes = 0;
      entry.live_objects_sent = entry.live_bytes_sent = 0;
      entry.peak_objects_sent = entry.peak_bytes_sent = 0;
      entry.live_reported = false;
    }
  }
  if (h.libc_text_hi == 0) LibcText(&h.libc_text_lo, &h.libc_text_hi);
  if (h.unregistered_label[0] == 0) {
    internal::LabelTable& labels = internal::LabelTable::Global();
    h.unregistered_label[1] = labels.Intern(kUnregisteredLabel[1]);
    h.unregistered_label[0] = labels.Intern(kUnregisteredLabel[0]);
  }
  h.unwind.store(context.unwind, std::memory_order_release);
  h.thread_data.store(context.thread_data, std::memory_order_release);
  h.activity.store(context.activity, std::memory_order_release);
  AllocHooks::Options hooks;
  hooks.mean_bytes = period_;
  hooks.callback = &OnAllocSample;
  hooks.live = &h.live;
  if (absl::Status s = AllocHooks::Install(hooks); !s.ok()) {
    h.running.store(false);
    return absl::Status(s.code(), absl::StrCat(period_source_, ": cannot intercept "
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
  h.thread_data.store(nullptr, std::memory_order_release);
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
  AllocGuard guard;  // what this allocates is never sampled (nor deadlocks on h.table.mutex)
  // The live table first, outside the lock: per stack, the blocks live now.
  const LiveSums live = window_end ? LiveSumsByStack(h) : LiveSums();
  // The window's peak, and the next window's starts from the heap now.
  PeakSums peak;
  internal::LivePeak::Stats peak_stats;
  if (window_end) {
    peak = PeakSumsByStack(h);
    peak_stats = h.peak.stats();
    h.peak.StartWindow();
  }
  std::vector<Row> rows;
  size_t stacks = 0;
  {
    std::lock_guard<std::mutex> lock(h.table.mutex);
    rows.reserve(h.table.pending.size() + live.size() + peak.size());
    for (uint32_t id : h.table.pending) {
      StackEntry& entry = h.table.entries[id];
      entry.pending = false;
      const int64_t values[kValues] = {h.table.RoundLocked(entry.sum[0]),
                                       h.table.RoundLocked(entry.sum[1]), 0, 0};
      entry.total_objects += entry.sum[0];
      entry.total_bytes += entry.sum[1];
      entry.sum[0] = 0;
      entry.sum[1] = 0;
      if (values[0] == 0 && values[1] == 0) continue;
      rows.push_back(RowOf(entry, id, values));
    }
    h.table.pending.clear();
    for (const auto& [tag, sums] : live) {
      if (tag >= h.table.entries.size()) continue;  // not one of ours
      const int64_t values[kValues] = {0, 0, h.table.RoundLocked(sums.first),
                                       h.table.RoundLocked(sums.second)};
      if (values[2] == 0 && values[3] == 0) continue;
      rows.push_back(RowOf(h.table.entries[tag], tag, values));
    }
    AddPeakRowsLocked(h, peak, rows);
    stacks = h.table.stacks();
  }
  AddRows(aggregator, thread, value_offset, rows);
  const LiveHeapTable::Stats table = h.live.stats();
  return absl::StrCat(
      "allocations sampled=", h.samples.load(std::memory_order_relaxed),
      " (since the first Start), of threads not registered=",
      h.samples_unregistered.load(std::memory_order_relaxed), " (on \"",
      kUnregisteredFrame, "\"), walks that did not reach the allocating code=",
      h.samples_untrimmed.load(std::memory_order_relaxed), ", of inprof's threads (left out)=",
      h.samples_own.load(std::memory_order_relaxed),
      ", on \"[events]\" for want of room in their thread's slot=",
      h.samples_threadless.load(std::memory_order_relaxed), ", distinct stacks=",
      stacks, " of ", kMaxStacks,
      ", not recorded for want of stack room (a small or foreign stack)=",
      h.samples_no_room.load(std::memory_order_relaxed), " (~",
      h.no_room_bytes.load(std::memory_order_relaxed), " bytes)",
      ", not recorded for want of memory=", h.samples_no_memory.load(std::memory_order_relaxed),
      ", live blocks the table could not keep=", table.overflows, " of ",
      table.inserts + table.overflows, " (table: ", table.capacity, " slots), freed unseen and "
      "replaced when their address was handed out again=", table.replaced,
      window_end ? absl::StrCat(", live heap at its highest in this window (peak_inuse_space)=",
                                peak_stats.peak_bytes, " bytes, now=", peak_stats.live_bytes)
                 : std::string());
}

void AllocationProvider::AddLiveState(SampleAggregator& aggregator, uint32_t thread,
                                      size_t value_offset, bool all) {
  if (!g_state_made.load(std::memory_order_acquire)) return;
  HeapState& h = State();
  AllocGuard guard;  // as in FlushEvents
  const LiveSums live = LiveSumsByStack(h);
  // The peak since the previous call: the agent keeps the highest of these
  // intervals in each of its windows (agent_session.h).
  internal::ThrowSafeMap<uint64_t, std::pair<double, double>> peak;
  for (const PeakSum& p : PeakSumsByStack(h)) peak[p.id] = {p.objects, p.bytes};
  h.peak.StartWindow();
  std::vector<Row> rows;
  std::unique_lock<std::mutex> lock(h.table.mutex);
  rows.reserve(h.table.entries.size());  // the one allocation, before anything changes
  for (size_t id = 0; id < h.table.entries.size(); ++id) {
    StackEntry& entry = h.table.entries[id];
    double objects = 0, bytes = 0, peak_objects = 0, peak_bytes = 0;
    if (auto it = live.find(id); it != live.end()) {
      objects = it->second.first;
      bytes = it->second.second;
    }
    if (auto it = peak.find(id); it != peak.end()) {
      peak_objects = it->second.first;
      peak_bytes = it->second.second;
    }
    const bool changed = objects != entry.live_objects_sent || bytes != entry.live_bytes_sent ||
                         peak_objects != entry.peak_objects_sent ||
                         peak_bytes != entry.peak_bytes_sent;
    if (!changed && !(all && entry.live_reported)) continue;
    entry.live_objects_sent = objects;
    entry.live_bytes_sent = bytes;
    entry.peak_objects_sent = peak_objects;
    entry.peak_bytes_sent = peak_bytes;
    entry.live_reported =
        entry.live_reported || objects != 0 || bytes != 0 || peak_objects != 0 || peak_bytes != 0;
    const int64_t values[kValues] = {0,
                                     0,
                                     h.table.RoundLocked(objects),
                                     h.table.RoundLocked(bytes),
                                     h.table.RoundLocked(peak_objects),
                                     h.table.RoundLocked(peak_bytes)};
    rows.push_back(RowOf(entry, id, values));
  }
  lock.unlock();
  AddRows(aggregator, thread, value_offset, rows);
}

bool AllocationProvider::SnapshotEvents(SampleAggregator& aggregator, uint32_t thread,
                                        size_t value_offset) {
  // Not started_: the endpoint's thread asks, while Start and Stop write it.
  if (!g_state_made.load(std::memory_order_acquire)) return false;
  HeapState& h = State();
  if (!h.running.load(std::memory_order_acquire)) return false;
  AllocGuard guard;  // as in FlushEvents
  const LiveSums live = LiveSumsByStack(h);
  std::vector<Row> rows;
  std::unique_lock<std::mutex> lock(h.table.mutex);
  rows.reserve(h.table.entries.size());  // the one allocation, before anything changes
  for (size_t id = 0; id < h.table.entries.size(); ++id) {
    const StackEntry& entry = h.table.entries[id];
    // What the next flush still gets (entry.sum[0]) is since Start too.
    double live_objects = 0;
    double live_bytes = 0;
    if (auto it = live.find(id); it != live.end()) {
      live_objects = it->second.first;
      live_bytes = it->second.second;
    }
    const int64_t values[kValues] = {h.table.RoundLocked(entry.total_objects + entry.sum[0]),
                               h.table.RoundLocked(entry.total_bytes + entry.sum[1]),
                               h.table.RoundLocked(live_objects),
                               h.table.RoundLocked(live_bytes)};
    if (values[0] == 0 && values[1] == 0 && values[2] == 0 && values[3] == 0) continue;
    rows.push_back(RowOf(entry, id, values));
  }
  lock.unlock();
  AddRows(aggregator, thread, value_offset, rows);
  return true;
}

void AllocationProvider::DrainThreadEvents(ThreadData& data, ThreadEventVisitor visit) {
  if (data.count.load(std::memory_order_acquire) == 0) return;  // the common case: no lock
  HeapState& h = State();
  AllocGuard guard;  // the aggregate's allocations (Stop() runs this on the host's thread)
  std::vector<Row> rows;
  {
    std::lock_guard<std::mutex> lock(h.table.mutex);
    rows.reserve(data.events.size());
    for (const ThreadData::Event& event : data.events) {
      if (event.key >= h.table.entries.size()) continue;
      StackEntry& entry = h.table.entries[event.key];
      entry.total_objects += event.values[0];
      entry.total_bytes += event.values[1];
      const int64_t values[kValues] = {h.table.RoundLocked(event.values[0]),
                                       h.table.RoundLocked(event.values[1]), 0, 0};
      rows.push_back(RowOf(entry, event.key, values));
    }
    data.events.clear();
    data.count.store(0, std::memory_order_release);
  }
  // The visit aggregates (the label table's lock): after the table's.
  for (const Row& row : rows) visit(row.frames, row.labels, row.values);
}

AllocationProvider::Stats AllocationProvider::stats() {
  if (!g_state_made.load(std::memory_order_acquire)) return {};
  HeapState& h = State();
  Stats s;
  s.samples = h.samples.load(std::memory_order_relaxed);
  s.samples_unregistered = h.samples_unregistered.load(std::memory_order_relaxed);
  s.samples_untrimmed = h.samples_untrimmed.load(std::memory_order_relaxed);
  s.samples_own = h.samples_own.load(std::memory_order_relaxed);
  s.samples_threadless = h.samples_threadless.load(std::memory_order_relaxed);
  s.samples_no_room = h.samples_no_room.load(std::memory_order_relaxed);
  const LiveHeapTable::Stats live = h.live.stats();
  s.live_overflows = live.overflows;
  s.alloc_bytes = h.alloc_bytes.load(std::memory_order_relaxed);
  s.freed_bytes = live.bytes_out;
  s.inuse_bytes = live.bytes_in >= live.bytes_out ? live.bytes_in - live.bytes_out : 0;
  {
    AllocGuard guard;
    std::lock_guard<std::mutex> lock(h.table.mutex);
    s.stacks = h.table.stacks();
  }
  return s;
}

}  // namespace inprof
