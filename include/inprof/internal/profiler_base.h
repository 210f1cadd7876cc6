// internal: not part of the public API (include inprof/profiler.h).
//
// The half of the Linux Profiler that does not depend on its components,
// over what both platforms share (ProfilerCommon, profiler_common.h):
// the registry of threads (RegisterThread, unregistration, the queue of
// slots retired without the lock, the slot lifecycle), Start() and Stop(),
// the collector's pass over the slots, the wall ticker's wake-ups (its
// thread, pacing and arm queue are internal::WallTickerThread, TickerPacing
// and ArmQueue: wall_ticker_thread.h), and the counters. Compiled once, in
// src/profiler/profiler_base.cc.
//
// Profiler<U, R, Ps...> (profiler.h) derives from ProfilerBase, through
// ProfilerCollector (profiler_collector.h), and supplies what its types
// decide through the hooks below: arming and disarming its providers,
// draining a slot's ring, its slot pool, the ticking providers' visits. The
// signal handler (sample_handler.h) stays a template: it is the hot path,
// and inlining the providers' OnSignal and the unwinder's walk into it is
// what the template arguments are for.
//
// Locks: "registry lock" below is registry_->mutex; the aggregate lock is
// the pipeline's (Pipeline::Ingest), always taken after it.
#ifndef INPROF_INTERNAL_PROFILER_BASE_H_
#define INPROF_INTERNAL_PROFILER_BASE_H_

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "inprof/internal/leaf_frame_resolver.h"
#include "inprof/internal/pending_slots.h"
#include "inprof/internal/profiler_control.h"
#include "inprof/internal/pipeline.h"
#include "inprof/internal/profiler_common.h"
#include "inprof/internal/provider_table.h"
#include "inprof/internal/sample_record.h"
#include "inprof/internal/signal_dispatch.h"
#include "inprof/internal/thread_info.h"
#include "inprof/internal/wall_ticker_thread.h"
#include "inprof/options.h"
#include "inprof/sample_aggregator.h"
#include "inprof/wall_time_provider.h"

namespace inprof::internal {

// Where a sample of a thread on a stack too small for the walk puts its
// values (the profile's comments count them); Profiler<>::kSmallStackFrame.
inline constexpr const char* kSmallStackFrame = "[inprof: on a small or foreign stack]";

// A registered thread: the header the signal handler reads, and the state
// the collector and the ticker keep for it whatever the template's types.
// ProfilerLayout<>::Slot (profiler_layout.h) adds its providers' per-thread
// data and its ring.
// SlotRecordState (profiler_common.h) holds its name, its newest stack
// (where a blocked thread still is: wall time credits it without a signal)
// and its entry in the aggregate.
struct SlotBase : ThreadSlotHeader, SlotRecordState {
  int max_frames = 512;
  // Collector-owned (registry lock held).
  std::vector<uint64_t> last_labels;
  // The stack (and canonical labels, "blocked" among them) of the current
  // blocking episode, from the sample taken when it began; empty when the
  // thread is not known to be blocked.
  std::vector<uint64_t> blocked_stack;
  std::vector<uint64_t> blocked_labels;
  // Samples taken of the thread by providers that SamplesRunningThreads
  // (its handler writes, after the record's push; the ticker reads), and
  // the newest such stack drained, with its canonical labels: a wall visit
  // to a thread that ran throughout credits the interval there.
  std::atomic<uint32_t> running_samples{0};
  std::vector<uint64_t> running_stack;
  std::vector<uint64_t> running_labels;
  // blocked_stack came from a provisional walk (UnwindResult::provisional:
  // frames may be missing), and whether this episode was sampled again
  // for that reason (once at most: each time costs the thread an EINTR).
  bool blocked_provisional = false;
  bool blocked_resampled = false;
  // The episode's first sample had no stack (SampleStackless): the rest
  // of it goes to kSmallStackFrame.
  bool blocked_stackless = false;
  // The tables when that stack was drained: sampled again once they are
  // ready and, if they were then, rebuilt since (a module built on demand).
  bool blocked_tables_ready = false;
  uint64_t blocked_tables_generation = 0;
  // Armed or disarmed outside the registry lock: the ticker leaves it be.
  bool arm_in_flight = false;
  // Prepared by RegisterThread and waiting in ProfilerBase::arm_queue_
  // (ArmQueue) for the ticker's armer thread to arm it (registry lock).
  bool arm_queued = false;
  // Where a copy of the thread's stack last failed to walk (ticker, registry
  // lock; ProfilerCollector<>::ReadBlockedStack): signalled there instead.
  SyscallSite unreadable_site;
  // The wall ticker's last visit (TickTime::now_ns; kNeverVisited since it
  // registered), whether it waits in ProfilerBase's due list (WallDue: it
  // ran, and no visit came for a round), out of its count (KeepsOwnAccounts). Registry lock.
  static constexpr int64_t kNeverVisited = INT64_MIN;
  int64_t wall_last_visit_ns = kNeverVisited;
  int64_t counted_since_ns = 0;  // entered the ticker's count (TickerPacing::Ended)
  bool wall_due = false, ticker_own_account = false;
  uint64_t seen_small_stack = 0;
  // Its CPU clock at the wall ticker's latest look, and the first look that
  // read it: how long a waiting thread waited, to a round (DumpThreads).
  int64_t still_clock = -1, still_since_ns = 0;
  // Per provider (collector-owned, registry lock): the newest stack drained
  // for it and its canonical labels. What the provider measured after that
  // sample (TakeTail) is credited there: a thread's last moments were
  // spent near it. And running_samples at each ticking provider's last
  // visit (ticker). Sized when the slot is made.
  std::vector<std::vector<uint64_t>> provider_last_stack;
  std::vector<std::vector<uint64_t>> provider_last_labels;
  std::vector<uint32_t> running_samples_at_visit;
};

// A thread the wall ticker visits ahead of its round (ProfilerBase::
// wall_due_): `slot` as registered when it was queued (a slot is reused
// with a new generation, and never freed).
struct WallDue {
  SlotBase* slot;
  uint64_t generation;
};

class ProfilerBase : public ProfilerCommon {
 public:
  ProfilerBase(const ProfilerBase&) = delete;
  ProfilerBase& operator=(const ProfilerBase&) = delete;

