// ProfilerBase's loops over its provider table (internal/provider_table.h):
// configuring, arming and disarming the providers, their tails, their
// events and the ticker's period, written once for every composition; and
// which ring a slot's handler writes.
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "inprof/base/log.h"
#include "inprof/internal/profiler_base.h"
#include "inprof/internal/signal_dispatch.h"

namespace inprof::internal {
namespace {

// The "[events]" thread of the aggregate: what event-driven providers
// recorded, whatever thread caused it.
constexpr const char* kEventsThreadName = "[events]";

}  // namespace

// Joins the event providers' records to each window, on the thread that
// cuts it.
class ProfilerBase::EventAttachment final : public PipelineAttachment {
 public:
  explicit EventAttachment(ProfilerBase& profiler) : profiler_(profiler) {}

  std::string BeforeCutLocked(SampleAggregator& agg, bool window_end) override {
    // A composition whose event providers are all off (period 0, as
    // DefaultProfiler's allocation provider by default) adds nothing.
    if (!EnsureThread(agg)) return {};
    std::string lines;
    ForEach([&](const ProviderOps& ops, void* p) {
      if (ops.flush_events == nullptr) return;
      std::string line = ops.flush_events(p, agg, *thread_, ops.value_offset, window_end);
      if (!line.empty()) absl::StrAppend(&lines, lines.empty() ? "" : "; ", line);
    });
    return lines;
  }

  void LiveStateLocked(SampleAggregator& agg, bool all) override {
    if (!EnsureThread(agg)) return;
    ForEach([&](const ProviderOps& ops, void* p) {
      if (ops.live_state != nullptr) ops.live_state(p, agg, *thread_, ops.value_offset, all);
    });
  }

  // The snapshot of the first event provider that has one with `type`.
  SnapshotShape SnapshotLocked(SampleAggregator& agg, absl::string_view type) override {
    SnapshotShape shape;
    std::optional<uint32_t> thread;
    ForEach([&](const ProviderOps& ops, void* p) {
      if (ops.snapshot == nullptr || shape.types != 0 || ops.period(p) <= 0) return;
      bool has = false;
      for (size_t t = 0; t < ops.snapshot_types; ++t) has |= ops.sample_types[t].type == type;
      if (!has) return;
      if (!thread.has_value()) {
        thread = agg.AddThread(static_cast<int64_t>(getpid()), kEventsThreadName);
      }
      if (!ops.snapshot(p, agg, *thread, ops.value_offset)) return;
      for (size_t t = 0; t < ops.snapshot_types; ++t) {
        const size_t bit = ops.value_offset + t;
        if (bit < 64) shape.types |= uint64_t{1} << bit;
      }
      shape.period = ops.period(p);
      shape.period_type = ops.value_offset + ops.period_index;
    });
    return shape;
  }

 private:
  template <typename F>
  void ForEach(F&& f) {
    const Shape& shape = profiler_.shape_;
    for (size_t i = 0; i < shape.providers.size(); ++i) {
      f(shape.providers[i], shape.provider_objects[i]);
    }
  }
  // The aggregate keeps its thread table across cuts: one entry for the
  // profiler's life (pid as its id: the events of every thread), made once
  // an event provider is on.
  bool EnsureThread(SampleAggregator& agg) {
    if (thread_.has_value()) return true;
    if (!profiler_.AnyEventProviderOn()) return false;
    thread_ = agg.AddThread(static_cast<int64_t>(getpid()), kEventsThreadName);
    return true;
  }

