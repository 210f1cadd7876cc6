// internal: not part of the public API.
//
// What a profiled process forwards to `inprof agent` through the shared
// memory it received in the Welcome (agent_protocol.h): one ring of records
// in the memfd, written by the process's collector and read by the agent.
//
// Why a forwarding ring rather than the agent reading the threads' own
// rings: the signal handler, the wall sampler's blocked-episode bookkeeping
// and the leaf-frame repair stay exactly the same in both modes (they read
// what the collector drained in the process); what moves to the agent is
// everything after the drain -- aggregation, symbolization, encoding,
// upload. The process's per-sample work in library mode is one copy into
// this ring. The threads' rings are in the region too (the end of this
// file), but the agent reads them only once the process is gone.
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
#include <functional>
#include <span>
#include <string_view>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "inprof/profile_data.h"
#include "inprof/internal/sample_record.h"

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
  // The sample types (bit i: sample_types[i]) the process leaves out of its
  // profiles (Pipeline::SetOmittedTypes: a provider that is off); the
  // agent's windows leave them out too.
  uint64_t omitted_types = 0;
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
// A sample adds its values to the window. A state row (`state`: the
// process's live heap, which the agent's windows report at their end)
// says instead what the values of its row -- thread, value offset, labels
// and frames (a synthetic's frame) -- are now; the agent keeps the newest
// of each row and adds the rows it keeps to every window it cuts. The
// process sends a row again only when it changed (all zeros: gone).
struct AgentSample {
  uint32_t thread = 0;
  uint32_t value_offset = 0;
  std::vector<int64_t> values;
  std::vector<uint64_t> labels;  // canonical label words (ids of AgentStrings)
  std::vector<uint64_t> frames;
  bool state = false;
};
struct AgentSynthetic {
  uint32_t thread = 0;
  uint32_t value_offset = 0;
  std::vector<int64_t> values;
  std::string frame;
  bool state = false;
};
// The process's counters (ProfilerStats, in its field order).
struct AgentStats {
  std::vector<uint64_t> counters;
};
// The process stopped its profiler: nothing follows.
struct AgentEnd {};
// The comment line of the process's event providers (the allocation
// counters), when it changed: the agent's windows carry the newest. And
// their sampling period (the allocations' mean, in bytes; 0: none), the
// period of the agent's heap snapshots (/debug/pprof/heap); and the lock
// waits' (nanoseconds; 0: none), of its /debug/pprof/mutex and /block.
struct AgentEventsNote {
  std::string line;
  int64_t period = 0;
  int64_t lock_period = 0;
};

// The answer to the agent's AgentDumpRequest (agent_protocol.h): one
// AgentDumpThread per thread of the dump (ProfilerBase::DumpThreads:
// identity, labels, frames or a synthetic frame), then AgentDumpEnd with
// the dump's comment lines, or why there is no dump.
struct AgentDumpLabel {
  std::string key;
  std::string str;
  int64_t num = 0;
  bool numeric = false;
};
struct AgentDumpThread {
  uint32_t request = 0;
  int64_t tid = 0;
  std::string name;
  std::vector<AgentDumpLabel> labels;
  std::vector<uint64_t> frames;
  std::string synthetic;
};
struct AgentDumpEnd {
  uint32_t request = 0;
  std::vector<std::string> comments;
  std::string error;  // empty: the dump is whole (threads not sent are counted in a comment)
};

using AgentOp = std::variant<AgentDescribe, AgentEngine, AgentString,
                             AgentThreadAdd, AgentThreadName, AgentThreadRemove,
                             AgentSample, AgentSynthetic, AgentStats, AgentEnd,
                             AgentEventsNote, AgentDumpThread, AgentDumpEnd>;

// Bounds the decoder enforces (a record is never longer than the ring).
inline constexpr size_t kAgentOpMaxValues = 64;
inline constexpr size_t kAgentOpMaxFrames = 4096;
inline constexpr size_t kAgentOpMaxLabelWords = 256;
inline constexpr size_t kAgentOpMaxStringBytes = 64 * 1024;
inline constexpr size_t kAgentOpMaxDumpLabels = 64;

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
                       std::span<const uint64_t> frames, bool state,
                       std::vector<uint64_t>& out);

