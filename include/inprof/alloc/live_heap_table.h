// internal: not part of the public API (phase 1 of the allocation profiler,
// docs/allocations_plan.md).
//
// LiveHeapTable: the sampled blocks that are still allocated, keyed by
// address, for the live-heap (inuse_*) profile. Open-addressed levels with
// linear probing; every operation is lock-free (compare-and-swap on the
// slot's key) and never calls malloc, so the free() wrapper may call Erase
// for every block it sees: a block that was never sampled costs one hash
// and one bit of an occupancy bitmap per level (one level in most
// programs).
//
// The table grows with the sampled live set: when the newest level holds
// more than half its slots, the next Insert maps a level twice its size
// (mmap: no malloc on the sampled path, and zero pages until used), and
// new entries go there while the older levels drain as their blocks are
// freed. It stops growing at `max_capacity` slots in all; past that (or
// when the kernel refuses the mapping) an Insert that finds no free slot
// within kMaxProbe is counted as an overflow (stats().overflows) and the
// block is not tracked: the profile's comments show the count.
//
// An address is in the table at most once: Insert replaces what any level
// held for it. The allocator hands an address out again only after it was
// freed, so an entry still there is a block whose free inprof did not see
// (a free through a pointer taken before the hooks were installed, an
// object that frees through its own slot); counted as stats().replaced.
//
// Deletion uses tombstones. Insert reuses them, and Erase turns a
// tombstone back into an empty slot (walking backwards) when the slot after
// it is empty, so that a long-running program's chains stay short.
//
// Memory: 32 bytes and a bit a slot, mapped per level: the first level
// (`capacity`, rounded up to a power of two; 65,536 slots: 2 MiB + 8 KiB)
// at construction, each further one when the live set needs it; at most
// 64 bytes a live sampled block once the table has grown.
//
// Thread-safety: Insert, Erase, Take and ForEach may run concurrently from
// any threads. An entry inserted by a thread is found by a later Erase of
// the same address from any thread that the program ordered after it (as a
// free is ordered after its malloc). ForEach sees each entry that stays in
// the table for its whole run exactly once, and never a half-written one.
// Erase empties a tombstone in two steps (kTombstone, a mark of its own,
// kEmpty) and an Insert whose chain runs through a marked slot puts the
// tombstone back, so no chain to a key an Insert returned has a hole, even
// for a moment; and while an Erase is clearing a slot's occupancy bit, a
// free that finds its home's bit clear looks at the slots instead. Not
// async-signal-safe to destroy.
//
// Example:
//   LiveHeapTable live(1 << 16, 1 << 23);  // grows from 65,536 to 8 M slots
//   live.Insert(p, {.size = 48, .weight_objects = 10922.7, .tag = stack_id});
//   ...
//   live.Erase(q);                         // q unsampled: nothing happens
//   LiveHeapTable::Totals t = live.Sum();  // inuse_objects, inuse_space
#ifndef INPROF_ALLOC_LIVE_HEAP_TABLE_H_
#define INPROF_ALLOC_LIVE_HEAP_TABLE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "absl/functional/function_ref.h"
#include "inprof/base/alloc_guard.h"

namespace inprof::internal {

class LivePeak;

class LiveHeapTable {
 public:
  // What the table keeps for one sampled block.
  struct Entry {
    uint64_t size = 0;            // the block's requested size in bytes
    double weight_objects = 0.0;  // what the sample stands for: 1/p objects
    uint64_t tag = 0;             // the caller's (a later phase: the stack's id)
  };
  // Counters since construction (relaxed: read them as an approximation
  // while others write).
  struct Stats {
    uint64_t inserts = 0;
    uint64_t erases = 0;
    uint64_t overflows = 0;  // Inserts that found no free slot: not tracked
    uint64_t rejected = 0;   // Inserts of an address the table cannot hold (odd, null)
    uint64_t replaced = 0;   // Inserts that replaced an entry for the same address
    uint64_t levels = 0;     // levels mapped
    uint64_t capacity = 0;   // their slots, in all
    // What the kept entries stand for, in bytes (size * weight_objects,
    // rounded the same way for both): in by Insert, out by Erase, Take and
    // a replacement. bytes_in - bytes_out is the live blocks' inuse_space
    // without a walk over the table (Sum).
    uint64_t bytes_in = 0;
    uint64_t bytes_out = 0;
  };
  // The live entries' sum, scaled: inuse_objects and inuse_space.
  struct Totals {
    uint64_t entries = 0;
    double objects = 0.0;  // sum of weight_objects
    double bytes = 0.0;    // sum of size * weight_objects
  };

