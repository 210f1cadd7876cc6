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
// The Windows counterpart of profiler_collector.h; there is no
// ProfilerBase under it (docs/profiler_split.md says why). The sampler
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
#include "inprof/internal/profiler_control.h"
#include "inprof/internal/composition.h"
#include "inprof/internal/pipeline.h"
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

template <Unwinder U, SampleRing R, SampleProvider... Ps>
class ProfilerCollector {
 protected:
  using L = ProfilerLayout<U, R, Ps...>;
  using Set = typename L::Set;
  using Slot = typename L::Slot;
  static constexpr size_t kNumProviders = L::kNumProviders;
  static constexpr auto kValueCounts = L::kValueCounts;
  static constexpr auto kValueOffsets = L::kValueOffsets;
  static constexpr size_t kNumValues = L::kNumValues;
  static constexpr size_t kMaxValuesPerProvider = L::kMaxValuesPerProvider;
  static constexpr size_t kMaxLabelWords = L::kMaxLabelWords;
  static constexpr size_t kMaxRecordWords = L::kMaxRecordWords;

  // Takes `options` as given: Profiler validates them.
  explicit ProfilerCollector(Options options)
      : options_(std::move(options)),
        pipeline_(options_, Set::SampleTypes(), Set::PeriodType(), PeriodOf<0>(),
              Set::Engine(U::kName)) {}

  // Provider I's period as the options configure it (the pipeline's: the
  // first provider's).
  template <size_t I>
  int64_t PeriodOf() {
    Options o = options_;
    if (!std::get<I>(providers_).Configure(o).ok()) return 0;
    return static_cast<int64_t>(std::get<I>(providers_).Period());
  }

  // Registry lock held; the sampler is not running or not at this slot.
  // Credits what each provider measured since its last sample of the thread
  // to that sample's stack.
  void TakeTailsLocked(Slot* slot, int64_t now) {
    const ThreadTimes times = internal::ReadThreadTimes(slot->handle);
    TakeTailsEach(slot, times, now, std::make_index_sequence<kNumProviders>{});
  }
  template <size_t... I>
  void TakeTailsEach(Slot* slot, const ThreadTimes& times, int64_t now,
                     std::index_sequence<I...>) {
    (TakeTailOne<I>(slot, times, now), ...);
  }
  template <size_t I>
  void TakeTailOne(Slot* slot, const ThreadTimes& times, int64_t now) {
    using P = std::tuple_element_t<I, std::tuple<Ps...>>;
    if constexpr (ReportsTail<P>) {
      int64_t values[kMaxValuesPerProvider] = {};
      std::span<int64_t> v(values, kValueCounts[I]);
      if (!std::get<I>(providers_).TakeTail(*slot, std::get<I>(slot->data), times, now, v)) {
        return;
      }
      Pipeline::Ingesting ingest = pipeline_.Ingest();
      SampleAggregator& agg = ingest.aggregator();
      EnsureAggregateThread(slot, agg);
      const std::vector<uint64_t>& last = slot->provider_last_stack[I];
      if (!last.empty()) {
        agg.Add(slot->aggregate_thread, last, slot->provider_last_labels[I],
                kValueOffsets[I], std::span<const int64_t>(values, kValueCounts[I]));
        return;
      }
      const char* frame = kTailFrame;
      if constexpr (NamesTailFrame<P>) frame = P::kTailFrame;
      agg.AddSynthetic(slot->aggregate_thread, frame, kValueOffsets[I],
                       std::span<const int64_t>(values, kValueCounts[I]));
    }
  }

