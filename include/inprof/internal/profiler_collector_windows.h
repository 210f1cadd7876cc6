// internal: not part of the public API (include inprof/profiler.h).
//
// The Windows profiler's state and its collector's half: the options, the
// providers, the pipeline (internal/pipeline.h), the registry and its slots, and
// what reads the records the sampler thread (profiler_sampler_windows.h)
// pushed, with the registry and aggregate locks held. It drains a slot's
// ring into the aggregate (DrainSlotIntoLocked: each record decoded, its
// labels made canonical, the slot's newest stack kept for the samples that
// reuse it), credits what each provider measured since a thread's last
// sample to that sample's stack (TakeTailsLocked), reads again the names
// of threads named by their description (RefreshNameLocked), and retires
// and pools the slots.
//
// The Windows counterpart of profiler_collector.h, over ProfilerCommon
// (profiler_common.h: the state both platforms share); Linux's
// ProfilerBase, written around its signals, is not under it. The sampler
// (profiler_sampler_windows.h) derives from it, and Profiler
// (windows/profiler_windows.h) from the sampler. The record's shape and
// the slot: profiler_layout_windows.h.
#ifndef INPROF_INTERNAL_PROFILER_COLLECTOR_WINDOWS_H_
#define INPROF_INTERNAL_PROFILER_COLLECTOR_WINDOWS_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "inprof/internal/label_table.h"
#include "inprof/internal/pipeline.h"
#include "inprof/internal/profiler_common.h"
#include "inprof/internal/profiler_layout_windows.h"
#include "inprof/internal/provider_set.h"
#include "inprof/internal/sample_record.h"
#include "inprof/internal/thread_slot_windows.h"
#include "inprof/options.h"
#include "inprof/sample_aggregator.h"
#include "inprof/spsc_ring.h"
#include "inprof/unwinder.h"
#include "inprof/windows/sample_provider_windows.h"

namespace inprof::internal {

// Its providers (ProviderHolder) are constructed first: the pipeline needs
// the first one's period.
template <Unwinder U, SampleRing R, SampleProvider... Ps>
class ProfilerCollector : protected ProviderHolder<Ps...>, public ProfilerCommon {
 protected:
  using L = ProfilerLayout<U, R, Ps...>;
  using Set = typename L::Set;
  using Slot = typename L::Slot;

  using ProviderHolder<Ps...>::providers_;
  // The providers' addresses, in L::kOps's order.
  const std::vector<void*> provider_objects_ = this->ProviderAddresses();

  // Validates `options` (ProfilerCommon).
  explicit ProfilerCollector(Options options)
      : ProfilerCommon(options, ProfileShape{.sample_types = Set::SampleTypes(),
                                             .period_type = Set::PeriodType(),
                                             .period = this->FirstPeriod(options),
                                             .engine = Set::Engine(U::kName)}) {}

  // Registry lock held; the sampler is not running or not at this slot.
  // Credits what each provider measured since its last sample of the thread
  // to that sample's stack.
  void TakeTailsLocked(Slot* slot, int64_t now) {
    const ThreadTimes times = internal::ReadThreadTimes(slot->handle);
    for (size_t i = 0; i < L::kNumProviders; ++i) {
      const WindowsProviderOps& ops = L::kOps[i];
      if (ops.take_tail == nullptr) continue;
      int64_t values[L::kMaxValuesPerProvider] = {};
      const std::span<int64_t> v(values, ops.value_count);
      if (!ops.take_tail(this->provider_objects_[i], *slot, times, now, v)) continue;
      Pipeline::Ingesting ingest = pipeline_.Ingest();
      SampleAggregator& agg = ingest.aggregator();
      EnsureAggregateThread(slot, agg);
      const std::vector<uint64_t>& last = slot->provider_last_stack[i];
      if (!last.empty()) {
        agg.Add(slot->aggregate_thread, last, slot->provider_last_labels[i], ops.value_offset, v);
        continue;
      }
      agg.AddSynthetic(slot->aggregate_thread, ops.tail_frame, ops.value_offset, v);
    }
  }

  static void EnsureAggregateThread(Slot* slot, SampleAggregator& agg) {
    ProfilerCommon::EnsureAggregateThread(*slot, slot->tid, agg);
  }

  // ---- The collector ------------------------------------------------------

  void DrainSlotLocked(Slot* slot) {
    Pipeline::Ingesting ingest = pipeline_.Ingest();
    DrainSlotIntoLocked(slot, ingest.aggregator());
  }

