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
// writes pprof, exactly as on Linux (internal/profiler_core.h).
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
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "inprof/internal/label_table.h"
#include "inprof/internal/log.h"
#include "inprof/internal/platform.h"
#include "inprof/internal/profiler_control.h"
#include "inprof/internal/profiler_core.h"
#include "inprof/internal/provider_set.h"
#include "inprof/internal/profiler_thread.h"
#include "inprof/internal/sample_record.h"
#include "inprof/internal/thread_slot_windows.h"
#include "inprof/internal/thread_snapshot_windows.h"
#include "inprof/options.h"
#include "inprof/spsc_ring.h"
#include "inprof/unwinder.h"
#include "inprof/windows/sample_provider_windows.h"

namespace inprof {

namespace internal {

// What RegisterThread learns of the calling thread.
struct CurrentThreadInfo {
  uint32_t tid = 0;
  void* handle = nullptr;  // OpenThread: suspend, get context, query
  StackBounds stack;       // GetCurrentThreadStackLimits
};
// Describes (and opens) the calling thread; the error names the call that
// failed.
absl::StatusOr<CurrentThreadInfo> DescribeCurrentThread();
void CloseThreadHandle(void* handle) noexcept;
// The thread's description (SetThreadDescription), empty if none.
std::string ThreadDescription(void* handle);

// A Windows sample record is internal/sample_record.h's, without leaf
// words: [meta][values...][label words...][frames...], its meta using the
// two bits only the sampler writes (same_stack, unsuspended).

}  // namespace internal

// A sampling profiler composed from components:
//   U   an Unwinder (unwinder.h) that walks a stack snapshot: OsUnwinder;
//   R   a SampleRing (spsc_ring.h), one per registered thread;
//   Ps  one or more SampleProviders (windows/sample_provider_windows.h).
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
  static constexpr size_t kMaxFrames = 512;  // deeper stacks are truncated
  static constexpr size_t kMaxLabels = internal::ThreadSlotHeader::kMaxLabels;
  static constexpr size_t kMaxLabelWords = 2 * kMaxLabels;
  static constexpr size_t kHeaderWords = 1 + kMaxValuesPerProvider + kMaxLabelWords;
  static constexpr size_t kMaxRecordWords =
      kHeaderWords + kMaxFrames < R::max_record_words() ? kHeaderWords + kMaxFrames
                                                        : R::max_record_words();
  static_assert(kMaxRecordWords > kHeaderWords, "ring records too small for a sample");

  struct Slot : internal::ThreadSlotHeader {
    std::tuple<typename Ps::ThreadData...> data;
    std::string name;
    bool name_from_os = false;  // registered without a name: its description
    int max_frames = static_cast<int>(kMaxFrames);
    R ring;
    // Sampler-owned (registry lock held).
    bool has_stack = false;       // a stack was pushed since registration
    ThreadTimes tick_times;       // read once per tick
    int64_t tick_times_at = -1;
    // Per provider: its last visit took a sample (CPU: the thread ran).
    std::array<bool, kNumProviders> busy{};
    // A tick picked the thread and its sample is not recorded yet (the
    // sampler takes the registry lock again to push it), and the
    // providers' state before that tick's visits: a thread that
    // unregisters meanwhile gets that state back before its tails are
    // taken, so the picked values go to its tail instead of being lost
    // with the sample the sampler then drops.
    bool pick_in_flight = false;
    std::tuple<typename Ps::ThreadData...> data_before_pick;
    // Values of samples dropped because the ring was full (sampler adds,
    // collector takes).
    std::array<std::atomic<int64_t>, kNumValues> dropped_values{};
    std::atomic<uint64_t> samples_taken{0};
    std::atomic<uint64_t> samples_truncated{0};
    std::atomic<uint64_t> samples_unsuspended{0};
    // Collector-owned (registry lock held).
    std::vector<uint64_t> last_stack;
    std::array<std::vector<uint64_t>, kNumProviders> provider_last_stack;
    std::array<std::vector<uint64_t>, kNumProviders> provider_last_labels;
    uint32_t aggregate_thread = 0;
    bool has_aggregate_thread = false;
    uint64_t seen_taken = 0, seen_dropped = 0, seen_truncated = 0, seen_unsuspended = 0;
  };

