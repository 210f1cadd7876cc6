// internal: not part of the public API (phase 1 of the allocation profiler,
// docs/allocations_plan.md; not yet wired into Profiler).
//
// AllocHooks: intercepts the process's allocation calls by rewriting the
// GOT slots that loaded objects call them through (R_X86_64_JUMP_SLOT and
// R_X86_64_GLOB_DAT relocations, or aarch64's) to point at inprof's
// wrappers: malloc, free, calloc, realloc, reallocarray, posix_memalign,
// aligned_alloc, memalign, valloc, pvalloc, free_sized and
// free_aligned_sized (C23, where libc has them), every operator new and delete,
// and dlopen/dlmopen, so that an object loaded later is patched before
// dlopen returns. Each wrapper calls the original function (resolved per
// symbol, never through a GOT slot, so never itself), then lets
// ShouldSampleAlloc decide; a sampled block is recorded in the
// LiveHeapTable (if one is given) and passed to the callback. free and the
// deletes erase their block from the table before the original frees it.
//
// One installation per process (the GOT is the process's). Objects in a
// link-map namespace other than inprof's (dlmopen; dl_iterate_phdr does not
// list them) and slots already bound to another definition than the global one (RTLD_DEEPBIND, an
// object's own allocator) are left alone: they would otherwise free through
// one allocator what another allocated. Malformed dynamic sections are
// bounds-checked against the object's PT_LOAD segments and skipped with one
// log line naming the object. The host keeps running in every case.
//
// inprof's own object (the program that links libinprof_alloc.a) is patched
// like any other: it is the host, whose allocations are what is profiled.
// The wrappers never call through a slot, so they never reach themselves;
// inprof's own allocations on the sampled path and in the hooks'
// bookkeeping run under an AllocGuard and are never sampled.
//
// dlopen through the wrapper: glibc resolves a relative name with the
// *caller's* DT_RUNPATH, and the caller is now the wrapper's object, so a
// library that dlopen()s a sibling by bare name through its own
// RUNPATH=$ORIGIN finds it only if the program's search path does too
// (known limitation; ddprof's and async-profiler's dlopen hooks share it).
//
// What cannot be seen: calls an object binds without a slot (libc's own
// internal calls that do not go through its PLT, -Bsymbolic, static
// linking), and function pointers taken before Install.
//
// Thread-safety: Install, Uninstall and the dlopen wrapper serialize on a
// mutex. The wrappers are lock-free (the sampled path excepted: it runs the
// callback). Uninstall does not wait for threads inside a wrapper: the
// callback's context and the table must outlive every call that may have
// started before Uninstall returned (a later phase owns them for the
// process's lifetime).
//
// Example:
//   LiveHeapTable live(1 << 16);
//   AllocHooks::Options options;
//   options.mean_bytes = 512 * 1024;
//   options.live = &live;
//   options.callback = [](void* ctx, const AllocSample& s) -> uint64_t { ...; return 0; };
//   if (absl::Status s = AllocHooks::Install(options); !s.ok()) Log(s.message());
//   ...
//   AllocHooks::Uninstall();
#ifndef INPROF_ALLOC_ALLOC_HOOKS_H_
#define INPROF_ALLOC_ALLOC_HOOKS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "inprof/alloc/live_heap_table.h"

namespace inprof::internal {

// One sampled allocation, as the callback sees it.
struct AllocSample {
  void* address;
  size_t size;            // the size asked for (nmemb * size for calloc)
  double weight_objects;  // what it stands for: 1/p objects
  double weight_bytes;    // and size/p bytes
  // The wrapper's return address: the instruction after the call in the
  // code that allocated (operator new's caller, not the allocator inside
  // it), where a stack walked on the sampled path is cut.
  uintptr_t caller;
};

// A callback's answer for a block the live table must not keep (an
// allocation of inprof's own threads, or one the profiler does not want).
inline constexpr uint64_t kAllocUntracked = ~uint64_t{0};

// Called on the sampled path, on the allocating thread, after the
// allocation and before the wrapper returns; allocations it makes are not
// sampled. The value it returns is kept with the block's live entry
// (AllocationProvider: the id of the stack it recorded); kAllocUntracked
// keeps the block out of the table.
using AllocSampleCallback = uint64_t (*)(void* context, const AllocSample& sample);

class AllocHooks {
 public:
  struct Options {
    // The countdown's mean in bytes (SetAllocSamplingMean); 0: no sampling,
    // the wrappers only forward.
    uint64_t mean_bytes = 512 * 1024;
    AllocSampleCallback callback = nullptr;
    void* context = nullptr;
    // Where sampled blocks are kept until freed (null: not kept).
    LiveHeapTable* live = nullptr;
    // Which objects to patch, by path ("" is the main program); null: all.
    // For tests, and for a host that limits interception to some libraries.
    bool (*object_filter)(const char* path) = nullptr;
    // The function each wrapper calls for a symbol (its mangled name); null
    // means dlsym(RTLD_DEFAULT, name), the definition the dynamic linker
    // binds. Tests pass counting stand-ins. A null result leaves that
    // symbol's slots alone.
    void* (*resolve)(const char* symbol) = nullptr;
  };

  // The hook counters (process-wide, since the first Install).
  struct Stats {
    uint64_t slots_patched = 0;   // slots written with a wrapper, in all
    uint64_t slots_restored = 0;  // slots written back
    uint64_t slots_skipped = 0;   // bound elsewhere, other namespace, no original
    uint64_t objects_failed = 0;  // objects skipped for malformed data or mprotect
    uint64_t samples = 0;         // allocations sampled
  };

  // Whether this platform has GOT patching (Linux x86-64 and aarch64).
  static bool Supported();

  // Sets the mean and callback, patches every loaded object's slots and
  // starts patching objects dlopen loads. FailedPrecondition when already
  // installed by this process; in a forked child whose parent had
  // installed them, takes that installation over (the slots are patched;
  // the new mean, callback and table apply). Unimplemented where
  // !Supported(). A failure on one object is logged and skipped, not
  // returned. Not from a signal handler.
  static absl::Status Install(const Options& options);

  // Writes every saved original back into the slots of the objects still
  // loaded, sets the mean to 0 and forgets the callback and table. No-op
  // when not installed.
  static void Uninstall();

  static bool Installed();
  static Stats stats();

  // Calls `visit` with each slot address patched now and the original it
  // holds, for every object still loaded (tests compare GOT slots).
  static void ForEachPatchedSlot(void (*visit)(void* context, const char* symbol,
                                               uintptr_t slot, uintptr_t original),
                                 void* context);
};

}  // namespace inprof::internal

#endif  // INPROF_ALLOC_ALLOC_HOOKS_H_
