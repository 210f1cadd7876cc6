#include "inprof/internal/label_table.h"

#include "inprof/internal/fork_guard.h"

namespace inprof::internal {

namespace {
// Created at static initialisation, so that its lock joins the fork guard
// while no lock is held (internal/fork_guard.h).
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

uint32_t LabelTable::Intern(absl::string_view s) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = ids_.find(s);
  if (it != ids_.end()) return it->second;
  if (strings_.size() >= kMaxEntries) {
    ++overflows_;
    return kOverflowId;
  }
  const uint32_t id = static_cast<uint32_t>(strings_.size());
  strings_.emplace_back(s.data(), s.size());
  ids_.emplace(strings_.back(), id);
  return id;
}

std::string LabelTable::Lookup(uint32_t id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return id < strings_.size() ? strings_[id] : std::string();
}

size_t LabelTable::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return strings_.size();
}

uint64_t LabelTable::overflows() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return overflows_;
}

}  // namespace inprof::internal
