// inprof/locks/lock_wait_provider.h: where threads wait for locks, as a
// provider of a Profiler (Linux).
//
// LockWaitProvider adds two sample types, named as Go's mutex and block
// profiles name them, so that `go tool pprof -sample_index=delay` reads
// them: contentions/count (waits) and delay/nanoseconds (time spent
// waiting). It is event-driven (sample_provider.h: RecordsEvents): at Start
// it patches the GOT slots of the pthread lock functions in every loaded
// object (inprof/alloc/lock_hooks.h: the allocation provider's mechanism;
// objects dlopen()ed later too), so every std::mutex, std::recursive_mutex,
// std::timed_mutex and std::shared_mutex; at Stop it writes them back. A
// lock call first tries the lock; only one that finds it busy is timed. A
// wait of at least Options::lock_period (INPROF_LOCK_PERIOD; 0: off) is
// always sampled; a shorter one with probability delay/period, weighted
// period/delay waits and `period` nanoseconds: the expected contentions and
// delay equal the truth (Go's block profile samples the same way).
//
// A sample's stack is the waiting thread's, walked by the profiler's
// unwinder at the lock call and cut there (hook frames trimmed); it
// carries the thread (id and registered name), its labels (ScopedLabels)
// and the numeric label "lock address", so that one lock's waits can be
// isolated (`-tagfocus`). Threads not registered with the profiler are
// walked too and carry "waiting thread"="unregistered" on the "[events]"
// thread. inprof's own threads are left out.
//
// absl::Mutex waits in its own futex code, which no slot reaches; with
// Options::lock_absl (INPROF_LOCK_ABSL=1) inprof registers Abseil's mutex
// tracer, which Abseil calls on the thread that unlocks a contended Mutex
// with how long the waiter it wakes waited: sampled the same way, on the
// unlocking thread's stack (Go's mutex profile's view: who held it), not
// the waiter's. Opt-in: Abseil keeps one tracer for the process's life and
// aborts (in a build with assertions, as Debian's) when a second, other
// one is registered, so a program with a tracer of its own must leave it
// off. Only the Abseil inprof links is traced.
//
// What it does not see: spin locks and hand-written futex calls (no library
// call to intercept), condition-variable waits (pthread_cond_wait takes its
// mutex back inside libc), absl::Mutex waits for a Condition (Await,
// LockWhen: Abseil reports none), calls bound without a GOT slot (static
// linking, -Bsymbolic).
//
// Memory: at most kMaxStacks distinct (labels, stack) keys of at most
// kMaxDepth frames (~18 MiB at the limit; past it waits are counted on
// "[inprof: lock-wait stacks beyond the table's limit]"), for the process's
// life: a wrapper may still run after Stop.
//
// Thread-safety: one LockWaitProvider may run at a time in a process;
// StartEvents fails for a second. The sampled path (after a sampled wait,
// holding the lock waited for) takes the provider's mutex; the wait itself
// takes none.
//
// Example:
//   inprof::Options options = inprof::Options::FromEnv();
//   options.lock_period = 1'000'000;  // 1 ms
//   inprof::DefaultProfiler profiler(options);
//   inprof::ScopedProfiler running(profiler);
//   // go tool pprof -sample_index=delay inprof.pb.gz
#ifndef INPROF_LOCKS_LOCK_WAIT_PROVIDER_H_
#define INPROF_LOCKS_LOCK_WAIT_PROVIDER_H_

#include <signal.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "inprof/internal/event_stack_table.h"
#include "inprof/options.h"
#include "inprof/sample_aggregator.h"
#include "inprof/sample_provider.h"

namespace inprof {

class LockWaitProvider {
 public:
  static constexpr const char* kName = "locks";
  static constexpr std::array<SampleTypeSpec, 2> kSampleTypes{
      {{"contentions", "count"}, {"delay", "nanoseconds"}}};
  static constexpr size_t kPeriodTypeIndex = 1;  // delay: the period is in nanoseconds
  static constexpr bool kArmsConcurrently = true;
  static constexpr bool kUnregistersLate = true;
  static constexpr bool kRecordsEvents = true;

  static constexpr size_t kMaxStacks = 1 << 16;
  static constexpr size_t kMaxDepth = 128;

  // The numeric label every sample carries: the lock's address.
  static constexpr const char* kLockLabel = "lock address";
  static constexpr const char* kUnregisteredLabel[2] = {"waiting thread", "unregistered"};
  static constexpr const char* kUnregisteredFrame =
      "[inprof: lock waits of unregistered threads]";
  static constexpr const char* kNoStackFrame =
      "[inprof: lock-wait stack not walked (small or foreign stack)]";
  static constexpr const char* kTableFullFrame =
      "[inprof: lock-wait stacks beyond the table's limit]";

  // A registered thread's sampled waits not yet drained (values:
  // contentions, delay), in its slot (internal/event_stack_table.h).
  using ThreadData = internal::EventThreadData;

  // Process-wide counters since the first Start.
  struct Stats {
    uint64_t waits = 0;                 // lock calls that found the lock busy (timed)
    uint64_t samples = 0;               // waits sampled
    uint64_t samples_unregistered = 0;  // of threads not registered
    uint64_t samples_untrimmed = 0;     // whose walk did not reach the lock call
    uint64_t samples_own = 0;           // of inprof's own threads (left out)
    uint64_t samples_threadless = 0;    // on "[events]": no room in the thread's slot
    uint64_t samples_no_room = 0;       // not recorded: too little (or a foreign) stack
    uint64_t samples_no_memory = 0;     // not recorded: std::bad_alloc
    uint64_t stacks = 0;                // distinct keys kept
  };

  absl::Status Configure(const Options& options);
  int64_t Period() const { return static_cast<int64_t>(period_); }
  absl::Status ArmThread(ThreadContext&, ThreadData&, int) { return absl::OkStatus(); }
  void DisarmThread(ThreadContext&, ThreadData&) noexcept {}
  static bool OnSignal(ThreadContext&, ThreadData&, const siginfo_t&,
                       std::span<int64_t>) noexcept {
    return false;
  }
  // "lock waits: sampled by delay, every wait of 1ms or more (...)" (empty
  // when off).
  std::string Describe() const;

  absl::Status StartEvents(const EventContext& context);
  void StopEvents(bool forked_child) noexcept;
  std::string FlushEvents(SampleAggregator& aggregator, uint32_t thread, size_t value_offset,
                          bool window_end);
  static void DrainThreadEvents(ThreadData& data, ThreadEventVisitor visit);
  // sample_provider.h: SnapshotsEvents. Per stack: contentions and delay
  // since Start (the live endpoint's /debug/pprof/mutex and /block).
  bool SnapshotEvents(SampleAggregator& aggregator, uint32_t thread, size_t value_offset);

  static Stats stats();

 private:
  uint64_t period_ = 0;
  std::string period_source_;
  bool absl_ = false;  // Options::lock_absl
  bool started_ = false;
};

static_assert(SampleProvider<LockWaitProvider>);
static_assert(RecordsEvents<LockWaitProvider>);
static_assert(DrainsThreadEvents<LockWaitProvider>);
static_assert(SnapshotsEvents<LockWaitProvider>);

}  // namespace inprof

#endif  // INPROF_LOCKS_LOCK_WAIT_PROVIDER_H_