  // Starts sampling every registered thread (and those that register
  // later). OK and a no-op when disabled; an error status, never a crash,
  // when another profiler runs, SIGPROF belongs to someone else, or the
  // options are invalid.
  absl::Status Start() override;

  // Stops sampling, drains every ring and writes the profile to
  // options().output. Idempotent. In a forked child it only forgets the
  // parent's profiler (no file is written).
  absl::Status Stop() override;

  // Registers the calling thread under `name`. Works before and after
  // Start(). The returned handle unregisters on destruction.
  [[nodiscard]] ThreadRegistration RegisterThread(absl::string_view name);

  // Renames the registered thread `tid` (a thread that called
  // pthread_setname_np or prctl(PR_SET_NAME) after registering): its samples
  // in the current window and later carry `name`. False when no registered
  // thread has that id. Any thread; not for signal handlers.
  bool SetThreadName(pid_t tid, absl::string_view name);

  // For tests: how many other threads must be inside RegisterThread at the
  // same moment for a registering thread to leave its costliest arming to
  // the ticker thread (kBurstThreads; 0: every thread registering while the
  // profiler runs). Before Start().
  void SetBurstThreadsForTesting(int threads) { burst_threads_ = threads; }

  // For tests: the lock that registration, the collector and the wall
  // sampler take (a thread unregistering itself while it is held queues its
  // slot instead of waiting).
  std::mutex& registry_mutex_for_testing() { return registry_->mutex; }

  // Counters so far. Any thread.
  ProfilerStats stats() const;

  // Every registered thread's stack now, a sample each (profiler_dump.cc).
  absl::StatusOr<ProfileData> DumpThreads(absl::Duration wait = absl::Seconds(1));

