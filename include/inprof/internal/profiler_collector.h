// internal: not part of the public API (include inprof/profiler.h).
//
// The collector's half of Profiler<U, R, Ps...>: what reads the records the
// signal handler (sample_handler.h) pushed, with the registry and aggregate
// locks held. It drains a slot's ring into the aggregate (DrainSlotIntoLocked,
// the hook ProfilerBase's pass calls), decodes each record (AddRecordLocked:
// the leaf repaired, the labels made canonical, the slot's newest running
// and blocked stacks kept for the ticker), and gives the wall ticker's
// visits what they need of it: a waiting thread's stack read and walked
// without a signal (ReadBlockedStack), and an interval credited to the
// thread's newest running stack (CreditRunning).
//
// Between ProfilerBase (compiled once) and Profiler (profiler.h), which
// derives from it.
#ifndef INPROF_INTERNAL_PROFILER_COLLECTOR_H_
#define INPROF_INTERNAL_PROFILER_COLLECTOR_H_

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "inprof/internal/label_table.h"
#include "inprof/base/log.h"
#include "inprof/internal/profiler_base.h"
#include "inprof/internal/profiler_layout.h"
#include "inprof/internal/provider_set.h"
#include "inprof/internal/sample_record.h"
#include "inprof/base/sanitizers.h"
#include "inprof/internal/thread_info.h"
#include "inprof/sample_aggregator.h"
#include "inprof/sample_provider.h"
#include "inprof/unwinder.h"
#include "inprof/wall_time_provider.h"

namespace inprof::internal {

template <Unwinder U, SampleRing R, SampleProvider... Ps>
class ProfilerCollector : public ProfilerBase {
 protected:
  using ProfilerBase::ProfilerBase;

  using L = ProfilerLayout<U, R, Ps...>;
  using Slot = typename L::Slot;
  using RecordMeta = internal::RecordMeta;
  static constexpr const char* kSmallStackFrame = internal::kSmallStackFrame;

  // Registry and aggregate locks held. Cheap for an idle thread (an empty
  // ring and unchanged counters): no atomic read-modify-write, no lookup.
  // Returns false when it stopped at its budget with records left.
  bool DrainSlotIntoLocked(SlotBase* base, SampleAggregator& agg) override {
    Slot* slot = static_cast<Slot*>(base);
    EnsureAggregateThread(slot, agg);
    // Not on the stack: a thread that unregisters drains its own ring, and
    // its 9 KiB frame (probed page by page) faulted in up to three fresh
    // stack pages, ~28 us a thread on a 2-core VM (bench/overhead
    // idle-1000). The registry lock serializes every drain.
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
    DrainThreadEventsEach(slot, agg, std::make_index_sequence<L::kNumProviders>{});
    return drained_all;
  }

  // Registry and aggregate locks held: the events providers left in the
  // slot (sample_provider.h: DrainsThreadEvents), as the thread's samples.
  template <size_t... I>
  void DrainThreadEventsEach(Slot* slot, SampleAggregator& agg, std::index_sequence<I...>) {
    (
        [&] {
          using P = std::tuple_element_t<I, std::tuple<Ps...>>;
          if constexpr (DrainsThreadEvents<P>) {
            P::DrainThreadEvents(
                std::get<I>(slot->data),
                [&](std::span<const uint64_t> frames, std::span<const uint64_t> labels,
                    std::span<const int64_t> values) {
                  agg.Add(slot->aggregate_thread, frames, labels, L::kValueOffsets[I], values);
                });
          }
        }(),
        ...);
  }