// ---------------------------------------------------------------------------
// The threads' own rings.
//
// Beyond the forwarding ring -- from offset `region_bytes` of the Welcome on
// -- the process grows the memfd with its registered threads' sample rings
// (the rings their signal handlers write), so that a process that dies
// (SIGKILL, a crash) loses nothing its handlers had written: when a
// connection ends without an AgentEnd, the agent reads what the process's
// collector had not drained (ReadAgentThreadArea) and adds it to the
// process's last window. While the process lives its collector alone reads
// them, as in-process.
//
// Layout: one page holding an AgentThreadAreaHeader, then chunks of
// chunk_bytes, each an AgentThreadChunkHeader and, at ring_offset, an
// SpscRecordRing<ring_words> (spsc_ring.h) of sample records
// (internal/sample_record.h). The process writes the header and each chunk
// before it publishes the chunk count. The agent checks every field against
// the memfd's size and reads nothing out of bounds.
inline constexpr uint64_t kAgentThreadAreaMagic = 0x3152485452504e49;  // "INPRTHR1"
inline constexpr size_t kAgentThreadAreaHeaderBytes = 4096;
inline constexpr size_t kAgentMaxProviders = kMaxRingProviders;
// Where the process puts the ring in each chunk, and the bytes of an
// SpscRecordRing before its words (its indices and drop count).
inline constexpr uint32_t kAgentThreadRingOffset = 64;
inline constexpr size_t kAgentThreadRingIndexBytes = 320;

struct AgentThreadAreaShape {
  uint64_t magic;
  uint32_t chunk_bytes;
  uint32_t ring_offset;  // of the ring in a chunk
  uint32_t ring_words;
  uint32_t leaf_words;   // the unwinder's leaf stack words (sample_record.h)
  uint32_t num_providers;
  uint32_t state_label_providers;  // bit i: provider i's samples are labelled
                                   // "thread state" running/blocked
  uint32_t value_counts[kAgentMaxProviders];
  uint32_t value_offsets[kAgentMaxProviders];
};
struct AgentThreadAreaHeader {
  AgentThreadAreaShape shape;
  std::atomic<uint32_t> chunks;  // made so far (release after each is made)
};
static_assert(sizeof(AgentThreadAreaHeader) <= kAgentThreadAreaHeaderBytes);

struct AgentThreadChunkHeader {
  std::atomic<uint32_t> in_use;  // a registered thread's ring
  int32_t tid;
  char name[56];  // NUL-terminated unless all 56 are used
};

// The shape of the process's records and rings (its Profiler type's):
// sample_record.h.
using AgentThreadRingLayout = ThreadRingLayout;
// A chunk's size for `layout`: the header's 64 bytes, then the ring, in pages.
uint32_t AgentThreadChunkBytes(const AgentThreadRingLayout& layout);
// Where the thread area starts in a region whose Welcome said `region_bytes`.
uint64_t AgentThreadAreaOffset(uint64_t region_bytes);

// A record left in a thread's ring, decoded.
struct AgentLeftoverSample {
  int32_t tid = 0;
  std::string_view thread_name;
  uint32_t provider = 0;
  uint32_t value_offset = 0;
  bool blocked = false;      // sampled while blocked
  bool state_label = false;  // the provider labels "thread state"
  std::span<const uint64_t> values;  // int64 values as words
  std::span<const uint64_t> labels;  // label words (process ids)
  std::span<const uint64_t> frames;  // as unwound (no leaf repair)
};
struct AgentThreadAreaSummary {
  uint64_t rings = 0;    // in use when the process ended
  uint64_t samples = 0;  // read from them
  uint64_t skipped = 0;  // records or rings that did not decode
  std::string error;     // the area itself is unusable (empty: fine)
};
// Reads every record left in the in-use rings of `area` (`bytes` long, as
// mapped from AgentThreadAreaOffset), calling `on_sample` for each. Reads
// only: the area is the process's. Never reads outside [area, area + bytes).
AgentThreadAreaSummary ReadAgentThreadArea(
    const void* area, uint64_t bytes,
    const std::function<void(const AgentLeftoverSample&)>& on_sample);

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_AGENT_STREAM_H_
