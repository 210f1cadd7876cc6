#include "inprof/base/fork_guard.h"

#include <pthread.h>

#include <algorithm>
#include <utility>
#include <vector>

namespace inprof::internal {
namespace {

struct ForkLocks {
  std::mutex mutex;  // guards `locks`; held from prepare to parent/child
  std::vector<std::pair<int, std::mutex*>> locks;  // sorted by rank
  bool installed = false;
};

// Never destroyed: fork() may run during static destruction.
ForkLocks& Locks() {
  static ForkLocks* locks = new ForkLocks;
  return *locks;
}

// Set on the thread that forks, while its handlers hold the locks.
__thread bool t_in_prepare __attribute__((tls_model("initial-exec")));

void Prepare() {
  t_in_prepare = true;
  ForkLocks& f = Locks();
  f.mutex.lock();
  for (auto& [rank, mutex] : f.locks) mutex->lock();
}

void Release() {
  ForkLocks& f = Locks();
  for (auto it = f.locks.rbegin(); it != f.locks.rend(); ++it) {
    it->second->unlock();
  }
  f.mutex.unlock();
  t_in_prepare = false;
}

}  // namespace

void RegisterForkLock(std::mutex* mutex, ForkLockRank rank) {
  ForkLocks& f = Locks();
  std::lock_guard<std::mutex> lock(f.mutex);
  if (!f.installed) {
    pthread_atfork(&Prepare, &Release, &Release);
    f.installed = true;
  }
  // After the last of its rank: a profiler's registry lock comes before
  // its aggregate lock whatever the interleaving of constructors.
  auto at = std::upper_bound(
      f.locks.begin(), f.locks.end(), static_cast<int>(rank),
      [](int r, const std::pair<int, std::mutex*>& e) { return r < e.first; });
  f.locks.insert(at, {static_cast<int>(rank), mutex});
}

bool InForkPrepare() { return t_in_prepare; }

void UnregisterForkLock(std::mutex* mutex) {
  ForkLocks& f = Locks();
  std::lock_guard<std::mutex> lock(f.mutex);
  f.locks.erase(std::remove_if(f.locks.begin(), f.locks.end(),
                               [mutex](const auto& e) { return e.second == mutex; }),
                f.locks.end());
}

}  // namespace inprof::internal
