// inprof/sample_aggregator.h: sums samples by thread and stack.
//
// The collector thread feeds every record it drains from the threads' rings
// into one SampleAggregator; the exporter takes the totals out as a
// ProfileData. Each distinct (thread, stack) is stored once with one value
// per sample type; adding a known stack allocates nothing.
//
// Thread-safety: not thread-safe; the profiler guards it with a mutex. Never
// used from a signal handler.
//
// Example:
//   inprof::SampleAggregator agg({{"cpu-samples", "count"},
//                                 {"cpu-time", "nanoseconds"}});
//   uint32_t t = agg.AddThread(gettid(), "main");
//   int64_t v[] = {1, 10'000'000};
//   agg.Add(t, frames, /*value_offset=*/0, v);
//   inprof::ProfileData data = agg.Take();
#ifndef INPROF_SAMPLE_AGGREGATOR_H_
#define INPROF_SAMPLE_AGGREGATOR_H_

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "inprof/base/growth_safe_table.h"
#include "absl/hash/hash.h"
#include "absl/types/span.h"
#include "inprof/profile_data.h"

namespace inprof {
namespace internal {
class LabelTable;
}  // namespace internal

// Where a forwarding aggregator sends what it is given instead of summing
// it (library mode: internal/agent_link.h forwards to `inprof agent`).
// Called with the aggregator's lock held; must not block.
class SampleForwarder {
 public:
  virtual void ForwardThread(uint32_t index, int64_t tid,
                             absl::string_view name) = 0;
  virtual void ForwardThreadName(uint32_t index, absl::string_view name) = 0;
  virtual void ForwardThreadRemoved(uint32_t index) = 0;
  virtual void ForwardSample(uint32_t thread, std::span<const uint64_t> frames,
                             std::span<const uint64_t> label_words,
                             size_t value_offset,
                             std::span<const int64_t> values) = 0;
  virtual void ForwardSynthetic(uint32_t thread, absl::string_view frame,
                                size_t value_offset,
                                std::span<const int64_t> values) = 0;

 protected:
  ~SampleForwarder() = default;
};

class SampleAggregator {
 public:
  explicit SampleAggregator(std::vector<ValueType> sample_types);

  // Registers a thread identity; returns its index for Add().
  uint32_t AddThread(int64_t tid, absl::string_view name);

  // The thread took a new name (pthread_setname_np): the whole window's
  // samples of `thread` carry it.
  void SetThreadName(uint32_t thread, absl::string_view name);

  // The thread is gone: its index may be handed out again by AddThread()
  // once the samples it has now were taken out (after the next Take()), so
  // the thread table stays as large as the threads alive in one window,
  // however many come and go over the process's life.
  void RemoveThread(uint32_t thread);
  // Entries in the thread table (alive, retired, reusable).
  size_t thread_table_size() const { return threads_.size(); }

  // Adds `values` to the stack's totals at positions [value_offset,
  // value_offset + values.size()) of the sample-type vector. Values that do
  // not fit the sample types (a caller bug) are ignored and counted in
  // values_rejected().
  void Add(uint32_t thread, std::span<const uint64_t> frames,
           size_t value_offset, std::span<const int64_t> values) {
    Add(thread, frames, {}, value_offset, values);
  }

  // Same, for a sample carrying labels: pairs of words as the signal
  // handler copies them (internal/label_table.h), in a canonical order
  // (sorted by key, one per key) so equal label sets aggregate together.
  void Add(uint32_t thread, std::span<const uint64_t> frames,
           std::span<const uint64_t> label_words, size_t value_offset,
           std::span<const int64_t> values);

  // Same for a frame that names itself (e.g. "[dropped: ring full]").
  void AddSynthetic(uint32_t thread, absl::string_view frame,
                    size_t value_offset, std::span<const int64_t> values);

  // Distinct stacks held now.
  size_t num_stacks() const { return samples_.size(); }

  // The table the label words' ids are looked up in when a stack is first
  // seen (nullptr: LabelTable::Global(), the process's). Not owned; it
  // must outlive its use. `inprof agent` gives each process its own.
  void SetLabelTable(const internal::LabelTable* table) { label_table_ = table; }
  const internal::LabelTable* label_table() const { return label_table_; }
  // At most `max_stacks` distinct stacks, of `max_frame_words` frames in
  // all, between two Take()s: a sample of a new stack beyond either adds
  // its values to its thread's `overflow_frame` instead, counted in
  // stacks_refused() (never reset). Default: no limit (a process's own
  // stacks are bounded by its code); the agent limits each process it
  // serves.
  void SetStackLimits(size_t max_stacks, size_t max_frame_words, std::string overflow_frame);
  uint64_t stacks_refused() const { return stacks_refused_; }
  // Add()/AddSynthetic() calls since construction.
  uint64_t records_added() const { return records_added_; }
  uint64_t values_rejected() const { return values_rejected_; }

