#include "inprof/alloc/lock_hooks.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "inprof/base/alloc_guard.h"
#include "inprof/base/fork_guard.h"
#include "src/alloc/got_hooks.h"

namespace inprof::internal {
namespace {

// The period in nanoseconds; 0: the wrappers only forward (before Install,
// after Uninstall, in a forked child until it takes the hooks over).
std::atomic<uint64_t> g_period{0};
std::atomic<LockWaitCallback> g_callback{nullptr};
std::atomic<void*> g_context{nullptr};

// The tries, resolved at the first Install and never changed.
std::atomic<int (*)(pthread_mutex_t*)> g_mutex_trylock{nullptr};
std::atomic<int (*)(pthread_rwlock_t*)> g_rwlock_tryrdlock{nullptr};
std::atomic<int (*)(pthread_rwlock_t*)> g_rwlock_trywrlock{nullptr};

std::atomic<uint64_t> g_waits{0};
std::atomic<uint64_t> g_samples{0};
std::atomic<uint64_t> g_own{0};

// Set while the callback runs: the thread's own lock calls in it (the
// provider's mutex, the label table's) pass straight through.
__thread bool t_in_callback __attribute__((tls_model("initial-exec")));
// The thread's generator for the sampling draw (splitmix64; seeded from the
// clock and the variable's address at its first wait).
__thread uint64_t t_random __attribute__((tls_model("initial-exec")));

uint64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
}

double NextUniform(uint64_t seed) {
  if (t_random == 0) t_random = seed ^ reinterpret_cast<uintptr_t>(&t_random);
  uint64_t z = (t_random += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

// After a wait of `delay` on `lock`: the draw, and the callback when
// sampled. errno is the original call's on return.
__attribute__((noinline)) void AfterWait(const void* lock, uint64_t start, uint64_t end,
                                         void* caller) {
  g_waits.fetch_add(1, std::memory_order_relaxed);
  // fork()'s prepare handler takes inprof's locks one by one, the
  // callback's among them: a wait for a later one must not call back into
  // a lock the handler holds already (it did: a fork beside a thread that
  // held a leaf lock for a moment hung its parent).
  if (InForkPrepare()) {
    g_own.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  const uint64_t period = g_period.load(std::memory_order_relaxed);
  const uint64_t delay = end > start ? end - start : 0;
  double count = 0;
  double weight = 0;
  if (!SampleLockWait(delay, period, NextUniform(end), &count, &weight)) return;
  LockWaitCallback callback = g_callback.load(std::memory_order_acquire);
  if (callback == nullptr) return;
  g_samples.fetch_add(1, std::memory_order_relaxed);
  const int saved_errno = errno;
  AllocGuard guard;  // the callback's allocations are not sampled
  t_in_callback = true;
  callback(g_context.load(std::memory_order_relaxed),
           LockWait{lock, delay, count, weight, reinterpret_cast<uintptr_t>(caller)});
  t_in_callback = false;
  errno = saved_errno;
}

}  // namespace

void LockHooks::ReportWait(const void* lock, uint64_t delay_ns, void* caller) noexcept {
  if (t_in_callback) {
    g_own.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  const int saved_errno = errno;
  const uint64_t now = NowNs();
  AfterWait(lock, now - std::min(now, delay_ns), now, caller);
  errno = saved_errno;
}

namespace {

// A lock through `real(lock, args...)` after `try_lock(lock)` found it
// busy: the original, timed.
// Out of line: the uncontended path (LockCall) saves no register for it.
template <typename Lock, typename... Args>
__attribute__((noinline)) int TimedWait(AllocSymbol symbol, Lock* lock, void* caller,
                                        Args... args) {
  const uint64_t start = NowNs();
  const int rc = HookReal<int (*)(Lock*, Args...)>(symbol)(lock, args...);
  // EDEADLK: an error-checking mutex its owner locked again, which never
  // waited; anything else (0, a timeout, EOWNERDEAD) followed a wait.
  if (rc != EDEADLK) {
    const int saved_errno = errno;
    AfterWait(lock, start, NowNs(), caller);
    errno = saved_errno;
  }
  return rc;
}

template <typename L, typename... Args>
inline __attribute__((always_inline)) int LockCall(AllocSymbol symbol, int (*try_lock)(L*),
                                                   L* lock, void* caller, Args... args) {
  if (__builtin_expect(try_lock != nullptr && g_period.load(std::memory_order_relaxed) != 0,
                       1)) {
    const int rc = try_lock(lock);
    if (__builtin_expect(rc != EBUSY, 1)) return rc;  // taken, or the original's error
    // Busy. The callback's own waits (its lock, the label table's) are not
    // timed: the thread-local is read only here, off the uncontended path.
    if (__builtin_expect(!t_in_callback, 1)) return TimedWait(symbol, lock, caller, args...);
    g_own.fetch_add(1, std::memory_order_relaxed);
    return HookReal<int (*)(L*, Args...)>(symbol)(lock, args...);
  }
  return HookReal<int (*)(L*, Args...)>(symbol)(lock, args...);
}

inline int (*MutexTry())(pthread_mutex_t*) {
  return g_mutex_trylock.load(std::memory_order_relaxed);
}
inline int (*ReadTry())(pthread_rwlock_t*) {
  return g_rwlock_tryrdlock.load(std::memory_order_relaxed);
}
inline int (*WriteTry())(pthread_rwlock_t*) {
  return g_rwlock_trywrlock.load(std::memory_order_relaxed);
}

// The wrappers, each for its symbol; `__builtin_return_address(0)` is the
// instruction after the call in the code that locked.
extern "C" {
int inprof_pthread_mutex_lock(pthread_mutex_t* m) {
  return LockCall(kSymMutexLock, MutexTry(), m, __builtin_return_address(0));
}
int inprof_pthread_mutex_timedlock(pthread_mutex_t* m, const timespec* abstime) {
  return LockCall(kSymMutexTimedlock, MutexTry(), m, __builtin_return_address(0), abstime);
}
int inprof_pthread_mutex_clocklock(pthread_mutex_t* m, clockid_t clock, const timespec* abstime) {
  return LockCall(kSymMutexClocklock, MutexTry(), m, __builtin_return_address(0), clock,
                  abstime);
}
int inprof_pthread_rwlock_rdlock(pthread_rwlock_t* rw) {
  return LockCall(kSymRwlockRdlock, ReadTry(), rw, __builtin_return_address(0));
}
int inprof_pthread_rwlock_wrlock(pthread_rwlock_t* rw) {
  return LockCall(kSymRwlockWrlock, WriteTry(), rw, __builtin_return_address(0));
}
int inprof_pthread_rwlock_timedrdlock(pthread_rwlock_t* rw, const timespec* abstime) {
  return LockCall(kSymRwlockTimedrdlock, ReadTry(), rw, __builtin_return_address(0), abstime);
}
int inprof_pthread_rwlock_timedwrlock(pthread_rwlock_t* rw, const timespec* abstime) {
  return LockCall(kSymRwlockTimedwrlock, WriteTry(), rw, __builtin_return_address(0), abstime);
}
int inprof_pthread_rwlock_clockrdlock(pthread_rwlock_t* rw, clockid_t clock,
                                      const timespec* abstime) {
  return LockCall(kSymRwlockClockrdlock, ReadTry(), rw, __builtin_return_address(0), clock,
                  abstime);
}
int inprof_pthread_rwlock_clockwrlock(pthread_rwlock_t* rw, clockid_t clock,
                                      const timespec* abstime) {
  return LockCall(kSymRwlockClockwrlock, WriteTry(), rw, __builtin_return_address(0), clock,
                  abstime);
}
}  // extern "C"

template <typename Fn>
uintptr_t Address(Fn* fn) {
  return reinterpret_cast<uintptr_t>(fn);
}

}  // namespace

bool SampleLockWait(uint64_t delay_ns, uint64_t period_ns, double uniform, double* count,
                    double* delay) {
  if (period_ns == 0) return false;
  if (delay_ns >= period_ns) {
    *count = 1;
    *delay = static_cast<double>(delay_ns);
    return true;
  }
  // P(sampled) = delay/period; the weights are its inverse.
  if (delay_ns == 0 || uniform * static_cast<double>(period_ns) >= static_cast<double>(delay_ns)) {
    return false;
  }
  *count = static_cast<double>(period_ns) / static_cast<double>(delay_ns);
  *delay = static_cast<double>(period_ns);
  return true;
}

}  // namespace inprof::internal

namespace inprof::internal {

uintptr_t LockWrapperAddress(AllocSymbol symbol) {
  static const uintptr_t kAt[] = {
      Address(inprof_pthread_mutex_lock),         Address(inprof_pthread_mutex_timedlock),
      Address(inprof_pthread_mutex_clocklock),    Address(inprof_pthread_rwlock_rdlock),
      Address(inprof_pthread_rwlock_wrlock),      Address(inprof_pthread_rwlock_timedrdlock),
      Address(inprof_pthread_rwlock_timedwrlock), Address(inprof_pthread_rwlock_clockrdlock),
      Address(inprof_pthread_rwlock_clockwrlock),
  };
  static_assert(std::size(kAt) == kAllocSymbolCount - kSymMutexLock);
  if (symbol < kSymMutexLock || symbol >= kAllocSymbolCount) return 0;
  return kAt[symbol - kSymMutexLock];
}

bool LockHooks::Supported() { return true; }

absl::Status LockHooks::Install(const Options& options) {
  if (g_mutex_trylock.load(std::memory_order_acquire) == nullptr) {
    AllocGuard guard;
    // dlsym's answer: the definition the program binds (a sanitizer's
    // interceptor first, so that it sees every lock taken).
    g_rwlock_tryrdlock.store(reinterpret_cast<int (*)(pthread_rwlock_t*)>(
                                 dlsym(RTLD_DEFAULT, "pthread_rwlock_tryrdlock")),
                             std::memory_order_release);
    g_rwlock_trywrlock.store(reinterpret_cast<int (*)(pthread_rwlock_t*)>(
                                 dlsym(RTLD_DEFAULT, "pthread_rwlock_trywrlock")),
                             std::memory_order_release);
    g_mutex_trylock.store(reinterpret_cast<int (*)(pthread_mutex_t*)>(
                              dlsym(RTLD_DEFAULT, "pthread_mutex_trylock")),
                          std::memory_order_release);
  }
  bool taken_over = false;
  if (absl::Status s = InstallLockGroup(&taken_over); !s.ok()) return s;
  g_context.store(options.context, std::memory_order_relaxed);
  g_callback.store(options.callback, std::memory_order_release);
  g_period.store(options.period_ns, std::memory_order_release);
  return absl::OkStatus();
}

void LockHooks::Pause() noexcept {
  g_period.store(0, std::memory_order_release);
  g_callback.store(nullptr, std::memory_order_release);
}

void LockHooks::Uninstall() {
  Pause();
  UninstallLockGroup();
}

bool LockHooks::Installed() { return LockGroupInstalled(); }

LockHooks::Stats LockHooks::stats() {
  Stats s;
  s.waits = g_waits.load(std::memory_order_relaxed);
  s.samples = g_samples.load(std::memory_order_relaxed);
  s.own = g_own.load(std::memory_order_relaxed);
  return s;
}

}  // namespace inprof::internal
