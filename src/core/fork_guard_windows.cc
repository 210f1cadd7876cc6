// Windows has no fork(): nothing to guard (internal/fork_guard.h).
#include "inprof/internal/fork_guard.h"

namespace inprof::internal {

void RegisterForkLock(std::mutex* /*mutex*/, ForkLockRank /*rank*/) {}
void UnregisterForkLock(std::mutex* /*mutex*/) {}

}  // namespace inprof::internal
