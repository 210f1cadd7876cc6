// The provider table (include/inprof/internal/provider_table.h): each
// ProviderOps has a pointer where its provider declares the capability and
// none where it does not, its values' place in the sample, and calls reach
// the provider with the ThreadData of its own slot.
#include "inprof/internal/provider_table.h"

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <tuple>

#include "gtest/gtest.h"
#include "inprof/cpu_time_provider.h"
#include "inprof/heap/allocation_provider.h"
#include "inprof/internal/provider_set.h"
#include "inprof/wall_time_provider.h"

namespace inprof {
namespace {

// A provider with only what the concept requires, which logs each call.
struct Plain {
  static constexpr const char* kName = "plain";
  static constexpr std::array<SampleTypeSpec, 2> kSampleTypes{{{"a", "count"}, {"b", "ns"}}};
  static constexpr size_t kPeriodTypeIndex = 1;
  struct ThreadData {
    int armed_with = -1;
    int disarms = 0;
  };
  absl::Status Configure(const Options&) { return absl::OkStatus(); }
  int64_t Period() const { return 7; }
  absl::Status ArmThread(ThreadContext&, ThreadData& data, int tag) {
    data.armed_with = tag;
    return absl::OkStatus();
  }
  void DisarmThread(ThreadContext&, ThreadData& data) noexcept { ++data.disarms; }
  static bool OnSignal(ThreadContext&, ThreadData&, const siginfo_t&,
                       std::span<int64_t>) noexcept {
    return false;
  }
};

// The same with a tail and a frame of its own for it.
struct WithTail : Plain {
  static constexpr const char* kTailFrame = "[with tail]";
  bool TakeTail(ThreadContext&, ThreadData& data, std::span<int64_t> values) {
    values[0] = data.armed_with;
    values[1] = 99;
    return true;
  }
};

// A slot as ProfilerLayout<>::Slot holds the providers' data.
template <typename... Ps>
struct FakeSlot : ThreadContext {
  std::tuple<typename Ps::ThreadData...> data;
};

TEST(ProviderTableTest, ACallReachesItsProviderWithTheDataOfItsOwnSlot) {
  using Slot = FakeSlot<Plain, WithTail>;
  static constexpr auto kOps = internal::MakeProviderOpsTable<Slot, Plain, WithTail>();
  std::tuple<Plain, WithTail> providers;
  Slot slot;
  ASSERT_TRUE(kOps[0].arm(&std::get<0>(providers), slot, 41).ok());
  ASSERT_TRUE(kOps[1].arm(&std::get<1>(providers), slot, 42).ok());
  EXPECT_EQ(std::get<0>(slot.data).armed_with, 41);
  EXPECT_EQ(std::get<1>(slot.data).armed_with, 42);
  kOps[1].disarm(&std::get<1>(providers), slot);
  EXPECT_EQ(std::get<0>(slot.data).disarms, 0);
  EXPECT_EQ(std::get<1>(slot.data).disarms, 1);
  EXPECT_EQ(kOps[0].data(slot), &std::get<0>(slot.data));
  EXPECT_EQ(kOps[1].data(slot), &std::get<1>(slot.data));

  // The tail: the second provider's own, with its data.
  EXPECT_EQ(kOps[0].take_tail, nullptr);
  ASSERT_NE(kOps[1].take_tail, nullptr);
  int64_t values[2] = {};
  EXPECT_TRUE(kOps[1].take_tail(&std::get<1>(providers), slot, std::span<int64_t>(values)));
  EXPECT_EQ(values[0], 42);
  EXPECT_EQ(values[1], 99);
  EXPECT_STREQ(kOps[0].tail_frame, kTailFrame);
  EXPECT_STREQ(kOps[1].tail_frame, "[with tail]");

  // Reset: back to a default ThreadData, the other provider's untouched.
  kOps[1].reset_data(slot);
  EXPECT_EQ(std::get<1>(slot.data).armed_with, -1);
  EXPECT_EQ(std::get<1>(slot.data).disarms, 0);
  EXPECT_EQ(std::get<0>(slot.data).armed_with, 41);

  // Where their values sit: two each, one after the other.
  EXPECT_EQ(kOps[0].value_offset, 0u);
  EXPECT_EQ(kOps[1].value_offset, 2u);
  EXPECT_EQ(kOps[1].value_count, 2u);
  EXPECT_EQ(kOps[1].period_index, 1u);
  EXPECT_EQ(kOps[1].period(&std::get<1>(providers)), 7);
}

TEST(ProviderTableTest, EachLibraryProviderHasExactlyTheEntriesItDeclares) {
  using Slot = FakeSlot<CpuTimeProvider, WallTimeProvider, AllocationProvider, Plain>;
  static constexpr auto kOps = internal::MakeProviderOpsTable<
      Slot, CpuTimeProvider, WallTimeProvider, AllocationProvider, Plain>();
  using Set = internal::ProviderSet<CpuTimeProvider, WallTimeProvider, AllocationProvider, Plain>;
  for (size_t i = 0; i < kOps.size(); ++i) {
    EXPECT_EQ(kOps[i].value_offset, Set::kValueOffsets[i]) << i;
    EXPECT_EQ(kOps[i].value_count, Set::kValueCounts[i]) << i;
    EXPECT_NE(kOps[i].configure, nullptr);
    EXPECT_NE(kOps[i].arm, nullptr);
    EXPECT_NE(kOps[i].disarm, nullptr);
  }
  const internal::ProviderOps& cpu = kOps[0];
  const internal::ProviderOps& wall = kOps[1];
  const internal::ProviderOps& alloc = kOps[2];
  const internal::ProviderOps& plain = kOps[3];

  // CPU: samples running threads, arms in two steps, a tail, an engine to
  // describe; no ticking, no events.
  EXPECT_TRUE(cpu.samples_running);
  EXPECT_TRUE(cpu.arms_in_two_steps);
  EXPECT_NE(cpu.prepare, nullptr);
  EXPECT_NE(cpu.take_tail, nullptr);
  EXPECT_NE(cpu.describe, nullptr);
  EXPECT_FALSE(cpu.ticks_threads);
  EXPECT_EQ(cpu.tick_period, nullptr);
  EXPECT_EQ(cpu.start_events, nullptr);

  // Wall: ticks, follows running threads, labels the thread's state.
  EXPECT_TRUE(wall.ticks_threads);
  EXPECT_NE(wall.tick_period, nullptr);
  EXPECT_NE(wall.follow_running, nullptr);
  EXPECT_TRUE(wall.labels_state);
  EXPECT_FALSE(wall.samples_running);
  EXPECT_EQ(wall.prepare, nullptr);
  EXPECT_EQ(wall.start_events, nullptr);

  // Allocations: events, their snapshot (Go's four heap types), live state
  // and the events a thread leaves in its data.
  EXPECT_TRUE(alloc.records_events);
  EXPECT_NE(alloc.start_events, nullptr);
  EXPECT_NE(alloc.stop_events, nullptr);
  EXPECT_NE(alloc.flush_events, nullptr);
  EXPECT_NE(alloc.snapshot, nullptr);
  EXPECT_EQ(alloc.snapshot_types, AllocationProvider::kSnapshotTypes);
  EXPECT_NE(alloc.live_state, nullptr);
  EXPECT_NE(alloc.drain_thread_events, nullptr);
  EXPECT_FALSE(alloc.ticks_threads);

  // Nothing optional: every optional entry null, every flag off.
  EXPECT_EQ(plain.describe, nullptr);
  EXPECT_EQ(plain.prepare, nullptr);
  EXPECT_EQ(plain.take_tail, nullptr);
  EXPECT_EQ(plain.tick_period, nullptr);
  EXPECT_EQ(plain.follow_running, nullptr);
  EXPECT_EQ(plain.drain_thread_events, nullptr);
  EXPECT_EQ(plain.start_events, nullptr);
  EXPECT_EQ(plain.stop_events, nullptr);
  EXPECT_EQ(plain.flush_events, nullptr);
  EXPECT_EQ(plain.live_state, nullptr);
  EXPECT_EQ(plain.snapshot, nullptr);
  EXPECT_FALSE(plain.ticks_threads || plain.samples_running || plain.labels_state ||
               plain.arms_in_two_steps || plain.records_events);
}

}  // namespace
}  // namespace inprof
