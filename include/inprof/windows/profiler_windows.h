// inprof/windows/profiler_windows.h: the Profiler on Windows, included by
// inprof/profiler.h there. The dd-win-prof seed's design on inprof's
// components, behind the same API as on Linux.
//
// Windows has no per-thread CPU timer signal, so a sampler thread
// ("inprof-sampler", dd-win-prof's StackSamplerLoop) does what the signal
// handler does on Linux. At each of a provider's ticks (CpuTimeProvider:
// every cpu_period; WallTimeProvider: every wall_period) it reads the
// registered threads' CPU counters without stopping them and lets the
// provider pick whom to sample. Each picked thread is then suspended once,
// its registers and stack copied, and resumed (thread_snapshot_windows.h:
// nothing else runs while it is stopped); the copy is walked after the
// thread runs again (the Unwinder, OsUnwinder by default) and one record
// per provider goes into the thread's ring. The collector thread drains
// the rings into the aggregate, the exporter symbolizes (DbgHelp) and
// writes pprof, exactly as on Linux (internal/pipeline.h).
//
// Its parts: internal::ProfilerLayout (profiler_layout_windows.h: the
// record's shape and the slot), internal::ProfilerCollector
// (profiler_collector_windows.h: the profiler's state and the collector's
// half), internal::ProfilerSampler (profiler_sampler_windows.h: the
// sampler thread, over the collector), and this class, which holds the
// API and registration and joins the rest.
//
// Never suspended: the sampler itself, the collector and the exporter (they
// never register), and a thread that is not registered.
//
// Thread-safety: Start, Stop and RegisterThread may be called from any
// thread. A ThreadRegistration must be destroyed before the Profiler. Only
// one Profiler runs in a process at a time.
//
// Example (the same as on Linux):
//   inprof::DefaultProfiler profiler(inprof::Options::FromEnv());
//   inprof::ScopedProfiler running(profiler);
//   auto self = profiler.RegisterThread("main");
#ifndef INPROF_WINDOWS_PROFILER_WINDOWS_H_
#define INPROF_WINDOWS_PROFILER_WINDOWS_H_

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "inprof/base/log.h"
#include "inprof/base/platform.h"
#include "inprof/internal/profiler_collector_windows.h"
#include "inprof/internal/profiler_control.h"
#include "inprof/internal/pipeline.h"
#include "inprof/internal/profiler_layout_windows.h"
#include "inprof/internal/profiler_sampler_windows.h"
#include "inprof/internal/thread_slot_windows.h"
#include "inprof/internal/thread_snapshot_windows.h"
#include "inprof/options.h"
#include "inprof/spsc_ring.h"
#include "inprof/unwinder.h"
#include "inprof/windows/sample_provider_windows.h"

namespace inprof {

// A sampling profiler composed from components:
//   U   an Unwinder (unwinder.h) that walks a stack snapshot: OsUnwinder;
//   R   a SampleRing (spsc_ring.h), one per registered thread;
//   Ps  one or more SampleProviders (windows/sample_provider_windows.h).
template <Unwinder U, SampleRing R, SampleProvider... Ps>
  requires(sizeof...(Ps) >= 1 && sizeof...(Ps) < 256)
class Profiler final : public internal::ProfilerSampler<U, R, Ps...> {
  // What the components fix (internal/profiler_layout_windows.h), the
  // profiler's state and the collector's half
  // (internal/profiler_collector_windows.h), and the sampler thread
  // (internal/profiler_sampler_windows.h), which derives from it.
  using Layout = internal::ProfilerLayout<U, R, Ps...>;
  using Base = internal::ProfilerSampler<U, R, Ps...>;
  using Set = typename Layout::Set;
  using Slot = typename Layout::Slot;
  // The state and services of the parts this one uses.
  using Base::options_, Base::config_status_, Base::providers_, Base::pipeline_,
      Base::session_, Base::registry_, Base::active_, Base::running_,
      Base::threads_registered_, Base::profiles_written_, Base::unsuspended_,
      Base::pending_, Base::snapshotter_,
      Base::StartSampler, Base::StopSampler, Base::DrainRings, Base::DrainSlotLocked,
      Base::TakeTailsLocked, Base::RefreshNameLocked, Base::RetireLocked, Base::AcquireSlot;

 public:
  using unwinder_type = U;
  using ring_type = R;