  // Probes an operation makes at most in one level before it gives up.
  static constexpr size_t kMaxProbe = 64;
  // Levels at most: 2^16 slots doubling 9 times reach 2^25 (1 GiB).
  static constexpr int kMaxLevels = 10;

  // `capacity` slots, rounded up to a power of two (at least 16), growing
  // up to `max_capacity` slots in all (0 or less than `capacity`: never
  // grows).
  explicit LiveHeapTable(size_t capacity, size_t max_capacity = 0);
  ~LiveHeapTable();
  LiveHeapTable(const LiveHeapTable&) = delete;
  LiveHeapTable& operator=(const LiveHeapTable&) = delete;

  // The slots of every level mapped so far.
  size_t capacity() const;

  // Records `address` with `entry`, replacing any entry the table held for
  // it. False (and counted) when no level has a free slot within
  // kMaxProbe of the address's home slot, or the address is null or odd
  // or in the top half of the address space (the allocator's blocks are
  // at least 2-aligned and in user space; the low bit marks a slot being
  // written, the top bit a slot being emptied). Lock-free; never calls malloc.
  bool Insert(const void* address, const Entry& entry);

  // Removes `address` if it is there. True when it was. Lock-free; never
  // allocates.
  bool Erase(const void* address) {
    // The common case inline: a block never sampled, its home slot empty in
    // every level, which the occupancy bitmaps say without touching the
    // slots (8 KiB for 65,536 slots stay in cache; the 2 MiB of slots do
    // not, and every free() of a program that frees millions of blocks a
    // second missed there: bench/alloc/compare_heap_profilers.py).
    const int n = nlevels_.load(std::memory_order_acquire);
    const uintptr_t a = reinterpret_cast<uintptr_t>(address);
    for (int i = 0; i < n; ++i) {
      const Level& level = levels_[i];
      const size_t home = level.Home(a);
      // A Reclaim clears a bit before it knows that it may: when one ran
      // while the bit was read, the bit says nothing (Level::Reclaim).
      const uint64_t done = level.reclaims_done.load(std::memory_order_seq_cst);
      if ((level.occupied[home / 64].load(std::memory_order_seq_cst) &
           (uint64_t{1} << (home % 64))) != 0 ||
          level.reclaims_started.load(std::memory_order_seq_cst) != done) {
        return EraseOccupied(a);
      }
    }
    return false;
  }

  // Removes `address` if it is there and copies its entry to `*out`
  // (`out` may be null). Lock-free; never allocates.
  bool Take(const void* address, Entry* out);

  // Calls `visit` for each live entry (a snapshot slot by slot, not an
  // atomic one: entries inserted or erased meanwhile may or may not be
  // seen). Must not call Insert/Erase on this table from `visit`.
  void ForEach(absl::FunctionRef<void(const void* address, const Entry& entry)> visit) const;

  // The live entries' totals (ForEach's snapshot).
  Totals Sum() const;

  // The counters (approximate while others write).
  Stats stats() const;

  // Tells `peak` (null: none) of every entry that Insert keeps and that
  // Take, Erase or a replacement removes from now on (live_peak.h: the
  // peak_inuse_* types). Set it while the table is empty, or before a
  // ForEach/Erase of what it holds, so that every removal follows its add.
  void SetPeak(LivePeak* peak) { peak_.store(peak, std::memory_order_release); }

 private:
  // One slot: the key, then the entry, each word atomic so that a reader
  // racing a writer reads no torn word (it then rechecks the key).
  struct alignas(32) Slot {
    std::atomic<uintptr_t> key{0};  // kEmpty, kTombstone, a mark, address|kBusy or address
    std::atomic<uint64_t> size{0};
    std::atomic<uint64_t> weight_bits{0};  // the double weight_objects' bits
    std::atomic<uint64_t> tag{0};
  };
  static_assert(sizeof(Slot) == 32, "the memory figure in the header comment");
  static constexpr uintptr_t kEmpty = 0;
  static constexpr uintptr_t kTombstone = 1;  // an odd value: never an address
  static constexpr uintptr_t kBusy = 1;       // low bit of a key being written
  // A tombstone an Erase is turning into kEmpty (Level::Reclaim) holds a
  // mark: this bit, the Reclaim's own number and kBusy. Never an address
  // or an address being written (both are below this bit); each mark
  // differs, so a Reclaim whose mark was put back and set again by another
  // cannot mistake the other's for its own.
  static constexpr uintptr_t kMarkBit = uintptr_t{1} << 63;
  static bool IsMark(uintptr_t key) { return (key & kMarkBit) != 0; }

