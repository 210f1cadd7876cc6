// internal: not part of the public API.
//
// The layout of one sample record in a thread's ring, as the signal handler
// writes it (profiler.h) and as two readers decode it: the profiler's
// collector, and `inprof agent`, which reads the threads' rings of a
// library-mode process that died before its collector drained them
// (agent_stream.h: AgentThreadArea).
//
//   [meta][values...][leaf stack words...][label words...][frames...]
//
// meta = provider | truncated << 8 | has leaf words << 9 |
//        label count << 10 (6 bits) | depth << 16 (16 bits) |
//        sampled while blocked << 32 | provisional stack << 33 |
//        (a provisional blocked stack's) tables ready at the walk << 34 |
//        their generation then << 35 (28 bits) |
//        no stack << 63 (the thread was on a stack too small for the walk:
//        a sigaltstack, a coroutine's; values only, depth 0).
//
// The number of values is the provider's (its sample types), the leaf words
// the unwinder's (CopiesLeafStack), the label words two per label: a key
// and a value, label-table ids (internal/label_table.h).
#ifndef INPROF_INTERNAL_SAMPLE_RECORD_H_
#define INPROF_INTERNAL_SAMPLE_RECORD_H_

#include <cstdint>

namespace inprof::internal {

inline constexpr uint64_t kRecordProviderMask = 0xff;
inline constexpr uint64_t kRecordTruncatedBit = 1u << 8;
inline constexpr uint64_t kRecordLeafWordsBit = 1u << 9;
inline constexpr int kRecordLabelCountShift = 10;
inline constexpr uint64_t kRecordLabelCountMask = 0x3f;
inline constexpr int kRecordDepthShift = 16;
inline constexpr uint64_t kRecordDepthMask = 0xffff;
inline constexpr uint64_t kRecordBlockedBit = uint64_t{1} << 32;
inline constexpr uint64_t kRecordProvisionalBit = uint64_t{1} << 33;
inline constexpr uint64_t kRecordWalkTablesReadyBit = uint64_t{1} << 34;
inline constexpr int kRecordWalkGenerationShift = 35;
inline constexpr uint64_t kRecordWalkGenerationMask = (uint64_t{1} << 28) - 1;
inline constexpr uint64_t kRecordStacklessBit = uint64_t{1} << 63;

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_SAMPLE_RECORD_H_
