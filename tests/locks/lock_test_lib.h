// The lock calls of tests/locks/lock_test_lib.cc (a shared library).
#ifndef INPROF_TESTS_LOCKS_LOCK_TEST_LIB_H_
#define INPROF_TESTS_LOCKS_LOCK_TEST_LIB_H_

#include <pthread.h>
#include <time.h>

#include <mutex>
#include <shared_mutex>

extern "C" {
int LockTestMutexLock(pthread_mutex_t* m);
int LockTestMutexTimedlock(pthread_mutex_t* m, const timespec* deadline);
}
void LockTestStdLock(std::mutex& m);
void LockTestSharedLockUnlock(std::shared_mutex& m);

#endif  // INPROF_TESTS_LOCKS_LOCK_TEST_LIB_H_
