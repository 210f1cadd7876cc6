// internal: not part of the public API (include inprof/profiler.h).
//
// The wall ticker's half of Profiler<U, R, Ps...>: each ticking provider's
// visits (internal::WallTicker<P>, wall_ticker.h) with this profiler as
// their host (TickerHost<I>: a thread's data, its ring drained, its
// blocked stack read, a signal, the credits), and the blocked stack read
// without a signal (ReadBlockedStack: the thread's stack copied from where
// it waits and walked by U). What stays a template per provider because
// the visits inline the provider's own calls; everything else they ask of
// the profiler is ProfilerBase's, compiled once.
//
// Between ProfilerCollector (profiler_collector.h) and Profiler
// (profiler.h), which derives from it. Registry lock held throughout.
#ifndef INPROF_INTERNAL_PROFILER_VISITS_H_
#define INPROF_INTERNAL_PROFILER_VISITS_H_

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "inprof/base/log.h"
#include "inprof/internal/profiler_collector.h"
#include "inprof/internal/profiler_layout.h"
#include "inprof/internal/provider_table.h"
#include "inprof/internal/sample_record.h"
#include "inprof/internal/thread_info.h"
#include "inprof/internal/wall_ticker.h"
#include "inprof/sample_provider.h"
#include "inprof/unwinder.h"
#include "inprof/wall_time_provider.h"

namespace inprof::internal {

template <Unwinder U, SampleRing R, SampleProvider... Ps>
class ProfilerVisits : public ProfilerCollector<U, R, Ps...> {
 protected:
  using ProfilerCollector<U, R, Ps...>::ProfilerCollector;
  using Layout = ProfilerLayout<U, R, Ps...>;
  using Slot = typename Layout::Slot;
  using Base = ProfilerBase;
  using Base::active_, Base::pacing_, Base::wall_due_, Base::kMaxTickBatch, Base::session_,
      Base::wall_visits_deferred_, Base::wall_unattributed_ns_, Base::wall_signals_,
      Base::wall_stacks_read_, Base::wall_episodes_resampled_, Base::wall_weight_sq_ms2_,
      Base::start_pid_,
      Base::pipeline_, Base::recorded_;

  // One wake-up of the ticker (internal::ProfilerBase::Tick): each ticking
  // provider visits its next threads (the one fan-out left a template: the
  // visits are WallTicker<P>'s, inlined with the provider's own).
  void TickProvidersLocked(TickTime when, size_t batch, size_t& next) override {
    internal::ForEachProvider<Layout::kNumProviders>(
        [&](auto i) { TickOne<decltype(i)::value>(when, batch, next); });
  }
  // Registry lock held: provider I's visits (internal::WallTicker), this
  // profiler their host.
  template <size_t I>
  void TickOne(TickTime when, size_t batch, size_t& next) {
    using P = std::tuple_element_t<I, std::tuple<Ps...>>;
    if constexpr (TicksThreads<P>) {
      TickerHost<I> host{this};
      auto& provider = *static_cast<P*>(this->ProviderObject(I));
      const internal::WallVisitCounts counts = std::get<I>(tickers_).VisitNext(
          provider, host, std::span<internal::SlotBase* const>(active_),
          when, batch, kMaxTickBatch, next, pacing_.steady_visits, pacing_.visit_cap(),
          std::span<const internal::WallDue>(wall_due_));
      pacing_.AddVisits(counts.visits);
      pacing_.BeginOwnAccounts(counts.own_accounts_begun);
      pacing_.NoteRound(std::get<I>(tickers_).round_estimate_ns());
      wall_visits_deferred_.fetch_add(counts.deferred, std::memory_order_relaxed);
      wall_unattributed_ns_.fetch_add(counts.unattributed_ns, std::memory_order_relaxed);
      wall_signals_.fetch_add(counts.signals, std::memory_order_relaxed);
      wall_stacks_read_.fetch_add(counts.stacks_read, std::memory_order_relaxed);
      wall_episodes_resampled_.fetch_add(counts.episodes_resampled,
                                         std::memory_order_relaxed);
      double weight_sq_ms2 = counts.weight_sq_ms2;
      if constexpr (requires { provider.TakeEndedShareSq(); }) {
        weight_sq_ms2 += provider.TakeEndedShareSq();
      }
      wall_weight_sq_ms2_.fetch_add(static_cast<uint64_t>(std::llround(weight_sq_ms2)),
                                    std::memory_order_relaxed);
    }
  }

