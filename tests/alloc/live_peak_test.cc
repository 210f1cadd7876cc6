#include "inprof/alloc/live_peak.h"

#include <cstdint>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inprof/alloc/live_heap_table.h"

namespace inprof::internal {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;

// tag -> (objects, bytes) at the window's peak.
std::map<uint64_t, std::pair<double, double>> PeakOf(LivePeak& peak) {
  std::map<uint64_t, std::pair<double, double>> out;
  peak.ForEachPeak([&](uint64_t tag, double objects, double bytes) {
    out[tag] = {objects, bytes};
  });
  return out;
}

TEST(LivePeakTest, AHeapThatGrowsThenIsFreedPeaksWhereItStoppedGrowing) {
  LivePeak peak(16);
  peak.StartWindow();
  for (int i = 0; i < 3; ++i) peak.Add(1, 100, 2.0);  // 600 bytes, 6 objects
  peak.Add(2, 50, 1.0);
  for (int i = 0; i < 3; ++i) peak.Remove(1, 100, 2.0);
  peak.Remove(2, 50, 1.0);
  EXPECT_THAT(PeakOf(peak), ElementsAre(Pair(1, Pair(6.0, 600.0)), Pair(2, Pair(1.0, 50.0))));
  const LivePeak::Stats s = peak.stats();
  EXPECT_EQ(s.live_bytes, 0u);
  EXPECT_EQ(s.peak_bytes, 650u);
  EXPECT_EQ(s.copies, 1u);  // at the first step down
}

// The peak is the moment the total was highest, not each tag's own
// highest: A at 1,000 then freed while B grows to 800 peaks with A alone.
TEST(LivePeakTest, ThePeakIsOneMomentNotEachTagsOwnHighest) {
  LivePeak peak(16);
  peak.StartWindow();
  peak.Add(1, 1000, 1.0);
  peak.Remove(1, 1000, 1.0);
  peak.Add(2, 800, 1.0);
  EXPECT_THAT(PeakOf(peak), ElementsAre(Pair(1, Pair(1.0, 1000.0))));
  // B then passes it: the peak moves to B alone, A at zero.
  peak.Add(2, 300, 1.0);
  peak.Remove(2, 300, 1.0);
  EXPECT_THAT(PeakOf(peak), ElementsAre(Pair(2, Pair(2.0, 1100.0))));
}

TEST(LivePeakTest, AWindowsPeakIsItsOwnAndStartsFromTheLiveHeap) {
  LivePeak peak(16);
  peak.StartWindow();
  peak.Add(1, 1000, 1.0);
  peak.Add(2, 500, 1.0);
  peak.Remove(1, 1000, 1.0);
  EXPECT_THAT(PeakOf(peak), ElementsAre(Pair(1, Pair(1.0, 1000.0)), Pair(2, Pair(1.0, 500.0))));
  // The next window begins with B's 500: C's 100 on top is its high.
  peak.StartWindow();
  peak.Add(3, 100, 1.0);
  peak.Remove(3, 100, 1.0);
  peak.Remove(2, 500, 1.0);
  EXPECT_THAT(PeakOf(peak), ElementsAre(Pair(2, Pair(1.0, 500.0)), Pair(3, Pair(1.0, 100.0))));
  // One that only shrinks peaks where it began.
  peak.Add(2, 500, 1.0);
  peak.StartWindow();
  peak.Remove(2, 500, 1.0);
  EXPECT_THAT(PeakOf(peak), ElementsAre(Pair(2, Pair(1.0, 500.0))));
  // And one with nothing live in it has no peak.
  peak.StartWindow();
  EXPECT_TRUE(PeakOf(peak).empty());
}

// A heap still growing when it is read: its peak is now.
TEST(LivePeakTest, AHeapStillGrowingPeaksNow) {
  LivePeak peak(16);
  peak.StartWindow();
  peak.Add(4, 10, 3.0);
  EXPECT_THAT(PeakOf(peak), ElementsAre(Pair(4, Pair(3.0, 30.0))));
  peak.Add(4, 10, 3.0);
  EXPECT_THAT(PeakOf(peak), ElementsAre(Pair(4, Pair(6.0, 60.0))));
}

TEST(LivePeakTest, TagsPastTheLimitAreCountedAndLeftOut) {
  LivePeak peak(4);
  peak.StartWindow();
  peak.Add(4, 10, 1.0);
  peak.Add(3, 10, 1.0);
  peak.Remove(4, 10, 1.0);
  EXPECT_THAT(PeakOf(peak), ElementsAre(Pair(3, Pair(1.0, 10.0))));
  EXPECT_EQ(peak.stats().untracked, 2u);
}

// Against a reference that copies every tag's sums at each new high:
// random programs of adds and frees over 40 tags, with windows, give the
// same peak, and the copies write at most one tag per event.
TEST(LivePeakTest, MatchesAFullCopyAtEveryNewHighOnRandomPrograms) {
  for (uint32_t seed = 1; seed <= 200; ++seed) {
    std::mt19937_64 random(seed);
    LivePeak peak(64);
    std::vector<std::pair<uint64_t, uint64_t>> live;  // (tag, size), weight 1.5
    std::map<uint64_t, int64_t> now, at_peak;
    int64_t total = 0, peak_total = 0;
    peak.StartWindow();
    for (int step = 0; step < 2000; ++step) {
      const bool add = live.empty() || random() % 100 < 55;
      if (add) {
        const uint64_t tag = random() % 40, size = 1 + random() % 1000;
        peak.Add(tag, size, 1.5);
        live.push_back({tag, size});
        const auto bytes = static_cast<int64_t>(static_cast<double>(size) * 1.5 + 0.5);
        now[tag] += bytes;
        total += bytes;
      } else {
        const size_t i = random() % live.size();
        const auto [tag, size] = live[i];
        live[i] = live.back();
        live.pop_back();
        peak.Remove(tag, size, 1.5);
        const auto bytes = static_cast<int64_t>(static_cast<double>(size) * 1.5 + 0.5);
        now[tag] -= bytes;
        total -= bytes;
      }
      if (total > peak_total) {
        peak_total = total;
        at_peak = now;
      }
      if (step % 500 == 499) {
        std::map<uint64_t, std::pair<double, double>> want;
        for (const auto& [tag, bytes] : at_peak) {
          if (bytes != 0) want[tag] = {0, static_cast<double>(bytes)};
        }
        std::map<uint64_t, std::pair<double, double>> got = PeakOf(peak);
        for (auto& [tag, sums] : got) sums.first = 0;  // objects: checked above
        ASSERT_EQ(got, want) << "seed " << seed << " step " << step;
        ASSERT_EQ(peak.stats().peak_bytes, static_cast<uint64_t>(peak_total));
        // The next window starts from the live heap.
        peak.StartWindow();
        peak_total = total;
        at_peak = now;
      }
    }
    const LivePeak::Stats s = peak.stats();
    EXPECT_LE(s.tags_copied, s.events) << "seed " << seed;
    EXPECT_EQ(s.live_bytes, static_cast<uint64_t>(total));
  }
}

// Threads adding and removing at once: nothing is lost (the live total
// returns to zero) and the peak is one consistent moment (its tags sum to
// the peak total, at least each thread's own high).
TEST(LivePeakTest, ThreadsAtOnceKeepTheSumsExact) {
  LivePeak peak(64);
  peak.StartWindow();
  constexpr int kThreads = 4, kBlocks = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&peak, t] {
      for (int round = 0; round < 3; ++round) {
        for (int i = 0; i < kBlocks; ++i) peak.Add(t, 64, 1.0);
        for (int i = 0; i < kBlocks; ++i) peak.Remove(t, 64, 1.0);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  double sum = 0;
  peak.ForEachPeak([&](uint64_t, double, double bytes) { sum += bytes; });
  const LivePeak::Stats s = peak.stats();
  EXPECT_EQ(s.live_bytes, 0u);
  EXPECT_EQ(sum, static_cast<double>(s.peak_bytes));
  EXPECT_GE(s.peak_bytes, uint64_t{kBlocks} * 64);
  EXPECT_LE(s.peak_bytes, uint64_t{kThreads} * kBlocks * 64);
}

// Through the live table: inserts, frees, a replacement and Take all reach
// the peak, once each.
TEST(LivePeakTest, TheLiveTableTellsItEveryEntryItKeepsAndLoses) {
  LiveHeapTable table(64);
  LivePeak peak(16);
  table.SetPeak(&peak);
  peak.StartWindow();
  alignas(16) static char blocks[4][16];
  table.Insert(blocks[0], {.size = 100, .weight_objects = 2.0, .tag = 1});
  table.Insert(blocks[1], {.size = 10, .weight_objects = 1.0, .tag = 2});
  // blocks[1] handed out again unseen: the stale entry leaves, the new one
  // comes.
  table.Insert(blocks[1], {.size = 30, .weight_objects = 1.0, .tag = 3});
  table.Insert(blocks[2], {.size = 5, .weight_objects = 1.0, .tag = 3});
  EXPECT_TRUE(table.Erase(blocks[0]));
  EXPECT_FALSE(table.Erase(blocks[3]));  // never sampled: nothing to tell
  LiveHeapTable::Entry taken;
  EXPECT_TRUE(table.Take(blocks[2], &taken));
  EXPECT_TRUE(table.Erase(blocks[1]));
  // The high: 200 (tag 1) + 10 (tag 2) = 210, before the replacement.
  // Tags 1 and 3 after it: 200 + 30 + 5 = 235, the peak.
  EXPECT_THAT(PeakOf(peak), ElementsAre(Pair(1, Pair(2.0, 200.0)), Pair(3, Pair(2.0, 35.0))));
  EXPECT_EQ(peak.stats().live_bytes, 0u);
  table.SetPeak(nullptr);
}

}  // namespace
}  // namespace inprof::internal
