#include "inprof/internal/label_table.h"

#include <algorithm>
#include <new>
#include <string>
#include <utility>

#include "inprof/base/alloc_guard.h"
#include "inprof/base/fork_guard.h"

namespace inprof::internal {

namespace {
// Created at static initialisation, so that its lock joins the fork guard
// while no lock is held (base/fork_guard.h).
[[maybe_unused]] const bool g_label_table_created = (LabelTable::Global(), true);
}  // namespace

LabelTable& LabelTable::Global() {
  static LabelTable* table = new LabelTable;  // outlives every profiler
  return *table;
}

LabelTable::LabelTable() {
  strings_.emplace_back("[inprof: label table full]");
  RegisterForkLock(&mutex_, kForkRankGlobal);  // a forked child may Intern
}

LabelTable::LabelTable(size_t max_entries, size_t max_bytes, std::string overflow_text)
    : max_entries_(std::min(max_entries, kMaxEntries)), max_bytes_(max_bytes) {
  strings_.push_back(std::move(overflow_text));
}

uint32_t LabelTable::Intern(absl::string_view s) {
  // Its allocations are never sampled: a sampled one would take the
  // allocation provider's table lock under this one, and the collector
  // takes them the other way round when it aggregates.
  AllocGuard guard;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = ids_.find(s);
  if (it != ids_.end()) return it->second;
  if (strings_.size() >= max_entries_ || s.size() > max_bytes_ - bytes_) {
    ++overflows_;
    return kOverflowId;
  }
  // Each allocation before the tables change (growth_safe_table.h): with
  // the heap exhausted the string reads as the overflow's, and the table
  // is as it was.
  const uint32_t id = static_cast<uint32_t>(strings_.size());
  try {
    std::string key(s.data(), s.size());
    std::string text(s.data(), s.size());
    internal::GrowthReserve reserve(ids_);
    strings_.push_back(std::move(text));
    ids_.emplace(std::move(key), id);
  } catch (const std::bad_alloc&) {
    ++overflows_;
    return kOverflowId;
  }
  bytes_ += s.size();
  return id;
}

std::string LabelTable::Lookup(uint32_t id) const {
  AllocGuard guard;  // the copy, under the lock: as in Intern
  std::lock_guard<std::mutex> lock(mutex_);
  return id < strings_.size() ? strings_[id] : std::string();
}

size_t LabelTable::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return strings_.size();
}

size_t LabelTable::bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_;
}

uint64_t LabelTable::overflows() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return overflows_;
}

size_t CanonicalLabelWords(std::span<const uint64_t> words, bool with_state,
                           uint64_t state_key, uint64_t state_value, uint64_t* out) {
  size_t n = 0;
  auto put = [&](uint64_t key, uint64_t value) {
    const uint64_t key_id = key & ~kNumericLabel;
    for (size_t i = 0; i < n; i += 2) {
      if ((out[i] & ~kNumericLabel) == key_id) {
        out[i] = key;
        out[i + 1] = value;
        return;
      }
    }
    out[n] = key;
    out[n + 1] = value;
    n += 2;
  };
  for (size_t i = 0; i + 1 < words.size(); i += 2) put(words[i], words[i + 1]);
  if (with_state) put(state_key, state_value);
  // Insertion sort by key: at most 17 pairs.
  for (size_t i = 2; i < n; i += 2) {
    for (size_t j = i; j >= 2 && out[j - 2] > out[j]; j -= 2) {
      std::swap(out[j - 2], out[j]);
      std::swap(out[j - 1], out[j + 1]);
    }
  }
  return n;
}

}  // namespace inprof::internal
