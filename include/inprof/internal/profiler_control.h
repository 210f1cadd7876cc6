// internal: not part of the public API (its types are: ThreadRegistration,
// ScopedProfiler; include inprof/profiler.h).
//
// What every platform's Profiler (profiler.h on Linux, profiler_windows.h
// on Windows) shares: the registry a ThreadRegistration calls back into,
// the registration handle itself, and ScopedProfiler.
//
// Thread-safety: a ThreadRegistration may be destroyed on any thread (see
// profiler.h); the registry's mutex serializes it with the profiler.
#ifndef INPROF_INTERNAL_PROFILER_CONTROL_H_
#define INPROF_INTERNAL_PROFILER_CONTROL_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "inprof/base/alloc_guard.h"
#include "inprof/base/log.h"
#if defined(_WIN32)
#include "inprof/internal/thread_slot_windows.h"
#else
#include "inprof/internal/signal_dispatch.h"
#include "inprof/internal/thread_info.h"
#endif

namespace inprof {

namespace internal {

// What a ThreadRegistration calls back into; outlives the Profiler so that a
// handle destroyed late finds out instead of touching freed memory.
class Registry {
 public:
  struct Owner {
    // Called with `lock` (on `mutex`) held; may release it for a while and
    // holds it again on return. The owner outlives that (its Stop() and
    // destructor wait for such work).
    virtual void Unregister(ThreadSlotHeader* slot, bool on_owner_thread,
                            std::unique_lock<std::mutex>& lock) = 0;

   protected:
    ~Owner() = default;
  };
  std::mutex mutex;
  Owner* owner = nullptr;  // null once the Profiler is gone
  // Registrations and unregistrations (ThreadRegistration::Reset) that
  // ran out of memory; the owner's stats show them.
  std::atomic<uint64_t> without_memory{0};
#if !defined(_WIN32)
  // The owner finishes unregistrations that threads queue on `retired`
  // without the lock (ThreadSlotHeader::retiring); false once it is gone
  // or when one of its providers needs the thread alive to unregister it.
  std::atomic<bool> defers_retire{false};
  std::atomic<ThreadSlotHeader*> retired{nullptr};
  std::atomic<uint32_t> retired_count{0};  // about how many are queued
  // On the owning thread: queues its slot. False (nothing done) when the
  // owner does not take them.
  bool TryRetireWithoutLock(ThreadSlotHeader* slot) noexcept {
    if (!defers_retire.load(std::memory_order_acquire)) return false;
    BeginRetireOnOwnThread(*slot);
    ThreadSlotHeader* head = retired.load(std::memory_order_relaxed);
    do {
      slot->next_retired = head;
    } while (!retired.compare_exchange_weak(head, slot, std::memory_order_release,
                                            std::memory_order_relaxed));
    retired_count.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  // Owner, registry lock held: the slots queued so far, newest first.
  ThreadSlotHeader* TakeRetired() noexcept {
    if (retired.load(std::memory_order_relaxed) == nullptr) return nullptr;
    retired_count.store(0, std::memory_order_relaxed);
    return retired.exchange(nullptr, std::memory_order_acquire);
  }
#endif
};

// The part of a profiler that ScopedProfiler drives.
class ProfilerControl {
 public:
  virtual absl::Status Start() = 0;
  virtual absl::Status Stop() = 0;
  // Whether `start_error`, which Start() returned, was logged already (an
  // invalid option is said at construction): ScopedProfiler does not say it
  // again.
  virtual bool StartErrorLogged(const absl::Status& /*start_error*/) const {
    return false;
  }

 protected:
  ~ProfilerControl() = default;
};

}  // namespace internal

// A registered thread. Move-only; unregisters on destruction.
class ThreadRegistration {
 public:
  // An inert registration (profiler disabled, or registration failed).
  ThreadRegistration() = default;
  explicit ThreadRegistration(absl::Status why_inert)
      : status_(std::move(why_inert)) {}
  ThreadRegistration(std::shared_ptr<internal::Registry> registry,
                     internal::ThreadSlotHeader* slot, int64_t tid)
      : registry_(std::move(registry)), slot_(slot), tid_(tid) {}
  ThreadRegistration(ThreadRegistration&& other) noexcept { *this = std::move(other); }
  ThreadRegistration& operator=(ThreadRegistration&& other) noexcept {
    if (this != &other) {
      Reset();
      registry_ = std::move(other.registry_);
      slot_ = std::exchange(other.slot_, nullptr);
      tid_ = other.tid_;
      status_ = std::move(other.status_);
    }
    return *this;
  }
  ThreadRegistration(const ThreadRegistration&) = delete;
  ThreadRegistration& operator=(const ThreadRegistration&) = delete;
  ~ThreadRegistration() { Reset(); }