 protected:
  // What the template's types decide, once, at construction.
  struct Shape {
    ProfileShape profile;
    // When every provider ArmsConcurrently (sample_provider.h), a thread
    // that registers or unregisters while the profiler runs arms or
    // disarms them outside the registry lock; Start() and Stop() do it
    // under the lock (all or none: a second perf-engine provider on the
    // same thread takes the slot's overflow descriptor from the first,
    // tests/profiler/sample_provider_test.cc).
    bool arms_outside_lock = false;
    // When every provider UnregistersLate (its tail taken after the thread
    // is gone), threads unregister themselves without the registry lock
    // and the profiler finishes that later (ProcessRetiredLocked).
    bool defers_retire = false;
    // A provider TicksThreads (wall time): the ticker thread runs.
    bool has_ticker = false;
    // Arming outside the lock, a ticker and a provider that ArmsInTwoSteps:
    // threads registering in a burst are armed by the ticker thread
    // (PrepareProviders, ArmPreparedProviders).
    bool two_step_arming = false;
    // The leaf stack words the unwinder copies into each record
    // (CopiesLeafStack; 0: none): drains refresh the leaf resolver first.
    size_t leaf_words = 0;
    // Samples pushed by the template's handlers (one profiler runs at a
    // time; a second of the same type only causes extra passes).
    std::atomic<uint64_t>* activity = nullptr;
    // The bits of the template's slots that left something to drain
    // (null: every pass reads every slot).
    PendingSlots* pending = nullptr;
    // The unwinder's walks before its tables were ready, process-wide
    // (null: it has no tables).
    uint64_t (*walks_without_tables)() = nullptr;
    // Its unwinder: its name and whether it works on this machine; the
    // calling thread's stack walked with it (EventContext::unwind).
    const char* unwinder = "";
    bool unwinder_supported = true;
    size_t (*unwind_here)(std::span<uintptr_t> out) noexcept = nullptr;
    // A copy of a waiting thread's stack walked from (pc, sp) (null: none).
    UnwindResult (*unwind_copy)(uintptr_t pc, uintptr_t sp, std::span<const uint64_t> copy,
                                std::span<uintptr_t> out) noexcept = nullptr;
    // The shape of the records and rings, for a reader in another process
    // (sample_record.h); null when the rings cannot live in shared memory.
    const ThreadRingLayout* ring_layout = nullptr;
    // The providers (provider_table.h): what each does, and each, in order.
    std::span<const ProviderOps> providers;
    std::vector<void*> provider_objects;
    // Its slots (ProfilerLayout<>::Slot).
    struct SlotOps {
      // One from the template's pool, made when it is empty (never
      // freed); and one back to it, its providers' data reset.
      SlotBase* (*acquire)() = nullptr;
      void (*release)(SlotBase* slot) = nullptr;
      // The ring its handler writes: the shared memory it writes
      // (null: its own ring), and a switch to `shared` (null: to its own).
      // shares_rings: its ring type can live in shared memory
      // (Pipeline::AcquireThreadRing).
      void* (*shared_ring)(const SlotBase* slot) = nullptr;
      void (*write_ring)(SlotBase* slot, void* shared) = nullptr;
      bool shares_rings = false;
    };
    SlotOps slots;
  };
  ProfilerBase(Options options, Shape shape);
  // Does nothing that needs the template: Profiler<>'s destructor
  // calls Shutdown() first.
  ~ProfilerBase();
  // Stop(), then every registered slot retired. For the derived class's
  // destructor, while its hooks still work.
  void Shutdown();

  // --- The template's part (Profiler<U, R, Ps...>) ------------------------
  // Registry and aggregate locks held: the slot's records into `agg`.
  // Cheap for an idle thread. False when it stopped at its budget with
  // records left.
  virtual bool DrainSlotIntoLocked(SlotBase* slot, SampleAggregator& agg) = 0;
  // Collector step (not under the registry lock): the unwinder's module
  // tables, then DrainRings().
  virtual void Drain() = 0;
  // One wake-up's visits of the ticking providers (registry lock held;
  // `next` lowered to the batch the next wake-up may stand for).
  virtual void TickProvidersLocked(TickTime when, size_t batch, size_t& next) = 0;