  static void EnsureAggregateThread(Slot* slot, SampleAggregator& agg) {
    if (!slot->has_aggregate_thread) {
      slot->aggregate_thread = agg.AddThread(slot->tid, slot->name);
      slot->has_aggregate_thread = true;
    }
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
    while (size_t n = slot->ring.TryPop(std::span<uint64_t>(record, kMaxRecordWords))) {
      const internal::RecordMeta meta = internal::RecordMeta::Decode(record[0]);
      const size_t provider = meta.provider;
      const size_t depth = meta.depth;
      const size_t nlabels = meta.label_count;
      if (provider >= kNumProviders) continue;
      const size_t nvalues = kValueCounts[provider];
      const size_t label_at = 1 + nvalues;
      const size_t header = label_at + 2 * nlabels;
      if (n < header + depth) continue;
      int64_t values[kMaxValuesPerProvider];
      for (size_t i = 0; i < nvalues; ++i) values[i] = static_cast<int64_t>(record[1 + i]);
      const std::span<const int64_t> value_span(values, nvalues);
      if (meta.unsuspended) {
        agg.AddSynthetic(slot->aggregate_thread, "[inprof: thread could not be suspended]",
                         kValueOffsets[provider], value_span);
        ++recorded;
        continue;
      }
      uint64_t labels[kMaxLabelWords + 2];
      const size_t label_words =
          CanonicalLabels(std::span<const uint64_t>(record + label_at, 2 * nlabels), provider,
                          labels, meta.blocked);
      const std::span<const uint64_t> label_span(labels, label_words);
      if (meta.same_stack) {
        if (slot->last_stack.empty()) {
          agg.AddSynthetic(slot->aggregate_thread, kTailFrame, kValueOffsets[provider],
                           value_span);
        } else {
          agg.Add(slot->aggregate_thread, slot->last_stack, label_span, kValueOffsets[provider],
                  value_span);
          slot->provider_last_stack[provider] = slot->last_stack;
          slot->provider_last_labels[provider].assign(labels, labels + label_words);
        }
        ++recorded;
        continue;
      }
      std::span<const uint64_t> frames(record + header, depth);
      agg.Add(slot->aggregate_thread, frames, label_span, kValueOffsets[provider], value_span);
      slot->last_stack.assign(frames.begin(), frames.end());
      slot->provider_last_stack[provider].assign(frames.begin(), frames.end());
      slot->provider_last_labels[provider].assign(labels, labels + label_words);
      ++recorded;
    }
    const uint64_t dropped = slot->ring.dropped();
    if (dropped != slot->seen_dropped) {
      std::array<int64_t, kNumValues> lost{};
      for (size_t i = 0; i < kNumValues; ++i) {
        lost[i] = slot->dropped_values[i].exchange(0, std::memory_order_relaxed);
      }
      agg.AddSynthetic(slot->aggregate_thread, "[inprof: samples dropped, ring full]", 0, lost);
    }
    const uint64_t taken = slot->samples_taken.load(std::memory_order_relaxed);
    const uint64_t truncated = slot->samples_truncated.load(std::memory_order_relaxed);
    const uint64_t unsuspended = slot->samples_unsuspended.load(std::memory_order_relaxed);
    taken_.fetch_add(taken - slot->seen_taken, std::memory_order_relaxed);
    dropped_.fetch_add(dropped - slot->seen_dropped, std::memory_order_relaxed);
    truncated_.fetch_add(truncated - slot->seen_truncated, std::memory_order_relaxed);
    unsuspended_.fetch_add(unsuspended - slot->seen_unsuspended, std::memory_order_relaxed);
    recorded_.fetch_add(recorded, std::memory_order_relaxed);
    slot->seen_taken = taken;
    slot->seen_dropped = dropped;
    slot->seen_truncated = truncated;
    slot->seen_unsuspended = unsuspended;
  }

  // Canonical label words for the aggregate (internal/provider_set.h),
  // with the thread-state label of providers that have one.
  size_t CanonicalLabels(std::span<const uint64_t> words, size_t provider, uint64_t* out,
                         bool blocked) const {
    return internal::CanonicalLabelWords(
        words, provider < kNumProviders && kStateLabelProvider[provider], state_key_,
        blocked ? blocked_value_ : running_value_, out);
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

  // Slots are pooled for the life of the process and never freed, so a
  // ScopedLabels on a thread whose registration ended writes valid memory.
  struct SlotPool {
    std::mutex mutex;
    std::vector<Slot*> free;
  };
  static SlotPool& Pool() {
    static SlotPool* pool = new SlotPool;  // intentionally never destroyed
    return *pool;
  }
  static Slot* AcquireSlot() {
    SlotPool& pool = Pool();
    {
      std::lock_guard<std::mutex> lock(pool.mutex);
      if (!pool.free.empty()) {
        Slot* slot = pool.free.back();
        pool.free.pop_back();
        return slot;
      }
    }
    return new Slot;
  }
  static void ReleaseSlot(Slot* slot) {
    ResetProviderData(slot);
    slot->seen_taken = slot->samples_taken.load();
    slot->seen_dropped = slot->ring.dropped();
    slot->seen_truncated = slot->samples_truncated.load();
    slot->seen_unsuspended = slot->samples_unsuspended.load();
    SlotPool& pool = Pool();
    std::lock_guard<std::mutex> lock(pool.mutex);
    pool.free.push_back(slot);
  }

  Options options_;
  std::tuple<Ps...> providers_;
  internal::Pipeline pipeline_;
  // What options_ attaches to the pipeline (its sinks, the live endpoint);
  // after pipeline_, which it refers to.
  internal::Composition composition_{pipeline_};
  uint64_t session_ = 0;  // registry lock; new per Start()
  std::shared_ptr<internal::Registry> registry_ = std::make_shared<internal::Registry>();
  std::vector<Slot*> active_;  // registry lock
  std::atomic<bool> running_{false};  // written under the registry lock

  std::atomic<uint64_t> taken_{0}, recorded_{0}, dropped_{0}, truncated_{0}, unsuspended_{0};

 private:
  // Collector-owned (registry lock).
  std::unique_ptr<uint64_t[]> drain_scratch_ =
      std::make_unique_for_overwrite<uint64_t[]>(kMaxRecordWords);
  int64_t names_read_at_ = 0;

  static constexpr std::array<bool, kNumProviders> kStateLabelProvider{LabelsThreadState<Ps>...};
  const uint64_t state_key_ = internal::LabelTable::Global().Intern("thread state");
  const uint64_t running_value_ = internal::LabelTable::Global().Intern("running");
  const uint64_t blocked_value_ = internal::LabelTable::Global().Intern("blocked");
};

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_PROFILER_COLLECTOR_WINDOWS_H_
