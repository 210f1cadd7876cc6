// internal: not part of the public API.
//
// Compact call-frame tables for the DWARF unwinder (dwarf_unwinder.h); the
// async-signal-safe walk over them is in cfi_walk.h.
//
// Off the hot path, each loaded module's call-frame information (.eh_frame,
// and .debug_frame where .eh_frame has no entry) is interpreted once (by
// the builder's own pass over each FDE's program, elfutils libdw for what
// that pass leaves: see CfiInterpreter) and flattened into sorted rows: from this pc on, the CFA
// (the caller's stack pointer) is sp or fp plus an offset, the return
// address is at CFA - 8 and the caller's rbp is unchanged or saved at a
// given offset. A CfiSnapshot gathers the tables of every loaded module at
// their load addresses; the signal handler looks each pc up (a per-table
// cache of recent lookups, else a binary search) and walks the stack,
// checking every read against the thread's stack bounds.
//
// Thread-safety: CfiModuleTable and CfiSnapshot are immutable once built
// (but for their lookup caches: single atomic words, relaxed, which any
// thread may overwrite with another valid entry), and their lookups are
// async-signal-safe (no allocation, no locks, no syscalls). The builders
// allocate and open files: never call them from a signal handler.
#ifndef INPROF_INTERNAL_CFI_TABLE_H_
#define INPROF_INTERNAL_CFI_TABLE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "inprof/internal/cfi_rule.h"
#include "inprof/internal/machine_context.h"
#include "inprof/unwinder.h"

namespace inprof::internal {

// The rows of one module's executable text, in link-time addresses.
// Immutable after construction; Find is async-signal-safe.
class CfiModuleTable {
 public:
  // Rows must be sorted by pc (equal pcs: the last wins); consecutive rows
  // with equal rules are merged. A row's rule holds up to the next row; the
  // last row should be kNone to close the table. `text_lo`/`text_hi`: the
  // link-time range the offsets are relative to.
  CfiModuleTable(uint64_t text_lo, uint64_t text_hi,
                 const std::vector<CfiRow>& rows, std::string path = "",
                 std::string build_id = "");
  ~CfiModuleTable();

  // The rule for `offset` from text_lo (kind kNone when no CFI covers it).
  // Looks in a small direct-mapped cache of recent lookups first (return
  // addresses repeat from sample to sample; a hit costs one load and a few
  // shifts), then searches the rows.
  [[gnu::always_inline]] CfiStep FindStep(uint64_t offset) const noexcept {
    if (offset >= text_size_ || cache_ == nullptr) return CfiStep();
    const auto key = static_cast<uint32_t>(offset);
    // Return addresses sit at arbitrary byte offsets: their low bits index
    // the cache well enough, with no hashing on the walk's critical path.
    std::atomic<uint64_t>& slot = cache_[key & cache_mask_];
    const uint64_t cached = slot.load(std::memory_order_relaxed);
    if ((cached >> 32) == key &&
        (cached & (kSlotValid | kSlotPacked)) == (kSlotValid | kSlotPacked)) {
      CfiStep step;
      step.cfa_offset = static_cast<int16_t>(cached >> 16);
      step.ra_offset = -8;
      step.fp_offset = (static_cast<int64_t>(cached << 48) >> 58) * 8;
      step.kind = (cached >> 2) & 7;
      step.flags = (cached >> 5) & 31;
      return step;
    }
    return StepFromWord(FindSlow(key, cached, &slot));
  }

  // The rule word (EncodeRule) without the cache (tests, benchmarks).
  uint64_t FindWordUncached(uint64_t offset) const noexcept {
    if (offset >= text_size_ || row_pc_.empty()) return 0;
    return rules_[row_rule_[SearchRow(static_cast<uint32_t>(offset))]];
  }

  // The rule for `offset` into *rule; false when no CFI covers it.
  bool Find(uint64_t offset, CfiRule* rule) const noexcept {
    *rule = RuleFromStep(FindStep(offset));
    return rule->kind != CfiRule::kNone;
  }
  bool FindUncached(uint64_t offset, CfiRule* rule) const noexcept {
    *rule = DecodeRule(FindWordUncached(offset));
    return rule->kind != CfiRule::kNone;
  }

