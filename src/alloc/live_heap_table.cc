#include "inprof/alloc/live_heap_table.h"

#include <sys/mman.h>

#include <bit>
#include <cstring>

#include "inprof/alloc/live_peak.h"

namespace inprof::internal {
namespace {
uint64_t DoubleBits(double d) {
  uint64_t bits;
  std::memcpy(&bits, &d, sizeof bits);
  return bits;
}
double BitsDouble(uint64_t bits) {
  double d;
  std::memcpy(&d, &bits, sizeof d);
  return d;
}
// Inserts that lose a race with a reclaiming Erase start over at most this
// many times (each time is a fresh probe) before the block counts as an
// overflow.
constexpr int kInsertAttempts = 4;
// An entry's bytes for the counters (bytes_in, bytes_out): the same
// rounding in and out, so that what stays is what the live entries make.
uint64_t EntryBytes(uint64_t size, double weight_objects) {
  const double bytes = static_cast<double>(size) * weight_objects;
  return bytes >= 1.8e19 ? uint64_t{1} << 63 : static_cast<uint64_t>(bytes + 0.5);
}
size_t RoundCapacity(size_t capacity) { return std::bit_ceil(capacity < 16 ? size_t{16} : capacity); }
}  // namespace

LiveHeapTable::LiveHeapTable(size_t capacity, size_t max_capacity)
    : max_capacity_(max_capacity) {
  // Without the first level every Insert overflows (counted): the host
  // runs on without a live heap.
  if (MakeLevel(0, RoundCapacity(capacity))) nlevels_.store(1, std::memory_order_release);
}

LiveHeapTable::~LiveHeapTable() {
  const int n = nlevels_.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) munmap(levels_[i].mapping, levels_[i].mapping_bytes);
}

bool LiveHeapTable::MakeLevel(int index, size_t slots) {
  // Slots first (32-byte aligned by the page), then the bitmap. Anonymous
  // memory reads as zero: every key kEmpty, every bit clear.
  const size_t slot_bytes = slots * sizeof(Slot);
  const size_t bitmap_bytes = (slots + 63) / 64 * sizeof(uint64_t);
  const size_t bytes = slot_bytes + bitmap_bytes;
  void* mapping = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapping == MAP_FAILED) return false;
  Level& level = levels_[index];
  level.mask = slots - 1;
  level.shift = 64 - static_cast<unsigned>(std::countr_one(level.mask));
  // Zero bytes are a valid Slot and a valid atomic word (both are
  // trivially copyable words whose zero is kEmpty / no bit).
  level.slots = static_cast<Slot*>(mapping);
  level.occupied = reinterpret_cast<std::atomic<uint64_t>*>(static_cast<char*>(mapping) + slot_bytes);
  level.mapping = mapping;
  level.mapping_bytes = bytes;
  level.live.store(0, std::memory_order_relaxed);
  return true;
}

size_t LiveHeapTable::capacity() const {
  size_t total = 0;
  const int n = nlevels_.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) total += levels_[i].mask + 1;
  return total;
}

void LiveHeapTable::MaybeGrow(int newest) {
  const Level& level = levels_[newest];
  const size_t slots = level.mask + 1;
  if (level.live.load(std::memory_order_relaxed) <= slots / 2) return;
  if (newest + 1 >= kMaxLevels || capacity() + 2 * slots > max_capacity_) return;
  bool expected = false;
  if (!growing_.compare_exchange_strong(expected, true, std::memory_order_acq_rel)) return;
  // Another thread may have grown it meanwhile.
  if (nlevels_.load(std::memory_order_acquire) == newest + 1 && MakeLevel(newest + 1, 2 * slots)) {
    nlevels_.store(newest + 2, std::memory_order_release);
  }
  growing_.store(false, std::memory_order_release);
}

bool LiveHeapTable::Insert(const void* address, const Entry& entry) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(address);
  if (a == 0 || (a & (kBusy | kMarkBit)) != 0) {
    rejected_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  // What the table still holds for this address is a block freed where
  // inprof did not see it: the allocator has just handed the address out
  // again.
  Entry stale;
  if (Take(address, &stale)) {
    erases_.fetch_sub(1, std::memory_order_relaxed);  // not a free that was seen
    replaced_.fetch_add(1, std::memory_order_relaxed);
  }
  const int n = nlevels_.load(std::memory_order_acquire);
  // The newest level first; an older one only when the newest cannot take
  // it (a table that may grow no more).
  for (int i = n - 1; i >= 0; --i) {
    if (!levels_[i].Insert(a, entry)) continue;
    inserts_.fetch_add(1, std::memory_order_relaxed);
    bytes_in_.fetch_add(EntryBytes(entry.size, entry.weight_objects), std::memory_order_relaxed);
    if (LivePeak* peak = peak_.load(std::memory_order_acquire)) {
      peak->Add(entry.tag, entry.size, entry.weight_objects);
    }
    if (i == n - 1) MaybeGrow(i);
    return true;
  }
  overflows_.fetch_add(1, std::memory_order_relaxed);
  if (n > 0) MaybeGrow(n - 1);
  return false;
}