  // --- The providers, through their table (profiler_providers.cc) --------
  absl::Status ConfigureProviders();
  // The sample types (bit i: the i-th) of event providers configured off,
  // left out of the profile (Pipeline::SetOmittedTypes): a profiler
  // with an allocation provider writes CPU profiles without its columns
  // while INPROF_ALLOC_PERIOD is unset. After ConfigureProviders.
  uint64_t OmittedSampleTypes() const;
  // How providers that say so sample, for the log and the profile's
  // comments (empty: nothing to say).
  std::string DescribeProviders() const;
  // Before a registration: the per-provider parts of the slot cleared.
  static void ClearProviderHistory(SlotBase* slot);
  // Each provider's per-thread data back to its initial value.
  void ResetProviderData(SlotBase* slot) const;
  // The registry lock held, or (arms_outside_lock) the slot marked by
  // BeginWorkOutsideLock.
  void ArmProviders(SlotBase* slot, uint64_t session);
  // Registry lock held. On the registering thread: providers that arm in
  // two steps (shape_.two_step_arming) prepared, the others armed; true
  // when one waits for ArmPreparedProviders, which the ticker thread
  // calls later (ArmThread returns at once for one armed already).
  bool PrepareProviders(SlotBase* slot, uint64_t session);
  void ArmPreparedProviders(SlotBase* slot, uint64_t session);
  void DisarmLocked(SlotBase* slot);
  // Registry lock held; no handler can run for the slot. Credits what each
  // provider (that TicksThreads: ticking_only) measured since the thread's
  // last sample: to its newest stack for that provider, or its tail frame.
  void TakeTailsLocked(SlotBase* slot, bool ticking_only = false);
  // The ticker's period (InfiniteDuration: no ticking provider).
  absl::Duration TickerPeriod() const;
  // Event-driven providers (sample_provider.h: RecordsEvents): started at
  // Start() once the threads are armed (an error is logged, and the others
  // sample on), stopped at the beginning of Stop() (forked_child: in a
  // child, where only atomics may be set). Start: under the registry lock.
  absl::Status StartEventProviders();
  void StopEventProviders(bool forked_child) noexcept;
  bool AnyEventProviderOn() const;
  // A slot from the template's pool, and back to it.
  SlotBase* AcquireSlot() { return shape_.slots.acquire(); }
  void ReleaseSlot(SlotBase* slot) {
    ResetProviderData(slot);
    shape_.slots.release(slot);
  }
  // Registry lock held; no handler can run for the slot (not armed yet, or
  // disarmed and waited for). Its ring becomes one in memory an attachment
  // shares (Pipeline::AcquireThreadRing; its own ring is empty: drained or
  // unused), and back once the shared one is drained.
  void UseSharedRingLocked(SlotBase* slot);
  void UseOwnRingLocked(SlotBase* slot);
  // In a forked child: the slot's provider data back to its initial value
  // and its own ring (a shared one is the parent's), no timer deleted.
  void ForgetProviderStateLocked(SlotBase* slot) {
    ResetProviderData(slot);
    shape_.slots.write_ring(slot, nullptr);
  }
  // Provider i, as the template gave it.
  void* ProviderObject(size_t i) const { return shape_.provider_objects[i]; }

  // --- For the template -------------------------------------------------
  // Registry lock held. Moves the slot's records into the aggregate.
  void DrainSlotLocked(SlotBase* slot);
  // The rings of every registered thread into the aggregate, when a
  // handler ran since the last pass. Returns whether the profiler is
  // still running.
  bool DrainRings();
  static void EnsureAggregateThread(SlotBase* slot, SampleAggregator& agg) {
    ProfilerCommon::EnsureAggregateThread(*slot, slot->tid, agg);
  }
  // Registry lock held (the ticker's credits, internal::WallTicker): a
  // provider's values, at `value_offset` of the sample, added to `frame`
  // (no stack), or to the thread's current blocking episode's stack
  // (labelled blocked; kSmallStackFrame when its first sample had none).
  void CreditSyntheticLocked(SlotBase* slot, size_t value_offset,
                             std::span<const int64_t> values, const char* frame);
  void CreditBlockedLocked(SlotBase* slot, size_t value_offset,
                           std::span<const int64_t> values);
  // Registry lock held: the leaf resolver's view of the modules, before a
  // drain (unwinders that copy leaf stack words).
  void RefreshLeafResolverLocked() {
    if (shape_.leaf_words != 0) leaf_resolver_.Refresh();
  }
  // Registry and aggregate locks held (profiler_records.cc). One record as
  // the handler writes it (from a ring, or built by the ticker:
  // ProfilerCollector<>::ReadBlockedStack) into the aggregate and the
  // slot's newest stacks; false for a malformed one. `repaired` has room
  // for n + 1 words.
  bool AddRecordLocked(SlotBase* slot, SampleAggregator& agg, const uint64_t* record,
                       size_t n, uint64_t* repaired);
  // Registry and aggregate locks held: the events providers left in the
  // slot (sample_provider.h: DrainsThreadEvents), as the thread's samples.
  void DrainThreadEventsLocked(SlotBase* slot, SampleAggregator& agg);
  // Registry lock held. The thread ran throughout a visit's interval and a
  // running sample was taken of it meanwhile: provider `provider`'s values
  // added to that sample's stack, labelled running (its ring drained
  // first, where the sample may be).
  void CreditRunningLocked(SlotBase* slot, size_t provider, std::span<const int64_t> values);
  // Canonical label words for the aggregate, with provider `provider`'s
  // state label when it has one ("thread state"="running" for a signalled
  // wall sample). `out` has room for kMaxLabelWords + 2.
  size_t ProviderLabels(std::span<const uint64_t> words, size_t provider, uint64_t* out,
                        bool blocked = false) const;
  static constexpr size_t kMaxLabelWords = 2 * ThreadSlotHeader::kMaxLabels;
  // Registry lock held. When the leaf pc has no frame record of its own
  // (its CFA is sp-based), the frame-pointer walk skipped its caller: insert
  // the return address found on the stack. `out` must hold frames.size()+1.
  std::span<const uint64_t> RepairLeaf(std::span<const uint64_t> frames,
                                       std::span<const uint64_t> stack_words,
                                       uint64_t* out);
  // The ticker's signal to `slot`'s thread with `tag`.
  void SendProfilingSignal(const ThreadSlotHeader& slot, int tag) const;

