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

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/random/distributions.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "inprof/cpu_time_provider.h"
#include "inprof/frame_pointer_unwinder.h"
#include "inprof/internal/agent_stream.h"
#include "inprof/internal/fork_guard.h"
#include "inprof/internal/label_table.h"
#include "inprof/internal/leaf_frame_resolver.h"
#include "inprof/internal/log.h"
#include "inprof/internal/profiler_control.h"
#include "inprof/internal/profiler_core.h"
#include "inprof/internal/provider_set.h"
#include "inprof/internal/sample_record.h"
#include "inprof/internal/signal_dispatch.h"
#include "inprof/internal/thread_info.h"
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
class Profiler final : public internal::ProfilerControl,
                       private internal::Registry::Owner {
  // Where each provider's values sit (internal/provider_set.h).
  using Set = internal::ProviderSet<Ps...>;
  static constexpr size_t kNumProviders = Set::kNumProviders;
  static constexpr std::array<size_t, kNumProviders> kValueCounts = Set::kValueCounts;
  static constexpr std::array<size_t, kNumProviders> kValueOffsets = Set::kValueOffsets;
  static constexpr size_t kNumValues = Set::kNumValues;
  static constexpr size_t kMaxValuesPerProvider = Set::kMaxValuesPerProvider;
  // Providers whose samples are taken while the thread runs
  // (sample_provider.h: SamplesRunningThreads).
  static constexpr std::array<bool, kNumProviders> kSamplesRunning{
      SamplesRunningThreads<Ps>...};
  static constexpr bool kHasRunningSampler = (SamplesRunningThreads<Ps> || ...);
  static constexpr size_t kMaxFrames = 512;  // the seed's limit
  static constexpr size_t kLeafWords = [] {
    if constexpr (CopiesLeafStack<U>) {
      return U::kLeafStackWords;
    } else {
      return size_t{0};
    }
  }();
  static_assert(kLeafWords <= internal::LeafFrameResolver::kStackWords);
  // Record layout: internal/sample_record.h.
  using RecordMeta = internal::RecordMeta;
  static constexpr uint64_t kWalkGenerationMask = RecordMeta::kGenerationMask;
  static constexpr size_t kMaxLabelWords =
      2 * internal::ThreadSlotHeader::kMaxLabels;
  static constexpr size_t kHeaderWords =
      1 + kMaxValuesPerProvider + kLeafWords + kMaxLabelWords;
  static constexpr size_t kMaxRecordWords =
      kHeaderWords + kMaxFrames < R::max_record_words()
          ? kHeaderWords + kMaxFrames
          : R::max_record_words();
  static_assert(kMaxRecordWords > kHeaderWords,
                "ring records too small for a sample");

  // A registered thread. Derives from the header the signal handler reads.
  struct alignas(kCacheLine) Slot : internal::ThreadSlotHeader {
    std::tuple<typename Ps::ThreadData...> data;
    // Values of samples dropped because the ring was full, per sample type.
    std::array<std::atomic<int64_t>, kNumValues> dropped_values{};
    int max_frames = static_cast<int>(kMaxFrames);
    // Collector-owned (registry lock held).
    std::string name;
    // The newest stack and labels drained for the thread: where a blocked
    // thread still is (wall time credits it without a signal).
    std::vector<uint64_t> last_stack;
    std::vector<uint64_t> last_labels;
    // Per provider: the newest stack drained for it and its canonical
    // labels. What the provider measured after that sample (TakeTail) is
    // credited there: a thread's last moments were spent near it.
    std::array<std::vector<uint64_t>, kNumProviders> provider_last_stack;
    std::array<std::vector<uint64_t>, kNumProviders> provider_last_labels;
    // The stack (and canonical labels, "blocked" among them) of the current
    // blocking episode, from the sample taken when it began; empty when the
    // thread is not known to be blocked.
    std::vector<uint64_t> blocked_stack;
    std::vector<uint64_t> blocked_labels;
    // Samples taken of the thread by providers that SamplesRunningThreads
    // (its handler writes, after the record's push; the ticker reads), the
    // count at each ticking provider's last visit (ticker), and the newest
    // such stack drained, with its canonical labels: a wall visit to a
    // thread that ran throughout credits the interval there.
    std::atomic<uint32_t> running_samples{0};
    std::array<uint32_t, kNumProviders> running_samples_at_visit{};
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
    uint32_t aggregate_thread = 0;
    bool has_aggregate_thread = false;
    // Its providers are being armed or disarmed outside the registry lock:
    // the ticker leaves it alone meanwhile.
    bool arm_in_flight = false;
    // Where a copy of the thread's stack last failed to walk (ticker,
    // registry lock; ReadBlockedStack): signalled there instead.
    internal::SyscallSite unreadable_site;
    uint64_t seen_taken = 0, seen_dropped = 0, seen_truncated = 0,
             seen_small_stack = 0;
    R ring;
    // The ring its handler writes: `ring`, or in library mode one in the
    // agent's shared region (so that a process that dies loses nothing its
    // handlers wrote). Switched only while no handler can run for the slot.
    R* active_ring = &ring;
  };

 public:
  using unwinder_type = U;
  using ring_type = R;

  // The stack SampleThread may use below the first-level handler's frame:
  // its record (kMaxRecordWords words), the rest of its frame with the
  // providers' OnSignal and the clock reads (2 KiB: 280 and 96 bytes at
  // -O2, GCC 12 -fstack-usage; the rest for other compilers and flags),
  // and the unwinder's walk. A sanitizer's redzones triple it (ASan at
  // -O0: 8.5 and 12 KiB measured), -O0 alone doubles it. A signal that
  // finds less of the thread's own stack is sampled without a stack
  // (SampleStackless): tests/safety/safety_small_stack_test.cc measures the
  // handler against it.
  static constexpr size_t kHandlerStackBytes =
      (sizeof(uint64_t) * kMaxRecordWords + 2048 +
       [] {
         if constexpr (DeclaresStackUse<U>) {
           return static_cast<size_t>(U::kMaxStackBytes);
         } else {
           return kUndeclaredUnwinderStackBytes;
         }
       }()) *
      (internal::kUnderSanitizer ? 3 : internal::kUnoptimized ? 2 : 1);
  // Where a sample of a thread on a stack too small for the walk puts its
  // values (the profile's comments count them).
  static constexpr const char* kSmallStackFrame =
      "[inprof: on a small or foreign stack]";

  // Validates `options`; an invalid option is logged and the profiler stays
  // disabled (Start() returns the error).
  explicit Profiler(Options options = Options::FromEnv())
      : options_(std::move(options)),
        core_(options_, SampleTypes(), PeriodType(), PeriodOf<0>(), Engine()) {
    config_status_ = options_.Validate();
    if (!config_status_.ok()) internal::Log(config_status_.message());
    registry_->owner = this;
    registry_->defers_retire.store(kDefersRetire, std::memory_order_release);
    // A child forked while one of our threads holds these must find them
    // free (internal/fork_guard.h).
    internal::RegisterForkLock(&registry_->mutex, internal::kForkRankRegistry);
    internal::RegisterForkLock(&core_.mutex(), internal::kForkRankAggregate);
  }

  ~Profiler() {
    Stop().IgnoreError();
    internal::UnregisterForkLock(&core_.mutex());
    internal::UnregisterForkLock(&registry_->mutex);
    std::lock_guard<std::mutex> lock(registry_->mutex);
    // A thread that checked defers_retire before this queues its slot
    // after: the slot is still in active_ below, and the queue is never
    // read again.
    registry_->defers_retire.store(false, std::memory_order_release);
    ProcessRetiredLocked();
    for (Slot* slot : active_) RetireLocked(slot, /*reusable=*/false);
    active_.clear();
    registry_->owner = nullptr;
  }

  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  // Starts sampling every registered thread (and those that register
  // later). OK and a no-op when disabled; an error status, never a crash,
  // when another profiler runs, SIGPROF belongs to someone else, or the
  // options are invalid.
  absl::Status Start() override {
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
    if (!U::Supported()) {
      internal::Log(absl::StrCat(U::kName,
                                 " unwinding is not supported on this "
                                 "architecture; profiling stays off"));
      return absl::OkStatus();
    }
    // Library mode: the agent gets the samples (a local socket round trip;
    // without an agent, profiling stays here unless INPROF_AGENT_FALLBACK=off).
    // The last session's shared rings (drained, no handler runs) go back
    // before its link does.
    for (Slot* slot : active_) UseOwnRingLocked(slot);
    if (absl::Status s = core_.ConnectAgent(ThreadRingLayout()); !s.ok()) return s;
    for (Slot* slot : active_) UseSharedRingLocked(slot);
    // No unwind tables are built here: the collector thread builds them
    // first thing (Drain), so Start() returns in well under a millisecond.
    if (absl::Status s = internal::InstallSignalHandler(); !s.ok()) return s;
    if (absl::Status s = ConfigureProviders(); !s.ok()) return s;
    if (const std::string how = DescribeProviders(); !how.empty()) {
      internal::Log(how);
    }
    // A new session per run: signals still queued from the previous run
    // carry the old one in their tag and are ignored.
    const uint64_t previous_session = session_;
    SetSessionLocked(internal::NewSessionId());
    if (absl::Status s = internal::ActivateSession(session_); !s.ok()) {
      SetSessionLocked(previous_session);
      return s;
    }
    running_ = true;
    stopping_ = false;
    start_pid_ = getpid();
    signal_uid_ = getuid();
    core_.BeginWindow();
    for (Slot* slot : active_) {
      // One that unregistered meanwhile is finished by the collector.
      if (!slot->retiring.load(std::memory_order_acquire)) ArmLocked(slot);
    }
    core_.SetEngineDetail(DescribeProviders());
    core_.StartCollector([this] { Drain(); }, [this] { return stats(); });
    StartTicker();
    return absl::OkStatus();
  }

  // Stops sampling, drains every ring and writes the profile to
  // options().output. Idempotent. In a forked child it only forgets the
  // parent's profiler (no file is written).
  absl::Status Stop() override {
    if (!running_) return absl::OkStatus();
    if (getpid() != start_pid_) {
      // A forked child: the registry lock is free (internal/fork_guard.h).
      {
        std::lock_guard<std::mutex> lock(registry_->mutex);
        for (Slot* slot : active_) ForgetSlotLocked(slot);
        active_.clear();
        internal::DeactivateSession(session_);
        running_ = false;
      }
      core_.AbandonCollector();
      StopTicker();
      return absl::OkStatus();
    }
    StopTicker();  // before taking the registry lock: Tick() takes it
    {
      std::unique_lock<std::mutex> lock(registry_->mutex);
      if (!running_) return absl::OkStatus();
      // Threads arming or disarming outside the lock finish first; none
      // starts from now on.
      stopping_ = true;
      arms_done_.wait(lock, [this] { return arms_in_flight_ == 0; });
      if (!running_) return absl::OkStatus();  // another Stop() was first
      ProcessRetiredLocked();
      for (Slot* slot : active_) DisarmLocked(slot);
      internal::DeactivateSession(session_);
      for (Slot* slot : active_) {
        internal::WaitForHandler(*slot);
        DrainSlotLocked(slot);  // the newest stacks, for the tails
        TakeTailsLocked(slot);
      }
      running_ = false;
      core_.SetEngineDetail(DescribeProviders());
    }
    core_.StopCollector();
    DrainRings();  // no table is needed any more: sampling is off
    absl::Status status = core_.Export(stats());
    if (status.ok()) {
      ++profiles_written_;
    } else {
      internal::Log(status.message());
    }
    return status;
  }

  // Registers the calling thread under `name`. Works before and after
  // Start(). The returned handle unregisters on destruction.
  [[nodiscard]] ThreadRegistration RegisterThread(absl::string_view name) {
    if (!options_.enabled) return ThreadRegistration();
    if (internal::CurrentThreadSlot() != nullptr &&
        internal::CurrentThreadSlot()->session.load() != 0) {
      return ThreadRegistration(absl::AlreadyExistsError(absl::StrCat(
          "thread '", name, "' is already registered with a profiler")));
    }
    auto info = internal::DescribeCurrentThread();
    if (!info.ok()) {
      internal::Log(absl::StrCat("cannot register thread '", name,
                                 "': ", info.status().message()));
      return ThreadRegistration(info.status());
    }
    if (internal::UnblockProfilingSignalInThisThread()) {
      threads_sigprof_unblocked_.fetch_add(1, std::memory_order_relaxed);
      if (!sigprof_unblock_logged_.exchange(true)) {
        internal::Log(absl::StrCat(
            "thread '", name,
            "' registered with SIGPROF blocked in its signal mask (often "
            "inherited from the thread that created it); unblocked it, since "
            "a thread that blocks SIGPROF cannot be sampled (said once; the "
            "profile's comments count such threads)"));
      }
    }
    Slot* slot = AcquireSlot();
    slot->tid = info->tid;
    slot->cpu_clock = info->cpu_clock;
    slot->stack = info->stack;
    slot->name = std::string(name);
    slot->max_frames = options_.max_frames;
    slot->has_aggregate_thread = false;
    slot->label_count = 0;
    slot->last_stack.clear();
    slot->last_labels.clear();
    for (auto& v : slot->provider_last_stack) v.clear();
    for (auto& v : slot->provider_last_labels) v.clear();
    slot->blocked_stack.clear();
    slot->blocked_labels.clear();
    slot->blocked_provisional = false;
    slot->blocked_resampled = false;
    slot->blocked_stackless = false;
    slot->unreadable_site = internal::SyscallSite{};
    slot->running_stack.clear();
    slot->running_labels.clear();
    slot->running_samples_at_visit.fill(
        slot->running_samples.load(std::memory_order_relaxed));
    slot->handler_exit_clock.store(-1, std::memory_order_relaxed);
    slot->retiring.store(false, std::memory_order_relaxed);
    slot->exit_cpu_ns.store(-1, std::memory_order_relaxed);
    slot->exit_wall_ns.store(-1, std::memory_order_relaxed);
    ++slot->generation;
    std::unique_lock<std::mutex> lock(registry_->mutex);
    // Many threads that ended while the lock was taken and are not finished
    // yet (the collector does that every collect_period): their slots go
    // back to the pool now, so that a program that keeps starting threads
    // does not keep allocating new ones. Not for fewer: that work would be
    // this thread's CPU before it is sampled.
    if (registry_->retired_count.load(std::memory_order_relaxed) >= kRetiredForRegistration) {
      ProcessRetiredLocked();
    }
    slot->session.store(session_, std::memory_order_release);
    internal::SetCurrentThreadSlot(slot);
    active_.push_back(slot);
    ++threads_registered_;
    if (running_ && !stopping_ && getpid() == start_pid_) {
      UseSharedRingLocked(slot);
      const uint64_t session = session_;
      if constexpr (kArmsOutsideLock) {
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
    }
    const bool ticking = running_ && !stopping_;
    lock.unlock();
    if (ticking) WakeQuietTicker();
    return ThreadRegistration(registry_, slot, info->tid);
  }

  // Renames the registered thread `tid` (a thread that called
  // pthread_setname_np or prctl(PR_SET_NAME) after registering): its samples
  // in the current window and later carry `name`. False when no registered
  // thread has that id. Any thread; not for signal handlers.
  bool SetThreadName(pid_t tid, absl::string_view name) {
    std::lock_guard<std::mutex> lock(registry_->mutex);
    for (Slot* slot : active_) {
      // A retiring thread may be gone, and its id reused.
      if (slot->tid != tid || slot->retiring.load(std::memory_order_acquire)) continue;
      slot->name = std::string(name);
      if (slot->has_aggregate_thread) {
        std::lock_guard<std::mutex> agg_lock(core_.mutex());
        core_.aggregator().SetThreadName(slot->aggregate_thread, name);
      }
      return true;
    }
    return false;
  }

  // An invalid option: logged at construction (ScopedProfiler).
  bool StartErrorLogged(const absl::Status& start_error) const override {
    return !config_status_.ok() && start_error == config_status_;
  }

  // True between a successful Start() and Stop().
  bool running() const { return running_; }

  // For tests: the lock that registration, the collector and the wall
  // sampler take (a thread unregistering itself while it is held queues its
  // slot instead of waiting).
  std::mutex& registry_mutex_for_testing() { return registry_->mutex; }
  const Options& options() const { return options_; }

  // Where the live endpoint (options().http_addr) listens, e.g.
  // "127.0.0.1:43121" (the port bound when 0 was asked); empty when it is
  // off, not started or could not listen (logged).
  std::string http_address() const { return core_.http_address(); }

  // Counters so far. Any thread.
  ProfilerStats stats() const {
    ProfilerStats s;
    s.samples_taken = taken_.load(std::memory_order_relaxed);
    s.samples_recorded = recorded_.load(std::memory_order_relaxed);
    s.samples_dropped = dropped_.load(std::memory_order_relaxed);
    s.stacks_truncated = truncated_.load(std::memory_order_relaxed);
    s.samples_small_stack = small_stack_.load(std::memory_order_relaxed);
    if constexpr (requires { U::WalksWithoutTables(); }) {
      s.stacks_before_tables = U::WalksWithoutTables() - walks_without_tables_at_construction_;
    }
    s.blocked_episodes_resampled =
        wall_episodes_resampled_.load(std::memory_order_relaxed);
    s.wall_signals = wall_signals_.load(std::memory_order_relaxed);
    s.wall_stacks_read = wall_stacks_read_.load(std::memory_order_relaxed);
    s.wall_running_credits =
        wall_running_credits_.load(std::memory_order_relaxed);
    s.threads_registered = threads_registered_.load(std::memory_order_relaxed);
    s.wall_wakeups = wall_wakeups_.load(std::memory_order_relaxed);
    s.threads_sigprof_unblocked =
        threads_sigprof_unblocked_.load(std::memory_order_relaxed);
    s.profiles_written = profiles_written_.load(std::memory_order_relaxed);
    return s;
  }

  // The pprof sample types, in value order.
  static std::vector<ValueType> SampleTypes() { return Set::SampleTypes(); }

  // "unwinder=frame-pointer providers=cpu".
  static std::string Engine() { return Set::Engine(U::kName); }

 private:
  static ValueType PeriodType() { return Set::PeriodType(); }
  template <size_t I>
  int64_t PeriodOf() {
    // Configure before reading so the period reflects options_.
    Options o = options_;
    if (!std::get<I>(providers_).Configure(o).ok()) return 0;
    return static_cast<int64_t>(std::get<I>(providers_).Period());
  }

  // How providers that say so sample (CpuTimeProvider: its engine), for
  // the log and the profile's comments.
  std::string DescribeProviders() const { return Set::Describe(providers_); }

  absl::Status ConfigureProviders() { return Set::Configure(providers_, options_); }

  // The signal handler's provider-specific part. Async-signal-safe.
  static void SampleThread(internal::ThreadSlotHeader* header,
                           siginfo_t* info, void* ucontext, int tag) noexcept {
    Slot* slot = static_cast<Slot*>(header);
    size_t provider;
    int64_t values[kMaxValuesPerProvider];
    if (!TakeValues(*slot, *info, tag, provider, values)) return;
    const size_t nvalues = kValueCounts[provider];
    uint64_t record[kMaxRecordWords];
    // The thread's labels: written only by this thread, so a plain copy
    // after a signal fence sees a consistent set.
    std::atomic_signal_fence(std::memory_order_acquire);
    uint32_t nlabels = slot->label_count;
    if (nlabels > internal::ThreadSlotHeader::kMaxLabels) nlabels = 0;
    const size_t label_at = 1 + nvalues + kLeafWords;
    for (size_t i = 0; i < 2 * nlabels; ++i) {
      record[label_at + i] = slot->label_words[i];
    }
    const size_t header_words = label_at + 2 * nlabels;
    const size_t frame_room = kMaxRecordWords - header_words;
    const size_t max_frames =
        static_cast<size_t>(slot->max_frames) < frame_room
            ? static_cast<size_t>(slot->max_frames)
            : frame_room;
    const bool sampled_blocked = SampledBlockedAt(
        provider, *slot, std::make_index_sequence<kNumProviders>{});
    // Read before the walk, so that tables published during it count as
    // newer (the safe side: the episode is then sampled again).
    RecordMeta meta;
    if (sampled_blocked) {
      meta.tables_ready = UnwindTablesReady();
      meta.generation = static_cast<uint32_t>(UnwindTablesGeneration() & kWalkGenerationMask);
    }
    U unwinder;
    if constexpr (kLeafWords > 0) {
      unwinder.CopyLeafStack(
          ucontext, slot->stack,
          std::span<uint64_t>(record + 1 + nvalues, kLeafWords));
    }
    const UnwindResult unwound = unwinder.Unwind(
        ucontext, slot->stack,
        std::span<uintptr_t>(
            reinterpret_cast<uintptr_t*>(record + header_words), max_frames));
    static_assert(sizeof(uintptr_t) == sizeof(uint64_t));
    // Which tables a provisional stack of a blocking episode was walked
    // with: the collector may drain it after newer tables are published,
    // and decides from this whether to sample the episode again.
    if (!(sampled_blocked && unwound.provisional)) {
      meta.tables_ready = false;
      meta.generation = 0;
    }
    meta.provider = static_cast<uint8_t>(provider);
    meta.truncated = unwound.truncated;
    meta.blocked = sampled_blocked;
    meta.provisional = unwound.provisional;
    meta.leaf_words = kLeafWords > 0;
    meta.label_count = static_cast<uint8_t>(nlabels);
    meta.depth = static_cast<uint16_t>(unwound.depth);
    record[0] = meta.Encode();
    for (size_t i = 0; i < nvalues; ++i) {
      record[1 + i] = static_cast<uint64_t>(values[i]);
    }
    slot->samples_taken.fetch_add(1, std::memory_order_relaxed);
    if (unwound.truncated) {
      slot->samples_truncated.fetch_add(1, std::memory_order_relaxed);
    }
    if (!slot->active_ring->TryPush(
            std::span<const uint64_t>(record, header_words + unwound.depth))) {
      // Keep the values so totals stay true; the ring counted the drop.
      const size_t offset = kValueOffsets[provider];
      for (size_t i = 0; i < nvalues; ++i) {
        slot->dropped_values[offset + i].fetch_add(values[i],
                                                   std::memory_order_relaxed);
      }
    } else if (kSamplesRunning[provider] && info->si_code != SI_KERNEL) {
      // A stack of the thread running, now in its ring (ITIMER_PROF's
      // process-wide signal, SI_KERNEL, may land on a thread that is not
      // the one running: not counted). Only this thread writes the count.
      slot->running_samples.store(
          slot->running_samples.load(std::memory_order_relaxed) + 1,
          std::memory_order_release);
    }
    // A signal another provider sent that this one swallowed: the same
    // stack, recorded again for it.
    TakeSwallowedEach(provider, *slot, record, nvalues, nlabels, unwound,
                      std::make_index_sequence<kNumProviders>{});
    HandlerDone(*slot);
  }

  // What both handler parts begin with: the provider the signal is for
  // (`tag`) and the values it measured; false when there is no sample.
  static bool TakeValues(Slot& slot, const siginfo_t& info, int tag,
                         size_t& provider, int64_t* values) noexcept {
    provider = static_cast<size_t>(tag & 0xff);
    return provider < kNumProviders &&
           OnSignalAt(provider, slot, info,
                      std::make_index_sequence<kNumProviders>{}, values);
  }
  // ... and end with, after the records' push.
  static void HandlerDone(Slot& slot) noexcept {
    // After the push: a collector that sees this count sees the record.
    activity_.fetch_add(1, std::memory_order_release);
    slot.handler_exit_clock.store(internal::ThreadCpuNanos(slot.cpu_clock),
                                  std::memory_order_relaxed);
  }

  // The signal handler's part for a thread whose stack cannot take
  // SampleThread (ThreadSlotHeader::sample_stackless): the provider's
  // values, and those of signals it swallowed, as records without a stack.
  // Its frame is a few words. Async-signal-safe.
  static void SampleStackless(internal::ThreadSlotHeader* header,
                              siginfo_t* info, void*, int tag) noexcept {
    Slot* slot = static_cast<Slot*>(header);
    size_t provider;
    int64_t values[kMaxValuesPerProvider];
    if (!TakeValues(*slot, *info, tag, provider, values)) return;
    const bool blocked = SampledBlockedAt(
        provider, *slot, std::make_index_sequence<kNumProviders>{});
    PushStackless(*slot, provider, values, blocked);
    TakeSwallowedStacklessEach(provider, *slot,
                               std::make_index_sequence<kNumProviders>{});
    HandlerDone(*slot);
  }
  static void PushStackless(Slot& slot, size_t provider, const int64_t* values,
                            bool blocked) noexcept {
    const size_t nvalues = kValueCounts[provider];
    uint64_t record[1 + kMaxValuesPerProvider];
    RecordMeta meta;
    meta.provider = static_cast<uint8_t>(provider);
    meta.stackless = true;
    meta.blocked = blocked;
    record[0] = meta.Encode();
    for (size_t i = 0; i < nvalues; ++i) {
      record[1 + i] = static_cast<uint64_t>(values[i]);
    }
    slot.samples_taken.fetch_add(1, std::memory_order_relaxed);
    if (!slot.active_ring->TryPush(std::span<const uint64_t>(record, 1 + nvalues))) {
      for (size_t i = 0; i < nvalues; ++i) {
        slot.dropped_values[kValueOffsets[provider] + i].fetch_add(
            values[i], std::memory_order_relaxed);
      }
    }
  }
  template <size_t... I>
  static void TakeSwallowedStacklessEach(size_t provider, Slot& slot,
                                         std::index_sequence<I...>) noexcept {
    (
        [&] {
          using P = std::tuple_element_t<I, std::tuple<Ps...>>;
          if constexpr (TakesSwallowedSignals<P>) {
            if (provider == I) return;
            int64_t values[kMaxValuesPerProvider];
            if (P::TakeSwallowed(slot, std::get<I>(slot.data),
                                 std::span<int64_t>(values, kValueCounts[I]))) {
              PushStackless(slot, I, values, /*blocked=*/false);
            }
          }
        }(),
        ...);
  }

  // On the owning thread as it unregisters (ThreadSlotHeader::
  // before_retire): each provider that OwesSamples and owes one now gets
  // its signal, handled before the call returns (a signal a thread sends
  // itself is delivered as the system call returns).
  static void TakeOwedSamples(internal::ThreadSlotHeader* header) noexcept {
    Slot* slot = static_cast<Slot*>(header);
    const uint64_t session = slot->session.load(std::memory_order_acquire);
    if (session == 0 || session != internal::ActiveSession()) return;
    TakeOwedEach(*slot, session, std::make_index_sequence<kNumProviders>{});
  }
  template <size_t... I>
  static void TakeOwedEach(Slot& slot, uint64_t session,
                           std::index_sequence<I...>) noexcept {
    (
        [&] {
          using P = std::tuple_element_t<I, std::tuple<Ps...>>;
          if constexpr (OwesSamples<P>) {
            if (P::OwesSample(slot, std::get<I>(slot.data))) {
              internal::SignalThisThread(internal::MakeSignalTag(I, session));
            }
          }
        }(),
        ...);
  }

  // In the handler, after `provider`'s record was pushed from `record`:
  // each other provider that had a signal outstanding for the thread
  // (TakesSwallowedSignals) gets a record of the same stack. The record is
  // rewritten in place: its values, and the words after them moved to
  // where its header ends for that provider.
  template <size_t... I>
  static void TakeSwallowedEach(size_t provider, Slot& slot, uint64_t* record,
                                size_t nvalues, size_t nlabels,
                                const UnwindResult& unwound,
                                std::index_sequence<I...>) noexcept {
    (
        [&] {
          using P = std::tuple_element_t<I, std::tuple<Ps...>>;
          if constexpr (TakesSwallowedSignals<P>) {
            if (provider == I) return;
            int64_t values[kMaxValuesPerProvider];
            if (!P::TakeSwallowed(slot, std::get<I>(slot.data),
                                  std::span<int64_t>(values, kValueCounts[I]))) {
              return;
            }
            const size_t new_header =
                1 + kValueCounts[I] + kLeafWords + 2 * nlabels;
            size_t depth = unwound.depth;
            bool truncated = unwound.truncated;
            if (new_header + depth > kMaxRecordWords) {
              depth = kMaxRecordWords - new_header;
              truncated = true;
            }
            // Leaf words, labels and frames, moved as one block.
            const size_t from = 1 + nvalues, to = 1 + kValueCounts[I];
            const size_t words = kLeafWords + 2 * nlabels + depth;
            if (to < from) {
              for (size_t w = 0; w < words; ++w) record[to + w] = record[from + w];
            } else if (to > from) {
              for (size_t w = words; w-- > 0;) record[to + w] = record[from + w];
            }
            RecordMeta meta;
            meta.provider = static_cast<uint8_t>(I);
            meta.truncated = truncated;
            meta.leaf_words = kLeafWords > 0;
            meta.label_count = static_cast<uint8_t>(nlabels);
            meta.depth = static_cast<uint16_t>(depth);
            record[0] = meta.Encode();
            for (size_t i = 0; i < kValueCounts[I]; ++i) {
              record[1 + i] = static_cast<uint64_t>(values[i]);
            }
            slot.samples_taken.fetch_add(1, std::memory_order_relaxed);
            if (truncated) slot.samples_truncated.fetch_add(1, std::memory_order_relaxed);
            if (!slot.active_ring->TryPush(
                    std::span<const uint64_t>(record, new_header + depth))) {
              for (size_t i = 0; i < kValueCounts[I]; ++i) {
                slot.dropped_values[kValueOffsets[I] + i].fetch_add(
                    values[i], std::memory_order_relaxed);
              }
            }
            nvalues = kValueCounts[I];
          }
        }(),
        ...);
  }

  // Providers that say whether their sample is of a blocked thread.
  template <size_t... I>
  static bool SampledBlockedAt(size_t provider, Slot& slot,
                               std::index_sequence<I...>) noexcept {
    bool blocked = false;
    (
        [&] {
          using P = std::tuple_element_t<I, std::tuple<Ps...>>;
          if constexpr (requires { P::SampledBlocked(std::get<I>(slot.data)); }) {
            if (provider == I) blocked = P::SampledBlocked(std::get<I>(slot.data));
          }
        }(),
        ...);
    return blocked;
  }
  template <size_t... I>
  static bool OnSignalAt(size_t provider, Slot& slot, const siginfo_t& info,
                         std::index_sequence<I...>, int64_t* values) noexcept {
    bool sampled = false;
    ((provider == I
          ? (sampled = std::tuple_element_t<I, std::tuple<Ps...>>::OnSignal(
                 slot, std::get<I>(slot.data), info,
                 std::span<int64_t>(values, kValueCounts[I])),
             true)
          : false) ||
     ...);
    return sampled;
  }

  // When every provider ArmsConcurrently (sample_provider.h), a thread
  // that registers or unregisters while the profiler runs arms or disarms
  // them outside the registry lock; Start() and Stop() do it under the lock.
  // All or none, so that providers are always armed in their order (a
  // second perf-engine provider on the same thread takes the slot's
  // overflow descriptor from the first: tests/core/sample_provider_test.cc).
  static constexpr bool kArmsOutsideLock = (ArmsConcurrently<Ps> && ...);

  // Registry lock held.
  void ArmLocked(Slot* slot) { ArmProviders(slot, session_); }
  // The registry lock held, or (kArmsOutsideLock) the slot marked by
  // BeginWorkOutsideLock.
  void ArmProviders(Slot* slot, uint64_t session) {
    ArmEach(slot, session, std::make_index_sequence<kNumProviders>{});
  }
  template <size_t... I>
  void ArmEach(Slot* slot, uint64_t session, std::index_sequence<I...>) {
    (ArmOne<I>(slot, session), ...);
  }
  template <size_t I>
  void ArmOne(Slot* slot, uint64_t session) {
    absl::Status s = std::get<I>(providers_).ArmThread(
        *slot, std::get<I>(slot->data), internal::MakeSignalTag(I, session));
    if (!s.ok()) {
      internal::Log(absl::StrCat("cannot sample thread '", slot->name,
                                 "': ", s.message()));
    }
  }
  // Registry lock held, or (kArmsOutsideLock) the slot marked by
  // BeginWorkOutsideLock.
  void DisarmLocked(Slot* slot) {
    DisarmEach(slot, std::make_index_sequence<kNumProviders>{});
  }
  template <size_t... I>
  void DisarmEach(Slot* slot, std::index_sequence<I...>) {
    (std::get<I>(providers_).DisarmThread(*slot, std::get<I>(slot->data)), ...);
  }

  // Registry lock held. Marks the slot's arming or disarming as under way
  // outside the lock: Stop() and the destructor wait for it to end, the
  // ticker skips the slot.
  void BeginWorkOutsideLock(Slot* slot) {
    slot->arm_in_flight = true;
    ++arms_in_flight_;
  }
  // Registry lock held again.
  void EndWorkOutsideLock(Slot* slot) {
    slot->arm_in_flight = false;
    if (--arms_in_flight_ == 0) arms_done_.notify_all();
  }

  // Registry lock held; no handler can run for the slot. Credits what each
  // provider measured since the thread's last sample to kTailFrame.
  void TakeTailsLocked(Slot* slot) {
    TakeTailsEach(slot, std::make_index_sequence<kNumProviders>{});
  }
  template <size_t... I>
  void TakeTailsEach(Slot* slot, std::index_sequence<I...>) {
    (TakeTailOne<I>(slot), ...);
  }
  template <size_t I>
  void TakeTailOne(Slot* slot) {
    using P = std::tuple_element_t<I, std::tuple<Ps...>>;
    if constexpr (ReportsTail<P>) {
      int64_t values[kMaxValuesPerProvider] = {};
      std::span<int64_t> v(values, kValueCounts[I]);
      if (!std::get<I>(providers_).TakeTail(*slot, std::get<I>(slot->data), v)) {
        return;
      }
      std::lock_guard<std::mutex> agg_lock(core_.mutex());
      SampleAggregator& agg = core_.aggregator();
      EnsureAggregateThread(slot, agg);
      const std::vector<uint64_t>& last = slot->provider_last_stack[I];
      if (!last.empty()) {
        // The thread was last seen there: its final stretch is credited to
        // that stack (sampled, not synthetic), so a thread that lived a
        // sample or two keeps its CPU on its real stack.
        agg.Add(slot->aggregate_thread, last, slot->provider_last_labels[I],
                kValueOffsets[I],
                std::span<const int64_t>(values, kValueCounts[I]));
        return;
      }
      const char* frame = kTailFrame;
      if constexpr (requires { P::kTailFrame; }) frame = P::kTailFrame;
      agg.AddSynthetic(slot->aggregate_thread, frame, kValueOffsets[I],
                       std::span<const int64_t>(values, kValueCounts[I]));
    }
  }

  static void EnsureAggregateThread(Slot* slot, SampleAggregator& agg) {
    if (!slot->has_aggregate_thread) {
      slot->aggregate_thread = agg.AddThread(slot->tid, slot->name);
      slot->has_aggregate_thread = true;
    }
  }

  // Registry lock held. Moves the slot's records into the aggregate.
  void DrainSlotLocked(Slot* slot) {
    std::lock_guard<std::mutex> agg_lock(core_.mutex());
    DrainSlotIntoLocked(slot, core_.aggregator());
  }

  // Registry and aggregate locks held. Cheap for an idle thread (an empty
  // ring and unchanged counters): no atomic read-modify-write, no lookup.
  // Returns false when it stopped at its budget with records left.
  bool DrainSlotIntoLocked(Slot* slot, SampleAggregator& agg) {
    EnsureAggregateThread(slot, agg);
    // Not on the stack: a thread that unregisters drains its own ring, and
    // its 9 KiB frame (probed page by page) faulted in up to three fresh
    // stack pages, ~28 us a thread on this project's VM (bench/overhead
    // idle-1000). The registry lock serializes every drain.
    uint64_t* record = drain_scratch_.get();
    // Room for one inserted caller frame.
    uint64_t* repaired = record + kMaxRecordWords;
    uint64_t recorded = 0;
    // At most a ring's worth a pass: a thread whose handler pushes as fast
    // as this pops (a flood of signals; any busy thread under TSan) held
    // the registry lock, and Stop() behind it, for as long as it ran (the
    // start/stop hammer hung 4 minutes). The rest waits for the next pass.
    bool drained_all = true;
    size_t budget = size_t{1} << 16;
    if constexpr (requires { R::capacity_words(); }) budget = R::capacity_words();
    while (size_t n = slot->active_ring->TryPop(std::span<uint64_t>(record, kMaxRecordWords))) {
      if (AddRecordLocked(slot, agg, record, n, repaired)) ++recorded;
      if (n >= budget) {
        drained_all = false;
        break;
      }
      budget -= n;
    }
    const uint64_t dropped = slot->active_ring->dropped();
    if (dropped != slot->seen_dropped) {
      std::array<int64_t, kNumValues> lost{};
      for (size_t i = 0; i < kNumValues; ++i) {
        lost[i] = slot->dropped_values[i].exchange(0, std::memory_order_relaxed);
      }
      agg.AddSynthetic(slot->aggregate_thread,
                       "[inprof: samples dropped, ring full]", 0, lost);
    }
    const uint64_t taken = slot->samples_taken.load(std::memory_order_relaxed);
    const uint64_t truncated =
        slot->samples_truncated.load(std::memory_order_relaxed);
    const uint64_t small_stack =
        slot->samples_small_stack.load(std::memory_order_relaxed);
    small_stack_.fetch_add(small_stack - slot->seen_small_stack,
                           std::memory_order_relaxed);
    slot->seen_small_stack = small_stack;
    taken_.fetch_add(taken - slot->seen_taken, std::memory_order_relaxed);
    dropped_.fetch_add(dropped - slot->seen_dropped, std::memory_order_relaxed);
    truncated_.fetch_add(truncated - slot->seen_truncated,
                         std::memory_order_relaxed);
    recorded_.fetch_add(recorded, std::memory_order_relaxed);
    slot->seen_taken = taken;
    slot->seen_dropped = dropped;
    slot->seen_truncated = truncated;
    return drained_all;
  }

  // Registry and aggregate locks held. One record as the handler writes it
  // (from a ring, or built by the ticker: ReadBlockedStack) into the
  // aggregate and the slot's newest stacks; false for a malformed one.
  // `repaired` has room for kMaxRecordWords + 1 words.
  bool AddRecordLocked(Slot* slot, SampleAggregator& agg, uint64_t* record,
                       size_t n, uint64_t* repaired) {
    EnsureAggregateThread(slot, agg);
    const RecordMeta meta = RecordMeta::Decode(record[0]);
    const size_t provider = meta.provider;
    const size_t depth = meta.depth;
    const bool blocked = meta.blocked;
    const size_t leaf_words = meta.leaf_words ? kLeafWords : 0;
    const size_t nlabels = meta.label_count;
    if (provider >= kNumProviders) return false;
    const size_t nvalues = kValueCounts[provider];
    const size_t label_at = 1 + nvalues + leaf_words;
    const size_t header = label_at + 2 * nlabels;
    if (n < header + depth) return false;
    int64_t values[kMaxValuesPerProvider];
    for (size_t i = 0; i < nvalues; ++i) {
      values[i] = static_cast<int64_t>(record[1 + i]);
    }
    if (meta.stackless) {
      // Taken on a stack too small for the walk (SampleStackless). A
      // blocked one begins an episode whose rest goes to the same frame.
      agg.AddSynthetic(slot->aggregate_thread, kSmallStackFrame,
                       kValueOffsets[provider],
                       std::span<const int64_t>(values, nvalues));
      if (blocked) {
        slot->blocked_stack.clear();
        slot->blocked_labels.clear();
        slot->blocked_provisional = false;
        slot->blocked_stackless = true;
      }
      return true;
    }
    std::span<const uint64_t> frames(record + header, depth);
    if (leaf_words > 0 && depth >= 1) {
      frames = RepairLeaf(frames,
                          std::span<const uint64_t>(record + 1 + nvalues,
                                                    leaf_words),
                          repaired);
    }
    uint64_t labels[kMaxLabelWords + 2];
    const size_t label_words = CanonicalLabels(
        std::span<const uint64_t>(record + label_at, 2 * nlabels), provider,
        labels, blocked);
    agg.Add(slot->aggregate_thread, frames,
            std::span<const uint64_t>(labels, label_words),
            kValueOffsets[provider],
            std::span<const int64_t>(values, nvalues));
    slot->last_stack.assign(frames.begin(), frames.end());
    slot->provider_last_stack[provider].assign(frames.begin(), frames.end());
    slot->provider_last_labels[provider].assign(labels, labels + label_words);
    if (kSamplesRunning[provider] && !blocked) {
      slot->running_stack.assign(frames.begin(), frames.end());
      slot->running_labels.assign(labels, labels + label_words);
      if constexpr (kHasFollower) {
        FollowRunningSample(slot, agg, frames,
                            std::span<const uint64_t>(record + label_at, 2 * nlabels),
                            values[kPeriodIndexes[provider]]);
      }
    }
    if (blocked) {
      // Where the thread's current blocking episode blocks: the ticker
      // credits the rest of the episode here without signalling again.
      slot->blocked_stackless = false;
      slot->blocked_stack.assign(frames.begin(), frames.end());
      slot->blocked_labels.assign(labels, labels + label_words);
      slot->blocked_provisional = meta.provisional;
      slot->blocked_tables_ready = meta.tables_ready;
      slot->blocked_tables_generation = meta.generation;
    }
    // The stack's own labels, without the provider's state label.
    slot->last_labels.assign(record + label_at,
                             record + label_at + 2 * nlabels);
    return true;
  }

  // Ticking providers that follow running threads (wall_time_provider.h):
  // a running sample drained for a followed thread carries its wall time.
  template <typename P>
  static constexpr bool kFollows =
      requires(typename P::ThreadData& data, std::span<int64_t> values) {
        { P::FollowRunningSample(data, int64_t{}, values) } -> std::convertible_to<bool>;
      };
  static constexpr bool kHasFollower = (kFollows<Ps> || ...);
  static constexpr std::array<size_t, kNumProviders> kPeriodIndexes{
      Ps::kPeriodTypeIndex...};

  // Registry and aggregate locks held.
  void FollowRunningSample(Slot* slot, SampleAggregator& agg,
                           std::span<const uint64_t> frames,
                           std::span<const uint64_t> label_words, int64_t cpu_ns) {
    FollowEach(slot, agg, frames, label_words, cpu_ns,
               std::make_index_sequence<kNumProviders>{});
  }
  template <size_t... I>
  void FollowEach(Slot* slot, SampleAggregator& agg,
                  std::span<const uint64_t> frames,
                  std::span<const uint64_t> label_words, int64_t cpu_ns,
                  std::index_sequence<I...>) {
    (
        [&] {
          using P = std::tuple_element_t<I, std::tuple<Ps...>>;
          if constexpr (kFollows<P>) {
            int64_t values[kMaxValuesPerProvider] = {};
            std::span<int64_t> v(values, kValueCounts[I]);
            if (!P::FollowRunningSample(std::get<I>(slot->data), cpu_ns, v)) return;
            uint64_t labels[kMaxLabelWords + 2];
            const size_t n = CanonicalLabels(label_words, I, labels);
            agg.Add(slot->aggregate_thread, frames,
                    std::span<const uint64_t>(labels, n), kValueOffsets[I],
                    std::span<const int64_t>(values, kValueCounts[I]));
            wall_running_credits_.fetch_add(1, std::memory_order_relaxed);
          }
        }(),
        ...);
  }

  // Canonical label words for the aggregate (internal/provider_set.h),
  // with the provider's state label ("thread state"="running" for a
  // signalled wall sample). Returns the number of words written to `out`
  // (room for kMaxLabelWords + 2).
  size_t CanonicalLabels(std::span<const uint64_t> words, size_t provider,
                         uint64_t* out, bool blocked = false) const {
    return internal::CanonicalLabelWords(
        words, provider < kNumProviders && state_label_provider_[provider], state_key_,
        blocked ? blocked_value_ : running_value_, out);
  }

  // The ticker thread ("inprof-tick"): drives providers that model
  // TicksThreads (wall time).
  static constexpr bool kHasTicker = (TicksThreads<Ps> || ...);

  absl::Duration TickerPeriod() const {
    absl::Duration period = absl::InfiniteDuration();
    TickerPeriodEach(period, std::make_index_sequence<kNumProviders>{});
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

  void StartTicker() {
    if constexpr (kHasTicker) {
      const absl::Duration period = TickerPeriod();
      if (period == absl::InfiniteDuration()) return;
      Ticker* t = ticker_.get();
      {
        std::lock_guard<std::mutex> lock(t->mutex);
        t->stop = false;
      }
      t->thread = std::thread([this, t, period] {
        pthread_setname_np(pthread_self(), "inprof-tick");
        const auto step = absl::ToChronoNanoseconds(period);
        // Intervals drawn uniformly from [0.5, 1.5] x `step`: visits at
        // fixed intervals lock onto a program's own rhythm (measured: a
        // thread sleeping 5 ms and spinning 5 ms was profiled 90-99.7%
        // asleep at a fixed 10 ms); with random intervals each visit falls
        // at a random phase of any rhythm. Uniform rather than exponential:
        // each visit is worth its interval, and the intervals' spread adds
        // to the profile's variance (exponential: twice a fixed interval's,
        // this: 1.08x).
        absl::BitGen gen;
        auto jittered = [&gen](std::chrono::nanoseconds d) {
          const double u = absl::Uniform<double>(gen, 0.5, 1.5);
          return std::chrono::nanoseconds(
              static_cast<int64_t>(static_cast<double>(d.count()) * u));
        };
        auto next = std::chrono::steady_clock::now() + jittered(step);
        size_t batch = 1;
        std::unique_lock<std::mutex> lock(t->mutex);
        while (!t->stop) {
          t->cv.wait_until(lock, next, [t] { return t->stop || t->replan; });
          if (t->stop) break;
          if (t->replan) {
            // A thread registered while the ticker waited long: back to the
            // base period, its first visit within one.
            t->replan = false;
            next = std::min(next, std::chrono::steady_clock::now() + jittered(step));
            continue;
          }
          lock.unlock();
          // steady_clock is CLOCK_MONOTONIC in libstdc++ and libc++ on
          // Linux: the same clock as the visits' (NowNanos).
          batch = Tick(batch, std::chrono::duration_cast<std::chrono::nanoseconds>(
                                  next.time_since_epoch())
                                  .count());
          lock.lock();
          next += jittered(step * batch *
                           tick_quiet_factor_.load(std::memory_order_relaxed));
          const auto now = std::chrono::steady_clock::now();
          // Fell behind: do not burst.
          if (next < now) next = now + jittered(step);
        }
      });
    }
  }

  void StopTicker() {
    if (!ticker_->thread.joinable()) return;
    if (getpid() != start_pid_) {
      // A forked child has no ticker thread: detaching it throws, and
      // destroying a condition variable it waited on can hang. Leak the
      // parent's ticker state (a few dozen bytes) and start afresh.
      (void)ticker_.release();
      ticker_ = std::make_unique<Ticker>();
      return;
    }
    {
      std::lock_guard<std::mutex> lock(ticker_->mutex);
      ticker_->stop = true;
    }
    ticker_->cv.notify_all();
    ticker_->thread.join();
  }

  // Most ticks one wake-up may stand for. With many threads, a wake-up every
  // period visiting ThreadsPerTick() threads costs mostly the wake-up itself;
  // waking every k periods and visiting k times as many threads keeps each
  // thread's revisit interval (and so the wall profile) the same. k is at
  // most the number of ticks a full round of the threads takes, so with
  // ThreadsPerTick() threads or fewer nothing changes.
  static constexpr size_t kMaxTickBatch = 10;

  // One wake-up of the ticker standing for `batch` ticks, meant for
  // `scheduled_ns` (CLOCK_MONOTONIC; TickTime says why that matters);
  // returns the batch for the next one.
  size_t Tick(size_t batch, int64_t scheduled_ns) {
    std::lock_guard<std::mutex> lock(registry_->mutex);
    if (!running_) return 1;
    wall_wakeups_.fetch_add(1, std::memory_order_relaxed);
    const int64_t now = WallTimeProvider::NowNanos();
    const TickTime when{now, std::min(scheduled_ns, now)};
    size_t next = kMaxTickBatch;
    TickEach(when, batch, next, std::make_index_sequence<kNumProviders>{});
    // A whole round of steady visits (every thread followed, or blocked
    // without having run): the next wake-up comes later, up to
    // kMaxQuietFactor periods, and never so late that a thread's revisit
    // interval grows past kMaxTickBatch periods (with many threads the
    // batches already space the wake-ups); anything new brings the base
    // period back.
    const uint32_t factor = tick_quiet_factor_.load(std::memory_order_relaxed);
    const uint32_t cap = static_cast<uint32_t>(
        std::clamp<size_t>(kMaxTickBatch / next, 1, kMaxQuietFactor));
    tick_quiet_factor_.store(
        !active_.empty() && tick_steady_visits_ >= active_.size()
            ? std::min<uint32_t>(factor * 2, cap)
            : 1,
        std::memory_order_relaxed);
    return next;
  }

  // Most base periods the ticker waits between wake-ups while every thread
  // is steady (see Tick). A followed thread's wall profile does not depend
  // on its visits, a blocked thread's episode is credited whole whenever it
  // is visited, and a thread that changes is found within this many
  // periods (each visit still credits the interval to where the thread is
  // then, at a time the program cannot predict: no bias, but a longer
  // interval is a coarser sample). bench/overhead: the ticker's wake-ups
  // were most of wall sampling's cost on busy threads.
  static constexpr uint32_t kMaxQuietFactor = 8;

  // After a thread registers: the ticker, if waiting long, is brought back
  // to the base period (registry lock not held).
  void WakeQuietTicker() {
    if constexpr (kHasTicker) {
      if (tick_quiet_factor_.load(std::memory_order_relaxed) <= 1) return;
      tick_quiet_factor_.store(1, std::memory_order_relaxed);
      {
        std::lock_guard<std::mutex> lock(ticker_->mutex);
        ticker_->replan = true;
      }
      ticker_->cv.notify_all();
    }
  }
  template <size_t... I>
  void TickEach(TickTime when, size_t batch, size_t& next,
                std::index_sequence<I...>) {
    (TickOne<I>(when, batch, next), ...);
  }
  // Registry lock held.
  template <size_t I>
  void TickOne(TickTime when, size_t batch, size_t& next) {
    using P = std::tuple_element_t<I, std::tuple<Ps...>>;
    if constexpr (TicksThreads<P>) {
      P& provider = std::get<I>(providers_);
      if (provider.TickPeriod() <= absl::ZeroDuration()) return;
      const size_t n = active_.size();
      const size_t per_tick = std::max<size_t>(1, provider.ThreadsPerTick());
      next = std::min(next, std::clamp<size_t>(n / per_tick, 1, kMaxTickBatch));
      if (n == 0) return;
      const size_t visits = std::min(n, batch * per_tick);
      size_t& cursor = tick_cursor_[I];
      for (size_t j = 0; j < visits; ++j) {
        Slot* slot = active_[(cursor + j) % n];
        if (slot->arm_in_flight) {  // being armed; visited next round
          tick_steady_visits_ = 0;
          continue;
        }
        // A thread that unregistered itself may be gone, and its id reused:
        // never visited again. One that unregisters during the visit waits
        // for it to end (ThreadSlotHeader::retiring).
        slot->visiting.store(true, std::memory_order_seq_cst);
        if (slot->retiring.load(std::memory_order_seq_cst)) {
          slot->visiting.store(false, std::memory_order_release);
          continue;
        }
        struct EndVisit {
          Slot* slot;
          ~EndVisit() { slot->visiting.store(false, std::memory_order_release); }
        } end_visit{slot};
        // The sample that began a blocking episode may still be in the ring:
        // without draining it the episode would look stackless and the
        // thread be signalled (and its blocking call interrupted) again.
        if (slot->blocked_stack.empty() && !slot->blocked_stackless &&
            provider.AwaitsEpisodeStack(std::get<I>(slot->data))) {
          if constexpr (kLeafWords > 0) leaf_resolver_.Refresh();
          DrainSlotLocked(slot);
        }
        int64_t values[kMaxValuesPerProvider] = {};
        std::span<int64_t> v(values, kValueCounts[I]);
        // The rest of an episode is credited to the stack of its first
        // sample, for as long as the thread waits there (a whole run, for a
        // sleep loop). A stack walked before the tables it needed existed
        // may miss frames (libc's, at start-up: one such stack got 10% of a
        // test's wall time, credited to its caller's caller for 4 s): once
        // the tables are ready, the episode is sampled again, once.
        bool has_episode_stack =
            !slot->blocked_stack.empty() || slot->blocked_stackless;
        const bool resample =
            has_episode_stack && slot->blocked_provisional &&
            !slot->blocked_resampled && UnwindTablesReady() &&
            (!slot->blocked_tables_ready ||
             (UnwindTablesGeneration() & kWalkGenerationMask) !=
                 slot->blocked_tables_generation);
        if (resample) has_episode_stack = false;
        // A running sample taken since this provider's last visit (its
        // record may still be in the ring: drained if it is used).
        bool has_running_sample = false;
        if constexpr (kFollows<P>) {
          // A followed thread's samples carry its wall time: drained first,
          // so that the visit's balance counts those taken in its interval;
          // and before the visit that may begin the following, so that
          // those samples do not carry time the visit credits.
          if (std::get<I>(slot->data).following ||
              slot->running_samples.load(std::memory_order_acquire) !=
                  slot->running_samples_at_visit[I]) {
            if constexpr (kLeafWords > 0) leaf_resolver_.Refresh();
            DrainSlotLocked(slot);
          }
        }
        if constexpr (kHasRunningSampler) {
          const uint32_t taken =
              slot->running_samples.load(std::memory_order_acquire);
          has_running_sample = taken != slot->running_samples_at_visit[I];
          slot->running_samples_at_visit[I] = taken;
        }
        switch (provider.VisitThread(*slot, std::get<I>(slot->data), when,
                                     has_episode_stack, has_running_sample,
                                     v)) {
          case TickDecision::kSkip:
            break;
          case TickDecision::kSignalBlocked:
            // A new blocking episode (or the same one sampled again): its
            // stack comes with this sample.
            slot->blocked_stack.clear();
            slot->blocked_labels.clear();
            slot->blocked_provisional = false;
            slot->blocked_stackless = false;
            slot->blocked_resampled = resample;
            if (resample) {
              wall_episodes_resampled_.fetch_add(1, std::memory_order_relaxed);
            }
            if (ReadBlockedStack<I>(slot)) {
              wall_stacks_read_.fetch_add(1, std::memory_order_relaxed);
              break;
            }
            SendProfilingSignal(*slot, internal::MakeSignalTag(I, session_));
            wall_signals_.fetch_add(1, std::memory_order_relaxed);
            break;
          case TickDecision::kSignal:
            SendProfilingSignal(*slot, internal::MakeSignalTag(I, session_));
            wall_signals_.fetch_add(1, std::memory_order_relaxed);
            break;
          case TickDecision::kCreditBlocked:
            CreditBlocked<I>(slot, v);
            break;
          case TickDecision::kCreditRunning:
            CreditRunning<I>(slot, v);
            break;
          case TickDecision::kFollowing:
            break;
          case TickDecision::kCreditSigwait:
            // Not an episode with a stack: the next visit looks again
            // rather than crediting an older episode's stack.
            slot->blocked_stack.clear();
            slot->blocked_labels.clear();
            slot->blocked_provisional = false;
            slot->blocked_stackless = false;
            if constexpr (requires { P::kSigwaitFrame; }) {
              CreditSynthetic<I>(slot, v, P::kSigwaitFrame);
            } else {
              CreditSynthetic<I>(slot, v, kTailFrame);
            }
            break;
        }
        if constexpr (requires { P::SteadyVisit(std::get<I>(slot->data)); }) {
          if (P::SteadyVisit(std::get<I>(slot->data))) {
            ++tick_steady_visits_;
          } else {
            tick_steady_visits_ = 0;
          }
        }
      }
      cursor = (cursor + visits) % n;
    }
  }

  // Whether a ticking provider's blocked threads can have their stacks read
  // without a signal: the provider says where the thread waits
  // (EpisodeSite, LookClock, TakeStackRead) and the unwinder walks copies
  // of stacks. Not under ThreadSanitizer: the thread's label words, which
  // only that thread writes (the handler reads them on it), are read from
  // the ticker while the thread waits, which it would report as a race.
#if defined(__SANITIZE_THREAD__)
  static constexpr bool kUnderTsan = true;
#else
  static constexpr bool kUnderTsan = false;
#endif
  template <typename P>
  static constexpr bool kReadsBlockedStacks =
      !kUnderTsan && kLeafWords == 0 &&
      requires(P& p, typename P::ThreadData& data, std::span<int64_t> values) {
        { P::EpisodeSite(data) } -> std::same_as<internal::SyscallSite>;
        { P::LookClock(data) } -> std::convertible_to<int64_t>;
        { p.TakeStackRead(data, values) } -> std::convertible_to<bool>;
      } &&
      requires(const U& u, std::span<const uint64_t> copy, std::span<uintptr_t> out) {
        { u.UnwindCopy(uintptr_t{}, uintptr_t{}, copy, out) } -> std::same_as<UnwindResult>;
      };
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
  bool ReadBlockedStack(Slot* slot) {
    using P = std::tuple_element_t<I, std::tuple<Ps...>>;
    if constexpr (!kReadsBlockedStacks<P>) {
      return false;
    } else {
      if (stack_reads_off_) return false;
      auto& data = std::get<I>(slot->data);
      const internal::SyscallSite site = P::EpisodeSite(data);
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
        read_record_ = std::make_unique_for_overwrite<uint64_t[]>(2 * kMaxRecordWords + 1);
      }
      const int error =
          internal::CopyOwnMemory(start_pid_, site.sp, bytes, stack_copy_.get());
      if (error != 0) {
        if (error != EFAULT) {
          // A sandbox without process_vm_readv: signals from now on.
          stack_reads_off_ = true;
          internal::Log(absl::StrCat(
              "wall sampler: cannot read a waiting thread's stack "
              "(process_vm_readv: ", strerror(error),
              "); blocked threads are signalled for their stacks instead"));
        }
        return false;
      }
      uint64_t* record = read_record_.get();
      constexpr size_t nvalues = kValueCounts[I];
      // Its labels as the handler would copy them (the thread waits: they
      // do not change while its clock does not).
      uint32_t nlabels = __atomic_load_n(&slot->label_count, __ATOMIC_RELAXED);
      if (nlabels > internal::ThreadSlotHeader::kMaxLabels) nlabels = 0;
      const size_t label_at = 1 + nvalues;
      for (size_t i = 0; i < 2 * nlabels; ++i) {
        record[label_at + i] = __atomic_load_n(&slot->label_words[i], __ATOMIC_RELAXED);
      }
      const size_t header_words = label_at + 2 * nlabels;
      const size_t max_frames = std::min<size_t>(
          static_cast<size_t>(slot->max_frames), kMaxRecordWords - header_words);
      const bool tables_ready = UnwindTablesReady();
      const uint64_t generation = UnwindTablesGeneration() & kWalkGenerationMask;
      const UnwindResult unwound = U().UnwindCopy(
          site.pc, site.sp, std::span<const uint64_t>(stack_copy_.get(), bytes / 8),
          std::span<uintptr_t>(reinterpret_cast<uintptr_t*>(record + header_words),
                               max_frames));
      if (unwound.truncated) {
        // A frame whose rbp the copy does not settle: the same stack at the
        // same place will not walk either, and a failed read is work the
        // ticker does on top of the signal. Signalled there from now on.
        slot->unreadable_site = site;
        return false;
      }
      if (internal::ThreadCpuNanos(slot->cpu_clock) != clock) {
        return false;  // the thread ran: the copy may be torn
      }
      int64_t values[kMaxValuesPerProvider] = {};
      if (!std::get<I>(providers_).TakeStackRead(
              data, std::span<int64_t>(values, nvalues))) {
        return false;
      }
      RecordMeta meta;
      meta.provider = static_cast<uint8_t>(I);
      meta.blocked = true;
      meta.provisional = unwound.provisional;
      meta.tables_ready = unwound.provisional && tables_ready;
      meta.generation = unwound.provisional ? static_cast<uint32_t>(generation) : 0;
      meta.label_count = static_cast<uint8_t>(nlabels);
      meta.depth = static_cast<uint16_t>(unwound.depth);
      record[0] = meta.Encode();
      for (size_t i = 0; i < nvalues; ++i) {
        record[1 + i] = static_cast<uint64_t>(values[i]);
      }
      slot->samples_taken.fetch_add(1, std::memory_order_relaxed);
      std::lock_guard<std::mutex> agg_lock(core_.mutex());
      if (AddRecordLocked(slot, core_.aggregator(), record,
                          header_words + unwound.depth, record + kMaxRecordWords)) {
        recorded_.fetch_add(1, std::memory_order_relaxed);
      }
      return true;
    }
  }

  // Whether the unwinder's tables are complete (always, for unwinders
  // without tables).
  static bool UnwindTablesReady() {
    if constexpr (requires { U::TablesReady(); }) {
      return U::TablesReady();
    } else {
      return true;
    }
  }
  static uint64_t UnwindTablesGeneration() {
    if constexpr (requires { U::TablesGeneration(); }) {
      return U::TablesGeneration();
    } else {
      return 0;
    }
  }

  // Registry lock held. Values with no stack: added to `frame`.
  template <size_t I>
  void CreditSynthetic(Slot* slot, std::span<const int64_t> values,
                       const char* frame) {
    std::lock_guard<std::mutex> agg_lock(core_.mutex());
    SampleAggregator& agg = core_.aggregator();
    EnsureAggregateThread(slot, agg);
    agg.AddSynthetic(slot->aggregate_thread, frame, kValueOffsets[I], values);
  }

  // Registry lock held. The thread is still in the blocking episode whose
  // stack was sampled: add the values there (labelled blocked).
  template <size_t I>
  void CreditBlocked(Slot* slot, std::span<const int64_t> values) {
    std::lock_guard<std::mutex> agg_lock(core_.mutex());
    SampleAggregator& agg = core_.aggregator();
    EnsureAggregateThread(slot, agg);
    if (slot->blocked_stackless) {
      agg.AddSynthetic(slot->aggregate_thread, kSmallStackFrame,
                       kValueOffsets[I], values);
    } else {
      agg.Add(slot->aggregate_thread, slot->blocked_stack, slot->blocked_labels,
              kValueOffsets[I], values);
    }
  }

  // Registry lock held. The thread ran throughout the interval and a
  // running sample was taken of it meanwhile: add the values to that
  // sample's stack, labelled running (drains the ring, where it may be).
  template <size_t I>
  void CreditRunning(Slot* slot, std::span<const int64_t> values) {
    std::lock_guard<std::mutex> agg_lock(core_.mutex());
    SampleAggregator& agg = core_.aggregator();
    if constexpr (kLeafWords > 0) leaf_resolver_.Refresh();
    DrainSlotIntoLocked(slot, agg);
    uint64_t labels[kMaxLabelWords + 2];
    const size_t label_words = CanonicalLabels(slot->running_labels, I, labels);
    if (slot->running_stack.empty()) {
      // Cannot happen (the count follows the push); credited to the
      // thread's tail frame rather than lost.
      const char* frame = kTailFrame;
      if constexpr (requires { std::tuple_element_t<I, std::tuple<Ps...>>::kTailFrame; }) {
        frame = std::tuple_element_t<I, std::tuple<Ps...>>::kTailFrame;
      }
      agg.AddSynthetic(slot->aggregate_thread, frame, kValueOffsets[I], values);
      return;
    }
    agg.Add(slot->aggregate_thread, slot->running_stack,
            std::span<const uint64_t>(labels, label_words), kValueOffsets[I],
            values);
    wall_running_credits_.fetch_add(1, std::memory_order_relaxed);
  }

  // The ticker's signal. Only the ticker sends it, and only in the process
  // that started the profiler (a forked child has no ticker), so the pid
  // and uid are those Start() saw: one system call per signal, not four
  // (getpid twice and getuid are real system calls in glibc 2.36).
  void SendProfilingSignal(const internal::ThreadSlotHeader& slot,
                           int tag) const {
    siginfo_t info;
    std::memset(&info, 0, sizeof(info));
    info.si_signo = internal::kProfilingSignal;
    info.si_code = SI_QUEUE;
    info.si_pid = start_pid_;
    info.si_uid = signal_uid_;
    info.si_value.sival_int = tag;
    // rt_tgsigqueueinfo: the same delivery a timer's SIGEV_THREAD_ID gives,
    // with our tag in si_value; ESRCH (thread gone) is harmless.
    syscall(SYS_rt_tgsigqueueinfo, start_pid_, slot.tid,
            internal::kProfilingSignal, &info);
  }

  // Registry lock held. When the leaf pc has no frame record of its own
  // (its CFA is sp-based), the frame-pointer walk skipped its caller: insert
  // the return address found on the stack. `out` must hold frames.size()+1.
  std::span<const uint64_t> RepairLeaf(std::span<const uint64_t> frames,
                                       std::span<const uint64_t> stack_words,
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

  // Collector step: picks up modules loaded or unloaded since the last pass
  // (unwinders with per-module tables, built off the hot path and read by
  // the handler), then drains the rings. Not under the registry lock: the
  // first build takes tens of milliseconds and threads register meanwhile;
  // the rings are drained between two tables, and the build stops (to be
  // resumed) once the profiler is stopping.
  void Drain() {
    if constexpr (requires(absl::FunctionRef<bool()> between) {
                    U::RefreshModules(between, true);
                  }) {
      U::RefreshModules([this] { return DrainRings(); }, /*on_demand=*/true);
    } else if constexpr (requires { U::RefreshModules(); }) {
      U::RefreshModules();
    }
    DrainRings();
  }

  // When no handler has run since the last pass (idle threads), the slots
  // are not visited: with 1,000 registered threads that walk over their
  // rings was most of the collector's CPU. Returns whether the profiler is
  // still running.
  bool DrainRings() {
    std::lock_guard<std::mutex> lock(registry_->mutex);
    ProcessRetiredLocked();
    if constexpr (kLeafWords > 0) leaf_resolver_.Refresh();
    // Read before draining: what is pushed meanwhile is drained next pass.
    const uint64_t activity = activity_.load(std::memory_order_acquire);
    if (activity != drained_activity_) {
      drained_activity_ = activity;
      std::lock_guard<std::mutex> agg_lock(core_.mutex());
      SampleAggregator& agg = core_.aggregator();
      for (Slot* slot : active_) {
        // Records left behind: the next pass visits the rings again.
        if (!DrainSlotIntoLocked(slot, agg)) drained_activity_ = ~uint64_t{0};
      }
    }
    return running_;
  }

  // Registry::Owner. Registry lock held by the caller (`lock`).
  void Unregister(internal::ThreadSlotHeader* header, bool on_owner_thread,
                  std::unique_lock<std::mutex>& lock) override {
    Slot* slot = static_cast<Slot*>(header);
    if (!RemoveActiveLocked(slot)) return;
    const bool same_process = start_pid_ == 0 || getpid() == start_pid_;
    if (!same_process) {
      ForgetSlotLocked(slot);  // a forked child
      return;
    }
    if constexpr (kArmsOutsideLock) {
      if (running_) {
        // close() of a perf event is the costliest call here: without the
        // lock. The slot is out of active_, so only Stop() (which waits for
        // this) could otherwise touch it.
        BeginWorkOutsideLock(slot);
        lock.unlock();
        DisarmLocked(slot);
        lock.lock();
        EndWorkOutsideLock(slot);
      }
    }
    FinishUnregisterLocked(slot, on_owner_thread, same_process);
  }

  // Registry lock held: takes `slot` out of active_; false if it was not
  // there (unregistered already).
  bool RemoveActiveLocked(Slot* slot) {
    auto it = std::find(active_.begin(), active_.end(), slot);
    if (it == active_.end()) return false;
    active_.erase(it);
    return true;
  }

  // Registry lock held; `slot` is out of active_ (Unregister, or a slot its
  // thread queued: ProcessRetiredLocked).
  void FinishUnregisterLocked(Slot* slot, bool on_owner_thread, bool same_process) {
    DisarmLocked(slot);  // a no-op once disarmed
    // A handler cannot be running on this thread while we are here; on
    // another thread it may be, so clear the session and wait it out.
    slot->session.store(0, std::memory_order_seq_cst);
    internal::WaitForHandler(*slot);
    if (on_owner_thread && internal::CurrentThreadSlot() == slot) {
      internal::SetCurrentThreadSlot(nullptr);
    }
    if (same_process) {
      if constexpr (kLeafWords > 0) leaf_resolver_.Refresh();
      DrainSlotLocked(slot);  // first: the tail goes to the newest stack
      TakeTailsLocked(slot);
      if (slot->has_aggregate_thread) {
        // Its entry in the thread table is reused after the next export.
        std::lock_guard<std::mutex> agg_lock(core_.mutex());
        core_.aggregator().RemoveThread(slot->aggregate_thread);
        slot->has_aggregate_thread = false;
      }
    }
    // A slot unregistered from another thread may still be the owner's TLS
    // slot: never reuse it, so that thread can never push into a new owner's
    // ring.
    RetireLocked(slot, /*reusable=*/on_owner_thread);
  }

  // When every provider can be disarmed and its tail taken after the
  // thread is gone, threads unregister themselves without the registry
  // lock (ThreadRegistration::Reset) and the profiler finishes that here.
  static constexpr bool kDefersRetire = (UnregistersLate<Ps> && ...);
  // Queued unregistrations that a registering thread finishes first.
  static constexpr uint32_t kRetiredForRegistration = 64;

  // Registry lock held: finishes the unregistrations threads queued (their
  // TLS pointer is cleared, so their slots go back to the pool). Called by
  // the collector at each pass, by RegisterThread, Start, Stop and the
  // destructor.
  void ProcessRetiredLocked() {
    if constexpr (kDefersRetire) {
      internal::ThreadSlotHeader* next = registry_->TakeRetired();
      if (next == nullptr) return;
      const bool same_process = start_pid_ == 0 || getpid() == start_pid_;
      while (next != nullptr) {
        Slot* slot = static_cast<Slot*>(next);
        next = next->next_retired;
        // Not in active_: a forked child forgot it, or the destructor
        // retired it already.
        if (!RemoveActiveLocked(slot)) continue;
        if (!same_process) {
          ForgetSlotLocked(slot);
          continue;
        }
        FinishUnregisterLocked(slot, /*on_owner_thread=*/true, same_process);
      }
    }
  }

  // Registry lock held, in a forked child of the process that started the
  // profiler. The parent's timers, threads and collector do not exist here:
  // forget the slot's per-provider state without deleting any timer (its id
  // may now name one of the child's own), take no tail, never reuse it.
  void ForgetSlotLocked(Slot* slot) {
    slot->session.store(0, std::memory_order_seq_cst);
    ResetProviderData(slot);
    slot->active_ring = &slot->ring;  // a shared one is the parent's
    if (internal::CurrentThreadSlot() == slot) {
      internal::SetCurrentThreadSlot(nullptr);
    }
  }

  // Library mode: the shape of the records and rings, for the agent to read
  // the rings of a process that died (internal/agent_stream.h); null when
  // the ring type is not an SpscRecordRing.
  const internal::AgentThreadRingLayout* ThreadRingLayout() const {
    if constexpr (kIsSpscRecordRing<R>) {
      static const internal::AgentThreadRingLayout layout = [] {
        internal::AgentThreadRingLayout l;
        l.ring_bytes = static_cast<uint32_t>(sizeof(R));
        l.ring_words = static_cast<uint32_t>(R::capacity_words());
        l.leaf_words = static_cast<uint32_t>(kLeafWords);
        for (size_t i = 0; i < kNumProviders; ++i) {
          l.value_counts.push_back(static_cast<uint32_t>(kValueCounts[i]));
          l.value_offsets.push_back(static_cast<uint32_t>(kValueOffsets[i]));
          if (state_label_provider_[i]) l.state_label_providers |= 1u << i;
        }
        return l;
      }();
      return kNumProviders <= internal::kAgentMaxProviders ? &layout : nullptr;
    } else {
      return nullptr;
    }
  }

  // Registry lock held; no handler can run for the slot (not armed yet, or
  // disarmed and waited for). Its ring becomes one in the agent's region
  // when there is an agent (its own ring is empty: drained or unused).
  void UseSharedRingLocked(Slot* slot) {
    if constexpr (kIsSpscRecordRing<R>) {
      if (slot->active_ring != &slot->ring) return;
      void* memory = core_.AcquireAgentThreadRing(slot->tid, slot->name);
      if (memory == nullptr) return;
      slot->active_ring = new (memory) R;  // default-init: its words untouched
      slot->seen_dropped = 0;
    }
  }
  // Registry lock held; the shared ring is drained and no handler can run
  // for the slot. Back to its own ring.
  void UseOwnRingLocked(Slot* slot) {
    if (slot->active_ring == &slot->ring) return;
    core_.ReleaseAgentThreadRing(slot->active_ring);
    slot->active_ring = &slot->ring;
    slot->seen_dropped = slot->ring.dropped();
  }

  // Registry lock held: the profiler and its registered slots take `session`.
  void SetSessionLocked(uint64_t session) {
    session_ = session;
    for (Slot* slot : active_) {
      slot->session.store(session_, std::memory_order_release);
    }
  }

  // Each provider's per-thread state back to its initial value.
  static void ResetProviderData(Slot* slot) {
    using Data = std::tuple<typename Ps::ThreadData...>;
    slot->data.~Data();
    new (&slot->data) Data();
  }

  void RetireLocked(Slot* slot, bool reusable) {
    DisarmLocked(slot);
    slot->session.store(0, std::memory_order_seq_cst);
    internal::WaitForHandler(*slot);
    if (start_pid_ == 0 || getpid() == start_pid_) UseOwnRingLocked(slot);
    if (reusable) ReleaseSlot(slot);
  }

  // Slots are pooled for the life of the process and never freed, so a
  // late signal on a stale TLS pointer always reads valid memory.
  struct SlotPool {
    std::mutex mutex;
    std::vector<Slot*> free;
  };
  static SlotPool& Pool() {
    static SlotPool* pool = [] {  // intentionally never destroyed
      auto* p = new SlotPool;
      internal::RegisterForkLock(&p->mutex, internal::kForkRankSlotPool);
      return p;
    }();
    return *pool;
  }
  static Slot* AcquireSlot() {
    SlotPool& pool = Pool();
    {
      std::lock_guard<std::mutex> lock(pool.mutex);
      if (!pool.free.empty()) {
        Slot* slot = pool.free.back();
        pool.free.pop_back();
        return slot;
      }
    }
    Slot* slot = new Slot;
    slot->sample = &SampleThread;
    slot->sample_stackless = &SampleStackless;
    slot->sample_stack_bytes = static_cast<uint32_t>(kHandlerStackBytes);
    slot->before_retire = &TakeOwedSamples;
    return slot;
  }
  static void ReleaseSlot(Slot* slot) {
    // Reset per-registration state; the ring is empty after the drain.
    ResetProviderData(slot);
    slot->seen_taken = slot->samples_taken.load();
    slot->seen_dropped = slot->ring.dropped();
    slot->seen_truncated = slot->samples_truncated.load();
    slot->seen_small_stack = slot->samples_small_stack.load();
    SlotPool& pool = Pool();
    std::lock_guard<std::mutex> lock(pool.mutex);
    pool.free.push_back(slot);
  }

  Options options_;
  absl::Status config_status_;
  std::tuple<Ps...> providers_;
  internal::ProfilerCore core_;
  uint64_t session_ = internal::NewSessionId();  // registry lock; new per Start()
  std::shared_ptr<internal::Registry> registry_ =
      std::make_shared<internal::Registry>();
  std::vector<Slot*> active_;  // registry lock
  // A record popped from a ring and its leaf-repaired copy (registry lock).
  std::unique_ptr<uint64_t[]> drain_scratch_ =
      std::make_unique_for_overwrite<uint64_t[]>(2 * kMaxRecordWords + 1);
  std::atomic<bool> running_{false};  // written under the registry lock
  // Stop() is waiting for arming outside the lock to end: no new one starts
  // (registry lock).
  bool stopping_ = false;
  size_t arms_in_flight_ = 0;  // registry lock
  std::condition_variable arms_done_;  // arms_in_flight_ fell to 0
  pid_t start_pid_ = 0;
  uid_t signal_uid_ = 0;  // getuid() at Start(): the ticker's signals' si_uid

  // Interned ids of the state label (wall samples).
  static constexpr std::array<bool, kNumProviders> state_label_provider_{
      requires { Ps::kStateLabel; }...};
  const uint64_t state_key_ =
      internal::LabelTable::Global().Intern(WallTimeProvider::kStateLabel);
  const uint64_t running_value_ =
      internal::LabelTable::Global().Intern(WallTimeProvider::kRunning);
  const uint64_t blocked_value_ =
      internal::LabelTable::Global().Intern(WallTimeProvider::kBlocked);
  std::array<size_t, kNumProviders> tick_cursor_{};  // registry lock
  // Steady visits in a row, and how many base periods the ticker waits
  // (Tick).
  size_t tick_steady_visits_ = 0;                    // registry lock
  std::atomic<uint32_t> tick_quiet_factor_{1};
  std::atomic<uint64_t> wall_wakeups_{0};
  std::atomic<uint64_t> threads_sigprof_unblocked_{0};
  std::atomic<bool> sigprof_unblock_logged_{false};
  std::atomic<uint64_t> wall_running_credits_{0};
  std::atomic<uint64_t> wall_signals_{0};
  // Blocked threads' stacks read without a signal (ReadBlockedStack), and
  // its buffers (ticker, registry lock); off once process_vm_readv failed
  // other than for an unmapped stack.
  std::atomic<uint64_t> wall_stacks_read_{0};
  std::unique_ptr<uint64_t[]> stack_copy_;
  std::unique_ptr<uint64_t[]> read_record_;
  bool stack_reads_off_ = false;
  std::atomic<uint64_t> wall_episodes_resampled_{0};
  struct Ticker {
    std::mutex mutex;
    std::condition_variable cv;
    bool stop = false;
    bool replan = false;  // WakeQuietTicker
    std::thread thread;
  };
  std::unique_ptr<Ticker> ticker_ = std::make_unique<Ticker>();
  internal::LeafFrameResolver leaf_resolver_;  // registry lock
  // Samples pushed by handlers of this profiler type (one profiler runs at a
  // time; a second of the same type only causes extra passes), and the
  // count the last full collector pass saw (registry lock).
  static inline std::atomic<uint64_t> activity_{0};
  uint64_t drained_activity_ = ~uint64_t{0};
  std::atomic<uint64_t> taken_{0}, recorded_{0}, dropped_{0}, truncated_{0},
      small_stack_{0};
  std::atomic<uint64_t> threads_registered_{0}, profiles_written_{0};
  // The unwinder's counter is process-wide; this profiler reports its own.
  const uint64_t walks_without_tables_at_construction_ = [] {
    if constexpr (requires { U::WalksWithoutTables(); }) {
      return U::WalksWithoutTables();
    } else {
      return uint64_t{0};
    }
  }();
};

}  // namespace inprof

#endif  // !_WIN32

#endif  // INPROF_PROFILER_H_
