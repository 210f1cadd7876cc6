// The collector's per-slot bits (include/inprof/internal/pending_slots.h):
// what a handler marks is taken once, and no mark is ever lost to a take
// running beside it.
#include "inprof/internal/pending_slots.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "inprof/internal/signal_dispatch.h"

namespace inprof::internal {
namespace {

std::vector<size_t> Take(PendingSlots& pending, const std::vector<ThreadSlotHeader>& slots) {
  std::vector<size_t> taken;
  pending.TakeEach([&](ThreadSlotHeader* slot) {
    taken.push_back(static_cast<size_t>(slot - slots.data()));
  });
  std::sort(taken.begin(), taken.end());
  return taken;
}

TEST(PendingSlotsTest, AMarkedSlotIsTakenOnceAcrossChunks) {
  // 5,000 slots: two chunks of 4,096.
  std::vector<ThreadSlotHeader> slots(5'000);
  auto pending = std::make_unique<PendingSlots>();
  for (ThreadSlotHeader& slot : slots) pending->Assign(&slot);
  EXPECT_FALSE(pending->overflowed());
  EXPECT_TRUE(Take(*pending, slots).empty());
  MarkPending(slots[0]);
  MarkPending(slots[63]);
  MarkPending(slots[64]);
  MarkPending(slots[4'999]);
  MarkPending(slots[4'999]);  // twice before a take: once
  EXPECT_EQ(Take(*pending, slots), (std::vector<size_t>{0, 63, 64, 4'999}));
  EXPECT_TRUE(Take(*pending, slots).empty());
  // A slot without a bit (never assigned) marks nothing.
  ThreadSlotHeader stray;
  MarkPending(stray);
  EXPECT_TRUE(Take(*pending, slots).empty());
}

// Each writer stores a value for its slot, then marks it; the taker reads
// the slot's value when it takes the bit. After the writers end and one
// last take, the taker has seen every slot's last value: a mark made
// while a take was under way is taken by the next one, and a take sees
// what was stored before the mark (release, acquire).
TEST(PendingSlotsTest, NoMarkIsLostToATakeBesideIt) {
  constexpr size_t kWriters = 4;
  constexpr size_t kSlotsPerWriter = 100;
  constexpr uint64_t kRounds = 20'000;
  std::vector<ThreadSlotHeader> slots(kWriters * kSlotsPerWriter);
  auto pending = std::make_unique<PendingSlots>();
  for (ThreadSlotHeader& slot : slots) pending->Assign(&slot);
  std::vector<std::atomic<uint64_t>> value(slots.size());
  std::vector<uint64_t> seen(slots.size(), 0);
  std::atomic<size_t> running{kWriters};
  std::vector<std::thread> writers;
  for (size_t w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      for (uint64_t r = 1; r <= kRounds; ++r) {
        const size_t i = w * kSlotsPerWriter + r % kSlotsPerWriter;
        value[i].store(r, std::memory_order_relaxed);
        MarkPending(slots[i]);
      }
      running.fetch_sub(1);
    });
  }
  auto take = [&] {
    pending->TakeEach([&](ThreadSlotHeader* slot) {
      const size_t i = static_cast<size_t>(slot - slots.data());
      seen[i] = value[i].load(std::memory_order_relaxed);
    });
  };
  while (running.load() > 0) take();
  for (std::thread& t : writers) t.join();
  take();
  for (size_t i = 0; i < slots.size(); ++i) {
    ASSERT_EQ(seen[i], value[i].load()) << "slot " << i;
  }
}

}  // namespace
}  // namespace inprof::internal