bool LiveHeapTable::Level::Insert(uintptr_t a, const Entry& entry) {
  const size_t home = Home(a);
  for (int attempt = 0; attempt < kInsertAttempts; ++attempt) {
    size_t i = 0;
    for (; i < kMaxProbe; ++i) {
      const size_t index = (home + i) & mask;
      Slot& slot = slots[index];
      uintptr_t key = slot.key.load(std::memory_order_acquire);
      if (key == kEmpty) SetOccupied(index);  // before the key leaves kEmpty
      // Another thread may take this free slot first: then look again at
      // what it holds now.
      while ((key == kEmpty || key == kTombstone) &&
             !slot.key.compare_exchange_weak(key, a | kBusy, std::memory_order_seq_cst,
                                             std::memory_order_acquire)) {
      }
      if (key == kEmpty || key == kTombstone) {  // ours, marked busy
        SetOccupied(index);  // and after: a Reclaim may have cleared it meanwhile
        break;
      }
    }
    if (i == kMaxProbe) return false;
    Slot& slot = slots[(home + i) & mask];
    slot.size.store(entry.size, std::memory_order_relaxed);
    slot.weight_bits.store(DoubleBits(entry.weight_objects), std::memory_order_relaxed);
    slot.tag.store(entry.tag, std::memory_order_relaxed);
    slot.key.store(a, std::memory_order_release);
    // A lookup stops at the first empty slot, so the slots between home and
    // ours must all be non-empty. An Erase may have emptied one behind us
    // while we probed past it (it checks the slot after, ours, which was
    // empty then): then take the entry out and place it again. One it is
    // emptying (marked) is put back as a tombstone, which makes its last
    // step fail. Read from ours back to home: a slot read non-empty is
    // marked later only after the slot after it, read before it, which
    // then is not empty.
    bool chain = true;
    for (size_t j = i; j-- > 0;) {
      std::atomic<uintptr_t>& key = slots[(home + j) & mask].key;
      uintptr_t seen = key.load(std::memory_order_seq_cst);
      while (IsMark(seen) &&
             !key.compare_exchange_weak(seen, kTombstone, std::memory_order_seq_cst)) {
      }
      if (seen == kEmpty) {
        chain = false;
        break;
      }
    }
    if (chain) {
      // The home slot is taken (ours, or one the chain runs through): its
      // bit is set before the caller's free can look, whatever an Insert
      // that took it has not yet done.
      SetOccupied(home);
      live.fetch_add(1, std::memory_order_relaxed);
      return true;
    }
    uintptr_t expected = a;
    slot.key.compare_exchange_strong(expected, kTombstone, std::memory_order_acq_rel);
  }
  return false;
}

bool LiveHeapTable::Take(const void* address, Entry* out) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(address);
  if (a == 0 || (a & (kBusy | kMarkBit)) != 0) return false;
  const int n = nlevels_.load(std::memory_order_acquire);
  for (int i = n - 1; i >= 0; --i) {
    Entry entry;
    if (!levels_[i].Take(a, &entry)) continue;
    if (out != nullptr) *out = entry;
    erases_.fetch_add(1, std::memory_order_relaxed);
    bytes_out_.fetch_add(EntryBytes(entry.size, entry.weight_objects), std::memory_order_relaxed);
    if (LivePeak* peak = peak_.load(std::memory_order_acquire)) {
      peak->Remove(entry.tag, entry.size, entry.weight_objects);
    }
    return true;
  }
  return false;
}

bool LiveHeapTable::Level::Take(uintptr_t a, Entry* out) {
  const size_t home = Home(a);
  for (size_t i = 0; i < kMaxProbe; ++i) {
    const size_t index = (home + i) & mask;
    Slot& slot = slots[index];
    uintptr_t key = slot.key.load(std::memory_order_acquire);
    if (key == kEmpty) return false;  // the common case for unsampled blocks
    if (key != a) continue;
    // The entry cannot change while its key is `a` (only the inserter
    // writes it, before publishing the key).
    Entry entry;
    entry.size = slot.size.load(std::memory_order_relaxed);
    entry.weight_objects = BitsDouble(slot.weight_bits.load(std::memory_order_relaxed));
    entry.tag = slot.tag.load(std::memory_order_relaxed);
    if (!slot.key.compare_exchange_strong(key, kTombstone, std::memory_order_acq_rel)) {
      return false;  // another thread took it (a double free)
    }
    *out = entry;
    live.fetch_sub(1, std::memory_order_relaxed);
    Reclaim(index);
    return true;
  }
  return false;
}

