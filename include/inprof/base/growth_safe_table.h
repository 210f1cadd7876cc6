// internal: not part of the public API.
//
// absl's hash tables as Debian 12 ships them (20220623) set a growing
// table's new capacity before they allocate its new array. A growth whose
// allocation throws std::bad_alloc leaves the table corrupt: its next
// insertion fails an assertion in Debian's libabsl and aborts the process,
// or reads past the old array. inprof swallows bad_alloc on its own threads
// (base/contained.h) and on the host's (RegisterThread, an unregistration's
// drain), then goes on using its tables. So a table that may grow with the
// heap exhausted uses GrowthSafeAllocator, and every insertion into it is
// preceded by a GrowthReserve: when the insertion can grow the table, the
// reserve allocates the new array first (a throw there leaves the table
// as it was) and the table's allocation takes that block.
//
// The reserve predicts absl's growth from size() and capacity() (a table
// grows when its size reaches 7/8 of its capacity, to twice the capacity
// plus one). Tables that use it are only inserted into and cleared: an
// erase would leave tombstones that make absl grow earlier than predicted.
// A growth the reserve did not predict allocates as before.
//
// Thread-safety: the reserved block is the calling thread's; a table is
// guarded as its owner guards it. Not in a signal handler.
//
// Example:
//   GrowthSafeMap<K, V> table;
//   {
//     GrowthReserve reserve(table);  // may throw: the table is unchanged
//     table.emplace(key, value);
//   }
#ifndef INPROF_BASE_GROWTH_SAFE_TABLE_H_
#define INPROF_BASE_GROWTH_SAFE_TABLE_H_

#include <cstddef>
#include <functional>
#include <new>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"

namespace inprof::internal {

// The block a GrowthReserve holds for this thread's next table growth.
struct ReservedBlock {
  void* memory = nullptr;
  size_t bytes = 0;
};
inline thread_local ReservedBlock t_reserved_block;

template <typename T>
class GrowthSafeAllocator {
 public:
  using value_type = T;
  static_assert(alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__);

  GrowthSafeAllocator() = default;
  template <typename U>
  GrowthSafeAllocator(const GrowthSafeAllocator<U>&) {}  // NOLINT: rebinding

  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
    ReservedBlock& block = t_reserved_block;
    if (block.memory != nullptr && block.bytes >= bytes) {
      void* memory = block.memory;
      block = ReservedBlock{};
      return static_cast<T*>(memory);
    }
    return static_cast<T*>(::operator new(bytes));
  }
  // Unsized: a reserved block may be larger than the table asked for.
  void deallocate(T* p, size_t) noexcept { ::operator delete(p); }

  friend bool operator==(const GrowthSafeAllocator&, const GrowthSafeAllocator&) {
    return true;
  }
};

// absl::flat_hash_map with that allocator.
template <typename K, typename V,
          typename Hash = absl::container_internal::hash_default_hash<K>,
          typename Eq = absl::container_internal::hash_default_eq<K>>
using GrowthSafeMap = absl::flat_hash_map<K, V, Hash, Eq, GrowthSafeAllocator<std::pair<const K, V>>>;

// For a table that also erases (so that GrowthReserve cannot predict its
// growth), or that is small and off the sampled path: the standard's
// node-based tables, whose insertion leaves the table as it was when an
// allocation throws (its strong guarantee), hashed with absl's hash. The
// absl table a growth left corrupt is not only unusable: destroying it
// frees what it never allocated (a first insertion into an empty table
// frees absl's static empty group), so even a table local to a function
// that an exception leaves must be one of these, or reserved.
template <typename K, typename V, typename Hash = absl::Hash<K>, typename Eq = std::equal_to<K>>
using ThrowSafeMap = std::unordered_map<K, V, Hash, Eq>;
template <typename K, typename Hash = absl::Hash<K>, typename Eq = std::equal_to<K>>
using ThrowSafeSet = std::unordered_set<K, Hash, Eq>;

// Before an insertion into `table` (see above); frees the block on
// destruction if the insertion did not take it.
class GrowthReserve {
 public:
  template <typename Table>
  explicit GrowthReserve(const Table& table) {
    const size_t capacity = table.capacity();
    // absl's CapacityToGrowth: 7/8 of the capacity may be used.
    const size_t growth = capacity - capacity / 8;
    if (table.size() + 1 <= growth && capacity != 0) return;
    const size_t next = capacity == 0 ? 1 : 2 * capacity + 1;
    // absl's AllocSize: a control byte per slot, the sentinel and a group's
    // clone (16), aligned for the slots, then the slots; and room for what
    // other versions add before them.
    const size_t bytes = next + 16 + 64 + next * sizeof(typename Table::value_type);
    ReservedBlock& block = t_reserved_block;
    if (block.memory != nullptr) {  // one left by a nested reserve
      ::operator delete(block.memory);
      block = ReservedBlock{};
    }
    block.memory = ::operator new(bytes);  // may throw: nothing changed
    block.bytes = bytes;
    armed_ = true;
  }
  ~GrowthReserve() {
    if (!armed_) return;
    ReservedBlock& block = t_reserved_block;
    if (block.memory != nullptr) ::operator delete(block.memory);
    block = ReservedBlock{};
  }
  GrowthReserve(const GrowthReserve&) = delete;
  GrowthReserve& operator=(const GrowthReserve&) = delete;

 private:
  bool armed_ = false;
};

}  // namespace inprof::internal

#endif  // INPROF_BASE_GROWTH_SAFE_TABLE_H_