  // A module whose table is not built yet (a Profiler builds tables on
  // demand): no rows, so walks take frame-pointer steps in it, and the
  // first walk that meets it marks it wanted; the collector's next pass
  // builds its table. Async-signal-safe.
  static std::shared_ptr<const CfiModuleTable> Pending(uint64_t text_lo,
                                                       uint64_t text_hi,
                                                       std::string path);
  // A pending table that answers lookups from the module's .eh_frame until
  // its rows are built: the segment of the ELF file at `open_path` that
  // holds .eh_frame_hdr and .eh_frame is mapped (read-only, private, owned
  // by the table, so a module unloaded meanwhile is never read), and a
  // lookup finds the pc's FDE by .eh_frame_hdr's binary search table and
  // runs its program up to the pc (the builder's own interpreter, and a
  // CFA expression evaluated at the pc as the builder does for the .plt,
  // so the answer is the row the table would hold), no allocation, no
  // locks, no syscalls. Answers are cached like rows. Where that cannot
  // answer (no FDE, a form the builder leaves to libdw), the walk takes a
  // frame-pointer step and marks the table wanted, as for Pending; after
  // kDirectLookupsBeforeBuild cache misses it is marked wanted too, so a
  // module walked often gets its table, and a short run never pays for
  // one. Falls back to Pending() when the file cannot be mapped, has
  // another build-id than `expected_build_id` (if given) or has no
  // .eh_frame_hdr search table in the usual encoding (datarel sdata4).
  static std::shared_ptr<const CfiModuleTable> PendingFromFile(
      uint64_t text_lo, uint64_t text_hi, std::string path,
      const std::string& open_path, const std::string& expected_build_id);
  static constexpr uint64_t kDirectLookupsBeforeBuild = 4096;
  // The rule word for `offset` from .eh_frame (direct tables only; 0 when
  // no FDE covers it, kUnsupported where the walk cannot use it), without
  // the cache or the count. Async-signal-safe.
  uint64_t FindWordDirect(uint64_t offset) const noexcept;
  bool direct() const noexcept { return direct_ != nullptr; }
  uint64_t direct_lookups() const noexcept {
    return direct_lookups_.load(std::memory_order_relaxed);
  }
  bool pending() const noexcept { return pending_; }
  void MarkWanted() const noexcept {
    if (!wanted_.load(std::memory_order_relaxed)) {
      wanted_.store(true, std::memory_order_relaxed);
    }
  }
  bool wanted() const noexcept { return wanted_.load(std::memory_order_relaxed); }

  uint64_t text_lo() const { return text_lo_; }
  uint64_t text_hi() const { return text_lo_ + text_size_; }
  size_t rows() const { return row_pc_.size(); }
  size_t distinct_rules() const { return rules_.size(); }
  const std::string& path() const { return path_; }
  const std::string& build_id() const { return build_id_; }
  // Heap and object bytes this table holds.
  size_t MemoryBytes() const;
  // The rows back (tests).
  std::vector<CfiRow> Rows() const;

 private:
  // Cache slots: key << 32 | payload | kSlotPacked | kSlotValid (0:
  // empty). A rule with ra at CFA - 8, a 16-bit CFA offset and rbp within
  // 256 bytes of its base (all seen in practice but signal trampolines) is
  // packed: kind in bits 2-4, flags 5-9, rbp offset / 8 in 10-15 and the
  // CFA offset in 16-31. Other rules store their index (bits 2-17).
  static constexpr uint64_t kSlotValid = 1;
  static constexpr uint64_t kSlotPacked = 2;
  static bool Packable(uint64_t w) {
    const int64_t cfa = RuleCfaOffset(w);
    const int64_t fp = RuleFpOffset(w);
    return RuleRaOffset(w) == -8 && cfa >= -32768 && cfa <= 32767 &&
           fp % 8 == 0 && fp >= -256 && fp <= 248 && w != 0;
  }
  static uint64_t MakeSlot(uint32_t key, uint16_t index, uint64_t w) {
    const uint64_t slot = (uint64_t{key} << 32) | kSlotValid;
    if (!Packable(w)) return slot | (uint64_t{index} << 2);
    const int64_t cfa = RuleCfaOffset(w);
    const int64_t fp = RuleFpOffset(w);
    return slot | kSlotPacked | (uint64_t{RuleKind(w)} << 2) |
           (uint64_t{RuleFlags(w)} << 5) |
           ((static_cast<uint64_t>(fp / 8) & 63) << 10) |
           (uint64_t{static_cast<uint16_t>(cfa)} << 16);
  }

  // FindStep's cache miss (or unpacked entry): searches, fills the slot.
  [[gnu::noinline]] uint64_t FindSlow(uint32_t key, uint64_t cached,
                                      std::atomic<uint64_t>* slot) const noexcept {
    if (direct_ != nullptr) return FindDirectSlow(key, slot);
    if ((cached >> 32) == key && (cached & kSlotValid) != 0) {
      return rules_[static_cast<uint16_t>(cached >> 2)];
    }
    const uint16_t index = row_rule_[SearchRow(key)];
    const uint64_t w = rules_[index];
    slot->store(MakeSlot(key, index, w), std::memory_order_relaxed);
    return w;
  }

  // A direct table's miss: from .eh_frame, cached when the rule packs
  // (only packed slots are ever stored: a direct table has no rules_).
  uint64_t FindDirectSlow(uint32_t key, std::atomic<uint64_t>* slot) const noexcept;

