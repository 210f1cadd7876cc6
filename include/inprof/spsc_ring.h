// inprof/spsc_ring.h: lock-free single-producer/single-consumer rings.
//
// Defines:
//   SpscRing<T, Capacity>   a fixed-capacity ring of T objects.
//   SpscRecordRing<Words>   a ring of variable-length records made of 64-bit
//                           words; this is what a thread's signal handler
//                           pushes samples into.
//   SampleRing              the concept a Profiler's ring type must model.
//
// Thread-safety: exactly one producer thread and one consumer thread at a
// time. TryPush is async-signal-safe (no allocation, no locks, no syscalls),
// so the producer may be a signal handler interrupting the thread that owns
// the ring. A push that does not fit is dropped and counted, never blocks.
//
// Example:
//   inprof::SpscRecordRing<4096> ring;              // 32 KiB of records
//   uint64_t sample[] = {42, 0x401000, 0x401234};
//   if (!ring.TryPush(sample)) { /* dropped; ring.dropped() counts it */ }
//   uint64_t out[64];
//   if (auto n = ring.TryPop(out)) { /* out[0..n) holds the record */ }
#ifndef INPROF_SPSC_RING_H_
#define INPROF_SPSC_RING_H_

#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>

namespace inprof {

// A fixed 64 rather than std::hardware_destructive_interference_size, whose
// value may change with -mtune and would change the layout (GCC warns).
inline constexpr size_t kCacheLine = 64;

// A bounded ring of T. Capacity must be a power of two.
// TryPush/TryPop never allocate; T's constructors may, which is the caller's
// concern (the profiler only stores trivially copyable records).
template <typename T, size_t Capacity>
class SpscRing {
  static_assert(Capacity >= 2 && (Capacity & (Capacity - 1)) == 0,
                "Capacity must be a power of two");

 public:
  SpscRing() = default;
  SpscRing(const SpscRing&) = delete;
  SpscRing& operator=(const SpscRing&) = delete;
  ~SpscRing() {
    while (TryPop()) {
    }
  }

  // Producer only. Returns false (and counts a drop) when full.
  template <typename... Args>
  [[nodiscard]] bool TryEmplace(Args&&... args) noexcept(
      std::is_nothrow_constructible_v<T, Args...>) {
    const uint64_t head = head_.load(std::memory_order_relaxed);
    if (head - cached_tail_ == Capacity) {
      cached_tail_ = tail_.load(std::memory_order_acquire);
      if (head - cached_tail_ == Capacity) {
        dropped_.fetch_add(1, std::memory_order_relaxed);
        return false;
      }
    }
    new (&slots_[head & kMask]) T(std::forward<Args>(args)...);
    head_.store(head + 1, std::memory_order_release);
    return true;
  }
  [[nodiscard]] bool TryPush(const T& value) noexcept(
      std::is_nothrow_copy_constructible_v<T>) {
    return TryEmplace(value);
  }

  // Consumer only. Empty optional when the ring is empty.
  [[nodiscard]] std::optional<T> TryPop() noexcept(
      std::is_nothrow_move_constructible_v<T>) {
    const uint64_t tail = tail_.load(std::memory_order_relaxed);
    if (tail == cached_head_) {
      cached_head_ = head_.load(std::memory_order_acquire);
      if (tail == cached_head_) return std::nullopt;
    }
    T* slot = std::launder(reinterpret_cast<T*>(&slots_[tail & kMask]));
    std::optional<T> out(std::move(*slot));
    slot->~T();
    tail_.store(tail + 1, std::memory_order_release);
    return out;
  }

  // Pushes refused because the ring was full. Any thread.
  uint64_t dropped() const noexcept {
    return dropped_.load(std::memory_order_relaxed);
  }
  // Approximate from any thread other than the two sides.
  size_t size() const noexcept {
    return static_cast<size_t>(head_.load(std::memory_order_acquire) -
                               tail_.load(std::memory_order_acquire));
  }
  static constexpr size_t capacity() noexcept { return Capacity; }

 private:
  static constexpr uint64_t kMask = Capacity - 1;
  struct alignas(T) Storage {
    std::byte bytes[sizeof(T)];
  };

