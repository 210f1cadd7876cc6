#include "inprof/spsc_ring.h"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace inprof {
namespace {

// Counts live instances so a test can see every construction matched by a
// destruction (a slot leaked or destroyed twice shows up as a non-zero count).
struct Counted {
  static inline int live = 0;
  int value = 0;
  explicit Counted(int v) : value(v) { ++live; }
  Counted(const Counted& other) : value(other.value) { ++live; }
  Counted(Counted&& other) noexcept : value(other.value) { ++live; }
  Counted& operator=(const Counted&) = default;
  Counted& operator=(Counted&&) = default;
  ~Counted() { --live; }
};

// ---------------------------------------------------------------------------
// SpscRing<T, N>

TEST(SpscRingTest, PopsInPushOrder) {
  SpscRing<int, 8> ring;
  EXPECT_FALSE(ring.TryPop().has_value());
  for (int i = 1; i <= 5; ++i) ASSERT_TRUE(ring.TryPush(i));
  EXPECT_EQ(ring.size(), 5u);
  for (int i = 1; i <= 5; ++i) {
    std::optional<int> v = ring.TryPop();
    ASSERT_TRUE(v.has_value());
    EXPECT_EQ(*v, i);
  }
  EXPECT_FALSE(ring.TryPop().has_value());
  EXPECT_EQ(ring.size(), 0u);
  EXPECT_EQ(ring.dropped(), 0u);
}

TEST(SpscRingTest, WrapsAroundOverManyCycles) {
  SpscRing<uint64_t, 4> ring;
  uint64_t next_push = 0;
  uint64_t next_pop = 0;
  // Uneven batch sizes move the indices across the end of the buffer at
  // every offset.
  for (int cycle = 0; cycle < 1000; ++cycle) {
    const int batch = 1 + cycle % 4;
    for (int i = 0; i < batch; ++i) ASSERT_TRUE(ring.TryPush(next_push++));
    for (int i = 0; i < batch; ++i) {
      std::optional<uint64_t> v = ring.TryPop();
      ASSERT_TRUE(v.has_value()) << "cycle " << cycle;
      ASSERT_EQ(*v, next_pop++) << "cycle " << cycle;
    }
  }
  EXPECT_EQ(next_pop, next_push);
  EXPECT_FALSE(ring.TryPop().has_value());
  EXPECT_EQ(ring.dropped(), 0u);
}

TEST(SpscRingTest, DropsAndCountsWhenFull) {
  SpscRing<int, 4> ring;
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(ring.TryPush(i));
  EXPECT_EQ(ring.size(), ring.capacity());
  EXPECT_FALSE(ring.TryPush(100));
  EXPECT_FALSE(ring.TryPush(101));
  EXPECT_EQ(ring.dropped(), 2u);
  // The refused values never entered: the contents are unchanged.
  std::optional<int> first = ring.TryPop();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(*first, 0);
  // One slot free again: one push fits, the next is refused.
  EXPECT_TRUE(ring.TryPush(4));
  EXPECT_FALSE(ring.TryPush(5));
  EXPECT_EQ(ring.dropped(), 3u);
  for (int expected = 1; expected <= 4; ++expected) {
    std::optional<int> v = ring.TryPop();
    ASSERT_TRUE(v.has_value());
    EXPECT_EQ(*v, expected);
  }
  EXPECT_FALSE(ring.TryPop().has_value());
}

TEST(SpscRingTest, DestroysEachObjectOnceAfterPops) {
  Counted::live = 0;
  {
    SpscRing<Counted, 8> ring;
    for (int i = 0; i < 6; ++i) ASSERT_TRUE(ring.TryEmplace(i));
    EXPECT_EQ(Counted::live, 6);
    for (int i = 0; i < 3; ++i) {
      std::optional<Counted> v = ring.TryPop();
      ASSERT_TRUE(v.has_value());
      EXPECT_EQ(v->value, i);
      EXPECT_EQ(Counted::live, 6 - i);  // the ring's 5 - i plus `v`
    }
    EXPECT_EQ(Counted::live, 3);
    // Copies pushed through TryPush are owned by the ring too.
    const Counted extra(99);
    ASSERT_TRUE(ring.TryPush(extra));
    EXPECT_EQ(Counted::live, 5);
    while (ring.TryPop().has_value()) {
    }
    EXPECT_EQ(Counted::live, 1);  // only `extra`
  }
  EXPECT_EQ(Counted::live, 0);
}

TEST(SpscRingTest, DestroysRemainingObjectsWithTheRing) {
  Counted::live = 0;
  {
    SpscRing<Counted, 8> ring;
    // Wrap the indices first so the survivors straddle the buffer's end.
    for (int i = 0; i < 6; ++i) ASSERT_TRUE(ring.TryEmplace(i));
    for (int i = 0; i < 6; ++i) ASSERT_TRUE(ring.TryPop().has_value());
    for (int i = 0; i < 8; ++i) ASSERT_TRUE(ring.TryEmplace(i));
    EXPECT_FALSE(ring.TryEmplace(-1));  // full: nothing constructed
    EXPECT_EQ(Counted::live, static_cast<int>(ring.size()));
    EXPECT_EQ(ring.size(), 8u);
    EXPECT_EQ(ring.dropped(), 1u);
  }
  EXPECT_EQ(Counted::live, 0);
}

TEST(SpscRingTest, MovesMoveOnlyValuesThrough) {
  SpscRing<std::unique_ptr<int>, 4> ring;
  ASSERT_TRUE(ring.TryEmplace(std::make_unique<int>(7)));
  ASSERT_TRUE(ring.TryEmplace(std::make_unique<int>(8)));
  std::optional<std::unique_ptr<int>> a = ring.TryPop();
  std::optional<std::unique_ptr<int>> b = ring.TryPop();
  ASSERT_TRUE(a.has_value() && *a != nullptr);
  ASSERT_TRUE(b.has_value() && *b != nullptr);
  EXPECT_EQ(**a, 7);
  EXPECT_EQ(**b, 8);
}

TEST(SpscRingTest, TwoThreadsTransferEveryValueInOrder) {
  // 3 million values: enough for the indices to wrap ~3000 times through a
  // 1024-slot ring while the two threads race.
  constexpr uint64_t kCount = 3'000'000;
  auto ring = std::make_unique<SpscRing<uint64_t, 1024>>();
  uint64_t refused = 0;
  // Set by the consumer at the first wrong value, so a broken ring fails the
  // test instead of leaving either thread waiting forever.
  std::atomic<bool> stop{false};

  std::thread producer([&] {
    for (uint64_t v = 1; v <= kCount; ++v) {
      while (!ring->TryPush(v)) {
        if (stop.load(std::memory_order_relaxed)) return;
        ++refused;
        std::this_thread::yield();
      }
    }
  });

  uint64_t sum = 0;
  uint64_t count = 0;
  uint64_t out_of_order = 0;
  uint64_t previous = 0;
  while (count < kCount) {
    std::optional<uint64_t> v = ring->TryPop();
    if (!v.has_value()) {
      std::this_thread::yield();
      continue;
    }
    if (*v != previous + 1) {
      ++out_of_order;
      stop.store(true, std::memory_order_relaxed);
      break;
    }
    previous = *v;
    sum += *v;
    ++count;
  }
  producer.join();

  EXPECT_EQ(count, kCount);
  EXPECT_EQ(sum, kCount * (kCount + 1) / 2);
  EXPECT_EQ(out_of_order, 0u);
  EXPECT_FALSE(ring->TryPop().has_value());
  EXPECT_EQ(ring->dropped(), refused);
}

// ---------------------------------------------------------------------------
// SpscRecordRing<W>

std::vector<uint64_t> Pop(SpscRecordRing<16>& ring, size_t capacity = 16) {
  std::vector<uint64_t> out(capacity);
  out.resize(ring.TryPop(out));
  return out;
}

TEST(SpscRecordRingTest, RoundTripsVariableLengthRecords) {
  SpscRecordRing<64> ring;
  const std::vector<std::vector<uint64_t>> records = {
      {1}, {2, 3}, {4, 5, 6, 7, 8}, {~uint64_t{0}, 0, 42}};
  size_t words = 0;
  for (const auto& r : records) {
    ASSERT_TRUE(ring.TryPush(r));
    words += r.size() + 1;  // one length word per record
  }
  EXPECT_EQ(ring.used_words(), words);
  for (const auto& r : records) {
    uint64_t out[64] = {};
    const size_t n = ring.TryPop(out);
    EXPECT_EQ(std::vector<uint64_t>(out, out + n), r);
  }
  uint64_t out[64];
  EXPECT_EQ(ring.TryPop(out), 0u);
  EXPECT_EQ(ring.used_words(), 0u);
  EXPECT_EQ(ring.dropped(), 0u);
}

TEST(SpscRecordRingTest, RecordsCrossTheBufferEndIntact) {
  SpscRecordRing<16> ring;
  uint64_t key = 1000;
  // Record lengths 1..7 (2..8 words with the length) against a 16-word
  // buffer: records start at every offset and many straddle the end.
  for (int i = 0; i < 500; ++i) {
    const size_t length = 1 + static_cast<size_t>(i) % 7;
    std::vector<uint64_t> a(length), b(length);
    for (size_t j = 0; j < length; ++j) a[j] = key + j;
    for (size_t j = 0; j < length; ++j) b[j] = key + 100 + j;
    ASSERT_TRUE(ring.TryPush(a)) << "iteration " << i;
    ASSERT_TRUE(ring.TryPush(b)) << "iteration " << i;
    ASSERT_EQ(Pop(ring), a) << "iteration " << i;
    ASSERT_EQ(Pop(ring), b) << "iteration " << i;
    key += 1000;
  }
  EXPECT_TRUE(Pop(ring).empty());
  EXPECT_EQ(ring.dropped(), 0u);
}

TEST(SpscRecordRingTest, DropsAndCountsWhenFull) {
  SpscRecordRing<16> ring;
  const uint64_t three[] = {1, 2, 3};
  // Three 4-word entries use 12 of 16 words; a fourth needs 4 and fits
  // exactly, after which even a 1-word record (2 words) is refused.
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(ring.TryPush(three));
  EXPECT_EQ(ring.used_words(), 16u);
  const uint64_t one[] = {9};
  EXPECT_FALSE(ring.TryPush(one));
  EXPECT_FALSE(ring.TryPush(three));
  EXPECT_EQ(ring.dropped(), 2u);
  // Freeing one entry makes room for exactly one more of the same size.
  EXPECT_EQ(Pop(ring), std::vector<uint64_t>({1, 2, 3}));
  const uint64_t other[] = {7, 8, 9};
  EXPECT_TRUE(ring.TryPush(other));
  EXPECT_FALSE(ring.TryPush(one));
  EXPECT_EQ(ring.dropped(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(Pop(ring), std::vector<uint64_t>({1, 2, 3}));
  }
  EXPECT_EQ(Pop(ring), std::vector<uint64_t>({7, 8, 9}));
  EXPECT_TRUE(Pop(ring).empty());
}

TEST(SpscRecordRingTest, LargestRecordFillsAnEmptyRing) {
  SpscRecordRing<16> ring;
  ASSERT_EQ(ring.max_record_words(), 15u);
  std::vector<uint64_t> largest(ring.max_record_words());
  for (size_t i = 0; i < largest.size(); ++i) largest[i] = 100 + i;
  // Offset the indices first so the record wraps.
  const uint64_t small[] = {1, 2, 3, 4, 5};
  ASSERT_TRUE(ring.TryPush(small));
  ASSERT_EQ(Pop(ring).size(), 5u);
  ASSERT_TRUE(ring.TryPush(largest));
  EXPECT_EQ(ring.used_words(), 16u);
  EXPECT_EQ(Pop(ring), largest);
  EXPECT_EQ(ring.dropped(), 0u);
}

TEST(SpscRecordRingTest, RejectsAndCountsOversizedAndEmptyRecords) {
  SpscRecordRing<16> ring;
  std::vector<uint64_t> oversized(ring.max_record_words() + 1, 5);
  EXPECT_FALSE(ring.TryPush(oversized));
  EXPECT_EQ(ring.dropped(), 1u);
  std::vector<uint64_t> huge(1000, 5);
  EXPECT_FALSE(ring.TryPush(huge));
  EXPECT_EQ(ring.dropped(), 2u);
  EXPECT_FALSE(ring.TryPush(std::span<const uint64_t>()));
  EXPECT_EQ(ring.dropped(), 3u);
  // Nothing was stored, and the ring still works.
  EXPECT_EQ(ring.used_words(), 0u);
  EXPECT_TRUE(Pop(ring).empty());
  const uint64_t ok[] = {11, 12};
  ASSERT_TRUE(ring.TryPush(ok));
  EXPECT_EQ(Pop(ring), std::vector<uint64_t>({11, 12}));
  EXPECT_EQ(ring.dropped(), 3u);
}

TEST(SpscRecordRingTest, TruncatesIntoShortBufferAndConsumesRecord) {
  SpscRecordRing<16> ring;
  const uint64_t long_record[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  const uint64_t next_record[] = {20, 21};
  ASSERT_TRUE(ring.TryPush(long_record));
  ASSERT_TRUE(ring.TryPush(next_record));

  uint64_t out[4] = {0, 0, 0, 0};
  EXPECT_EQ(ring.TryPop(out), 4u);
  EXPECT_EQ(std::vector<uint64_t>(out, out + 4),
            std::vector<uint64_t>({1, 2, 3, 4}));
  // The rest of the long record is gone: the next pop is the next record.
  EXPECT_EQ(ring.used_words(), 3u);
  EXPECT_EQ(Pop(ring), std::vector<uint64_t>({20, 21}));
  EXPECT_TRUE(Pop(ring).empty());
}

// Record k: length 1 + k % 37, words k, k + 1, ... Any torn, shifted or
// mixed-up record fails the check.
constexpr size_t kMaxTestRecord = 37;
size_t RecordLength(uint64_t k) { return 1 + static_cast<size_t>(k % 37); }
size_t MakeRecord(uint64_t k, uint64_t* words) {
  const size_t n = RecordLength(k);
  for (size_t i = 0; i < n; ++i) words[i] = k + i;
  return n;
}
bool RecordIsIntact(const uint64_t* words, size_t n) {
  if (n == 0 || n != RecordLength(words[0])) return false;
  for (size_t i = 1; i < n; ++i) {
    if (words[i] != words[0] + i) return false;
  }
  return true;
}

TEST(SpscRecordRingTest, TwoThreadsTransferEveryRecordIntact) {
  // 1 million records of 1..37 words through a 1024-word ring: the producer
  // retries refused pushes, so every record must arrive, in order.
  constexpr uint64_t kRecords = 1'000'000;
  auto ring = std::make_unique<SpscRecordRing<1024>>();
  uint64_t refused = 0;
  std::atomic<bool> stop{false};  // the consumer saw a bad record

  std::thread producer([&] {
    uint64_t words[kMaxTestRecord];
    for (uint64_t k = 0; k < kRecords; ++k) {
      const size_t n = MakeRecord(k, words);
      while (!ring->TryPush(std::span<const uint64_t>(words, n))) {
        if (stop.load(std::memory_order_relaxed)) return;
        ++refused;
        std::this_thread::yield();
      }
    }
  });

  uint64_t popped = 0;
  uint64_t corrupt = 0;
  uint64_t out_of_order = 0;
  uint64_t out[64];
  while (popped < kRecords) {
    const size_t n = ring->TryPop(out);
    if (n == 0) {
      std::this_thread::yield();
      continue;
    }
    if (!RecordIsIntact(out, n)) ++corrupt;
    if (out[0] != popped) ++out_of_order;
    if (corrupt != 0 || out_of_order != 0) {
      stop.store(true, std::memory_order_relaxed);
      break;
    }
    ++popped;
  }
  producer.join();

  EXPECT_EQ(popped, kRecords);
  EXPECT_EQ(corrupt, 0u);
  EXPECT_EQ(out_of_order, 0u);
  EXPECT_EQ(ring->TryPop(out), 0u);
  // Every refused attempt is counted, and only those.
  EXPECT_EQ(ring->dropped(), refused);
}

TEST(SpscRecordRingTest, TwoThreadsLoseOnlyCountedDrops) {
  // The producer never waits, like a signal handler: whatever does not fit
  // is dropped. Every attempt is either popped intact or counted.
  constexpr uint64_t kAttempts = 2'000'000;
  auto ring = std::make_unique<SpscRecordRing<512>>();
  std::atomic<bool> done{false};

  std::thread producer([&] {
    uint64_t words[kMaxTestRecord];
    for (uint64_t k = 0; k < kAttempts; ++k) {
      const size_t n = MakeRecord(k, words);
      (void)ring->TryPush(std::span<const uint64_t>(words, n));
    }
    done.store(true, std::memory_order_release);
  });

  uint64_t popped = 0;
  uint64_t corrupt = 0;
  uint64_t out_of_order = 0;
  bool have_previous = false;
  uint64_t previous = 0;
  uint64_t out[64];
  while (true) {
    // Read `done` before popping, so an empty pop after it means drained.
    const bool finished = done.load(std::memory_order_acquire);
    const size_t n = ring->TryPop(out);
    if (n == 0) {
      if (finished) break;
      std::this_thread::yield();
      continue;
    }
    if (!RecordIsIntact(out, n)) ++corrupt;
    if (have_previous && out[0] <= previous) ++out_of_order;
    // A corrupt ring can hand out garbage without end; the producer still
    // finishes on its own.
    if (corrupt != 0 || out_of_order != 0) break;
    previous = out[0];
    have_previous = true;
    ++popped;
  }
  producer.join();

  ASSERT_EQ(corrupt, 0u);
  EXPECT_GT(popped, 0u);
  EXPECT_EQ(out_of_order, 0u);
  EXPECT_EQ(popped + ring->dropped(), kAttempts);
}

// ---------------------------------------------------------------------------
// SampleRing

// Everything SampleRing asks for except TryPush.
struct RingWithoutTryPush {
  RingWithoutTryPush() = default;
  RingWithoutTryPush(const RingWithoutTryPush&) = delete;
  size_t TryPop(std::span<uint64_t>) noexcept { return 0; }
  uint64_t dropped() const noexcept { return 0; }
  static constexpr size_t max_record_words() noexcept { return 15; }
};

// Same, with a TryPush that may throw (not usable from a signal handler).
struct RingWithThrowingTryPush : RingWithoutTryPush {
  bool TryPush(std::span<const uint64_t>) { return false; }
};

// Same, but copyable (a ring must stay in its thread's slot).
struct CopyableRing {
  bool TryPush(std::span<const uint64_t>) noexcept { return false; }
  size_t TryPop(std::span<uint64_t>) noexcept { return 0; }
  uint64_t dropped() const noexcept { return 0; }
  static constexpr size_t max_record_words() noexcept { return 15; }
};

TEST(SampleRingTest, ModelledByRecordRingOnly) {
  static_assert(SampleRing<SpscRecordRing<16>>);
  static_assert(SampleRing<SpscRecordRing<4096>>);
  static_assert(SampleRing<DefaultSampleRing>);
  static_assert(!SampleRing<RingWithoutTryPush>);
  static_assert(!SampleRing<RingWithThrowingTryPush>);
  static_assert(!SampleRing<CopyableRing>);
  static_assert(!SampleRing<SpscRing<uint64_t, 16>>);
  static_assert(SpscRecordRing<1024>::IndicesOnOwnCacheLines());
  EXPECT_EQ(DefaultSampleRing::max_record_words(),
            DefaultSampleRing::capacity_words() - 1);
}

}  // namespace
}  // namespace inprof