 public:
  using unwinder_type = U;
  using ring_type = R;

  // Validates `options`; an invalid option is logged and the profiler stays
  // disabled (Start() returns the error).
  explicit Profiler(Options options = Options::FromEnv())
      : options_(std::move(options)),
        core_(options_, SampleTypes(), PeriodType(), PeriodOf<0>(), Engine()) {
    config_status_ = options_.Validate();
    if (!config_status_.ok()) internal::Log(config_status_.message());
    registry_->owner = this;
    core_.set_describe_unwind_tables(false);
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
    if (absl::Status s = core_.ConnectAgent(); !s.ok()) return s;
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
    std::apply([&](const auto&... p) { ((pending += p.ThreadsPerTick()), ...); },
               providers_);
    pending_.reserve(pending);
    running_ = true;
    core_.BeginWindow();
    const int64_t now = internal::MonotonicNanos();
    for (Slot* slot : active_) ArmLocked(slot, now);
    core_.SetEngineDetail(DescribeProviders());
    internal::Log(DescribeProviders());
    core_.StartCollector([this] { DrainRings(); }, [this] { return stats(); });
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
        std::lock_guard<std::mutex> agg_lock(core_.mutex());
        RefreshNameLocked(slot, core_.aggregator());
      }
      running_ = false;
      ClaimProcess(nullptr);
    }
    core_.StopCollector();
    DrainRings();
    absl::Status status = core_.Export(stats());
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
  const Options& options() const { return options_; }
  // Always empty: the live endpoint is not part of the Windows build.
  std::string http_address() const { return core_.http_address(); }

  // Counters so far. Any thread.
  ProfilerStats stats() const {
    ProfilerStats s;
    s.samples_taken = taken_.load(std::memory_order_relaxed);
    s.samples_recorded = recorded_.load(std::memory_order_relaxed);
    s.samples_dropped = dropped_.load(std::memory_order_relaxed);
    s.stacks_truncated = truncated_.load(std::memory_order_relaxed);
    s.samples_unsuspended = unsuspended_.load(std::memory_order_relaxed);
    s.threads_registered = threads_registered_.load(std::memory_order_relaxed);
    s.profiles_written = profiles_written_.load(std::memory_order_relaxed);
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

  static ValueType PeriodType() { return Set::PeriodType(); }
  template <size_t I>
  int64_t PeriodOf() {
    Options o = options_;
    if (!std::get<I>(providers_).Configure(o).ok()) return 0;
    return static_cast<int64_t>(std::get<I>(providers_).Period());
  }

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
    ArmEach(slot, times, now, std::make_index_sequence<kNumProviders>{});
  }
  template <size_t... I>
  void ArmEach(Slot* slot, const ThreadTimes& times, int64_t now, std::index_sequence<I...>) {
    (
        [&] {
          absl::Status s = std::get<I>(providers_).ArmThread(*slot, std::get<I>(slot->data),
                                                             times, now);
          if (!s.ok()) {
            internal::Log(absl::StrCat("cannot sample thread '", slot->name, "': ", s.message()));
          }
        }(),
        ...);
  }

  // Registry lock held; the sampler is not running or not at this slot.
  // Credits what each provider measured since its last sample of the thread
  // to that sample's stack.
  void TakeTailsLocked(Slot* slot, int64_t now) {
    const ThreadTimes times = internal::ReadThreadTimes(slot->handle);
    TakeTailsEach(slot, times, now, std::make_index_sequence<kNumProviders>{});
  }
  template <size_t... I>
  void TakeTailsEach(Slot* slot, const ThreadTimes& times, int64_t now,
                     std::index_sequence<I...>) {
    (TakeTailOne<I>(slot, times, now), ...);
  }
  template <size_t I>
  void TakeTailOne(Slot* slot, const ThreadTimes& times, int64_t now) {
    using P = std::tuple_element_t<I, std::tuple<Ps...>>;
    if constexpr (ReportsTail<P>) {
      int64_t values[kMaxValuesPerProvider] = {};
      std::span<int64_t> v(values, kValueCounts[I]);
      if (!std::get<I>(providers_).TakeTail(*slot, std::get<I>(slot->data), times, now, v)) {
        return;
      }
      std::lock_guard<std::mutex> agg_lock(core_.mutex());
      SampleAggregator& agg = core_.aggregator();
      EnsureAggregateThread(slot, agg);
      const std::vector<uint64_t>& last = slot->provider_last_stack[I];
      if (!last.empty()) {
        agg.Add(slot->aggregate_thread, last, slot->provider_last_labels[I],
                kValueOffsets[I], std::span<const int64_t>(values, kValueCounts[I]));
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

  // ---- The sampler thread ------------------------------------------------

  // A sample a provider asked for in this tick.
  struct Pending {
    Slot* slot;
    uint64_t generation;
    uint8_t provider;
    bool same_stack;  // VisitDecision::kSameStack
    bool blocked;     // the provider's thread-state label
    std::array<int64_t, kMaxValuesPerProvider> values;
  };

  struct Sampler {
    std::mutex mutex;
    std::condition_variable cv;
    bool stop = false;
    internal::ProfilerThread thread;
  };

  void StartSampler() {
    sampler_->stop = false;
    sampler_->thread = internal::ProfilerThread([this] { SamplerLoop(); });
  }

  void StopSampler() {
    if (!sampler_->thread.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(sampler_->mutex);
      sampler_->stop = true;
    }
    sampler_->cv.notify_all();
    sampler_->thread.join();
  }

  void SamplerLoop() {
    internal::SetCurrentThreadName("inprof-sampler");
    std::array<int64_t, kNumProviders> period{};
    std::array<int64_t, kNumProviders> due{};
    const int64_t start = internal::MonotonicNanos();
    std::apply(
        [&](const auto&... p) {
          size_t i = 0;
          ((period[i] = absl::ToInt64Nanoseconds(p.TickPeriod()), due[i] = start + period[i], ++i),
           ...);
        },
        providers_);
    std::unique_lock<std::mutex> lock(sampler_->mutex);
    while (!sampler_->stop) {
      int64_t next = INT64_MAX;
      for (size_t i = 0; i < kNumProviders; ++i) {
        if (period[i] > 0) next = std::min(next, due[i]);
      }
      if (next == INT64_MAX) {
        sampler_->cv.wait(lock, [this] { return sampler_->stop; });
        break;
      }
      const int64_t wait = next - internal::MonotonicNanos();
      if (wait > 0) {
        sampler_->cv.wait_for(lock, std::chrono::nanoseconds(wait),
                              [this] { return sampler_->stop; });
        if (sampler_->stop) break;
        if (internal::MonotonicNanos() < next) continue;  // woke early
      }
      lock.unlock();
      const int64_t now = internal::MonotonicNanos();
      std::array<bool, kNumProviders> ticking{};
      for (size_t i = 0; i < kNumProviders; ++i) {
        if (period[i] <= 0 || due[i] > now) continue;
        ticking[i] = true;
        due[i] += period[i];
        if (due[i] <= now) due[i] = now + period[i];  // fell behind: no burst
      }
      Tick(now, ticking);
      lock.lock();
    }
  }

  // One round: the providers whose tick it is pick threads (registry lock),
  // then each picked thread is snapshotted (registry lock: a slot cannot be
  // released meanwhile), walked (no lock: the walk may wait for the loader
  // lock, which a thread registering from DllMain holds while it waits for
  // the registry lock), and its records pushed (registry lock, the slot
  // checked again).
  void Tick(int64_t now, const std::array<bool, kNumProviders>& ticking) {
    pending_.clear();
    {
      std::lock_guard<std::mutex> lock(registry_->mutex);
      if (!running_) return;
      VisitEach(now, ticking, std::make_index_sequence<kNumProviders>{});
    }
    for (size_t i = 0; i < pending_.size(); ++i) {
      Slot* slot = pending_[i].slot;
      const uint64_t generation = pending_[i].generation;
      // This thread's entries are consecutive after the first.
      size_t end = i + 1;
      bool wants_stack = !pending_[i].same_stack;
      for (size_t j = i + 1; j < pending_.size(); ++j) {
        if (pending_[j].slot == slot && pending_[j].generation == generation) {
          std::swap(pending_[end], pending_[j]);
          wants_stack |= !pending_[end].same_stack;
          ++end;
        }
      }
      SampleThread(slot, generation, std::span<Pending>(&pending_[i], end - i), wants_stack);
      i = end - 1;
    }
  }

  template <size_t... I>
  void VisitEach(int64_t now, const std::array<bool, kNumProviders>& ticking,
                 std::index_sequence<I...>) {
    ((ticking[I] ? VisitProvider<I>(now) : void()), ...);
  }

  // Registry lock held. Visits threads round-robin until the provider's
  // ThreadsPerTick() samples are picked or every thread was visited. A
  // provider with IdleVisitsPerTick() (CpuTimeProvider) visits the threads
  // its last visit found running first, every tick, then at most that many
  // of the others: each visit reads the thread's clocks, a system call.
  template <size_t I>
  void VisitProvider(int64_t now) {
    using P = std::tuple_element_t<I, std::tuple<Ps...>>;
    P& provider = std::get<I>(providers_);
    const size_t n = active_.size();
    if (n == 0) return;
    size_t budget = std::max<size_t>(1, provider.ThreadsPerTick());
    size_t idle_visits = n;
    if constexpr (requires { provider.IdleVisitsPerTick(); }) {
      idle_visits = std::max<size_t>(1, provider.IdleVisitsPerTick());
    }
    const bool busy_first = idle_visits < n;
    const uint32_t self = internal::CurrentTid();
    auto visit = [&](Slot* slot) {
      // A thread that suspends itself never wakes: the sampler is never
      // sampled.
      if (slot->tid == self) return;
      // Unregistering (ThreadSlotHeader::leaving): its tail takes its CPU.
      if (slot->leaving.load(std::memory_order_acquire)) return;
      if (slot->tick_times_at != now) {
        slot->tick_times = internal::ReadThreadTimes(slot->handle);
        slot->tick_times_at = now;
      }
      if (!slot->pick_in_flight) slot->data_before_pick = slot->data;
      Pending p{slot, slot->generation, static_cast<uint8_t>(I), false, false, {}};
      const VisitDecision d = provider.Visit(
          *slot, std::get<I>(slot->data), slot->tick_times, now,
          std::span<int64_t>(p.values.data(), kValueCounts[I]));
      slot->busy[I] = d == VisitDecision::kSample;
      if (d == VisitDecision::kSkip) return;
      slot->pick_in_flight = true;
      p.same_stack = d == VisitDecision::kSameStack && slot->has_stack;
      if constexpr (LabelsThreadState<P>) p.blocked = P::SampledBlocked(std::get<I>(slot->data));
      pending_.push_back(p);
      --budget;
    };
    if (busy_first) {
      for (Slot* slot : active_) {
        if (budget == 0) break;
        if (slot->busy[I]) visit(slot);
      }
    }
    size_t& cursor = cursor_[I];
    size_t scanned = 0, visited = 0;
    while (scanned < n && budget > 0 && visited < idle_visits) {
      Slot* slot = active_[(cursor + scanned) % n];
      ++scanned;
      if (busy_first && slot->busy[I]) continue;  // visited above
      visit(slot);
      ++visited;
    }
    cursor = (cursor + scanned) % n;
  }

  struct LabelCopy {
    const Slot* slot;
    uint32_t count;
    uint64_t words[kMaxLabelWords];
  };
  // While the thread is suspended: its labels as they are (entries are
  // written before the count that covers them, labels.cc).
  static void CopyLabels(void* arg) noexcept {
    auto* c = static_cast<LabelCopy*>(arg);
    uint32_t count = *const_cast<volatile const uint32_t*>(&c->slot->label_count);
    if (count > kMaxLabels) count = 0;
    for (uint32_t i = 0; i < 2 * count; ++i) c->words[i] = c->slot->label_words[i];
    c->count = count;
  }

  bool StillSampled(const Slot* slot, uint64_t generation) const {
    return running_ && slot->generation == generation &&
           slot->session.load(std::memory_order_acquire) == session_ &&
           std::find(active_.begin(), active_.end(), slot) != active_.end();
  }

  void SampleThread(Slot* slot, uint64_t generation, std::span<Pending> entries,
                    bool wants_stack) {
    LabelCopy labels{slot, 0, {}};
    internal::SnapshotOutcome outcome = internal::SnapshotOutcome::kOk;
    {
      std::lock_guard<std::mutex> lock(registry_->mutex);
      // Unregistered since the pick: its tail took the picked values back.
      if (!StillSampled(slot, generation)) return;
      if (slot->leaving.load(std::memory_order_acquire)) {
        // Unregistering since the pick, and waiting for this lock: its
        // stack would be the wait's. The picked values go back, for its
        // tail (at Unregister, or Stop's) to give to its last stack.
        slot->data = slot->data_before_pick;
        slot->pick_in_flight = false;
        return;
      }
      if (wants_stack) {
        outcome = snapshotter_->Capture(slot->handle, slot->stack, &CopyLabels, &labels);
      } else {
        // The thread has not run since its last stack: its labels have not
        // changed either (only the thread writes them).
        CopyLabels(&labels);
      }
    }
    UnwindResult unwound;
    const bool suspended = !wants_stack || outcome == internal::SnapshotOutcome::kOk ||
                           outcome == internal::SnapshotOutcome::kNoStack;
    if (wants_stack && suspended) {
      U unwinder;
      const size_t max_frames = std::min<size_t>(
          static_cast<size_t>(std::max(1, slot->max_frames)),
          kMaxRecordWords - (1 + kMaxValuesPerProvider + 2 * labels.count));
      unwound = unwinder.Unwind(snapshotter_->snapshot(), slot->stack,
                                std::span<uintptr_t>(frames_.data(), max_frames));
    }
    std::lock_guard<std::mutex> lock(registry_->mutex);
    if (!StillSampled(slot, generation)) return;  // as above
    slot->pick_in_flight = false;
    for (const Pending& p : entries) {
      const size_t nvalues = kValueCounts[p.provider];
      internal::RecordMeta meta;
      meta.provider = static_cast<uint8_t>(p.provider);
      meta.label_count = static_cast<uint8_t>(labels.count);
      meta.blocked = p.blocked;
      size_t depth = 0;
      if (!suspended) {
        meta.unsuspended = true;
        slot->samples_unsuspended.fetch_add(1, std::memory_order_relaxed);
      } else if (p.same_stack) {
        meta.same_stack = true;
      } else {
        depth = unwound.depth;
        if (unwound.truncated) {
          meta.truncated = true;
          slot->samples_truncated.fetch_add(1, std::memory_order_relaxed);
        }
      }
      meta.depth = static_cast<uint16_t>(depth);
      record_[0] = meta.Encode();
      for (size_t v = 0; v < nvalues; ++v) record_[1 + v] = static_cast<uint64_t>(p.values[v]);
      const size_t label_at = 1 + nvalues;
      for (size_t w = 0; w < 2 * labels.count; ++w) record_[label_at + w] = labels.words[w];
      const size_t frames_at = label_at + 2 * labels.count;
      for (size_t f = 0; f < depth; ++f) record_[frames_at + f] = frames_[f];
      slot->samples_taken.fetch_add(1, std::memory_order_relaxed);
      if (!slot->ring.TryPush(std::span<const uint64_t>(record_.data(), frames_at + depth))) {
        const size_t offset = kValueOffsets[p.provider];
        for (size_t v = 0; v < nvalues; ++v) {
          slot->dropped_values[offset + v].fetch_add(p.values[v], std::memory_order_relaxed);
        }
      } else if (depth > 0) {
        slot->has_stack = true;
      }
    }
  }

  // ---- The collector ------------------------------------------------------

  void DrainSlotLocked(Slot* slot) {
    std::lock_guard<std::mutex> agg_lock(core_.mutex());
    DrainSlotIntoLocked(slot, core_.aggregator());
  }

  // Registry and aggregate locks held.
  void DrainSlotIntoLocked(Slot* slot, SampleAggregator& agg) {
    EnsureAggregateThread(slot, agg);
    uint64_t* record = drain_scratch_.get();
    uint64_t recorded = 0;
    while (size_t n = slot->ring.TryPop(std::span<uint64_t>(record, kMaxRecordWords))) {
      const internal::RecordMeta meta = internal::RecordMeta::Decode(record[0]);
      const size_t provider = meta.provider;
      const size_t depth = meta.depth;
      const size_t nlabels = meta.label_count;
      if (provider >= kNumProviders) continue;
      const size_t nvalues = kValueCounts[provider];
      const size_t label_at = 1 + nvalues;
      const size_t header = label_at + 2 * nlabels;
      if (n < header + depth) continue;
      int64_t values[kMaxValuesPerProvider];
      for (size_t i = 0; i < nvalues; ++i) values[i] = static_cast<int64_t>(record[1 + i]);
      const std::span<const int64_t> value_span(values, nvalues);
      if (meta.unsuspended) {
        agg.AddSynthetic(slot->aggregate_thread, "[inprof: thread could not be suspended]",
                         kValueOffsets[provider], value_span);
        ++recorded;
        continue;
      }
      uint64_t labels[kMaxLabelWords + 2];
      const size_t label_words =
          CanonicalLabels(std::span<const uint64_t>(record + label_at, 2 * nlabels), provider,
                          labels, meta.blocked);
      const std::span<const uint64_t> label_span(labels, label_words);
      if (meta.same_stack) {
        if (slot->last_stack.empty()) {
          agg.AddSynthetic(slot->aggregate_thread, kTailFrame, kValueOffsets[provider],
                           value_span);
        } else {
          agg.Add(slot->aggregate_thread, slot->last_stack, label_span, kValueOffsets[provider],
                  value_span);
          slot->provider_last_stack[provider] = slot->last_stack;
          slot->provider_last_labels[provider].assign(labels, labels + label_words);
        }
        ++recorded;
        continue;
      }
      std::span<const uint64_t> frames(record + header, depth);
      agg.Add(slot->aggregate_thread, frames, label_span, kValueOffsets[provider], value_span);
      slot->last_stack.assign(frames.begin(), frames.end());
      slot->provider_last_stack[provider].assign(frames.begin(), frames.end());
      slot->provider_last_labels[provider].assign(labels, labels + label_words);
      ++recorded;
    }
    const uint64_t dropped = slot->ring.dropped();
    if (dropped != slot->seen_dropped) {
      std::array<int64_t, kNumValues> lost{};
      for (size_t i = 0; i < kNumValues; ++i) {
        lost[i] = slot->dropped_values[i].exchange(0, std::memory_order_relaxed);
      }
      agg.AddSynthetic(slot->aggregate_thread, "[inprof: samples dropped, ring full]", 0, lost);
    }
    const uint64_t taken = slot->samples_taken.load(std::memory_order_relaxed);
    const uint64_t truncated = slot->samples_truncated.load(std::memory_order_relaxed);
    const uint64_t unsuspended = slot->samples_unsuspended.load(std::memory_order_relaxed);
    taken_.fetch_add(taken - slot->seen_taken, std::memory_order_relaxed);
    dropped_.fetch_add(dropped - slot->seen_dropped, std::memory_order_relaxed);
    truncated_.fetch_add(truncated - slot->seen_truncated, std::memory_order_relaxed);
    unsuspended_.fetch_add(unsuspended - slot->seen_unsuspended, std::memory_order_relaxed);
    recorded_.fetch_add(recorded, std::memory_order_relaxed);
    slot->seen_taken = taken;
    slot->seen_dropped = dropped;
    slot->seen_truncated = truncated;
    slot->seen_unsuspended = unsuspended;
  }

  // Canonical label words for the aggregate (internal/provider_set.h),
  // with the thread-state label of providers that have one.
  size_t CanonicalLabels(std::span<const uint64_t> words, size_t provider, uint64_t* out,
                         bool blocked) const {
    return internal::CanonicalLabelWords(
        words, provider < kNumProviders && kStateLabelProvider[provider], state_key_,
        blocked ? blocked_value_ : running_value_, out);
  }

  // Registry and aggregate locks held: a thread registered without a name
  // takes its description as it is now.
  void RefreshNameLocked(Slot* slot, SampleAggregator& agg) {
    if (!slot->name_from_os) return;
    std::string name = internal::ThreadDescription(slot->handle);
    if (name.empty() || name == slot->name) return;
    slot->name = std::move(name);
    if (slot->has_aggregate_thread) agg.SetThreadName(slot->aggregate_thread, slot->name);
  }

  // The collector's step (every collect_period): drain every ring, and read
  // again the names of threads named by their description.
  bool DrainRings() {
    std::lock_guard<std::mutex> lock(registry_->mutex);
    std::lock_guard<std::mutex> agg_lock(core_.mutex());
    SampleAggregator& agg = core_.aggregator();
    const int64_t now = internal::MonotonicNanos();
    const bool rename = now - names_read_at_ >= kNameRefreshNs;
    if (rename) names_read_at_ = now;
    for (Slot* slot : active_) {
      DrainSlotIntoLocked(slot, agg);
      if (rename) RefreshNameLocked(slot, agg);
    }
    return running_;
  }
  // How often the names of threads registered without one are read again.
  static constexpr int64_t kNameRefreshNs = 1'000'000'000;

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
      std::lock_guard<std::mutex> agg_lock(core_.mutex());
      RefreshNameLocked(slot, core_.aggregator());  // its name at the end
      core_.aggregator().RemoveThread(slot->aggregate_thread);
      slot->has_aggregate_thread = false;
    }
    RetireLocked(slot, /*reusable=*/on_owner_thread);
  }

  void RetireLocked(Slot* slot, bool reusable) {
    slot->session.store(0, std::memory_order_seq_cst);
    ++slot->generation;  // a tick that picked it leaves it alone
    internal::CloseThreadHandle(slot->handle);
    slot->handle = nullptr;
    if (reusable) ReleaseSlot(slot);
  }

  static void ResetProviderData(Slot* slot) {
    using Data = std::tuple<typename Ps::ThreadData...>;
    slot->data.~Data();
    new (&slot->data) Data();
  }

  // Slots are pooled for the life of the process and never freed, so a
  // ScopedLabels on a thread whose registration ended writes valid memory.
  struct SlotPool {
    std::mutex mutex;
    std::vector<Slot*> free;
  };
  static SlotPool& Pool() {
    static SlotPool* pool = new SlotPool;  // intentionally never destroyed
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
    return new Slot;
  }
  static void ReleaseSlot(Slot* slot) {
    ResetProviderData(slot);
    slot->seen_taken = slot->samples_taken.load();
    slot->seen_dropped = slot->ring.dropped();
    slot->seen_truncated = slot->samples_truncated.load();
    slot->seen_unsuspended = slot->samples_unsuspended.load();
    SlotPool& pool = Pool();
    std::lock_guard<std::mutex> lock(pool.mutex);
    pool.free.push_back(slot);
  }

  Options options_;
  absl::Status config_status_;
  std::tuple<Ps...> providers_;
  internal::ProfilerCore core_;
  uint64_t session_ = 0;  // registry lock; new per Start()
  std::shared_ptr<internal::Registry> registry_ = std::make_shared<internal::Registry>();
  std::vector<Slot*> active_;  // registry lock
  std::atomic<bool> running_{false};  // written under the registry lock
  std::array<size_t, kNumProviders> cursor_{};  // registry lock

  // Sampler-owned: the picks of a tick, the snapshot and walk buffers.
  std::vector<Pending> pending_;
  std::unique_ptr<internal::ThreadSnapshotter> snapshotter_;
  std::vector<uintptr_t> frames_ = std::vector<uintptr_t>(kMaxFrames);
  std::vector<uint64_t> record_ = std::vector<uint64_t>(kMaxRecordWords);
  std::unique_ptr<Sampler> sampler_ = std::make_unique<Sampler>();

  // Collector-owned (registry lock).
  std::unique_ptr<uint64_t[]> drain_scratch_ =
      std::make_unique_for_overwrite<uint64_t[]>(kMaxRecordWords);
  int64_t names_read_at_ = 0;

  static constexpr std::array<bool, kNumProviders> kStateLabelProvider{LabelsThreadState<Ps>...};
  const uint64_t state_key_ = internal::LabelTable::Global().Intern("thread state");
  const uint64_t running_value_ = internal::LabelTable::Global().Intern("running");
  const uint64_t blocked_value_ = internal::LabelTable::Global().Intern("blocked");

  std::atomic<uint64_t> taken_{0}, recorded_{0}, dropped_{0}, truncated_{0}, unsuspended_{0};
  std::atomic<uint64_t> threads_registered_{0}, profiles_written_{0};
};

}  // namespace inprof

#endif  // INPROF_WINDOWS_PROFILER_WINDOWS_H_