  // Producer side: own index, cached copy of the consumer's.
  alignas(kCacheLine) std::atomic<uint64_t> head_{0};
  alignas(kCacheLine) uint64_t cached_tail_ = 0;
  // Consumer side.
  alignas(kCacheLine) std::atomic<uint64_t> tail_{0};
  alignas(kCacheLine) uint64_t cached_head_ = 0;
  alignas(kCacheLine) std::atomic<uint64_t> dropped_{0};
  alignas(kCacheLine) Storage slots_[Capacity];
};

// A bounded ring of variable-length records of 64-bit words. Words must be a
// power of two. Each record is stored as a one-word length followed by its
// payload and may wrap around the end of the buffer, so no space is wasted on
// padding and any record up to Words - 1 words fits into an empty ring.
template <size_t Words>
class SpscRecordRing {
  static_assert(Words >= 16 && (Words & (Words - 1)) == 0,
                "Words must be a power of two >= 16");

 public:
  SpscRecordRing() = default;
  SpscRecordRing(const SpscRecordRing&) = delete;
  SpscRecordRing& operator=(const SpscRecordRing&) = delete;

  // Producer only. Async-signal-safe. Never allocates. Returns false and
  // counts a drop when the record does not fit (or is empty or too large).
  [[nodiscard]] bool TryPush(std::span<const uint64_t> record) noexcept {
    const uint64_t needed = record.size() + 1;
    if (record.empty() || needed > Words) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    const uint64_t head = head_.load(std::memory_order_relaxed);
    if (head + needed - cached_tail_ > Words) {
      cached_tail_ = tail_.load(std::memory_order_acquire);
      if (head + needed - cached_tail_ > Words) {
        dropped_.fetch_add(1, std::memory_order_relaxed);
        return false;
      }
    }
    words_[head & kMask] = record.size();
    CopyIn(head + 1, record);
    head_.store(head + needed, std::memory_order_release);
    return true;
  }

  // Consumer only. Copies the oldest record into `out` and returns its length
  // in words, or 0 when the ring is empty. A record longer than `out` is
  // consumed and truncated to out.size() words (the return value is then
  // out.size()); callers size `out` for the largest record they push.
  [[nodiscard]] size_t TryPop(std::span<uint64_t> out) noexcept {
    if (out.empty()) return 0;  // never consume a record we cannot return
    const uint64_t tail = tail_.load(std::memory_order_relaxed);
    if (tail == cached_head_) {
      cached_head_ = head_.load(std::memory_order_acquire);
      if (tail == cached_head_) return 0;
    }
    const uint64_t length = words_[tail & kMask];
    const size_t copy = length < out.size() ? length : out.size();
    CopyOut(tail + 1, out.first(copy));
    tail_.store(tail + 1 + length, std::memory_order_release);
    return copy;
  }

  // Records refused because the ring was full. Any thread.
  uint64_t dropped() const noexcept {
    return dropped_.load(std::memory_order_relaxed);
  }
  // Words in use, approximate from a third thread.
  size_t used_words() const noexcept {
    return static_cast<size_t>(head_.load(std::memory_order_acquire) -
                               tail_.load(std::memory_order_acquire));
  }
  static constexpr size_t capacity_words() noexcept { return Words; }
  // Largest payload one record can carry.
  static constexpr size_t max_record_words() noexcept { return Words - 1; }

  // Where the indices and the words are, for a reader in another process
  // (library mode's agent reads the rings of a process that died:
  // internal/agent_stream.h). The same for every Words.
  static constexpr size_t head_offset() noexcept { return offsetof(SpscRecordRing, head_); }
  static constexpr size_t tail_offset() noexcept { return offsetof(SpscRecordRing, tail_); }
  static constexpr size_t dropped_offset() noexcept {
    return offsetof(SpscRecordRing, dropped_);
  }
  static constexpr size_t words_offset() noexcept { return offsetof(SpscRecordRing, words_); }

  // Layout check used by a static_assert below: producer index, consumer
  // index and the drop counter never share a cache line (no false sharing).
  static constexpr bool IndicesOnOwnCacheLines() noexcept {
    return offsetof(SpscRecordRing, cached_tail_) -
                   offsetof(SpscRecordRing, head_) >= kCacheLine &&
           offsetof(SpscRecordRing, tail_) -
                   offsetof(SpscRecordRing, cached_tail_) >= kCacheLine &&
           offsetof(SpscRecordRing, words_) -
                   offsetof(SpscRecordRing, dropped_) >= kCacheLine;
  }

