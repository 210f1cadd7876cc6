// The Profiler's type-independent half (internal/profiler_base.h).
#include "inprof/internal/profiler_base.h"

#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "inprof/base/contained.h"
#include "inprof/base/fork_guard.h"
#include "inprof/base/log.h"
#include "inprof/base/owned_fd.h"
#include "inprof/base/alloc_guard.h"

namespace inprof::internal {

ProfilerBase::ProfilerBase(Options options, Shape shape)
    : ProfilerCommon(std::move(options), std::move(shape.profile)),
      shape_(std::move(shape)),
      walks_without_tables_at_construction_(
          shape_.walks_without_tables != nullptr ? shape_.walks_without_tables() : 0) {
  registry_->owner = this;
  registry_->defers_retire.store(shape_.defers_retire, std::memory_order_release);
  // A child forked while one of our threads holds these must find them
  // free (base/fork_guard.h).
  RegisterForkLock(&registry_->mutex, kForkRankRegistry);
  pipeline_.RegisterForkLock(kForkRankAggregate);
  for (const ProviderOps& ops : shape_.providers) value_counts_.push_back(ops.value_count);
  AttachEventProviders();
  pipeline_.SetThreadDumper([this] { return DumpThreads(); });
}

ProfilerBase::~ProfilerBase() = default;

void ProfilerBase::Shutdown() {
  Stop().IgnoreError();
  pipeline_.UnregisterForkLock();
  UnregisterForkLock(&registry_->mutex);
  std::lock_guard<std::mutex> lock(registry_->mutex);
  // A thread that checked defers_retire before this queues its slot
  // after: the slot is still in active_ below, and the queue is never
  // read again.
  registry_->defers_retire.store(false, std::memory_order_release);
  ProcessRetiredLocked();
  for (SlotBase* slot : active_) RetireLocked(slot, /*reusable=*/false);
  active_.clear();
  wall_due_.clear();
  registry_->owner = nullptr;
}

absl::Status ProfilerBase::Start() {
  AllocGuard guard;  // inprof's own allocations on the host's thread
  if (!options_.enabled) return absl::OkStatus();
  if (!config_status_.ok()) return config_status_;
  std::lock_guard<std::mutex> lock(registry_->mutex);
  if (running_) return absl::OkStatus();
  ProcessRetiredLocked();
  if (start_pid_ != 0 && getpid() != start_pid_) {
    // Its collector's and sinks' state belongs to the parent.
    return absl::FailedPreconditionError(absl::StrCat(
        "this profiler was started in process ", start_pid_,
        "; a forked child must construct its own Profiler to profile"));
  }
  if (!shape_.unwinder_supported) {
    Log(absl::StrCat(shape_.unwinder,
                     " unwinding is not supported on this architecture; profiling stays off"));
    return absl::OkStatus();
  }
  // Before the attachments are told the sample types: which ones are left
  // out (a provider that is off) is known once the providers are
  // configured.
  if (absl::Status s = ConfigureProviders(); !s.ok()) return s;
  pipeline_.SetOmittedTypes(OmittedSampleTypes());
  // An attachment may take the samples from here on (library mode: a
  // local socket round trip, or profiling stays here; Options). The last
  // session's shared rings (drained, no handler runs) go back before it
  // connects again.
  for (SlotBase* slot : active_) UseOwnRingLocked(slot);
  if (absl::Status s = pipeline_.ConnectAttachments(shape_.ring_layout); !s.ok()) return s;
  for (SlotBase* slot : active_) UseSharedRingLocked(slot);
  // No unwind tables are built here: the collector thread builds them
  // first thing (Drain), so Start() returns in well under a millisecond.
  if (absl::Status s = InstallSignalHandler(); !s.ok()) return s;
  if (const std::string how = DescribeProviders(); !how.empty()) Log(how);
  // A new session per run: signals still queued from the previous run
  // carry the old one in their tag and are ignored.
  const uint64_t previous_session = session_;
  SetSessionLocked(NewSessionId());
  if (absl::Status s = ActivateSession(session_); !s.ok()) {
    SetSessionLocked(previous_session);
    return s;
  }
  running_ = true;
  stopping_ = false;
  start_pid_ = getpid();
  signal_uid_ = getuid();
  pipeline_.BeginWindow();
  for (SlotBase* slot : active_) {
    // One that unregistered meanwhile is finished by the collector.
    if (!slot->retiring.load(std::memory_order_acquire)) {
      slot->wall_last_visit_ns = SlotBase::kNeverVisited;  // of an earlier session
      ArmProviders(slot, session_);
    }
  }
  if (absl::Status s = StartEventProviders(); !s.ok()) Log(s.message());
  pipeline_.SetEngineDetail(DescribeProviders());
  // Each window's last wall visits at its edge (WallTickerThread::TickNow):
  // 50 ms at most, a window is not held up by a late ticker.
  pipeline_.StartCollector([this] { Drain(); }, [this] { return stats(); },
                           [this] { ticker_.TickNow(absl::Milliseconds(50)); });
  StartTicker();
  return absl::OkStatus();
}

absl::Status ProfilerBase::Stop() {
  AllocGuard guard;  // inprof's own allocations on the host's thread
  if (!running_) return absl::OkStatus();
  if (getpid() != start_pid_) {
    StopEventProviders(/*forked_child=*/true);
    // A forked child: the registry lock is free (base/fork_guard.h).
    {
      std::lock_guard<std::mutex> lock(registry_->mutex);
      for (SlotBase* slot : active_) ForgetSlotLocked(slot);
      active_.clear();
      wall_due_.clear();
      arm_queue_.Clear();
      DeactivateSession(session_);
      running_ = false;
    }
    pipeline_.AbandonCollector();
    StopTicker();
    return absl::OkStatus();
  }
  // No event is recorded from here on; the last window takes those that were.
  StopEventProviders(/*forked_child=*/false);
  // The last wall visits, as at a window's edge: the threads' time since
  // the ticker's last wake-up is handed out now (it was lost: up to a
  // jittered batch of quiet periods, 12.6 ms of a 0.3 s program at 10 ms,
  // GperftoolsTest.WallTimeOnlyWhenInprofWallPeriodAsksForIt).
  ticker_.TickNow(absl::Milliseconds(50));
  StopTicker();  // before taking the registry lock: Tick() takes it
  {
    std::unique_lock<std::mutex> lock(registry_->mutex);
    if (!running_) return absl::OkStatus();
    // Threads arming or disarming outside the lock finish first; none
    // starts from now on.
    stopping_ = true;
    arms_done_.wait(lock, [this] { return arms_in_flight_ == 0; });
    if (!running_) return absl::OkStatus();  // another Stop() was first
    // Prepared threads the ticker did not arm: DisarmLocked forgets their
    // preparation, their tails take their points.
    arm_queue_.Clear();
    ProcessRetiredLocked();
    // The threads' waits since the last wake-up (the one above, unless the
    // ticker was late for it) count as waits between visits (the
    // comments' longest).
    pacing_.Stop(WallTimeProvider::NowNanos());
    for (SlotBase* slot : active_) {
      slot->ticker_own_account = false;
      DisarmLocked(slot);
    }
    DeactivateSession(session_);
    // What allocates from here on is contained (base/contained.h): with
    // the heap exhausted Stop() still stops (no exception reaches the
    // host: ScopedProfiler calls it from a destructor); what could not be
    // drained or written is lost, counted and said once.
    for (SlotBase* slot : active_) {
      WaitForHandler(*slot);
      RunContained("a thread's last drain at Stop()", [&] {
        DrainSlotLocked(slot);  // the newest stacks, for the tails
        TakeTailsLocked(slot);
      });
    }
    running_ = false;
    RunContained("describing the engines at Stop()",
                 [&] { pipeline_.SetEngineDetail(DescribeProviders()); });
  }
  pipeline_.StopCollector();
  // No table is needed any more: sampling is off.
  RunContained("the last drain at Stop()", [&] { DrainRings(); });
  // A status without a message allocates nothing.
  absl::Status status(absl::StatusCode::kResourceExhausted, "");
  RunContained("writing the profile at Stop()", [&] {
    status = pipeline_.Export(stats());
    if (!status.ok()) Log(status.message());
  });
  if (status.ok()) ++profiles_written_;
  EndFileThread();  // a stopped profiler leaves no thread of inprof's
  return status;
}

ThreadRegistration ProfilerBase::RegisterThread(absl::string_view name) {
  AllocGuard guard;  // inprof's own allocations on the host's thread
  if (!options_.enabled) return ThreadRegistration();
  // How many register at this moment (two-step arming).
  const int registering = registering_.fetch_add(1, std::memory_order_relaxed);
  struct Leave {
    std::atomic<int>& count;
    ~Leave() { count.fetch_sub(1, std::memory_order_relaxed); }
  } leave{registering_};
  if (CurrentThreadSlot() != nullptr && CurrentThreadSlot()->session.load() != 0) {
    return ThreadRegistration(absl::AlreadyExistsError(absl::StrCat(
        "thread '", name, "' is already registered with a profiler")));
  }
  // With the heap exhausted (a program registering a thread while short of
  // memory; its std::thread would end in std::terminate), the
  // registration fails with a status that allocates nothing: no message.
  const absl::Status no_memory(absl::StatusCode::kResourceExhausted, "");
  absl::StatusOr<CurrentThreadInfo> info = no_memory;
  try {
    info = DescribeCurrentThread();
  } catch (const std::bad_alloc&) {
    registry_->without_memory.fetch_add(1, std::memory_order_relaxed);
    return ThreadRegistration(no_memory);
  }
  if (!info.ok()) {
    Log(absl::StrCat("cannot register thread '", name,
                     "': ", info.status().message()));
    return ThreadRegistration(info.status());
  }
  if (UnblockProfilingSignalInThisThread()) {
    threads_sigprof_unblocked_.fetch_add(1, std::memory_order_relaxed);
    if (!sigprof_unblock_logged_.exchange(true)) {
      Log(absl::StrCat(
          "thread '", name,
          "' registered with SIGPROF blocked in its signal mask (often "
          "inherited from the thread that created it); unblocked it, since "
          "a thread that blocks SIGPROF cannot be sampled (said once; the "
          "profile's comments count such threads)"));
    }
  }
  SlotBase* slot = nullptr;
  try {
    slot = AcquireSlot();
    slot->name.assign(name.data(), name.size());
  } catch (const std::bad_alloc&) {
    if (slot != nullptr) ReleaseSlot(slot);  // allocates nothing
    registry_->without_memory.fetch_add(1, std::memory_order_relaxed);
    return ThreadRegistration(no_memory);
  }
  slot->tid = info->tid;
  slot->cpu_clock = info->cpu_clock;
  slot->stack = info->stack;
  slot->max_frames = options_.max_frames;
  slot->has_aggregate_thread = false;
  slot->label_count = 0;
  slot->last_stack.clear();
  slot->last_labels.clear();
  slot->blocked_stack.clear();
  slot->blocked_labels.clear();
  slot->blocked_provisional = false;
  slot->blocked_resampled = false;
  slot->blocked_stackless = false;
  slot->unreadable_site = SyscallSite{};
  slot->wall_last_visit_ns = SlotBase::kNeverVisited;
  slot->wall_due = false;
  slot->ticker_own_account = false;
  slot->running_stack.clear();
  slot->running_labels.clear();
  ClearProviderHistory(slot);
  slot->handler_exit_clock.store(-1, std::memory_order_relaxed);
  slot->retiring.store(false, std::memory_order_relaxed);
  slot->exit_cpu_ns.store(-1, std::memory_order_relaxed);
  slot->exit_wall_ns.store(-1, std::memory_order_relaxed);
  ++slot->generation;
  std::unique_lock<std::mutex> lock(registry_->mutex);
  // Room for the slot in the registry's table before anything changes: a
  // registration that cannot have it ends as if it never began.
  if (active_.size() == active_.capacity()) {
    try {
      active_.reserve(std::max<size_t>(16, 2 * active_.size()));
    } catch (const std::bad_alloc&) {
      lock.unlock();
      ReleaseSlot(slot);
      registry_->without_memory.fetch_add(1, std::memory_order_relaxed);
      return ThreadRegistration(no_memory);
    }
  }
  // Many threads that ended while the lock was taken and are not finished
  // yet (the collector does that every collect_period): their slots go
  // back to the pool now, so that a program that keeps starting threads
  // does not keep allocating new ones. Not for fewer: that work would be
  // this thread's CPU before it is sampled.
  if (registry_->retired_count.load(std::memory_order_relaxed) >=
      kRetiredForRegistration) {
    ProcessRetiredLocked();
  }
  slot->session.store(session_, std::memory_order_release);
  SetCurrentThreadSlot(slot);
  slot->counted_since_ns = WallTimeProvider::NowNanos();
  pacing_.CountThreads(slot->counted_since_ns, active_.size());
  active_.push_back(slot);
  // At a random place in the wall sampler's round robin: its first visit
  // then comes after a uniformly random part of a round, which is what the
  // first visit's weight (a round, WallTimeProvider::VisitThread) assumes.
  // Appended, the threads of a burst were visited soon after registering
  // while the cursor was near the end: 64 threads registered at once and
  // joined 1.2 s later were credited 12% more than their lifetimes. The
  // thread it swaps with moves to the end: a visit interval longer or
  // shorter once, which its visits' weights follow.
  if (active_.size() > 1) {
    insert_rng_ ^= insert_rng_ << 13;
    insert_rng_ ^= insert_rng_ >> 7;
    insert_rng_ ^= insert_rng_ << 17;
    std::swap(active_.back(), active_[insert_rng_ % active_.size()]);
  }
  bool wake_armer = false;
  if (running_ && !stopping_ && getpid() == start_pid_ &&
      !ArmRegisteringLocked(slot, registering, lock, wake_armer)) {
    // The heap ran out while arming (a provider's system call failed and
    // its message could not be made, a shared ring area could not grow):
    // the registration is undone, as one that never began.
    lock.unlock();
    registry_->without_memory.fetch_add(1, std::memory_order_relaxed);
    return ThreadRegistration(no_memory);
  }
  ++threads_registered_;
  const bool ticking = running_ && !stopping_;
  lock.unlock();
  if (wake_armer) ticker_.WakeToArm();
  if (ticking) WakeQuietTicker();
  return ThreadRegistration(registry_, slot, info->tid);
}

// Registry lock held (`lock`), the profiler running: `slot`, just added to
// active_, armed or queued for the ticker's armer (`wake_armer`). False
// when an allocation failed on the way; the slot has then left the
// registry (its arming undone, its TLS pointer cleared).
bool ProfilerBase::ArmRegisteringLocked(SlotBase* slot, int registering,
                                        std::unique_lock<std::mutex>& lock,
                                        bool& wake_armer) {
  try {
    UseSharedRingLocked(slot);
    const uint64_t session = session_;
    if (shape_.two_step_arming &&
        std::max(registering, registering_.load(std::memory_order_relaxed) - 1) >=
            burst_threads_ &&
        ticker_.armer_ready() &&
        PrepareProviders(slot, session)) {
      // In a burst: the ticker's armer opens its perf event (ArmQueued).
      arm_queue_.Push(slot);
      wake_armer = true;
    } else if (shape_.arms_outside_lock) {
      // The engines' system calls (perf_event_open, fcntl) without the
      // lock that every other registering thread, the collector and the
      // ticker wait for.
      BeginWorkOutsideLock(slot);
      lock.unlock();
      ArmProviders(slot, session);
      lock.lock();
      EndWorkOutsideLock(slot);
    } else {
      ArmProviders(slot, session);
    }
    return true;
  } catch (const std::bad_alloc&) {
    if (!lock.owns_lock()) lock.lock();
    if (slot->arm_in_flight) EndWorkOutsideLock(slot);
    wake_armer = false;
    if (RemoveActiveLocked(slot)) FinishUnregisterLocked(slot, /*on_owner_thread=*/true, true);
    return false;
  }
}

bool ProfilerBase::SetThreadName(pid_t tid, absl::string_view name) {
  AllocGuard guard;  // inprof's own allocations on the host's thread
  std::lock_guard<std::mutex> lock(registry_->mutex);
  for (SlotBase* slot : active_) {
    // A retiring thread may be gone, and its id reused.
    if (slot->tid != tid || slot->retiring.load(std::memory_order_acquire)) continue;
    slot->name = std::string(name);
    if (slot->has_aggregate_thread) {
      Pipeline::Ingesting ingest = pipeline_.Ingest();
      ingest.aggregator().SetThreadName(slot->aggregate_thread, name);
    }
    return true;
  }
  return false;
}

ProfilerStats ProfilerBase::stats() const {
  ProfilerStats s;
  AddCommonStats(s);
  s.samples_small_stack = small_stack_.load(std::memory_order_relaxed);
  if (shape_.walks_without_tables != nullptr) {
    s.stacks_before_tables =
        shape_.walks_without_tables() - walks_without_tables_at_construction_;
  }
  s.blocked_episodes_resampled =
      wall_episodes_resampled_.load(std::memory_order_relaxed);
  s.blocked_episodes_provisional =
      wall_episodes_provisional_.load(std::memory_order_relaxed);
  s.wall_signals = wall_signals_.load(std::memory_order_relaxed);
  s.wall_stacks_read = wall_stacks_read_.load(std::memory_order_relaxed);
  s.wall_running_credits = wall_running_credits_.load(std::memory_order_relaxed);
  s.wall_wakeups = wall_wakeups_.load(std::memory_order_relaxed);
  s.wall_visits = pacing_.total_visits();
  s.wall_visits_deferred = wall_visits_deferred_.load(std::memory_order_relaxed);
  s.wall_unattributed_ns = wall_unattributed_ns_.load(std::memory_order_relaxed);
  s.threads_sigprof_unblocked =
      threads_sigprof_unblocked_.load(std::memory_order_relaxed);
  s.wall_tail_frame_ns = wall_tail_frame_ns_.load(std::memory_order_relaxed);
  s.wall_longest_round_ns = pacing_.longest_round_ns();
  s.wall_weight_sq_ms2 = wall_weight_sq_ms2_.load(std::memory_order_relaxed);
  s.threads_armed_by_sampler =
      threads_armed_by_sampler_.load(std::memory_order_relaxed);
  s.registrations_without_memory = registry_->without_memory.load(std::memory_order_relaxed);
  return s;
}

void ProfilerBase::CreditSyntheticLocked(SlotBase* slot, size_t value_offset,
                                         std::span<const int64_t> values,
                                         const char* frame) {
  Pipeline::Ingesting ingest = pipeline_.Ingest();
  SampleAggregator& agg = ingest.aggregator();
  EnsureAggregateThread(slot, agg);
  agg.AddSynthetic(slot->aggregate_thread, frame, value_offset, values);
}

void ProfilerBase::CreditBlockedLocked(SlotBase* slot, size_t value_offset,
                                       std::span<const int64_t> values) {
  Pipeline::Ingesting ingest = pipeline_.Ingest();
  SampleAggregator& agg = ingest.aggregator();
  EnsureAggregateThread(slot, agg);
  if (slot->blocked_stackless) {
    agg.AddSynthetic(slot->aggregate_thread, kSmallStackFrame, value_offset, values);
  } else {
    agg.Add(slot->aggregate_thread, slot->blocked_stack, slot->blocked_labels,
            value_offset, values);
  }
}

void ProfilerBase::DrainSlotLocked(SlotBase* slot) {
  Pipeline::Ingesting ingest = pipeline_.Ingest();
  DrainSlotIntoLocked(slot, ingest.aggregator());
}

// When no handler has run since the last pass (idle threads), the slots
// are not visited: with 1,000 registered threads that walk over their
// rings was most of the collector's CPU.
bool ProfilerBase::DrainRings() {
  std::lock_guard<std::mutex> lock(registry_->mutex);
  drain_now_ns_ = WallTimeProvider::NowNanos();
  ProcessRetiredLocked();
  RefreshLeafResolverLocked();
  // Read before draining: what is pushed meanwhile is drained next pass.
  const uint64_t activity = shape_.activity->load(std::memory_order_acquire);
  if (activity != drained_activity_) {
    drained_activity_ = activity;
    Pipeline::Ingesting ingest = pipeline_.Ingest();
    SampleAggregator& agg = ingest.aggregator();
    if (shape_.pending != nullptr && !shape_.pending->overflowed()) {
      // Only the slots that left something since the last pass.
      shape_.pending->TakeEach([&](ThreadSlotHeader* header) {
        SlotBase* slot = static_cast<SlotBase*>(header);
        const uint64_t session = slot->session.load(std::memory_order_acquire);
        if (session == session_ && session != 0) {
          if (!DrainSlotIntoLocked(slot, agg)) {
            // Records left behind: the next pass visits the slot again.
            MarkPending(*slot);
            drained_activity_ = ~uint64_t{0};
          }
        } else if (session != 0) {
          // Another profiler of the same template's types (each takes the
          // bits of both): left for it, and a pass of its own.
          MarkPending(*slot);
          shape_.activity->fetch_add(1, std::memory_order_release);
        }
        // Session 0: a free slot, or one unregistering, which drains
        // itself (FinishUnregisterLocked).
      });
    } else {
      for (SlotBase* slot : active_) {
        // Records left behind: the next pass visits the rings again.
        if (!DrainSlotIntoLocked(slot, agg)) drained_activity_ = ~uint64_t{0};
      }
    }
  }
  return running_;
}

std::span<const uint64_t> ProfilerBase::RepairLeaf(
    std::span<const uint64_t> frames, std::span<const uint64_t> stack_words,
    uint64_t* out) {
  const int slot = leaf_resolver_.ReturnAddressSlot(frames[0]);
  if (slot < 0 || static_cast<size_t>(slot) >= stack_words.size()) {
    return frames;
  }
  const uint64_t caller = stack_words[static_cast<size_t>(slot)];
  if (caller == 0 || (frames.size() > 1 && frames[1] == caller) ||
      !leaf_resolver_.InModule(caller)) {
    return frames;
  }
  out[0] = frames[0];
  out[1] = caller;
  std::copy(frames.begin() + 1, frames.end(), out + 2);
  return std::span<const uint64_t>(out, frames.size() + 1);
}

// Only the ticker sends it, and only in the process that started the
// profiler (a forked child has no ticker), so the pid and uid are those
// Start() saw: one system call per signal, not four (getpid twice and
// getuid are real system calls in glibc 2.36).
void ProfilerBase::SendProfilingSignal(const ThreadSlotHeader& slot, int tag) const {
  siginfo_t info;
  std::memset(&info, 0, sizeof(info));
  info.si_signo = kProfilingSignal;
  info.si_code = SI_QUEUE;
  info.si_pid = start_pid_;
  info.si_uid = signal_uid_;
  info.si_value.sival_int = tag;
  // rt_tgsigqueueinfo: the same delivery a timer's SIGEV_THREAD_ID gives,
  // with our tag in si_value; ESRCH (thread gone) is harmless.
  syscall(SYS_rt_tgsigqueueinfo, start_pid_, slot.tid, kProfilingSignal, &info);
}

void ProfilerBase::Unregister(ThreadSlotHeader* header, bool on_owner_thread,
                              std::unique_lock<std::mutex>& lock) {
  SlotBase* slot = static_cast<SlotBase*>(header);
  if (!RemoveActiveLocked(slot)) return;
  const bool same_process = start_pid_ == 0 || getpid() == start_pid_;
  if (!same_process) {
    ForgetSlotLocked(slot);  // a forked child
    return;
  }
  if (shape_.arms_outside_lock && running_) {
    // A thread that ended: its wall tail now, while the time it was
    // counted until is the window's (TickerPacing::Ended), not once it
    // has the lock again -- in a burst of exits that came after the next
    // export window's edge, and a window held 4.3x its threads' time in
    // it (the tail of a thread whose handler interrupts this takes what
    // the handler left; the handler then finds nothing owed).
    if (on_owner_thread && slot->exit_wall_ns.load(std::memory_order_relaxed) >= 0) {
      try {
        DrainSlotLocked(slot);
        TakeTailsLocked(slot, /*ticking_only=*/true);
      } catch (const std::bad_alloc&) {
      }
    }
    // close() of a perf event is the costliest call here: without the
    // lock. The slot is out of active_, so only Stop() (which waits for
    // this) could otherwise touch it.
    BeginWorkOutsideLock(slot);
    lock.unlock();
    DisarmLocked(slot);
    lock.lock();
    EndWorkOutsideLock(slot);
  }
  if (!FinishUnregisterLocked(slot, on_owner_thread, same_process)) {
    registry_->without_memory.fetch_add(1, std::memory_order_relaxed);
  }
}

bool ProfilerBase::RemoveActiveLocked(SlotBase* slot) {
  auto it = std::find(active_.begin(), active_.end(), slot);
  if (it == active_.end()) return false;
  const int64_t now = WallTimeProvider::NowNanos();
  pacing_.CountThreads(now, active_.size());
  // A thread that ended: its time since the last wake-up is its tail's
  // (WallTimeProvider::TakeTail), not the next wake-up's to hand out. One
  // that keeps its own account was out of the count.
  if (slot->ticker_own_account) {
    slot->ticker_own_account = false;
    pacing_.LeaveOwnAccount();
  } else if (slot->exit_wall_ns.load(std::memory_order_relaxed) >= 0) {
    pacing_.Ended(now, slot->counted_since_ns);
  }
  active_.erase(it);
  ForgetDueLocked(slot);
  arm_queue_.Forget(slot);
  return true;
}

// The armer thread: arms the queued slots, ArmQueue::kBatch per hold of
// the registry lock (a registering thread waits for it meanwhile, asleep),
// until the queue is empty. A slot that left active_ left the queue; one
// whose thread is retiring is skipped (its tail takes its points).
void ProfilerBase::ArmQueued() {
  for (;;) {
    std::lock_guard<std::mutex> lock(registry_->mutex);
    if (!running_ || stopping_) {
      arm_queue_.Clear();
      return;
    }
    if (arm_queue_.empty()) return;
    arm_queue_.ArmBatch([this](SlotBase* slot) {
      ArmPreparedProviders(slot, session_);
      threads_armed_by_sampler_.fetch_add(1, std::memory_order_relaxed);
    });
  }
}

// Registry lock held: `slot` out of the wall ticker's due list. Once the
// slot is back in the pool a registering thread rewrites it without the
// registry lock, so no entry may outlive its place in active_ or its
// retirement (its last drain may queue it after it left active_).
void ProfilerBase::ForgetDueLocked(SlotBase* slot) {
  if (!slot->wall_due) return;
  std::erase_if(wall_due_, [slot](const WallDue& d) { return d.slot == slot; });
  slot->wall_due = false;
}

// Registry lock held; `slot` is out of active_ (Unregister, or a slot its
// thread queued: ProcessRetiredLocked).
bool ProfilerBase::FinishUnregisterLocked(SlotBase* slot, bool on_owner_thread,
                                          bool same_process) {
  DisarmLocked(slot);  // a no-op once disarmed
  // A handler cannot be running on this thread while we are here; on
  // another thread it may be, so clear the session and wait it out.
  slot->session.store(0, std::memory_order_seq_cst);
  WaitForHandler(*slot);
  if (on_owner_thread && CurrentThreadSlot() == slot) {
    SetCurrentThreadSlot(nullptr);
  }
  bool drained = true;
  if (same_process) {
    // The drain and the tails allocate (a stack the aggregate has not
    // seen). With the heap exhausted the thread's last samples are lost,
    // counted, and the unregistration still completes.
    try {
      RefreshLeafResolverLocked();
      DrainSlotLocked(slot);  // first: the tail goes to the newest stack
      TakeTailsLocked(slot);
    } catch (const std::bad_alloc&) {
      drained = false;
    }
    if (slot->has_aggregate_thread) {
      slot->has_aggregate_thread = false;
      // Its entry in the thread table is reused after the next export
      // (without memory for that list, it stays: one entry).
      Pipeline::Ingesting ingest = pipeline_.Ingest();
      try {
        ingest.aggregator().RemoveThread(slot->aggregate_thread);
      } catch (const std::bad_alloc&) {
      }
    }
  }
  // A slot unregistered from another thread may still be the owner's TLS
  // slot: never reuse it, so that thread can never push into a new owner's
  // ring. Nor one whose ring may still hold records: they would be drained
  // as the next owner's.
  RetireLocked(slot, /*reusable=*/on_owner_thread && drained);
  return drained;
}

// Registry lock held: finishes the unregistrations threads queued (when
// every provider can be disarmed and its tail taken after the thread is
// gone, threads unregister themselves without the registry lock:
// ThreadRegistration::Reset; their TLS pointer is cleared, so their slots
// go back to the pool). Called by the collector at each pass, by
// RegisterThread, Start, Stop and the destructor.
void ProfilerBase::ProcessRetiredLocked() {
  if (!shape_.defers_retire) return;
  ThreadSlotHeader* next = registry_->TakeRetired();
  if (next == nullptr) return;
  const bool same_process = start_pid_ == 0 || getpid() == start_pid_;
  while (next != nullptr) {
    SlotBase* slot = static_cast<SlotBase*>(next);
    next = next->next_retired;
    // Not in active_: a forked child forgot it, or the destructor retired
    // it already.
    if (!RemoveActiveLocked(slot)) continue;
    if (!same_process) {
      ForgetSlotLocked(slot);
      continue;
    }
    if (!FinishUnregisterLocked(slot, /*on_owner_thread=*/true, same_process)) {
      registry_->without_memory.fetch_add(1, std::memory_order_relaxed);
    }
  }
}

// Registry lock held, in a forked child of the process that started the
// profiler. The parent's timers, threads and collector do not exist here:
// forget the slot's per-provider state without deleting any timer (its id
// may now name one of the child's own), take no tail, never reuse it.
void ProfilerBase::ForgetSlotLocked(SlotBase* slot) {
  slot->session.store(0, std::memory_order_seq_cst);
  ForgetProviderStateLocked(slot);
  if (CurrentThreadSlot() == slot) SetCurrentThreadSlot(nullptr);
}

// Registry lock held: the profiler and its registered slots take `session`.
void ProfilerBase::SetSessionLocked(uint64_t session) {
  session_ = session;
  for (SlotBase* slot : active_) {
    slot->session.store(session_, std::memory_order_release);
  }
}

void ProfilerBase::RetireLocked(SlotBase* slot, bool reusable) {
  ForgetDueLocked(slot);
  DisarmLocked(slot);
  slot->session.store(0, std::memory_order_seq_cst);
  WaitForHandler(*slot);
  if (start_pid_ == 0 || getpid() == start_pid_) UseOwnRingLocked(slot);
  if (reusable) ReleaseSlot(slot);
}

// Registry lock held. Marks the slot's arming or disarming as under way
// outside the lock: Stop() and the destructor wait for it to end, the
// ticker skips the slot.
void ProfilerBase::BeginWorkOutsideLock(SlotBase* slot) {
  slot->arm_in_flight = true;
  ++arms_in_flight_;
}

// Registry lock held again.
void ProfilerBase::EndWorkOutsideLock(SlotBase* slot) {
  slot->arm_in_flight = false;
  if (--arms_in_flight_ == 0) arms_done_.notify_all();
}

// The ticker thread ("inprof-tick", WallTickerThread): drives providers
// that model TicksThreads (wall time).
void ProfilerBase::StartTicker() {
  if (!shape_.has_ticker) return;
  const absl::Duration period = TickerPeriod();
  if (period == absl::InfiniteDuration()) return;
  // A new thread, a new CPU clock: its cost per visit is measured again
  // (registry lock held by Start()).
  pacing_.Restart(absl::ToInt64Nanoseconds(period), WallTimeProvider::NowNanos());
  ticker_.Start(
      period, pacing_,
      [this](size_t batch, int64_t scheduled_ns) { return Tick(batch, scheduled_ns); },
      [this] { ArmQueued(); });
}

void ProfilerBase::StopTicker() { ticker_.Stop(/*in_forked_child=*/getpid() != start_pid_); }

// One wake-up of the ticker standing for `batch` ticks, meant for
// `scheduled_ns` (CLOCK_MONOTONIC; TickTime says why that matters);
// returns the batch for the next one.
//
// With many threads, a wake-up every period visiting ThreadsPerTick()
// threads costs mostly the wake-up itself; waking every k periods and
// visiting k times as many threads keeps each thread's revisit interval
// (and so the wall profile) the same. k is at most the number of ticks a
// full round of the threads takes (kMaxTickBatch at most), so with
// ThreadsPerTick() threads or fewer nothing changes.
size_t ProfilerBase::Tick(size_t batch, int64_t scheduled_ns) {
  std::lock_guard<std::mutex> lock(registry_->mutex);
  if (!running_) return 1;
  wall_wakeups_.fetch_add(1, std::memory_order_relaxed);
  const int64_t now = WallTimeProvider::NowNanos();
  TickTime when{now, std::min(scheduled_ns, now)};
  when.pace = pacing_.WakeUp(now, batch);
  // Threads that ended and queued their unregistration (a burst of exits:
  // the lock was taken) are not handed time: their tails weigh their ends
  // (WallTimeProvider::TakeTail), and visited now they have no stack to
  // take it (4,391 of 10,000 threads queued at one wake-up, 1,724
  // thread-seconds unattributed). The queue is only read: the collector
  // finishes them, in the process's descriptor table (the ticker has its
  // own: their descriptors closed here would stay open).
  // Only those that ended before `now`: one that ended after it (this
  // thread was preempted between reading the clock and the queue) lived
  // through the interval, and its tail counts from this wake-up
  // (WallTimeProvider::EndedShare). Nor those that keep their own account:
  // out of the count already.
  pacing_.CountThreads(now, active_.size());
  for (ThreadSlotHeader* h = registry_->retired.load(std::memory_order_acquire); h != nullptr;
       h = h->next_retired) {
    const SlotBase* retired = static_cast<SlotBase*>(h);
    if (retired->ticker_own_account || h->exit_wall_ns.load(std::memory_order_relaxed) > now) {
      continue;
    }
    pacing_.Ended(now, retired->counted_since_ns);
  }
  when.thread_ns = pacing_.ThreadTime(now, active_.size());
  // The visits a tick within Options::wall_cpu_budget, from the ticker
  // thread's CPU since the last wake-up.
  pacing_.MeasureCpu(ThreadCpuNanos(CLOCK_THREAD_CPUTIME_ID),
                     options_.wall_cpu_budget / 100.0, now, active_.size());
  size_t next = kMaxTickBatch;
  TickProvidersLocked(when, batch, next);
  for (const WallDue& due : wall_due_) {
    if (due.slot->generation == due.generation) due.slot->wall_due = false;
  }
  wall_due_.clear();
  // A whole round of steady visits (every thread followed, or blocked
  // without having run): the next wake-up comes later; anything new brings
  // the base period back.
  pacing_.EndWakeUp(active_.size(), next);
  return pacing_.BatchWhenStretched(next);
}

// After a thread registers: the ticker, if waiting long, is brought back
// to the base period (registry lock not held).
void ProfilerBase::WakeQuietTicker() {
  if (!shape_.has_ticker) return;
  if (pacing_.Unquiet()) ticker_.Replan();
}

}  // namespace inprof::internal
