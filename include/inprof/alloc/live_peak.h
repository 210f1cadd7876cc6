// internal: not part of the public API.
//
// LivePeak: the sampled live heap as it stood at its high-water mark, per
// tag (the allocation provider's stack id), for the peak_inuse_* sample
// types. LiveHeapTable tells it every entry it gains and loses (Add,
// Remove); it keeps each tag's live sums now and as they were at the
// highest live total since StartWindow.
//
// Exact, and O(1) amortized per sampled event, with no walk of the live
// table: the peak sums equal the live sums for every tag not changed since
// the last copy, and the changed tags are kept in a list. When the live
// total passes its mark the copy is owed, and the first Remove after that
// (the first step down from the new high) makes it: the changed tags' sums
// become their peak sums, the list empties. Each copied tag was put on the
// list by an event since the previous copy, so the copies cost at most one
// step per event in all. A heap that only grows owes its copy until it is
// read (ForEachPeak settles it).
//
// Sums are integers (bytes rounded as LiveHeapTable's counters round them,
// objects in 1/65,536ths), so that a tag whose blocks are all freed is
// exactly zero again.
//
// Memory: 40 bytes a tag, `max_tags` of them, mapped at construction (zero
// pages until used: 2.6 MiB for the allocation provider's 65,539 stack ids,
// touched as stacks appear). Tags at or past `max_tags` are counted
// (stats().untracked) and left out of every sum.
//
// Thread-safety: every member may be called from any thread. One mutex,
// taken only on sampled events (never on an allocation or free that was not
// sampled), and registered with the fork guard (base/fork_guard.h): a child
// forked while another thread held it frees sampled blocks without
// deadlocking. Never calls malloc (ForEachPeak's visit may).
//
// Example:
//   LivePeak peak(1 << 16);
//   peak.Add(7, 4096, 128.0);     // a sampled block of stack 7 allocated
//   peak.Remove(7, 4096, 128.0);  // and freed: stack 7 peaked at 512 KiB
//   peak.ForEachPeak([](uint64_t tag, double objects, double bytes) { ... });
//   peak.StartWindow();           // the next window's peak starts from now
#ifndef INPROF_ALLOC_LIVE_PEAK_H_
#define INPROF_ALLOC_LIVE_PEAK_H_

#include <cstddef>
#include <cstdint>
#include <mutex>

#include "absl/functional/function_ref.h"

namespace inprof::internal {

class LivePeak {
 public:
  struct Stats {
    uint64_t events = 0;        // Adds and Removes of tracked tags
    uint64_t copies = 0;        // peaks recorded (first steps down from a new high)
    uint64_t tags_copied = 0;   // tags those copies wrote: at most `events`
    uint64_t untracked = 0;     // events of tags at or past max_tags
    uint64_t live_bytes = 0;    // the live total now
    uint64_t peak_bytes = 0;    // and at its highest since StartWindow
  };

  explicit LivePeak(size_t max_tags);
  ~LivePeak();
  LivePeak(const LivePeak&) = delete;
  LivePeak& operator=(const LivePeak&) = delete;

  // A sampled block of `tag`, `size` bytes standing for `weight_objects`
  // blocks, became live (Add) or left the live heap (Remove).
  void Add(uint64_t tag, uint64_t size, double weight_objects) noexcept;
  void Remove(uint64_t tag, uint64_t size, double weight_objects) noexcept;

  // Begins a window: its peak is the live heap as it stands now, until the
  // live total passes it.
  void StartWindow() noexcept;

  // Calls `visit` with each tag's sums at the window's peak, for the tags
  // whose sums there are not zero (in tag order). Does not end the window.
  void ForEachPeak(absl::FunctionRef<void(uint64_t tag, double objects, double bytes)> visit);

  Stats stats();

  // The fixed-point scale of the object sums.
  static constexpr double kObjectScale = 65536.0;

 private:
  struct Cell {
    int64_t live_bytes;
    int64_t live_objects;  // in 1/kObjectScale
    int64_t peak_bytes;
    int64_t peak_objects;
    uint32_t changed;  // 1 while on the changed list
    uint32_t pad;
  };
  static_assert(sizeof(Cell) == 40, "the memory figure in the header comment");

  void ChangeLocked(uint64_t tag, int64_t bytes, int64_t objects) noexcept;
  void CopyLocked() noexcept;

  std::mutex mutex_;
  size_t max_tags_;
  Cell* cells_ = nullptr;        // max_tags_ of them
  uint32_t* changed_ = nullptr;  // the changed tags, changed_count_ of them
  size_t changed_count_ = 0;
  size_t tags_seen_ = 0;  // one past the highest tag added
  void* mapping_ = nullptr;
  size_t mapping_bytes_ = 0;
  int64_t live_total_ = 0;
  int64_t peak_total_ = 0;
  bool copy_owed_ = false;  // the live sums are the peak's, not yet copied
  Stats stats_;
};

}  // namespace inprof::internal

#endif  // INPROF_ALLOC_LIVE_PEAK_H_
