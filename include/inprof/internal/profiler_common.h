// internal: not part of the public API (include inprof/profiler.h).
//
// What every platform's profiler holds and does the same way, compiled once
// (src/profiler/profiler_common.cc): the options and their verdict, the
// pipeline (internal/pipeline.h) with what Options attaches to it
// (ComposePipeline, internal/composition.h), the registry a
// ThreadRegistration calls back into, the session, whether it runs, the counters every platform keeps,
// and the collector's common steps: a thread's entry in the aggregate, the
// canonical label words with the thread-state label, a drained slot's
// counters and its dropped samples. SlotPool<Slot> pools the slots.
//
//   ProfilerCommon                  this header
//     ProfilerBase                  profiler_base.h (Linux: signals, the
//                                   registry's lock-free retirement, the
//                                   wall ticker)
//     ProfilerCollector<U, R, Ps>   profiler_collector_windows.h (Windows:
//                                   the sampler thread's collector)
//
// Locks: "registry lock" is registry_->mutex; the aggregate lock is the
// pipeline's (Pipeline::Ingest), always taken after it.
#ifndef INPROF_INTERNAL_PROFILER_COMMON_H_
#define INPROF_INTERNAL_PROFILER_COMMON_H_

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "inprof/base/fork_guard.h"
#include "inprof/internal/pipeline.h"
#include "inprof/internal/profiler_control.h"
#include "inprof/options.h"
#include "inprof/profile_data.h"
#include "inprof/sample_aggregator.h"

namespace inprof::internal {

// The collector's part of a registered thread's slot, on every platform
// (registry lock): the slot types derive from it beside their
// ThreadSlotHeader.
struct SlotRecordState {
  std::string name;
  // The newest stack drained for the thread.
  std::vector<uint64_t> last_stack;
  uint32_t aggregate_thread = 0;
  bool has_aggregate_thread = false;
  // The slot's own counters as the last drain saw them.
  uint64_t seen_taken = 0, seen_dropped = 0, seen_truncated = 0;
};

class ProfilerCommon : public ProfilerControl, protected Registry::Owner {
 public:
  ProfilerCommon(const ProfilerCommon&) = delete;
  ProfilerCommon& operator=(const ProfilerCommon&) = delete;

  // An invalid option: logged at construction (ScopedProfiler).
  bool StartErrorLogged(const absl::Status& start_error) const override {
    return !config_status_.ok() && start_error == config_status_;
  }

  // True between a successful Start() and Stop().
  bool running() const { return running_; }
  // Sets Options::alloc_period for the next Start() (the providers are
  // configured at each Start). FailedPrecondition while running. For the
  // gperftools drop-in's HeapProfilerStart, which turns allocation
  // sampling on in a process whose environment did not. Not concurrently
  // with Start() or Stop().
  // `source` names what asked for it in the lines that mention the period.
  absl::Status SetAllocPeriod(uint64_t bytes, std::string source = {}) {
    if (running_) {
      return absl::FailedPreconditionError("the allocation period is set before Start()");
    }
    options_.alloc_period = bytes;
    options_.alloc_period_source = std::move(source);
    return absl::OkStatus();
  }
  const Options& options() const { return options_; }

  // Where the live endpoint (options().http_addr) listens, e.g.
  // "127.0.0.1:43121" (the port bound when 0 was asked); empty when it is
  // off, not started or could not listen (logged), and on Windows.
  std::string http_address() const { return pipeline_.ServedAddress(); }

  // The heap now, as the live endpoint's /debug/pprof/heap serves it: a
  // gzip pprof of the allocation provider's alloc_* since Start() and
  // inuse_* now (only those types), opening on `default_type`
  // ("inuse_space", "alloc_space"). NotFound when allocations are not
  // profiled (INPROF_ALLOC_PERIOD unset, not running, or no
  // AllocationProvider in the composition). Any thread, not concurrently
  // with Start() or Stop(); it symbolizes, so it takes as long as a
  // capture's encoding (~0.1 s).
  absl::StatusOr<std::string> HeapProfile(absl::string_view default_type = "inuse_space") {
    return pipeline_.Snapshot(default_type);
  }

