// inprof/profiler.h: the Profiler, composed from an unwinder, a ring and
// sample providers; thread registration; ScopedProfiler.
//
// A Profiler samples the threads registered with it. Each registered thread
// owns a slot with its own lock-free ring: the profiling signal's handler,
// running on that thread, asks the provider that sent the signal for the
// sample's values, unwinds the interrupted stack and pushes one record. A
// collector thread drains the rings every collect_period into an aggregate
// keyed by (thread, stack); Stop() symbolizes it and writes a pprof file.
//
// Thread-safety: Start, Stop and RegisterThread may be called from any
// thread. A ThreadRegistration must be destroyed before the Profiler and is
// meant to be destroyed on the thread that created it (destroying it
// elsewhere is safe; its slot is then retired instead of reused). Only one
// Profiler runs in a process at a time; a second Start() gets an error.
//
// Example:
//   inprof::DefaultProfiler profiler(inprof::Options::FromEnv());
//   inprof::ScopedProfiler running(profiler);   // Start(); Stop() at exit
//   auto self = profiler.RegisterThread("main");
//   std::thread worker([&] {
//     auto registration = profiler.RegisterThread("worker");
//     DoWork();
//   });
//   worker.join();
#ifndef INPROF_PROFILER_H_
#define INPROF_PROFILER_H_

#if defined(_WIN32)
// Windows: a sampler thread suspends and walks the threads instead of a
// signal handler (dd-win-prof's design); the same API.
#include "inprof/windows/profiler_windows.h"
#else

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "inprof/cpu_time_provider.h"
#include "inprof/frame_pointer_unwinder.h"
#include "inprof/internal/agent_stream.h"
#include "inprof/internal/fork_guard.h"
#include "inprof/internal/label_table.h"
#include "inprof/internal/leaf_frame_resolver.h"
#include "inprof/internal/log.h"
#include "inprof/internal/profiler_control.h"
#include "inprof/internal/profiler_base.h"
#include "inprof/internal/profiler_core.h"
#include "inprof/internal/provider_set.h"
#include "inprof/internal/sample_record.h"
#include "inprof/internal/signal_dispatch.h"
#include "inprof/internal/thread_info.h"
#include "inprof/internal/wall_ticker.h"
#include "inprof/options.h"
#include "inprof/sample_provider.h"
#include "inprof/spsc_ring.h"
#include "inprof/unwinder.h"
#include "inprof/wall_time_provider.h"

