// Windows has no fork(): nothing to guard (base/fork_guard.h).
#include "inprof/base/fork_guard.h"

namespace inprof::internal {

void RegisterForkLock(std::mutex* /*mutex*/, ForkLockRank /*rank*/) {}
void UnregisterForkLock(std::mutex* /*mutex*/) {}
bool InForkPrepare() { return false; }

}  // namespace inprof::internal
