// internal: not part of the public API.
//
// What an event provider (AllocationProvider, LockWaitProvider) keeps of
// its sampled events, shared: the interned (labels, stack) keys that
// BuildEventKey makes (event_stack.h), what is pending on the profiler's
// "[events]" thread for each, and a registered thread's own events in its
// slot (EventThreadData) until the collector drains them. Each event
// carries two values (objects and bytes, contentions and delay).
//
// Thread-safety: everything named ...Locked runs under `mutex`, which the
// sampled path (on the thread that caused the event) and the collector
// share. The table grows with the heap exhausted too: an interning that
// cannot allocate throws std::bad_alloc and leaves it as it was.
//
// Example (a provider's sampled path, with `key` from BuildEventKey):
//   std::lock_guard<std::mutex> lock(table.mutex);
//   const uint32_t id = table.InternLocked(key);
//   if (!table.AddToThreadLocked(data, slot, id, a, b, activity)) {
//     table.AddPendingLocked(id, a, b);  // on "[events]" at the next flush
//   }
#ifndef INPROF_INTERNAL_EVENT_STACK_TABLE_H_
#define INPROF_INTERNAL_EVENT_STACK_TABLE_H_

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "absl/hash/hash.h"
#include "absl/types/span.h"
#include "inprof/base/growth_safe_table.h"
#include "inprof/internal/pending_slots.h"
#include "inprof/internal/signal_dispatch.h"

namespace inprof::internal {

// A registered thread's events not yet drained, one entry per key, written
// by the thread (as its events happen) and read by the collector, both
// under the table's mutex. Past kMaxEvents distinct keys between two
// drains an event goes to "[events]" instead (the provider counts it). Up
// to 6 KiB a thread that has that many at once.
struct EventThreadData {
  static constexpr size_t kMaxEvents = 256;
  struct Event {
    uint32_t key;
    double values[2];
  };
  std::vector<Event> events;
  std::atomic<uint32_t> count{0};  // events.size(), read without the lock
};

// One interned key: [number of label words, the canonical label words, the
// frames] (empty for the ids that stand for events without a stack), and
// its values pending on "[events]".
struct EventStackEntry {
  std::vector<uint64_t> key;
  double sum[2] = {0, 0};
  bool pending = false;  // in EventStackTable::pending

  std::span<const uint64_t> labels() const {
    if (key.empty()) return {};
    return std::span<const uint64_t>(key).subspan(1, key[0]);
  }
  std::span<const uint64_t> frames() const {
    if (key.empty()) return {};
    return std::span<const uint64_t>(key).subspan(1 + key[0]);
  }
};

// What a flush, drain or snapshot takes from the table under its lock and
// hands to the aggregator after it (AddEventRows): the aggregator takes
// the label table's lock, and a thread may hold that lock, or any lock of
// the program, when its own event takes the table's (an allocation inside
// LabelTable::Intern, a wait inside a callback), so the table's lock is a
// leaf and never held around the aggregator. A key's frames and labels
// stay where they are: entries are never removed, and a moved entry keeps
// its key's memory. N: the provider's columns.
template <size_t N>
struct EventRow {
  std::span<const uint64_t> frames;
  std::span<const uint64_t> labels;
  uint32_t id;
  int64_t values[N];
};

// `rows` into `aggregator` (a SampleAggregator): a real stack from
// `first_id` on, below it the synthetic frame `synthetic(id)`.
template <size_t N, typename Aggregator>
void AddEventRows(Aggregator& aggregator, uint32_t thread, size_t value_offset,
                  uint32_t first_id, const char* (*synthetic)(uint32_t),
                  const std::vector<EventRow<N>>& rows) {
  for (const EventRow<N>& row : rows) {
    if (row.id >= first_id) {
      aggregator.Add(thread, row.frames, row.labels, value_offset, row.values);
    } else {
      aggregator.AddSynthetic(thread, synthetic(row.id), value_offset, row.values);
    }
  }
}

// Entry: EventStackEntry or a type derived from it. Ids below `first_id`
// stand for events without a stack (the provider's synthetic frames);
// `full_id` is the one an interning beyond `max_stacks` keys gets.
template <typename Entry>
class EventStackTable {
 public:
  EventStackTable(uint32_t first_id, size_t max_stacks, uint32_t full_id, uint64_t seed)
      : first_id_(first_id), max_stacks_(max_stacks), full_id_(full_id), rounding_(seed) {
    entries.resize(first_id);
  }

