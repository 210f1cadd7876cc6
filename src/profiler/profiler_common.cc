// What every platform's profiler shares (internal/profiler_common.h).
#include "inprof/internal/profiler_common.h"

#include <utility>

#include "inprof/base/log.h"
#include "inprof/internal/composition.h"
#include "inprof/internal/label_table.h"

namespace inprof::internal {

ProfilerCommon::ProfilerCommon(Options options, ProfileShape shape)
    : options_(std::move(options)),
      config_status_(options_.Validate()),
      pipeline_(options_, std::move(shape.sample_types), shape.period_type,
                shape.period, std::move(shape.engine)),
      session_(NewSessionId()),
      state_key_(LabelTable::Global().Intern(kThreadState)),
      running_value_(LabelTable::Global().Intern(kThreadRunning)),
      blocked_value_(LabelTable::Global().Intern(kThreadBlocked)) {
  if (!config_status_.ok()) Log(config_status_.message());
  // What options_ attaches to the pipeline: its sinks and the rest.
  ComposePipeline(pipeline_);
}

ProfilerCommon::~ProfilerCommon() = default;

void ProfilerCommon::AddCommonStats(ProfilerStats& s) const {
  s.samples_taken = taken_.load(std::memory_order_relaxed);
  s.samples_recorded = recorded_.load(std::memory_order_relaxed);
  s.samples_dropped = dropped_.load(std::memory_order_relaxed);
  s.stacks_truncated = truncated_.load(std::memory_order_relaxed);
  s.threads_registered = threads_registered_.load(std::memory_order_relaxed);
  s.profiles_written = profiles_written_.load(std::memory_order_relaxed);
}

void ProfilerCommon::EnsureAggregateThread(SlotRecordState& slot, int64_t tid,
                                           SampleAggregator& agg) {
  if (!slot.has_aggregate_thread) {
    slot.aggregate_thread = agg.AddThread(tid, slot.name);
    slot.has_aggregate_thread = true;
  }
}

size_t ProfilerCommon::CanonicalLabels(std::span<const uint64_t> words,
                                       bool state_label, bool blocked,
                                       uint64_t* out) const {
  return CanonicalLabelWords(words, state_label, state_key_,
                             blocked ? blocked_value_ : running_value_, out);
}

void ProfilerCommon::CountDrainedLocked(
    SlotRecordState& slot, SampleAggregator& agg, uint64_t taken,
    uint64_t dropped, uint64_t truncated, uint64_t recorded,
    std::span<std::atomic<int64_t>> dropped_values) {
  if (dropped != slot.seen_dropped) {
    std::vector<int64_t> lost(dropped_values.size());
    for (size_t i = 0; i < lost.size(); ++i) {
      lost[i] = dropped_values[i].exchange(0, std::memory_order_relaxed);
    }
    agg.AddSynthetic(slot.aggregate_thread, "[inprof: samples dropped, ring full]", 0, lost);
  }
  taken_.fetch_add(taken - slot.seen_taken, std::memory_order_relaxed);
  dropped_.fetch_add(dropped - slot.seen_dropped, std::memory_order_relaxed);
  truncated_.fetch_add(truncated - slot.seen_truncated, std::memory_order_relaxed);
  recorded_.fetch_add(recorded, std::memory_order_relaxed);
  slot.seen_taken = taken;
  slot.seen_dropped = dropped;
  slot.seen_truncated = truncated;
}

}  // namespace inprof::internal
