// internal: not part of the public API.
//
// Finds the GOT slots through which one loaded ELF object calls the
// allocation functions AllocHooks intercepts (and the lock functions
// LockHooks does, through the same slots and the same patching): its
// DT_JMPREL and DT_RELA relocations of type JUMP_SLOT or GLOB_DAT
// (x86-64, aarch64) whose symbol is one of kAllocSymbolNames. Every read
// of the object's memory (dynamic section, relocation tables, symbols,
// names) and every slot found is bounds-checked against the object's
// PT_LOAD segments, so a malformed object yields an error, never a fault.
//
// Thread-safety: reads only. The object must stay mapped while it runs
// (call it from a dl_iterate_phdr callback, which holds the loader's lock).
//
// Example:
//   dl_iterate_phdr([](dl_phdr_info* info, size_t, void*) {
//     std::vector<GotSlot> slots;
//     absl::Status s = ScanGotSlots(ObjectImageOf(*info), &slots);
//     ...
//   }, nullptr);
#ifndef INPROF_ALLOC_GOT_SCAN_H_
#define INPROF_ALLOC_GOT_SCAN_H_

#include <link.h>

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace inprof::internal {

// The intercepted symbols, by index (AllocSymbol): the allocation
// functions, dlopen, and the lock functions. Mangled names for the
// operators (x86-64 and aarch64 both have size_t = unsigned long, "m").
enum AllocSymbol : int {
  kSymMalloc, kSymFree, kSymCalloc, kSymRealloc, kSymReallocarray,
  kSymPosixMemalign, kSymAlignedAlloc, kSymMemalign, kSymValloc, kSymPvalloc,
  kSymFreeSized, kSymFreeAlignedSized,  // C23, where libc has them (glibc 2.40)
  kSymNew, kSymNewArray, kSymNewNothrow, kSymNewArrayNothrow,
  kSymNewAligned, kSymNewArrayAligned, kSymNewAlignedNothrow, kSymNewArrayAlignedNothrow,
  kSymDelete, kSymDeleteArray, kSymDeleteSized, kSymDeleteArraySized,
  kSymDeleteAligned, kSymDeleteArrayAligned, kSymDeleteSizedAligned,
  kSymDeleteArraySizedAligned, kSymDeleteNothrow, kSymDeleteArrayNothrow,
  kSymDeleteAlignedNothrow, kSymDeleteArrayAlignedNothrow,
  kSymDlopen, kSymDlmopen,
  // The lock functions (lock_hooks.h), patched only while lock waits are
  // profiled; the entries from kSymMutexLock on.
  kSymMutexLock, kSymMutexTimedlock, kSymMutexClocklock,
  kSymRwlockRdlock, kSymRwlockWrlock, kSymRwlockTimedrdlock, kSymRwlockTimedwrlock,
  kSymRwlockClockrdlock, kSymRwlockClockwrlock,
  kAllocSymbolCount
};
extern const char* const kAllocSymbolNames[kAllocSymbolCount];

// The index of `name`, or -1 when it is not intercepted.
int AllocSymbolIndex(std::string_view name);

// One loaded object, as dl_iterate_phdr describes it.
struct ObjectImage {
  uintptr_t base = 0;  // dlpi_addr: load bias
  const ElfW(Phdr)* phdrs = nullptr;
  size_t phnum = 0;
  const char* name = "";  // dlpi_name; "" for the main program
};
inline ObjectImage ObjectImageOf(const dl_phdr_info& info) {
  return {info.dlpi_addr, info.dlpi_phdr, info.dlpi_phnum,
          info.dlpi_name != nullptr ? info.dlpi_name : ""};
}

// A GOT slot that holds the address of one intercepted symbol.
struct GotSlot {
  uintptr_t address = 0;  // of the 8-byte slot, inside a PT_LOAD segment
  AllocSymbol symbol = kSymMalloc;
  // The protection of the slot's page as the loader left it: PROT_READ
  // inside PT_GNU_RELRO's protected pages, else its segment's flags.
  int prot = 0;
  // The symbol's value in this object's dynamic symbol table (non-zero
  // for an undefined symbol only in a non-PIE executable that takes its
  // address: then base + value is the object's own PLT entry).
  uintptr_t symbol_value = 0;
  // The symbol's value when this object defines it itself (libc its
  // malloc, a library its own allocator): base + value is that definition.
  uintptr_t own_definition = 0;
};

// Appends `image`'s slots for the intercepted symbols to `*slots`. An
// object without a dynamic section, or without such relocations (the
// vdso), has none: OK. InvalidArgument naming the object and what was
// wrong when its dynamic data lies outside its segments or contradicts
// itself; then `*slots` is unchanged.
absl::Status ScanGotSlots(const ObjectImage& image, std::vector<GotSlot>* slots);

// Whether [address, address + size) lies inside one of `image`'s PT_LOAD
// segments.
bool ImageContains(const ObjectImage& image, uintptr_t address, size_t size);

// The object's dynamic section's address in memory, or 0 if it has none.
uintptr_t DynamicAddress(const ObjectImage& image);

// Whether allocations can be intercepted in a process whose main program
// is `main_program` and whose global malloc is at `global_malloc` (0: none
// found): Unimplemented, one line saying why, for a static executable (no
// dynamic section, or no dynamic malloc: its allocation calls go through no
// GOT slot).
absl::Status CheckInterceptable(const ObjectImage& main_program, uintptr_t global_malloc);

}  // namespace inprof::internal

#endif  // INPROF_ALLOC_GOT_SCAN_H_
