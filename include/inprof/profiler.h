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
// threads, the counters, and the loops over the provider table that
// internal::MakeProviderOpsTable builds from Ps: provider_table.h);
// internal::ProfilerLayout (the record's shape and the slot the components
// fix); internal::SampleHandler (the signal handler's half); then
// internal::ProfilerCollector (a ring popped, the slot pool) and
// internal::ProfilerVisits (the wall ticker's visits), each over the one
// before; and this class, which holds the providers and fixes the shape.
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

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "inprof/cpu_time_provider.h"
#include "inprof/frame_pointer_unwinder.h"
#include "inprof/internal/profiler_base.h"
#include "inprof/internal/profiler_control.h"
#include "inprof/internal/profiler_layout.h"
#include "inprof/internal/profiler_visits.h"
#include "inprof/internal/provider_set.h"
#include "inprof/internal/provider_table.h"
#include "inprof/internal/sample_handler.h"
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
                       public internal::ProfilerVisits<U, R, Ps...> {
  // What the components fix (internal/profiler_layout.h), the handler's
  // half (internal/sample_handler.h), the collector's
  // (internal/profiler_collector.h) and the wall ticker's
  // (internal/profiler_visits.h), over internal::ProfilerBase.
  using Layout = internal::ProfilerLayout<U, R, Ps...>;
  using Handler = internal::SampleHandler<U, R, Ps...>;
  using Visits = internal::ProfilerVisits<U, R, Ps...>;
  using Set = typename Layout::Set;
  using Slot = typename Layout::Slot;
  using Shape = internal::ProfilerBase::Shape;

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
      : Visits(options,
               Shape{.profile = {.sample_types = SampleTypes(),
                                 .period_type = Set::PeriodType(),
                                 .period = this->FirstPeriod(options),
                                 .engine = Engine()},
                     // All or none, so that providers are always armed in
                     // their order (sample_provider.h: ArmsConcurrently).
                     .arms_outside_lock = (ArmsConcurrently<Ps> && ...),
                     .defers_retire = (UnregistersLate<Ps> && ...),
                     .has_ticker = (TicksThreads<Ps> || ...),
                     .two_step_arming = (ArmsConcurrently<Ps> && ...) &&
                                        (TicksThreads<Ps> || ...) && (ArmsInTwoSteps<Ps> || ...),
                     .leaf_words = Layout::kLeafWords,
                     .activity = &Handler::activity,
                     .pending = &Visits::Pending(),
                     .walks_without_tables = Layout::WalksWithoutTables(),
                     .unwinder = U::kName,
                     .unwinder_supported = U::Supported(),
                     .unwind_here = &Handler::UnwindHere,
                     .unwind_copy = Visits::kDumpReadsCopies ? &Visits::UnwindCopyOf
                                                             : nullptr,
                     .ring_layout = internal::ThreadRingLayoutOf<Layout, R>(),
                     .providers = kOps,
                     .provider_objects = this->ProviderAddresses(),
                     .slots = Visits::kSlotOps}) {}

  ~Profiler() { this->Shutdown(); }

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
};

}  // namespace inprof

#endif  // !_WIN32

#endif  // INPROF_PROFILER_H_