  ProfilerBase& profiler_;
  std::optional<uint32_t> thread_;
};

void ProfilerBase::AttachEventProviders() {
  const bool any = std::any_of(shape_.providers.begin(), shape_.providers.end(),
                               [](const ProviderOps& ops) { return ops.records_events; });
  if (any) pipeline_.Attach(std::make_unique<EventAttachment>(*this));
}

absl::Status ProfilerBase::ConfigureProviders() {
  for (size_t i = 0; i < shape_.providers.size(); ++i) {
    const absl::Status s =
        shape_.providers[i].configure(shape_.provider_objects[i], options_);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

uint64_t ProfilerBase::OmittedSampleTypes() const {
  uint64_t mask = 0;
  for (size_t i = 0; i < shape_.providers.size(); ++i) {
    const ProviderOps& ops = shape_.providers[i];
    if (!ops.records_events || ops.period(shape_.provider_objects[i]) > 0) continue;
    for (size_t t = 0; t < ops.value_count; ++t) {
      const size_t bit = ops.value_offset + t;
      if (bit < 64) mask |= uint64_t{1} << bit;
    }
  }
  return mask;
}

std::string ProfilerBase::DescribeProviders() const {
  std::string out;
  for (size_t i = 0; i < shape_.providers.size(); ++i) {
    const ProviderOps& ops = shape_.providers[i];
    if (ops.describe == nullptr) continue;
    const std::string part = ops.describe(shape_.provider_objects[i]);
    if (!part.empty()) absl::StrAppend(&out, out.empty() ? "" : "; ", part);
  }
  return out;
}

bool ProfilerBase::AnyEventProviderOn() const {
  for (size_t i = 0; i < shape_.providers.size(); ++i) {
    const ProviderOps& ops = shape_.providers[i];
    if (ops.records_events && ops.period(shape_.provider_objects[i]) > 0) return true;
  }
  return false;
}

void ProfilerBase::ClearProviderHistory(SlotBase* slot) {
  for (auto& v : slot->provider_last_stack) v.clear();
  for (auto& v : slot->provider_last_labels) v.clear();
  std::fill(slot->running_samples_at_visit.begin(), slot->running_samples_at_visit.end(),
            slot->running_samples.load(std::memory_order_relaxed));
}

void ProfilerBase::ResetProviderData(SlotBase* slot) const {
  for (const ProviderOps& ops : shape_.providers) ops.reset_data(*slot);
}

void ProfilerBase::ArmOne(SlotBase* slot, size_t i, uint64_t session, bool late) {
  const absl::Status s = shape_.providers[i].arm(shape_.provider_objects[i], *slot,
                                                 MakeSignalTag(static_cast<int>(i), session));
  if (!s.ok() && !(late && slot->retiring.load(std::memory_order_acquire))) {
    Log(absl::StrCat("cannot sample thread '", slot->name, "': ", s.message()));
  }
}

void ProfilerBase::ArmProviders(SlotBase* slot, uint64_t session) {
  for (size_t i = 0; i < shape_.providers.size(); ++i) ArmOne(slot, i, session);
}

bool ProfilerBase::PrepareProviders(SlotBase* slot, uint64_t session) {
  if (!shape_.two_step_arming) {
    ArmProviders(slot, session);
    return false;
  }
  bool waits = false;
  for (size_t i = 0; i < shape_.providers.size(); ++i) {
    const ProviderOps& ops = shape_.providers[i];
    if (ops.prepare != nullptr && ops.prepare(shape_.provider_objects[i], *slot)) {
      waits = true;
      continue;
    }
    ArmOne(slot, i, session);
  }
  return waits;
}

void ProfilerBase::ArmPreparedProviders(SlotBase* slot, uint64_t session) {
  for (size_t i = 0; i < shape_.providers.size(); ++i) {
    if (shape_.providers[i].arms_in_two_steps) ArmOne(slot, i, session, /*late=*/true);
  }
}

void ProfilerBase::DisarmLocked(SlotBase* slot) {
  for (size_t i = 0; i < shape_.providers.size(); ++i) {
    shape_.providers[i].disarm(shape_.provider_objects[i], *slot);
  }
}

void ProfilerBase::TakeTailsLocked(SlotBase* slot, bool ticking_only) {
  for (size_t i = 0; i < shape_.providers.size(); ++i) {
    const ProviderOps& ops = shape_.providers[i];
    if (ops.take_tail == nullptr || (ticking_only && !ops.ticks_threads)) continue;
    int64_t values[kMaxProviderValues] = {};
    const std::span<int64_t> v(values, ops.value_count);
    if (!ops.take_tail(shape_.provider_objects[i], *slot, v)) continue;
    Pipeline::Ingesting ingest = pipeline_.Ingest();
    SampleAggregator& agg = ingest.aggregator();
    EnsureAggregateThread(slot, agg);
    const std::vector<uint64_t>& last = slot->provider_last_stack[i];
    if (!last.empty()) {
      // The thread was last seen there: its final stretch is credited to
      // that stack (sampled, not synthetic), so a thread that lived a
      // sample or two keeps its CPU on its real stack.
      agg.Add(slot->aggregate_thread, last, slot->provider_last_labels[i], ops.value_offset,
              v);
      continue;
    }
    agg.AddSynthetic(slot->aggregate_thread, ops.tail_frame, ops.value_offset, v);
    if (ops.ticks_threads) {
      // Wall time whose place was never read: the comments say how much.
      wall_tail_frame_ns_.fetch_add(
          static_cast<uint64_t>(std::max<int64_t>(0, values[ops.period_index])),
          std::memory_order_relaxed);
    }
  }
}

void ProfilerBase::UseSharedRingLocked(SlotBase* slot) {
  if (!shape_.slots.shares_rings || shape_.slots.shared_ring(slot) != nullptr) return;
  void* memory = pipeline_.AcquireThreadRing(slot->tid, slot->name);
  if (memory != nullptr) shape_.slots.write_ring(slot, memory);
}

void ProfilerBase::UseOwnRingLocked(SlotBase* slot) {
  void* shared = shape_.slots.shared_ring(slot);
  if (shared == nullptr) return;
  pipeline_.ReleaseThreadRing(shared);
  shape_.slots.write_ring(slot, nullptr);
}

absl::Duration ProfilerBase::TickerPeriod() const {
  absl::Duration period = absl::InfiniteDuration();
  for (size_t i = 0; i < shape_.providers.size(); ++i) {
    const ProviderOps& ops = shape_.providers[i];
    if (ops.tick_period == nullptr) continue;
    const absl::Duration d = ops.tick_period(shape_.provider_objects[i]);
    if (d > absl::ZeroDuration() && d < period) period = d;
  }
  return period;
}

absl::Status ProfilerBase::StartEventProviders() {
  absl::Status status;
  for (size_t i = 0; i < shape_.providers.size(); ++i) {
    const ProviderOps& ops = shape_.providers[i];
    if (ops.start_events == nullptr) continue;
    const EventContext context{.unwind = shape_.unwind_here,
                               .thread_data = ops.data,
                               .activity = shape_.activity};
    status.Update(ops.start_events(shape_.provider_objects[i], context));
  }
  return status;
}

void ProfilerBase::StopEventProviders(bool forked_child) noexcept {
  for (size_t i = 0; i < shape_.providers.size(); ++i) {
    const ProviderOps& ops = shape_.providers[i];
    if (ops.stop_events != nullptr) ops.stop_events(shape_.provider_objects[i], forked_child);
  }
}

}  // namespace inprof::internal
