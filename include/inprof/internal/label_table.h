// internal: not part of the public API.
//
// Interns label keys and string values into small ids, so a thread's label
// set is a few words the signal handler can copy without locks or
// allocation. Never shrinks; capped at kMaxEntries (further strings map to
// kOverflowId, counted) so that high-cardinality string labels cannot grow
// memory without bound. Thread-safe (mutex); never used in a signal handler.
#ifndef INPROF_INTERNAL_LABEL_TABLE_H_
#define INPROF_INTERNAL_LABEL_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <span>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"

namespace inprof::internal {

class LabelTable {
 public:
  // 64 Ki strings; measured cost of an interned lookup is in
  // bench/labels_benchmark.cc.
  static constexpr size_t kMaxEntries = size_t{1} << 16;
  static constexpr uint32_t kOverflowId = 0;  // "[inprof: label table full]"

  static LabelTable& Global();

  uint32_t Intern(absl::string_view s);
  std::string Lookup(uint32_t id) const;
  size_t size() const;
  uint64_t overflows() const;

 private:
  LabelTable();
  mutable std::mutex mutex_;
  absl::flat_hash_map<std::string, uint32_t> ids_;
  std::deque<std::string> strings_;
  uint64_t overflows_ = 0;
};

// One label as the handler copies it: two words.
//   key word:   interned key id | kNumericLabel if the value is a number
//   value word: interned string id, or the number
inline constexpr uint64_t kNumericLabel = uint64_t{1} << 32;

// Canonical label words for the aggregate: one entry per key (the innermost
// scope wins: later pairs of `words` replace earlier ones), plus
// (`state_key`, `state_value`) when `with_state`, sorted by key. Returns the
// number of words written to `out`, which has room for words.size() + 2.
// The label wall samples carry: kThreadState = kThreadRunning or
// kThreadBlocked (WallTimeProvider::kStateLabel and its values).
inline constexpr const char* kThreadState = "thread state";
inline constexpr const char* kThreadRunning = "running";
inline constexpr const char* kThreadBlocked = "blocked";

size_t CanonicalLabelWords(std::span<const uint64_t> words, bool with_state,
                           uint64_t state_key, uint64_t state_value, uint64_t* out);

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_LABEL_TABLE_H_