  // The row in force at `key` (< text size). Row 0 starts at 0 (the
  // constructor puts a kNone row there), so there always is one.
  size_t SearchRow(uint32_t key) const noexcept {
    const size_t bucket = key >> kBucketShift;
    size_t lo = bucket_row_[bucket];
    size_t hi = bucket + 1 < bucket_row_.size() ? bucket_row_[bucket + 1] + 1
                                                 : row_pc_.size();
    // Invariant: row_pc_[lo] <= key < row_pc_[hi] (or hi is the end).
    while (hi - lo > 1) {
      const size_t mid = lo + (hi - lo) / 2;
      if (row_pc_[mid] <= key) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    return lo;
  }

  // A coarse index: bucket_row_[b] is the last row starting at or before
  // b << kBucketShift, so a lookup searches only the rows of one bucket.
  // 256-byte buckets cost 4 bytes per 256 bytes of text (1.6%) and leave a
  // search a handful of probes (in the benchmark's own binary at most 33
  // rows, mostly under 8, share a bucket).
  static constexpr int kBucketShift = 8;

  uint64_t text_lo_ = 0;
  uint64_t text_size_ = 0;
  std::vector<uint32_t> row_pc_;     // sorted offsets from text_lo_
  std::vector<uint16_t> row_rule_;   // index into rules_
  std::vector<uint64_t> rules_;      // distinct rule words; [0] is kNone
  std::vector<uint32_t> bucket_row_;
  // Lookup cache (slot format: MakeSlot). One word per slot, so concurrent
  // handlers never see a torn entry; a lost update only costs a later
  // search. At least a quarter as many slots as rows, 64 to 4096.
  std::unique_ptr<std::atomic<uint64_t>[]> cache_;
  int cache_bits_ = 6;
  uint32_t cache_mask_ = 0;
  std::string path_;
  std::string build_id_;
  bool pending_ = false;
  mutable std::atomic<bool> wanted_{false};
  // Direct tables (PendingFromFile): the mapped file and its index.
  struct DirectIndex;
  struct DirectIndexDeleter {
    void operator()(DirectIndex* d) const noexcept;
  };
  std::unique_ptr<DirectIndex, DirectIndexDeleter> direct_;
  mutable std::atomic<uint64_t> direct_lookups_{0};
};

// All loaded modules' tables at their load addresses. Immutable after
// construction; Find is async-signal-safe.
class CfiSnapshot {
 public:
  struct Module {
    uintptr_t lo = 0;    // runtime address of the table's text_lo
    uintptr_t hi = 0;    // runtime end of its text
    const CfiModuleTable* table = nullptr;
  };

  CfiSnapshot() = default;
  // True while a build is under way: modules whose table is not built yet
  // hold a pending table (walks take frame-pointer steps there and are
  // counted, CfiGlobalState::walks_without_tables).
  bool partial = false;

  // `modules` need not be sorted; the tables are kept alive by the snapshot.
  // A table without rows still marks its range as a module's text.
  CfiSnapshot(std::vector<std::pair<uintptr_t, std::shared_ptr<const CfiModuleTable>>>
                  modules,
              uint64_t generation = 0);

  // The rule for runtime `pc` (kind kNone: no CFI covers it). `hint`
  // caches the module of the previous lookup (consecutive frames are often
  // in one module); pass a pointer initialised to nullptr.
  // kCached = false bypasses the tables' lookup caches (benchmarks).
  template <bool kCached = true>
  [[gnu::always_inline]] CfiStep FindStep(uintptr_t pc,
                                          const Module** hint) const noexcept {
    const Module* m = FindModule(pc, hint);
    if (m == nullptr) return CfiStep();
    if constexpr (kCached) {
      return m->table->FindStep(pc - m->lo);
    } else {
      return StepFromWord(m->table->FindWordUncached(pc - m->lo));
    }
  }
  bool Find(uintptr_t pc, const Module** hint, CfiRule* rule) const noexcept {
    *rule = RuleFromStep(FindStep(pc, hint));
    return rule->kind != CfiRule::kNone;
  }

