#include "inprof/sample_aggregator.h"

#include "inprof/internal/label_table.h"

#include <algorithm>
#include <utility>

namespace inprof {

SampleAggregator::SampleAggregator(std::vector<ValueType> sample_types)
    : sample_types_(std::move(sample_types)) {}

uint32_t SampleAggregator::AddThread(int64_t tid, absl::string_view name) {
  if (!reusable_.empty()) {
    const uint32_t index = reusable_.back();
    reusable_.pop_back();
    threads_[index] = {tid, std::string(name)};
    return index;
  }
  threads_.push_back({tid, std::string(name)});
  return static_cast<uint32_t>(threads_.size() - 1);
}

void SampleAggregator::SetThreadName(uint32_t thread, absl::string_view name) {
  if (thread < threads_.size()) threads_[thread].name = std::string(name);
}

void SampleAggregator::RemoveThread(uint32_t thread) {
  if (thread < threads_.size()) retired_.push_back(thread);
}

std::vector<int64_t>& SampleAggregator::Slot(const KeyView& key) {
  auto it = index_.find(key);
  if (it == index_.end()) {
    ProfileSample sample;
    sample.thread = key.thread;
    sample.frames.assign(key.frames.begin(), key.frames.end());
    sample.synthetic_frame = std::string(key.synthetic);
    sample.values.assign(sample_types_.size(), 0);
    // Decoded once per distinct key: new keys are rare next to Add()s.
    const internal::LabelTable& table = internal::LabelTable::Global();
    for (size_t i = 0; i + 1 < key.labels.size(); i += 2) {
      SampleLabel label;
      label.key = table.Lookup(static_cast<uint32_t>(key.labels[i]));
      label.numeric = (key.labels[i] & internal::kNumericLabel) != 0;
      if (label.numeric) {
        label.num = static_cast<int64_t>(key.labels[i + 1]);
      } else {
        label.str = table.Lookup(static_cast<uint32_t>(key.labels[i + 1]));
      }
      sample.labels.push_back(std::move(label));
    }
    samples_.push_back(std::move(sample));
    it = index_
             .emplace(Key{key.thread, samples_.back().frames,
                          std::vector<uint64_t>(key.labels.begin(),
                                                key.labels.end()),
                          samples_.back().synthetic_frame},
                      samples_.size() - 1)
             .first;
  }
  return samples_[it->second].values;
}

void SampleAggregator::Add(uint32_t thread, std::span<const uint64_t> frames,
                           std::span<const uint64_t> label_words,
                           size_t value_offset,
                           std::span<const int64_t> values) {
  ++records_added_;
  if (value_offset + values.size() > sample_types_.size()) {
    ++values_rejected_;
    return;
  }
  std::vector<int64_t>& totals = Slot({thread, frames, label_words, {}});
  for (size_t i = 0; i < values.size(); ++i) totals[value_offset + i] += values[i];
}

void SampleAggregator::AddSynthetic(uint32_t thread, absl::string_view frame,
                                    size_t value_offset,
                                    std::span<const int64_t> values) {
  ++records_added_;
  if (value_offset + values.size() > sample_types_.size()) {
    ++values_rejected_;
    return;
  }
  std::vector<int64_t>& totals = Slot({thread, {}, {}, frame});
  for (size_t i = 0; i < values.size(); ++i) totals[value_offset + i] += values[i];
}

ProfileData SampleAggregator::Take() {
  ProfileData data;
  data.sample_types = sample_types_;
  data.threads = threads_;
  data.samples = std::move(samples_);
  samples_.clear();
  index_.clear();
  // No sample refers to the retired threads any more.
  reusable_.insert(reusable_.end(), retired_.begin(), retired_.end());
  retired_.clear();
  return data;
}

}  // namespace inprof
