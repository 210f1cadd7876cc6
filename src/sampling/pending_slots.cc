#include "inprof/internal/pending_slots.h"

#include <mutex>

namespace inprof::internal {

PendingSlots::~PendingSlots() {
  for (auto& chunk : chunks_) delete chunk.load(std::memory_order_relaxed);
}

void PendingSlots::Assign(ThreadSlotHeader* slot) {
  std::lock_guard<std::mutex> lock(mutex_);
  const size_t index = count_.load(std::memory_order_relaxed);
  if (index >= kCapacity) {
    overflowed_.store(true, std::memory_order_release);
    return;
  }
  const size_t c = index / kSlotsPerChunk;
  Chunk* chunk = chunks_[c].load(std::memory_order_relaxed);
  if (chunk == nullptr) {
    chunk = new Chunk;
    chunks_[c].store(chunk, std::memory_order_release);
  }
  const size_t in_chunk = index % kSlotsPerChunk;
  chunk->slots[in_chunk] = slot;
  slot->pending_word = &chunk->words[in_chunk / 64];
  slot->pending_bit = uint64_t{1} << (in_chunk % 64);
  count_.store(index + 1, std::memory_order_release);
}

}  // namespace inprof::internal