  // Most ticks one wake-up of the ticker may stand for (Tick).
  static constexpr size_t kMaxTickBatch = TickerPacing::kMaxTickBatch;

  std::vector<SlotBase*> active_;  // registry lock
  // xorshift64 state for where a registering thread enters active_
  // (registry lock).
  uint64_t insert_rng_ = 0x9E3779B97F4A7C15ULL;
  pid_t start_pid_ = 0;
  // The ticker's pace and CPU budget (Options::wall_cpu_budget; registry
  // lock): Tick widens its interval after a whole round of steady visits
  // (steady_visits), and the visits a tick stay within visit_cap().
  TickerPacing pacing_;
  // Threads that ran (a running sample was drained) and were not visited
  // for a round, visited first at the next tick, ahead of the round robin
  // (registry lock; WallTicker::VisitNext). A thread that registers last
  // among thousands, or while rounds are long, is then on its own stack
  // from its first CPU sample on, not after a whole round.
  std::vector<WallDue> wall_due_;
  // CLOCK_MONOTONIC at the start of the collector's pass (registry lock).
  int64_t drain_now_ns_ = 0;
  // Registry lock held, a running sample of `slot` drained: queues it in
  // wall_due_ when it was not visited for a round.
  void NoteRanLocked(SlotBase* slot) {
    if (slot->wall_due || !shape_.has_ticker ||
        slot->retiring.load(std::memory_order_relaxed)) {
      return;
    }
    if (slot->wall_last_visit_ns != SlotBase::kNeverVisited &&
        drain_now_ns_ - slot->wall_last_visit_ns < kWallDueAfterNs) {
      return;
    }
    slot->wall_due = true;
    wall_due_.push_back(WallDue{slot, slot->generation});
  }
  static constexpr int64_t kWallDueAfterNs = 2'000'000'000;  // a round (kMaxRoundNs)
  std::atomic<uint64_t> wall_visits_deferred_{0};
  std::atomic<uint64_t> wall_unattributed_ns_{0};
  std::atomic<uint64_t> wall_weight_sq_ms2_{0};  // ProfilerStats::wall_weight_sq_ms2
  std::atomic<uint64_t> small_stack_{0};
  std::atomic<uint64_t> wall_running_credits_{0};
  std::atomic<uint64_t> wall_signals_{0};
  // Blocked threads' stacks read without a signal (ReadBlockedStack).
  std::atomic<uint64_t> wall_stacks_read_{0};
  std::atomic<uint64_t> wall_episodes_resampled_{0};
  // Episodes whose first stack was a walk before the tables (registry and
  // aggregate locks: ProfilerCollector<>::AddRecordLocked).
  std::atomic<uint64_t> wall_episodes_provisional_{0};
  // Wall time (ns) of threads with no wall sample that went to the tail
  // frame (Profiler<>::TakeTailOne): where they were could not be read.
  std::atomic<uint64_t> wall_tail_frame_ns_{0};

