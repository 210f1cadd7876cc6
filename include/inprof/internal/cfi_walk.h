// internal: not part of the public API.
//
// The async-signal-safe walk over the call-frame tables of cfi_table.h: the
// snapshot the signal handler reads (g_cfi_state) and the guard that pins it
// for one walk, the checked stack reads, and CfiWalk, which turns an
// interrupted context into its return addresses.
//
// Thread-safety: CfiReadGuard, ReadStackWord, GuessFrameRecord and CfiWalk
// are async-signal-safe (no allocation, no locks, no syscalls; memory reads
// only inside the given StackBounds and at or above the interrupted stack
// pointer).
#ifndef INPROF_INTERNAL_CFI_WALK_H_
#define INPROF_INTERNAL_CFI_WALK_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>

#include "inprof/internal/cfi_table.h"
#include "inprof/internal/machine_context.h"
#include "inprof/unwinder.h"

namespace inprof::internal {

// The snapshot the signal handler reads, and the count of handlers reading
// one: a snapshot replaced by a newer one is freed only once the count has
// been seen at zero after the replacement (see dwarf_unwinder_linux.cc).
struct CfiGlobalState {
  alignas(64) std::atomic<uint64_t> readers{0};
  alignas(64) std::atomic<const CfiSnapshot*> current{nullptr};
  // Walks that found no snapshot yet (the tables are built on the
  // collector thread after Start) or met a module whose table was not built
  // yet (CfiModuleTable::pending) and took frame-pointer steps there.
  alignas(64) std::atomic<uint64_t> walks_without_tables{0};
  // Frames a pending table answered from .eh_frame (cache misses only).
  std::atomic<uint64_t> direct_lookups{0};
};
extern CfiGlobalState g_cfi_state;

// Pins the current snapshot for the duration of one walk.
// Async-signal-safe: two atomic read-modify-writes and one load.
class CfiReadGuard {
 public:
  CfiReadGuard() noexcept {
    g_cfi_state.readers.fetch_add(1, std::memory_order_seq_cst);
    snapshot_ = g_cfi_state.current.load(std::memory_order_seq_cst);
  }
  ~CfiReadGuard() { g_cfi_state.readers.fetch_sub(1, std::memory_order_release); }
  CfiReadGuard(const CfiReadGuard&) = delete;
  CfiReadGuard& operator=(const CfiReadGuard&) = delete;
  const CfiSnapshot* snapshot() const noexcept { return snapshot_; }