  // Moves the totals out (samples and the thread table) and starts empty;
  // indices of threads not removed stay valid.
  ProfileData Take();

  const std::vector<ValueType>& sample_types() const { return sample_types_; }

  // From now on, everything added here is also added to `mirror` (same
  // sample types; its own thread table, which gets this one's threads now
  // and as they come); nullptr stops. The live endpoint's windows are cut
  // from a mirror, independently of the exporter's Take()s. Not owned; it
  // must outlive its use.
  void SetMirror(SampleAggregator* mirror);
  // While paused, what is added does not go to the mirror: rows that are
  // not samples (library mode's state rows, Pipeline::Locked::
  // LiveStateAtAttachments). The mirror stays set.
  void PauseMirror(bool paused) { mirror_paused_ = paused; }

  // From now on samples go to `forwarder` instead of being summed here
  // (nullptr: summed here again). The thread table is still kept, and
  // forwarded: the threads known now at once, later ones as they come. While
  // forwarding, a removed thread's index is reusable at once (no Take()
  // waits for its samples). Not owned; it must outlive its use.
  void SetForwarder(SampleForwarder* forwarder);
  bool forwarding() const { return forwarder_ != nullptr; }

 private:
  struct KeyView {
    uint32_t thread;
    std::span<const uint64_t> frames;
    std::span<const uint64_t> labels;
    absl::string_view synthetic;
  };
  struct Key {
    uint32_t thread;
    std::vector<uint64_t> frames;
    std::vector<uint64_t> labels;
    std::string synthetic;
  };
  struct KeyHash {
    using is_transparent = void;
    size_t operator()(const KeyView& k) const {
      return absl::HashOf(k.thread,
                          absl::MakeSpan(k.frames.data(), k.frames.size()),
                          absl::MakeSpan(k.labels.data(), k.labels.size()),
                          k.synthetic);
    }
    size_t operator()(const Key& k) const {
      return (*this)(KeyView{k.thread, k.frames, k.labels, k.synthetic});
    }
  };
  struct KeyEq {
    using is_transparent = void;
    static KeyView View(const Key& k) {
      return {k.thread, k.frames, k.labels, k.synthetic};
    }
    static KeyView View(const KeyView& k) { return k; }
    template <typename A, typename B>
    bool operator()(const A& a, const B& b) const {
      const KeyView x = View(a), y = View(b);
      return x.thread == y.thread && x.synthetic == y.synthetic &&
             std::equal(x.frames.begin(), x.frames.end(), y.frames.begin(),
                        y.frames.end()) &&
             std::equal(x.labels.begin(), x.labels.end(), y.labels.begin(),
                        y.labels.end());
    }
  };

  std::vector<int64_t>& Slot(const KeyView& key);

  std::vector<ValueType> sample_types_;
  std::vector<ThreadIdentity> threads_;
  std::vector<uint32_t> retired_;   // removed; samples not yet taken out
  std::vector<uint32_t> reusable_;  // removed before the last Take()
  std::vector<ProfileSample> samples_;
  // Grows with the heap exhausted too (growth_safe_table.h).
  internal::GrowthSafeMap<Key, size_t, KeyHash, KeyEq> index_;
  uint64_t records_added_ = 0;
  uint64_t values_rejected_ = 0;
  const internal::LabelTable* label_table_ = nullptr;  // null: Global()
  size_t max_stacks_ = SIZE_MAX;
  size_t max_frame_words_ = SIZE_MAX;
  size_t frame_words_ = 0;  // in samples_
  std::string overflow_frame_;
  uint64_t stacks_refused_ = 0;
  SampleAggregator* mirror_ = nullptr;
  bool mirror_paused_ = false;
  SampleForwarder* forwarder_ = nullptr;
  std::vector<uint32_t> mirror_threads_;  // this table's index -> mirror's
};

}  // namespace inprof

#endif  // INPROF_SAMPLE_AGGREGATOR_H_
