#include "inprof/base/contained.h"

#include <atomic>
#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "inprof/base/log.h"

namespace inprof::internal {
namespace {
std::atomic<uint64_t> g_failures{0};
// The `what`s already logged (a handful of names, each a string literal).
constexpr int kMaxLogged = 32;
std::atomic<const char*> g_logged[kMaxLogged];

bool FirstOf(const char* what) {
  for (auto& slot : g_logged) {
    const char* seen = slot.load(std::memory_order_acquire);
    if (seen == what) return false;
    if (seen == nullptr) {
      if (slot.compare_exchange_strong(seen, what, std::memory_order_acq_rel)) return true;
      if (seen == what) return false;
    }
  }
  return false;  // more names than slots: the count still goes up
}
}  // namespace

void NoteContainedFailure(const char* what, const char* error) noexcept {
  g_failures.fetch_add(1, std::memory_order_relaxed);
  if (!FirstOf(what)) return;
  try {
    Log(absl::StrCat(what, " failed (", error,
                     "): skipped, and again each time it fails; the program runs on"));
  } catch (...) {
    // No memory for the line: a fixed one.
    WriteLineToStderr("inprof: a profiler thread's work failed for want of memory: "
                      "skipped; the program runs on\n");
  }
}

uint64_t ContainedFailures() noexcept { return g_failures.load(std::memory_order_relaxed); }

}  // namespace inprof::internal
