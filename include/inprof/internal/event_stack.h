// internal: not part of the public API.
//
// What the event providers (AllocationProvider, LockWaitProvider) share on
// their sampled path, on the thread that causes the event: which thread it
// is and whether its stack has room for the walk (EventThreadOf), and the
// event's key, its labels and its stack walked there and cut at the code
// that made the call (BuildEventKey). A key is [number of label words, the
// canonical label words, the frames]; the providers intern it.
//
// Thread-safety: both run on the calling thread and touch only its slot
// (which only it writes) and the buffers they are given.
#ifndef INPROF_INTERNAL_EVENT_STACK_H_
#define INPROF_INTERNAL_EVENT_STACK_H_

#include <cstddef>
#include <cstdint>
#include <span>

#include "inprof/internal/signal_dispatch.h"

namespace inprof::internal {

// The calling thread, as an event provider sees it.
struct EventThread {
  ThreadSlotHeader* slot = nullptr;  // its slot, when it has one
  bool registered = false;           // with the profiler running now
  // Whether it runs on its own stack with at least the room asked for
  // (false on a signal's alternate stack, a coroutine's, near its end).
  bool room = false;
};

// `needed`: the bytes the sampled path may use past this call. The bounds
// of a thread that never registered are looked up once per thread
// (pthread_getattr_np), unless `caller` lies in [no_lookup_lo,
// no_lookup_hi): code that may hold the thread's own lock (libc's).
EventThread EventThreadOf(size_t needed, uintptr_t caller, uintptr_t no_lookup_lo,
                          uintptr_t no_lookup_hi);

// The frames beyond a key's depth the walk may need: the unwinder's, the
// sampled path's and the hook's own frames, cut afterwards.
inline constexpr size_t kEventWalkExtra = 10;
// The most label words a key holds (the thread's labels and one pair more).
inline constexpr size_t kEventKeyLabelWords = 2 * ThreadSlotHeader::kMaxLabels + 2;
// A key's size for `max_depth` frames.
constexpr size_t EventKeyWords(size_t max_depth) {
  return 1 + kEventKeyLabelWords + max_depth + kEventWalkExtra;
}

struct EventKeyInput {
  // EventContext::unwind; null: no frames.
  size_t (*unwind)(std::span<uintptr_t> out) noexcept = nullptr;
  uintptr_t caller = 0;  // the return address in the code that made the call
  EventThread thread;
  // The label pair a thread that never registered carries (it has none of
  // its own), and one more pair every key carries when `with_extra` (the
  // lock's address).
  const uint64_t* unregistered_label = nullptr;
  bool with_extra = false;
  uint64_t extra_key = 0;
  uint64_t extra_value = 0;
};

struct EventKey {
  size_t length = 0;       // words of the key; 1 + label words when no frame
  size_t depth = 0;        // frames kept
  bool untrimmed = false;  // the walk never reached `caller`: kept whole
};

// Writes the key to `key` (EventKeyWords(max_depth) words): the labels,
// then the frames, walked into the key's own tail and cut at `caller`; the
// leaf points into the call (the profile takes a leaf pc as exact).
EventKey BuildEventKey(const EventKeyInput& input, uint64_t* key, size_t max_depth);

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_EVENT_STACK_H_
