// internal: not part of the public API (include inprof/profiler.h).
//
// What a Profiler<U, R, Ps...>'s components fix at compile time, shared by
// its three parts: where each provider's values sit in a sample record, how
// long a record may be, the stack the signal handler needs below its frame,
// the registered thread's slot, and the unwinder's table state.
//
//   ProfilerLayout<U, R, Ps...>   this header
//   SampleHandler<U, R, Ps...>    sample_handler.h: the signal handler's
//                                 half, which writes records into the rings
//   ProfilerCollector<U, R, Ps...>  profiler_collector.h: the collector's
//                                 half, which reads them into the aggregate
//   Profiler<U, R, Ps...>         profiler.h: the providers, the slots and
//                                 the ticker's visits, over the two
//
// The record's words: sample_record.h.
#ifndef INPROF_INTERNAL_PROFILER_LAYOUT_H_
#define INPROF_INTERNAL_PROFILER_LAYOUT_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <tuple>
#include <vector>

#include "inprof/internal/leaf_frame_resolver.h"
#include "inprof/internal/profiler_base.h"
#include "inprof/internal/provider_set.h"
#include "inprof/internal/sample_record.h"
#include "inprof/internal/signal_dispatch.h"
#include "inprof/sample_provider.h"
#include "inprof/spsc_ring.h"
#include "inprof/unwinder.h"

namespace inprof::internal {

template <Unwinder U, SampleRing R, SampleProvider... Ps>
struct ProfilerLayout {
  // Where each provider's values sit (provider_set.h).
  using Set = ProviderSet<Ps...>;
  template <size_t I>
  using Provider = std::tuple_element_t<I, std::tuple<Ps...>>;
  static constexpr size_t kNumProviders = Set::kNumProviders;
  static constexpr std::array<size_t, kNumProviders> kValueCounts = Set::kValueCounts;
  static constexpr std::array<size_t, kNumProviders> kValueOffsets = Set::kValueOffsets;
  static constexpr size_t kNumValues = Set::kNumValues;
  static constexpr size_t kMaxValuesPerProvider = Set::kMaxValuesPerProvider;
  // Providers whose samples are taken while the thread runs
  // (sample_provider.h: SamplesRunningThreads).
  static constexpr std::array<bool, kNumProviders> kSamplesRunning{
      SamplesRunningThreads<Ps>...};
  static constexpr bool kHasRunningSampler = (SamplesRunningThreads<Ps> || ...);
  // Providers whose samples carry the thread's state label (wall time).
  static constexpr std::array<bool, kNumProviders> kStateLabelProvider{
      LabelsThreadState<Ps>...};
  static constexpr size_t kMaxFrames = 512;
  static constexpr size_t kLeafWords = [] {
    if constexpr (CopiesLeafStack<U>) {
      return U::kLeafStackWords;
    } else {
      return size_t{0};
    }
  }();
  static_assert(kLeafWords <= LeafFrameResolver::kStackWords);
  static constexpr uint64_t kWalkGenerationMask = RecordMeta::kGenerationMask;
  static constexpr size_t kMaxLabelWords = 2 * ThreadSlotHeader::kMaxLabels;
  // The longest header a record may have (sample_record.h: RecordLayout).
  static constexpr size_t kHeaderWords =
      RecordLayout{.values = kMaxValuesPerProvider,
                   .leaf_words = kLeafWords,
                   .labels = ThreadSlotHeader::kMaxLabels}
          .frames_at();
  static constexpr size_t kMaxRecordWords =
      kHeaderWords + kMaxFrames < R::max_record_words()
          ? kHeaderWords + kMaxFrames
          : R::max_record_words();
  static_assert(kMaxRecordWords > kHeaderWords,
                "ring records too small for a sample");

  // The stack SampleHandler::SampleThread may use below the first-level
  // handler's frame: its record (kMaxRecordWords words), the rest of its
  // frame with the providers' OnSignal and the clock reads (2 KiB: 280 and
  // 96 bytes at -O2, GCC 12 -fstack-usage; the rest for other compilers and
  // flags), and the unwinder's walk. A sanitizer's redzones triple it (ASan
  // at -O0: 8.5 and 12 KiB measured), -O0 alone doubles it. A signal that
  // finds less of the thread's own stack is sampled without a stack
  // (SampleStackless): tests/safety/safety_small_stack_test.cc measures the
  // handler against it.
  static constexpr size_t kHandlerStackBytes =
      (sizeof(uint64_t) * kMaxRecordWords + 2048 +
       [] {
         if constexpr (DeclaresStackUse<U>) {
           return static_cast<size_t>(U::kMaxStackBytes);
         } else {
           return kUndeclaredUnwinderStackBytes;
         }
       }()) *
      (kUnderSanitizer ? 3 : kUnoptimized ? 2 : 1);

  // A registered thread: the header the signal handler reads and the
  // collector's state (SlotBase), its providers' per-thread data and its
  // ring.
  struct alignas(kCacheLine) Slot : SlotBase {
    std::tuple<typename Ps::ThreadData...> data;
    // Values of samples dropped because the ring was full, per sample type.
    std::array<std::atomic<int64_t>, kNumValues> dropped_values{};
    R ring;
    // The ring its handler writes: `ring`, or in library mode one in the
    // agent's shared region (so that a process that dies loses nothing its
    // handlers wrote). Switched only while no handler can run for the slot.
    R* active_ring = &ring;
  };

  // The unwinder's walks before its tables were ready, process-wide (null:
  // it has no tables).
  static constexpr uint64_t (*WalksWithoutTables())() {
    if constexpr (BuildsTablesLazily<U>) {
      return [] { return static_cast<uint64_t>(U::WalksWithoutTables()); };
    } else {
      return nullptr;
    }
  }
  // Whether the unwinder's tables are complete (always, for unwinders
  // without tables).
  static bool UnwindTablesReady() {
    if constexpr (BuildsTablesLazily<U>) {
      return U::TablesReady();
    } else {
      return true;
    }
  }
  static uint64_t UnwindTablesGeneration() {
    if constexpr (BuildsTablesLazily<U>) {
      return U::TablesGeneration();
    } else {
      return 0;
    }
  }
};

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_PROFILER_LAYOUT_H_