 private:
  static constexpr uint64_t kMask = Words - 1;

  // At most two memcpy pieces: up to the end of the buffer, then from its
  // start (memcpy is async-signal-safe: it touches only the given memory).
  void CopyIn(uint64_t at, std::span<const uint64_t> words) noexcept {
    const size_t start = at & kMask;
    const size_t first = words.size() < Words - start ? words.size() : Words - start;
    std::memcpy(&words_[start], words.data(), first * sizeof(uint64_t));
    if (words.size() > first) {
      std::memcpy(&words_[0], words.data() + first,
                  (words.size() - first) * sizeof(uint64_t));
    }
  }
  void CopyOut(uint64_t at, std::span<uint64_t> out) const noexcept {
    const size_t start = at & kMask;
    const size_t first = out.size() < Words - start ? out.size() : Words - start;
    std::memcpy(out.data(), &words_[start], first * sizeof(uint64_t));
    if (out.size() > first) {
      std::memcpy(out.data() + first, &words_[0],
                  (out.size() - first) * sizeof(uint64_t));
    }
  }

  alignas(kCacheLine) std::atomic<uint64_t> head_{0};
  alignas(kCacheLine) uint64_t cached_tail_ = 0;
  alignas(kCacheLine) std::atomic<uint64_t> tail_{0};
  alignas(kCacheLine) uint64_t cached_head_ = 0;
  alignas(kCacheLine) std::atomic<uint64_t> dropped_{0};
  alignas(kCacheLine) uint64_t words_[Words];
};

static_assert(SpscRecordRing<16>::IndicesOnOwnCacheLines(),
              "each index must sit on its own cache line");
static_assert(SpscRecordRing<16>::words_offset() == SpscRecordRing<4096>::words_offset(),
              "the layout before the words does not depend on their number");

// Whether R is an SpscRecordRing (of any size): library mode puts such rings
// in memory the agent shares.
template <typename R>
inline constexpr bool kIsSpscRecordRing = false;
template <size_t Words>
inline constexpr bool kIsSpscRecordRing<SpscRecordRing<Words>> = true;

// A ring a Profiler can use between a thread's signal handler and the
// collector. Requirements:
//   (1) default constructible, not copyable (it lives in a thread's slot);
//   (2) r.TryPush(std::span<const uint64_t>) -> bool, noexcept
//       (async-signal-safe; false means dropped and counted);
//   (3) r.TryPop(std::span<uint64_t>) -> size_t words, 0 when empty;
//   (4) r.dropped() -> uint64_t, the number of refused pushes;
//   (5) R::max_record_words(), the largest record it accepts.
template <typename R>
concept SampleRing =
    std::default_initializable<R> && (!std::copy_constructible<R>) &&
    requires(R& r, std::span<const uint64_t> in, std::span<uint64_t> out) {
      { r.TryPush(in) } noexcept -> std::same_as<bool>;
      { r.TryPop(out) } -> std::same_as<size_t>;
      { r.dropped() } -> std::convertible_to<uint64_t>;
      { R::max_record_words() } -> std::convertible_to<size_t>;
    };

// Optional: `R::capacity_words()`, the ring's size in words. The collector
// pops at most that many a pass from one ring, so a thread whose handler
// pushes as fast as it pops cannot hold the registry lock.
template <typename R>
concept SizedRing = SampleRing<R> && requires {
  { R::capacity_words() } -> std::convertible_to<size_t>;
};

// 32 KiB of samples per thread: at the fastest CPU period (1 ms) a thread
// makes 50 samples per 50 ms collection pass; at ~40 frames each that is
// ~17 KiB, so the default leaves headroom for bursts.
using DefaultSampleRing = SpscRecordRing<4096>;
static_assert(SampleRing<DefaultSampleRing>);
static_assert(SizedRing<DefaultSampleRing>);

}  // namespace inprof

#endif  // INPROF_SPSC_RING_H_
