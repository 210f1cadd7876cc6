// internal: not part of the public API (include inprof/profiler.h).
//
// The collector's half of Profiler<U, R, Ps...>, what its ring, slot and
// unwinder types decide: a ring popped into the aggregate (each record
// decoded by ProfilerBase::AddRecordLocked, compiled once), the module
// tables refreshed between passes, the slots (pool, handler entry points,
// shared rings). Over ProfilerBase, under ProfilerVisits.
#ifndef INPROF_INTERNAL_PROFILER_COLLECTOR_H_
#define INPROF_INTERNAL_PROFILER_COLLECTOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "inprof/internal/agent_stream.h"
#include "inprof/internal/pending_slots.h"
#include "inprof/internal/profiler_base.h"
#include "inprof/internal/profiler_common.h"
#include "inprof/internal/profiler_layout.h"
#include "inprof/internal/sample_handler.h"
#include "inprof/sample_aggregator.h"
#include "inprof/sample_provider.h"
#include "inprof/spsc_ring.h"
#include "inprof/unwinder.h"

namespace inprof::internal {

template <Unwinder U, SampleRing R, SampleProvider... Ps>
class ProfilerCollector : public ProfilerBase {
 protected:
  using ProfilerBase::ProfilerBase;

  using L = ProfilerLayout<U, R, Ps...>;
  using Handler = SampleHandler<U, R, Ps...>;
  using Slot = typename L::Slot;

  // Registry and aggregate locks held. Cheap for an idle thread (an empty
  // ring and unchanged counters): no atomic read-modify-write, no lookup.
  // Returns false when it stopped at its budget with records left.
  bool DrainSlotIntoLocked(SlotBase* base, SampleAggregator& agg) override {
    Slot* slot = static_cast<Slot*>(base);
    EnsureAggregateThread(slot, agg);
    // Not on the stack: a thread that unregisters drains its own ring, and
    // its 9 KiB frame faulted in up to three fresh stack pages, ~28 us a
    // thread (bench/overhead idle-1000). The registry lock serializes it.
    uint64_t* record = drain_scratch_.get();
    // Room for one inserted caller frame.
    uint64_t* repaired = record + L::kMaxRecordWords;
    uint64_t recorded = 0;
    // At most a ring's worth a pass: a thread whose handler pushes as fast
    // as this pops (a flood of signals; any busy thread under TSan) held
    // the registry lock, and Stop() behind it, for as long as it ran (the
    // start/stop hammer hung 4 minutes). The rest waits for the next pass.
    bool drained_all = true;
    size_t budget = size_t{1} << 16;
    if constexpr (SizedRing<R>) budget = R::capacity_words();
    while (size_t n = slot->active_ring->TryPop(std::span<uint64_t>(record, L::kMaxRecordWords))) {
      if (AddRecordLocked(slot, agg, record, n, repaired)) ++recorded;
      if (n >= budget) {
        drained_all = false;
        break;
      }
      budget -= n;
    }
    const uint64_t small_stack =
        slot->samples_small_stack.load(std::memory_order_relaxed);
    small_stack_.fetch_add(small_stack - slot->seen_small_stack,
                           std::memory_order_relaxed);
    slot->seen_small_stack = small_stack;
    CountDrainedLocked(*slot, agg, slot->samples_taken.load(std::memory_order_relaxed),
                       slot->active_ring->dropped(),
                       slot->samples_truncated.load(std::memory_order_relaxed), recorded,
                       slot->dropped_values);
    DrainThreadEventsLocked(slot, agg);
    return drained_all;
  }

  // Collector step: picks up modules loaded or unloaded since the last pass
  // (unwinders with per-module tables, built off the hot path and read by
  // the handler), then drains the rings. Not under the registry lock: the
  // first build takes tens of milliseconds and threads register meanwhile;
  // the rings are drained between two tables, and the build stops (to be
  // resumed) once the profiler is stopping.
  void Drain() override {
    if constexpr (RefreshesModulesBetweenTables<U>) {
      U::RefreshModules([this] { return DrainRings(); }, /*on_demand=*/true);
    } else if constexpr (RefreshesModules<U>) {
      U::RefreshModules();
    }
    DrainRings();
  }

  // The slots' bits, for every slot of this type (never destroyed).
  static PendingSlots& Pending() {
    static auto* pending = new PendingSlots;
    return *pending;
  }
  // The slots (internal::ProfilerBase::Shape::SlotOps): from and back to
  // their pool; a ring in the agent's memory (library mode) placed with
  // its words untouched.
  static constexpr Shape::SlotOps kSlotOps{
      .acquire = []() -> SlotBase* {
        if (Slot* slot = SlotPool<Slot>::Take()) return slot;
        return SlotPool<Slot>::MakeNew([] {
          // Not value-initialized (that zeroed the ring: 8 page faults a
          // thread); every member but the ring's words has an initializer.
          std::unique_ptr<Slot> slot(new Slot);
          slot->sample = &Handler::SampleThread;
          slot->sample_stackless = &Handler::SampleStackless;
          slot->sample_stack_bytes = static_cast<uint32_t>(L::kHandlerStackBytes);
          slot->before_retire = &Handler::TakeOwedSamples;
          slot->provider_last_stack.resize(L::kNumProviders);
          slot->provider_last_labels.resize(L::kNumProviders);
          slot->running_samples_at_visit.resize(L::kNumProviders);
          Pending().Assign(slot.get());  // may throw; unchanged then
          return slot.release();
        });
      },
      .release =
          [](SlotBase* base) {
            // The per-registration counts; the ring is empty after the drain.
            Slot* slot = static_cast<Slot*>(base);
            slot->seen_taken = slot->samples_taken.load();
            slot->seen_dropped = slot->ring.dropped();
            slot->seen_truncated = slot->samples_truncated.load();
            slot->seen_small_stack = slot->samples_small_stack.load();
            SlotPool<Slot>::Put(slot);
          },
      .shared_ring = [](const SlotBase* base) -> void* {
        const Slot* slot = static_cast<const Slot*>(base);
        return slot->active_ring == &slot->ring ? nullptr : slot->active_ring;
      },
      .write_ring =
          [](SlotBase* base, void* shared) {
            Slot* slot = static_cast<Slot*>(base);
            slot->active_ring = shared != nullptr ? new (shared) R : &slot->ring;
            slot->seen_dropped = shared != nullptr ? 0 : slot->ring.dropped();
          },
      .shares_rings = kIsSpscRecordRing<R>};

 private:
  // A record popped from a ring and its leaf-repaired copy (registry lock).
  std::unique_ptr<uint64_t[]> drain_scratch_ =
      std::make_unique_for_overwrite<uint64_t[]>(2 * L::kMaxRecordWords + 1);
};

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_PROFILER_COLLECTOR_H_
