// What a process in library mode forwards to the agent (internal/
// agent_stream.h): the records' encoding, and the shared ring read by a
// consumer that trusts nothing the producer wrote.
#include "inprof/internal/agent_stream.h"

#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inprof/internal/label_table.h"

namespace inprof::internal {
namespace {

using ::testing::HasSubstr;

TEST(AgentStreamTest, EveryRecordRoundTrips) {
  const std::vector<AgentOp> ops = {
      AgentDescribe{{{"cpu-samples", "count"}, {"cpu-time", "nanoseconds"}},
                    {"cpu-time", "nanoseconds"}, 10'000'000,
                    "unwinder=dwarf providers=cpu,wall"},
      AgentEngine{"cpu engine=perf"},
      AgentString{7, "request id"},
      AgentThreadAdd{3, 4242, "worker-1"},
      AgentThreadName{3, "renamed"},
      AgentThreadRemove{3},
      AgentSample{2, 1, {5, -6}, {7 | kNumericLabel, 99}, {0x401000, 0x402000, 0x403000}},
      AgentSynthetic{2, 0, {1, 10'000'000}, "[inprof: samples lost, agent ring full]"},
      AgentStats{{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}},
      AgentEnd{},
  };
  for (const AgentOp& op : ops) {
    const std::vector<uint64_t> words = EncodeAgentOp(op);
    absl::StatusOr<AgentOp> back = DecodeAgentOp(words);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(EncodeAgentOp(*back), words) << "record type " << words[0];
  }
  // The sample fast path encodes what the variant does.
  std::vector<uint64_t> direct;
  const int64_t values[] = {5, -6};
  const uint64_t labels[] = {7 | kNumericLabel, 99};
  const uint64_t frames[] = {0x401000, 0x402000, 0x403000};
  EncodeAgentSample(2, 1, values, labels, frames, direct);
  EXPECT_EQ(direct, EncodeAgentOp(ops[6]));
  auto sample = std::get<AgentSample>(*DecodeAgentOp(direct));
  EXPECT_EQ(sample.values, (std::vector<int64_t>{5, -6}));
  EXPECT_EQ(sample.frames.size(), 3u);
}

TEST(AgentStreamTest, EveryTruncationIsAnErrorNamingTheField) {
  const std::vector<AgentOp> ops = {
      AgentDescribe{{{"cpu-samples", "count"}}, {"cpu-samples", "count"}, 1, "e"},
      AgentThreadAdd{3, 4242, "worker-1"},
      AgentSample{2, 0, {5}, {1, 2}, {0x401000}},
      AgentSynthetic{2, 0, {1}, "frame"},
  };
  for (const AgentOp& op : ops) {
    const std::vector<uint64_t> words = EncodeAgentOp(op);
    for (size_t n = 1; n < words.size(); ++n) {
      absl::StatusOr<AgentOp> cut = DecodeAgentOp(std::span(words.data(), n));
      ASSERT_FALSE(cut.ok()) << "record type " << words[0] << " cut at " << n;
      EXPECT_THAT(cut.status().message(), HasSubstr("agent stream: ")) << cut.status();
    }
    std::vector<uint64_t> longer = words;
    longer.push_back(0);
    absl::StatusOr<AgentOp> extra = DecodeAgentOp(longer);
    ASSERT_FALSE(extra.ok());
    // A sample's counts say how long it is: they no longer add up.
    EXPECT_THAT(extra.status().message(),
                HasSubstr(std::holds_alternative<AgentSample>(op) ? "do not make its"
                                                                  : "after its end"));
  }
  EXPECT_THAT(DecodeAgentOp(std::vector<uint64_t>{99}).status().message(),
              HasSubstr("unknown record type 99"));
  // A thread record whose name claims more bytes than the record has.
  std::vector<uint64_t> words = EncodeAgentOp(AgentThreadAdd{1, 2, "ab"});
  words[3] = 1000;
  EXPECT_THAT(DecodeAgentOp(words).status().message(),
              HasSubstr("thread record: name has 1000 bytes, past the record's end"));
  // A string's padding must be zero: one encoding per record.
  words = EncodeAgentOp(AgentThreadAdd{1, 2, "ab"});
  words[4] |= uint64_t{0x24} << 16;
  EXPECT_THAT(DecodeAgentOp(words).status().message(),
              HasSubstr("name has 2 bytes and then padding that is not zero"));
  // A sample whose counts do not add up to its length.
  words = EncodeAgentOp(AgentSample{1, 0, {1}, {}, {2, 3}});
  words[5] = 5;  // frames
  EXPECT_THAT(DecodeAgentOp(words).status().message(),
              HasSubstr("do not make its"));
}

struct Region {
  explicit Region(size_t bytes) : words(bytes / 8, 0), bytes(bytes) {}
  void* data() { return words.data(); }
  std::vector<uint64_t> words;
  size_t bytes;
};

TEST(AgentStreamTest, RecordsWrapAroundTheRingAndAFullRingRefuses) {
  Region region(kAgentRingControlBytes + 64 * sizeof(uint64_t));
  ASSERT_EQ(AgentRingWords(region.bytes), 64u);
  AgentRingWriter writer(region.data(), region.bytes);
  AgentRingReader reader(region.data(), region.bytes);
  std::vector<uint64_t> out;
  uint64_t next = 0;
  for (int round = 0; round < 50; ++round) {
    // 5 records of 10 words (11 with the length) fit in 64; a 6th does not.
    int pushed = 0;
    while (writer.Push(std::vector<uint64_t>(10, next + pushed))) ++pushed;
    ASSERT_EQ(pushed, 5) << "round " << round;
    for (int i = 0; i < pushed; ++i) {
      ASSERT_EQ(reader.Pop(out), AgentRingReader::kRecord);
      EXPECT_EQ(out, std::vector<uint64_t>(10, next + i));
    }
    EXPECT_EQ(reader.Pop(out), AgentRingReader::kEmpty);
    next += pushed;
  }
  EXPECT_FALSE(writer.Push(std::vector<uint64_t>(64, 1))) << "longer than the ring";
  reader.AddSamplesConsumed(3);
  EXPECT_EQ(writer.samples_consumed(), 3u);
}

TEST(AgentStreamTest, AnImpossibleIndexOrLengthStopsTheReader) {
  Region region(kAgentRingControlBytes + 64 * sizeof(uint64_t));
  auto* control = static_cast<AgentRingControl*>(region.data());
  {
    AgentRingReader reader(region.data(), region.bytes);
    std::vector<uint64_t> out;
    control->head.store(1000);  // more than the ring holds
    EXPECT_EQ(reader.Pop(out), AgentRingReader::kCorrupt);
    EXPECT_THAT(reader.error(), HasSubstr("write index 1000 is impossible"));
    control->head.store(0);
    EXPECT_EQ(reader.Pop(out), AgentRingReader::kCorrupt) << "never read again";
  }
  {
    AgentRingWriter writer(region.data(), region.bytes);
    control->head.store(0);
    control->tail.store(0);
    ASSERT_TRUE(writer.Push(std::vector<uint64_t>{1, 2}));
    AgentRingReader reader(region.data(), region.bytes);
    region.words[kAgentRingControlBytes / 8] = 40;  // the length word
    std::vector<uint64_t> out;
    EXPECT_EQ(reader.Pop(out), AgentRingReader::kCorrupt);
    EXPECT_THAT(reader.error(), HasSubstr("a record of 40 words"));
  }
  {
    // A length that wraps around when one is added (found by the fuzzer:
    // it used to pass the check and ask for 2^64-1 words).
    control->head.store(1);
    control->tail.store(0);
    region.words[kAgentRingControlBytes / 8] = ~uint64_t{0};
    AgentRingReader reader(region.data(), region.bytes);
    std::vector<uint64_t> out;
    EXPECT_EQ(reader.Pop(out), AgentRingReader::kCorrupt);
    EXPECT_THAT(reader.error(), HasSubstr("a record of 18446744073709551615 words"));
  }
  EXPECT_EQ(AgentRingWords(100), 0u);
  AgentRingReader tiny(region.data(), 100);
  std::vector<uint64_t> out;
  EXPECT_EQ(tiny.Pop(out), AgentRingReader::kCorrupt);
}

}  // namespace
}  // namespace inprof::internal