  // Registry and aggregate locks held. One record as the handler writes it
  // (from a ring, or built by the ticker: ReadBlockedStack) into the
  // aggregate and the slot's newest stacks; false for a malformed one.
  // `repaired` has room for L::kMaxRecordWords + 1 words.
  bool AddRecordLocked(Slot* slot, SampleAggregator& agg, uint64_t* record,
                       size_t n, uint64_t* repaired) {
    EnsureAggregateThread(slot, agg);
    const RecordView view = RecordView::Read(record, n, L::kValueCounts, L::kLeafWords);
    if (!view.ok()) return false;
    const RecordMeta meta = view.meta;
    const size_t provider = meta.provider;
    const bool blocked = meta.blocked;
    const size_t nvalues = view.layout.values;
    int64_t values[L::kMaxValuesPerProvider];
    for (size_t i = 0; i < nvalues; ++i) {
      values[i] = static_cast<int64_t>(view.values()[i]);
    }
    if (meta.stackless) {
      // Taken on a stack too small for the walk (SampleStackless). A
      // blocked one begins an episode whose rest goes to the same frame.
      agg.AddSynthetic(slot->aggregate_thread, kSmallStackFrame,
                       L::kValueOffsets[provider],
                       std::span<const int64_t>(values, nvalues));
      if (blocked) {
        slot->blocked_stack.clear();
        slot->blocked_labels.clear();
        slot->blocked_provisional = false;
        slot->blocked_stackless = true;
      }
      return true;
    }
    std::span<const uint64_t> frames = view.frames();
    if (!view.leaf().empty() && !frames.empty()) {
      frames = RepairLeaf(frames, view.leaf(), repaired);
    }
    uint64_t labels[L::kMaxLabelWords + 2];
    const size_t label_words = CanonicalLabels(view.labels(), provider, labels, blocked);
    agg.Add(slot->aggregate_thread, frames,
            std::span<const uint64_t>(labels, label_words),
            L::kValueOffsets[provider],
            std::span<const int64_t>(values, nvalues));
    slot->last_stack.assign(frames.begin(), frames.end());
    slot->provider_last_stack[provider].assign(frames.begin(), frames.end());
    slot->provider_last_labels[provider].assign(labels, labels + label_words);
    if (L::kSamplesRunning[provider] && !blocked) {
      slot->running_stack.assign(frames.begin(), frames.end());
      slot->running_labels.assign(labels, labels + label_words);
      NoteRanLocked(slot);  // a wall visit soon, if none came for a round
      if constexpr (kHasFollower) {
        FollowRunningSample(slot, agg, frames, view.labels(),
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
      if (meta.provisional) wall_episodes_provisional_.fetch_add(1, std::memory_order_relaxed);
      slot->blocked_tables_ready = meta.tables_ready;
      slot->blocked_tables_generation = meta.generation;
    }
    // The stack's own labels, without the provider's state label.
    slot->last_labels.assign(view.labels().begin(), view.labels().end());
    return true;
  }

  // Ticking providers that follow running threads (wall_time_provider.h):
  // a running sample drained for a followed thread carries its wall time.
  template <typename P>
  static constexpr bool kFollows = FollowsRunningThreads<P>;
  static constexpr bool kHasFollower = (kFollows<Ps> || ...);
  static constexpr std::array<size_t, L::kNumProviders> kPeriodIndexes{
      Ps::kPeriodTypeIndex...};

  // Registry and aggregate locks held.
  void FollowRunningSample(Slot* slot, SampleAggregator& agg,
                           std::span<const uint64_t> frames,
                           std::span<const uint64_t> label_words, int64_t cpu_ns) {
    FollowEach(slot, agg, frames, label_words, cpu_ns,
               std::make_index_sequence<L::kNumProviders>{});
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
            int64_t values[L::kMaxValuesPerProvider] = {};
            std::span<int64_t> v(values, L::kValueCounts[I]);
            if (!P::FollowRunningSample(std::get<I>(slot->data), cpu_ns, v)) return;
            uint64_t labels[L::kMaxLabelWords + 2];
            const size_t n = CanonicalLabels(label_words, I, labels);
            agg.Add(slot->aggregate_thread, frames,
                    std::span<const uint64_t>(labels, n), L::kValueOffsets[I],
                    std::span<const int64_t>(values, L::kValueCounts[I]));
            wall_running_credits_.fetch_add(1, std::memory_order_relaxed);
          }
        }(),
        ...);
  }

  // Canonical label words for the aggregate (ProfilerCommon), with the
  // provider's state label ("thread state"="running" for a signalled wall
  // sample). Returns the number of words written to `out` (room for
  // L::kMaxLabelWords + 2).
  size_t CanonicalLabels(std::span<const uint64_t> words, size_t provider,
                         uint64_t* out, bool blocked = false) const {
    return ProfilerBase::CanonicalLabels(
        words, provider < L::kNumProviders && L::kStateLabelProvider[provider], blocked, out);
  }

