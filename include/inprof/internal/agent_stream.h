// internal: not part of the public API.
//
// What a profiled process forwards to `inprof agent` through the shared
// memory it received in the Welcome (agent_protocol.h): one ring of records
// in the memfd, written by the process's collector and read by the agent.
//
// Why one forwarding ring and not the threads' own rings in the region: the
// signal handler, the wall sampler's blocked-episode bookkeeping and the
// leaf-frame repair stay exactly the same in both modes (they read what the
// collector drained in the process); what moves to the agent is everything
// after the drain -- aggregation, symbolization, encoding, upload. The
// process's per-sample work in library mode is one copy into this ring.
//
// The region starts with a control block -- the producer's index, the
// consumer's index and the number of samples consumed, each on its own cache
// line -- followed by the ring's words. Both sides derive the ring's capacity
// from the region's size alone (AgentRingWords), never from the region's
// contents: the agent trusts nothing the process wrote, bounds-checks every
// index and record, and stops reading a ring that is inconsistent
// (fuzz/agent_stream_fuzzer.cc).
//
// Records are AgentOps: one type word, then the payload (fixed-width words;
// strings as a byte count and the bytes packed into words, little-endian).
//
// Example (the process side):
//   AgentRingWriter ring(region, region_bytes);
//   ring.Push(EncodeAgentOp(AgentThreadAdd{.index = 0, .tid = 42, .name = "main"}));
// and the agent's:
//   AgentRingReader reader(region, region_bytes);
//   std::vector<uint64_t> record;
//   while (reader.Pop(record) == AgentRingReader::kRecord) {
//     absl::StatusOr<AgentOp> op = DecodeAgentOp(record);
//   }
#ifndef INPROF_INTERNAL_AGENT_STREAM_H_
#define INPROF_INTERNAL_AGENT_STREAM_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "inprof/profile_data.h"

namespace inprof::internal {

// The control block at the start of the region.
struct AgentRingControl {
  alignas(64) std::atomic<uint64_t> head;  // words written (producer)
  alignas(64) std::atomic<uint64_t> tail;  // words read (consumer)
  // AgentSample records the agent consumed: what the process counts as lost
  // when the agent dies is what it forwarded beyond this.
  alignas(64) std::atomic<uint64_t> samples_consumed;
};
static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "the ring's indices are shared between processes");
inline constexpr size_t kAgentRingControlBytes = sizeof(AgentRingControl);

// The ring's capacity in words for a region of `region_bytes`: the largest
// power of two that fits after the control block (0 when none does).
size_t AgentRingWords(uint64_t region_bytes);

// The producer side (the profiled process). Not thread-safe: one writer.
class AgentRingWriter {
 public:
  AgentRingWriter(void* region, uint64_t region_bytes);
  // Appends one record; false when it does not fit now (the caller counts
  // the loss). Never blocks.
  bool Push(std::span<const uint64_t> record);
  // Records the consumer has not read yet, in words.
  uint64_t pending_words() const;
  uint64_t samples_consumed() const;
  size_t capacity_words() const { return words_; }

 private:
  AgentRingControl* control_;
  uint64_t* data_;
  size_t words_;
};

// The consumer side (the agent). Reads a region another process writes.
class AgentRingReader {
 public:
  AgentRingReader(void* region, uint64_t region_bytes);
  enum Result { kEmpty, kRecord, kCorrupt };
  // The oldest record into `record`. kCorrupt (with error()) when the
  // producer's index or a record's length is impossible; the ring is not
  // read again after that.
  Result Pop(std::vector<uint64_t>& record);
  // Counts samples consumed, for the producer's loss accounting.
  void AddSamplesConsumed(uint64_t n);
  const std::string& error() const { return error_; }

 private:
  AgentRingControl* control_;
  const uint64_t* data_;
  size_t words_;
  uint64_t tail_ = 0;
  std::string error_;
};

// The records.
// The profile's shape: first record of every connection.
struct AgentDescribe {
  std::vector<ValueType> sample_types;
  ValueType period_type;
  int64_t period = 0;
  std::string engine;  // "unwinder=... providers=..."
};
// How samples are taken (the engine's detail line), when it changes.
struct AgentEngine {
  std::string detail;
};
// A label string of the process's LabelTable: sample label words carry ids.
struct AgentString {
  uint32_t id = 0;
  std::string text;
};
struct AgentThreadAdd {
  uint32_t index = 0;  // the process's aggregate thread index
  int64_t tid = 0;
  std::string name;
};
struct AgentThreadName {
  uint32_t index = 0;
  std::string name;
};
struct AgentThreadRemove {
  uint32_t index = 0;
};
struct AgentSample {
  uint32_t thread = 0;
  uint32_t value_offset = 0;
  std::vector<int64_t> values;
  std::vector<uint64_t> labels;  // canonical label words (ids of AgentStrings)
  std::vector<uint64_t> frames;
};
struct AgentSynthetic {
  uint32_t thread = 0;
  uint32_t value_offset = 0;
  std::vector<int64_t> values;
  std::string frame;
};
// The process's counters (ProfilerStats, in its field order).
struct AgentStats {
  std::vector<uint64_t> counters;
};
// The process stopped its profiler: nothing follows.
struct AgentEnd {};

using AgentOp = std::variant<AgentDescribe, AgentEngine, AgentString,
                             AgentThreadAdd, AgentThreadName, AgentThreadRemove,
                             AgentSample, AgentSynthetic, AgentStats, AgentEnd>;

// Bounds the decoder enforces (a record is never longer than the ring).
inline constexpr size_t kAgentOpMaxValues = 64;
inline constexpr size_t kAgentOpMaxFrames = 4096;
inline constexpr size_t kAgentOpMaxLabelWords = 256;
inline constexpr size_t kAgentOpMaxStringBytes = 64 * 1024;

// Appends the record's words to `out` (cleared first).
void EncodeAgentOp(const AgentOp& op, std::vector<uint64_t>& out);
std::vector<uint64_t> EncodeAgentOp(const AgentOp& op);
// Every error names the record type and the field.
absl::StatusOr<AgentOp> DecodeAgentOp(std::span<const uint64_t> record);

// The AgentSample encoding without building an AgentSample (the process's
// collector calls it for every sample).
void EncodeAgentSample(uint32_t thread, uint32_t value_offset,
                       std::span<const int64_t> values,
                       std::span<const uint64_t> labels,
                       std::span<const uint64_t> frames,
                       std::vector<uint64_t>& out);

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_AGENT_STREAM_H_
