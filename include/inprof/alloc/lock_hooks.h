// internal: not part of the public API.
//
// LockHooks: times the waits of the process's lock calls, through the GOT
// slots AllocHooks patches (alloc_hooks.h: the same scan, the same writes,
// the same dlopen wrapper, one installation per process): while installed,
// the slots of pthread_mutex_lock, pthread_mutex_timedlock and _clocklock,
// pthread_rwlock_rdlock and _wrlock and their timed and clock forms point
// at inprof's wrappers, in the executable and every shared library
// (dlopen()ed later too). std::mutex, std::recursive_mutex,
// std::timed_mutex, std::shared_mutex and std::shared_timed_mutex call
// them from the code that locks (their members are inline).
//
// A wrapper tries the lock first (pthread_mutex_trylock,
// pthread_rwlock_tryrdlock or _trywrlock): an uncontended lock returns from
// there, untimed. Only a try that finds the lock busy (EBUSY) is followed by
// the original call, timed with CLOCK_MONOTONIC; any other answer of the
// try (0, EOWNERDEAD of a robust mutex, EAGAIN of a recursive count, EINVAL)
// is what the original would have returned, and is returned as it is. The
// original's return value and errno are never changed.
//
// Sampling by delay, as Go's block profile: a wait of at least the period
// is always sampled, with weight 1 wait and its delay; a shorter one with
// probability delay/period, weighted period/delay waits and period
// nanoseconds. Both estimates are unbiased: E[waits] = 1 and E[delay] =
// delay for every wait.
//
// What it cannot see: spin locks and futex calls written by hand (no
// library call), condition-variable waits (pthread_cond_wait takes its
// mutex back inside libc, without a slot), calls bound without a slot
// (static linking, -Bsymbolic), and absl::Mutex (its own futex code; its
// contention reaches inprof through absl::RegisterMutexTracer instead).
//
// The wrappers never allocate and take no lock of their own while a
// thread waits; the callback runs after the wait, on the waiting thread,
// holding the lock it waited for, with the thread's own lock calls passed
// straight through (a thread-local guard), and its allocations unsampled.
//
// Thread-safety: Install and Uninstall serialize with AllocHooks'.
// Uninstall does not wait for threads inside a wrapper: the callback's
// context must outlive every call that may have started before it
// returned.
#ifndef INPROF_ALLOC_LOCK_HOOKS_H_
#define INPROF_ALLOC_LOCK_HOOKS_H_

#include <cstdint>

#include "absl/status/status.h"

namespace inprof::internal {

// One sampled wait, as the callback sees it.
struct LockWait {
  const void* lock;      // the mutex or rwlock waited for
  uint64_t delay_ns;     // how long the call took, after a busy try
  double weight_count;   // what it stands for: waits
  double weight_delay;   // and nanoseconds
  // The wrapper's return address: the instruction after the call in the
  // code that locked (std::mutex::lock's inlined call), where a stack
  // walked on the sampled path is cut.
  uintptr_t caller;
};

using LockWaitCallback = void (*)(void* context, const LockWait& wait);

// A wait's sampling decision: `uniform` in [0, 1). Sampled when delay >=
// period, or with probability delay/period (uniform * period < delay);
// then *count and *delay hold its weights. period 0: never.
bool SampleLockWait(uint64_t delay_ns, uint64_t period_ns, double uniform, double* count,
                    double* delay);

class LockHooks {
 public:
  struct Options {
    uint64_t period_ns = 0;  // 0: the wrappers only forward
    LockWaitCallback callback = nullptr;
    void* context = nullptr;
  };

  // Process-wide counters, since the first Install.
  struct Stats {
    uint64_t waits = 0;    // busy tries followed by a timed wait
    uint64_t samples = 0;  // waits sampled (the callback called)
    uint64_t own = 0;      // waits of a lock call made inside the callback
  };

  // Whether this platform has GOT patching (Linux x86-64 and aarch64).
  static bool Supported();

  // Resolves the originals, sets the period and callback and patches the
  // lock functions' slots of every loaded object (and of those dlopen
  // loads later). FailedPrecondition when already installed by this
  // process; a forked child whose parent had installed them takes that
  // installation over. Not from a signal handler.
  static absl::Status Install(const Options& options);

  // Sets the period to 0 (no wait is timed after it returns), forgets the
  // callback and writes the lock slots back. No-op when not installed.
  static void Uninstall();
  // Sets the period to 0 and forgets the callback (atomics only, so a
  // forked child may call it): the wrappers only forward, the slots stay
  // patched until Uninstall or the next Install takes them over.
  static void Pause() noexcept;

  static bool Installed();
  static Stats stats();

  // A wait timed elsewhere (absl::Mutex's tracer: lock_wait_provider.h),
  // `delay_ns` on `lock`, reported from a frame whose return address is
  // `caller`: drawn and passed to the callback as a wrapper's own wait is.
  // Inside the callback (a lock of inprof's own) it is counted as `own`.
  static void ReportWait(const void* lock, uint64_t delay_ns, void* caller) noexcept;
};

}  // namespace inprof::internal

#endif  // INPROF_ALLOC_LOCK_HOOKS_H_
