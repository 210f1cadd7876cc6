// Windows: handles are not numbers a program reuses under inprof (a handle
// value stays inprof's until inprof closes it), so there are no tables to
// keep apart: what owned_fd.h's table functions run, runs here, contained.
#include "inprof/base/owned_fd.h"

#include "inprof/base/contained.h"

namespace inprof::internal {

uint32_t CurrentDescriptorTable() noexcept { return 0; }

DescriptorTableHandle ThisDescriptorTable() noexcept { return {}; }

void JoinDescriptorTable(const DescriptorTableHandle&) noexcept {}

bool RunWithOwnDescriptors(const std::function<void()>& fn) {
  return RunContained("a file read of inprof's", fn);
}

void EndFileThread() noexcept {}

}  // namespace inprof::internal
