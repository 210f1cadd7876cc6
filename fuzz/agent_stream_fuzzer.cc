// libFuzzer target: what `inprof agent` reads from a profiled process's
// shared memory (agent_stream.h) -- the records (DecodeAgentOp) and the ring
// they travel in (AgentRingReader), both written by a process the agent
// does not trust.
//
// Checked:
//  - the input as little-endian 64-bit words (a trailing partial word is
//    dropped) is one record: DecodeAgentOp either fails with an error that
//    begins "agent stream: " or gives an op that encodes back to exactly
//    the input words (the format has one encoding per record);
//  - the input bytes as a whole region (control block, then the ring: the
//    largest size AgentRingWords accepts, in a buffer of exactly that size
//    so ASan sees any read past it): popping until kEmpty or kCorrupt, and
//    decoding every record popped, neither crashes nor reads out of bounds,
//    a record is never longer than the ring, and kCorrupt comes with an
//    error and stays;
//  - the input as the threads' ring area of a process that died
//    (ReadAgentThreadArea): its first bytes as the area's header (the magic
//    set right when the first byte is even, so that the rest is explored),
//    the rest as its chunks, in a buffer of exactly that size: the reader
//    neither crashes nor reads out of bounds, calls back once per sample it
//    counts, and every sample's parts fit in a record of the ring.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <span>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "inprof/internal/agent_stream.h"

namespace {

using inprof::internal::AgentOp;
using inprof::internal::AgentRingReader;

// DecodeAgentOp's contract on one record.
void CheckRecord(std::span<const uint64_t> words) {
  absl::StatusOr<AgentOp> op = inprof::internal::DecodeAgentOp(words);
  if (op.ok()) {
    const std::vector<uint64_t> again = inprof::internal::EncodeAgentOp(*op);
    if (again.size() != words.size() ||
        !std::equal(again.begin(), again.end(), words.begin())) {
      std::abort();
    }
  } else {
    const absl::string_view error = op.status().message();
    if (!absl::StartsWith(error, "agent stream: ") ||
        absl::StrContains(error, "\n")) {
      std::abort();
    }
  }
}

// The ring's reader on a region holding the input's bytes.
void CheckRing(const uint8_t* data, size_t size) {
  const size_t words = inprof::internal::AgentRingWords(size);
  if (words == 0) return;  // too small to hold a ring
  const size_t region_bytes = inprof::internal::kAgentRingControlBytes +
                              words * sizeof(uint64_t);
  // A region is page-aligned memory in the agent; here, the control block's
  // alignment, and exactly region_bytes so that ASan catches reads past it.
  constexpr std::align_val_t kAlign{alignof(inprof::internal::AgentRingControl)};
  void* region = ::operator new(region_bytes, kAlign);
  std::memcpy(region, data, region_bytes);

  AgentRingReader reader(region, region_bytes);
  std::vector<uint64_t> record;
  // Every record takes at least two words of the ring and the write index
  // is read once per Pop: a sound reader ends within `words` records; a
  // few more rounds cannot hurt.
  const size_t max_pops = words + 4;
  size_t pops = 0;
  AgentRingReader::Result result;
  while ((result = reader.Pop(record)) == AgentRingReader::kRecord) {
    if (record.empty() || record.size() >= words) std::abort();
    CheckRecord(record);
    if (++pops > max_pops) std::abort();  // the reader never ends
  }
  if (result == AgentRingReader::kCorrupt) {
    if (reader.error().empty()) std::abort();
    if (reader.Pop(record) != AgentRingReader::kCorrupt) std::abort();
  } else if (!reader.error().empty()) {
    std::abort();
  }
  reader.AddSamplesConsumed(1);
  ::operator delete(region, kAlign);
}

void CheckThreadArea(const uint8_t* data, size_t size) {
  using inprof::internal::AgentThreadAreaHeader;
  using inprof::internal::AgentThreadAreaShape;
  using inprof::internal::kAgentThreadAreaHeaderBytes;
  const size_t header_input = sizeof(AgentThreadAreaShape) + sizeof(uint32_t);
  if (size < header_input) return;
  const size_t bytes = kAgentThreadAreaHeaderBytes + (size - header_input);
  constexpr std::align_val_t kAlign{64};
  char* area = static_cast<char*>(::operator new(bytes, kAlign));
  std::memset(area, 0, kAgentThreadAreaHeaderBytes);
  std::memcpy(area, data, header_input);
  if ((data[0] & 1) == 0) {
    reinterpret_cast<AgentThreadAreaShape*>(area)->magic =
        inprof::internal::kAgentThreadAreaMagic;
  }
  std::memcpy(area + kAgentThreadAreaHeaderBytes, data + header_input, size - header_input);
  const uint32_t ring_words = reinterpret_cast<AgentThreadAreaShape*>(area)->ring_words;
  uint64_t calls = 0;
  const inprof::internal::AgentThreadAreaSummary summary = inprof::internal::ReadAgentThreadArea(
      area, bytes, [&](const inprof::internal::AgentLeftoverSample& s) {
        ++calls;
        const size_t words = 1 + s.values.size() + s.labels.size() + s.frames.size();
        if (words >= ring_words || s.values.size() > inprof::internal::kAgentOpMaxValues ||
            s.labels.size() % 2 != 0) {
          std::abort();
        }
      });
  if (calls != summary.samples) std::abort();
  if (!summary.error.empty() && calls != 0) std::abort();
  ::operator delete(area, kAlign);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The input as words (memcpy: the input need not be aligned).
  std::vector<uint64_t> words(size / sizeof(uint64_t));
  if (!words.empty()) std::memcpy(words.data(), data, words.size() * sizeof(uint64_t));
  CheckRecord(words);
  CheckRing(data, size);
  CheckThreadArea(data, size);
  return 0;
}