  // Validates `options`; an invalid option is logged and the profiler stays
  // disabled (Start() returns the error).
  explicit Profiler(Options options = Options::FromEnv())
      : Base(std::move(options)) {
    registry_->owner = this;
    pipeline_.set_describe_unwind_tables(false);
    // Looks GetThreadDescription up now: that takes the loader lock, which
    // must never be taken under the registry lock (a thread registering
    // from DllMain holds the loader lock and waits for the registry lock).
    internal::ThreadDescription(nullptr);
  }

  ~Profiler() {
    Stop().IgnoreError();
    std::lock_guard<std::mutex> lock(registry_->mutex);
    for (Slot* slot : active_) RetireLocked(slot, /*reusable=*/false);
    active_.clear();
    registry_->owner = nullptr;
  }

  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  // Starts sampling every registered thread (and those that register
  // later). OK and a no-op when disabled; an error status, never a crash,
  // when another profiler runs or the options are invalid.
  absl::Status Start() override {
    if (!options_.enabled) return absl::OkStatus();
    if (!config_status_.ok()) return config_status_;
    std::lock_guard<std::mutex> lock(registry_->mutex);
    if (running_) return absl::OkStatus();
    if (!U::Supported()) {
      internal::Log(absl::StrCat(U::kName, " unwinding is not supported here; "
                                           "profiling stays off"));
      return absl::OkStatus();
    }
    if (absl::Status s = pipeline_.ConnectAttachments(nullptr); !s.ok()) return s;
    if (absl::Status s = ConfigureProviders(); !s.ok()) return s;
    if (!ClaimProcess(this)) {
      return absl::FailedPreconditionError(
          "another inprof profiler is running in this process");
    }
    session_ = internal::NewSessionId();
    for (Slot* slot : active_) {
      slot->session.store(session_, std::memory_order_release);
    }
    snapshotter_ = std::make_unique<internal::ThreadSnapshotter>();
    size_t pending = 0;
    for (size_t i = 0; i < Layout::kNumProviders; ++i) {
      pending += Layout::kOps[i].threads_per_tick(this->provider_objects_[i]);
    }
    pending_.reserve(pending);
    running_ = true;
    pipeline_.BeginWindow();
    const int64_t now = internal::MonotonicNanos();
    for (Slot* slot : active_) ArmLocked(slot, now);
    pipeline_.SetEngineDetail(DescribeProviders());
    internal::Log(DescribeProviders());
    pipeline_.StartCollector([this] { DrainRings(); }, [this] { return stats(); });
    StartSampler();
    return absl::OkStatus();
  }

  // Stops sampling, drains every ring and writes the profile to
  // options().output. Idempotent.
  absl::Status Stop() override {
    if (!running_) return absl::OkStatus();
    StopSampler();  // before the registry lock: a tick takes it
    {
      std::lock_guard<std::mutex> lock(registry_->mutex);
      if (!running_) return absl::OkStatus();
      const int64_t now = internal::MonotonicNanos();
      for (Slot* slot : active_) {
        DrainSlotLocked(slot);  // the newest stacks, for the tails
        TakeTailsLocked(slot, now);
        internal::Pipeline::Ingesting ingest = pipeline_.Ingest();
        RefreshNameLocked(slot, ingest.aggregator());
      }
      running_ = false;
      ClaimProcess(nullptr);
    }
    pipeline_.StopCollector();
    DrainRings();
    absl::Status status = pipeline_.Export(stats());
    if (status.ok()) {
      ++profiles_written_;
    } else {
      internal::Log(status.message());
    }
    return status;
  }

  // Registers the calling thread under `name` (empty: the thread's
  // description, SetThreadDescription, read again as it changes). Works
  // before and after Start(). The returned handle unregisters on
  // destruction.
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
    Slot* slot = AcquireSlot();
    slot->tid = info->tid;
    slot->handle = info->handle;
    slot->stack = info->stack;
    slot->name_from_os = name.empty();
    slot->name = name.empty() ? internal::ThreadDescription(info->handle)
                              : std::string(name);
    if (slot->name.empty()) slot->name = absl::StrCat("thread-", info->tid);
    slot->max_frames = options_.max_frames;
    slot->label_count = 0;
    slot->has_stack = false;
    slot->tick_times_at = -1;
    slot->busy.fill(false);
    slot->pick_in_flight = false;
    slot->leaving.store(false, std::memory_order_relaxed);
    slot->has_aggregate_thread = false;
    slot->last_stack.clear();
    for (auto& v : slot->provider_last_stack) v.clear();
    for (auto& v : slot->provider_last_labels) v.clear();
    ++slot->generation;
    std::lock_guard<std::mutex> lock(registry_->mutex);
    slot->session.store(running_ ? session_ : kRegisteredIdle, std::memory_order_release);
    internal::SetCurrentThreadSlot(slot);
    active_.push_back(slot);
    ++threads_registered_;
    if (running_) ArmLocked(slot, internal::MonotonicNanos());
    return ThreadRegistration(registry_, slot, info->tid);
  }

