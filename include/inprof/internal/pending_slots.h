// include/inprof/internal/pending_slots.h: which registered threads left something for the collector since it last
// looked: a bit per slot, set by whatever leaves records or events in the
// slot (the signal handler, an event-driven provider), taken by the
// collector's pass, which then drains only those slots. Without it each
// pass read every slot's ring and counters: with 10,000 registered threads
// the collector spent ~8% of a core on slots that had nothing
// (bench/sampling/many_threads; docs/measurements.md).
#ifndef INPROF_INTERNAL_PENDING_SLOTS_H_
#define INPROF_INTERNAL_PENDING_SLOTS_H_

#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "inprof/internal/signal_dispatch.h"

namespace inprof::internal {

class PendingSlots {
 public:
  static constexpr size_t kSlotsPerChunk = 4096;
  static constexpr size_t kChunks = 256;
  static constexpr size_t kCapacity = kSlotsPerChunk * kChunks;  // 1,048,576

  PendingSlots() = default;
  PendingSlots(const PendingSlots&) = delete;
  PendingSlots& operator=(const PendingSlots&) = delete;
  ~PendingSlots();

  // Gives `slot` its bit, once, when the slot is created (slots live as
  // long as the process: the bit is never given to another). Past
  // kCapacity slots the slot gets none and overflowed() turns true.
  void Assign(ThreadSlotHeader* slot);

  // Some slot has no bit: the collector must read every slot.
  bool overflowed() const { return overflowed_.load(std::memory_order_acquire); }

  // Clears each set bit and calls f(slot) for its slot. One caller at a
  // time (the collector, under its registry lock). A slot marked while f
  // runs for it is passed again at the next call.
  template <typename F>
  void TakeEach(F&& f) {
    const size_t count = count_.load(std::memory_order_acquire);
    const size_t chunks = (count + kSlotsPerChunk - 1) / kSlotsPerChunk;
    for (size_t c = 0; c < chunks; ++c) {
      Chunk* chunk = chunks_[c].load(std::memory_order_acquire);
      if (chunk == nullptr) continue;
      for (size_t w = 0; w < kWordsPerChunk; ++w) {
        if (chunk->words[w].load(std::memory_order_relaxed) == 0) continue;
        uint64_t bits = chunk->words[w].exchange(0, std::memory_order_acq_rel);
        while (bits != 0) {
          const int b = std::countr_zero(bits);
          bits &= bits - 1;
          f(chunk->slots[w * 64 + static_cast<size_t>(b)]);
        }
      }
    }
  }

 private:
  static constexpr size_t kWordsPerChunk = kSlotsPerChunk / 64;
  struct Chunk {
    std::array<std::atomic<uint64_t>, kWordsPerChunk> words{};
    std::array<ThreadSlotHeader*, kSlotsPerChunk> slots{};
  };
  std::mutex mutex_;  // Assign
  std::atomic<size_t> count_{0};
  std::atomic<bool> overflowed_{false};
  std::array<std::atomic<Chunk*>, kChunks> chunks_{};
};

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_PENDING_SLOTS_H_
