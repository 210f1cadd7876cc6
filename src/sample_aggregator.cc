#include "inprof/sample_aggregator.h"

#include <algorithm>
#include <utility>

namespace inprof {

SampleAggregator::SampleAggregator(std::vector<ValueType> sample_types)
    : sample_types_(std::move(sample_types)) {}

uint32_t SampleAggregator::AddThread(int64_t tid, absl::string_view name) {
  threads_.push_back({tid, std::string(name)});
  return static_cast<uint32_t>(threads_.size() - 1);
}

std::vector<int64_t>& SampleAggregator::Slot(const KeyView& key) {
  auto it = index_.find(key);
  if (it == index_.end()) {
    ProfileSample sample;
    sample.thread = key.thread;
    sample.frames.assign(key.frames.begin(), key.frames.end());
    sample.synthetic_frame = std::string(key.synthetic);
    sample.values.assign(sample_types_.size(), 0);
    samples_.push_back(std::move(sample));
    it = index_
             .emplace(Key{key.thread, samples_.back().frames,
                          samples_.back().synthetic_frame},
                      samples_.size() - 1)
             .first;
  }
  return samples_[it->second].values;
}

void SampleAggregator::Add(uint32_t thread, std::span<const uint64_t> frames,
                           size_t value_offset,
                           std::span<const int64_t> values) {
  ++records_added_;
  if (value_offset + values.size() > sample_types_.size()) {
    ++values_rejected_;
    return;
  }
  std::vector<int64_t>& totals = Slot({thread, frames, {}});
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
  std::vector<int64_t>& totals = Slot({thread, {}, frame});
  for (size_t i = 0; i < values.size(); ++i) totals[value_offset + i] += values[i];
}

ProfileData SampleAggregator::Take() {
  ProfileData data;
  data.sample_types = sample_types_;
  data.threads = threads_;
  data.samples = std::move(samples_);
  samples_.clear();
  index_.clear();
  return data;
}

}  // namespace inprof