  // Registry and aggregate locks held.
  void DrainSlotIntoLocked(Slot* slot, SampleAggregator& agg) {
    EnsureAggregateThread(slot, agg);
    uint64_t* record = drain_scratch_.get();
    uint64_t recorded = 0;
    while (size_t n = slot->ring.TryPop(std::span<uint64_t>(record, L::kMaxRecordWords))) {
      // No leaf words on Windows (sample_record.h).
      const internal::RecordView view = internal::RecordView::Read(record, n, L::kValueCounts, 0);
      if (!view.ok()) continue;
      const internal::RecordMeta meta = view.meta;
      const size_t provider = meta.provider;
      const size_t nvalues = view.layout.values;
      int64_t values[L::kMaxValuesPerProvider];
      for (size_t i = 0; i < nvalues; ++i) values[i] = static_cast<int64_t>(view.values()[i]);
      const std::span<const int64_t> value_span(values, nvalues);
      if (meta.unsuspended) {
        agg.AddSynthetic(slot->aggregate_thread, "[inprof: thread could not be suspended]",
                         L::kValueOffsets[provider], value_span);
        ++recorded;
        continue;
      }
      uint64_t labels[L::kMaxLabelWords + 2];
      const size_t label_words =
          CanonicalLabels(view.labels(), provider, labels, meta.blocked);
      const std::span<const uint64_t> label_span(labels, label_words);
      if (meta.same_stack) {
        if (slot->last_stack.empty()) {
          agg.AddSynthetic(slot->aggregate_thread, kTailFrame, L::kValueOffsets[provider],
                           value_span);
        } else {
          agg.Add(slot->aggregate_thread, slot->last_stack, label_span, L::kValueOffsets[provider],
                  value_span);
          slot->provider_last_stack[provider] = slot->last_stack;
          slot->provider_last_labels[provider].assign(labels, labels + label_words);
        }
        ++recorded;
        continue;
      }
      std::span<const uint64_t> frames = view.frames();
      agg.Add(slot->aggregate_thread, frames, label_span, L::kValueOffsets[provider], value_span);
      slot->last_stack.assign(frames.begin(), frames.end());
      slot->provider_last_stack[provider].assign(frames.begin(), frames.end());
      slot->provider_last_labels[provider].assign(labels, labels + label_words);
      ++recorded;
    }
    const uint64_t unsuspended = slot->samples_unsuspended.load(std::memory_order_relaxed);
    unsuspended_.fetch_add(unsuspended - slot->seen_unsuspended, std::memory_order_relaxed);
    slot->seen_unsuspended = unsuspended;
    CountDrainedLocked(*slot, agg, slot->samples_taken.load(std::memory_order_relaxed),
                       slot->ring.dropped(),
                       slot->samples_truncated.load(std::memory_order_relaxed), recorded,
                       slot->dropped_values);
  }

  // Canonical label words for the aggregate (ProfilerCommon), with the
  // thread-state label of providers that have one.
  size_t CanonicalLabels(std::span<const uint64_t> words, size_t provider, uint64_t* out,
                         bool blocked) const {
    return ProfilerCommon::CanonicalLabels(
        words, provider < L::kNumProviders && kStateLabelProvider[provider], blocked, out);
  }

  // Registry and aggregate locks held: a thread registered without a name
  // takes its description as it is now.
  void RefreshNameLocked(Slot* slot, SampleAggregator& agg) {
    if (!slot->name_from_os) return;
    std::string name = internal::ThreadDescription(slot->handle);
    if (name.empty() || name == slot->name) return;
    slot->name = std::move(name);
    if (slot->has_aggregate_thread) agg.SetThreadName(slot->aggregate_thread, slot->name);
  }

  // The collector's step (every collect_period): drain every ring, and read
  // again the names of threads named by their description.
  bool DrainRings() {
    std::lock_guard<std::mutex> lock(registry_->mutex);
    Pipeline::Ingesting ingest = pipeline_.Ingest();
    SampleAggregator& agg = ingest.aggregator();
    const int64_t now = internal::MonotonicNanos();
    const bool rename = now - names_read_at_ >= kNameRefreshNs;
    if (rename) names_read_at_ = now;
    for (Slot* slot : active_) {
      DrainSlotIntoLocked(slot, agg);
      if (rename) RefreshNameLocked(slot, agg);
    }
    return running_;
  }
  // How often the names of threads registered without one are read again.
  static constexpr int64_t kNameRefreshNs = 1'000'000'000;

  void RetireLocked(Slot* slot, bool reusable) {
    slot->session.store(0, std::memory_order_seq_cst);
    ++slot->generation;  // a tick that picked it leaves it alone
    internal::CloseThreadHandle(slot->handle);
    slot->handle = nullptr;
    if (reusable) ReleaseSlot(slot);
  }

  static void ResetProviderData(Slot* slot) {
    using Data = std::tuple<typename Ps::ThreadData...>;
    slot->data.~Data();
    new (&slot->data) Data();
  }

  // A slot from the pool (SlotPool: never freed), or a new one.
  static Slot* AcquireSlot() {
    if (Slot* slot = SlotPool<Slot>::Take()) return slot;
    return SlotPool<Slot>::MakeNew([] { return new Slot; });
  }
  static void ReleaseSlot(Slot* slot) {
    ResetProviderData(slot);
    slot->seen_taken = slot->samples_taken.load();
    slot->seen_dropped = slot->ring.dropped();
    slot->seen_truncated = slot->samples_truncated.load();
    slot->seen_unsuspended = slot->samples_unsuspended.load();
    SlotPool<Slot>::Put(slot);
  }

  std::vector<Slot*> active_;  // registry lock
  std::atomic<uint64_t> unsuspended_{0};

 private:
  // Collector-owned (registry lock).
  std::unique_ptr<uint64_t[]> drain_scratch_ =
      std::make_unique_for_overwrite<uint64_t[]>(L::kMaxRecordWords);
  int64_t names_read_at_ = 0;

  static constexpr std::array<bool, L::kNumProviders> kStateLabelProvider{LabelsThreadState<Ps>...};
};

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_PROFILER_COLLECTOR_WINDOWS_H_
