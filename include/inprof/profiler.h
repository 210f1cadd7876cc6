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
// Its parts, from the ground up: internal::ProfilerBase (profiler_base.h,
// compiled once: the registry, Start/Stop, the collector's and the ticker's
// threads, the counters); internal::ProfilerLayout (the record's shape and
// the slot the components fix); internal::SampleHandler (the signal
// handler's half); internal::ProfilerCollector (the collector's half, over
// ProfilerBase); internal::WallTicker (the ticker's visits); and this
// class, which holds the providers and the slots and joins the rest.
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

#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "inprof/cpu_time_provider.h"
#include "inprof/frame_pointer_unwinder.h"
#include "inprof/internal/agent_stream.h"
#include "inprof/base/fork_guard.h"
#include "inprof/base/log.h"
#include "inprof/internal/profiler_base.h"
#include "inprof/internal/profiler_collector.h"
#include "inprof/internal/profiler_control.h"
#include "inprof/internal/composition.h"
#include "inprof/internal/pipeline.h"
#include "inprof/internal/profiler_layout.h"
#include "inprof/internal/provider_set.h"
#include "inprof/internal/sample_handler.h"
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

// A sampling profiler composed from components:
//   U   an Unwinder (unwinder.h), e.g. FramePointerUnwinder;
//   R   a SampleRing (spsc_ring.h), one per registered thread;
//   Ps  one or more SampleProviders (sample_provider.h).
template <Unwinder U, SampleRing R, SampleProvider... Ps>
  requires(sizeof...(Ps) >= 1 && sizeof...(Ps) < 256)
