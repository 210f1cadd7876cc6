// internal: not part of the public API (include inprof/profiler.h).
//
// The Windows counterpart of profiler_layout.h: what a Windows
// Profiler<U, R, Ps...>'s components fix at compile time, shared by its
// three parts: where each provider's values sit in a sample record, how
// long a record may be, and the registered thread's slot.
//
//   ProfilerLayout<U, R, Ps...>     this header
//   ProfilerCollector<U, R, Ps...>  profiler_collector_windows.h: the
//                                   profiler's state and the collector's
//                                   half, which reads the rings into the
//                                   aggregate
//   ProfilerSampler<U, R, Ps...>    profiler_sampler_windows.h: the sampler
//                                   thread, which suspends the picked
//                                   threads and writes records into their
//                                   rings
//   Profiler<U, R, Ps...>           windows/profiler_windows.h: the API,
//                                   over the two
//
// A Windows sample record is internal/sample_record.h's, without leaf
// words: [meta][values...][label words...][frames...], its meta using the
// two bits only the sampler writes (same_stack, unsuspended).
#ifndef INPROF_INTERNAL_PROFILER_LAYOUT_WINDOWS_H_
#define INPROF_INTERNAL_PROFILER_LAYOUT_WINDOWS_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

#include "inprof/internal/profiler_common.h"
#include "inprof/internal/provider_set.h"
#include "inprof/internal/sample_record.h"
#include "inprof/internal/thread_slot_windows.h"
#include "inprof/spsc_ring.h"
#include "inprof/unwinder.h"
#include "inprof/windows/sample_provider_windows.h"

namespace inprof::internal {

// What the Windows profiler does with one provider outside its sampler's
// visit (which stays a template: it inlines the provider's Visit), as
// function pointers made once per provider type (Linux's counterpart:
// provider_table.h).
struct WindowsProviderOps {
  size_t value_offset = 0;
  size_t value_count = 0;
  const char* tail_frame = kTailFrame;  // its tail, when the thread has no stack
  absl::Status (*arm)(void* provider, ThreadContext& thread, const ThreadTimes& times,
                      int64_t now) = nullptr;
  // Null unless ReportsTail.
  bool (*take_tail)(void* provider, ThreadContext& thread, const ThreadTimes& times,
                    int64_t now, std::span<int64_t> values) = nullptr;
  absl::Duration (*tick_period)(const void* provider) = nullptr;
  size_t (*threads_per_tick)(const void* provider) = nullptr;
};

template <typename Slot, size_t I, SampleProvider P>
constexpr WindowsProviderOps MakeWindowsProviderOps(size_t value_offset) {
  WindowsProviderOps ops;
  ops.value_offset = value_offset;
  ops.value_count = P::kSampleTypes.size();
  if constexpr (NamesTailFrame<P>) ops.tail_frame = P::kTailFrame;
  ops.arm = [](void* p, ThreadContext& t, const ThreadTimes& times, int64_t now) {
    return static_cast<P*>(p)->ArmThread(t, std::get<I>(static_cast<Slot&>(t).data), times, now);
  };
  if constexpr (ReportsTail<P>) {
    ops.take_tail = [](void* p, ThreadContext& t, const ThreadTimes& times, int64_t now,
                       std::span<int64_t> v) {
      return static_cast<P*>(p)->TakeTail(t, std::get<I>(static_cast<Slot&>(t).data), times,
                                          now, v);
    };
  }
  ops.tick_period = [](const void* p) { return static_cast<const P*>(p)->TickPeriod(); };
  ops.threads_per_tick = [](const void* p) {
    return static_cast<size_t>(static_cast<const P*>(p)->ThreadsPerTick());
  };
  return ops;
}

template <Unwinder U, SampleRing R, SampleProvider... Ps>
struct ProfilerLayout {
  // Where each provider's values sit (internal/provider_set.h).
  using Set = internal::ProviderSet<Ps...>;
  static constexpr size_t kNumProviders = Set::kNumProviders;
  static constexpr std::array<size_t, kNumProviders> kValueCounts = Set::kValueCounts;
  static constexpr std::array<size_t, kNumProviders> kValueOffsets = Set::kValueOffsets;
  static constexpr size_t kNumValues = Set::kNumValues;
  static constexpr size_t kMaxValuesPerProvider = Set::kMaxValuesPerProvider;
  static constexpr size_t kMaxFrames = 512;  // deeper stacks are truncated
  static constexpr size_t kMaxLabels = internal::ThreadSlotHeader::kMaxLabels;
  static constexpr size_t kMaxLabelWords = 2 * kMaxLabels;
  // The longest header a record may have (sample_record.h: RecordLayout).
  static constexpr size_t kHeaderWords =
      internal::RecordLayout{.values = kMaxValuesPerProvider, .labels = kMaxLabels}.frames_at();
  static constexpr size_t kMaxRecordWords =
      kHeaderWords + kMaxFrames < R::max_record_words() ? kHeaderWords + kMaxFrames
                                                        : R::max_record_words();
  static_assert(kMaxRecordWords > kHeaderWords, "ring records too small for a sample");

  // A registered thread: the header the sampler reads while it is
  // suspended, the sampler's and the collector's state (SlotRecordState:
  // its name, newest stack and entry in the aggregate), its providers'
  // per-thread data and its ring.
  struct Slot : internal::ThreadSlotHeader, internal::SlotRecordState {
    std::tuple<typename Ps::ThreadData...> data;
    bool name_from_os = false;  // registered without a name: its description
    int max_frames = static_cast<int>(kMaxFrames);
    R ring;
    // Sampler-owned (registry lock held).
    bool has_stack = false;       // a stack was pushed since registration
    ThreadTimes tick_times;       // read once per tick
    int64_t tick_times_at = -1;
    // Per provider: its last visit took a sample (CPU: the thread ran).
    std::array<bool, kNumProviders> busy{};
    // A tick picked the thread and its sample is not recorded yet (the
    // sampler takes the registry lock again to push it), and the
    // providers' state before that tick's visits: a thread that
    // unregisters meanwhile gets that state back before its tails are
    // taken, so the picked values go to its tail instead of being lost
    // with the sample the sampler then drops.
    bool pick_in_flight = false;
    std::tuple<typename Ps::ThreadData...> data_before_pick;
    // Values of samples dropped because the ring was full (sampler adds,
    // collector takes).
    std::array<std::atomic<int64_t>, kNumValues> dropped_values{};
    std::atomic<uint64_t> samples_taken{0};
    std::atomic<uint64_t> samples_truncated{0};
    std::atomic<uint64_t> samples_unsuspended{0};
    // Collector-owned (registry lock held).
    std::array<std::vector<uint64_t>, kNumProviders> provider_last_stack;
    std::array<std::vector<uint64_t>, kNumProviders> provider_last_labels;
    uint64_t seen_unsuspended = 0;
  };

  // Each provider's WindowsProviderOps, in order.
  static constexpr std::array<WindowsProviderOps, kNumProviders> kOps =
      []<size_t... I>(std::index_sequence<I...>) {
        return std::array<WindowsProviderOps, kNumProviders>{
            MakeWindowsProviderOps<Slot, I, Ps>(kValueOffsets[I])...};
      }(std::index_sequence_for<Ps...>{});
};

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_PROFILER_LAYOUT_WINDOWS_H_