  // Whether a ticking provider's blocked threads can have their stacks read
  // without a signal: the provider says where the thread waits
  // (EpisodeSite, LookClock, TakeStackRead) and the unwinder walks copies
  // of stacks. Not under ThreadSanitizer: what the ticker reads of a
  // waiting thread (its slot, its stack) is kept only when the thread's CPU
  // clock shows it did not run meanwhile, a synchronisation TSan cannot
  // see.
#if defined(INPROF_TSAN)
  static constexpr bool kUnderTsan = true;
#else
  static constexpr bool kUnderTsan = false;
#endif
  template <typename P>
  static constexpr bool kReadsBlockedStacks =
      !kUnderTsan && L::kLeafWords == 0 && ReadsBlockedStacks<P> && WalksStackCopies<U>;
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
  bool ReadBlockedStack(Slot* slot, typename L::template Provider<I>& provider) {
    using P = typename L::template Provider<I>;
    if constexpr (!kReadsBlockedStacks<P>) {
      return false;
    } else {
      if (stack_reads_off_) return false;
      auto& data = std::get<I>(slot->data);
      const SyscallSite site = P::EpisodeSite(data);
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
        read_record_ = std::make_unique_for_overwrite<uint64_t[]>(2 * L::kMaxRecordWords + 1);
      }
      const int error =
          CopyOwnMemory(start_pid_, site.sp, bytes, stack_copy_.get());
      if (error != 0) {
        if (error != EFAULT) {
          // A sandbox without process_vm_readv: signals from now on.
          stack_reads_off_ = true;
          Log(absl::StrCat(
              "wall sampler: cannot read a waiting thread's stack "
              "(process_vm_readv: ", strerror(error),
              "); blocked threads are signalled for their stacks instead"));
        }
        return false;
      }
      uint64_t* record = read_record_.get();
      constexpr size_t nvalues = L::kValueCounts[I];
      // Its labels as the handler would copy them (the thread waits: they
      // do not change while its clock does not).
      uint32_t nlabels = __atomic_load_n(&slot->label_count, __ATOMIC_RELAXED);
      if (nlabels > ThreadSlotHeader::kMaxLabels) nlabels = 0;
      RecordLayout at{.values = nvalues, .labels = nlabels};  // no leaf words
      for (size_t i = 0; i < 2 * nlabels; ++i) {
        record[at.labels_at() + i] = __atomic_load_n(&slot->label_words[i], __ATOMIC_RELAXED);
      }
      const size_t header_words = at.frames_at();
      const size_t max_frames = std::min<size_t>(
          static_cast<size_t>(slot->max_frames), L::kMaxRecordWords - header_words);
      const bool tables_ready = L::UnwindTablesReady();
      const uint64_t generation = L::UnwindTablesGeneration() & L::kWalkGenerationMask;
      const UnwindResult unwound = U().UnwindCopy(
          site.pc, site.sp, std::span<const uint64_t>(stack_copy_.get(), bytes / 8),
          std::span<uintptr_t>(reinterpret_cast<uintptr_t*>(record + header_words),
                               max_frames));
      if (unwound.truncated) {
        // A frame whose rbp the copy does not settle: the same stack at the
        // same place will not walk either, and a failed read is work the
        // ticker does on top of the signal. Signalled there from now on --
        // unless the walk lacked the tables (frame pointers only, from an
        // unknown rbp: it stops at once), which the next read may have.
        if (!unwound.provisional) slot->unreadable_site = site;
        return false;
      }
      if (ThreadCpuNanos(slot->cpu_clock) != clock) {
        return false;  // the thread ran: the copy may be torn
      }
      int64_t values[L::kMaxValuesPerProvider] = {};
      if (!provider.TakeStackRead(
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
      at.depth = unwound.depth;
      record[RecordLayout::kMetaAt] = meta.Encode();
      for (size_t i = 0; i < nvalues; ++i) {
        record[at.value(i)] = static_cast<uint64_t>(values[i]);
      }
      slot->samples_taken.fetch_add(1, std::memory_order_relaxed);
      Pipeline::Ingesting ingest = pipeline_.Ingest();
      if (AddRecordLocked(slot, ingest.aggregator(), record, at.size(),
                          record + L::kMaxRecordWords)) {
        recorded_.fetch_add(1, std::memory_order_relaxed);
      }
      return true;
    }
  }

  // Registry lock held. The thread ran throughout the interval and a
  // running sample was taken of it meanwhile: add the values to that
  // sample's stack, labelled running (drains the ring, where it may be).
  template <size_t I>
  void CreditRunning(Slot* slot, std::span<const int64_t> values) {
    Pipeline::Ingesting ingest = pipeline_.Ingest();
    SampleAggregator& agg = ingest.aggregator();
    RefreshLeafResolverLocked();
    DrainSlotIntoLocked(slot, agg);
    uint64_t labels[L::kMaxLabelWords + 2];
    const size_t label_words = CanonicalLabels(slot->running_labels, I, labels);
    if (slot->running_stack.empty()) {
      // Cannot happen (the count follows the push); credited to the
      // thread's tail frame rather than lost.
      const char* frame = kTailFrame;
      if constexpr (NamesTailFrame<std::tuple_element_t<I, std::tuple<Ps...>>>) {
        frame = std::tuple_element_t<I, std::tuple<Ps...>>::kTailFrame;
      }
      agg.AddSynthetic(slot->aggregate_thread, frame, L::kValueOffsets[I], values);
      return;
    }
    agg.Add(slot->aggregate_thread, slot->running_stack,
            std::span<const uint64_t>(labels, label_words), L::kValueOffsets[I],
            values);
    wall_running_credits_.fetch_add(1, std::memory_order_relaxed);
  }

 private:
  // A record popped from a ring and its leaf-repaired copy (registry lock).
  std::unique_ptr<uint64_t[]> drain_scratch_ =
      std::make_unique_for_overwrite<uint64_t[]>(2 * L::kMaxRecordWords + 1);
  // ReadBlockedStack's buffers (ticker, registry lock); off once
  // process_vm_readv failed other than for an unmapped stack.
  std::unique_ptr<uint64_t[]> stack_copy_;
  std::unique_ptr<uint64_t[]> read_record_;
  bool stack_reads_off_ = false;
};

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_PROFILER_COLLECTOR_H_
