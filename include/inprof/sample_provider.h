// inprof/sample_provider.h: the SampleProvider concept.
//
// A provider decides when a registered thread is sampled and with which
// values, and names those values (its pprof sample types). The Profiler
// concatenates the sample types of all its providers; a sample taken by one
// provider carries zeros for the others' types.
//
// Thread-safety: Configure/ArmThread/DisarmThread run on the profiler's
// control paths (Start, Stop, RegisterThread) under the registry lock,
// unless the provider says it ArmsConcurrently (below); OnSignal runs in the
// signal handler on the sampled thread and must be async-signal-safe.
//
// Example:
//   struct CountingProvider {          // counts SIGPROFs sent some other way
//     static constexpr const char* kName = "count";
//     static constexpr std::array<inprof::SampleTypeSpec, 1> kSampleTypes{
//         {{"hits", "count"}}};
//     struct ThreadData {};
//     ...
//   };
//   static_assert(inprof::SampleProvider<CountingProvider>);
#ifndef INPROF_SAMPLE_PROVIDER_H_
#define INPROF_SAMPLE_PROVIDER_H_

#if defined(_WIN32)
// Windows: the sampler thread's variant, same names.
#include "inprof/windows/sample_provider_windows.h"
#else

#include <signal.h>

#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "inprof/internal/signal_dispatch.h"
#include "inprof/options.h"
#include "inprof/sample_aggregator.h"

