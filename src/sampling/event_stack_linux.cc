#include "inprof/internal/event_stack.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "inprof/internal/label_table.h"
#include "inprof/internal/thread_info.h"

namespace inprof::internal {

EventThread EventThreadOf(size_t needed, uintptr_t caller, uintptr_t no_lookup_lo,
                          uintptr_t no_lookup_hi) {
  EventThread t;
  t.slot = CurrentThreadSlot();
  const uint64_t active = ActiveSession();
  t.registered = t.slot != nullptr && active != 0 &&
                 t.slot->session.load(std::memory_order_relaxed) == active;
  StackBounds stack;
  bool known = false;
  if (t.slot != nullptr && t.slot->stack.hi > t.slot->stack.lo) {
    stack = t.slot->stack;
    known = true;
  } else if (!(known = KnownCurrentThreadStack(&stack)) &&
             !(caller >= no_lookup_lo && caller < no_lookup_hi)) {
    known = CachedCurrentThreadStack(&stack);
  }
  const auto sp = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
  t.room = known && sp >= stack.lo && sp < stack.hi && sp - stack.lo >= needed;
  return t;
}

EventKey BuildEventKey(const EventKeyInput& input, uint64_t* key, size_t max_depth) {
  EventKey out;
  size_t nlabel_words = 0;
  uint64_t own[2 * ThreadSlotHeader::kMaxLabels + 2];
  size_t nown = 0;
  if (!input.thread.registered) {
    // A thread that never registered has no labels of its own: it is named
    // as such, so that its stacks stay apart from a registered thread's.
    own[0] = input.unregistered_label[0];
    own[1] = input.unregistered_label[1];
    nown = 2;
  } else {
    std::atomic_signal_fence(std::memory_order_acquire);
    uint32_t nlabels = input.thread.slot->label_count;
    if (nlabels > ThreadSlotHeader::kMaxLabels) nlabels = 0;
    nown = 2 * nlabels;
    std::memcpy(own, input.thread.slot->label_words, nown * sizeof(uint64_t));
  }
  nlabel_words = CanonicalLabelWords(std::span<const uint64_t>(own, nown), input.with_extra,
                                     input.extra_key, input.extra_value, key + 1);
  key[0] = nlabel_words;
  uint64_t* const frames = key + 1 + nlabel_words;
  static_assert(sizeof(uint64_t) == sizeof(uintptr_t));
  size_t depth = 0;
  if (input.unwind != nullptr) {
    depth = input.unwind(std::span<uintptr_t>(reinterpret_cast<uintptr_t*>(frames),
                                              max_depth + kEventWalkExtra));
  }
  // Cut at the code that made the call: the walk begins in the unwinder's
  // own frame, then the sampled path's, the hook's and the wrapper's. A
  // walk that never reaches the caller keeps its frames.
  size_t first = depth;
  for (size_t i = 0; i < depth; ++i) {
    if (frames[i] == input.caller) {
      first = i;
      break;
    }
  }
  if (depth > 0 && first == depth) {
    out.untrimmed = true;
    first = 0;
  }
  const size_t n = std::min(depth - first, max_depth);
  if (first > 0) std::memmove(frames, frames + first, n * sizeof(uint64_t));
  // The leaf is a return address, and the profile takes its leaf pc as
  // exact (pprof_writer.cc): point it into the call instead.
  if (n > 0 && first > 0) frames[0] -= 1;
  out.depth = n;
  out.length = 1 + nlabel_words + n;
  return out;
}

}  // namespace inprof::internal
