// internal: not part of the public API.
//
// The one process-wide profiling signal handler and the per-thread slot it
// finds through initial-exec TLS.
//
// Every registered thread owns a slot whose first member is a
// ThreadSlotHeader. Slots are never returned to the system (they are pooled
// and reused), so a late signal or a stale TLS pointer always reads valid
// memory. The handler samples only when the slot belongs to the session that
// is currently started; otherwise it returns at once. The handler stays
// installed after Stop so a late SIGPROF never terminates the process.
#ifndef INPROF_INTERNAL_SIGNAL_DISPATCH_H_
#define INPROF_INTERNAL_SIGNAL_DISPATCH_H_

#include <signal.h>
#include <sys/types.h>
#include <time.h>

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "inprof/base/sanitizers.h"
#include "inprof/unwinder.h"

namespace inprof::internal {

// The signal timers and the wall sampler deliver.
inline constexpr int kProfilingSignal = SIGPROF;

// Built with AddressSanitizer or ThreadSanitizer, whose instrumentation
// enlarges stack frames (the handler's stack bound, profiler.h).
#if defined(INPROF_ASAN) || defined(INPROF_TSAN)
inline constexpr bool kUnderSanitizer = true;
#else
inline constexpr bool kUnderSanitizer = false;
#endif
// Built without optimization (-O0): larger frames too.
#if defined(__OPTIMIZE__)
inline constexpr bool kUnoptimized = false;
#else
inline constexpr bool kUnoptimized = true;
#endif

// sigev_value tags: the high 16 bits mark our signals, so a SIGPROF from
// kill(1) or another library is never sampled; bits 8-15 carry the low byte
// of the session (one per Start()), so a timer signal still queued from a
// previous run of the same profiler is ignored instead of racing the
// re-arming of its thread; the low byte names the provider.
inline constexpr int kSignalTagMagic = 0x1f0f0000;
// The low byte of a thread dump's signal (no provider's: at most 255).
inline constexpr int kDumpSignalProvider = 0xff;
inline constexpr int kSignalTagMagicMask = static_cast<int>(0xffff0000u);
uint64_t ActiveSession() noexcept;
inline int MakeSignalTag(int provider, uint64_t session = ActiveSession()) {
  return kSignalTagMagic | static_cast<int>((session & 0xff) << 8) | provider;
}
inline constexpr bool SignalTagMatchesSession(int tag, uint64_t session) {
  return ((tag >> 8) & 0xff) == static_cast<int>(session & 0xff);
}

struct ThreadSlotHeader;
// `tag` is the signal's tag (MakeSignalTag): from si_value for signals inprof
// queued or a POSIX timer sent, from the slot for kernel-generated ones.
using SampleFn = void (*)(ThreadSlotHeader* slot, siginfo_t* info,
                          void* ucontext, int tag) noexcept;

// Signal-visible state of one registered thread. Counters are written by the
// handler on the owning thread and read by the collector.
struct ThreadSlotHeader {
  // Session of the profiler the slot is registered with; 0 when free.
  std::atomic<uint64_t> session{0};
  // Set while the handler runs on this thread (Stop waits for it to clear).
  std::atomic<uint32_t> in_handler{0};
  // The provider-specific part; set once when the slot is created.
  SampleFn sample = nullptr;
  // The handler runs on whatever stack the thread is on (SIGPROF is not
  // taken on an alternate stack): `sample` walks only when at least
  // `sample_stack_bytes` of the thread's own stack lie below the
  // first-level handler's frame. Otherwise (a signal handler on a small
  // sigaltstack, a coroutine's stack, a stack near its end)
  // `sample_stackless`, whose frame is a few words, records the values
  // without a stack, counted in samples_small_stack. Set with `sample`.
  SampleFn sample_stackless = nullptr;
  uint32_t sample_stack_bytes = 0;
  // Called on the owning thread as it unregisters, before it stops being
  // sampled: takes the samples its providers still owe it (a sample point
  // its CPU crossed moments ago, whose signal is on its way), so that they
  // land on its stack rather than on a tail frame. Set once with `sample`.
  void (*before_retire)(ThreadSlotHeader* slot) noexcept = nullptr;
  pid_t tid = 0;
  clockid_t cpu_clock = 0;
  StackBounds stack;
  // Kernel-generated SIGPROFs carry no tag of ours; the slot holds it.
  // A perf event's overflow (cpu_time_provider.h, perf engine) arrives with
  // si_code POLL_IN and si_fd naming the event: sampled when si_fd is
  // perf_fd. ITIMER_PROF (itimer engine) arrives with SI_KERNEL: sampled
  // when itimer_tag is set. Written under the registry lock while the
  // thread may be running its handler, hence atomics (relaxed suffices: the
  // handler revalidates the session).
  std::atomic<int> perf_fd{-1};
  std::atomic<int> perf_tag{0};
  std::atomic<int> itimer_tag{0};
  // The thread's CPU clock when inprof's handler last returned on it (-1:
  // never), so providers can tell the thread's own CPU from what a sample
  // (delivery, unwinding, recording) cost it.
  std::atomic<int64_t> handler_exit_clock{-1};
  // Handler-side counters.
  std::atomic<uint64_t> samples_taken{0};
  std::atomic<uint64_t> samples_truncated{0};
  std::atomic<uint64_t> samples_small_stack{0};

