// What a process in library mode forwards to the agent (internal/
// agent_stream.h): the records' encoding, and the shared ring read by a
// consumer that trusts nothing the producer wrote.
#include "inprof/internal/agent_stream.h"

#include <cstdint>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inprof/internal/label_table.h"
#include "inprof/internal/sample_record.h"
#include "inprof/spsc_ring.h"

namespace inprof::internal {
namespace {

using ::testing::HasSubstr;

TEST(AgentStreamTest, EveryRecordRoundTrips) {
  const std::vector<AgentOp> ops = {
      AgentDescribe{{{"cpu-samples", "count"}, {"cpu-time", "nanoseconds"}},
                    {"cpu-time", "nanoseconds"}, 10'000'000,
                    "unwinder=dwarf providers=cpu,wall", /*omitted_types=*/0b10},
      AgentEngine{"cpu engine=perf"},
      AgentString{7, "request id"},
      AgentThreadAdd{3, 4242, "worker-1"},
      AgentThreadName{3, "renamed"},
      AgentThreadRemove{3},
      AgentSample{2, 1, {5, -6}, {7 | kNumericLabel, 99}, {0x401000, 0x402000, 0x403000}},
      AgentSynthetic{2, 0, {1, 10'000'000}, "[inprof: samples lost, agent ring full]"},
      AgentStats{{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}},
      AgentEnd{},
      AgentSample{2, 3, {0, 0, 4, 4096}, {}, {0x401000}, /*state=*/true},
      AgentSynthetic{2, 3, {0, 0, 1, 64}, "[inprof: unregistered]", /*state=*/true},
      AgentEventsNote{"allocations sampled=3", 524288, 1'000'000},
      AgentDumpThread{7, 4242, "worker", {{"thread state", "blocked", 0, false},
                                          {"waited ns", "", 1500, true}},
                      {0x401000, 0x402000}, ""},
      AgentDumpThread{7, 4243, "gone", {}, {}, "[inprof: the thread ended]"},
      AgentDumpEnd{7, {"thread dump: 2 registered threads"}, ""},
      AgentDumpEnd{8, {}, "the profiler is not running"},
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
  EncodeAgentSample(2, 1, values, labels, frames, /*state=*/false, direct);
  EXPECT_EQ(direct, EncodeAgentOp(ops[6]));
  auto sample = std::get<AgentSample>(*DecodeAgentOp(direct));
  EXPECT_EQ(sample.values, (std::vector<int64_t>{5, -6}));
  EXPECT_EQ(sample.frames.size(), 3u);
  EXPECT_FALSE(sample.state);
  // A state row is a sample of its own type: what it is survives the trip.
  const uint64_t frame[] = {0x401000};
  const int64_t live[] = {0, 0, 4, 4096};
  EncodeAgentSample(2, 3, live, {}, frame, /*state=*/true, direct);
  EXPECT_EQ(direct, EncodeAgentOp(ops[10]));
  EXPECT_NE(direct[0], EncodeAgentOp(ops[6])[0]);
  EXPECT_TRUE(std::get<AgentSample>(*DecodeAgentOp(direct)).state);
  EXPECT_TRUE(std::get<AgentSynthetic>(*DecodeAgentOp(EncodeAgentOp(ops[11]))).state);
  const auto note = std::get<AgentEventsNote>(*DecodeAgentOp(EncodeAgentOp(ops[12])));
  EXPECT_EQ(note.line, "allocations sampled=3");
  EXPECT_EQ(note.period, 524288);
}

TEST(AgentStreamTest, EveryTruncationIsAnErrorNamingTheField) {
  const std::vector<AgentOp> ops = {
      AgentDescribe{{{"cpu-samples", "count"}}, {"cpu-samples", "count"}, 1, "e"},
      AgentThreadAdd{3, 4242, "worker-1"},
      AgentSample{2, 0, {5}, {1, 2}, {0x401000}},
      AgentSynthetic{2, 0, {1}, "frame"},
      AgentSample{2, 0, {5}, {1, 2}, {0x401000}, /*state=*/true},
      AgentSynthetic{2, 0, {1}, "frame", /*state=*/true},
      AgentEventsNote{"line", 1, 2},
      AgentDumpThread{1, 2, "t", {{"k", "v", 3, true}}, {0x401000}, "s"},
      AgentDumpEnd{1, {"c"}, "e"},
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
  // The omitted types name types the record has.
  std::vector<uint64_t> past = EncodeAgentOp(
      AgentDescribe{{{"cpu-samples", "count"}}, {"cpu-samples", "count"}, 1, "e", 0b1});
  EXPECT_TRUE(DecodeAgentOp(past).ok());
  past.back() = 0b10;
  EXPECT_THAT(DecodeAgentOp(past).status().message(),
              HasSubstr("omitted sample types 0x2 name types past its 1"));
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

// The threads' own rings, as a process lays them out (AgentLink) and as the
// agent reads them after the process died (ReadAgentThreadArea).
class ThreadAreaTest : public ::testing::Test {
 protected:
  using Ring = SpscRecordRing<64>;
  static constexpr size_t kChunks = 3;

  void SetUp() override {
    AgentThreadRingLayout layout;
    layout.ring_bytes = sizeof(Ring);
    chunk_bytes_ = AgentThreadChunkBytes(layout);
    bytes_ = kAgentThreadAreaHeaderBytes + kChunks * chunk_bytes_;
    memory_.assign(bytes_ / 8 + 8, 0);
    auto* h = new (base()) AgentThreadAreaHeader{};
    h->shape.magic = kAgentThreadAreaMagic;
    h->shape.chunk_bytes = chunk_bytes_;
    h->shape.ring_offset = kAgentThreadRingOffset;
    h->shape.ring_words = 64;
    h->shape.leaf_words = 2;
    h->shape.num_providers = 2;  // cpu (2 values), wall (2 values, state label)
    h->shape.state_label_providers = 0b10;
    h->shape.value_counts[0] = h->shape.value_counts[1] = 2;
    h->shape.value_offsets[0] = 0;
    h->shape.value_offsets[1] = 2;
    h->chunks.store(kChunks);
  }
  char* base() { return reinterpret_cast<char*>(memory_.data()); }
  AgentThreadAreaHeader* header() { return reinterpret_cast<AgentThreadAreaHeader*>(base()); }
  char* chunk(size_t i) { return base() + kAgentThreadAreaHeaderBytes + i * chunk_bytes_; }
  // A chunk in use by `tid`, with its ring constructed.
  Ring* UseChunk(size_t i, int32_t tid, const char* name) {
    auto* c = new (chunk(i)) AgentThreadChunkHeader{};
    c->tid = tid;
    std::strncpy(c->name, name, sizeof(c->name));
    c->in_use.store(1);
    return new (chunk(i) + kAgentThreadRingOffset) Ring;
  }
  // A record as the signal handler writes it (internal/sample_record.h).
  static std::vector<uint64_t> Record(uint64_t provider, std::vector<uint64_t> values,
                                      std::vector<uint64_t> leaf,
                                      std::vector<uint64_t> labels,
                                      std::vector<uint64_t> frames, bool blocked) {
    RecordMeta meta;
    meta.provider = static_cast<uint8_t>(provider);
    meta.leaf_words = !leaf.empty();
    meta.label_count = static_cast<uint8_t>(labels.size() / 2);
    meta.depth = static_cast<uint16_t>(frames.size());
    meta.blocked = blocked;
    std::vector<uint64_t> r = {meta.Encode()};
    for (auto* part : {&values, &leaf, &labels, &frames}) {
      r.insert(r.end(), part->begin(), part->end());
    }
    return r;
  }
  std::vector<AgentLeftoverSample> Read(AgentThreadAreaSummary* summary,
                                        uint64_t bytes = 0) {
    std::vector<AgentLeftoverSample> out;
    names_.clear();
    *summary = ReadAgentThreadArea(base(), bytes == 0 ? bytes_ : bytes,
                                   [&](const AgentLeftoverSample& s) {
                                     names_.emplace_back(s.thread_name);
                                     out.push_back(s);
                                     // The spans point into the reader's scratch.
                                     copies_.push_back({s.values.begin(), s.values.end()});
                                     copies_.push_back({s.labels.begin(), s.labels.end()});
                                     copies_.push_back({s.frames.begin(), s.frames.end()});
                                   });
    return out;
  }

  uint32_t chunk_bytes_ = 0;
  size_t bytes_ = 0;
  std::vector<uint64_t> memory_;
  std::vector<std::string> names_;
  std::vector<std::vector<uint64_t>> copies_;
};

TEST_F(ThreadAreaTest, WhatTheHandlersLeftIsReadWithItsThread) {
  Ring* a = UseChunk(0, 101, "worker-a");
  Ring* b = UseChunk(2, 102, "worker-b");
  ASSERT_TRUE(a->TryPush(Record(0, {1, 10'000'000}, {7, 8}, {}, {0x401000, 0x402000}, false)));
  ASSERT_TRUE(a->TryPush(Record(1, {1, 9'000'000}, {}, {5, 6}, {0x403000}, true)));
  // Drained already (the tail moved past it): not read again.
  ASSERT_TRUE(b->TryPush(Record(0, {1, 1}, {}, {}, {0x1}, false)));
  uint64_t scratch[64];
  ASSERT_EQ(b->TryPop(scratch), 4u);
  ASSERT_TRUE(b->TryPush(Record(0, {1, 20'000'000}, {}, {}, {0x404000, 0x405000, 0x406000}, false)));
  // Chunk 1 is free: whatever it holds is not a thread's.
  AgentThreadAreaSummary summary;
  const auto samples = Read(&summary);
  EXPECT_EQ(summary.error, "");
  EXPECT_EQ(summary.rings, 2u);
  EXPECT_EQ(summary.samples, 3u);
  EXPECT_EQ(summary.skipped, 0u);
  ASSERT_EQ(samples.size(), 3u);
  EXPECT_EQ(samples[0].tid, 101);
  EXPECT_EQ(names_[0], "worker-a");
  EXPECT_EQ(samples[0].provider, 0u);
  EXPECT_EQ(samples[0].value_offset, 0u);
  EXPECT_FALSE(samples[0].state_label);
  EXPECT_EQ(copies_[0], (std::vector<uint64_t>{1, 10'000'000}));
  EXPECT_EQ(copies_[2], (std::vector<uint64_t>{0x401000, 0x402000}));  // leaf words skipped
  EXPECT_EQ(samples[1].value_offset, 2u);
  EXPECT_TRUE(samples[1].state_label);
  EXPECT_TRUE(samples[1].blocked);
  EXPECT_EQ(copies_[4], (std::vector<uint64_t>{5, 6}));
  EXPECT_EQ(samples[2].tid, 102);
  EXPECT_EQ(names_[2], "worker-b");
  EXPECT_EQ(copies_[8], (std::vector<uint64_t>{0x404000, 0x405000, 0x406000}));
}

TEST_F(ThreadAreaTest, NoAreaOrABrokenOneIsSaidAndNothingIsReadOutOfBounds) {
  AgentThreadAreaSummary summary;
  // No area at all (a process that made none): nothing, no error.
  EXPECT_TRUE(Read(&summary, 100).empty());
  EXPECT_EQ(summary.error, "");
  Ring* r = UseChunk(0, 7, "t");
  ASSERT_TRUE(r->TryPush(Record(0, {1, 2}, {}, {}, {0x1}, false)));
  header()->shape.magic = 1;
  EXPECT_TRUE(Read(&summary).empty());
  EXPECT_THAT(summary.error, HasSubstr("no header"));
  header()->shape.magic = kAgentThreadAreaMagic;
  for (auto breaks : std::vector<void (*)(AgentThreadAreaShape&)>{
           [](AgentThreadAreaShape& s) { s.ring_words = 63; },
           [](AgentThreadAreaShape& s) { s.ring_words = 1u << 30; },
           [](AgentThreadAreaShape& s) { s.num_providers = 0; },
           [](AgentThreadAreaShape& s) { s.num_providers = 99; },
           [](AgentThreadAreaShape& s) { s.ring_offset = 8; },
           [](AgentThreadAreaShape& s) { s.chunk_bytes = 64; },
           // Not whole pages: the next chunk's header would be misaligned
           // (found by fuzz/agent_stream_fuzzer.cc under UBSan).
           [](AgentThreadAreaShape& s) { s.chunk_bytes += 2; },
           [](AgentThreadAreaShape& s) { s.value_counts[1] = 1000; },
       }) {
    const AgentThreadAreaShape good = header()->shape;
    breaks(header()->shape);
    EXPECT_TRUE(Read(&summary).empty());
    EXPECT_THAT(summary.error, HasSubstr("impossible layout"));
    header()->shape = good;
  }
  // More chunks claimed than the memory holds: only those inside are read.
  header()->chunks.store(1'000'000);
  EXPECT_EQ(Read(&summary).size(), 1u);
  EXPECT_EQ(summary.rings, 1u);
}

TEST_F(ThreadAreaTest, AnImpossibleIndexOrRecordSkipsWhatCannotBeRead) {
  Ring* r = UseChunk(0, 7, "t");
  Ring* s = UseChunk(1, 8, "u");
  ASSERT_TRUE(r->TryPush(Record(5, {1, 2}, {}, {}, {0x1}, false)));  // no provider 5
  ASSERT_TRUE(r->TryPush(Record(0, {1, 2}, {}, {}, {0x2}, false)));
  ASSERT_TRUE(s->TryPush(Record(0, {1, 2}, {}, {}, {0x3}, false)));
  AgentThreadAreaSummary summary;
  auto samples = Read(&summary);
  EXPECT_EQ(samples.size(), 2u);  // the record after the bad one is still read
  EXPECT_EQ(summary.skipped, 1u);
  // A head further than the ring from the tail, then a length past the head.
  auto* words = reinterpret_cast<uint64_t*>(chunk(1) + kAgentThreadRingOffset);
  const uint64_t head = words[Ring::head_offset() / 8];
  words[Ring::head_offset() / 8] = head + 1000;
  samples = Read(&summary);
  EXPECT_EQ(samples.size(), 1u);
  EXPECT_EQ(summary.skipped, 2u);
  words[Ring::head_offset() / 8] = head;
  words[Ring::words_offset() / 8] = 63;  // the first record's length
  samples = Read(&summary);
  EXPECT_EQ(samples.size(), 1u);
  EXPECT_EQ(summary.skipped, 2u);
}

}  // namespace
}  // namespace inprof::internal
