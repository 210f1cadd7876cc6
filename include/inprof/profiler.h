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
#include "inprof/internal/pipeline.h"
#include "inprof/internal/profiler_layout.h"
#include "inprof/internal/provider_set.h"
#include "inprof/internal/provider_table.h"
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
  using Base::pipeline_, Base::session_, Base::active_,
      Base::pacing_,
      Base::wall_visits_deferred_, Base::wall_unattributed_ns_, Base::wall_due_,
      Base::kMaxTickBatch, Base::wall_signals_,
      Base::wall_stacks_read_, Base::wall_episodes_resampled_, Base::wall_tail_frame_ns_,
      Base::Shutdown,
      Base::DrainRings, Base::DrainSlotLocked, Base::RefreshLeafResolverLocked,
      Base::SendProfilingSignal, Base::CreditBlockedLocked,
      Base::CreditSyntheticLocked;

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
                                             .period_type = Set::PeriodType(),
                                             .period = this->FirstPeriod(options),
                                             .engine = Engine()},
                                 .arms_outside_lock = (ArmsConcurrently<Ps> && ...),
                                 .defers_retire = (UnregistersLate<Ps> && ...),
                                 .has_ticker = kHasTicker,
                                 .two_step_arming = kTwoStepArming,
                                 .leaf_words = Layout::kLeafWords > 0,
                                 .activity = &Handler::activity,
                                 .pending = &Pending(),
                                 .walks_without_tables = WalksWithoutTables(),
                                 .unwinder = U::kName,
                                 .unwinder_supported = U::Supported(),
                                 .unwind_here = &UnwindHere,
                                 .ring_layout = RingLayout(),
                                 .providers = kOps,
                                 .provider_objects = this->ProviderAddresses(),
                                 .slots = kSlotOps}) {}

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
  // What each provider does (internal/provider_table.h), looped over by
  // internal::ProfilerBase with the providers' addresses in that order.
  static constexpr auto kOps = internal::MakeProviderOpsTable<Slot, Ps...>();

  static constexpr uint64_t (*WalksWithoutTables())() {
    if constexpr (BuildsTablesLazily<U>) {
      return [] { return static_cast<uint64_t>(U::WalksWithoutTables()); };
    } else {
      return nullptr;
    }
  }

  // When every provider ArmsConcurrently (sample_provider.h), a thread
  // that registers or unregisters while the profiler runs arms or disarms
  // them outside the registry lock; Start() and Stop() do it under the
  // lock. All or none, so that providers are always armed in their order
  // (a second perf-engine provider on the same thread takes the slot's
  // overflow descriptor from the first: tests/profiler/sample_provider_test.cc).
  // Threads registering in a burst leave their costliest arming to the
  // ticker thread (sample_provider.h: ArmsInTwoSteps). When every provider
  // can be disarmed and its tail taken after the thread is gone
  // (UnregistersLate), threads unregister themselves without the registry
  // lock and the profiler finishes that later.
  static constexpr bool kTwoStepArming = (ArmsConcurrently<Ps> && ...) &&
                                         (TicksThreads<Ps> || ...) && (ArmsInTwoSteps<Ps> || ...);
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

  // Library mode: the shape of the records and rings, for the agent to read
  // the rings of a process that died (internal/agent_stream.h); null when
  // the ring type is not an SpscRecordRing.
  static const internal::AgentThreadRingLayout* RingLayout() {
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

  // The slots' bits, for every slot of this type (never destroyed).
  static internal::PendingSlots& Pending() {
    static auto* pending = new internal::PendingSlots;
    return *pending;
  }
  // The slots (internal::ProfilerBase::Shape::SlotOps): from and back to
  // their pool; a ring in the agent's memory (library mode) placed with
  // its words untouched.
  static constexpr Base::Shape::SlotOps kSlotOps{
      .acquire = []() -> internal::SlotBase* {
        if (Slot* slot = internal::SlotPool<Slot>::Take()) return slot;
        return internal::SlotPool<Slot>::MakeNew([] {
          auto slot = std::make_unique<Slot>();
          slot->sample = &Handler::SampleThread;
          slot->sample_stackless = &Handler::SampleStackless;
          slot->sample_stack_bytes = static_cast<uint32_t>(Layout::kHandlerStackBytes);
          slot->before_retire = &Handler::TakeOwedSamples;
          slot->provider_last_stack.resize(Layout::kNumProviders);
          slot->provider_last_labels.resize(Layout::kNumProviders);
          slot->running_samples_at_visit.resize(Layout::kNumProviders);
          Pending().Assign(slot.get());  // may throw; unchanged then
          return slot.release();
        });
      },
      .release =
          [](internal::SlotBase* base) {
            // The per-registration counts; the ring is empty after the drain.
            Slot* slot = static_cast<Slot*>(base);
            slot->seen_taken = slot->samples_taken.load();
            slot->seen_dropped = slot->ring.dropped();
            slot->seen_truncated = slot->samples_truncated.load();
            slot->seen_small_stack = slot->samples_small_stack.load();
            internal::SlotPool<Slot>::Put(slot);
          },
      .shared_ring = [](const internal::SlotBase* base) -> void* {
        const Slot* slot = static_cast<const Slot*>(base);
        return slot->active_ring == &slot->ring ? nullptr : slot->active_ring;
      },
      .write_ring =
          [](internal::SlotBase* base, void* shared) {
            Slot* slot = static_cast<Slot*>(base);
            slot->active_ring = shared != nullptr ? new (shared) R : &slot->ring;
            slot->seen_dropped = shared != nullptr ? 0 : slot->ring.dropped();
          },
      .shares_rings = kIsSpscRecordRing<R>};

  std::tuple<internal::WallTicker<Ps>...> tickers_;  // registry lock
};

}  // namespace inprof

#endif  // !_WIN32

#endif  // INPROF_PROFILER_H_
