// internal: not part of the public API.
//
// fork() copies only the calling thread. A lock that another thread (the
// collector, the wall ticker, a thread registering) holds at that moment
// stays locked forever in the child, whose first ThreadRegistration::Reset(),
// RegisterThread() or Stop() then hangs: 13% of the children forked while the
// collector drained every millisecond did (tests/safety_fork_test.cc).
//
// pthread_atfork handlers therefore take every lock a child may need just
// before fork() and release them in both processes after it, like glibc does
// for malloc's arenas. They are taken in rank order, which is the order in
// which inprof's threads nest them, so the handler cannot deadlock with them:
// a fork() waits at most for the longest critical section (a collector pass:
// microseconds, or the DWARF tables' rebuild after a dlopen: tens of ms).
#ifndef INPROF_BASE_FORK_GUARD_H_
#define INPROF_BASE_FORK_GUARD_H_

#include <mutex>

namespace inprof::internal {

enum ForkLockRank {
  kForkRankOutermost = -1, // the gperftools drop-in's heap dumps (a dump
                           // takes the profiler's locks under it)
  kForkRankModules = 0,    // DWARF module state (a rebuild drains the rings
                           // between two tables: registry lock under it)
  kForkRankRegistry = 1,   // a profiler's registry lock
  kForkRankAggregate = 2,  // its aggregate lock (taken under the registry's)
  kForkRankSlotPool = 3,   // slot pools (taken under the registry's)
  kForkRankGlobal = 4,     // label table, handler install
  kForkRankLeaf = 5,       // locks under which nothing else is taken
                           // (the preload library's thread table)
};

// Adds `mutex` to the locks held across fork(). Thread-safe; the first call
// installs the pthread_atfork handlers. Never call it while holding a lock
// that is registered here (the prepare handler holds the list's lock while
// it takes them): inprof registers its global locks at static
// initialisation and a profiler's in its constructor.
void RegisterForkLock(std::mutex* mutex, ForkLockRank rank);
// Removes it (before the mutex is destroyed).
void UnregisterForkLock(std::mutex* mutex);

// Whether the calling thread is in fork()'s prepare handler: from before it
// takes the first of these locks until the parent's or child's handler has
// released them. Code that the handler's own lock calls may reach (the
// lock hooks' sampling callback, which takes a lock registered here) must
// do nothing then: the handler may hold that lock already.
bool InForkPrepare();

}  // namespace inprof::internal

#endif  // INPROF_BASE_FORK_GUARD_H_