  // One open-addressed table. Its fields but the counters are written once,
  // before the level is published through nlevels_, and read-only after.
  struct Level {
    size_t mask = 0;
    unsigned shift = 0;  // 64 - log2(capacity)
    Slot* slots = nullptr;
    // The occupancy bitmap: a slot's bit is set whenever its key is not
    // kEmpty, except while a Reclaim runs (reclaims_started differs from
    // reclaims_done); and on the home slot of every key an Insert has
    // returned. Set before and after a slot's key leaves kEmpty, and on the
    // home slot before an Insert returns; cleared by a Reclaim that marked
    // the slot, before it empties it, and set again when an Insert put the
    // tombstone back meanwhile.
    std::atomic<uint64_t>* occupied = nullptr;
    void* mapping = nullptr;
    size_t mapping_bytes = 0;
    std::atomic<uint64_t> live{0};  // keys in it (a growth trigger, approximate)
    // Reclaims begun and ended: the begun count numbers the marks.
    std::atomic<uint64_t> reclaims_started{0};
    std::atomic<uint64_t> reclaims_done{0};

    size_t Home(uintptr_t address) const {
      // Fibonacci hashing: the product's high bits depend on every bit of
      // the address, including the low ones that alignment leaves zero.
      return static_cast<size_t>((static_cast<uint64_t>(address) * 0x9e3779b97f4a7c15ULL) >>
                                 shift);
    }
    void SetOccupied(size_t index) {
      occupied[index / 64].fetch_or(uint64_t{1} << (index % 64), std::memory_order_seq_cst);
    }
    // Inserts into this level; false when no free slot within kMaxProbe.
    bool Insert(uintptr_t a, const Entry& entry);
    bool Take(uintptr_t a, Entry* out);
    // Turns tombstones back into empty slots from `index` backwards while
    // the slot after each is empty.
    void Reclaim(size_t index);
  };

  // Erase when a home slot of `a` is taken: Take, unless this thread
  // looked `a` up last, found it absent, and nothing was inserted since.
  // An allocator that hands the same block out again (glibc's tcache, a
  // malloc/free loop) whose home slot another block holds otherwise
  // probed on every free: 16% of such a program's time.
  bool EraseOccupied(uintptr_t a) {
    AllocThreadState& t = alloc_thread_state;
    // An insert of `a` that the program ordered before this free (its
    // malloc returned after the insert) is counted here already.
    const uint64_t inserts = inserts_.load(std::memory_order_relaxed);
    if (t.absent_address == a && t.absent_table == this && t.absent_inserts == inserts) {
      return false;
    }
    if (Take(reinterpret_cast<const void*>(a), nullptr)) return true;
    t.absent_address = a;
    t.absent_table = this;
    t.absent_inserts = inserts;
    return false;
  }

  // Maps level `index` with `slots` slots; false when the kernel refuses.
  bool MakeLevel(int index, size_t slots);
  // Maps the next level when the newest is over half full and the table
  // may still grow.
  void MaybeGrow(int newest);

  Level levels_[kMaxLevels];
  std::atomic<int> nlevels_{0};
  std::atomic<bool> growing_{false};
  std::atomic<LivePeak*> peak_{nullptr};
  size_t max_capacity_;
  // Counters on a line of their own: the hot path (Erase of an unsampled
  // block) reads only the levels.
  alignas(64) std::atomic<uint64_t> inserts_{0};
  std::atomic<uint64_t> erases_{0};
  std::atomic<uint64_t> overflows_{0};
  std::atomic<uint64_t> rejected_{0};
  std::atomic<uint64_t> replaced_{0};
  std::atomic<uint64_t> bytes_in_{0};
  std::atomic<uint64_t> bytes_out_{0};
};

}  // namespace inprof::internal

#endif  // INPROF_ALLOC_LIVE_HEAP_TABLE_H_
