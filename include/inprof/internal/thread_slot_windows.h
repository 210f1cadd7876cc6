// internal: not part of the public API.
//
// The Windows counterpart of signal_dispatch.h's ThreadSlotHeader: what the
// sampler thread and ScopedLabels (labels.h) see of a registered thread.
// There is no signal handler on Windows: the sampler thread suspends the
// thread and reads this while it is suspended
// (profiler_sampler_windows.h). Below it, the calls the registry makes on
// the OS thread (thread_info_windows.cc).
//
// Thread-safety: `session` is atomic; the label fields are written only by
// the owning thread, in an order that makes any suspended state consistent
// (entries before the count that covers them), and read only while the
// owner is suspended.
#ifndef INPROF_INTERNAL_THREAD_SLOT_WINDOWS_H_
#define INPROF_INTERNAL_THREAD_SLOT_WINDOWS_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "inprof/unwinder.h"

namespace inprof::internal {

struct ThreadSlotHeader {
  // Session of the profiler the slot is registered with; 0 when free.
  std::atomic<uint64_t> session{0};
  uint32_t tid = 0;         // GetCurrentThreadId()
  void* handle = nullptr;   // the thread, opened to suspend, read and time it
  StackBounds stack;        // GetCurrentThreadStackLimits()

  // Labels the thread attached with ScopedLabels (labels.h), as pairs of
  // words (internal/label_table.h).
  static constexpr uint32_t kMaxLabels = 16;
  uint64_t label_words[2 * kMaxLabels] = {};
  uint32_t label_count = 0;
  uint64_t labels_overflowed = 0;
  // Bumped at each registration, so a ScopedLabels that outlives its
  // thread's registration never writes into a reused slot.
  uint64_t generation = 0;
  // Set by ThreadRegistration::Reset before it waits for the registry lock:
  // the sampler no longer picks the thread, whose CPU since its last sample
  // goes to its tail (its last stack). Otherwise a thread that finished its
  // work and waited for the lock the sampler held had that CPU charged to
  // the lock wait's stack (7.5% of a busy thread's CPU, once, with another
  // Wine test beside it: ProfilerWindowsTest.ABusyThreadAmongManyIdleOnesKeepsItsCpu).
  std::atomic<bool> leaving{false};
};

// The calling thread's slot.
ThreadSlotHeader* CurrentThreadSlot() noexcept;
void SetCurrentThreadSlot(ThreadSlotHeader* slot) noexcept;

// A process-unique id for a profiler instance (never 0).
uint64_t NewSessionId() noexcept;

// GetCurrentThreadId().
uint32_t CurrentTid() noexcept;

// What RegisterThread learns of the calling thread.
struct CurrentThreadInfo {
  uint32_t tid = 0;
  void* handle = nullptr;  // OpenThread: suspend, get context, query
  StackBounds stack;       // GetCurrentThreadStackLimits
};
// Describes (and opens) the calling thread; the error names the call that
// failed.
absl::StatusOr<CurrentThreadInfo> DescribeCurrentThread();
void CloseThreadHandle(void* handle) noexcept;
// The thread's description (SetThreadDescription), empty if none.
std::string ThreadDescription(void* handle);

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_THREAD_SLOT_WINDOWS_H_
