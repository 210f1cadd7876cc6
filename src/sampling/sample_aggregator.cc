#include "inprof/sample_aggregator.h"

#include "inprof/base/growth_safe_table.h"
#include "inprof/internal/label_table.h"

#include <algorithm>
#include <utility>

namespace inprof {

SampleAggregator::SampleAggregator(std::vector<ValueType> sample_types)
    : sample_types_(std::move(sample_types)) {}

// Each step that may throw (std::bad_alloc: the heap exhausted) comes
// before the tables change, so that one that throws leaves them as they were.
uint32_t SampleAggregator::AddThread(int64_t tid, absl::string_view name) {
  std::string copy(name);
  if (!reusable_.empty()) {
    const uint32_t index = reusable_.back();
    if (mirror_ != nullptr) mirror_threads_[index] = mirror_->AddThread(tid, name);
    reusable_.pop_back();
    threads_[index] = {tid, std::move(copy)};
    if (forwarder_ != nullptr) forwarder_->ForwardThread(index, tid, name);
    return index;
  }
  if (threads_.size() == threads_.capacity()) threads_.reserve(2 * threads_.size() + 16);
  if (mirror_ != nullptr) {
    if (mirror_threads_.size() == mirror_threads_.capacity()) {
      mirror_threads_.reserve(2 * mirror_threads_.size() + 16);
    }
    mirror_threads_.push_back(mirror_->AddThread(tid, name));
  }
  threads_.push_back({tid, std::move(copy)});
  const auto index = static_cast<uint32_t>(threads_.size() - 1);
  if (forwarder_ != nullptr) forwarder_->ForwardThread(index, tid, name);
  return index;
}

void SampleAggregator::SetThreadName(uint32_t thread, absl::string_view name) {
  if (thread >= threads_.size()) return;
  threads_[thread].name = std::string(name);
  if (mirror_ != nullptr) mirror_->SetThreadName(mirror_threads_[thread], name);
  if (forwarder_ != nullptr) forwarder_->ForwardThreadName(thread, name);
}

void SampleAggregator::RemoveThread(uint32_t thread) {
  if (thread >= threads_.size()) return;
  if (mirror_ != nullptr) mirror_->RemoveThread(mirror_threads_[thread]);
  if (forwarder_ != nullptr) {
    forwarder_->ForwardThreadRemoved(thread);
    reusable_.push_back(thread);  // no sample here refers to it
    return;
  }
  retired_.push_back(thread);
}

void SampleAggregator::SetForwarder(SampleForwarder* forwarder) {
  forwarder_ = forwarder;
  if (forwarder == nullptr) return;
  std::vector<bool> gone(threads_.size(), false);
  for (uint32_t i : reusable_) gone[i] = true;
  for (uint32_t i : retired_) gone[i] = true;
  for (uint32_t i = 0; i < threads_.size(); ++i) {
    if (!gone[i]) forwarder->ForwardThread(i, threads_[i].tid, threads_[i].name);
  }
}

void SampleAggregator::SetMirror(SampleAggregator* mirror) {
  mirror_ = mirror;
  mirror_threads_.clear();
  if (mirror == nullptr) return;
  // Every entry, alive or not: indices stay aligned, and an entry that is
  // retired or reusable gets no further samples anyway.
  mirror_threads_.reserve(threads_.size());
  for (const ThreadIdentity& t : threads_) {
    mirror_threads_.push_back(mirror->AddThread(t.tid, t.name));
  }
}

void SampleAggregator::SetStackLimits(size_t max_stacks, size_t max_frame_words,
                                      std::string overflow_frame) {
  max_stacks_ = max_stacks;
  max_frame_words_ = max_frame_words;
  overflow_frame_ = std::move(overflow_frame);
}

std::vector<int64_t>& SampleAggregator::Slot(const KeyView& key) {
  auto it = index_.find(key);
  if (it == index_.end() && !overflow_frame_.empty() &&
      (samples_.size() >= max_stacks_ ||
       key.frames.size() > max_frame_words_ - std::min(frame_words_, max_frame_words_)) &&
      key.synthetic != overflow_frame_) {
    // Over the limits: the thread's one overflow row (always admitted).
    ++stacks_refused_;
    return Slot({key.thread, {}, {}, overflow_frame_});
  }
  if (it == index_.end()) {
    // Everything the new row needs is made before anything changes (see
    // AddThread); the table's growth too (growth_safe_table.h).
    ProfileSample sample;
    sample.thread = key.thread;
    sample.frames.assign(key.frames.begin(), key.frames.end());
    sample.synthetic_frame = std::string(key.synthetic);
    sample.values.assign(sample_types_.size(), 0);
    // Decoded once per distinct key: new keys are rare next to Add()s.
    const internal::LabelTable& table =
        label_table_ != nullptr ? *label_table_ : internal::LabelTable::Global();
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
    Key stored{key.thread, sample.frames,
               std::vector<uint64_t>(key.labels.begin(), key.labels.end()),
               sample.synthetic_frame};
    internal::GrowthReserve reserve(index_);
    samples_.push_back(std::move(sample));
    it = index_.emplace(std::move(stored), samples_.size() - 1).first;  // cannot throw now
    frame_words_ += key.frames.size();
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
  if (forwarder_ != nullptr) {
    forwarder_->ForwardSample(thread, frames, label_words, value_offset, values);
    if (mirror_ != nullptr && !mirror_paused_ && thread < mirror_threads_.size()) {
      mirror_->Add(mirror_threads_[thread], frames, label_words, value_offset,
                   values);
    }
    return;
  }
  std::vector<int64_t>& totals = Slot({thread, frames, label_words, {}});
  for (size_t i = 0; i < values.size(); ++i) totals[value_offset + i] += values[i];
  if (mirror_ != nullptr && !mirror_paused_ && thread < mirror_threads_.size()) {
    mirror_->Add(mirror_threads_[thread], frames, label_words, value_offset,
                 values);
  }
}

void SampleAggregator::AddSynthetic(uint32_t thread, absl::string_view frame,
                                    size_t value_offset,
                                    std::span<const int64_t> values) {
  ++records_added_;
  if (value_offset + values.size() > sample_types_.size()) {
    ++values_rejected_;
    return;
  }
  if (forwarder_ != nullptr) {
    forwarder_->ForwardSynthetic(thread, frame, value_offset, values);
    if (mirror_ != nullptr && !mirror_paused_ && thread < mirror_threads_.size()) {
      mirror_->AddSynthetic(mirror_threads_[thread], frame, value_offset, values);
    }
    return;
  }
  std::vector<int64_t>& totals = Slot({thread, {}, {}, frame});
  for (size_t i = 0; i < values.size(); ++i) totals[value_offset + i] += values[i];
  if (mirror_ != nullptr && !mirror_paused_ && thread < mirror_threads_.size()) {
    mirror_->AddSynthetic(mirror_threads_[thread], frame, value_offset, values);
  }
}

ProfileData SampleAggregator::Take() {
  ProfileData data;
  data.sample_types = sample_types_;
  data.threads = threads_;
  data.samples = std::move(samples_);
  samples_.clear();
  index_.clear();
  frame_words_ = 0;
  // No sample refers to the retired threads any more.
  reusable_.insert(reusable_.end(), retired_.begin(), retired_.end());
  retired_.clear();
  return data;
}

}  // namespace inprof