void LiveHeapTable::Level::Reclaim(size_t index) {
  // A tombstone whose next slot is empty ends no chain a lookup needs: no
  // key lies past it. Empty it, then its predecessor, and so on.
  //
  // The slot is marked first. An Insert that fills the next slot after the
  // check below finds the mark in its chain and puts the tombstone back,
  // and the last step (mark -> kEmpty) then fails. Emptying the slot in one
  // step, then putting the tombstone back when the next slot had filled,
  // left a moment when the chain to the key just inserted had a hole; and
  // clearing the bit after the slot was empty, then setting it again, one
  // when a taken home slot had no bit: a free in either moment left its
  // block counted live (tests/alloc/live_heap_table_test.cc,
  // AFreeFindsItsBlockWhileOthersEmptyTheSlotsBeforeIt). The bit is cleared
  // inside the count of reclaims begun and not ended, which Erase reads.
  for (size_t n = 0; n < kMaxProbe; ++n) {
    Slot& slot = slots[index];
    const Slot& next = slots[(index + 1) & mask];
    if (next.key.load(std::memory_order_seq_cst) != kEmpty) return;
    const uintptr_t mark =
        kMarkBit | (reclaims_started.fetch_add(1, std::memory_order_seq_cst) << 1) | kBusy;
    bool emptied = false;
    uintptr_t expected = kTombstone;
    if (slot.key.compare_exchange_strong(expected, mark, std::memory_order_seq_cst)) {
      expected = mark;
      // Read after the mark: an Insert that filled `next` before it is
      // seen here; one that fills it later sees the mark in its chain.
      if (next.key.load(std::memory_order_seq_cst) != kEmpty) {
        slot.key.compare_exchange_strong(expected, kTombstone, std::memory_order_seq_cst);
      } else {
        occupied[index / 64].fetch_and(~(uint64_t{1} << (index % 64)), std::memory_order_seq_cst);
        emptied = slot.key.compare_exchange_strong(expected, kEmpty, std::memory_order_seq_cst);
        if (!emptied) SetOccupied(index);  // put back as a tombstone
      }
    }
    reclaims_done.fetch_add(1, std::memory_order_seq_cst);
    if (!emptied) return;
    index = (index - 1) & mask;
  }
}

void LiveHeapTable::ForEach(
    absl::FunctionRef<void(const void* address, const Entry& entry)> visit) const {
  const int n = nlevels_.load(std::memory_order_acquire);
  for (int l = 0; l < n; ++l) {
    const Level& level = levels_[l];
    for (size_t i = 0; i <= level.mask; ++i) {
      // A clear bitmap word says 64 empty slots without touching them (a
      // grown table is mostly empty pages), unless a Reclaim ran meanwhile.
      if (i % 64 == 0) {
        const uint64_t done = level.reclaims_done.load(std::memory_order_seq_cst);
        if (level.occupied[i / 64].load(std::memory_order_seq_cst) == 0 &&
            level.reclaims_started.load(std::memory_order_seq_cst) == done) {
          i += 63;
          continue;
        }
      }
      const Slot& slot = level.slots[i];
      const uintptr_t key = slot.key.load(std::memory_order_acquire);
      if (key == kEmpty || (key & kBusy) != 0) continue;  // empty, tombstone, being written
      Entry entry;
      entry.size = slot.size.load(std::memory_order_relaxed);
      entry.weight_objects = BitsDouble(slot.weight_bits.load(std::memory_order_relaxed));
      entry.tag = slot.tag.load(std::memory_order_relaxed);
      // Seqlock-style: the entry is whole if the key did not change meanwhile.
      std::atomic_thread_fence(std::memory_order_acquire);
      if (slot.key.load(std::memory_order_relaxed) != key) continue;
      visit(reinterpret_cast<const void*>(key), entry);
    }
  }
}

LiveHeapTable::Totals LiveHeapTable::Sum() const {
  Totals totals;
  ForEach([&](const void*, const Entry& entry) {
    ++totals.entries;
    totals.objects += entry.weight_objects;
    totals.bytes += static_cast<double>(entry.size) * entry.weight_objects;
  });
  return totals;
}

LiveHeapTable::Stats LiveHeapTable::stats() const {
  Stats s;
  s.inserts = inserts_.load(std::memory_order_relaxed);
  s.erases = erases_.load(std::memory_order_relaxed);
  s.overflows = overflows_.load(std::memory_order_relaxed);
  s.rejected = rejected_.load(std::memory_order_relaxed);
  s.replaced = replaced_.load(std::memory_order_relaxed);
  s.levels = static_cast<uint64_t>(nlevels_.load(std::memory_order_acquire));
  s.capacity = capacity();
  s.bytes_in = bytes_in_.load(std::memory_order_relaxed);
  s.bytes_out = bytes_out_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace inprof::internal
