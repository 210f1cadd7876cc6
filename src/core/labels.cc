#include "inprof/labels.h"

#include <atomic>

#include "inprof/internal/label_table.h"

namespace inprof {

ScopedLabels::ScopedLabels(std::initializer_list<Label> labels) {
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
    slot->label_words[2 * end_] = key;
    slot->label_words[2 * end_ + 1] = value;
    ++end_;
  }
  // Entries first, then the count the handler reads (same thread: a signal
  // fence is the whole synchronisation needed).
  std::atomic_signal_fence(std::memory_order_release);
  slot->label_count = end_;
  std::atomic_signal_fence(std::memory_order_release);
}

ScopedLabels::~ScopedLabels() {
  if (slot_ == nullptr) return;
  if (internal::CurrentThreadSlot() != slot_ ||
      slot_->generation != generation_) {
    return;  // the registration ended inside the scope: nothing to undo
  }
  std::atomic_signal_fence(std::memory_order_release);
  slot_->label_count = begin_;
  std::atomic_signal_fence(std::memory_order_release);
}

}  // namespace inprof
