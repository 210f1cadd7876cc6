#include "inprof/locks/lock_wait_provider.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/base/internal/cycleclock.h"  // Frequency: the unit of the tracer's waits
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "inprof/alloc/lock_hooks.h"
#include "inprof/base/alloc_guard.h"
#include "inprof/base/fork_guard.h"
#include "inprof/base/profiler_thread.h"
#include "inprof/internal/event_stack.h"
#include "inprof/internal/event_stack_table.h"
#include "inprof/internal/label_table.h"
#include "inprof/internal/signal_dispatch.h"

namespace inprof {
namespace {

using internal::AllocGuard;
using internal::LockHooks;
using internal::LockWait;

constexpr size_t kValues = LockWaitProvider::kSampleTypes.size();
static_assert(kValues == 2);

// Key ids: the first three stand for waits without a stack.
constexpr uint32_t kUnregisteredId = 0;
constexpr uint32_t kNoStackId = 1;
constexpr uint32_t kTableFullId = 2;
constexpr uint32_t kFirstStackId = 3;

// What the sampled path may use of the waiting thread's stack past
// EventThreadOf: the key (~1.2 KiB), the walk, interning a new key
// (malloc, absl's map) and the provider's lock.
constexpr size_t kSampledPathStackBytes = 8 * 1024;

// One interned (labels, stack), with its values since Start (flushed or
// drained: SnapshotEvents).
struct Entry : internal::EventStackEntry {
  double total_contentions = 0;
  double total_delay = 0;
};

// Created at the first Start and never destroyed: a wrapper a thread
// entered before Stop may still call into it.
struct LockState {
  internal::EventStackTable<Entry> table{kFirstStackId, LockWaitProvider::kMaxStacks,
                                         kTableFullId, 0x2545f4914f6cdd1dULL};
  std::atomic<size_t (*)(std::span<uintptr_t>) noexcept> unwind{nullptr};
  std::atomic<void* (*)(ThreadContext&) noexcept> thread_data{nullptr};
  std::atomic<std::atomic<uint64_t>*> activity{nullptr};
  std::atomic<bool> running{false};
  uint64_t unregistered_label[2] = {0, 0};
  uint64_t lock_key = 0;  // kLockLabel's key word (numeric)

  std::atomic<uint64_t> samples{0};
  std::atomic<uint64_t> samples_unregistered{0};
  std::atomic<uint64_t> samples_untrimmed{0};
  std::atomic<uint64_t> samples_own{0};
  std::atomic<uint64_t> samples_threadless{0};
  std::atomic<uint64_t> samples_no_room{0};
  std::atomic<uint64_t> samples_no_memory{0};