 protected:
  // What the composition's types fix of the profile.
  struct ProfileShape {
    std::vector<ValueType> sample_types;
    ValueType period_type;
    int64_t period = 0;  // the first provider's
    std::string engine;  // "unwinder=frame-pointer providers=cpu"
  };
  // Validates `options`: an invalid one is logged, and Start() returns it.
  ProfilerCommon(Options options, ProfileShape shape);
  ~ProfilerCommon();

  // The counters kept here, into `s`.
  void AddCommonStats(ProfilerStats& s) const;

  // Registry and aggregate locks held: the thread's entry in the aggregate,
  // made at its first sample.
  static void EnsureAggregateThread(SlotRecordState& slot, int64_t tid,
                                    SampleAggregator& agg);

  // Canonical label words for the aggregate (label_table.h), with the
  // "thread state" label ("running" or "blocked") when `state_label`.
  // `out` holds words.size() + 2.
  size_t CanonicalLabels(std::span<const uint64_t> words, bool state_label,
                         bool blocked, uint64_t* out) const;

  // Registry and aggregate locks held, after a drain of `slot`: its
  // counters now (`taken`, `dropped`, `truncated`), and the records it
  // added. A ring that dropped records since the last drain has their
  // values (taken from `dropped_values`, zeroed) added to a frame of
  // their own.
  void CountDrainedLocked(SlotRecordState& slot, SampleAggregator& agg,
                          uint64_t taken, uint64_t dropped, uint64_t truncated,
                          uint64_t recorded,
                          std::span<std::atomic<int64_t>> dropped_values);

  Options options_;
  absl::Status config_status_;
  Pipeline pipeline_;
  uint64_t session_;  // registry lock; new per Start()
  std::shared_ptr<Registry> registry_ = std::make_shared<Registry>();
  std::atomic<bool> running_{false};  // written under the registry lock
  std::atomic<uint64_t> taken_{0}, recorded_{0}, dropped_{0}, truncated_{0};
  std::atomic<uint64_t> threads_registered_{0}, profiles_written_{0};

 private:
  const uint64_t state_key_;
  const uint64_t running_value_;
  const uint64_t blocked_value_;
};

// The slots of one Slot type, pooled for the life of the process and never
// freed, so a late signal or a ScopedLabels on a thread whose registration
// ended reads and writes valid memory. The free list keeps room for every
// slot ever made, so Put never allocates: it runs where an exception must
// not escape (an unregistration, a registration undone for want of
// memory). Any thread.
template <typename Slot>
class SlotPool {
 public:
  // A pooled slot, or null when there is none.
  static Slot* Take() {
    Pool& pool = Get();
    std::lock_guard<std::mutex> lock(pool.mutex);
    if (pool.free.empty()) return nullptr;
    Slot* slot = pool.free.back();
    pool.free.pop_back();
    return slot;
  }
  // A new slot, `make()`'s. Either may throw std::bad_alloc (the heap
  // exhausted); nothing is kept then.
  template <typename Make>
  static Slot* MakeNew(Make&& make) {
    Pool& pool = Get();
    std::lock_guard<std::mutex> lock(pool.mutex);
    if (pool.free.capacity() <= pool.made) {
      pool.free.reserve(std::max<size_t>(16, 2 * pool.made));
    }
    Slot* slot = make();
    ++pool.made;
    return slot;
  }
  static void Put(Slot* slot) noexcept {
    Pool& pool = Get();
    std::lock_guard<std::mutex> lock(pool.mutex);
    pool.free.push_back(slot);  // within the room MakeNew kept
  }

 private:
  struct Pool {
    std::mutex mutex;
    std::vector<Slot*> free;
    size_t made = 0;
  };
  static Pool& Get() {
    static Pool* pool = [] {  // intentionally never destroyed
      auto* p = new Pool;
#if !defined(_WIN32)
      RegisterForkLock(&p->mutex, kForkRankSlotPool);
#endif
      return p;
    }();
    return *pool;
  }
};

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_PROFILER_COMMON_H_