  // The module whose text holds `pc`, or nullptr; `hint` as for Find.
  // Between modules, a direct-mapped cache of 4 KiB pages (two modules'
  // text never share a page) usually saves the binary search.
  const Module* FindModule(uintptr_t pc, const Module** hint) const noexcept {
    const Module* m = *hint;
    if (m != nullptr && pc >= m->lo && pc < m->hi) return m;
    const uint64_t page = pc >> 12;
    std::atomic<uint64_t>& slot =
        page_cache_[(page * 0x9e3779b97f4a7c15ULL) >> (64 - kPageCacheBits)];
    const uint64_t cached = slot.load(std::memory_order_relaxed);
    if ((cached >> 16) == page && (cached & 0xffff) != 0) {
      m = &modules_[(cached & 0xffff) - 1];
      if (pc < m->lo || pc >= m->hi) return nullptr;
      *hint = m;
      return m;
    }
    size_t lo = 0, hi = modules_.size();
    while (lo < hi) {  // first module with lo > pc
      const size_t mid = lo + (hi - lo) / 2;
      if (modules_[mid].lo <= pc) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    if (lo == 0) return nullptr;
    m = &modules_[lo - 1];
    if (pc >= m->hi) return nullptr;
    if (lo < 0xffff) {
      slot.store((page << 16) | lo, std::memory_order_relaxed);
    }
    *hint = m;
    return m;
  }

  // True if `pc` lies in a loaded module's text (with or without CFI).
  bool InModule(uintptr_t pc) const noexcept {
    const Module* hint = nullptr;
    return FindModule(pc, &hint) != nullptr;
  }

  std::span<const Module> modules() const { return modules_; }
  uint64_t generation() const { return generation_; }

 private:
  static constexpr int kPageCacheBits = 8;
  std::vector<Module> modules_;  // sorted by lo, non-overlapping
  // Slots: page << 16 | (module index + 1); 0: empty.
  std::unique_ptr<std::atomic<uint64_t>[]> page_cache_ =
      std::make_unique<std::atomic<uint64_t>[]>(size_t{1} << kPageCacheBits);
  std::vector<std::shared_ptr<const CfiModuleTable>> owned_;
  uint64_t generation_ = 0;
};

// Builds the table of the ELF file at `path` (opened read-only; for the
// main program pass "/proc/self/exe"). `text_lo`/`text_hi`: the link-time
// range of its executable segments. Fails when the file cannot be read or
// has no usable CFI. When `expected_build_id` is not empty the file's
// GNU build-id must equal it (a file replaced on disk is refused).
// A table build that `progress` interrupted: the FDEs found and the rows
// built so far, so that the next build of the same file resumes where this
// one stopped instead of starting over (a profiler started and stopped
// every few milliseconds would otherwise never finish a large table, and
// each Stop would pay for a build's start again). Empty until a build is
// interrupted; a finished build empties it.
class CfiPartialBuild {
 public:
  CfiPartialBuild();
  ~CfiPartialBuild();
  CfiPartialBuild(const CfiPartialBuild&) = delete;
  CfiPartialBuild& operator=(const CfiPartialBuild&) = delete;
  bool empty() const { return state_ == nullptr; }
  // FDEs processed so far, of how many (0/0 when empty).
  size_t fdes_done() const;
  size_t fdes_total() const;

  struct State;  // cfi_table_libdw.cc
  std::unique_ptr<State> state_;
};

// Which interpreter turns an FDE's program into rows.
//  - kOwn (the default): the builder's own single pass over each .eh_frame
//    FDE's instructions (x86-64 files), which covers what compilers emit;
//    whatever it does not model (CFA and register expressions, DW_CFA_set_loc,
//    malformed programs, FDEs that overlap, .debug_frame, other machines)
//    goes to libdw, FDE by FDE.
//  - kLibdw: libdw for every FDE: dwarf_cfi_addrframe once per row, each
//    call re-running the FDE's program from its start, so an FDE of n rows
//    costs O(n^2) — 25 ms of a short profiled run's CPU went there. The
//    reference that the tests and the fuzzer compare kOwn with, row for row.
enum class CfiInterpreter : uint8_t { kOwn, kLibdw };
struct CfiBuildOptions {
  CfiInterpreter interpreter = CfiInterpreter::kOwn;
  // When set, incremented by the FDEs each interpreter turned into rows.
  size_t* fdes_own = nullptr;
  size_t* fdes_libdw = nullptr;
};

// `progress` is called every 64 FDEs (a large library has tens of
// thousands, and under a sanitizer a table takes a second): returning false
// abandons the build with a Cancelled status. With `partial`, an abandoned
// build leaves its work there and a build given the same `partial` (for the
// same file and range) resumes it.
absl::StatusOr<std::shared_ptr<const CfiModuleTable>> BuildCfiTableFromFile(
    const std::string& path, uint64_t text_lo, uint64_t text_hi,
    const std::string& expected_build_id = "",
    absl::FunctionRef<bool()> progress = [] { return true; },
    CfiPartialBuild* partial = nullptr, const CfiBuildOptions& options = {});

// The same from an ELF image in memory (the vDSO); the bytes are copied.
absl::StatusOr<std::shared_ptr<const CfiModuleTable>> BuildCfiTableFromImage(
    std::span<const uint8_t> image, const std::string& name, uint64_t text_lo,
    uint64_t text_hi, absl::FunctionRef<bool()> progress = [] { return true; },
    CfiPartialBuild* partial = nullptr, const CfiBuildOptions& options = {});

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_CFI_TABLE_H_
