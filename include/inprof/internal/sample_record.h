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
// Encode() and Decode(), so a new bit is one field and one line each. Where
// each part lies is RecordLayout's to say, for every writer (the handler,
// its stackless and re-used records, the collector's blocked-stack reads,
// the Windows sampler) and reader (RecordView: the collector, the agent,
// the Windows collector): the offsets are computed here only.
//
// Example:
//   RecordMeta meta;
//   meta.provider = 1;
//   meta.depth = 12;
//   const RecordLayout at{.values = 2, .labels = 1, .depth = 12};
//   record[0] = meta.Encode();
//   record[at.value(0)] = ...;            // values, then labels, then frames
//   ...
//   const RecordView view = RecordView::Read(record, at.size(), value_counts, 0);
//   if (view.ok()) use(view.meta, view.values(), view.labels(), view.frames());
#ifndef INPROF_INTERNAL_SAMPLE_RECORD_H_
#define INPROF_INTERNAL_SAMPLE_RECORD_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "inprof/spsc_ring.h"

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

// Where each part of a record lies: [meta][values][leaf words][labels]
// [frames], from how many of each there are. Constant expressions only:
// the signal handler uses it.
struct RecordLayout {
  size_t values = 0;      // the provider's value count
  size_t leaf_words = 0;  // the unwinder's leaf stack words (0: none)
  size_t labels = 0;      // labels, two words each
  size_t depth = 0;       // frames

  static constexpr size_t kMetaAt = 0;
  constexpr size_t value(size_t i) const { return 1 + i; }
  constexpr size_t leaf_at() const { return 1 + values; }
  constexpr size_t labels_at() const { return leaf_at() + leaf_words; }
  // Where the frames begin: the header's length.
  constexpr size_t frames_at() const { return labels_at() + 2 * labels; }
  constexpr size_t size() const { return frames_at() + depth; }
};

// The writer's half of the codec, for every writer (the signal handler,
// its stackless and swallowed samples, the wall sampler's stack reads, the
// Windows sampler): `meta`, its counts taken from `at`, and `values` (at.values
// of them) into the header of `record`; the leaf words, labels and frames
// go where `at` says, before or after. Returns the record's length.
// Async-signal-safe.
template <typename Value>
constexpr size_t WriteRecordHeader(uint64_t* record, const RecordLayout& at, RecordMeta meta,
                                   const Value* values) {
  meta.leaf_words = at.leaf_words > 0;
  meta.label_count = static_cast<uint8_t>(at.labels);
  meta.depth = static_cast<uint16_t>(at.depth);
  record[RecordLayout::kMetaAt] = meta.Encode();
  for (size_t i = 0; i < at.values; ++i) record[at.value(i)] = static_cast<uint64_t>(values[i]);
  return at.size();
}

// A record read back: its meta, and each part, checked against the words
// there are. `value_counts[p]` is provider p's value count and
// `leaf_words` the unwinder's (the meta says whether they are there).
struct RecordView {
  RecordMeta meta;
  RecordLayout layout;
  const uint64_t* words = nullptr;
  bool valid = false;  // the provider is known and the words hold every part

  bool ok() const { return valid; }
  std::span<const uint64_t> values() const {
    return {words + layout.value(0), layout.values};
  }
  std::span<const uint64_t> leaf() const { return {words + layout.leaf_at(), layout.leaf_words}; }
  std::span<const uint64_t> labels() const {
    return {words + layout.labels_at(), 2 * layout.labels};
  }
  std::span<const uint64_t> frames() const { return {words + layout.frames_at(), layout.depth}; }

  static RecordView Read(const uint64_t* record, size_t n,
                         std::span<const size_t> value_counts, size_t leaf_words) {
    RecordView view;
    if (n < 1) return view;
    view.words = record;
    view.meta = RecordMeta::Decode(record[0]);
    if (view.meta.provider >= value_counts.size()) return view;
    view.layout.values = value_counts[view.meta.provider];
    view.layout.leaf_words = view.meta.leaf_words ? leaf_words : 0;
    view.layout.labels = view.meta.label_count;
    view.layout.depth = view.meta.depth;
    view.valid = view.layout.size() <= n;
    return view;
  }
};

// The shape of a profiler's records and rings, for a reader in another
// process (`inprof agent` reads the rings of a process that died: its
// threads' rings can live in memory it shares).
inline constexpr size_t kMaxRingProviders = 16;
struct ThreadRingLayout {
  uint32_t ring_bytes = 0;  // sizeof the ring object
  uint32_t ring_words = 0;
  uint32_t leaf_words = 0;
  uint32_t state_label_providers = 0;
  std::vector<uint32_t> value_counts;   // per provider
  std::vector<uint32_t> value_offsets;  // per provider
};

// The layout of a Profiler whose ring is R and whose record layout is L
// (internal/profiler_layout.h: kLeafWords, kNumProviders, kValueCounts,
// kValueOffsets, kStateLabelProvider); null when R is not an
// SpscRecordRing or it has more than kMaxRingProviders providers.
template <typename L, typename R>
const ThreadRingLayout* ThreadRingLayoutOf() {
  if constexpr (kIsSpscRecordRing<R>) {
    static const ThreadRingLayout layout = [] {
      ThreadRingLayout l;
      l.ring_bytes = static_cast<uint32_t>(sizeof(R));
      l.ring_words = static_cast<uint32_t>(R::capacity_words());
      l.leaf_words = static_cast<uint32_t>(L::kLeafWords);
      for (size_t i = 0; i < L::kNumProviders; ++i) {
        l.value_counts.push_back(static_cast<uint32_t>(L::kValueCounts[i]));
        l.value_offsets.push_back(static_cast<uint32_t>(L::kValueOffsets[i]));
        if (L::kStateLabelProvider[i]) l.state_label_providers |= 1u << i;
      }
      return l;
    }();
    return L::kNumProviders <= kMaxRingProviders ? &layout : nullptr;
  } else {
    return nullptr;
  }
}

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_SAMPLE_RECORD_H_