  // Renames the registered thread `tid`: its samples in the current window
  // and later carry `name`. False when no registered thread has that id.
  bool SetThreadName(uint32_t tid, absl::string_view name) {
    std::lock_guard<std::mutex> lock(registry_->mutex);
    for (Slot* slot : active_) {
      if (slot->tid != tid) continue;
      slot->name = std::string(name);
      slot->name_from_os = false;
      if (slot->has_aggregate_thread) {
        internal::Pipeline::Ingesting ingest = pipeline_.Ingest();
        ingest.aggregator().SetThreadName(slot->aggregate_thread, name);
      }
      return true;
    }
    return false;
  }

  // running(), options(), http_address() (always empty: the live endpoint
  // is not part of the Windows build): internal::ProfilerCommon.

  // Counters so far. Any thread.
  ProfilerStats stats() const {
    ProfilerStats s;
    this->AddCommonStats(s);
    s.samples_unsuspended = unsuspended_.load(std::memory_order_relaxed);
    return s;
  }

  // The pprof sample types, in value order.
  static std::vector<ValueType> SampleTypes() { return Set::SampleTypes(); }

  // "unwinder=windows-unwind-info providers=cpu,wall".
  static std::string Engine() { return Set::Engine(U::kName); }

 private:
  // The session of a slot registered while the profiler is not running: not
  // 0 (RegisterThread's "already registered" check), never a real session.
  static constexpr uint64_t kRegisteredIdle = ~uint64_t{0};

  std::string DescribeProviders() const { return Set::Describe(providers_); }

  absl::Status ConfigureProviders() { return Set::Configure(providers_, options_); }

  // One process-wide sampler: a second running profiler is refused.
  static bool ClaimProcess(const void* owner) {
    static std::atomic<const void*> claimed{nullptr};
    if (owner == nullptr) {
      claimed.store(nullptr);
      return true;
    }
    const void* expected = nullptr;
    return claimed.compare_exchange_strong(expected, owner);
  }

  // Registry lock held: the thread's counters now are each provider's
  // starting point.
  void ArmLocked(Slot* slot, int64_t now) {
    slot->session.store(session_, std::memory_order_release);
    const ThreadTimes times = internal::ReadThreadTimes(slot->handle);
    for (size_t i = 0; i < Layout::kNumProviders; ++i) {
      const absl::Status s = Layout::kOps[i].arm(this->provider_objects_[i], *slot, times, now);
      if (!s.ok()) {
        internal::Log(absl::StrCat("cannot sample thread '", slot->name, "': ", s.message()));
      }
    }
  }

  // Registry::Owner. Registry lock held by the caller.
  void Unregister(internal::ThreadSlotHeader* header, bool on_owner_thread,
                  std::unique_lock<std::mutex>& /*lock*/) override {
    Slot* slot = static_cast<Slot*>(header);
    auto it = std::find(active_.begin(), active_.end(), slot);
    if (it == active_.end()) return;
    active_.erase(it);
    if (on_owner_thread && internal::CurrentThreadSlot() == slot) {
      internal::SetCurrentThreadSlot(nullptr);
    }
    if (slot->pick_in_flight) {
      // The sampler will drop that sample (StillSampled): its values go to
      // the tail.
      slot->data = slot->data_before_pick;
      slot->pick_in_flight = false;
    }
    if (running_) {
      DrainSlotLocked(slot);  // first: the tail goes to the newest stack
      TakeTailsLocked(slot, internal::MonotonicNanos());
    } else {
      DrainSlotLocked(slot);
    }
    if (slot->has_aggregate_thread) {
      internal::Pipeline::Ingesting ingest = pipeline_.Ingest();
      RefreshNameLocked(slot, ingest.aggregator());  // its name at the end
      ingest.aggregator().RemoveThread(slot->aggregate_thread);
      slot->has_aggregate_thread = false;
    }
    RetireLocked(slot, /*reusable=*/on_owner_thread);
  }

};

}  // namespace inprof

#endif  // INPROF_WINDOWS_PROFILER_WINDOWS_H_
