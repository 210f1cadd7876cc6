// ProfilerBase's half of draining a record (internal/profiler_base.h): one
// record, as a slot's handler or the ticker wrote it, decoded with
// RecordView (sample_record.h) into the aggregate and the slot's newest
// stacks, for every composition. The template keeps only what its types
// decide: popping its ring (ProfilerCollector<>::DrainSlotIntoLocked).
#include <algorithm>
#include <cstdint>
#include <span>

#include "inprof/internal/profiler_base.h"
#include "inprof/internal/sample_record.h"

namespace inprof::internal {

size_t ProfilerBase::ProviderLabels(std::span<const uint64_t> words, size_t provider,
                                    uint64_t* out, bool blocked) const {
  const bool state = provider < shape_.providers.size() && shape_.providers[provider].labels_state;
  return CanonicalLabels(words, state, blocked, out);
}

bool ProfilerBase::AddRecordLocked(SlotBase* slot, SampleAggregator& agg,
                                   const uint64_t* record, size_t n, uint64_t* repaired) {
  EnsureAggregateThread(slot, agg);
  const RecordView view = RecordView::Read(record, n, value_counts_, shape_.leaf_words);
  // A label count past what a slot holds is a corrupt record, not a sample.
  if (!view.ok() || view.labels().size() > kMaxLabelWords) return false;
  const RecordMeta meta = view.meta;
  const size_t provider = meta.provider;
  const ProviderOps& ops = shape_.providers[provider];
  const bool blocked = meta.blocked;
  const size_t nvalues = view.layout.values;
  int64_t values[kMaxProviderValues];
  for (size_t i = 0; i < nvalues; ++i) values[i] = static_cast<int64_t>(view.values()[i]);
  const std::span<const int64_t> v(values, nvalues);
  if (meta.stackless) {
    // Taken on a stack too small for the walk (SampleStackless). A
    // blocked one begins an episode whose rest goes to the same frame.
    agg.AddSynthetic(slot->aggregate_thread, kSmallStackFrame, ops.value_offset, v);
    if (blocked) {
      slot->blocked_stack.clear();
      slot->blocked_labels.clear();
      slot->blocked_provisional = false;
      slot->blocked_stackless = true;
    }
    return true;
  }
  std::span<const uint64_t> frames = view.frames();
  if (!view.leaf().empty() && !frames.empty()) frames = RepairLeaf(frames, view.leaf(), repaired);
  uint64_t labels[kMaxLabelWords + 2];
  const size_t label_words = ProviderLabels(view.labels(), provider, labels, blocked);
  const std::span<const uint64_t> canonical(labels, label_words);
  agg.Add(slot->aggregate_thread, frames, canonical, ops.value_offset, v);
  slot->last_stack.assign(frames.begin(), frames.end());
  slot->provider_last_stack[provider].assign(frames.begin(), frames.end());
  slot->provider_last_labels[provider].assign(canonical.begin(), canonical.end());
  if (ops.samples_running && !blocked) {
    slot->running_stack.assign(frames.begin(), frames.end());
    slot->running_labels.assign(canonical.begin(), canonical.end());
    NoteRanLocked(slot);  // a wall visit soon, if none came for a round
    FollowRunningSampleLocked(slot, agg, frames, view.labels(), values[ops.period_index]);
  }
  if (blocked) {
    // Where the thread's current blocking episode blocks: the ticker
    // credits the rest of the episode here without signalling again.
    slot->blocked_stackless = false;
    slot->blocked_stack.assign(frames.begin(), frames.end());
    slot->blocked_labels.assign(canonical.begin(), canonical.end());
    slot->blocked_provisional = meta.provisional;
    if (meta.provisional) wall_episodes_provisional_.fetch_add(1, std::memory_order_relaxed);
    slot->blocked_tables_ready = meta.tables_ready;
    slot->blocked_tables_generation = meta.generation;
  }
  // The stack's own labels, without the provider's state label.
  slot->last_labels.assign(view.labels().begin(), view.labels().end());
  return true;
}

// Ticking providers that follow running threads (wall_time_provider.h): a
// running sample drained for a followed thread carries its wall time.
void ProfilerBase::FollowRunningSampleLocked(SlotBase* slot, SampleAggregator& agg,
                                             std::span<const uint64_t> frames,
                                             std::span<const uint64_t> label_words,
                                             int64_t cpu_ns) {
  for (size_t i = 0; i < shape_.providers.size(); ++i) {
    const ProviderOps& ops = shape_.providers[i];
    if (ops.follow_running == nullptr) continue;
    int64_t values[kMaxProviderValues] = {};
    const std::span<int64_t> v(values, ops.value_count);
    if (!ops.follow_running(*slot, cpu_ns, v)) continue;
    uint64_t labels[kMaxLabelWords + 2];
    const size_t n = ProviderLabels(label_words, i, labels);
    agg.Add(slot->aggregate_thread, frames, std::span<const uint64_t>(labels, n),
            ops.value_offset, v);
    wall_running_credits_.fetch_add(1, std::memory_order_relaxed);
  }
}

void ProfilerBase::DrainThreadEventsLocked(SlotBase* slot, SampleAggregator& agg) {
  for (const ProviderOps& ops : shape_.providers) {
    if (ops.drain_thread_events == nullptr) continue;
    ops.drain_thread_events(*slot, [&](std::span<const uint64_t> frames,
                                       std::span<const uint64_t> labels,
                                       std::span<const int64_t> values) {
      agg.Add(slot->aggregate_thread, frames, labels, ops.value_offset, values);
    });
  }
}

void ProfilerBase::CreditRunningLocked(SlotBase* slot, size_t provider,
                                       std::span<const int64_t> values) {
  const ProviderOps& ops = shape_.providers[provider];
  Pipeline::Ingesting ingest = pipeline_.Ingest();
  SampleAggregator& agg = ingest.aggregator();
  RefreshLeafResolverLocked();
  DrainSlotIntoLocked(slot, agg);
  if (slot->running_stack.empty()) {
    // Cannot happen (the count follows the push); credited to the
    // thread's tail frame rather than lost.
    agg.AddSynthetic(slot->aggregate_thread, ops.tail_frame, ops.value_offset, values);
    return;
  }
  uint64_t labels[kMaxLabelWords + 2];
  const size_t label_words = ProviderLabels(slot->running_labels, provider, labels);
  agg.Add(slot->aggregate_thread, slot->running_stack,
          std::span<const uint64_t>(labels, label_words), ops.value_offset, values);
  wall_running_credits_.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace inprof::internal