class Profiler final : private internal::ProviderHolder<Ps...>,
                       public internal::ProfilerCollector<U, R, Ps...> {
  using internal::ProviderHolder<Ps...>::providers_;
  // What the components fix (internal/profiler_layout.h), the handler's
  // half (internal/sample_handler.h) and the collector's
  // (internal/profiler_collector.h), which derives from internal::ProfilerBase.
  using Layout = internal::ProfilerLayout<U, R, Ps...>;
  using Handler = internal::SampleHandler<U, R, Ps...>;
  using Collector = internal::ProfilerCollector<U, R, Ps...>;
  using Base = internal::ProfilerBase;
  using Set = typename Layout::Set;
  using Slot = typename Layout::Slot;
  // The base's state and services this part uses.
  using typename Base::Shape;
  using Base::options_, Base::pipeline_, Base::composition_, Base::session_, Base::active_,
      Base::pacing_,
      Base::wall_visits_deferred_, Base::wall_unattributed_ns_, Base::wall_due_,
      Base::kMaxTickBatch, Base::wall_signals_,
      Base::wall_stacks_read_, Base::wall_episodes_resampled_, Base::wall_tail_frame_ns_,
      Base::Shutdown,
      Base::DrainRings, Base::DrainSlotLocked, Base::RefreshLeafResolverLocked,
      Base::SendProfilingSignal, Base::CreditBlockedLocked,
      Base::CreditSyntheticLocked, Base::EnsureAggregateThread;

 public:
  using unwinder_type = U;
  using ring_type = R;

  // The stack the signal handler may use below its first-level frame
  // (internal/profiler_layout.h).
  static constexpr size_t kHandlerStackBytes = Layout::kHandlerStackBytes;
  // Where a sample of a thread on a stack too small for the walk puts its
  // values (the profile's comments count them).
  static constexpr const char* kSmallStackFrame = internal::kSmallStackFrame;

  // Validates `options`; an invalid option is logged and the profiler stays
  // disabled (Start() returns the error).
  explicit Profiler(Options options = Options::FromEnv())
      : Collector(options, Shape{.profile = {.sample_types = SampleTypes(),
                                             .period_type = PeriodType(),
                                             .period = this->FirstPeriod(options),
                                             .engine = Engine()},
                                 .arms_outside_lock = kArmsOutsideLock,
                                 .defers_retire = kDefersRetire,
                                 .has_ticker = kHasTicker,
                                 .two_step_arming = kTwoStepArming,
                                 .leaf_words = Layout::kLeafWords > 0,
                                 .activity = &Handler::activity,
                                 .pending = &Pending(),
                                 .walks_without_tables = WalksWithoutTables()}) {
    if constexpr (kHasEvents) pipeline_.Attach(std::make_unique<EventAttachment>(*this));
  }

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

  // When every provider ArmsConcurrently (sample_provider.h), a thread
  // that registers or unregisters while the profiler runs arms or disarms
  // them outside the registry lock; Start() and Stop() do it under the lock.
  // All or none, so that providers are always armed in their order (a
  // second perf-engine provider on the same thread takes the slot's
  // overflow descriptor from the first: tests/profiler/sample_provider_test.cc).
  static constexpr bool kArmsOutsideLock = (ArmsConcurrently<Ps> && ...);

  // Threads registering in a burst leave their costliest arming to the
  // ticker thread (sample_provider.h: ArmsInTwoSteps).
  static constexpr bool kTwoStepArming =
      kArmsOutsideLock && (TicksThreads<Ps> || ...) && (ArmsInTwoSteps<Ps> || ...);

  // Registry lock held, on the registering thread: providers that arm in
  // two steps are prepared, the others armed. True when one waits for
  // ArmPreparedProviders.
  bool PrepareProviders(internal::SlotBase* slot, uint64_t session) override {
    if constexpr (kTwoStepArming) {
      return PrepareEach(static_cast<Slot*>(slot), session,
                         std::make_index_sequence<Layout::kNumProviders>{});
    } else {
      ArmProviders(slot, session);
      return false;
    }
  }
  template <size_t... I>
  bool PrepareEach(Slot* slot, uint64_t session, std::index_sequence<I...>) {
    bool waits = false;
    (
        [&] {
          using P = std::tuple_element_t<I, std::tuple<Ps...>>;
          if constexpr (ArmsInTwoSteps<P>) {
            if (std::get<I>(providers_).PrepareThread(*slot, std::get<I>(slot->data))) {
              waits = true;
              return;
            }
          }
          ArmOne<I>(slot, session);
        }(),
        ...);
    return waits;
  }
  // Registry lock held, on the ticker thread: the prepared providers armed
  // (ArmThread returns at once for one already armed).
  void ArmPreparedProviders(internal::SlotBase* slot, uint64_t session) override {
    ArmPreparedEach(static_cast<Slot*>(slot), session,
                    std::make_index_sequence<Layout::kNumProviders>{});
  }
  template <size_t... I>
  void ArmPreparedEach(Slot* slot, uint64_t session, std::index_sequence<I...>) {
    (
        [&] {
          using P = std::tuple_element_t<I, std::tuple<Ps...>>;
          if constexpr (ArmsInTwoSteps<P>) ArmOne<I>(slot, session, /*late=*/true);
        }(),
        ...);
  }

  // The registry lock held, or (kArmsOutsideLock) the slot marked by
  // BeginWorkOutsideLock.
  void ArmProviders(internal::SlotBase* slot, uint64_t session) override {
    ArmEach(static_cast<Slot*>(slot), session,
            std::make_index_sequence<Layout::kNumProviders>{});
  }
  template <size_t... I>
  void ArmEach(Slot* slot, uint64_t session, std::index_sequence<I...>) {
    (ArmOne<I>(slot, session), ...);
  }
  // `late`: on the ticker thread, after PrepareThread; a thread that
  // unregistered itself meanwhile (without the registry lock) may be gone,
  // and its arming fail: its preparation stands (its tail takes its CPU).
  template <size_t I>
  void ArmOne(Slot* slot, uint64_t session, bool late = false) {
    absl::Status s = std::get<I>(providers_).ArmThread(
        *slot, std::get<I>(slot->data), internal::MakeSignalTag(I, session));
    if (!s.ok() && !(late && slot->retiring.load(std::memory_order_acquire))) {
      internal::Log(absl::StrCat("cannot sample thread '", slot->name,
                                 "': ", s.message()));
    }
  }
  void DisarmLocked(internal::SlotBase* slot) override {
    DisarmEach(static_cast<Slot*>(slot), std::make_index_sequence<Layout::kNumProviders>{});
  }
  template <size_t... I>
  void DisarmEach(Slot* slot, std::index_sequence<I...>) {
    (std::get<I>(providers_).DisarmThread(*slot, std::get<I>(slot->data)), ...);
  }

  // What each provider measured since the thread's last sample: to its
  // newest stack, or to kTailFrame.
  void TakeTailsLocked(internal::SlotBase* slot) override {
    TakeTailsEach(static_cast<Slot*>(slot), std::make_index_sequence<Layout::kNumProviders>{});
  }
  template <size_t... I>
  void TakeTailsEach(Slot* slot, std::index_sequence<I...>) {
    (TakeTailOne<I>(slot), ...);
  }
  template <size_t I>
  void TakeTailOne(Slot* slot) {
    using P = std::tuple_element_t<I, std::tuple<Ps...>>;
    if constexpr (ReportsTail<P>) {
      int64_t values[Layout::kMaxValuesPerProvider] = {};
      std::span<int64_t> v(values, Layout::kValueCounts[I]);
      if (!std::get<I>(providers_).TakeTail(*slot, std::get<I>(slot->data), v)) {
        return;
      }
      internal::Pipeline::Ingesting ingest = pipeline_.Ingest();
      SampleAggregator& agg = ingest.aggregator();
      EnsureAggregateThread(slot, agg);
      const std::vector<uint64_t>& last = slot->provider_last_stack[I];
      if (!last.empty()) {
        // The thread was last seen there: its final stretch is credited to
        // that stack (sampled, not synthetic), so a thread that lived a
        // sample or two keeps its CPU on its real stack.
        agg.Add(slot->aggregate_thread, last, slot->provider_last_labels[I],
                Layout::kValueOffsets[I],
                std::span<const int64_t>(values, Layout::kValueCounts[I]));
        return;
      }
      const char* frame = kTailFrame;
      if constexpr (NamesTailFrame<P>) frame = P::kTailFrame;
      agg.AddSynthetic(slot->aggregate_thread, frame, Layout::kValueOffsets[I],
                       std::span<const int64_t>(values, Layout::kValueCounts[I]));
      if constexpr (TicksThreads<P>) {
        // Wall time whose place was never read: the comments say how much.
        wall_tail_frame_ns_.fetch_add(
            static_cast<uint64_t>(std::max<int64_t>(0, values[P::kPeriodTypeIndex])),
            std::memory_order_relaxed);
      }
    }
  }

  // Event-driven providers (sample_provider.h: RecordsEvents): started and
  // stopped with the profiler; what they recorded joins each window at its
  // cut, under one aggregate thread of their own.
  static constexpr bool kHasEvents = (RecordsEvents<Ps> || ...);
  static constexpr const char* kEventsThreadName = "[events]";

  absl::Status StartEventProviders() override {
    absl::Status status;
    if constexpr (kHasEvents) {
      StartEventsEach(status, std::make_index_sequence<Layout::kNumProviders>{});
    }
    return status;
  }
  template <size_t... I>
  void StartEventsEach(absl::Status& status, std::index_sequence<I...>) {
    (
        [&] {
          using P = std::tuple_element_t<I, std::tuple<Ps...>>;
          if constexpr (RecordsEvents<P>) {
            const EventContext context{.unwind = &UnwindHere,
                                       .thread_data = &ThreadDataOf<I>,
                                       .activity = &Handler::activity};
            status.Update(std::get<I>(providers_).StartEvents(context));
          }
        }(),
        ...);
  }
  template <size_t I>
  static void* ThreadDataOf(ThreadContext& thread) noexcept {
    return &std::get<I>(static_cast<Slot&>(thread).data);
  }
  void StopEventProviders(bool forked_child) noexcept override {
    if constexpr (kHasEvents) {
      std::apply(
          [&](auto&... p) {
            (
                [&] {
                  if constexpr (RecordsEvents<std::decay_t<decltype(p)>>) {
                    p.StopEvents(forked_child);
                  }
                }(),
                ...);
          },
          providers_);
    }
  }
  // The sample types of the event providers configured off: a composition
  // with an allocation provider writes CPU profiles without its columns
  // while INPROF_ALLOC_PERIOD is unset.
  uint64_t OmittedSampleTypes() const override {
    uint64_t mask = 0;
    OmitEach(mask, std::make_index_sequence<Layout::kNumProviders>{});
    return mask;
  }
  template <size_t... I>
  void OmitEach(uint64_t& mask, std::index_sequence<I...>) const {
    (
        [&] {
          using P = std::tuple_element_t<I, std::tuple<Ps...>>;
          if constexpr (RecordsEvents<P>) {
            if (std::get<I>(providers_).Period() > 0) return;
            for (size_t t = 0; t < P::kSampleTypes.size(); ++t) {
              const size_t bit = Layout::kValueOffsets[I] + t;
              if (bit < 64) mask |= uint64_t{1} << bit;
            }
          }
        }(),
        ...);
  }
  // Whether an event provider is configured on (a period above 0).
  bool AnyEventProviderOn() const {
    return std::apply(
        [](const auto&... p) {
          return ([&] {
            if constexpr (RecordsEvents<std::decay_t<decltype(p)>>) {
              return p.Period() > 0;
            } else {
              return false;
            }
          }() || ...);
        },
        providers_);
  }
  // Each event provider's flush; their comment lines, "\n"-free, "; "-joined.
  template <size_t... I>
  std::string FlushEventsEach(SampleAggregator& agg, uint32_t thread, bool window_end,
                              std::index_sequence<I...>) {
    std::string lines;
    (
        [&] {
          using P = std::tuple_element_t<I, std::tuple<Ps...>>;
          if constexpr (RecordsEvents<P>) {
            std::string line = std::get<I>(providers_).FlushEvents(
                agg, thread, Layout::kValueOffsets[I], window_end);
            if (!line.empty()) absl::StrAppend(&lines, lines.empty() ? "" : "; ", line);
          }
        }(),
        ...);
    return lines;
  }
  // Joins the providers' events to each window, on the thread that cuts it.
  class EventAttachment final : public internal::PipelineAttachment {
   public:
    explicit EventAttachment(Profiler& profiler) : profiler_(profiler) {}
    std::string BeforeCutLocked(SampleAggregator& agg, bool window_end) override {
      // A composition whose event providers are all off (period 0, as
      // DefaultProfiler's allocation provider by default) adds nothing.
      if (!thread_.has_value() && !profiler_.AnyEventProviderOn()) return {};
      // The aggregate keeps its thread table across cuts: one entry for
      // the profiler's life (pid as its id: the events of every thread).
      if (!thread_.has_value()) {
        thread_ = agg.AddThread(static_cast<int64_t>(getpid()), kEventsThreadName);
      }
      return profiler_.FlushEventsEach(agg, *thread_, window_end,
                                       std::make_index_sequence<Layout::kNumProviders>{});
    }

    void LiveStateLocked(SampleAggregator& agg, bool all) override {
      if (!thread_.has_value() && !profiler_.AnyEventProviderOn()) return;
      if (!thread_.has_value()) {
        thread_ = agg.AddThread(static_cast<int64_t>(getpid()), kEventsThreadName);
      }
      profiler_.LiveStateEach(agg, *thread_, all,
                              std::make_index_sequence<Layout::kNumProviders>{});
    }

    SnapshotShape SnapshotLocked(SampleAggregator& agg) override {
      SnapshotShape shape;
      std::optional<uint32_t> thread;
      profiler_.SnapshotEach(agg, thread, shape,
                             std::make_index_sequence<Layout::kNumProviders>{});
      return shape;
    }

   private:
    Profiler& profiler_;
    std::optional<uint32_t> thread_;
  };
  // Each event provider's live state (ReportsLiveState).
  template <size_t... I>
  void LiveStateEach(SampleAggregator& agg, uint32_t thread, bool all,
                     std::index_sequence<I...>) {
    (
        [&] {
          using P = std::tuple_element_t<I, std::tuple<Ps...>>;
          if constexpr (ReportsLiveState<P>) {
            std::get<I>(providers_).AddLiveState(agg, thread, Layout::kValueOffsets[I], all);
          }
        }(),
        ...);
  }
  // The first event provider's snapshot that has one (SnapshotsEvents).
  template <size_t... I>
  void SnapshotEach(SampleAggregator& agg, std::optional<uint32_t>& thread,
                    internal::PipelineAttachment::SnapshotShape& shape,
                    std::index_sequence<I...>) {
    (
        [&] {
          using P = std::tuple_element_t<I, std::tuple<Ps...>>;
          if constexpr (SnapshotsEvents<P>) {
            if (shape.types != 0) return;
            auto& p = std::get<I>(providers_);
            if (p.Period() <= 0) return;
            if (!thread.has_value()) {
              thread = agg.AddThread(static_cast<int64_t>(getpid()), kEventsThreadName);
            }
            if (!p.SnapshotEvents(agg, *thread, Layout::kValueOffsets[I])) return;
            for (size_t t = 0; t < SnapshotTypeCount<P>(); ++t) {
              const size_t bit = Layout::kValueOffsets[I] + t;
              if (bit < 64) shape.types |= uint64_t{1} << bit;
            }
            shape.period = p.Period();
            shape.period_type = Layout::kValueOffsets[I] + P::kPeriodTypeIndex;
          }
        }(),
        ...);
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
    size_t room = Layout::kHandlerStackBytes;
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

  // The ticker thread ("inprof-tick"): drives providers that model
  // TicksThreads (wall time).
  static constexpr bool kHasTicker = (TicksThreads<Ps> || ...);

  absl::Duration TickerPeriod() const override {
    absl::Duration period = absl::InfiniteDuration();
    TickerPeriodEach(period, std::make_index_sequence<Layout::kNumProviders>{});
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
    TickEach(when, batch, next, std::make_index_sequence<Layout::kNumProviders>{});
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
          when, batch, kMaxTickBatch, next, pacing_.steady_visits, pacing_.visit_cap(),
          std::span<const internal::WallDue>(wall_due_));
      pacing_.AddVisits(counts.visits);
      pacing_.NoteRound(std::get<I>(tickers_).round_estimate_ns());
      wall_visits_deferred_.fetch_add(counts.deferred, std::memory_order_relaxed);
      wall_unattributed_ns_.fetch_add(counts.unattributed_ns, std::memory_order_relaxed);
      wall_signals_.fetch_add(counts.signals, std::memory_order_relaxed);
      wall_stacks_read_.fetch_add(counts.stacks_read, std::memory_order_relaxed);
      wall_episodes_resampled_.fetch_add(counts.episodes_resampled,
                                         std::memory_order_relaxed);
    }
  }

  // What provider I's visits ask of the profiler (internal::WallTickerHost).
  template <size_t I>
  struct TickerHost {
    static constexpr bool kCountsRunningSamples = Layout::kHasRunningSampler;
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
      return self->template ReadBlockedStack<I>(&Of(slot), std::get<I>(self->providers_));
    }
    void Signal(internal::SlotBase& slot) {
      self->SendProfilingSignal(slot, internal::MakeSignalTag(I, self->session_));
    }
    void CreditBlocked(internal::SlotBase& slot, std::span<const int64_t> values) {
      self->CreditBlockedLocked(&slot, Layout::kValueOffsets[I], values);
    }
    void CreditRunning(internal::SlotBase& slot, std::span<const int64_t> values) {
      self->template CreditRunning<I>(&Of(slot), values);
    }
    void CreditSynthetic(internal::SlotBase& slot, std::span<const int64_t> values,
                         const char* frame) {
      self->CreditSyntheticLocked(&slot, Layout::kValueOffsets[I], values, frame);
    }
    bool TablesReady() { return Layout::UnwindTablesReady(); }
    uint64_t TablesGeneration() { return Layout::UnwindTablesGeneration(); }
  };

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
        l.leaf_words = static_cast<uint32_t>(Layout::kLeafWords);
        for (size_t i = 0; i < Layout::kNumProviders; ++i) {
          l.value_counts.push_back(static_cast<uint32_t>(Layout::kValueCounts[i]));
          l.value_offsets.push_back(static_cast<uint32_t>(Layout::kValueOffsets[i]));
          if (Layout::kStateLabelProvider[i]) l.state_label_providers |= 1u << i;
        }
        return l;
      }();
      return Layout::kNumProviders <= internal::kAgentMaxProviders ? &layout : nullptr;
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
      void* memory = composition_.AcquireAgentThreadRing(slot->tid, slot->name);
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
    composition_.ReleaseAgentThreadRing(slot->active_ring);
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

  // The slots' bits, for every slot of this type (never destroyed).
  static internal::PendingSlots& Pending() {
    static auto* pending = new internal::PendingSlots;
    return *pending;
  }
  internal::SlotBase* AcquireSlot() override {
    if (Slot* slot = internal::SlotPool<Slot>::Take()) return slot;
    return internal::SlotPool<Slot>::MakeNew([] {
      auto slot = std::make_unique<Slot>();
      slot->sample = &Handler::SampleThread;
      slot->sample_stackless = &Handler::SampleStackless;
      slot->sample_stack_bytes = static_cast<uint32_t>(Layout::kHandlerStackBytes);
      slot->before_retire = &Handler::TakeOwedSamples;
      Pending().Assign(slot.get());  // may throw; unchanged then
      return slot.release();
    });
  }
  void ReleaseSlot(internal::SlotBase* base) override {
    Slot* slot = static_cast<Slot*>(base);
    // Reset per-registration state; the ring is empty after the drain.
    ResetProviderData(slot);
    slot->seen_taken = slot->samples_taken.load();
    slot->seen_dropped = slot->ring.dropped();
    slot->seen_truncated = slot->samples_truncated.load();
    slot->seen_small_stack = slot->samples_small_stack.load();
    internal::SlotPool<Slot>::Put(slot);
  }

  std::tuple<internal::WallTicker<Ps>...> tickers_;  // registry lock
};

}  // namespace inprof

#endif  // !_WIN32

#endif  // INPROF_PROFILER_H_
