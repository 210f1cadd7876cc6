// The record codec (internal/sample_record.h): where each part of a record
// lies, written once and read back by RecordView as every reader does.
#include "inprof/internal/sample_record.h"

#include <array>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace inprof::internal {
namespace {

// A record written as the writers write it: the header by
// WriteRecordHeader (from a meta without its counts, which the layout
// gives), the other parts at RecordLayout's offsets.
std::vector<uint64_t> Write(const RecordMeta& meta, const RecordLayout& at,
                            const std::vector<uint64_t>& values,
                            const std::vector<uint64_t>& leaf,
                            const std::vector<uint64_t>& labels,
                            const std::vector<uint64_t>& frames) {
  std::vector<uint64_t> record(at.size(), 0xdead);
  RecordMeta bare = meta;
  bare.leaf_words = false;
  bare.label_count = 0;
  bare.depth = 0;
  const std::vector<int64_t> signed_values(values.begin(), values.end());
  EXPECT_EQ(WriteRecordHeader(record.data(), at, bare, signed_values.data()), at.size());
  for (size_t i = 0; i < leaf.size(); ++i) record[at.leaf_at() + i] = leaf[i];
  for (size_t i = 0; i < labels.size(); ++i) record[at.labels_at() + i] = labels[i];
  for (size_t i = 0; i < frames.size(); ++i) record[at.frames_at() + i] = frames[i];
  return record;
}

TEST(SampleRecordTest, EveryPartReadsBackWhereItWasWritten) {
  constexpr std::array<size_t, 3> kCounts = {2, 1, 4};
  for (const bool with_leaf : {false, true}) {
    RecordMeta meta;
    meta.provider = 2;
    meta.leaf_words = with_leaf;
    meta.label_count = 2;
    meta.depth = 3;
    const RecordLayout at{.values = 4, .leaf_words = with_leaf ? 5u : 0u, .labels = 2, .depth = 3};
    const std::vector<uint64_t> values = {10, 11, 12, 13}, leaf = {20, 21, 22, 23, 24},
                                labels = {30, 31, 32, 33}, frames = {40, 41, 42};
    const std::vector<uint64_t> record = Write(
        meta, at, values, with_leaf ? leaf : std::vector<uint64_t>{}, labels, frames);
    EXPECT_EQ(record.size(), 1 + 4 + (with_leaf ? 5 : 0) + 4 + 3u);
    const RecordView view = RecordView::Read(record.data(), record.size(), kCounts, 5);
    ASSERT_TRUE(view.ok());
    EXPECT_EQ(view.meta, meta);
    EXPECT_EQ(std::vector<uint64_t>(view.values().begin(), view.values().end()), values);
    EXPECT_EQ(std::vector<uint64_t>(view.leaf().begin(), view.leaf().end()),
              with_leaf ? leaf : std::vector<uint64_t>{});
    EXPECT_EQ(std::vector<uint64_t>(view.labels().begin(), view.labels().end()), labels);
    EXPECT_EQ(std::vector<uint64_t>(view.frames().begin(), view.frames().end()), frames);
    EXPECT_EQ(view.layout.size(), record.size());
  }
}

// A record its words cannot hold, or of a provider the reader does not
// know, is refused, never read past its end.
TEST(SampleRecordTest, ARecordShorterThanItsMetaSaysOrOfAnUnknownProviderIsRefused) {
  constexpr std::array<size_t, 2> kCounts = {2, 3};
  RecordMeta meta;
  meta.provider = 1;
  meta.label_count = 1;
  meta.depth = 4;
  const RecordLayout at{.values = 3, .labels = 1, .depth = 4};
  const std::vector<uint64_t> record = Write(meta, at, {1, 2, 3}, {}, {7, 8}, {1, 2, 3, 4});
  EXPECT_TRUE(RecordView::Read(record.data(), record.size(), kCounts, 0).ok());
  EXPECT_FALSE(RecordView::Read(record.data(), record.size() - 1, kCounts, 0).ok());
  EXPECT_FALSE(RecordView::Read(record.data(), 0, kCounts, 0).ok());
  meta.provider = 2;
  std::vector<uint64_t> unknown = record;
  unknown[0] = meta.Encode();
  EXPECT_FALSE(RecordView::Read(unknown.data(), unknown.size(), kCounts, 0).ok());
  // A stackless record: the meta and the values only.
  RecordMeta stackless;
  stackless.stackless = true;
  const RecordLayout short_at{.values = 2};
  EXPECT_EQ(short_at.size(), 3u);
  const std::vector<uint64_t> values_only = Write(stackless, short_at, {5, 6}, {}, {}, {});
  const RecordView view = RecordView::Read(values_only.data(), values_only.size(), kCounts, 8);
  ASSERT_TRUE(view.ok());
  EXPECT_TRUE(view.meta.stackless);
  EXPECT_EQ(view.values()[1], 6u);
  EXPECT_TRUE(view.frames().empty());
}

}  // namespace
}  // namespace inprof::internal
