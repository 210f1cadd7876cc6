// internal: not part of the public API (include inprof/profiler.h).
//
// A Profiler's providers as a table that ProfilerBase loops over at run
// time: one ProviderOps of function pointers per provider type, made once
// at compile time from the template arguments by MakeProviderOps<Slot, I,
// P>(), with the capabilities the provider declares (sample_provider.h's
// optional concepts: a null pointer where it declares none). The per-
// provider fan-out (arming, tails, events, the ticker's period) is then
// written once, in src/profiler/profiler_providers.cc, instead of once per
// operation as a fold over the providers. Only what must be a template
// stays one: the signal handler (sample_handler.h), the collector's record
// decoding (profiler_collector.h) and the wall ticker's visits.
//
// Each pointer takes the provider as `void*` and the thread as the
// ThreadContext its slot derives from; the pointer casts both back to the
// types it was made for.
//
// Example (what Profiler<U, R, Ps...> does):
//   static constexpr auto kOps = MakeProviderOpsTable<Slot, Ps...>();
//   // kOps[i].arm(&std::get<i>(providers), slot, tag) arms provider i.
#ifndef INPROF_INTERNAL_PROVIDER_TABLE_H_
#define INPROF_INTERNAL_PROVIDER_TABLE_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "inprof/internal/provider_set.h"
#include "inprof/options.h"
#include "inprof/sample_aggregator.h"
#include "inprof/sample_provider.h"
#include "inprof/wall_time_provider.h"

namespace inprof::internal {

// Most values one provider contributes (its sample types).
inline constexpr size_t kMaxProviderValues = 16;

struct ProviderOps {
  // Where its values sit in a sample, how many, and its period's type.
  size_t value_offset = 0;
  size_t value_count = 0;
  size_t period_index = 0;
  // The frame its tail goes to when the thread has no sample of it.
  const char* tail_frame = kTailFrame;
  bool ticks_threads = false;        // TicksThreads
  bool samples_running = false;      // SamplesRunningThreads
  bool labels_state = false;         // LabelsThreadState
  bool arms_in_two_steps = false;    // ArmsInTwoSteps
  bool records_events = false;       // RecordsEvents
  size_t snapshot_types = 0;         // SnapshotTypeCount, when SnapshotsEvents
  // Its sample types' names and units (value_count of them).
  const SampleTypeSpec* sample_types = nullptr;

