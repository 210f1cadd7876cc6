// inprof/windows/sample_provider_windows.h: the SampleProvider concept on
// Windows, where samples are taken by a sampler thread (dd-win-prof's
// StackSamplerLoop) instead of a signal on the sampled thread.
//
// A provider decides, at each of its visits to a registered thread, whether
// the thread is sampled and with which values, from the thread's CPU
// counters, read without stopping it. The sampler then suspends the
// threads that providers asked for, once each whatever the number of
// providers, copies their stacks and resumes them
// (internal/profiler_sampler_windows.h).
// Requirements (1)-(5) are those of the Linux concept (sample_provider.h).
//
// Thread-safety: every call runs on the profiler's control paths (Start,
// Stop, RegisterThread) or on its sampler thread, under the profiler's
// registry lock; none runs while a thread is suspended.
//
// Example:
//   class MyProvider { ... Visit(...) returns VisitDecision::kSample ... };
//   static_assert(inprof::SampleProvider<MyProvider>);
#ifndef INPROF_WINDOWS_SAMPLE_PROVIDER_WINDOWS_H_
#define INPROF_WINDOWS_SAMPLE_PROVIDER_WINDOWS_H_

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "inprof/internal/thread_slot_windows.h"
#include "inprof/options.h"

namespace inprof {

// A pprof sample type known at compile time.
struct SampleTypeSpec {
  const char* type;
  const char* unit;
};

// What a provider sees of a registered thread: its id, handle and stack.
using ThreadContext = internal::ThreadSlotHeader;

// A thread's CPU counters, read without suspending it.
struct ThreadTimes {
  // User + kernel time (GetThreadTimes), in nanoseconds; -1: unreadable
  // (the thread is gone). Windows advances it at clock ticks (15.6 ms by
  // default), Wine at the kernel's (10 ms here).
  int64_t cpu_ns = -1;
  // Cycles the thread ran (QueryThreadCycleTime): exact, and advanced by
  // any run however short. has_cycles is false where it fails (Wine 8).
  uint64_t cycles = 0;
  bool has_cycles = false;
};

// What a visit decides.
enum class VisitDecision {
  kSkip,       // no sample this time
  kSample,     // suspend the thread and take its stack now
  kSameStack,  // the thread has not run since the provider's last visit:
               // its stack is the last one taken (no suspension); the
               // sampler takes one if it has none
};

// Requirements of a SampleProvider P on Windows:
//   (1) P::kName: a short name for logs and profile comments;
//   (2) P::kSampleTypes: a constexpr std::array<SampleTypeSpec, N>, N >= 1,
//       and P::kPeriodTypeIndex < N (pprof's period type);
//   (3) typename P::ThreadData: default-constructible and copyable
//       per-thread state (the sampler keeps a copy from before a visit, to
//       undo a pick whose thread unregisters before its sample is recorded);
//   (4) p.Configure(const Options&) -> absl::Status: at Start;
//   (5) p.Period() -> int64_t: the period in kPeriodTypeIndex's unit;
//   (6) p.TickPeriod() -> absl::Duration: how often it visits threads
//       (zero: the provider is off);
//   (7) p.ThreadsPerTick() -> size_t: most samples (kSample) per visit
//       round; threads past it are visited next round;
//   (8) p.ArmThread(ThreadContext&, ThreadData&, const ThreadTimes&,
//       int64_t now_ns) -> absl::Status: the thread starts being sampled
//       (at Start, or when it registers while running);
//   (9) p.Visit(ThreadContext&, ThreadData&, const ThreadTimes&,
//       int64_t now_ns, std::span<int64_t> values) -> VisitDecision: fills
//       `values` (kSampleTypes.size() of them) unless it skips.
template <typename P>
concept SampleProvider =
    requires { typename P::ThreadData; } &&
    std::default_initializable<typename P::ThreadData> &&
    std::copyable<typename P::ThreadData> &&
    requires(P& p, const P& cp, const Options& options, ThreadContext& thread,
             typename P::ThreadData& data, const ThreadTimes& times,
             int64_t now, std::span<int64_t> values) {
      { P::kName } -> std::convertible_to<const char*>;
      { P::kSampleTypes.size() } -> std::convertible_to<size_t>;
      { P::kSampleTypes[0] } -> std::convertible_to<SampleTypeSpec>;
      { P::kPeriodTypeIndex } -> std::convertible_to<size_t>;
      { p.Configure(options) } -> std::same_as<absl::Status>;
      { cp.Period() } -> std::convertible_to<int64_t>;
      { cp.TickPeriod() } -> std::same_as<absl::Duration>;
      { cp.ThreadsPerTick() } -> std::convertible_to<size_t>;
      { p.ArmThread(thread, data, times, now) } -> std::same_as<absl::Status>;
      { p.Visit(thread, data, times, now, values) } -> std::same_as<VisitDecision>;
    } && (P::kSampleTypes.size() >= 1) &&
    (P::kPeriodTypeIndex < P::kSampleTypes.size());

// Optional: what the provider measured since its last sample of a thread
// that unregisters or when the profiler stops:
// p.TakeTail(ThreadContext&, ThreadData&, const ThreadTimes&, int64_t now_ns,
// std::span<int64_t> values) -> bool. Credited to the thread's last stack,
// so totals stay exact.
template <typename P>
concept ReportsTail = SampleProvider<P> &&
    requires(P& p, ThreadContext& thread, typename P::ThreadData& data,
             const ThreadTimes& times, int64_t now, std::span<int64_t> values) {
      { p.TakeTail(thread, data, times, now, values) } -> std::same_as<bool>;
    };

// Optional: a provider whose samples carry the wall sampler's "thread state"
// label (running or blocked) declares `static constexpr const char*
// kStateLabel` and `static bool SampledBlocked(const ThreadData&)`: the
// state of its latest decision.
template <typename P>
concept LabelsThreadState = SampleProvider<P> &&
    requires(const typename P::ThreadData& data) {
      { P::kStateLabel } -> std::convertible_to<const char*>;
      { P::SampledBlocked(data) } -> std::same_as<bool>;
    };

// Optional: the frame a provider's tail values are credited to when the
// thread has no stack yet, instead of kTailFrame below: `static constexpr
// const char* kTailFrame`.
template <typename P>
concept NamesTailFrame = SampleProvider<P> && requires {
  { P::kTailFrame } -> std::convertible_to<const char*>;
};

// Optional: p.IdleVisitsPerTick() -> size_t: the sampler visits the
// threads the provider's last visit found running first, every tick, then
// at most this many of the others (each visit reads a thread's clocks, a
// system call); without it every thread is visited.
template <typename P>
concept SparesIdleThreads = SampleProvider<P> && requires(const P& cp) {
  { cp.IdleVisitsPerTick() } -> std::convertible_to<size_t>;
};

// The frame that tail values are credited to when the thread has no stack
// yet.
inline constexpr const char* kTailFrame =
    "[inprof: CPU since the thread's last sample]";

namespace internal {
// The thread's counters (GetThreadTimes, QueryThreadCycleTime). Any thread.
ThreadTimes ReadThreadTimes(void* handle) noexcept;
// A monotonic clock in nanoseconds (QueryPerformanceCounter).
int64_t MonotonicNanos() noexcept;
}  // namespace internal

}  // namespace inprof

#endif  // INPROF_WINDOWS_SAMPLE_PROVIDER_WINDOWS_H_
