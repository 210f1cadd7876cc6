// internal: not part of the public API (include inprof/profiler.h).
//
// The signal handler's half of Profiler<U, R, Ps...>: on the sampled
// thread, it asks the provider the signal is for for the sample's values,
// walks the interrupted stack with U and pushes one record (sample_record.h)
// into the thread's ring -- and one more for each other provider whose
// signal this one swallowed. A thread on a stack too small for the walk
// gets records without a stack (SampleStackless). The collector's half
// (profiler_collector.h) reads the records back.
//
// ProfilerBase installs SampleThread, SampleStackless and TakeOwedSamples
// in each slot (ThreadSlotHeader); the process-wide handler
// (signal_dispatch.h) calls them. Everything here is async-signal-safe:
// no allocation, no lock, nothing but the slot, the ring and the stack.
#ifndef INPROF_INTERNAL_SAMPLE_HANDLER_H_
#define INPROF_INTERNAL_SAMPLE_HANDLER_H_

#include <signal.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <tuple>
#include <utility>

#include "inprof/internal/profiler_layout.h"
#include "inprof/internal/sample_record.h"
#include "inprof/internal/signal_dispatch.h"
#include "inprof/internal/thread_info.h"
#include "inprof/sample_provider.h"
#include "inprof/unwinder.h"

namespace inprof::internal {

template <Unwinder U, SampleRing R, SampleProvider... Ps>
class SampleHandler {
  using L = ProfilerLayout<U, R, Ps...>;
  using Slot = typename L::Slot;

 public:
  // Samples pushed by handlers of this profiler type (one profiler runs at a
  // time; a second of the same type only causes extra passes): the
  // collector skips its pass over the slots while it is unchanged.
  static inline std::atomic<uint64_t> activity{0};

