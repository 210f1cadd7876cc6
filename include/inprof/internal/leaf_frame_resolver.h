// internal: not part of the public API.
//
// Recovers the caller of a frameless leaf, off the hot path.
//
// A frame-pointer walk starts at the interrupted pc and follows rbp. When the
// interrupted function has no frame record of its own (GCC 12 emits none for
// leaf functions that do not touch the stack, even with
// -mno-omit-leaf-frame-pointer; libc's hand-written routines; any function
// interrupted in its prologue or epilogue), rbp is still the caller's frame,
// so the walk skips the caller. The return address is then on the stack at
// [sp + CFA offset - 8]. The signal handler copies the first words at sp
// (cheap, bounded); the collector asks this resolver, once per distinct leaf
// pc, where the module's call-frame information (.eh_frame, read with
// elfutils libdwfl) puts the CFA at that pc, and inserts the word that holds
// the return address.
//
// Thread-safety: not thread-safe; the collector uses it under the registry
// lock. Never call it from a signal handler.
#ifndef INPROF_INTERNAL_LEAF_FRAME_RESOLVER_H_
#define INPROF_INTERNAL_LEAF_FRAME_RESOLVER_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "inprof/base/growth_safe_table.h"

namespace inprof::internal {

class LeafFrameResolver {
 public:
  // Words at the interrupted sp the handler copies: enough for a CFA up to
  // sp + 64 (return address plus up to seven pushes or 56 bytes of locals).
  static constexpr size_t kStackWords = 8;

  LeafFrameResolver();
  ~LeafFrameResolver();
  LeafFrameResolver(const LeafFrameResolver&) = delete;
  LeafFrameResolver& operator=(const LeafFrameResolver&) = delete;

  // Index into the words at sp that holds the leaf's return address, or -1
  // when the leaf has its own frame record (CFA based on rbp) or nothing is
  // known. Cached per pc.
  int ReturnAddressSlot(uint64_t pc);

  // True if `address` lies in a loaded module's text (checks a candidate
  // return address before it is inserted).
  bool InModule(uint64_t address);

  // Re-reads the module list if modules were loaded or unloaded. Cheap
  // otherwise (compares dl_iterate_phdr's adds/subs counters).
  void Refresh();

  size_t cached_pcs() const { return slots_.size(); }

 private:
  struct Session;
  std::unique_ptr<Session> session_;
  GrowthSafeMap<uint64_t, int8_t> slots_;  // growth_safe_table.h
  unsigned long long adds_ = 0, subs_ = 0;
};

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_LEAF_FRAME_RESOLVER_H_