 private:
  // Registry::Owner. Registry lock held by the caller (`lock`).
  void Unregister(ThreadSlotHeader* header, bool on_owner_thread,
                  std::unique_lock<std::mutex>& lock) override;
  // Registry lock held: takes `slot` out of active_; false if it was not
  // there (unregistered already).
  bool ArmRegisteringLocked(SlotBase* slot, int registering,
                            std::unique_lock<std::mutex>& lock, bool& wake_armer);
  bool RemoveActiveLocked(SlotBase* slot);
  void ForgetDueLocked(SlotBase* slot);
  // False when the slot's last samples could not be drained for want of
  // memory (lost; the slot is not reused).
  bool FinishUnregisterLocked(SlotBase* slot, bool on_owner_thread,
                              bool same_process);
  void ProcessRetiredLocked();
  void ForgetSlotLocked(SlotBase* slot);
  void SetSessionLocked(uint64_t session);
  void RetireLocked(SlotBase* slot, bool reusable);
  void BeginWorkOutsideLock(SlotBase* slot);
  void EndWorkOutsideLock(SlotBase* slot);
  void StartTicker();
  void StopTicker();
  size_t Tick(size_t batch, int64_t scheduled_ns);
  void WakeQuietTicker();
  // Two-step arming (shape_.two_step_arming): RegisterThread queues a
  // prepared slot in arm_queue_ and wakes the armer, whose thread arms the
  // queue in batches (ArmQueued); a slot leaving active_ leaves the queue.
  void ArmQueued();

  // `late`: on the ticker thread, after PrepareThread; a thread that
  // unregistered itself meanwhile (without the registry lock) may be gone,
  // and its arming fail: its preparation stands (its tail takes its CPU).
  void ArmOne(SlotBase* slot, size_t i, uint64_t session, bool late = false);
  // At construction: the event providers' records joined to each window.
  class EventAttachment;
  void AttachEventProviders();
  void FollowRunningSampleLocked(SlotBase* slot, SampleAggregator& agg,
                                 std::span<const uint64_t> frames,
                                 std::span<const uint64_t> label_words, int64_t cpu_ns);

  // Queued unregistrations that a registering thread finishes first.
  static constexpr uint32_t kRetiredForRegistration = 64;

  const Shape shape_;
  // Each provider's value count, in order (RecordView::Read).
  std::vector<size_t> value_counts_;
  // Stop() is waiting for arming outside the lock to end: no new one starts
  // (registry lock).
  bool stopping_ = false;
  size_t arms_in_flight_ = 0;  // registry lock
  std::condition_variable arms_done_;  // arms_in_flight_ fell to 0
  uid_t signal_uid_ = 0;  // getuid() at Start(): the ticker's signals' si_uid
  std::atomic<uint64_t> wall_wakeups_{0};
  std::atomic<uint64_t> threads_sigprof_unblocked_{0};
  std::atomic<bool> sigprof_unblock_logged_{false};
  // Two-step arming. A registering thread leaves its costliest arming to
  // the ticker when more than burst_threads_ other threads are inside
  // RegisterThread with it: alone, a thread's perf event costs it ~5 us to
  // open, and arming it at once keeps the CPU of a thread that lives
  // microseconds on its own stacks (its first sample point may come before
  // any batch); in a burst of 1,000 the same calls cost each ~22 us, each
  // system call absorbing context switches, where the ticker makes them in
  // a row (docs/measurements.md).
  static constexpr int kBurstThreads = 4;
  int burst_threads_ = kBurstThreads;
  std::atomic<int> registering_{0};  // threads inside RegisterThread
  ArmQueue arm_queue_;  // registry lock
  std::atomic<uint64_t> threads_armed_by_sampler_{0};
  WallTickerThread ticker_;
  LeafFrameResolver leaf_resolver_;  // registry lock
  // The handlers' activity count the last full collector pass saw
  // (registry lock).
  uint64_t drained_activity_ = ~uint64_t{0};
  // The unwinder's counter is process-wide; this profiler reports its own.
  const uint64_t walks_without_tables_at_construction_;
};

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_PROFILER_BASE_H_