namespace inprof {

// A pprof sample type known at compile time.
struct SampleTypeSpec {
  const char* type;
  const char* unit;
};

// What a provider sees of a registered thread: its tid, CPU clock and stack.
using ThreadContext = internal::ThreadSlotHeader;

// Requirements of a SampleProvider P:
//   (1) P::kName: a short name for logs and profile comments;
//   (2) P::kSampleTypes: a constexpr std::array<SampleTypeSpec, N>, N >= 1,
//       the values it contributes, in order;
//   (3) typename P::ThreadData: default-constructible per-thread state that
//       the profiler stores in each thread's slot;
//   (4) p.Configure(const Options&) -> absl::Status: called at Start;
//   (5) p.Period() -> int64_t: the sampling period in the unit of
//       kSampleTypes[P::kPeriodTypeIndex] (pprof's period / period_type);
//   (6) p.ArmThread(ThreadContext&, ThreadData&, int signal_tag)
//       -> absl::Status: arrange for the profiling signal, carrying
//       signal_tag in si_value, to reach the thread when it should be sampled;
//   (7) p.DisarmThread(ThreadContext&, ThreadData&) noexcept: stop that; no
//       new signal is generated for the thread after it returns;
//   (8) P::OnSignal(ThreadContext&, ThreadData&, const siginfo_t&,
//       std::span<int64_t> values) noexcept -> bool: async-signal-safe;
//       fills values (kSampleTypes.size() of them); false skips the sample.
template <typename P>
concept SampleProvider =
    requires { typename P::ThreadData; } &&
    std::default_initializable<typename P::ThreadData> &&
    requires(P& p, const P& cp, const Options& options, ThreadContext& thread,
             typename P::ThreadData& data, const siginfo_t& info,
             std::span<int64_t> values, int tag) {
      { P::kName } -> std::convertible_to<const char*>;
      { P::kSampleTypes.size() } -> std::convertible_to<size_t>;
      { P::kSampleTypes[0] } -> std::convertible_to<SampleTypeSpec>;
      { P::kPeriodTypeIndex } -> std::convertible_to<size_t>;
      { p.Configure(options) } -> std::same_as<absl::Status>;
      { cp.Period() } -> std::convertible_to<int64_t>;
      { p.ArmThread(thread, data, tag) } -> std::same_as<absl::Status>;
      { p.DisarmThread(thread, data) } noexcept;
      { P::OnSignal(thread, data, info, values) } noexcept -> std::same_as<bool>;
    } && (P::kSampleTypes.size() >= 1) &&
    (P::kPeriodTypeIndex < P::kSampleTypes.size());

// Optional: a provider that can report what it measured since a thread's
// last sample (for CPU time: the CPU the thread used after its last timer
// signal). The profiler calls p.TakeTail(ThreadContext&, ThreadData&,
// std::span<int64_t> values) -> bool, outside any signal handler and once no
// handler can run for the thread, when the thread unregisters and at Stop,
// and credits the values to a synthetic frame so that totals stay exact
// (a thread shorter than a scheduler tick may never be signalled at all).
template <typename P>
concept ReportsTail = SampleProvider<P> &&
    requires(P& p, ThreadContext& thread, typename P::ThreadData& data,
             std::span<int64_t> values) {
      { p.TakeTail(thread, data, values) } -> std::same_as<bool>;
    };

// Optional: a provider whose ArmThread and DisarmThread may run for
// different threads at the same time, outside the registry lock, declares
// `static constexpr bool kArmsConcurrently = true;`. When every provider of a
// Profiler says so, it makes those calls at registration and unregistration
// (system calls, for CPU engines) without holding the lock that
// every registering thread, the collector and the wall ticker take: with
// 1,000 threads registering at once, each holding it across a
// perf_event_open or a close() queued the others behind it
// (bench/overhead idle-1000). The profiler still guarantees that calls for
// one thread never overlap, that Configure never runs while one is under
// way, and that no other profiler call (TakeTail, VisitThread) sees that
// thread's data meanwhile; what the provider shares between threads
// (counters, descriptor budgets, a random generator) is its own to guard.
template <typename P>
concept ArmsConcurrently = SampleProvider<P> && requires {
  requires P::kArmsConcurrently;
};

// Optional: a provider whose arming has a costly part (system calls) that
// another thread may do later declares `static constexpr bool
// kArmsInTwoSteps = true;` and `bool p.PrepareThread(ThreadContext&,
// ThreadData&)`. When many threads register at once, the profiler calls
// PrepareThread on each registering thread (cheap: no system call but a
// read of the thread's clock) and, when it returns true, ArmThread later on
// its sampler thread, in a batch; from PrepareThread on, what the provider
// owes the thread (its samples, OwesSample, its tail) counts as if it were
// armed then. False: the profiler arms the thread at once, as usual.
// DisarmThread must also undo a preparation that was never armed.
// CpuTimeProvider: the perf engine's perf_event_open and fcntl calls.
template <typename P>
concept ArmsInTwoSteps = ArmsConcurrently<P> &&
    requires(P& p, ThreadContext& thread, typename P::ThreadData& data) {
      requires P::kArmsInTwoSteps;
      { p.PrepareThread(thread, data) } -> std::same_as<bool>;
    };

// Optional: a provider whose DisarmThread and TakeTail may run after the
// thread has exited declares `static constexpr bool kUnregistersLate =
// true;`; its TakeTail then ends the tail at the thread's exit_cpu_ns /
// exit_wall_ns (ThreadContext) when they are set (>= 0), since a gone
// thread's CPU clock cannot be read. When every provider of a Profiler
// says so, a thread that unregisters itself does not take the registry
// lock: it queues its slot and the collector finishes the unregistration
// (internal/signal_dispatch.h, ThreadSlotHeader::retiring).
template <typename P>
concept UnregistersLate = SampleProvider<P> && requires {
  requires P::kUnregistersLate;
};

// Optional: a provider whose samples are taken only while the thread runs
// on a CPU (CpuTimeProvider: a thread's CPU clock advances only then)
// declares `static constexpr bool kSamplesRunningThreads = true;`. The
// wall sampler then credits a thread that ran throughout the interval since
// its last visit to the stack of such a sample taken in that interval,
// instead of signalling the thread a second time (wall_time_provider.h).
template <typename P>
concept SamplesRunningThreads = SampleProvider<P> && requires {
  requires P::kSamplesRunningThreads;
};

// Optional: a provider whose signal to a running thread asks only for the
// thread's stack at some point after it was sent declares
// `static bool P::TakeSwallowed(ThreadContext&, ThreadData&,
// std::span<int64_t> values) noexcept` (async-signal-safe). The profiling signal is SIGPROF, which the
// kernel does not queue: one sent while another is pending is discarded.
// The handler of every other provider's sample of the thread calls it, and
// when it returns true (it had a signal outstanding, and now takes its
// values so that its own handler, if that signal does arrive, finds none)
// records a second sample of the same stack for it. WallTimeProvider: a
// wall signal sent to a thread whose CPU timer had just fired.
template <typename P>
concept TakesSwallowedSignals = SampleProvider<P> &&
    requires(ThreadContext& thread, typename P::ThreadData& data,
             std::span<int64_t> values) {
      { P::TakeSwallowed(thread, data, values) } noexcept -> std::same_as<bool>;
    };

// Optional: a provider that can tell, on the thread itself, that it owes the
// thread a sample now (a sample point passed whose signal has not been
// handled yet) declares `static bool P::OwesSample(ThreadContext&,
// const ThreadData&) noexcept`. When the thread unregisters itself, the
// profiler then signals it once more with that provider's tag, so the
// sample is taken on its stack (moments before it leaves) instead of
// going to kTailFrame with its tail.
template <typename P>
concept OwesSamples = SampleProvider<P> &&
    requires(ThreadContext& thread, const typename P::ThreadData& data) {
      { P::OwesSample(thread, data) } noexcept -> std::same_as<bool>;
    };

// The frame that tail values are credited to, unless the provider names
// its own (NamesTailFrame).
inline constexpr const char* kTailFrame =
    "[inprof: CPU since the thread's last sample]";

// Optional: `static constexpr const char* P::kTailFrame`, the frame its
// tails go to when the thread has no sample of it (WallTimeProvider: "wall
// time since the thread's last sample").
template <typename P>
concept NamesTailFrame = SampleProvider<P> && requires {
  { P::kTailFrame } -> std::convertible_to<const char*>;
};

// Optional: a provider that samples blocked threads too, and says which
// samples are of a blocked thread: `static bool P::SampledBlocked(const
// ThreadData&) noexcept`, called in the handler right after its OnSignal.
// Such a sample begins a blocking episode: the rest of the episode is
// credited to its stack without another signal (wall_time_provider.h).
template <typename P>
concept ReportsBlockedSamples =
    SampleProvider<P> && requires(const typename P::ThreadData& data) {
      { P::SampledBlocked(data) } -> std::convertible_to<bool>;
    };

// Optional: `static constexpr const char* P::kStateLabel`: the provider's
// samples carry that label, "running" or "blocked" (WallTimeProvider:
// "thread state"), in the profile.
template <typename P>
concept LabelsThreadState = SampleProvider<P> && requires {
  { P::kStateLabel } -> std::convertible_to<const char*>;
};

// What the profiler gives an event-driven provider (RecordsEvents) at
// Start.
struct EventContext {
  // Walks the calling thread's stack, as the profiler's unwinder does for a
  // signal, into `out`: out[0] is a pc in `unwind` itself, then return
  // addresses, callers last. 0 frames on a thread that is not registered
  // with the running profiler, or whose stack has no room for the walk (a
  // coroutine's, a sigaltstack). Not async-signal-safe; never allocates.
  size_t (*unwind)(std::span<uintptr_t> out) noexcept = nullptr;
  // The provider's ThreadData in a registered thread's slot.
  void* (*thread_data)(ThreadContext& thread) noexcept = nullptr;
  // Bumped after an event is left in a ThreadData (DrainsThreadEvents), so
  // that the collector's next pass visits the threads' slots.
  std::atomic<uint64_t>* activity = nullptr;
};

// Optional: a provider that records events as they happen, on the thread
// that causes them, instead of when a signal arrives (AllocationProvider,
// inprof/heap/allocation_provider.h: a sampled allocation) declares `static
// constexpr bool kRecordsEvents = true;` and:
//   (1) p.StartEvents(const EventContext&) -> absl::Status: at Start, once
//       the session is active and the registered threads are armed; an
//       error is logged and the other providers keep sampling;
//   (2) p.StopEvents(bool forked_child) noexcept: at Stop, before the last
//       drain; no event is recorded after it returns (in a forked child,
//       where other threads' locks may be held, it may only set atomics);
//   (3) p.FlushEvents(SampleAggregator&, uint32_t thread, size_t
//       value_offset, bool window_end): on the thread that cuts a profile
//       window, with the pipeline's lock held, before the cut: adds what it
//       recorded since its last flush, its values at [value_offset,
//       value_offset + kSampleTypes.size()), under aggregator thread
//       `thread` (the profiler's "[events]" entry); window_end: the window
//       ends here, so state it reports as of the window's end (the live
//       heap) is added too (false for a live capture's window). Returns
//       a comment line for the window (its counters), or "".
// Its events do not go through the threads' rings: what a signal handler
// pushes there is the handler's alone. Its ArmThread, DisarmThread and
// OnSignal may do nothing (OnSignal returning false).
template <typename P>
concept RecordsEvents = SampleProvider<P> &&
    requires(P& p, const EventContext& context, SampleAggregator& aggregator, uint32_t thread,
             size_t offset, bool flag) {
      requires P::kRecordsEvents;
      { p.StartEvents(context) } -> std::same_as<absl::Status>;
      { p.StopEvents(flag) } noexcept;
      { p.FlushEvents(aggregator, thread, offset, flag) } -> std::convertible_to<std::string>;
    };

// Optional, with RecordsEvents: a provider that leaves a registered
// thread's events in its ThreadData (on that thread, as they happen) has the
// collector take them into the thread's own samples (its thread id, name
// and the labels the event carries), under the registry and aggregate
// locks, at every drain and before the thread unregisters:
//   static void P::DrainThreadEvents(ThreadData&, absl::FunctionRef<void(
//       std::span<const uint64_t> frames, std::span<const uint64_t>
//       canonical_label_words, std::span<const int64_t> values)>)
// (values: kSampleTypes.size() of them).
using ThreadEventVisitor = absl::FunctionRef<void(std::span<const uint64_t> frames,
                                                  std::span<const uint64_t> label_words,
                                                  std::span<const int64_t> values)>;
template <typename P>
concept DrainsThreadEvents =
    RecordsEvents<P> && requires(typename P::ThreadData& data, ThreadEventVisitor visit) {
      P::DrainThreadEvents(data, visit);
    };

// Optional, with RecordsEvents: a provider whose events make a profile of
// their own at any moment (the live endpoint's /debug/pprof/heap, as Go
// serves it) also has
//   p.SnapshotEvents(SampleAggregator&, uint32_t thread, size_t
//       value_offset) -> bool
// with the pipeline's lock held: adds its totals since Start (all its
// values at [value_offset, value_offset + kSampleTypes.size()), as of now),
// without flushing anything the windows still get. False when it is off
// (nothing added).
template <typename P>
concept SnapshotsEvents =
    RecordsEvents<P> && requires(P& p, SampleAggregator& aggregator, uint32_t thread,
                                 size_t offset) {
      { p.SnapshotEvents(aggregator, thread, offset) } -> std::same_as<bool>;
    };

// How many of a SnapshotsEvents provider's leading columns its snapshot
// fills: P::kSnapshotTypes when it declares one (the allocation provider:
// Go's four heap types, not its windows' peak), else all of them.
template <typename P>
constexpr size_t SnapshotTypeCount() {
  if constexpr (requires { P::kSnapshotTypes; }) {
    return P::kSnapshotTypes;
  } else {
    return P::kSampleTypes.size();
  }
}

// Optional, with RecordsEvents: a provider whose FlushEvents reports state
// as of a window's end (the live heap) reports that state alone too, for
// windows cut elsewhere (library mode: `inprof agent` cuts them, and keeps
// the newest state of each row between its cuts):
//   p.AddLiveState(SampleAggregator&, uint32_t thread, size_t value_offset,
//       bool all)
// with the pipeline's lock held: adds, as rows whose values are absolute
// (the values now, not added to earlier ones), those that changed since its
// previous call, a row gone as zeros; every row it has reported and not
// zeroed since when `all` (the previous rows may not all have arrived).
template <typename P>
concept ReportsLiveState =
    RecordsEvents<P> && requires(P& p, SampleAggregator& aggregator, uint32_t thread,
                                 size_t offset, bool all) {
      p.AddLiveState(aggregator, thread, offset, all);
    };

}  // namespace inprof

#endif  // !_WIN32

#endif  // INPROF_SAMPLE_PROVIDER_H_
