// A shared library for lock_wait_provider_test: its lock calls go through
// its own GOT slots, as any library's do. Under a sanitizer whose runtime
// is linked statically (TSan), the test executable's own calls bind to the
// runtime's interceptors directly, without a slot; this library's are
// patched everywhere, so the tests lock through it.
#include <pthread.h>
#include <time.h>

#include <mutex>
#include <shared_mutex>

#include "locks/lock_test_lib.h"

extern "C" {
int LockTestMutexLock(pthread_mutex_t* m) { return pthread_mutex_lock(m); }
int LockTestMutexTimedlock(pthread_mutex_t* m, const timespec* deadline) {
  return pthread_mutex_timedlock(m, deadline);
}
}  // extern "C"

// std::mutex::lock and shared_mutex::lock_shared are one call each to the
// pthread function; made here directly, since an unoptimized build (the
// sanitizers') keeps them out of line as weak functions that bind to the
// executable's copies, whose calls are the executable's.
void LockTestStdLock(std::mutex& m) { pthread_mutex_lock(m.native_handle()); }
void LockTestSharedLockUnlock(std::shared_mutex& m) {
  auto* rw = static_cast<pthread_rwlock_t*>(m.native_handle());
  pthread_rwlock_rdlock(rw);
  pthread_rwlock_unlock(rw);
}
