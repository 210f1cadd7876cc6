#include "inprof/alloc/live_peak.h"

#include <sys/mman.h>

#include <cmath>

#include "inprof/base/fork_guard.h"

namespace inprof::internal {
namespace {

// As LiveHeapTable's counters round an entry's bytes.
int64_t EntryBytes(uint64_t size, double weight_objects) {
  const double bytes = static_cast<double>(size) * weight_objects;
  return bytes >= 4.6e18 ? int64_t{1} << 62 : static_cast<int64_t>(bytes + 0.5);
}

int64_t EntryObjects(double weight_objects) {
  const double scaled = weight_objects * LivePeak::kObjectScale;
  return scaled >= 4.6e18 ? int64_t{1} << 62 : static_cast<int64_t>(scaled + 0.5);
}

}  // namespace

LivePeak::LivePeak(size_t max_tags) : max_tags_(max_tags) {
  const size_t bytes = max_tags * (sizeof(Cell) + sizeof(uint32_t));
  if (bytes > 0) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) {
      mapping_ = p;
      mapping_bytes_ = bytes;
      cells_ = static_cast<Cell*>(p);
      changed_ = reinterpret_cast<uint32_t*>(cells_ + max_tags);
    }
  }
  if (cells_ == nullptr) max_tags_ = 0;  // every tag untracked, counted
  RegisterForkLock(&mutex_, kForkRankLeaf);
}

LivePeak::~LivePeak() {
  UnregisterForkLock(&mutex_);
  if (mapping_ != nullptr) munmap(mapping_, mapping_bytes_);
}

void LivePeak::ChangeLocked(uint64_t tag, int64_t bytes, int64_t objects) noexcept {
  Cell& cell = cells_[tag];
  cell.live_bytes += bytes;
  cell.live_objects += objects;
  if (cell.changed == 0) {
    cell.changed = 1;
    changed_[changed_count_++] = static_cast<uint32_t>(tag);
  }
  if (tag >= tags_seen_) tags_seen_ = tag + 1;
  live_total_ += bytes;
  ++stats_.events;
}

void LivePeak::CopyLocked() noexcept {
  for (size_t i = 0; i < changed_count_; ++i) {
    Cell& cell = cells_[changed_[i]];
    cell.peak_bytes = cell.live_bytes;
    cell.peak_objects = cell.live_objects;
    cell.changed = 0;
  }
  stats_.tags_copied += changed_count_;
  ++stats_.copies;
  changed_count_ = 0;
  copy_owed_ = false;
}

void LivePeak::Add(uint64_t tag, uint64_t size, double weight_objects) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (tag >= max_tags_) {
    ++stats_.untracked;
    return;
  }
  ChangeLocked(tag, EntryBytes(size, weight_objects), EntryObjects(weight_objects));
  if (live_total_ > peak_total_) {
    peak_total_ = live_total_;
    copy_owed_ = true;
  }
}

void LivePeak::Remove(uint64_t tag, uint64_t size, double weight_objects) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (tag >= max_tags_) {
    ++stats_.untracked;
    return;
  }
  // The first step down from a new high: the live sums are the peak's.
  if (copy_owed_) CopyLocked();
  ChangeLocked(tag, -EntryBytes(size, weight_objects), -EntryObjects(weight_objects));
}

void LivePeak::StartWindow() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  peak_total_ = live_total_;
  copy_owed_ = true;
}

void LivePeak::ForEachPeak(
    absl::FunctionRef<void(uint64_t tag, double objects, double bytes)> visit) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (copy_owed_) CopyLocked();
  for (size_t tag = 0; tag < tags_seen_; ++tag) {
    const Cell& cell = cells_[tag];
    if (cell.peak_bytes == 0 && cell.peak_objects == 0) continue;
    visit(tag, static_cast<double>(cell.peak_objects) / kObjectScale,
          static_cast<double>(cell.peak_bytes));
  }
}

LivePeak::Stats LivePeak::stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  Stats s = stats_;
  s.live_bytes = live_total_ > 0 ? static_cast<uint64_t>(live_total_) : 0;
  s.peak_bytes = peak_total_ > 0 ? static_cast<uint64_t>(peak_total_) : 0;
  return s;
}

}  // namespace inprof::internal