namespace inprof {

namespace internal {
// A Profiler's providers, in a base constructed before ProfilerBase (whose
// constructor needs the first provider's period).
template <typename... Ps>
struct ProviderHolder {
  std::tuple<Ps...> providers_;
};
}  // namespace internal

// A sampling profiler composed from components:
//   U   an Unwinder (unwinder.h), e.g. FramePointerUnwinder;
//   R   a SampleRing (spsc_ring.h), one per registered thread;
//   Ps  one or more SampleProviders (sample_provider.h).
template <Unwinder U, SampleRing R, SampleProvider... Ps>
  requires(sizeof...(Ps) >= 1 && sizeof...(Ps) < 256)
class Profiler final : private internal::ProviderHolder<Ps...>,
                       public internal::ProfilerBase {
  using internal::ProviderHolder<Ps...>::providers_;
  // Where each provider's values sit (internal/provider_set.h).
  using Set = internal::ProviderSet<Ps...>;
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
  static constexpr size_t kMaxFrames = 512;  // the seed's limit
  static constexpr size_t kLeafWords = [] {
    if constexpr (CopiesLeafStack<U>) {
      return U::kLeafStackWords;
    } else {
      return size_t{0};
    }
  }();
  static_assert(kLeafWords <= internal::LeafFrameResolver::kStackWords);
  // Record layout: internal/sample_record.h.
  using RecordMeta = internal::RecordMeta;
  static constexpr uint64_t kWalkGenerationMask = RecordMeta::kGenerationMask;
  static constexpr size_t kMaxLabelWords =
      2 * internal::ThreadSlotHeader::kMaxLabels;
  static constexpr size_t kHeaderWords =
      1 + kMaxValuesPerProvider + kLeafWords + kMaxLabelWords;
  static constexpr size_t kMaxRecordWords =
      kHeaderWords + kMaxFrames < R::max_record_words()
          ? kHeaderWords + kMaxFrames
          : R::max_record_words();
  static_assert(kMaxRecordWords > kHeaderWords,
                "ring records too small for a sample");

  // A registered thread: the header the signal handler reads and the
  // collector's state (internal::SlotBase), its providers' per-thread data
  // and its ring.
  struct alignas(kCacheLine) Slot : internal::SlotBase {
    std::tuple<typename Ps::ThreadData...> data;
    // Values of samples dropped because the ring was full, per sample type.
    std::array<std::atomic<int64_t>, kNumValues> dropped_values{};
    // Collector-owned (registry lock held). Per provider: the newest stack
    // drained for it and its canonical labels. What the provider measured
    // after that sample (TakeTail) is credited there: a thread's last
    // moments were spent near it.
    std::array<std::vector<uint64_t>, kNumProviders> provider_last_stack;
    std::array<std::vector<uint64_t>, kNumProviders> provider_last_labels;
    // running_samples at each ticking provider's last visit (ticker).
    std::array<uint32_t, kNumProviders> running_samples_at_visit{};
    R ring;
    // The ring its handler writes: `ring`, or in library mode one in the
    // agent's shared region (so that a process that dies loses nothing its
    // handlers wrote). Switched only while no handler can run for the slot.
    R* active_ring = &ring;
  };

 public:
  using unwinder_type = U;
  using ring_type = R;

  // The stack SampleThread may use below the first-level handler's frame:
  // its record (kMaxRecordWords words), the rest of its frame with the
  // providers' OnSignal and the clock reads (2 KiB: 280 and 96 bytes at
  // -O2, GCC 12 -fstack-usage; the rest for other compilers and flags),
  // and the unwinder's walk. A sanitizer's redzones triple it (ASan at
  // -O0: 8.5 and 12 KiB measured), -O0 alone doubles it. A signal that
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
      (internal::kUnderSanitizer ? 3 : internal::kUnoptimized ? 2 : 1);
  // Where a sample of a thread on a stack too small for the walk puts its
  // values (the profile's comments count them).
  static constexpr const char* kSmallStackFrame = internal::kSmallStackFrame;

  // Validates `options`; an invalid option is logged and the profiler stays
  // disabled (Start() returns the error).
  explicit Profiler(Options options = Options::FromEnv())
      : ProfilerBase(options, Shape{.sample_types = SampleTypes(),
                                    .period_type = PeriodType(),
                                    .period = PeriodOf<0>(options),
                                    .engine = Engine(),
                                    .arms_outside_lock = kArmsOutsideLock,
                                    .defers_retire = kDefersRetire,
                                    .has_ticker = kHasTicker,
                                    .leaf_words = kLeafWords > 0,
                                    .activity = &activity_,
                                    .walks_without_tables = WalksWithoutTables()}) {}

  ~Profiler() { Shutdown(); }

  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  // Start(), Stop(), RegisterThread(), SetThreadName(), stats() and the
  // rest of the API: internal::ProfilerBase.

  // The pprof sample types, in value order.
  static std::vector<ValueType> SampleTypes() { return Set::SampleTypes(); }

  // "unwinder=frame-pointer providers=cpu".
  static std::string Engine() { return Set::Engine(U::kName); }

 private:
  static ValueType PeriodType() { return Set::PeriodType(); }
  template <size_t I>
  int64_t PeriodOf(const Options& options) {
    // Configure before reading so the period reflects the options.
    Options o = options;
    if (!std::get<I>(providers_).Configure(o).ok()) return 0;
    return static_cast<int64_t>(std::get<I>(providers_).Period());
  }

  // How providers that say so sample (CpuTimeProvider: its engine), for
  // the log and the profile's comments.
  std::string DescribeProviders() const override { return Set::Describe(providers_); }

  absl::Status ConfigureProviders() override {
    return Set::Configure(providers_, options_);
  }

  bool UnwinderSupported(std::string& why_not) const override {
    if (U::Supported()) return true;
    why_not = absl::StrCat(U::kName,
                           " unwinding is not supported on this "
                           "architecture; profiling stays off");
    return false;
  }

  static constexpr uint64_t (*WalksWithoutTables())() {
    if constexpr (BuildsTablesLazily<U>) {
      return [] { return static_cast<uint64_t>(U::WalksWithoutTables()); };
    } else {
      return nullptr;
    }
  }

  // The signal handler's provider-specific part. Async-signal-safe.
  static void SampleThread(internal::ThreadSlotHeader* header,
                           siginfo_t* info, void* ucontext, int tag) noexcept {
    Slot* slot = static_cast<Slot*>(header);
    size_t provider;
    int64_t values[kMaxValuesPerProvider];
    if (!TakeValues(*slot, *info, tag, provider, values)) return;
    const size_t nvalues = kValueCounts[provider];
    uint64_t record[kMaxRecordWords];
    // The thread's labels: written only by this thread, so a plain copy
    // after a signal fence sees a consistent set.
    std::atomic_signal_fence(std::memory_order_acquire);
    uint32_t nlabels = slot->label_count;
    if (nlabels > internal::ThreadSlotHeader::kMaxLabels) nlabels = 0;
    const size_t label_at = 1 + nvalues + kLeafWords;
    for (size_t i = 0; i < 2 * nlabels; ++i) {
      record[label_at + i] = slot->label_words[i];
    }
    const size_t header_words = label_at + 2 * nlabels;
    const size_t frame_room = kMaxRecordWords - header_words;
    const size_t max_frames =
        static_cast<size_t>(slot->max_frames) < frame_room
            ? static_cast<size_t>(slot->max_frames)
            : frame_room;
    const bool sampled_blocked = SampledBlockedAt(
        provider, *slot, std::make_index_sequence<kNumProviders>{});
    // Read before the walk, so that tables published during it count as
    // newer (the safe side: the episode is then sampled again).
    RecordMeta meta;
    if (sampled_blocked) {
      meta.tables_ready = UnwindTablesReady();
      meta.generation = static_cast<uint32_t>(UnwindTablesGeneration() & kWalkGenerationMask);
    }
    U unwinder;
    if constexpr (kLeafWords > 0) {
      unwinder.CopyLeafStack(
          ucontext, slot->stack,
          std::span<uint64_t>(record + 1 + nvalues, kLeafWords));
    }
    const UnwindResult unwound = unwinder.Unwind(
        ucontext, slot->stack,
        std::span<uintptr_t>(
            reinterpret_cast<uintptr_t*>(record + header_words), max_frames));
    static_assert(sizeof(uintptr_t) == sizeof(uint64_t));
    // Which tables a provisional stack of a blocking episode was walked
    // with: the collector may drain it after newer tables are published,
    // and decides from this whether to sample the episode again.
    if (!(sampled_blocked && unwound.provisional)) {
      meta.tables_ready = false;
      meta.generation = 0;
    }
    meta.provider = static_cast<uint8_t>(provider);
    meta.truncated = unwound.truncated;
    meta.blocked = sampled_blocked;
    meta.provisional = unwound.provisional;
    meta.leaf_words = kLeafWords > 0;
    meta.label_count = static_cast<uint8_t>(nlabels);
    meta.depth = static_cast<uint16_t>(unwound.depth);
    record[0] = meta.Encode();
    for (size_t i = 0; i < nvalues; ++i) {
      record[1 + i] = static_cast<uint64_t>(values[i]);
    }
    slot->samples_taken.fetch_add(1, std::memory_order_relaxed);
    if (unwound.truncated) {
      slot->samples_truncated.fetch_add(1, std::memory_order_relaxed);
    }
    if (!slot->active_ring->TryPush(
            std::span<const uint64_t>(record, header_words + unwound.depth))) {
      // Keep the values so totals stay true; the ring counted the drop.
      const size_t offset = kValueOffsets[provider];
      for (size_t i = 0; i < nvalues; ++i) {
        slot->dropped_values[offset + i].fetch_add(values[i],
                                                   std::memory_order_relaxed);
      }
    } else if (kSamplesRunning[provider] && info->si_code != SI_KERNEL) {
      // A stack of the thread running, now in its ring (ITIMER_PROF's
      // process-wide signal, SI_KERNEL, may land on a thread that is not
      // the one running: not counted). Only this thread writes the count.
      slot->running_samples.store(
          slot->running_samples.load(std::memory_order_relaxed) + 1,
          std::memory_order_release);
    }
    // A signal another provider sent that this one swallowed: the same
    // stack, recorded again for it.
    TakeSwallowedEach(provider, *slot, record, nvalues, nlabels, unwound,
                      std::make_index_sequence<kNumProviders>{});
    HandlerDone(*slot);
  }

  // What both handler parts begin with: the provider the signal is for
  // (`tag`) and the values it measured; false when there is no sample.
  static bool TakeValues(Slot& slot, const siginfo_t& info, int tag,
                         size_t& provider, int64_t* values) noexcept {
    provider = static_cast<size_t>(tag & 0xff);
    return provider < kNumProviders &&
           OnSignalAt(provider, slot, info,
                      std::make_index_sequence<kNumProviders>{}, values);
  }
  // ... and end with, after the records' push.
  static void HandlerDone(Slot& slot) noexcept {
    // After the push: a collector that sees this count sees the record.
    activity_.fetch_add(1, std::memory_order_release);
    slot.handler_exit_clock.store(internal::ThreadCpuNanos(slot.cpu_clock),
                                  std::memory_order_relaxed);
  }

  // The signal handler's part for a thread whose stack cannot take
  // SampleThread (ThreadSlotHeader::sample_stackless): the provider's
  // values, and those of signals it swallowed, as records without a stack.
  // Its frame is a few words. Async-signal-safe.
  static void SampleStackless(internal::ThreadSlotHeader* header,
                              siginfo_t* info, void*, int tag) noexcept {
    Slot* slot = static_cast<Slot*>(header);
    size_t provider;
    int64_t values[kMaxValuesPerProvider];
    if (!TakeValues(*slot, *info, tag, provider, values)) return;
    const bool blocked = SampledBlockedAt(
        provider, *slot, std::make_index_sequence<kNumProviders>{});
    PushStackless(*slot, provider, values, blocked);
    TakeSwallowedStacklessEach(provider, *slot,
                               std::make_index_sequence<kNumProviders>{});
    HandlerDone(*slot);
  }
  static void PushStackless(Slot& slot, size_t provider, const int64_t* values,
                            bool blocked) noexcept {
    const size_t nvalues = kValueCounts[provider];
    uint64_t record[1 + kMaxValuesPerProvider];
    RecordMeta meta;
    meta.provider = static_cast<uint8_t>(provider);
    meta.stackless = true;
    meta.blocked = blocked;
    record[0] = meta.Encode();
    for (size_t i = 0; i < nvalues; ++i) {
      record[1 + i] = static_cast<uint64_t>(values[i]);
    }
    slot.samples_taken.fetch_add(1, std::memory_order_relaxed);
    if (!slot.active_ring->TryPush(std::span<const uint64_t>(record, 1 + nvalues))) {
      for (size_t i = 0; i < nvalues; ++i) {
        slot.dropped_values[kValueOffsets[provider] + i].fetch_add(
            values[i], std::memory_order_relaxed);
      }
    }
  }
  template <size_t... I>
  static void TakeSwallowedStacklessEach(size_t provider, Slot& slot,
                                         std::index_sequence<I...>) noexcept {
    (
        [&] {
          using P = std::tuple_element_t<I, std::tuple<Ps...>>;
          if constexpr (TakesSwallowedSignals<P>) {
            if (provider == I) return;
            int64_t values[kMaxValuesPerProvider];
            if (P::TakeSwallowed(slot, std::get<I>(slot.data),
                                 std::span<int64_t>(values, kValueCounts[I]))) {
              PushStackless(slot, I, values, /*blocked=*/false);
            }
          }
        }(),
        ...);
  }

  // On the owning thread as it unregisters (ThreadSlotHeader::
  // before_retire): each provider that OwesSamples and owes one now gets
  // its signal, handled before the call returns (a signal a thread sends
  // itself is delivered as the system call returns).
  static void TakeOwedSamples(internal::ThreadSlotHeader* header) noexcept {
    Slot* slot = static_cast<Slot*>(header);
    const uint64_t session = slot->session.load(std::memory_order_acquire);
    if (session == 0 || session != internal::ActiveSession()) return;
    TakeOwedEach(*slot, session, std::make_index_sequence<kNumProviders>{});
  }
  template <size_t... I>
  static void TakeOwedEach(Slot& slot, uint64_t session,
                           std::index_sequence<I...>) noexcept {
    (
        [&] {
          using P = std::tuple_element_t<I, std::tuple<Ps...>>;
          if constexpr (OwesSamples<P>) {
            if (P::OwesSample(slot, std::get<I>(slot.data))) {
              internal::SignalThisThread(internal::MakeSignalTag(I, session));
            }
          }
        }(),
        ...);
  }

  // In the handler, after `provider`'s record was pushed from `record`:
  // each other provider that had a signal outstanding for the thread
  // (TakesSwallowedSignals) gets a record of the same stack. The record is
  // rewritten in place: its values, and the words after them moved to
  // where its header ends for that provider.
  template <size_t... I>
  static void TakeSwallowedEach(size_t provider, Slot& slot, uint64_t* record,
                                size_t nvalues, size_t nlabels,
                                const UnwindResult& unwound,
                                std::index_sequence<I...>) noexcept {
    (
        [&] {
          using P = std::tuple_element_t<I, std::tuple<Ps...>>;
          if constexpr (TakesSwallowedSignals<P>) {
            if (provider == I) return;
            int64_t values[kMaxValuesPerProvider];
            if (!P::TakeSwallowed(slot, std::get<I>(slot.data),
                                  std::span<int64_t>(values, kValueCounts[I]))) {
              return;
            }
            const size_t new_header =
                1 + kValueCounts[I] + kLeafWords + 2 * nlabels;
            size_t depth = unwound.depth;
            bool truncated = unwound.truncated;
            if (new_header + depth > kMaxRecordWords) {
              depth = kMaxRecordWords - new_header;
              truncated = true;
            }
            // Leaf words, labels and frames, moved as one block.
            const size_t from = 1 + nvalues, to = 1 + kValueCounts[I];
            const size_t words = kLeafWords + 2 * nlabels + depth;
            if (to < from) {
              for (size_t w = 0; w < words; ++w) record[to + w] = record[from + w];
            } else if (to > from) {
              for (size_t w = words; w-- > 0;) record[to + w] = record[from + w];
            }
            RecordMeta meta;
            meta.provider = static_cast<uint8_t>(I);
            meta.truncated = truncated;
            meta.leaf_words = kLeafWords > 0;
            meta.label_count = static_cast<uint8_t>(nlabels);
            meta.depth = static_cast<uint16_t>(depth);
            record[0] = meta.Encode();
            for (size_t i = 0; i < kValueCounts[I]; ++i) {
              record[1 + i] = static_cast<uint64_t>(values[i]);
            }
            slot.samples_taken.fetch_add(1, std::memory_order_relaxed);
            if (truncated) slot.samples_truncated.fetch_add(1, std::memory_order_relaxed);
            if (!slot.active_ring->TryPush(
                    std::span<const uint64_t>(record, new_header + depth))) {
              for (size_t i = 0; i < kValueCounts[I]; ++i) {
                slot.dropped_values[kValueOffsets[I] + i].fetch_add(
                    values[i], std::memory_order_relaxed);
              }
            }
            nvalues = kValueCounts[I];
          }
        }(),
        ...);
  }

  // Providers that say whether their sample is of a blocked thread.
  template <size_t... I>
  static bool SampledBlockedAt(size_t provider, Slot& slot,
                               std::index_sequence<I...>) noexcept {
    bool blocked = false;
    (
        [&] {
          using P = std::tuple_element_t<I, std::tuple<Ps...>>;
          if constexpr (ReportsBlockedSamples<P>) {
            if (provider == I) blocked = P::SampledBlocked(std::get<I>(slot.data));
          }
        }(),
        ...);
    return blocked;
  }
  template <size_t... I>
  static bool OnSignalAt(size_t provider, Slot& slot, const siginfo_t& info,
                         std::index_sequence<I...>, int64_t* values) noexcept {
    bool sampled = false;
    ((provider == I
          ? (sampled = std::tuple_element_t<I, std::tuple<Ps...>>::OnSignal(
                 slot, std::get<I>(slot.data), info,
                 std::span<int64_t>(values, kValueCounts[I])),
             true)
          : false) ||
     ...);
    return sampled;
  }

  // When every provider ArmsConcurrently (sample_provider.h), a thread
  // that registers or unregisters while the profiler runs arms or disarms
  // them outside the registry lock; Start() and Stop() do it under the lock.
  // All or none, so that providers are always armed in their order (a
  // second perf-engine provider on the same thread takes the slot's
  // overflow descriptor from the first: tests/core/sample_provider_test.cc).
  static constexpr bool kArmsOutsideLock = (ArmsConcurrently<Ps> && ...);

  // The registry lock held, or (kArmsOutsideLock) the slot marked by
  // BeginWorkOutsideLock.
  void ArmProviders(internal::SlotBase* slot, uint64_t session) override {
    ArmEach(static_cast<Slot*>(slot), session,
            std::make_index_sequence<kNumProviders>{});
  }
  template <size_t... I>
  void ArmEach(Slot* slot, uint64_t session, std::index_sequence<I...>) {
    (ArmOne<I>(slot, session), ...);
  }
  template <size_t I>
  void ArmOne(Slot* slot, uint64_t session) {
    absl::Status s = std::get<I>(providers_).ArmThread(
        *slot, std::get<I>(slot->data), internal::MakeSignalTag(I, session));
    if (!s.ok()) {
      internal::Log(absl::StrCat("cannot sample thread '", slot->name,
                                 "': ", s.message()));
    }
  }
  void DisarmLocked(internal::SlotBase* slot) override {
    DisarmEach(static_cast<Slot*>(slot), std::make_index_sequence<kNumProviders>{});
  }
  template <size_t... I>
  void DisarmEach(Slot* slot, std::index_sequence<I...>) {
    (std::get<I>(providers_).DisarmThread(*slot, std::get<I>(slot->data)), ...);
  }

  // What each provider measured since the thread's last sample: to its
  // newest stack, or to kTailFrame.
  void TakeTailsLocked(internal::SlotBase* slot) override {
    TakeTailsEach(static_cast<Slot*>(slot), std::make_index_sequence<kNumProviders>{});
  }
  template <size_t... I>
  void TakeTailsEach(Slot* slot, std::index_sequence<I...>) {
    (TakeTailOne<I>(slot), ...);
  }
  template <size_t I>
  void TakeTailOne(Slot* slot) {
    using P = std::tuple_element_t<I, std::tuple<Ps...>>;
    if constexpr (ReportsTail<P>) {
      int64_t values[kMaxValuesPerProvider] = {};
      std::span<int64_t> v(values, kValueCounts[I]);
      if (!std::get<I>(providers_).TakeTail(*slot, std::get<I>(slot->data), v)) {
        return;
      }
      std::lock_guard<std::mutex> agg_lock(core_.mutex());
      SampleAggregator& agg = core_.aggregator();
      EnsureAggregateThread(slot, agg);
      const std::vector<uint64_t>& last = slot->provider_last_stack[I];
      if (!last.empty()) {
        // The thread was last seen there: its final stretch is credited to
        // that stack (sampled, not synthetic), so a thread that lived a
        // sample or two keeps its CPU on its real stack.
        agg.Add(slot->aggregate_thread, last, slot->provider_last_labels[I],
                kValueOffsets[I],
                std::span<const int64_t>(values, kValueCounts[I]));
        return;
      }
      const char* frame = kTailFrame;
      if constexpr (NamesTailFrame<P>) frame = P::kTailFrame;
      agg.AddSynthetic(slot->aggregate_thread, frame, kValueOffsets[I],
                       std::span<const int64_t>(values, kValueCounts[I]));
    }
  }

  // Registry and aggregate locks held. Cheap for an idle thread (an empty
  // ring and unchanged counters): no atomic read-modify-write, no lookup.
  // Returns false when it stopped at its budget with records left.
  bool DrainSlotIntoLocked(internal::SlotBase* base, SampleAggregator& agg) override {
    Slot* slot = static_cast<Slot*>(base);
    EnsureAggregateThread(slot, agg);
    // Not on the stack: a thread that unregisters drains its own ring, and
    // its 9 KiB frame (probed page by page) faulted in up to three fresh
    // stack pages, ~28 us a thread on this project's VM (bench/overhead
    // idle-1000). The registry lock serializes every drain.
    uint64_t* record = drain_scratch_.get();
    // Room for one inserted caller frame.
    uint64_t* repaired = record + kMaxRecordWords;
    uint64_t recorded = 0;
    // At most a ring's worth a pass: a thread whose handler pushes as fast
    // as this pops (a flood of signals; any busy thread under TSan) held
    // the registry lock, and Stop() behind it, for as long as it ran (the
    // start/stop hammer hung 4 minutes). The rest waits for the next pass.
    bool drained_all = true;
    size_t budget = size_t{1} << 16;
    if constexpr (SizedRing<R>) budget = R::capacity_words();
    while (size_t n = slot->active_ring->TryPop(std::span<uint64_t>(record, kMaxRecordWords))) {
      if (AddRecordLocked(slot, agg, record, n, repaired)) ++recorded;
      if (n >= budget) {
        drained_all = false;
        break;
      }
      budget -= n;
    }
    const uint64_t dropped = slot->active_ring->dropped();
    if (dropped != slot->seen_dropped) {
      std::array<int64_t, kNumValues> lost{};
      for (size_t i = 0; i < kNumValues; ++i) {
        lost[i] = slot->dropped_values[i].exchange(0, std::memory_order_relaxed);
      }
      agg.AddSynthetic(slot->aggregate_thread,
                       "[inprof: samples dropped, ring full]", 0, lost);
    }
    const uint64_t taken = slot->samples_taken.load(std::memory_order_relaxed);
    const uint64_t truncated =
        slot->samples_truncated.load(std::memory_order_relaxed);
    const uint64_t small_stack =
        slot->samples_small_stack.load(std::memory_order_relaxed);
    small_stack_.fetch_add(small_stack - slot->seen_small_stack,
                           std::memory_order_relaxed);
    slot->seen_small_stack = small_stack;
    taken_.fetch_add(taken - slot->seen_taken, std::memory_order_relaxed);
    dropped_.fetch_add(dropped - slot->seen_dropped, std::memory_order_relaxed);
    truncated_.fetch_add(truncated - slot->seen_truncated,
                         std::memory_order_relaxed);
    recorded_.fetch_add(recorded, std::memory_order_relaxed);
    slot->seen_taken = taken;
    slot->seen_dropped = dropped;
    slot->seen_truncated = truncated;
    return drained_all;
  }

  // Registry and aggregate locks held. One record as the handler writes it
  // (from a ring, or built by the ticker: ReadBlockedStack) into the
  // aggregate and the slot's newest stacks; false for a malformed one.
  // `repaired` has room for kMaxRecordWords + 1 words.
  bool AddRecordLocked(Slot* slot, SampleAggregator& agg, uint64_t* record,
                       size_t n, uint64_t* repaired) {
    EnsureAggregateThread(slot, agg);
    const RecordMeta meta = RecordMeta::Decode(record[0]);
    const size_t provider = meta.provider;
    const size_t depth = meta.depth;
    const bool blocked = meta.blocked;
    const size_t leaf_words = meta.leaf_words ? kLeafWords : 0;
    const size_t nlabels = meta.label_count;
    if (provider >= kNumProviders) return false;
    const size_t nvalues = kValueCounts[provider];
    const size_t label_at = 1 + nvalues + leaf_words;
    const size_t header = label_at + 2 * nlabels;
    if (n < header + depth) return false;
    int64_t values[kMaxValuesPerProvider];
    for (size_t i = 0; i < nvalues; ++i) {
      values[i] = static_cast<int64_t>(record[1 + i]);
    }
    if (meta.stackless) {
      // Taken on a stack too small for the walk (SampleStackless). A
      // blocked one begins an episode whose rest goes to the same frame.
      agg.AddSynthetic(slot->aggregate_thread, kSmallStackFrame,
                       kValueOffsets[provider],
                       std::span<const int64_t>(values, nvalues));
      if (blocked) {
        slot->blocked_stack.clear();
        slot->blocked_labels.clear();
        slot->blocked_provisional = false;
        slot->blocked_stackless = true;
      }
      return true;
    }
    std::span<const uint64_t> frames(record + header, depth);
    if (leaf_words > 0 && depth >= 1) {
      frames = RepairLeaf(frames,
                          std::span<const uint64_t>(record + 1 + nvalues,
                                                    leaf_words),
                          repaired);
    }
    uint64_t labels[kMaxLabelWords + 2];
    const size_t label_words = CanonicalLabels(
        std::span<const uint64_t>(record + label_at, 2 * nlabels), provider,
        labels, blocked);
    agg.Add(slot->aggregate_thread, frames,
            std::span<const uint64_t>(labels, label_words),
            kValueOffsets[provider],
            std::span<const int64_t>(values, nvalues));
    slot->last_stack.assign(frames.begin(), frames.end());
    slot->provider_last_stack[provider].assign(frames.begin(), frames.end());
    slot->provider_last_labels[provider].assign(labels, labels + label_words);
    if (kSamplesRunning[provider] && !blocked) {
      slot->running_stack.assign(frames.begin(), frames.end());
      slot->running_labels.assign(labels, labels + label_words);
      if constexpr (kHasFollower) {
        FollowRunningSample(slot, agg, frames,
                            std::span<const uint64_t>(record + label_at, 2 * nlabels),
                            values[kPeriodIndexes[provider]]);
      }
    }
    if (blocked) {
      // Where the thread's current blocking episode blocks: the ticker
      // credits the rest of the episode here without signalling again.
      slot->blocked_stackless = false;
      slot->blocked_stack.assign(frames.begin(), frames.end());
      slot->blocked_labels.assign(labels, labels + label_words);
      slot->blocked_provisional = meta.provisional;
      slot->blocked_tables_ready = meta.tables_ready;
      slot->blocked_tables_generation = meta.generation;
    }
    // The stack's own labels, without the provider's state label.
    slot->last_labels.assign(record + label_at,
                             record + label_at + 2 * nlabels);
    return true;
  }

  // Ticking providers that follow running threads (wall_time_provider.h):
  // a running sample drained for a followed thread carries its wall time.
  template <typename P>
  static constexpr bool kFollows = FollowsRunningThreads<P>;
  static constexpr bool kHasFollower = (kFollows<Ps> || ...);
  static constexpr std::array<size_t, kNumProviders> kPeriodIndexes{
      Ps::kPeriodTypeIndex...};

  // Registry and aggregate locks held.
  void FollowRunningSample(Slot* slot, SampleAggregator& agg,
                           std::span<const uint64_t> frames,
                           std::span<const uint64_t> label_words, int64_t cpu_ns) {
    FollowEach(slot, agg, frames, label_words, cpu_ns,
               std::make_index_sequence<kNumProviders>{});
  }
  template <size_t... I>
  void FollowEach(Slot* slot, SampleAggregator& agg,
                  std::span<const uint64_t> frames,
                  std::span<const uint64_t> label_words, int64_t cpu_ns,
                  std::index_sequence<I...>) {
    (
        [&] {
          using P = std::tuple_element_t<I, std::tuple<Ps...>>;
          if constexpr (kFollows<P>) {
            int64_t values[kMaxValuesPerProvider] = {};
            std::span<int64_t> v(values, kValueCounts[I]);
            if (!P::FollowRunningSample(std::get<I>(slot->data), cpu_ns, v)) return;
            uint64_t labels[kMaxLabelWords + 2];
            const size_t n = CanonicalLabels(label_words, I, labels);
            agg.Add(slot->aggregate_thread, frames,
                    std::span<const uint64_t>(labels, n), kValueOffsets[I],
                    std::span<const int64_t>(values, kValueCounts[I]));
            wall_running_credits_.fetch_add(1, std::memory_order_relaxed);
          }
        }(),
        ...);
  }

  // Canonical label words for the aggregate (internal/provider_set.h),
  // with the provider's state label ("thread state"="running" for a
  // signalled wall sample). Returns the number of words written to `out`
  // (room for kMaxLabelWords + 2).
  size_t CanonicalLabels(std::span<const uint64_t> words, size_t provider,
                         uint64_t* out, bool blocked = false) const {
    return internal::CanonicalLabelWords(
        words, provider < kNumProviders && state_label_provider_[provider], state_key_,
        blocked ? blocked_value_ : running_value_, out);
  }

  // The ticker thread ("inprof-tick"): drives providers that model
  // TicksThreads (wall time).
  static constexpr bool kHasTicker = (TicksThreads<Ps> || ...);

  absl::Duration TickerPeriod() const override {
    absl::Duration period = absl::InfiniteDuration();
    TickerPeriodEach(period, std::make_index_sequence<kNumProviders>{});
    return period;
  }
  template <size_t... I>
  void TickerPeriodEach(absl::Duration& period, std::index_sequence<I...>) const {
    (
        [&] {
          using P = std::tuple_element_t<I, std::tuple<Ps...>>;
          if constexpr (TicksThreads<P>) {
            const absl::Duration d = std::get<I>(providers_).TickPeriod();
            if (d > absl::ZeroDuration() && d < period) period = d;
          }
        }(),
        ...);
  }

  // One wake-up of the ticker (internal::ProfilerBase::Tick): each ticking
  // provider visits its next threads.
  void TickProvidersLocked(TickTime when, size_t batch, size_t& next) override {
    TickEach(when, batch, next, std::make_index_sequence<kNumProviders>{});
  }
  template <size_t... I>
  void TickEach(TickTime when, size_t batch, size_t& next,
                std::index_sequence<I...>) {
    (TickOne<I>(when, batch, next), ...);
  }
  // Registry lock held: provider I's visits (internal::WallTicker), this
  // profiler their host.
  template <size_t I>
  void TickOne(TickTime when, size_t batch, size_t& next) {
    using P = std::tuple_element_t<I, std::tuple<Ps...>>;
    if constexpr (TicksThreads<P>) {
      TickerHost<I> host{this};
      const internal::WallVisitCounts counts = std::get<I>(tickers_).VisitNext(
          std::get<I>(providers_), host, std::span<internal::SlotBase* const>(active_),
          when, batch, kMaxTickBatch, next, tick_steady_visits_);
      wall_signals_.fetch_add(counts.signals, std::memory_order_relaxed);
      wall_stacks_read_.fetch_add(counts.stacks_read, std::memory_order_relaxed);
      wall_episodes_resampled_.fetch_add(counts.episodes_resampled,
                                         std::memory_order_relaxed);
    }
  }

  // What provider I's visits ask of the profiler (internal::WallTickerHost).
  template <size_t I>
  struct TickerHost {
    static constexpr bool kCountsRunningSamples = kHasRunningSampler;
    Profiler* self;

    static Slot& Of(internal::SlotBase& slot) { return static_cast<Slot&>(slot); }
    auto& Data(internal::SlotBase& slot) { return std::get<I>(Of(slot).data); }
    uint32_t& RunningSamplesAtVisit(internal::SlotBase& slot) {
      return Of(slot).running_samples_at_visit[I];
    }
    void DrainSlot(internal::SlotBase& slot) {
      self->RefreshLeafResolverLocked();
      self->DrainSlotLocked(&slot);
    }
    bool ReadBlockedStack(internal::SlotBase& slot) {
      return self->template ReadBlockedStack<I>(&Of(slot));
    }
    void Signal(internal::SlotBase& slot) {
      self->SendProfilingSignal(slot, internal::MakeSignalTag(I, self->session_));
    }
    void CreditBlocked(internal::SlotBase& slot, std::span<const int64_t> values) {
      self->CreditBlockedLocked(&slot, kValueOffsets[I], values);
    }
    void CreditRunning(internal::SlotBase& slot, std::span<const int64_t> values) {
      self->template CreditRunning<I>(&Of(slot), values);
    }
    void CreditSynthetic(internal::SlotBase& slot, std::span<const int64_t> values,
                         const char* frame) {
      self->CreditSyntheticLocked(&slot, kValueOffsets[I], values, frame);
    }
    bool TablesReady() { return UnwindTablesReady(); }
    uint64_t TablesGeneration() { return UnwindTablesGeneration(); }
  };

  // Whether a ticking provider's blocked threads can have their stacks read
  // without a signal: the provider says where the thread waits
  // (EpisodeSite, LookClock, TakeStackRead) and the unwinder walks copies
  // of stacks. Not under ThreadSanitizer: the thread's label words, which
  // only that thread writes (the handler reads them on it), are read from
  // the ticker while the thread waits, which it would report as a race.
#if defined(__SANITIZE_THREAD__)
  static constexpr bool kUnderTsan = true;
#else
  static constexpr bool kUnderTsan = false;
#endif
  template <typename P>
  static constexpr bool kReadsBlockedStacks =
      !kUnderTsan && kLeafWords == 0 && ReadsBlockedStacks<P> && WalksStackCopies<U>;
  // The most of a blocked thread's stack it copies (from its sp up): a
  // deeper stack is sampled by the signal.
  static constexpr size_t kStackReadBytes = 64 * 1024;

  // Registry lock held, in a visit that asked for kSignalBlocked: the
  // thread's stack copied from where it waits (process_vm_readv: a stack
  // unmapped meanwhile fails instead of faulting) and walked from the copy,
  // its sample recorded as its handler would have -- when the thread's CPU
  // clock reads after the copy what it read before the look that found it
  // waiting (it did not run: the copy is its stack as it waits) and the
  // walk is complete. False (the caller signals) otherwise. A signal costs
  // the thread a wake-up, the handler and, for calls SA_RESTART does not
  // restart, an EINTR; this costs the ticker a copy and a walk.
  template <size_t I>
  bool ReadBlockedStack(Slot* slot) {
    using P = std::tuple_element_t<I, std::tuple<Ps...>>;
    if constexpr (!kReadsBlockedStacks<P>) {
      return false;
    } else {
      if (stack_reads_off_) return false;
      auto& data = std::get<I>(slot->data);
      const internal::SyscallSite site = P::EpisodeSite(data);
      const int64_t clock = P::LookClock(data);
      if (!site.known() || site.nr < 0 || clock < 0 || (site.sp & 7) != 0 ||
          site.sp < slot->stack.lo || site.sp >= slot->stack.hi ||
          site == slot->unreadable_site) {
        return false;
      }
      const size_t bytes =
          std::min<size_t>(slot->stack.hi - site.sp, kStackReadBytes) & ~size_t{7};
      if (bytes == 0) return false;
      if (stack_copy_ == nullptr) {
        stack_copy_ = std::make_unique_for_overwrite<uint64_t[]>(kStackReadBytes / 8);
        read_record_ = std::make_unique_for_overwrite<uint64_t[]>(2 * kMaxRecordWords + 1);
      }
      const int error =
          internal::CopyOwnMemory(start_pid_, site.sp, bytes, stack_copy_.get());
      if (error != 0) {
        if (error != EFAULT) {
          // A sandbox without process_vm_readv: signals from now on.
          stack_reads_off_ = true;
          internal::Log(absl::StrCat(
              "wall sampler: cannot read a waiting thread's stack "
              "(process_vm_readv: ", strerror(error),
              "); blocked threads are signalled for their stacks instead"));
        }
        return false;
      }
      uint64_t* record = read_record_.get();
      constexpr size_t nvalues = kValueCounts[I];
      // Its labels as the handler would copy them (the thread waits: they
      // do not change while its clock does not).
      uint32_t nlabels = __atomic_load_n(&slot->label_count, __ATOMIC_RELAXED);
      if (nlabels > internal::ThreadSlotHeader::kMaxLabels) nlabels = 0;
      const size_t label_at = 1 + nvalues;
      for (size_t i = 0; i < 2 * nlabels; ++i) {
        record[label_at + i] = __atomic_load_n(&slot->label_words[i], __ATOMIC_RELAXED);
      }
      const size_t header_words = label_at + 2 * nlabels;
      const size_t max_frames = std::min<size_t>(
          static_cast<size_t>(slot->max_frames), kMaxRecordWords - header_words);
      const bool tables_ready = UnwindTablesReady();
      const uint64_t generation = UnwindTablesGeneration() & kWalkGenerationMask;
      const UnwindResult unwound = U().UnwindCopy(
          site.pc, site.sp, std::span<const uint64_t>(stack_copy_.get(), bytes / 8),
          std::span<uintptr_t>(reinterpret_cast<uintptr_t*>(record + header_words),
                               max_frames));
      if (unwound.truncated) {
        // A frame whose rbp the copy does not settle: the same stack at the
        // same place will not walk either, and a failed read is work the
        // ticker does on top of the signal. Signalled there from now on.
        slot->unreadable_site = site;
        return false;
      }
      if (internal::ThreadCpuNanos(slot->cpu_clock) != clock) {
        return false;  // the thread ran: the copy may be torn
      }
      int64_t values[kMaxValuesPerProvider] = {};
      if (!std::get<I>(providers_).TakeStackRead(
              data, std::span<int64_t>(values, nvalues))) {
        return false;
      }
      RecordMeta meta;
      meta.provider = static_cast<uint8_t>(I);
      meta.blocked = true;
      meta.provisional = unwound.provisional;
      meta.tables_ready = unwound.provisional && tables_ready;
      meta.generation = unwound.provisional ? static_cast<uint32_t>(generation) : 0;
      meta.label_count = static_cast<uint8_t>(nlabels);
      meta.depth = static_cast<uint16_t>(unwound.depth);
      record[0] = meta.Encode();
      for (size_t i = 0; i < nvalues; ++i) {
        record[1 + i] = static_cast<uint64_t>(values[i]);
      }
      slot->samples_taken.fetch_add(1, std::memory_order_relaxed);
      std::lock_guard<std::mutex> agg_lock(core_.mutex());
      if (AddRecordLocked(slot, core_.aggregator(), record,
                          header_words + unwound.depth, record + kMaxRecordWords)) {
        recorded_.fetch_add(1, std::memory_order_relaxed);
      }
      return true;
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

  // Registry lock held. The thread ran throughout the interval and a
  // running sample was taken of it meanwhile: add the values to that
  // sample's stack, labelled running (drains the ring, where it may be).
  template <size_t I>
  void CreditRunning(Slot* slot, std::span<const int64_t> values) {
    std::lock_guard<std::mutex> agg_lock(core_.mutex());
    SampleAggregator& agg = core_.aggregator();
    RefreshLeafResolverLocked();
    DrainSlotIntoLocked(slot, agg);
    uint64_t labels[kMaxLabelWords + 2];
    const size_t label_words = CanonicalLabels(slot->running_labels, I, labels);
    if (slot->running_stack.empty()) {
      // Cannot happen (the count follows the push); credited to the
      // thread's tail frame rather than lost.
      const char* frame = kTailFrame;
      if constexpr (NamesTailFrame<std::tuple_element_t<I, std::tuple<Ps...>>>) {
        frame = std::tuple_element_t<I, std::tuple<Ps...>>::kTailFrame;
      }
      agg.AddSynthetic(slot->aggregate_thread, frame, kValueOffsets[I], values);
      return;
    }
    agg.Add(slot->aggregate_thread, slot->running_stack,
            std::span<const uint64_t>(labels, label_words), kValueOffsets[I],
            values);
    wall_running_credits_.fetch_add(1, std::memory_order_relaxed);
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


  // When every provider can be disarmed and its tail taken after the
  // thread is gone, threads unregister themselves without the registry
  // lock (ThreadRegistration::Reset) and the profiler finishes that later
  // (internal::ProfilerBase::ProcessRetiredLocked).
  static constexpr bool kDefersRetire = (UnregistersLate<Ps> && ...);

  // In a forked child: no timer deleted (its id may now name one of the
  // child's own); a shared ring is the parent's.
  void ForgetProviderStateLocked(internal::SlotBase* base) override {
    Slot* slot = static_cast<Slot*>(base);
    ResetProviderData(slot);
    slot->active_ring = &slot->ring;
  }

  // Library mode: the shape of the records and rings, for the agent to read
  // the rings of a process that died (internal/agent_stream.h); null when
  // the ring type is not an SpscRecordRing.
  const internal::AgentThreadRingLayout* ThreadRingLayout() const override {
    if constexpr (kIsSpscRecordRing<R>) {
      static const internal::AgentThreadRingLayout layout = [] {
        internal::AgentThreadRingLayout l;
        l.ring_bytes = static_cast<uint32_t>(sizeof(R));
        l.ring_words = static_cast<uint32_t>(R::capacity_words());
        l.leaf_words = static_cast<uint32_t>(kLeafWords);
        for (size_t i = 0; i < kNumProviders; ++i) {
          l.value_counts.push_back(static_cast<uint32_t>(kValueCounts[i]));
          l.value_offsets.push_back(static_cast<uint32_t>(kValueOffsets[i]));
          if (state_label_provider_[i]) l.state_label_providers |= 1u << i;
        }
        return l;
      }();
      return kNumProviders <= internal::kAgentMaxProviders ? &layout : nullptr;
    } else {
      return nullptr;
    }
  }

  // Registry lock held; no handler can run for the slot (not armed yet, or
  // disarmed and waited for). Its ring becomes one in the agent's region
  // when there is an agent (its own ring is empty: drained or unused).
  void UseSharedRingLocked(internal::SlotBase* base) override {
    if constexpr (kIsSpscRecordRing<R>) {
      Slot* slot = static_cast<Slot*>(base);
      if (slot->active_ring != &slot->ring) return;
      void* memory = core_.AcquireAgentThreadRing(slot->tid, slot->name);
      if (memory == nullptr) return;
      slot->active_ring = new (memory) R;  // default-init: its words untouched
      slot->seen_dropped = 0;
    }
  }
  // Registry lock held; the shared ring is drained and no handler can run
  // for the slot. Back to its own ring.
  void UseOwnRingLocked(internal::SlotBase* base) override {
    Slot* slot = static_cast<Slot*>(base);
    if (slot->active_ring == &slot->ring) return;
    core_.ReleaseAgentThreadRing(slot->active_ring);
    slot->active_ring = &slot->ring;
    slot->seen_dropped = slot->ring.dropped();
  }

  // Each provider's per-thread state back to its initial value.
  static void ResetProviderData(Slot* slot) {
    using Data = std::tuple<typename Ps::ThreadData...>;
    slot->data.~Data();
    new (&slot->data) Data();
  }

  // Before a registration.
  void ClearProviderHistory(internal::SlotBase* base) override {
    Slot* slot = static_cast<Slot*>(base);
    for (auto& v : slot->provider_last_stack) v.clear();
    for (auto& v : slot->provider_last_labels) v.clear();
    slot->running_samples_at_visit.fill(
        slot->running_samples.load(std::memory_order_relaxed));
  }

  // Slots are pooled for the life of the process and never freed, so a
  // late signal on a stale TLS pointer always reads valid memory.
  struct SlotPool {
    std::mutex mutex;
    std::vector<Slot*> free;
  };
  static SlotPool& Pool() {
    static SlotPool* pool = [] {  // intentionally never destroyed
      auto* p = new SlotPool;
      internal::RegisterForkLock(&p->mutex, internal::kForkRankSlotPool);
      return p;
    }();
    return *pool;
  }
  internal::SlotBase* AcquireSlot() override {
    SlotPool& pool = Pool();
    {
      std::lock_guard<std::mutex> lock(pool.mutex);
      if (!pool.free.empty()) {
        Slot* slot = pool.free.back();
        pool.free.pop_back();
        return slot;
      }
    }
    Slot* slot = new Slot;
    slot->sample = &SampleThread;
    slot->sample_stackless = &SampleStackless;
    slot->sample_stack_bytes = static_cast<uint32_t>(kHandlerStackBytes);
    slot->before_retire = &TakeOwedSamples;
    return slot;
  }
  void ReleaseSlot(internal::SlotBase* base) override {
    Slot* slot = static_cast<Slot*>(base);
    // Reset per-registration state; the ring is empty after the drain.
    ResetProviderData(slot);
    slot->seen_taken = slot->samples_taken.load();
    slot->seen_dropped = slot->ring.dropped();
    slot->seen_truncated = slot->samples_truncated.load();
    slot->seen_small_stack = slot->samples_small_stack.load();
    SlotPool& pool = Pool();
    std::lock_guard<std::mutex> lock(pool.mutex);
    pool.free.push_back(slot);
  }

  // A record popped from a ring and its leaf-repaired copy (registry lock).
  std::unique_ptr<uint64_t[]> drain_scratch_ =
      std::make_unique_for_overwrite<uint64_t[]>(2 * kMaxRecordWords + 1);

  // Interned ids of the state label (wall samples).
  static constexpr std::array<bool, kNumProviders> state_label_provider_{
      LabelsThreadState<Ps>...};
  const uint64_t state_key_ =
      internal::LabelTable::Global().Intern(WallTimeProvider::kStateLabel);
  const uint64_t running_value_ =
      internal::LabelTable::Global().Intern(WallTimeProvider::kRunning);
  const uint64_t blocked_value_ =
      internal::LabelTable::Global().Intern(WallTimeProvider::kBlocked);
  std::tuple<internal::WallTicker<Ps>...> tickers_;  // registry lock
  // ReadBlockedStack's buffers (ticker, registry lock); off once
  // process_vm_readv failed other than for an unmapped stack.
  std::unique_ptr<uint64_t[]> stack_copy_;
  std::unique_ptr<uint64_t[]> read_record_;
  bool stack_reads_off_ = false;
  // Samples pushed by handlers of this profiler type (one profiler runs at a
  // time; a second of the same type only causes extra passes).
  static inline std::atomic<uint64_t> activity_{0};
};

}  // namespace inprof

#endif  // !_WIN32

#endif  // INPROF_PROFILER_H_
