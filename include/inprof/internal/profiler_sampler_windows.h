// internal: not part of the public API (include inprof/profiler.h).
//
// The Windows profiler's sampler thread ("inprof-sampler", dd-win-prof's
// StackSamplerLoop): what the signal handler (sample_handler.h) does on
// Linux. At each of a provider's ticks it reads the registered threads'
// CPU counters without stopping them and lets the provider pick whom to
// sample (VisitProvider); each picked thread is then suspended once, its
// registers, stack and labels copied, and resumed
// (thread_snapshot_windows.h); the copy is walked after the thread runs
// again (U), and one record per provider goes into the thread's ring
// (SampleThread). The collector's half (profiler_collector_windows.h, its
// base) reads the records back.
//
// Never suspended: the sampler itself, the collector and the exporter (they
// never register), and a thread that is not registered or is unregistering.
//
// Between ProfilerCollector and Profiler (windows/profiler_windows.h),
// which derives from it. The record's shape: profiler_layout_windows.h.
#ifndef INPROF_INTERNAL_PROFILER_SAMPLER_WINDOWS_H_
#define INPROF_INTERNAL_PROFILER_SAMPLER_WINDOWS_H_

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "inprof/base/platform.h"
#include "inprof/internal/profiler_collector_windows.h"
#include "inprof/internal/profiler_layout_windows.h"
#include "inprof/base/profiler_thread.h"
#include "inprof/internal/sample_record.h"
#include "inprof/internal/thread_slot_windows.h"
#include "inprof/internal/thread_snapshot_windows.h"
#include "inprof/spsc_ring.h"
#include "inprof/unwinder.h"
#include "inprof/windows/sample_provider_windows.h"

namespace inprof::internal {

template <Unwinder U, SampleRing R, SampleProvider... Ps>
class ProfilerSampler : public ProfilerCollector<U, R, Ps...> {
 protected:
  using Base = ProfilerCollector<U, R, Ps...>;
  using L = ProfilerLayout<U, R, Ps...>;
  using Slot = typename L::Slot;
  // The state this part uses (profiler_collector_windows.h).
  using Base::providers_, Base::session_, Base::registry_, Base::active_, Base::running_;

  using Base::Base;

  // A sample a provider asked for in this tick.
  struct Pending {
    Slot* slot;
    uint64_t generation;
    uint8_t provider;
    bool same_stack;  // VisitDecision::kSameStack
    bool blocked;     // the provider's thread-state label
    std::array<int64_t, L::kMaxValuesPerProvider> values;
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

 private:
  void SamplerLoop() {
    internal::SetCurrentThreadName("inprof-sampler");
    std::array<int64_t, L::kNumProviders> period{};
    std::array<int64_t, L::kNumProviders> due{};
    const int64_t start = internal::MonotonicNanos();
    for (size_t i = 0; i < L::kNumProviders; ++i) {
      period[i] = absl::ToInt64Nanoseconds(L::kOps[i].tick_period(this->provider_objects_[i]));
      due[i] = start + period[i];
    }
    std::unique_lock<std::mutex> lock(sampler_->mutex);
    while (!sampler_->stop) {
      int64_t next = INT64_MAX;
      for (size_t i = 0; i < L::kNumProviders; ++i) {
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
      std::array<bool, L::kNumProviders> ticking{};
      for (size_t i = 0; i < L::kNumProviders; ++i) {
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
  void Tick(int64_t now, const std::array<bool, L::kNumProviders>& ticking) {
    pending_.clear();
    {
      std::lock_guard<std::mutex> lock(registry_->mutex);
      if (!running_) return;
      VisitEach(now, ticking, std::make_index_sequence<L::kNumProviders>{});
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
  void VisitEach(int64_t now, const std::array<bool, L::kNumProviders>& ticking,
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
    if constexpr (SparesIdleThreads<P>) {
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
          std::span<int64_t>(p.values.data(), L::kValueCounts[I]));
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
    uint64_t words[L::kMaxLabelWords];
  };
  // While the thread is suspended: its labels as they are (entries are
  // written before the count that covers them, labels.cc).
  static void CopyLabels(void* arg) noexcept {
    auto* c = static_cast<LabelCopy*>(arg);
    uint32_t count = *const_cast<volatile const uint32_t*>(&c->slot->label_count);
    if (count > L::kMaxLabels) count = 0;
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
          L::kMaxRecordWords -
              internal::RecordLayout{.values = L::kMaxValuesPerProvider, .labels = labels.count}
                  .frames_at());
      unwound = unwinder.Unwind(snapshotter_->snapshot(), slot->stack,
                                std::span<uintptr_t>(frames_.data(), max_frames));
    }
    std::lock_guard<std::mutex> lock(registry_->mutex);
    if (!StillSampled(slot, generation)) return;  // as above
    slot->pick_in_flight = false;
    for (const Pending& p : entries) {
      const size_t nvalues = L::kValueCounts[p.provider];
      internal::RecordMeta meta;
      meta.provider = static_cast<uint8_t>(p.provider);
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
      // No leaf words here (sample_record.h: RecordLayout).
      const internal::RecordLayout at{.values = nvalues, .labels = labels.count, .depth = depth};
      internal::WriteRecordHeader(record_.data(), at, meta, p.values.data());
      for (size_t w = 0; w < 2 * labels.count; ++w) record_[at.labels_at() + w] = labels.words[w];
      for (size_t f = 0; f < depth; ++f) record_[at.frames_at() + f] = frames_[f];
      slot->samples_taken.fetch_add(1, std::memory_order_relaxed);
      if (!slot->ring.TryPush(std::span<const uint64_t>(record_.data(), at.size()))) {
        const size_t offset = L::kValueOffsets[p.provider];
        for (size_t v = 0; v < nvalues; ++v) {
          slot->dropped_values[offset + v].fetch_add(p.values[v], std::memory_order_relaxed);
        }
      } else if (depth > 0) {
        slot->has_stack = true;
      }
    }
  }

 protected:
  // Sampler-owned: the picks of a tick, the snapshot and walk buffers.
  std::vector<Pending> pending_;
  std::unique_ptr<internal::ThreadSnapshotter> snapshotter_;

 private:
  std::array<size_t, L::kNumProviders> cursor_{};  // registry lock
  std::vector<uintptr_t> frames_ = std::vector<uintptr_t>(L::kMaxFrames);
  std::vector<uint64_t> record_ = std::vector<uint64_t>(L::kMaxRecordWords);
  std::unique_ptr<Sampler> sampler_ = std::make_unique<Sampler>();
};

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_PROFILER_SAMPLER_WINDOWS_H_
