#include "inprof/alloc/live_heap_table.h"

#include <bit>
#include <cstring>

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
}  // namespace

LiveHeapTable::LiveHeapTable(size_t capacity)
    : mask_(std::bit_ceil(capacity < 16 ? size_t{16} : capacity) - 1),
      shift_(64 - static_cast<unsigned>(std::countr_one(mask_))),
      slots_(new Slot[mask_ + 1]),
      occupied_(new std::atomic<uint64_t>[(mask_ + 1 + 63) / 64]) {
  for (size_t i = 0; i < (mask_ + 1 + 63) / 64; ++i) {
    occupied_[i].store(0, std::memory_order_relaxed);
  }
}

void LiveHeapTable::ClearOccupied(size_t index) {
  occupied_[index / 64].fetch_and(~(uint64_t{1} << (index % 64)), std::memory_order_seq_cst);
  // An Insert may have taken the slot between its emptying and the clear,
  // its own SetOccupied after its CAS landing before the clear.
  if (slots_[index].key.load(std::memory_order_seq_cst) != kEmpty) SetOccupied(index);
}

bool LiveHeapTable::Insert(const void* address, const Entry& entry) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(address);
  if (a == 0 || (a & kBusy) != 0) {
    rejected_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  const size_t home = Home(a);
  for (int attempt = 0; attempt < kInsertAttempts; ++attempt) {
    size_t i = 0;
    for (; i < kMaxProbe; ++i) {
      const size_t index = (home + i) & mask_;
      Slot& slot = slots_[index];
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
    if (i == kMaxProbe) break;
    Slot& slot = slots_[(home + i) & mask_];
    slot.size.store(entry.size, std::memory_order_relaxed);
    slot.weight_bits.store(DoubleBits(entry.weight_objects), std::memory_order_relaxed);
    slot.tag.store(entry.tag, std::memory_order_relaxed);
    slot.key.store(a, std::memory_order_release);
    // A lookup stops at the first empty slot, so the slots between home and
    // ours must all be non-empty. An Erase may have emptied one behind us
    // while we probed past it (it checks the slot after, ours, which was
    // empty then): then take the entry out and place it again.
    bool chain = true;
    for (size_t j = 0; j < i; ++j) {
      if (slots_[(home + j) & mask_].key.load(std::memory_order_acquire) == kEmpty) {
        chain = false;
        break;
      }
    }
    if (chain) {
      inserts_.fetch_add(1, std::memory_order_relaxed);
      bytes_in_.fetch_add(EntryBytes(entry.size, entry.weight_objects),
                          std::memory_order_relaxed);
      return true;
    }
    uintptr_t expected = a;
    slot.key.compare_exchange_strong(expected, kTombstone, std::memory_order_acq_rel);
  }
  overflows_.fetch_add(1, std::memory_order_relaxed);
  return false;
}

bool LiveHeapTable::Take(const void* address, Entry* out) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(address);
  if (a == 0 || (a & kBusy) != 0) return false;
  const size_t home = Home(a);
  for (size_t i = 0; i < kMaxProbe; ++i) {
    const size_t index = (home + i) & mask_;
    Slot& slot = slots_[index];
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
    if (out != nullptr) *out = entry;
    erases_.fetch_add(1, std::memory_order_relaxed);
    bytes_out_.fetch_add(EntryBytes(entry.size, entry.weight_objects),
                         std::memory_order_relaxed);
    Reclaim(index);
    return true;
  }
  return false;
}

void LiveHeapTable::Reclaim(size_t index) {
  // A tombstone whose next slot is empty ends no chain a lookup needs: no
  // key lies past it. Empty it, then its predecessor, and so on.
  for (size_t n = 0; n < kMaxProbe; ++n) {
    Slot& slot = slots_[index];
    const Slot& next = slots_[(index + 1) & mask_];
    if (next.key.load(std::memory_order_acquire) != kEmpty) return;
    uintptr_t expected = kTombstone;
    if (!slot.key.compare_exchange_strong(expected, kEmpty, std::memory_order_seq_cst)) return;
    ClearOccupied(index);
    if (next.key.load(std::memory_order_acquire) != kEmpty) {
      // An Insert placed a key after us meanwhile, having probed past this
      // slot: restore the tombstone so that its chain holds (if another
      // Insert took the empty slot instead, the chain holds as well).
      expected = kEmpty;
      SetOccupied(index);
      if (slot.key.compare_exchange_strong(expected, kTombstone, std::memory_order_seq_cst)) {
        SetOccupied(index);
      } else {
        ClearOccupied(index);  // set again when another Insert holds it
      }
      return;
    }
    index = (index - 1) & mask_;
  }
}

void LiveHeapTable::ForEach(
    absl::FunctionRef<void(const void* address, const Entry& entry)> visit) const {
  for (size_t i = 0; i <= mask_; ++i) {
    const Slot& slot = slots_[i];
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
  s.bytes_in = bytes_in_.load(std::memory_order_relaxed);
  s.bytes_out = bytes_out_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace inprof::internal