  std::mutex mutex;
  std::vector<Entry> entries;
  std::vector<uint32_t> pending;  // ids with values since the last flush

  uint32_t first_id() const { return first_id_; }
  size_t stacks() const { return entries.size() - first_id_; }

  // The id of `key`, interned; full_id when the table holds max_stacks.
  uint32_t InternLocked(absl::Span<const uint64_t> key) {
    if (auto it = index_.find(key); it != index_.end()) return it->second;
    if (entries.size() >= first_id_ + max_stacks_) return full_id_;
    const auto id = static_cast<uint32_t>(entries.size());
    // Each allocation before the tables change (bad_alloc leaves them whole).
    std::vector<uint64_t> stored(key.begin(), key.end());
    std::vector<uint64_t> indexed(key.begin(), key.end());
    GrowthReserve reserve(index_);
    entries.emplace_back().key = std::move(stored);
    index_.emplace(std::move(indexed), id);
    return id;
  }

  // `x` as a whole number, up with chance frac(x): unbiased (a weight of
  // 1.58 would otherwise always count 2).
  int64_t RoundLocked(double x) {
    const double whole = std::floor(x);
    rounding_ = rounding_ * 6364136223846793005ULL + 1442695040888963407ULL;
    const double u = static_cast<double>(rounding_ >> 11) * 0x1.0p-53;
    return static_cast<int64_t>(whole) + (u < x - whole ? 1 : 0);
  }

  // On "[events]" at the next flush. May throw: nothing changed then.
  void AddPendingLocked(uint32_t id, double a, double b) {
    Entry& entry = entries[id];
    if (!entry.pending) {
      pending.push_back(id);
      entry.pending = true;
    }
    entry.sum[0] += a;
    entry.sum[1] += b;
  }

  // In the registered thread's own data, for its own samples: false when
  // it holds kMaxEvents other keys already (then the caller adds it to
  // "[events]"). Marks the slot for the collector and bumps `activity`.
  // May throw (the data's first reservation): nothing changed then.
  bool AddToThreadLocked(EventThreadData& data, ThreadSlotHeader& slot, uint32_t id, double a,
                         double b, std::atomic<uint64_t>* activity) {
    EventThreadData::Event* event = nullptr;
    for (auto it = data.events.rbegin(); it != data.events.rend(); ++it) {
      if (it->key == id) {
        event = &*it;
        break;
      }
    }
    if (event == nullptr && data.events.size() < data.kMaxEvents) {
      if (data.events.capacity() == 0) data.events.reserve(data.kMaxEvents);
      event = &data.events.emplace_back(EventThreadData::Event{id, {0, 0}});
    }
    if (event == nullptr) return false;
    event->values[0] += a;
    event->values[1] += b;
    data.count.store(static_cast<uint32_t>(data.events.size()), std::memory_order_release);
    MarkPending(slot);
    if (activity != nullptr) activity->fetch_add(1, std::memory_order_release);
    return true;
  }

 private:
  struct KeyHash {
    using is_transparent = void;
    size_t operator()(absl::Span<const uint64_t> key) const { return absl::HashOf(key); }
  };
  struct KeyEq {
    using is_transparent = void;
    bool operator()(absl::Span<const uint64_t> a, absl::Span<const uint64_t> b) const {
      return a == b;
    }
  };

  const uint32_t first_id_;
  const size_t max_stacks_;
  const uint32_t full_id_;
  uint64_t rounding_;
  // Grows with the heap exhausted too (growth_safe_table.h).
  GrowthSafeMap<std::vector<uint64_t>, uint32_t, KeyHash, KeyEq> index_;
};

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_EVENT_STACK_TABLE_H_