  // True while the thread is registered.
  bool active() const { return slot_ != nullptr; }
  // Why the registration is inert (OK for an active one, or when the
  // profiler is disabled).
  const absl::Status& status() const { return status_; }

  // Unregisters now. Idempotent. Never throws: with the heap exhausted
  // (the drain of the thread's last samples allocates), the thread leaves
  // the profiler without them rather than ending the program in
  // std::terminate (this runs in a destructor).
  void Reset() noexcept {
    if (slot_ == nullptr) return;
    try {
      ResetOrThrow();
    } catch (const std::bad_alloc&) {
      registry_->without_memory.fetch_add(1, std::memory_order_relaxed);
#if !defined(_WIN32)
      if (static_cast<int64_t>(internal::CurrentTid()) == tid_ &&
          internal::CurrentThreadSlot() == slot_) {
        internal::SetCurrentThreadSlot(nullptr);
      }
#endif
      slot_ = nullptr;
    }
  }

 private:
  void ResetOrThrow() {
    // What the unregistration allocates is inprof's, not the host's.
    internal::AllocGuard guard;
#if !defined(_WIN32)
    if (internal::CurrentThreadSlot() == slot_) {
      // On its own thread: what it still owes is sampled, and its tails end
      // here, before the unregistration's own work (disarming, draining).
      if (slot_->before_retire != nullptr) slot_->before_retire(slot_);
      internal::MarkUnregistering(*slot_);
    }
#endif
#if defined(_WIN32)
    slot_->leaving.store(true, std::memory_order_release);
    std::unique_lock<std::mutex> lock(registry_->mutex);
#else
    // On its own thread, a registration that finds the registry lock taken
    // does not wait for it: a pool of 1,000 threads ending at once queued
    // behind it, ~70 us of CPU a thread on a 2-core VM (bench/core
    // BM_Profiler_RegistrationBurst). It queues its slot and the collector
    // finishes the unregistration. Uncontended, it unregisters at once, so
    // its slot is reused by the next thread that registers. (Its TLS
    // pointer is the slot only on the thread that owns it.)
    std::unique_lock<std::mutex> lock(registry_->mutex, std::try_to_lock);
    if (!lock.owns_lock()) {
      if (internal::CurrentThreadSlot() == slot_ &&
          registry_->TryRetireWithoutLock(slot_)) {
        slot_ = nullptr;
        return;
      }
      lock.lock();
    }
#endif
    const bool own_thread = static_cast<int64_t>(internal::CurrentTid()) == tid_;
    if (registry_->owner != nullptr) {
      registry_->owner->Unregister(slot_, own_thread, lock);
    } else if (own_thread &&
               internal::CurrentThreadSlot() == slot_) {
      internal::SetCurrentThreadSlot(nullptr);
    }
    slot_ = nullptr;
  }

  std::shared_ptr<internal::Registry> registry_;
  internal::ThreadSlotHeader* slot_ = nullptr;
  int64_t tid_ = 0;
  absl::Status status_;
};

// Starts a profiler on construction and stops it (writing the profile) on
// destruction. Errors are logged on one line; the host keeps running.
class ScopedProfiler {
 public:
  explicit ScopedProfiler(internal::ProfilerControl& profiler)
      : profiler_(profiler), start_status_(profiler.Start()) {
    if (!start_status_.ok() && !profiler.StartErrorLogged(start_status_)) {
      internal::Log(absl::StrCat("profiler not started: ",
                                 start_status_.message()));
    }
  }
  ~ScopedProfiler() {
    if (start_status_.ok()) profiler_.Stop().IgnoreError();
  }
  ScopedProfiler(const ScopedProfiler&) = delete;
  ScopedProfiler& operator=(const ScopedProfiler&) = delete;

  // Why the profiler did not start (OK if it did).
  const absl::Status& start_status() const { return start_status_; }

 private:
  internal::ProfilerControl& profiler_;
  absl::Status start_status_;
};

}  // namespace inprof

#endif  // INPROF_INTERNAL_PROFILER_CONTROL_H_
