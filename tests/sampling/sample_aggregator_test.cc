#include "inprof/sample_aggregator.h"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inprof/internal/label_table.h"
#include "inprof/profile_data.h"

// Counts heap allocations so a test can check that adding a known stack
// allocates nothing; from the g_fail_at-th one counted after FailFrom()
// (0: never), every allocation throws (a heap exhausted).
namespace {
std::atomic<uint64_t> g_allocations{0};
uint64_t g_fail_at = 0;
}  // namespace

// noinline: once inlined, GCC's -Wmismatched-new-delete sees free() on a
// pointer from operator new and (wrongly) rejects the pair.
__attribute__((noinline)) void* operator new(size_t size) {
  const uint64_t n = g_allocations.fetch_add(1, std::memory_order_relaxed) + 1;
  if (g_fail_at != 0 && n >= g_fail_at) throw std::bad_alloc();
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
__attribute__((noinline)) void operator delete(void* p) noexcept {
  std::free(p);
}
__attribute__((noinline)) void operator delete(void* p, size_t) noexcept {
  std::free(p);
}

namespace inprof {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

const std::vector<ValueType> kTypes = {{"cpu-samples", "count"},
                                       {"cpu-time", "nanoseconds"}};

// Finds the one sample with this thread and these frames (or synthetic
// frame); fails the test and returns nullptr when there is not exactly one.
const ProfileSample* Find(const ProfileData& data, uint32_t thread,
                          const std::vector<uint64_t>& frames,
                          const std::string& synthetic = "") {
  const ProfileSample* found = nullptr;
  int matches = 0;
  for (const ProfileSample& s : data.samples) {
    if (s.thread == thread && s.frames == frames &&
        s.synthetic_frame == synthetic) {
      found = &s;
      ++matches;
    }
  }
  EXPECT_EQ(matches, 1) << "thread " << thread << ", " << frames.size()
                        << " frames, synthetic '" << synthetic << "'";
  return matches == 1 ? found : nullptr;
}

TEST(SampleAggregatorTest, SameStackAddedTwiceSums) {
  SampleAggregator agg(kTypes);
  const uint32_t t = agg.AddThread(100, "main");
  const std::vector<uint64_t> frames = {0x401000, 0x402000, 0x403000};
  const int64_t v1[] = {1, 10'000'000};
  const int64_t v2[] = {2, 25'000'000};
  agg.Add(t, frames, 0, v1);
  agg.Add(t, frames, 0, v2);
  EXPECT_EQ(agg.num_stacks(), 1u);

  const ProfileData data = agg.Take();
  ASSERT_EQ(data.samples.size(), 1u);
  EXPECT_EQ(data.samples[0].thread, t);
  EXPECT_EQ(data.samples[0].frames, frames);
  EXPECT_THAT(data.samples[0].values, ElementsAre(3, 35'000'000));
  EXPECT_THAT(data.samples[0].synthetic_frame, IsEmpty());
}

TEST(SampleAggregatorTest, DifferentStacksStaySeparate) {
  SampleAggregator agg(kTypes);
  const uint32_t t = agg.AddThread(100, "main");
  const int64_t one[] = {1, 1};
  // A prefix, an extension and a reordering are all different stacks.
  const std::vector<std::vector<uint64_t>> stacks = {
      {1, 2, 3}, {1, 2}, {1, 2, 3, 4}, {3, 2, 1}, {1, 2, 4}};
  for (const auto& frames : stacks) agg.Add(t, frames, 0, one);
  agg.Add(t, stacks[0], 0, one);
  EXPECT_EQ(agg.num_stacks(), stacks.size());

  const ProfileData data = agg.Take();
  ASSERT_EQ(data.samples.size(), stacks.size());
  for (size_t i = 0; i < stacks.size(); ++i) {
    const ProfileSample* s = Find(data, t, stacks[i]);
    ASSERT_NE(s, nullptr);
    const int64_t expected = i == 0 ? 2 : 1;
    EXPECT_THAT(s->values, ElementsAre(expected, expected)) << "stack " << i;
  }
}

TEST(SampleAggregatorTest, DifferentThreadsWithSameStackStaySeparate) {
  SampleAggregator agg(kTypes);
  const uint32_t a = agg.AddThread(100, "main");
  const uint32_t b = agg.AddThread(101, "worker");
  ASSERT_NE(a, b);
  const std::vector<uint64_t> frames = {0x10, 0x20};
  const int64_t va[] = {1, 100};
  const int64_t vb[] = {5, 500};
  agg.Add(a, frames, 0, va);
  agg.Add(b, frames, 0, vb);
  agg.Add(a, frames, 0, va);
  EXPECT_EQ(agg.num_stacks(), 2u);

  const ProfileData data = agg.Take();
  ASSERT_EQ(data.samples.size(), 2u);
  const ProfileSample* sa = Find(data, a, frames);
  const ProfileSample* sb = Find(data, b, frames);
  ASSERT_NE(sa, nullptr);
  ASSERT_NE(sb, nullptr);
  EXPECT_THAT(sa->values, ElementsAre(2, 200));
  EXPECT_THAT(sb->values, ElementsAre(5, 500));
  ASSERT_EQ(data.threads.size(), 2u);
  EXPECT_EQ(data.threads[a].tid, 100);
  EXPECT_EQ(data.threads[a].name, "main");
  EXPECT_EQ(data.threads[b].tid, 101);
  EXPECT_EQ(data.threads[b].name, "worker");
}

TEST(SampleAggregatorTest, ValueOffsetsPlaceValuesAndLeaveZerosElsewhere) {
  SampleAggregator agg({{"cpu-samples", "count"},
                        {"cpu-time", "nanoseconds"},
                        {"wall-samples", "count"},
                        {"wall-time", "nanoseconds"}});
  const uint32_t t = agg.AddThread(7, "t");
  const std::vector<uint64_t> cpu_stack = {1, 2};
  const std::vector<uint64_t> wall_stack = {3, 4};
  const int64_t cpu[] = {1, 10};
  const int64_t wall[] = {1, 50};
  const int64_t just_wall_time[] = {25};
  agg.Add(t, cpu_stack, 0, cpu);
  agg.Add(t, wall_stack, 2, wall);
  agg.Add(t, wall_stack, 3, just_wall_time);

  const ProfileData data = agg.Take();
  ASSERT_EQ(data.samples.size(), 2u);
  const ProfileSample* c = Find(data, t, cpu_stack);
  const ProfileSample* w = Find(data, t, wall_stack);
  ASSERT_NE(c, nullptr);
  ASSERT_NE(w, nullptr);
  EXPECT_THAT(c->values, ElementsAre(1, 10, 0, 0));
  EXPECT_THAT(w->values, ElementsAre(0, 0, 1, 75));
}

TEST(SampleAggregatorTest, SyntheticFramesAggregateSeparately) {
  SampleAggregator agg(kTypes);
  const uint32_t a = agg.AddThread(1, "a");
  const uint32_t b = agg.AddThread(2, "b");
  const int64_t one[] = {1, 10};
  const std::vector<uint64_t> frames = {0x10};
  agg.AddSynthetic(a, "[dropped: ring full]", 0, one);
  agg.AddSynthetic(a, "[dropped: ring full]", 0, one);
  agg.AddSynthetic(a, "[truncated]", 0, one);
  agg.AddSynthetic(b, "[dropped: ring full]", 0, one);
  agg.Add(a, frames, 0, one);
  EXPECT_EQ(agg.num_stacks(), 4u);

  const ProfileData data = agg.Take();
  ASSERT_EQ(data.samples.size(), 4u);
  const ProfileSample* dropped_a = Find(data, a, {}, "[dropped: ring full]");
  const ProfileSample* truncated_a = Find(data, a, {}, "[truncated]");
  const ProfileSample* dropped_b = Find(data, b, {}, "[dropped: ring full]");
  const ProfileSample* real_a = Find(data, a, frames);
  ASSERT_NE(dropped_a, nullptr);
  ASSERT_NE(truncated_a, nullptr);
  ASSERT_NE(dropped_b, nullptr);
  ASSERT_NE(real_a, nullptr);
  EXPECT_THAT(dropped_a->values, ElementsAre(2, 20));
  EXPECT_THAT(truncated_a->values, ElementsAre(1, 10));
  EXPECT_THAT(dropped_b->values, ElementsAre(1, 10));
  EXPECT_THAT(real_a->values, ElementsAre(1, 10));
  EXPECT_THAT(dropped_a->frames, IsEmpty());
}

TEST(SampleAggregatorTest, TakeReturnsEverythingAndStartsEmpty) {
  SampleAggregator agg(kTypes);
  const uint32_t a = agg.AddThread(10, "main");
  const uint32_t b = agg.AddThread(11, "worker");
  const int64_t v[] = {1, 10};
  agg.Add(a, std::vector<uint64_t>{1, 2}, 0, v);
  agg.Add(b, std::vector<uint64_t>{3}, 0, v);
  agg.AddSynthetic(b, "[dropped: ring full]", 0, v);

  const ProfileData first = agg.Take();
  EXPECT_EQ(first.sample_types, kTypes);
  EXPECT_EQ(first.samples.size(), 3u);
  ASSERT_EQ(first.threads.size(), 2u);
  EXPECT_EQ(agg.num_stacks(), 0u);

  // Nothing is carried over into the next window.
  const ProfileData empty = agg.Take();
  EXPECT_THAT(empty.samples, IsEmpty());
  EXPECT_EQ(empty.sample_types, kTypes);

  // Thread indices from before the Take still name the same threads, and
  // a stack seen before starts again from zero.
  agg.Add(b, std::vector<uint64_t>{3}, 0, v);
  EXPECT_EQ(agg.num_stacks(), 1u);
  const ProfileData second = agg.Take();
  ASSERT_EQ(second.samples.size(), 1u);
  EXPECT_EQ(second.samples[0].thread, b);
  EXPECT_THAT(second.samples[0].frames, ElementsAre(3u));
  EXPECT_THAT(second.samples[0].values, ElementsAre(1, 10));
  ASSERT_GT(second.threads.size(), b);
  EXPECT_EQ(second.threads[b].tid, 11);
  EXPECT_EQ(second.threads[b].name, "worker");

  // Threads added after a Take get fresh indices.
  const uint32_t c = agg.AddThread(12, "late");
  EXPECT_NE(c, a);
  EXPECT_NE(c, b);
  agg.Add(c, std::vector<uint64_t>{9}, 0, v);
  const ProfileData third = agg.Take();
  ASSERT_EQ(third.samples.size(), 1u);
  ASSERT_GT(third.threads.size(), c);
  EXPECT_EQ(third.threads[third.samples[0].thread].tid, 12);
}

TEST(SampleAggregatorTest, RecordsAddedCountsEveryCall) {
  SampleAggregator agg(kTypes);
  EXPECT_EQ(agg.records_added(), 0u);
  const uint32_t t = agg.AddThread(1, "t");
  const int64_t v[] = {1, 1};
  const std::vector<uint64_t> frames = {5, 6};
  agg.Add(t, frames, 0, v);
  agg.Add(t, frames, 0, v);  // known stack: still a record
  agg.AddSynthetic(t, "[x]", 0, v);
  EXPECT_EQ(agg.records_added(), 3u);
  EXPECT_EQ(agg.num_stacks(), 2u);
  (void)agg.Take();
  // Counted since construction, not per window.
  agg.Add(t, frames, 0, v);
  EXPECT_EQ(agg.records_added(), 4u);
}

TEST(SampleAggregatorTest, AddThreadKeepsIdentities) {
  SampleAggregator agg(kTypes);
  EXPECT_EQ(agg.sample_types(), kTypes);
  const uint32_t a = agg.AddThread(42, "main");
  const uint32_t b = agg.AddThread(43, "");
  const uint32_t c = agg.AddThread(42, "main");  // a reused tid is a new entry
  EXPECT_NE(a, b);
  EXPECT_NE(b, c);
  EXPECT_NE(a, c);
  const ProfileData data = agg.Take();
  ASSERT_EQ(data.threads.size(), 3u);
  EXPECT_EQ(data.threads[b].tid, 43);
  EXPECT_EQ(data.threads[b].name, "");
  EXPECT_EQ(data.threads[c].tid, 42);
  EXPECT_THAT(data.samples, IsEmpty());
}

TEST(SampleAggregatorTest, AddingKnownStackAllocatesNothing) {
  SampleAggregator agg(kTypes);
  const uint32_t t = agg.AddThread(1, "t");
  const std::vector<uint64_t> frames = {0x401000, 0x402000, 0x403000};
  const int64_t v[] = {1, 10};
  agg.Add(t, frames, 0, v);
  agg.AddSynthetic(t, "[dropped: ring full]", 0, v);

  const uint64_t before = g_allocations.load(std::memory_order_relaxed);
  for (int i = 0; i < 100; ++i) {
    agg.Add(t, frames, 0, v);
    agg.AddSynthetic(t, "[dropped: ring full]", 0, v);
  }
  const uint64_t after = g_allocations.load(std::memory_order_relaxed);
  EXPECT_EQ(after - before, 0u);

  // The counter does see allocations: a new stack makes some.
  agg.Add(t, std::vector<uint64_t>{7, 8, 9}, 0, v);
  EXPECT_GT(g_allocations.load(std::memory_order_relaxed), after);

  const ProfileData data = agg.Take();
  const ProfileSample* s = Find(data, t, frames);
  ASSERT_NE(s, nullptr);
  EXPECT_THAT(s->values, ElementsAre(101, 1010));
}

// A removed thread's entry keeps naming its samples until they are taken
// out, and is reused only after that: the table stays the size of the
// threads alive in one window however many come and go.
// With the heap exhausted (std::bad_alloc) from any allocation of an
// Add of new stacks on, the aggregate is as it was: what it held is all
// there and it takes new stacks once the heap is back. absl's tables
// corrupt themselves when a growth throws (growth_safe_table.h): this
// crossed the index's growths (40 stacks) and failed each allocation of
// every Add in turn. Deterministic.
TEST(SampleAggregatorTest, AnAddThatRunsOutOfMemoryLeavesTheAggregateAsItWas) {
  constexpr uint64_t kStacks = 40;
  uint64_t failures = 0;
  for (uint64_t k = 1;; ++k) {
    SampleAggregator agg(kTypes);
    const uint32_t t = agg.AddThread(1, "main");
    uint64_t added = 0;  // stacks that made it in
    bool threw = false;
    g_allocations.store(0);
    g_fail_at = k;
    for (uint64_t i = 0; i < kStacks; ++i) {
      const uint64_t frames[] = {0x1000 + i, 0x2000};  // no allocation here
      const int64_t values[] = {1, 10};
      try {
        agg.Add(t, frames, 0, values);
        ++added;
      } catch (const std::bad_alloc&) {
        threw = true;
        break;
      }
    }
    g_fail_at = 0;
    if (!threw) break;  // the k-th allocation was never made
    ++failures;
    // The heap is back: every stack can be added, the earlier ones summed.
    for (uint64_t i = 0; i < kStacks; ++i) {
      const uint64_t frames[] = {0x1000 + i, 0x2000};
      const int64_t values[] = {1, 10};
      agg.Add(t, frames, 0, values);
    }
    EXPECT_EQ(agg.num_stacks(), kStacks) << "failing from allocation " << k;
    const ProfileData data = agg.Take();
    for (uint64_t i = 0; i < kStacks; ++i) {
      const ProfileSample* s = Find(data, t, {0x1000 + i, 0x2000});
      ASSERT_NE(s, nullptr) << "failing from allocation " << k;
      const int64_t times = i < added ? 2 : 1;
      EXPECT_THAT(s->values, ElementsAre(times, 10 * times)) << "failing from allocation " << k;
    }
  }
  EXPECT_GT(failures, kStacks);  // at least one allocation a new stack
}

// A label interned with the heap exhausted (a ScopedLabels on the host's
// thread) reads as the overflow's string, counted, and never throws; the
// table is as it was and takes the string once the heap is back. Each
// allocation of 40 new strings failed in turn: deterministic.
TEST(LabelTableTest, InternWithTheHeapExhaustedReadsAsTheOverflow) {
  for (uint64_t k = 1;; ++k) {
    internal::LabelTable table(1000, 1 << 20, "[full]");
    std::vector<std::string> texts;
    for (int i = 0; i < 40; ++i) {
      texts.push_back(absl::StrCat("a label value long enough to allocate ", i));
    }
    std::vector<uint32_t> ids;
    ids.reserve(texts.size());  // the test's own room, before the heap runs out
    g_allocations.store(0);
    g_fail_at = k;
    for (const std::string& t : texts) ids.push_back(table.Intern(t));
    g_fail_at = 0;
    const uint64_t refused = table.overflows();
    for (size_t i = 0; i < texts.size(); ++i) {
      const uint32_t id = table.Intern(texts[i]);
      EXPECT_EQ(table.Lookup(id), texts[i]) << "failing from allocation " << k;
      if (ids[i] != internal::LabelTable::kOverflowId) {
        EXPECT_EQ(ids[i], id);
      }
    }
    EXPECT_EQ(table.overflows(), refused);
    if (refused == 0) break;  // the k-th allocation was never made
  }
}

TEST(SampleAggregatorTest, RemovedThreadEntriesAreReusedAfterTake) {
  SampleAggregator agg(kTypes);
  const uint64_t frames[] = {0x1000, 0x2000};
  const int64_t v[] = {1, 10};
  const uint32_t a = agg.AddThread(100, "a");
  agg.Add(a, frames, 0, v);
  agg.RemoveThread(a);
  const uint32_t b = agg.AddThread(101, "b");
  EXPECT_NE(b, a) << "reused before a's samples were taken out";
  ProfileData first = agg.Take();
  ASSERT_EQ(first.samples.size(), 1u);
  EXPECT_EQ(first.threads[first.samples[0].thread].name, "a");
  for (int i = 0; i < 1000; ++i) {
    const uint32_t t = agg.AddThread(1000 + i, "churn");
    agg.Add(t, frames, 0, v);
    agg.RemoveThread(t);
    ProfileData window = agg.Take();
    ASSERT_EQ(window.samples.size(), 1u);
    EXPECT_EQ(window.threads[window.samples[0].thread].tid, 1000 + i);
  }
  EXPECT_EQ(agg.thread_table_size(), 2u);  // b, and a's entry reused by each
}

// The live endpoint's windows: a mirror gets what is added while it is set,
// under its own thread table, whatever the main aggregate's Take()s do.
TEST(SampleAggregatorTest, MirrorGetsWhatIsAddedWhileSet) {
  SampleAggregator agg(kTypes);
  SampleAggregator mirror(kTypes);
  const uint32_t a = agg.AddThread(10, "a");
  const std::vector<uint64_t> f1 = {0x10, 0x20};
  const std::vector<uint64_t> f2 = {0x30};
  const int64_t v[] = {1, 100};
  agg.Add(a, f1, 0, v);  // before: not mirrored

  agg.SetMirror(&mirror);
  agg.Add(a, f1, 0, v);
  const uint32_t b = agg.AddThread(20, "b");  // a thread that comes later
  agg.Add(b, f2, 0, v);
  agg.AddSynthetic(b, "[dropped: ring full]", 0, v);
  agg.SetThreadName(a, "a2");
  ProfileData main_window = agg.Take();  // the exporter's cut
  agg.Add(a, f1, 0, v);
  agg.RemoveThread(b);
  agg.SetMirror(nullptr);
  agg.Add(a, f1, 0, v);  // after: not mirrored

  ProfileData m = mirror.Take();
  ASSERT_EQ(m.threads.size(), 2u);
  EXPECT_EQ(m.threads[0].tid, 10);
  EXPECT_EQ(m.threads[0].name, "a2");
  EXPECT_EQ(m.threads[1].tid, 20);
  const ProfileSample* s1 = Find(m, 0, f1);
  ASSERT_NE(s1, nullptr);
  EXPECT_THAT(s1->values, ElementsAre(2, 200));
  const ProfileSample* s2 = Find(m, 1, f2);
  ASSERT_NE(s2, nullptr);
  EXPECT_THAT(s2->values, ElementsAre(1, 100));
  EXPECT_NE(Find(m, 1, {}, "[dropped: ring full]"), nullptr);
  EXPECT_EQ(m.samples.size(), 3u);

  // The main aggregate is as if there were no mirror.
  EXPECT_THAT(Find(main_window, a, f1)->values, ElementsAre(2, 200));
  ProfileData rest = agg.Take();
  EXPECT_THAT(Find(rest, a, f1)->values, ElementsAre(2, 200));
}

}  // namespace
}  // namespace inprof
