#include "inprof/labels.h"

#include <atomic>

#include "inprof/base/alloc_guard.h"
#include "inprof/internal/label_table.h"

namespace inprof {

ScopedLabels::ScopedLabels(std::initializer_list<Label> labels) {
  internal::AllocGuard guard;  // interning: inprof's allocation, not the host's
  internal::ThreadSlotHeader* slot = internal::CurrentThreadSlot();
  if (slot == nullptr || slot->session.load(std::memory_order_relaxed) == 0) {
    return;
  }
  internal::LabelTable& table = internal::LabelTable::Global();
  slot_ = slot;
  generation_ = slot->generation;
  begin_ = end_ = slot->label_count;
  for (const Label& label : labels) {
    if (end_ >= internal::ThreadSlotHeader::kMaxLabels) {
      ++slot->labels_overflowed;
      continue;
    }
    uint64_t key = table.Intern(label.key);
    uint64_t value = 0;
    if (label.numeric) {
      key |= internal::kNumericLabel;
      value = static_cast<uint64_t>(label.num);
    } else {
      value = table.Intern(label.str);
    }
    // Relaxed atomic stores (plain moves on x86): the wall ticker reads a
    // waiting thread's labels from another thread (ProfilerCollector::
    // ReadBlockedStack, relaxed loads, kept only when the thread's CPU
    // clock shows it did not run meanwhile); plain stores made that a
    // data race (clang's TSan reports it).
    __atomic_store_n(&slot->label_words[2 * end_], key, __ATOMIC_RELAXED);
    __atomic_store_n(&slot->label_words[2 * end_ + 1], value, __ATOMIC_RELAXED);
    ++end_;
  }
  // Entries first, then the count the handler reads (same thread: a signal
  // fence is the whole synchronisation needed).
  std::atomic_signal_fence(std::memory_order_release);
  __atomic_store_n(&slot->label_count, end_, __ATOMIC_RELAXED);
  std::atomic_signal_fence(std::memory_order_release);
}

ScopedLabels::~ScopedLabels() {
  if (slot_ == nullptr) return;
  if (internal::CurrentThreadSlot() != slot_ ||
      slot_->generation != generation_) {
    return;  // the registration ended inside the scope: nothing to undo
  }
  std::atomic_signal_fence(std::memory_order_release);
  __atomic_store_n(&slot_->label_count, begin_, __ATOMIC_RELAXED);
  std::atomic_signal_fence(std::memory_order_release);
}

}  // namespace inprof
