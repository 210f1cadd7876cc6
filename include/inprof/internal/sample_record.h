// internal: not part of the public API.
//
// The layout of one sample record in a thread's ring, as the signal handler
// writes it (profiler.h; the Windows sampler, profiler_windows.h) and as two
// readers decode it: the profiler's collector, and `inprof agent`, which
// reads the threads' rings of a library-mode process that died before its
// collector drained them (agent_stream.h: AgentThreadArea).
//
//   [meta][values...][leaf stack words...][label words...][frames...]
//
// The number of values is the provider's (its sample types), the leaf words
// the unwinder's (CopiesLeafStack), the label words two per label: a key
// and a value, label-table ids (internal/label_table.h). `meta` is a
// RecordMeta, encoded in one word; every reader and writer goes through
// Encode() and Decode(), so a new bit is one field and one line each.
//
// Example:
//   RecordMeta meta;
//   meta.provider = 1;
//   meta.depth = 12;
//   record[0] = meta.Encode();
//   ...
//   const RecordMeta read = RecordMeta::Decode(record[0]);
#ifndef INPROF_INTERNAL_SAMPLE_RECORD_H_
#define INPROF_INTERNAL_SAMPLE_RECORD_H_

#include <cstdint>

namespace inprof::internal {

struct RecordMeta {
  // The bits of the word, low to high.
  static constexpr int kProviderShift = 0;        // 8 bits
  static constexpr int kTruncatedShift = 8;
  static constexpr int kLeafWordsShift = 9;
  static constexpr int kLabelCountShift = 10;     // 6 bits
  static constexpr int kDepthShift = 16;          // 16 bits
  static constexpr int kBlockedShift = 32;
  static constexpr int kProvisionalShift = 33;
  static constexpr int kTablesReadyShift = 34;
  static constexpr int kGenerationShift = 35;     // 26 bits
  static constexpr int kStacklessShift = 61;
  static constexpr int kSameStackShift = 62;
  static constexpr int kUnsuspendedShift = 63;
  static constexpr uint64_t kLabelCountMask = 0x3f;
  static constexpr uint64_t kDepthMask = 0xffff;
  static constexpr uint64_t kGenerationMask = (uint64_t{1} << 26) - 1;

  uint8_t provider = 0;      // the provider's index in the Profiler
  bool truncated = false;    // the walk stopped at a bad frame or the limit
  bool leaf_words = false;   // the unwinder's leaf stack words follow
  uint8_t label_count = 0;   // at most kLabelCountMask
  uint16_t depth = 0;        // frames
  bool blocked = false;      // a sample of a blocked thread (wall time)
  // Linux: a blocked stack walked before the unwinder's tables had what it
  // needed (frames may be missing), whether they were ready then, and
  // their generation (low bits): the collector samples the episode again
  // once newer tables exist.
  bool provisional = false;
  bool tables_ready = false;
  uint32_t generation = 0;
  // Linux: no stack (depth 0): the thread was on a stack too small for the
  // walk (a signal handler's sigaltstack, a coroutine's); values only.
  bool stackless = false;
  // Windows: the sample reuses the thread's previous stack (it did not run
  // since), or the thread could not be suspended (no stack).
  bool same_stack = false;
  bool unsuspended = false;

  constexpr uint64_t Encode() const {
    return static_cast<uint64_t>(provider) << kProviderShift |
           static_cast<uint64_t>(truncated) << kTruncatedShift |
           static_cast<uint64_t>(leaf_words) << kLeafWordsShift |
           (label_count & kLabelCountMask) << kLabelCountShift |
           static_cast<uint64_t>(depth) << kDepthShift |
           static_cast<uint64_t>(blocked) << kBlockedShift |
           static_cast<uint64_t>(provisional) << kProvisionalShift |
           static_cast<uint64_t>(tables_ready) << kTablesReadyShift |
           (generation & kGenerationMask) << kGenerationShift |
           static_cast<uint64_t>(stackless) << kStacklessShift |
           static_cast<uint64_t>(same_stack) << kSameStackShift |
           static_cast<uint64_t>(unsuspended) << kUnsuspendedShift;
  }
  static constexpr RecordMeta Decode(uint64_t word) {
    RecordMeta m;
    m.provider = static_cast<uint8_t>(word >> kProviderShift);
    m.truncated = (word >> kTruncatedShift) & 1;
    m.leaf_words = (word >> kLeafWordsShift) & 1;
    m.label_count = static_cast<uint8_t>((word >> kLabelCountShift) & kLabelCountMask);
    m.depth = static_cast<uint16_t>((word >> kDepthShift) & kDepthMask);
    m.blocked = (word >> kBlockedShift) & 1;
    m.provisional = (word >> kProvisionalShift) & 1;
    m.tables_ready = (word >> kTablesReadyShift) & 1;
    m.generation = static_cast<uint32_t>((word >> kGenerationShift) & kGenerationMask);
    m.stackless = (word >> kStacklessShift) & 1;
    m.same_stack = (word >> kSameStackShift) & 1;
    m.unsuspended = (word >> kUnsuspendedShift) & 1;
    return m;
  }
  constexpr bool operator==(const RecordMeta&) const = default;
};

// Every field survives the round trip, and no two share a bit.
static_assert([] {
  RecordMeta all;
  all.provider = 0xff;
  all.truncated = all.leaf_words = all.blocked = all.provisional = true;
  all.tables_ready = all.stackless = all.same_stack = all.unsuspended = true;
  all.label_count = RecordMeta::kLabelCountMask;
  all.depth = 0xffff;
  all.generation = RecordMeta::kGenerationMask;
  return RecordMeta::Decode(all.Encode()) == all && all.Encode() == ~uint64_t{0};
}());
static_assert(RecordMeta::kGenerationShift + 26 == RecordMeta::kStacklessShift);
static_assert(RecordMeta::kStacklessShift + 1 == RecordMeta::kSameStackShift);

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_SAMPLE_RECORD_H_