 private:
  const CfiSnapshot* snapshot_;
};

// Reads the word at `address` if it is 8-byte aligned (x86-64 keeps rsp,
// and so every CFA and register save slot, 8-byte aligned: anything else is
// a bad rule or a corrupt stack), lies inside `bounds` and at or above
// `floor` (the current frame's stack pointer: memory below it may be an
// unmapped part of a growable stack). Reading other frames' slots is the
// point, so AddressSanitizer (whose redzones they may be) is told so.
// `copy_delta`: the word is read at address + copy_delta (a walk of a copy
// of another thread's stack, DwarfUnwinder::UnwindCopy; `bounds` are then
// the copied range's real addresses).
__attribute__((no_sanitize_address)) inline bool ReadStackWord(
    const StackBounds& bounds, uintptr_t floor, uintptr_t address,
    uintptr_t* value, uintptr_t copy_delta = 0) noexcept {
  if ((address & 7) != 0 || address < floor ||
      !bounds.Contains(address, sizeof(uintptr_t))) {
    return false;
  }
  *value = *reinterpret_cast<const uintptr_t*>(address + copy_delta);
  return true;
}

// For a walk of a copy of a thread stopped in a system call, whose rbp is
// not known (UnwindCopy): the frame record of the first frame that keeps
// its CFA in rbp (code built with frame pointers), which holds its caller's
// rbp and return address. Every 8-byte-aligned pair in [sp, bounds.hi) that
// could be a record (the saved rbp 0 or a stack address above it, the
// return address in a module and covered by CFI) is a candidate. The
// records above the frame's own are each pointed to by the one below;
// nothing in memory points to the innermost one (its address is only in
// rbp), so it is a head: a candidate no other candidate points to. So are
// a stale record left in an uninitialised local and a (frame, pc) pair a
// function keeps (the sanitizers' interceptors do, below their own record),
// and so are the slots where code without frame pointers pushed rbp first
// (it holds 0 in a new thread until a frame-pointer function sets it). The
// answer is the lowest candidate, when it is the only head whose saved rbp
// is not 0 or, when no head has one, when it saved 0 (a frame-pointer frame
// whose callers all kept none). Anything else is ambiguous: no answer, and
// the walk ends truncated (the wall sampler then signals the thread). The
// caller keeps only walks that end complete at the thread's entry. Never
// used by a signal handler's walk; not inlined into CfiWalk, so its arrays
// stay off the handler's stack.
template <bool kCached>
__attribute__((noinline)) inline bool GuessFrameRecord(
    const CfiSnapshot* snapshot, const StackBounds& bounds, uintptr_t sp,
    uintptr_t copy_delta, uintptr_t* record) noexcept {
  constexpr size_t kMaxCandidates = 128;
  uintptr_t at[kMaxCandidates];
  uintptr_t saved[kMaxCandidates];
  size_t n = 0;
  for (uintptr_t r = (sp + 7) & ~uintptr_t{7}; r + 16 <= bounds.hi; r += 8) {
    uintptr_t saved_fp = 0, ra = 0;
    if (!ReadStackWord(bounds, sp, r, &saved_fp, copy_delta)) return false;
    if (saved_fp != 0 && (saved_fp <= r || saved_fp >= bounds.hi || (saved_fp & 7) != 0)) {
      continue;
    }
    if (!ReadStackWord(bounds, sp, r + 8, &ra, copy_delta) || ra == 0 ||
        !snapshot->InModule(ra)) {
      continue;
    }
    const CfiSnapshot::Module* hint = nullptr;
    const unsigned kind = snapshot->template FindStep<kCached>(ra - 1, &hint).kind;
    if (kind == CfiRule::kNone || kind == CfiRule::kUnsupported) continue;
    if (n == kMaxCandidates) return false;
    at[n] = r;
    saved[n] = saved_fp;
    ++n;
  }
  if (n == 0) return false;
  size_t linked_heads = 0;  // heads whose saved rbp is not 0
  bool lowest_is_head = true;
  for (size_t i = 0; i < n; ++i) {
    bool pointed_to = false;
    for (size_t j = 0; j < n && !pointed_to; ++j) pointed_to = saved[j] == at[i];
    if (i == 0) lowest_is_head = !pointed_to;
    if (!pointed_to && saved[i] != 0) ++linked_heads;
  }
  // at[0] is the lowest candidate.
  if (!lowest_is_head) return false;
  if (linked_heads > 1) return false;
  if (linked_heads == 1 && saved[0] == 0) return false;  // the linked one is above
  *record = at[0];
  return true;
}

// Walks the stack from `regs` with the rules of `snapshot` (null: frame
// pointers only). Writes the pc, then return addresses; stops complete at a
// frame whose CFI marks the return address undefined (thread entry, _start)
// or at a zero return address; stops truncated at a pc without CFI where a
// frame-pointer step is not possible either, at a CFA that does not
// increase, at a read outside the stack, at a frame-pointer step whose
// return address lies in no loaded module, or when `out` is full.
// Async-signal-safe; never faults whatever the stack and rules hold.
// kCached = false bypasses the tables' lookup caches (benchmarks).
// `copy_delta` (see ReadStackWord) walks a copy of the stack; with
// `fp_known` false the walk starts without the frame pointer's value (a
// thread stopped in a system call, whose registers other than sp and pc
// are not known): a frame whose CFA is based on it ends the walk truncated
// unless a callee's save slot gave it.
template <bool kCached = true>
inline UnwindResult CfiWalk(const CfiSnapshot* snapshot,
                            const RegisterState& regs,
                            const StackBounds& stack,
                            std::span<uintptr_t> out,
                            uintptr_t copy_delta = 0,
                            bool fp_known_at_start = true) noexcept {
  UnwindResult result;
  if (out.empty()) return result;
  out[result.depth++] = regs.pc;
  result.provisional = snapshot == nullptr;  // frame pointers only
  if constexpr (!kCfiWalkSupported) {
    result.truncated = true;
    return result;
  }
  // Locals: stores into `out` may alias anything of type uintptr_t, so
  // the compiler would otherwise reload these on every frame.
  const StackBounds bounds{stack.lo, stack.hi};
  uintptr_t pc = regs.pc;
  uintptr_t sp = regs.sp;
  uintptr_t fp = regs.fp;
  bool fp_known = fp_known_at_start;
  bool fp_guessed = false;  // see kCfaFp
  bool exact_pc = true;  // pc is not a return address: look it up as is
  const CfiSnapshot::Module* hint = nullptr;
  // Counts the walk once if it met a module without its table yet.
  struct PendingMet {
    bool met = false;
    ~PendingMet() {
      if (met) g_cfi_state.walks_without_tables.fetch_add(1, std::memory_order_relaxed);
    }
  } pending_met;
  while (true) {
    const CfiStep rule =
        snapshot != nullptr
            ? snapshot->template FindStep<kCached>(exact_pc ? pc : pc - 1, &hint)
            : CfiStep();
    const unsigned kind = rule.kind;
    uintptr_t cfa = 0;
    uintptr_t return_address = 0;
    uintptr_t next_fp = fp;
    bool next_fp_known = fp_known;
    bool next_exact = false;
    if (kind == CfiRule::kNone || kind == CfiRule::kUnsupported) {
      const uintptr_t looked_up = exact_pc ? pc : pc - 1;
      if (hint != nullptr && hint->table->pending() && looked_up >= hint->lo &&
          looked_up < hint->hi) {
        hint->table->MarkWanted();
        pending_met.met = true;
        result.provisional = true;
      }
      // No usable CFI: one frame-pointer step, as FramePointerUnwinder
      // would take it, if rbp looks like a frame record above sp.
      if (!fp_known || (fp & 7) != 0 ||
          !ReadStackWord(bounds, sp, fp, &next_fp, copy_delta) ||
          !ReadStackWord(bounds, sp, fp + sizeof(uintptr_t), &return_address, copy_delta)) {
        result.truncated = true;
        return result;
      }
      // Without CFI to vouch for it, a return address must at least point
      // into a loaded module; anything else is a stale or foreign word.
      if (snapshot != nullptr && !snapshot->InModule(return_address) &&
          return_address != 0) {
        result.truncated = true;
        return result;
      }
      cfa = fp + 2 * sizeof(uintptr_t);
      next_fp_known = true;
    } else {
      const intptr_t cfa_offset = rule.cfa_offset;
      switch (kind) {
        case CfiRule::kOutermost:
          return result;
        case CfiRule::kCfaSp:
          cfa = sp + cfa_offset;
          break;
        case CfiRule::kCfaFp:
          if (!fp_known && !fp_known_at_start && !fp_guessed &&
              snapshot != nullptr) {
            // A walk of a stopped thread's stack copy (UnwindCopy), whose
            // rbp nobody read: see GuessFrameRecord. Callers' rbp come from
            // their save slots as usual.
            fp_guessed = true;
            uintptr_t record = 0;
            if (GuessFrameRecord<kCached>(snapshot, bounds, sp, copy_delta, &record)) {
              fp = record + 16 - cfa_offset;  // the record sits at CFA - 16
              fp_known = true;
            }
          }
          if (!fp_known) {
            result.truncated = true;
            return result;
          }
          cfa = fp + cfa_offset;
          break;
        case CfiRule::kCfaDerefSp:
          if (!ReadStackWord(bounds, sp, sp + cfa_offset, &cfa, copy_delta)) {
            result.truncated = true;
            return result;
          }
          break;
        default:
          result.truncated = true;
          return result;
      }
      const unsigned flags = rule.flags;
      const uintptr_t ra_base = (flags & CfiRule::kRaFromSp) ? sp : cfa;
      if (!ReadStackWord(bounds, sp, ra_base + rule.ra_offset,
                         &return_address, copy_delta)) {
        result.truncated = true;
        return result;
      }
      if (flags & CfiRule::kFpSaved) {
        const uintptr_t fp_base = (flags & CfiRule::kFpFromSp) ? sp : cfa;
        const uintptr_t slot = fp_base + rule.fp_offset;
        if (slot < sp && exact_pc) {
          // Interrupted between `pop %rbp` and `ret`: GCC's CFI still names
          // the save slot, now below sp, but rbp already holds the caller's
          // value (bench/overhead found 0.3-1% of stacks cut here).
          next_fp = fp;
          next_fp_known = fp_known;
        } else if (!ReadStackWord(bounds, sp, slot, &next_fp, copy_delta)) {
          result.truncated = true;
          return result;
        } else {
          next_fp_known = true;
        }
      } else if (flags & CfiRule::kFpLost) {
        next_fp_known = false;
      }
      next_exact = (flags & CfiRule::kSignalFrame) != 0;
    }
    // The caller's frame lies strictly above this one: a cycle, a
    // downward CFA or a CFA off the stack ends the walk.
    if (cfa <= sp || cfa > bounds.hi) {
      result.truncated = true;
      return result;
    }
    if (return_address == 0) return result;  // thread-entry convention
    if (result.depth == out.size()) {
      result.truncated = true;
      return result;
    }
    out[result.depth++] = return_address;
    pc = return_address;
    sp = cfa;
    fp = next_fp;
    fp_known = next_fp_known;
    exact_pc = next_exact;
  }
}

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_CFI_WALK_H_