  // Labels the thread attached with ScopedLabels (labels.h), as pairs of
  // words (internal/label_table.h). Written only by the owning thread and
  // read by the handler on that same thread: entries are written before
  // label_count grows, with signal fences between.
  static constexpr uint32_t kMaxLabels = 16;
  uint64_t label_words[2 * kMaxLabels] = {};
  uint32_t label_count = 0;
  // Labels not attached because kMaxLabels were active (owning thread).
  uint64_t labels_overflowed = 0;
  // Bumped at each registration, so a ScopedLabels that outlives its
  // thread's registration never writes into a reused slot.
  uint64_t generation = 0;

  // Unregistering without the registry lock (ThreadRegistration::Reset on
  // the owning thread, when the profiler's providers allow it): the thread
  // clears its TLS pointer, so no handler touches the slot again, reads
  // its CPU clock and the monotonic clock (the end of its tails, since its
  // clock cannot be read once it exits), sets `retiring` and queues the
  // slot for the collector, which finishes the unregistration under the
  // lock. The ticker marks `visiting` around each visit and skips a
  // retiring slot; the thread waits for a visit under way before it goes
  // (both sequentially consistent: one of them sees the other), so no
  // signal is ever sent to a thread id that may have been reused.
  std::atomic<bool> retiring{false};
  std::atomic<bool> visiting{false};
  std::atomic<int64_t> exit_cpu_ns{-1};   // -1: the thread is registered
  std::atomic<int64_t> exit_wall_ns{-1};  // CLOCK_MONOTONIC
  ThreadSlotHeader* next_retired = nullptr;
  // A thread dump's request (ProfilerBase::DumpThreads): the dumping
  // thread points dump_frames at room for dump_capacity frames, sets
  // dump_state to kDumpAsked and signals; the handler, whatever signal it
  // runs for, takes the request (kDumpWriting), walks the stack there and
  // sets dump_depth, then kDumpDone (kDumpNoStack on a small stack). A
  // dumper that stops waiting takes kDumpAsked back to kDumpIdle, or waits
  // out kDumpWriting: the room is never written after it gave up.
  static constexpr uint32_t kDumpIdle = 0, kDumpAsked = 1, kDumpWriting = 2, kDumpDone = 3,
                            kDumpNoStack = 4;
  std::atomic<uint32_t> dump_state{kDumpIdle};
  uint32_t dump_capacity = 0;
  uint32_t dump_depth = 0;
  // The answering handler's pc and call-number register (SyscallRegisters):
  // whether it returns into a system call, which the dump then reads
  // (SyscallAt). A thread the dump saw running while another handler had it
  // out of its wait is still waiting.
  uint64_t dump_pc = 0;
  int64_t dump_nr = -1;
  uint64_t* dump_frames = nullptr;
  // The slot's bit in its profiler type's PendingSlots (pending_slots.h:
  // MarkPending), set once when the slot is created; null: none.
  std::atomic<uint64_t>* pending_word = nullptr;
  uint64_t pending_bit = 0;
};

// After leaving records or events in `slot` for the collector: its next
// pass drains the slot (pending_slots.h). Async-signal-safe: one atomic OR.
// A slot without a bit: a no-op (the collector then reads every slot).
inline void MarkPending(ThreadSlotHeader& slot) noexcept {
  if (std::atomic<uint64_t>* word = slot.pending_word) {
    word->fetch_or(slot.pending_bit, std::memory_order_release);
  }
}

// On the owning thread as it begins to unregister: its CPU and monotonic
// clocks now, where its tails end (exit_cpu_ns, exit_wall_ns). Not for
// signal handlers.
void MarkUnregistering(ThreadSlotHeader& slot) noexcept;

// The lock-free half of an unregistration on the owning thread (see
// ThreadSlotHeader::retiring): after it, `slot` may be queued for the
// collector. Not for signal handlers.
void BeginRetireOnOwnThread(ThreadSlotHeader& slot) noexcept;

// Sends the profiling signal, carrying `tag`, to the calling thread: it is
// handled before this returns. Not for signal handlers.
void SignalThisThread(int tag) noexcept;

// The calling thread's slot (initial-exec TLS: no __tls_get_addr).
ThreadSlotHeader* CurrentThreadSlot() noexcept;
void SetCurrentThreadSlot(ThreadSlotHeader* slot) noexcept;

// A process-unique id for a profiler instance (never 0).
uint64_t NewSessionId() noexcept;

// Installs the process-wide handler for kProfilingSignal (SA_RESTART |
// SA_SIGINFO) unless it is ours already. Fails, leaving the application's
// handler in place, if somebody else installed one.
absl::Status InstallSignalHandler();

// Unblocks kProfilingSignal in the calling thread's signal mask when the
// thread blocks it (a mask often inherited from the thread that created it:
// a server that blocks every signal in its workers) and no handler other
// than inprof's is installed for it (and, before inprof's is, none is
// pending: the default action would end the process): no sample can be
// taken of a thread that blocks it. True when it was blocked and now is
// not.
bool UnblockProfilingSignalInThisThread() noexcept;

// Makes `session` the one whose slots are sampled. Fails if another session
// is active (a second profiler started in the same process).
absl::Status ActivateSession(uint64_t session);

// Stops sampling `session`'s slots. After return no handler is inside a
// slot of that session except those that began before; call
// WaitForHandler(slot) on each slot to wait them out.
void DeactivateSession(uint64_t session) noexcept;
void WaitForHandler(const ThreadSlotHeader& slot) noexcept;

// The active session id, 0 when none.
uint64_t ActiveSession() noexcept;

// Handler invocations that found no active slot, by reason (for tests).
struct DispatchStats {
  uint64_t no_slot = 0;
  uint64_t inactive = 0;
  uint64_t foreign = 0;  // SIGPROF not sent by inprof
};
DispatchStats GetDispatchStats() noexcept;

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_SIGNAL_DISPATCH_H_