  LockState() { internal::RegisterForkLock(&table.mutex, internal::kForkRankLeaf); }
};

std::atomic<bool> g_state_made{false};

LockState& State() {
  static LockState* state = [] {
    AllocGuard guard;
    auto* made = new LockState;
    g_state_made.store(true, std::memory_order_release);
    return made;
  }();
  return *state;
}

__attribute__((noinline)) void OnWaitBody(LockState& s, const LockWait& wait,
                                          const internal::EventThread& thread) {
  uint64_t key[internal::EventKeyWords(LockWaitProvider::kMaxDepth)];
  internal::EventKeyInput input;
  input.unwind = s.unwind.load(std::memory_order_acquire);
  input.caller = wait.caller;
  input.thread = thread;
  input.unregistered_label = s.unregistered_label;
  input.with_extra = true;
  input.extra_key = s.lock_key;
  input.extra_value = reinterpret_cast<uintptr_t>(wait.lock);
  const internal::EventKey built =
      internal::BuildEventKey(input, key, LockWaitProvider::kMaxDepth);
  if (built.untrimmed) s.samples_untrimmed.fetch_add(1, std::memory_order_relaxed);
  if (!thread.registered) s.samples_unregistered.fetch_add(1, std::memory_order_relaxed);
  auto& table = s.table;
  std::lock_guard<std::mutex> lock(table.mutex);
  uint32_t id;
  if (built.depth > 0) {
    id = table.InternLocked(absl::Span<const uint64_t>(key, built.length));
  } else {
    id = thread.registered ? kNoStackId : kUnregisteredId;
  }
  // A registered thread's own waits stay in its slot, for its thread.
  if (auto data_of = s.thread_data.load(std::memory_order_acquire);
      thread.registered && id >= kFirstStackId && data_of != nullptr) {
    auto& data = *static_cast<LockWaitProvider::ThreadData*>(data_of(*thread.slot));
    if (table.AddToThreadLocked(data, *thread.slot, id, wait.weight_count, wait.weight_delay,
                                s.activity.load(std::memory_order_relaxed))) {
      return;
    }
    s.samples_threadless.fetch_add(1, std::memory_order_relaxed);
  }
  table.AddPendingLocked(id, wait.weight_count, wait.weight_delay);
}

// LockHooks' callback: after a sampled wait, on the waiting thread, holding
// the lock it waited for, with its own lock calls passed through and its
// allocations unsampled (lock_hooks.h).
void OnWait(void* /*context*/, const LockWait& wait) {
  LockState& s = State();
  if (internal::IsProfilerThread()) {
    s.samples_own.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  s.samples.fetch_add(1, std::memory_order_relaxed);
  const internal::EventThread thread =
      internal::EventThreadOf(kSampledPathStackBytes, wait.caller, 0, 0);
  if (!thread.room) {
    s.samples_no_room.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  try {
    OnWaitBody(s, wait, thread);
  } catch (const std::bad_alloc&) {
    s.samples_no_memory.fetch_add(1, std::memory_order_relaxed);
  }
}

// Nanoseconds per CycleClock cycle, the unit of absl::Mutex's tracer (set
// before the tracer is registered; 0: none).
std::atomic<double> g_absl_ns_per_cycle{0};

// absl::Mutex's tracer: on the thread that unlocked a contended mutex, after
// the unlock, with how long the waiter it wakes waited, in CycleClock
// cycles. Drawn and recorded as a wait of the lock hooks' (the callback
// above, on this thread: the holder's stack, cut at the unlock).
__attribute__((noinline)) void AbslMutexTracer(const char* /*event*/, const void* mutex,
                                               int64_t wait_cycles) {
  const double ns_per_cycle = g_absl_ns_per_cycle.load(std::memory_order_relaxed);
  if (wait_cycles <= 0 || ns_per_cycle <= 0) return;
  LockHooks::ReportWait(mutex, static_cast<uint64_t>(static_cast<double>(wait_cycles) *
                                                     ns_per_cycle),
                        __builtin_return_address(0));
}

const char* SyntheticFrame(uint32_t id) {
  switch (id) {
    case kUnregisteredId:
      return LockWaitProvider::kUnregisteredFrame;
    case kNoStackId:
      return LockWaitProvider::kNoStackFrame;
    default:
      return LockWaitProvider::kTableFullFrame;
  }
}

using Row = internal::EventRow<kValues>;

void AddRows(SampleAggregator& aggregator, uint32_t thread, size_t value_offset,
             const std::vector<Row>& rows) {
  internal::AddEventRows(aggregator, thread, value_offset, kFirstStackId, &SyntheticFrame, rows);
}

Row RowOf(const Entry& entry, uint32_t id, int64_t a, int64_t b) {
  return Row{entry.frames(), entry.labels(), id, {a, b}};
}

}  // namespace

absl::Status LockWaitProvider::Configure(const Options& options) {
  period_ = static_cast<uint64_t>(absl::ToInt64Nanoseconds(options.lock_period));
  period_source_ =
      options.lock_period_source.empty() ? "Options::lock_period" : options.lock_period_source;
  absl_ = options.lock_absl;
  return absl::OkStatus();
}

std::string LockWaitProvider::Describe() const {
  if (period_ == 0) return "";
  return absl::StrCat("lock waits: sampled by delay, every wait of ",
                      absl::FormatDuration(absl::Nanoseconds(period_)),
                      " or more, a shorter one with probability delay/period (", period_source_,
                      ")",
                      absl_ ? "; absl::Mutex waits at the unlock that ended them, on the "
                              "unlocking thread's stack (INPROF_LOCK_ABSL)"
                            : "");
}

absl::Status LockWaitProvider::StartEvents(const EventContext& context) {
  if (period_ == 0) return absl::OkStatus();
  if (!LockHooks::Supported()) {
    return absl::UnimplementedError(absl::StrCat(
        period_source_, ": lock-wait profiling needs GOT patching (Linux x86-64, aarch64); "
        "lock waits are not profiled"));
  }
  LockState& s = State();
  AllocGuard guard;
  if (s.running.exchange(true)) {
    return absl::FailedPreconditionError(absl::StrCat(
        period_source_, ": another profiler in this process profiles lock waits; this one "
        "does not"));
  }
  {
    std::lock_guard<std::mutex> lock(s.table.mutex);
    for (Entry& entry : s.table.entries) entry.total_contentions = entry.total_delay = 0;
  }
  if (s.lock_key == 0) {
    internal::LabelTable& labels = internal::LabelTable::Global();
    s.unregistered_label[1] = labels.Intern(kUnregisteredLabel[1]);
    s.unregistered_label[0] = labels.Intern(kUnregisteredLabel[0]);
    s.lock_key = labels.Intern(kLockLabel) | internal::kNumericLabel;
  }
  s.unwind.store(context.unwind, std::memory_order_release);
  s.thread_data.store(context.thread_data, std::memory_order_release);
  s.activity.store(context.activity, std::memory_order_release);
  LockHooks::Options hooks;
  hooks.period_ns = period_;
  hooks.callback = &OnWait;
  if (absl::Status st = LockHooks::Install(hooks); !st.ok()) {
    s.running.store(false);
    return absl::Status(st.code(), absl::StrCat(period_source_, ": cannot intercept lock "
                                                "calls: ", st.message()));
  }
  if (absl_) {
    // Abseil keeps the first tracer for good (a second, other one aborts a
    // build with assertions): registering this same one again is allowed.
    g_absl_ns_per_cycle.store(1e9 / absl::base_internal::CycleClock::Frequency(),
                              std::memory_order_relaxed);
    absl::RegisterMutexTracer(&AbslMutexTracer);
  }
  started_ = true;
  return absl::OkStatus();
}

void LockWaitProvider::StopEvents(bool forked_child) noexcept {
  if (!started_) return;
  started_ = false;
  LockState& s = State();
  // No wait is timed from now on, in a forked child too (atomics only).
  LockHooks::Pause();
  s.unwind.store(nullptr, std::memory_order_release);
  s.thread_data.store(nullptr, std::memory_order_release);
  if (!forked_child) {
    AllocGuard guard;
    LockHooks::Uninstall();
  }
  s.running.store(false);
}

std::string LockWaitProvider::FlushEvents(SampleAggregator& aggregator, uint32_t thread,
                                          size_t value_offset, bool /*window_end*/) {
  if (!g_state_made.load(std::memory_order_acquire)) return "";
  LockState& s = State();
  AllocGuard guard;
  auto& table = s.table;
  std::vector<Row> rows;
  size_t stacks = 0;
  {
    std::lock_guard<std::mutex> lock(table.mutex);
    rows.reserve(table.pending.size());
    for (uint32_t id : table.pending) {
      Entry& entry = table.entries[id];
      entry.pending = false;
      const int64_t contentions = table.RoundLocked(entry.sum[0]);
      const int64_t delay = table.RoundLocked(entry.sum[1]);
      entry.total_contentions += entry.sum[0];
      entry.total_delay += entry.sum[1];
      entry.sum[0] = entry.sum[1] = 0;
      if (contentions == 0 && delay == 0) continue;
      rows.push_back(RowOf(entry, id, contentions, delay));
    }
    table.pending.clear();
    stacks = table.stacks();
  }
  AddRows(aggregator, thread, value_offset, rows);
  const LockHooks::Stats hooks = LockHooks::stats();
  return absl::StrCat(
      "lock waits timed=", hooks.waits, " (calls that found the lock busy, since the first "
      "Start), sampled=", s.samples.load(std::memory_order_relaxed),
      ", of threads not registered=", s.samples_unregistered.load(std::memory_order_relaxed),
      ", walks that did not reach the lock call=",
      s.samples_untrimmed.load(std::memory_order_relaxed), ", of inprof's threads (left out)=",
      s.samples_own.load(std::memory_order_relaxed),
      ", on \"[events]\" for want of room in their thread's slot=",
      s.samples_threadless.load(std::memory_order_relaxed), ", distinct stacks=",
      stacks, " of ", kMaxStacks,
      ", not recorded for want of stack room=", s.samples_no_room.load(std::memory_order_relaxed),
      ", for want of memory=", s.samples_no_memory.load(std::memory_order_relaxed));
}

void LockWaitProvider::DrainThreadEvents(ThreadData& data, ThreadEventVisitor visit) {
  if (data.count.load(std::memory_order_acquire) == 0) return;  // the common case: no lock
  auto& table = State().table;
  AllocGuard guard;
  std::vector<Row> rows;
  {
    std::lock_guard<std::mutex> lock(table.mutex);
    rows.reserve(data.events.size());
    for (const ThreadData::Event& event : data.events) {
      if (event.key >= table.entries.size()) continue;
      Entry& entry = table.entries[event.key];
      entry.total_contentions += event.values[0];
      entry.total_delay += event.values[1];
      rows.push_back(RowOf(entry, event.key, table.RoundLocked(event.values[0]),
                           table.RoundLocked(event.values[1])));
    }
    data.events.clear();
    data.count.store(0, std::memory_order_release);
  }
  // The visit aggregates (the label table's lock): after the table's.
  for (const Row& row : rows) visit(row.frames, row.labels, row.values);
}

bool LockWaitProvider::SnapshotEvents(SampleAggregator& aggregator, uint32_t thread,
                                      size_t value_offset) {
  // Not started_: the endpoint's thread asks, while Start and Stop write it.
  if (!g_state_made.load(std::memory_order_acquire)) return false;
  LockState& s = State();
  if (!s.running.load(std::memory_order_acquire)) return false;
  AllocGuard guard;
  auto& table = s.table;
  std::vector<Row> rows;
  {
    std::lock_guard<std::mutex> lock(table.mutex);
    for (size_t id = 0; id < table.entries.size(); ++id) {
      const Entry& entry = table.entries[id];
      // What the next flush still gets is since Start too.
      const int64_t contentions = table.RoundLocked(entry.total_contentions + entry.sum[0]);
      const int64_t delay = table.RoundLocked(entry.total_delay + entry.sum[1]);
      if (contentions == 0 && delay == 0) continue;
      rows.push_back(RowOf(entry, static_cast<uint32_t>(id), contentions, delay));
    }
  }
  AddRows(aggregator, thread, value_offset, rows);
  return true;
}

LockWaitProvider::Stats LockWaitProvider::stats() {
  Stats out;
  out.waits = LockHooks::stats().waits;
  if (!g_state_made.load(std::memory_order_acquire)) return out;
  LockState& s = State();
  out.samples = s.samples.load(std::memory_order_relaxed);
  out.samples_unregistered = s.samples_unregistered.load(std::memory_order_relaxed);
  out.samples_untrimmed = s.samples_untrimmed.load(std::memory_order_relaxed);
  out.samples_own = s.samples_own.load(std::memory_order_relaxed);
  out.samples_threadless = s.samples_threadless.load(std::memory_order_relaxed);
  out.samples_no_room = s.samples_no_room.load(std::memory_order_relaxed);
  out.samples_no_memory = s.samples_no_memory.load(std::memory_order_relaxed);
  {
    AllocGuard guard;
    std::lock_guard<std::mutex> lock(s.table.mutex);
    out.stacks = s.table.stacks();
  }
  return out;
}

}  // namespace inprof