  // What provider I's visits ask of the profiler (internal::WallTickerHost).
  template <size_t I>
  struct TickerHost {
    using P = typename Layout::template Provider<I>;
    static constexpr bool kCountsRunningSamples = Layout::kHasRunningSampler;
    ProfilerVisits* self;

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
      return self->template ReadBlockedStack<I>(
          &Of(slot), *static_cast<P*>(self->ProviderObject(I)));
    }
    void Signal(internal::SlotBase& slot) {
      self->SendProfilingSignal(slot, internal::MakeSignalTag(I, self->session_));
    }
    void CreditBlocked(internal::SlotBase& slot, std::span<const int64_t> values) {
      self->CreditBlockedLocked(&slot, Layout::kValueOffsets[I], values);
    }
    void CreditRunning(internal::SlotBase& slot, std::span<const int64_t> values) {
      self->CreditRunningLocked(&slot, I, values);
    }
    void CreditSynthetic(internal::SlotBase& slot, std::span<const int64_t> values,
                         const char* frame) {
      self->CreditSyntheticLocked(&slot, Layout::kValueOffsets[I], values, frame);
    }
    bool TablesReady() { return Layout::UnwindTablesReady(); }
    uint64_t TablesGeneration() { return Layout::UnwindTablesGeneration(); }
  };

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
      !kUnderTsan && Layout::kLeafWords == 0 && ReadsBlockedStacks<P> && WalksStackCopies<U>;
  // A thread dump's walk of a waiting thread's stack copy (ProfilerBase::
  // Shape::unwind_copy), where the unwinder walks copies. Under TSan too:
  // the dump reads no slot field the thread writes but its labels
  // (atomics), and TSan defers a signal to a thread blocked in read()
  // until the call returns.
  static constexpr bool kDumpReadsCopies = Layout::kLeafWords == 0 && WalksStackCopies<U>;
  static UnwindResult UnwindCopyOf(uintptr_t pc, uintptr_t sp, std::span<const uint64_t> copy,
                                   std::span<uintptr_t> out) noexcept {
    if constexpr (WalksStackCopies<U>) {
      return U().UnwindCopy(pc, sp, copy, out);
    } else {
      return {};
    }
  }
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
  bool ReadBlockedStack(Slot* slot, typename Layout::template Provider<I>& provider) {
    using P = typename Layout::template Provider<I>;
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
        read_record_ = std::make_unique_for_overwrite<uint64_t[]>(2 * Layout::kMaxRecordWords + 1);
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
      constexpr size_t nvalues = Layout::kValueCounts[I];
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
          static_cast<size_t>(slot->max_frames), Layout::kMaxRecordWords - header_words);
      const bool tables_ready = Layout::UnwindTablesReady();
      const uint64_t generation = Layout::UnwindTablesGeneration() & Layout::kWalkGenerationMask;
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
        // Before the first build of the tables is complete (a program's
        // first tens of milliseconds, `inprof run`'s threads started at
        // once), the walk from a copy stops at its first frame: that
        // provisional stack is kept -- counted truncated, and the episode
        // read again once the tables are ready (WallTicker) -- rather than
        // a signal, whose EINTR cut 500 ms sleeps of a test's 32 threads
        // to 5 ms in 27 of 40 runs (their wall time 0.2-15 s of 16.5).
        if (!unwound.provisional || tables_ready) return false;
      }
      if (ThreadCpuNanos(slot->cpu_clock) != clock) {
        return false;  // the thread ran: the copy may be torn
      }
      int64_t values[Layout::kMaxValuesPerProvider] = {};
      if (!provider.TakeStackRead(
              data, std::span<int64_t>(values, nvalues))) {
        return false;
      }
      RecordMeta meta;
      meta.provider = static_cast<uint8_t>(I);
      meta.blocked = true;
      meta.provisional = unwound.provisional;
      meta.truncated = unwound.truncated;
      meta.tables_ready = unwound.provisional && tables_ready;
      meta.generation = unwound.provisional ? static_cast<uint32_t>(generation) : 0;
      at.depth = unwound.depth;
      WriteRecordHeader(record, at, meta, values);
      slot->samples_taken.fetch_add(1, std::memory_order_relaxed);
      if (unwound.truncated) slot->samples_truncated.fetch_add(1, std::memory_order_relaxed);
      Pipeline::Ingesting ingest = pipeline_.Ingest();
      if (this->AddRecordLocked(slot, ingest.aggregator(), record, at.size(),
                          record + Layout::kMaxRecordWords)) {
        recorded_.fetch_add(1, std::memory_order_relaxed);
      }
      return true;
    }
  }

 private:
  std::tuple<WallTicker<Ps>...> tickers_;
  // ReadBlockedStack's buffers; off once process_vm_readv failed other
  // than for an unmapped stack.
  std::unique_ptr<uint64_t[]> stack_copy_;
  std::unique_ptr<uint64_t[]> read_record_;
  bool stack_reads_off_ = false;
};

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_PROFILER_VISITS_H_
