// internal: not part of the public API.
//
// Interns label keys and string values into small ids, so a thread's label
// set is a few words the signal handler can copy without locks or
// allocation. Never shrinks; capped at kMaxEntries (further strings map to
// kOverflowId, counted) so that high-cardinality string labels cannot grow
// memory without bound. Thread-safe (mutex); never used in a signal handler.
//
// Global() is the process's own table. `inprof agent` gives each process
// it serves a table of its own, with a quota of strings and bytes, freed
// when that process's session ends (agent_session.h): one process's labels
// can neither fill nor grow a table another process's labels need.
#ifndef INPROF_INTERNAL_LABEL_TABLE_H_
#define INPROF_INTERNAL_LABEL_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <span>
#include <string>

#include "absl/strings/string_view.h"
#include "inprof/base/growth_safe_table.h"

namespace inprof::internal {

class LabelTable {
 public:
  // 64 Ki strings; measured cost of an interned lookup is in
  // bench/labels_benchmark.cc.
  static constexpr size_t kMaxEntries = size_t{1} << 16;
  static constexpr uint32_t kOverflowId = 0;  // "[inprof: label table full]"

  static LabelTable& Global();

  // A table of its own (not the process's): at most `max_entries` strings
  // (kOverflowId's included) of at most `max_bytes` in all; a string over
  // either, or one met with the heap exhausted (Intern never throws: a
  // ScopedLabels on the host's thread calls it), reads `overflow_text`,
  // counted in overflows(). Not joined to the
  // fork guard: for tables no forked child uses (the agent's).
  LabelTable(size_t max_entries, size_t max_bytes, std::string overflow_text);

  uint32_t Intern(absl::string_view s);
  std::string Lookup(uint32_t id) const;
  size_t size() const;
  // The strings' bytes held (kOverflowId's text not counted).
  size_t bytes() const;
  uint64_t overflows() const;

 private:
  LabelTable();
  const size_t max_entries_ = kMaxEntries;
  const size_t max_bytes_ = SIZE_MAX;
  size_t bytes_ = 0;
  mutable std::mutex mutex_;
  GrowthSafeMap<std::string, uint32_t> ids_;  // growth_safe_table.h
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