  // A sample of the thread the signal interrupted, its stack walked.
  static void SampleThread(ThreadSlotHeader* header,
                           siginfo_t* info, void* ucontext, int tag) noexcept {
    Slot* slot = static_cast<Slot*>(header);
    if (TakeDumpRequest(*slot)) {
      U dumper;
      slot->dump_depth = static_cast<uint32_t>(
          dumper.Unwind(ucontext, slot->stack,
                        std::span<uintptr_t>(reinterpret_cast<uintptr_t*>(slot->dump_frames),
                                             slot->dump_capacity))
              .depth);
      SyscallRegisters(ucontext, &slot->dump_pc, &slot->dump_nr);
      slot->dump_state.store(ThreadSlotHeader::kDumpDone, std::memory_order_release);
      if ((tag & 0xff) == kDumpSignalProvider) {
        slot->handler_exit_clock.store(ThreadCpuNanos(slot->cpu_clock),
                                       std::memory_order_relaxed);
      }
    }
    size_t provider;
    int64_t values[L::kMaxValuesPerProvider];
    if (!TakeValues(*slot, *info, tag, provider, values)) return;
    const size_t nvalues = L::kValueCounts[provider];
    uint64_t record[L::kMaxRecordWords];
    // The thread's labels: written only by this thread, so a plain copy
    // after a signal fence sees a consistent set.
    std::atomic_signal_fence(std::memory_order_acquire);
    uint32_t nlabels = slot->label_count;
    if (nlabels > ThreadSlotHeader::kMaxLabels) nlabels = 0;
    RecordLayout at{.values = nvalues, .leaf_words = L::kLeafWords, .labels = nlabels};
    for (size_t i = 0; i < 2 * nlabels; ++i) {
      record[at.labels_at() + i] = slot->label_words[i];
    }
    const size_t header_words = at.frames_at();
    const size_t frame_room = L::kMaxRecordWords - header_words;
    const size_t max_frames =
        static_cast<size_t>(slot->max_frames) < frame_room
            ? static_cast<size_t>(slot->max_frames)
            : frame_room;
    const bool sampled_blocked = SampledBlockedAt(
        provider, *slot, std::make_index_sequence<L::kNumProviders>{});
    // Read before the walk, so that tables published during it count as
    // newer (the safe side: the episode is then sampled again).
    RecordMeta meta;
    if (sampled_blocked) {
      meta.tables_ready = L::UnwindTablesReady();
      meta.generation = static_cast<uint32_t>(L::UnwindTablesGeneration() & L::kWalkGenerationMask);
    }
    U unwinder;
    if constexpr (L::kLeafWords > 0) {
      unwinder.CopyLeafStack(
          ucontext, slot->stack,
          std::span<uint64_t>(record + at.leaf_at(), L::kLeafWords));
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
    at.depth = unwound.depth;
    WriteRecordHeader(record, at, meta, values);
    slot->samples_taken.fetch_add(1, std::memory_order_relaxed);
    if (unwound.truncated) {
      slot->samples_truncated.fetch_add(1, std::memory_order_relaxed);
    }
    if (!slot->active_ring->TryPush(std::span<const uint64_t>(record, at.size()))) {
      // Keep the values so totals stay true; the ring counted the drop.
      const size_t offset = L::kValueOffsets[provider];
      for (size_t i = 0; i < nvalues; ++i) {
        slot->dropped_values[offset + i].fetch_add(values[i],
                                                   std::memory_order_relaxed);
      }
    } else if (L::kSamplesRunning[provider]) {
      // A stack of the thread running, now in its ring. Only this thread
      // writes the count. ITIMER_PROF's process-wide signal (SI_KERNEL)
      // counts too: the kernel gives it to the thread whose tick expired
      // the timer unless that one blocks SIGPROF, so it may land on a
      // thread that was not running; a visit uses the count only for a
      // thread whose clock says it ran throughout since the last look, or
      // that runs then (wall_time_provider_linux.cc). Not counted, no
      // thread of the itimer engine was ever followed: a busy thread among
      // 1,000 got its wall time only from visits of the round, weighing a
      // round each (0 and 1.19x its 3 s in two runs; bench/sampling/
      // many_threads).
      slot->running_samples.store(
          slot->running_samples.load(std::memory_order_relaxed) + 1,
          std::memory_order_release);
    }
    // A signal another provider sent that this one swallowed: the same
    // stack, recorded again for it.
    TakeSwallowedEach(provider, *slot, record, nvalues, nlabels, unwound,
                      std::make_index_sequence<L::kNumProviders>{});
    HandlerDone(*slot);
  }

  // The signal handler's part for a thread whose stack cannot take
  // SampleThread (ThreadSlotHeader::sample_stackless): the provider's
  // values, and those of signals it swallowed, as records without a stack.
  // Its frame is a few words. Async-signal-safe.
  static void SampleStackless(ThreadSlotHeader* header,
                              siginfo_t* info, void* ucontext, int tag) noexcept {
    Slot* slot = static_cast<Slot*>(header);
    if (TakeDumpRequest(*slot)) {
      slot->dump_depth = 0;
      SyscallRegisters(ucontext, &slot->dump_pc, &slot->dump_nr);
      slot->dump_state.store(ThreadSlotHeader::kDumpNoStack, std::memory_order_release);
    }
    size_t provider;
    int64_t values[L::kMaxValuesPerProvider];
    if (!TakeValues(*slot, *info, tag, provider, values)) return;
    const bool blocked = SampledBlockedAt(
        provider, *slot, std::make_index_sequence<L::kNumProviders>{});
    PushStackless(*slot, provider, values, blocked);
    TakeSwallowedStacklessEach(provider, *slot,
                               std::make_index_sequence<L::kNumProviders>{});
    HandlerDone(*slot);
  }
  // On the owning thread as it unregisters (ThreadSlotHeader::
  // before_retire): each provider that OwesSamples and owes one now gets
  // its signal, handled before the call returns (a signal a thread sends
  // itself is delivered as the system call returns).
  static void TakeOwedSamples(ThreadSlotHeader* header) noexcept {
    Slot* slot = static_cast<Slot*>(header);
    const uint64_t session = slot->session.load(std::memory_order_acquire);
    if (session == 0 || session != ActiveSession()) return;
    TakeOwedEach(*slot, session, std::make_index_sequence<L::kNumProviders>{});
  }
  // EventContext::unwind: the calling thread's stack, walked by U from a
  // context of this frame, when the thread is on its own stack with room
  // for the walk (as the signal handler requires): a registered thread's
  // bounds are its slot's, any other thread's those cached for it
  // (internal::KnownCurrentThreadStack).
  __attribute__((noinline)) static size_t UnwindHere(std::span<uintptr_t> out) noexcept {
    internal::ThreadSlotHeader* slot = internal::CurrentThreadSlot();
    const uint64_t active = internal::ActiveSession();
    StackBounds stack;
    size_t room = L::kHandlerStackBytes;
    if (slot != nullptr && active != 0 &&
        slot->session.load(std::memory_order_relaxed) == active) {
      stack = slot->stack;
      room = slot->sample_stack_bytes;
    } else if (!internal::KnownCurrentThreadStack(&stack)) {
      // A thread that never registered: its bounds, once the provider
      // found them where that is safe (thread_info.h).
      return 0;
    }
    // Not on its own stack (a coroutine's, a signal's alternate stack) or
    // without room for the walk: not walked (counted by the caller).
    const auto sp = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
    if (!(sp >= stack.lo && sp < stack.hi && sp - stack.lo >= room)) return 0;
    ucontext_t context;
    if (getcontext(&context) != 0) return 0;
    U unwinder;
    return unwinder.Unwind(&context, stack, out).depth;
  }

 private:
  // What both handler parts begin with: the provider the signal is for
  // (`tag`) and the values it measured; false when there is no sample.
  static bool TakeValues(Slot& slot, const siginfo_t& info, int tag,
                         size_t& provider, int64_t* values) noexcept {
    provider = static_cast<size_t>(tag & 0xff);
    return provider < L::kNumProviders &&
           OnSignalAt(provider, slot, info,
                      std::make_index_sequence<L::kNumProviders>{}, values);
  }
  // A thread dump's request in the slot, taken (ThreadSlotHeader::
  // dump_state): any of inprof's signals answers it, the dump's own or one
  // pending before it (a second SIGPROF is not queued beside the first).
  static bool TakeDumpRequest(Slot& slot) noexcept {
    uint32_t asked = ThreadSlotHeader::kDumpAsked;
    return slot.dump_state.load(std::memory_order_relaxed) == asked &&
           slot.dump_state.compare_exchange_strong(asked, ThreadSlotHeader::kDumpWriting,
                                                   std::memory_order_acquire);
  }
  // ... and end with, after the records' push.
  static void HandlerDone(Slot& slot) noexcept {
    // After the push: a collector that sees this count (and the slot's
    // bit) sees the record.
    MarkPending(slot);
    activity.fetch_add(1, std::memory_order_release);
    slot.handler_exit_clock.store(ThreadCpuNanos(slot.cpu_clock),
                                  std::memory_order_relaxed);
  }

  static void PushStackless(Slot& slot, size_t provider, const int64_t* values,
                            bool blocked) noexcept {
    const size_t nvalues = L::kValueCounts[provider];
    uint64_t record[RecordLayout{.values = L::kMaxValuesPerProvider}.size()];
    RecordMeta meta;
    meta.provider = static_cast<uint8_t>(provider);
    meta.stackless = true;
    meta.blocked = blocked;
    const RecordLayout at{.values = nvalues};
    WriteRecordHeader(record, at, meta, values);
    slot.samples_taken.fetch_add(1, std::memory_order_relaxed);
    if (!slot.active_ring->TryPush(std::span<const uint64_t>(record, at.size()))) {
      for (size_t i = 0; i < nvalues; ++i) {
        slot.dropped_values[L::kValueOffsets[provider] + i].fetch_add(
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
            int64_t values[L::kMaxValuesPerProvider];
            if (P::TakeSwallowed(slot, std::get<I>(slot.data),
                                 std::span<int64_t>(values, L::kValueCounts[I]))) {
              PushStackless(slot, I, values, /*blocked=*/false);
            }
          }
        }(),
        ...);
  }

  template <size_t... I>
  static void TakeOwedEach(Slot& slot, uint64_t session,
                           std::index_sequence<I...>) noexcept {
    (
        [&] {
          using P = std::tuple_element_t<I, std::tuple<Ps...>>;
          if constexpr (OwesSamples<P>) {
            if (P::OwesSample(slot, std::get<I>(slot.data))) {
              SignalThisThread(MakeSignalTag(I, session));
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
            int64_t values[L::kMaxValuesPerProvider];
            if (!P::TakeSwallowed(slot, std::get<I>(slot.data),
                                  std::span<int64_t>(values, L::kValueCounts[I]))) {
              return;
            }
            const RecordLayout was{.values = nvalues, .leaf_words = L::kLeafWords,
                                   .labels = nlabels};
            RecordLayout now{.values = L::kValueCounts[I], .leaf_words = L::kLeafWords,
                             .labels = nlabels};
            const size_t new_header = now.frames_at();
            size_t depth = unwound.depth;
            bool truncated = unwound.truncated;
            if (new_header + depth > L::kMaxRecordWords) {
              depth = L::kMaxRecordWords - new_header;
              truncated = true;
            }
            now.depth = depth;
            // Leaf words, labels and frames, moved as one block.
            const size_t from = was.leaf_at(), to = now.leaf_at();
            const size_t words = now.size() - to;
            if (to < from) {
              for (size_t w = 0; w < words; ++w) record[to + w] = record[from + w];
            } else if (to > from) {
              for (size_t w = words; w-- > 0;) record[to + w] = record[from + w];
            }
            RecordMeta meta;
            meta.provider = static_cast<uint8_t>(I);
            meta.truncated = truncated;
            WriteRecordHeader(record, now, meta, values);
            slot.samples_taken.fetch_add(1, std::memory_order_relaxed);
            if (truncated) slot.samples_truncated.fetch_add(1, std::memory_order_relaxed);
            if (!slot.active_ring->TryPush(std::span<const uint64_t>(record, now.size()))) {
              for (size_t i = 0; i < L::kValueCounts[I]; ++i) {
                slot.dropped_values[L::kValueOffsets[I] + i].fetch_add(
                    values[i], std::memory_order_relaxed);
              }
            }
            nvalues = L::kValueCounts[I];
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
    // A fold over one provider is a lone `||` operand; its value is unused.
    static_cast<void>(
        ((provider == I
              ? (sampled = std::tuple_element_t<I, std::tuple<Ps...>>::OnSignal(
                     slot, std::get<I>(slot.data), info,
                     std::span<int64_t>(values, L::kValueCounts[I])),
                 true)
              : false) ||
         ...));
    return sampled;
  }
};

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_SAMPLE_HANDLER_H_