  // Always set.
  absl::Status (*configure)(void* provider, const Options& options) = nullptr;
  int64_t (*period)(const void* provider) = nullptr;
  absl::Status (*arm)(void* provider, ThreadContext& thread, int tag) = nullptr;
  void (*disarm)(void* provider, ThreadContext& thread) noexcept = nullptr;
  // Its per-thread data in a slot, and that data back to its initial value.
  void* (*data)(ThreadContext& thread) noexcept = nullptr;
  void (*reset_data)(ThreadContext& thread) noexcept = nullptr;
  // Null where the provider declares nothing of the kind.
  std::string (*describe)(const void* provider) = nullptr;
  bool (*prepare)(void* provider, ThreadContext& thread) = nullptr;
  bool (*take_tail)(void* provider, ThreadContext& thread, std::span<int64_t> values) = nullptr;
  absl::Duration (*tick_period)(const void* provider) = nullptr;
  // FollowsRunningThreads: the wall time a running sample of `cpu_ns`
  // carries for a followed thread.
  bool (*follow_running)(ThreadContext& thread, int64_t cpu_ns,
                         std::span<int64_t> values) = nullptr;
  // DrainsThreadEvents: the events left in the thread's data.
  void (*drain_thread_events)(ThreadContext& thread, ThreadEventVisitor visit) = nullptr;
  absl::Status (*start_events)(void* provider, const EventContext& context) = nullptr;
  void (*stop_events)(void* provider, bool forked_child) noexcept = nullptr;
  std::string (*flush_events)(void* provider, SampleAggregator& agg, uint32_t thread,
                              size_t value_offset, bool window_end) = nullptr;
  void (*live_state)(void* provider, SampleAggregator& agg, uint32_t thread,
                     size_t value_offset, bool all) = nullptr;
  bool (*snapshot)(void* provider, SampleAggregator& agg, uint32_t thread,
                   size_t value_offset) = nullptr;
};

// Provider I's ThreadData in `thread`'s slot.
template <typename Slot, size_t I>
auto& SlotDataOf(ThreadContext& thread) noexcept {
  return std::get<I>(static_cast<Slot&>(thread).data);
}

// Provider I (of type P) of a profiler whose slots are `Slot`s, which hold
// the providers' ThreadData as std::tuple `data`.
template <typename Slot, size_t I, SampleProvider P>
constexpr ProviderOps MakeProviderOps(size_t value_offset) {
  static_assert(P::kSampleTypes.size() <= kMaxProviderValues);
  using Data = typename P::ThreadData;
  ProviderOps ops;
  ops.value_offset = value_offset;
  ops.value_count = P::kSampleTypes.size();
  ops.sample_types = P::kSampleTypes.data();
  ops.period_index = P::kPeriodTypeIndex;
  if constexpr (NamesTailFrame<P>) ops.tail_frame = P::kTailFrame;
  ops.ticks_threads = TicksThreads<P>;
  ops.samples_running = SamplesRunningThreads<P>;
  ops.labels_state = LabelsThreadState<P>;
  ops.arms_in_two_steps = ArmsInTwoSteps<P>;
  ops.records_events = RecordsEvents<P>;
  ops.configure = [](void* p, const Options& o) { return static_cast<P*>(p)->Configure(o); };
  ops.period = [](const void* p) { return static_cast<int64_t>(static_cast<const P*>(p)->Period()); };
  ops.arm = [](void* p, ThreadContext& t, int tag) {
    return static_cast<P*>(p)->ArmThread(t, SlotDataOf<Slot, I>(t), tag);
  };
  ops.disarm = [](void* p, ThreadContext& t) noexcept {
    static_cast<P*>(p)->DisarmThread(t, SlotDataOf<Slot, I>(t));
  };
  ops.data = [](ThreadContext& t) noexcept -> void* { return &SlotDataOf<Slot, I>(t); };
  ops.reset_data = [](ThreadContext& t) noexcept {
    Data* d = &SlotDataOf<Slot, I>(t);
    std::destroy_at(d);
    std::construct_at(d);
  };
  if constexpr (requires(const P& p) { p.Describe(); }) {
    ops.describe = [](const void* p) { return std::string(static_cast<const P*>(p)->Describe()); };
  }
  if constexpr (ArmsInTwoSteps<P>) {
    ops.prepare = [](void* p, ThreadContext& t) {
      return static_cast<P*>(p)->PrepareThread(t, SlotDataOf<Slot, I>(t));
    };
  }
  if constexpr (ReportsTail<P>) {
    ops.take_tail = [](void* p, ThreadContext& t, std::span<int64_t> v) {
      return static_cast<P*>(p)->TakeTail(t, SlotDataOf<Slot, I>(t), v);
    };
  }
  if constexpr (TicksThreads<P>) {
    ops.tick_period = [](const void* p) {
      return absl::Duration(static_cast<const P*>(p)->TickPeriod());
    };
  }
  if constexpr (FollowsRunningThreads<P>) {
    ops.follow_running = [](ThreadContext& t, int64_t cpu_ns, std::span<int64_t> v) {
      return static_cast<bool>(P::FollowRunningSample(SlotDataOf<Slot, I>(t), cpu_ns, v));
    };
  }
  if constexpr (DrainsThreadEvents<P>) {
    ops.drain_thread_events = [](ThreadContext& t, ThreadEventVisitor visit) {
      P::DrainThreadEvents(SlotDataOf<Slot, I>(t), visit);
    };
  }
  if constexpr (RecordsEvents<P>) {
    ops.start_events = [](void* p, const EventContext& c) {
      return static_cast<P*>(p)->StartEvents(c);
    };
    ops.stop_events = [](void* p, bool forked) noexcept {
      static_cast<P*>(p)->StopEvents(forked);
    };
    ops.flush_events = [](void* p, SampleAggregator& agg, uint32_t thread, size_t offset,
                          bool window_end) {
      return std::string(static_cast<P*>(p)->FlushEvents(agg, thread, offset, window_end));
    };
  }
  if constexpr (ReportsLiveState<P>) {
    ops.live_state = [](void* p, SampleAggregator& agg, uint32_t thread, size_t offset,
                        bool all) { static_cast<P*>(p)->AddLiveState(agg, thread, offset, all); };
  }
  if constexpr (SnapshotsEvents<P>) {
    ops.snapshot_types = SnapshotTypeCount<P>();
    ops.snapshot = [](void* p, SampleAggregator& agg, uint32_t thread, size_t offset) {
      return static_cast<P*>(p)->SnapshotEvents(agg, thread, offset);
    };
  }
  return ops;
}

// The table of a profiler's providers, in their order.
template <typename Slot, SampleProvider... Ps>
constexpr std::array<ProviderOps, sizeof...(Ps)> MakeProviderOpsTable() {
  return []<size_t... I>(std::index_sequence<I...>) {
    return std::array<ProviderOps, sizeof...(Ps)>{MakeProviderOps<Slot, I, Ps>(
        ProviderSet<Ps...>::kValueOffsets[I])...};
  }(std::index_sequence_for<Ps...>{});
}

// f(std::integral_constant<size_t, I>{}) for I in [0, N): for what stays a
// template per provider (the wall ticker's visits).
template <size_t N, typename F>
void ForEachProvider(F&& f) {
  [&]<size_t... I>(std::index_sequence<I...>) {
    (f(std::integral_constant<size_t, I>{}), ...);
  }(std::make_index_sequence<N>{});
}

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_PROVIDER_TABLE_H_
