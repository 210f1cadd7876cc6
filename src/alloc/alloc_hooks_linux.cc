#include "inprof/alloc/alloc_hooks.h"

#include <dlfcn.h>
#include <link.h>
#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <vector>

#include "absl/strings/str_cat.h"
#include "inprof/alloc/alloc_sampler.h"
#include "inprof/alloc/got_scan.h"
#include "inprof/base/contained.h"
#include "inprof/base/fork_guard.h"
#include "inprof/base/growth_safe_table.h"
#include "inprof/base/log.h"
#include "inprof/base/sanitizers.h"
#include "src/alloc/alloc_wrappers.h"
#include "src/alloc/got_hooks.h"

namespace inprof::internal {

// What each wrapper calls: set once per symbol (null -> address), before
// any slot points at the wrapper, and never changed afterwards, so a
// wrapper that a thread entered before Uninstall still has its target.
std::atomic<void*> g_hook_real[kAllocSymbolCount];
std::atomic<AllocSampleCallback> g_callback{nullptr};
std::atomic<void*> g_context{nullptr};
std::atomic<LiveHeapTable*> g_live{nullptr};
// Whether the plain operators new and delete (throwing, nothrow, sized;
// not the aligned ones) are libstdc++'s, which are malloc and free (size 0
// as 1) with a new_handler loop on failure: then their wrappers call malloc
// and free themselves, one layer of hooks instead of three (new[] -> new ->
// malloc each through a patched slot: ~20 % of an allocation-heavy
// program's CPU). Any other definition (a replaced operator new, a
// sanitizer's) keeps the layered path.
std::atomic<bool> g_new_is_malloc{false};

std::atomic<uint64_t> g_slots_patched{0};
std::atomic<uint64_t> g_slots_restored{0};
std::atomic<uint64_t> g_slots_skipped{0};
std::atomic<uint64_t> g_objects_failed{0};
std::atomic<uint64_t> g_samples{0};

// alloc_wrappers.h.
__attribute__((noinline)) void RecordSample(void* address, size_t size, void* caller) {
  AllocGuard guard;
  g_samples.fetch_add(1, std::memory_order_relaxed);
  const AllocWeight weight = SampleWeight(size, ThreadSampleMean());
  uint64_t tag = 0;
  if (AllocSampleCallback callback = g_callback.load(std::memory_order_acquire)) {
    tag = callback(g_context.load(std::memory_order_relaxed),
                   AllocSample{address, size, weight.objects, weight.bytes,
                               reinterpret_cast<uintptr_t>(caller)});
  }
  if (tag == kAllocUntracked) return;
  if (LiveHeapTable* live = g_live.load(std::memory_order_acquire)) {
    live->Insert(address, {size, weight.objects, tag});
  }
}

namespace {


template <typename Fn>
Fn Real(AllocSymbol symbol) {
  return HookReal<Fn>(symbol);
}


// realloc is a free of the old block and an allocation of `size` bytes, as
// jemalloc, tcmalloc and Go account it: the old block leaves the live heap
// whatever its sampling (ReallocCommon took its entry), and the new size
// has its own chance of being sampled. A block kept with its old weight at
// its new size counted a buffer regrown k times about k + 1 times.
void AfterRealloc(void* old_address, bool had_entry, const LiveHeapTable::Entry& old_entry,
                  void* new_address, size_t size, void* caller) {
  if (new_address == nullptr) {
    // Failed (the old block is intact: its entry goes back) or realloc(p,
    // 0) freed it (glibc: nothing to put back).
    LiveHeapTable* live = g_live.load(std::memory_order_acquire);
    if (had_entry && size != 0 && live != nullptr) {
      AllocGuard guard;
      live->Insert(old_address, old_entry);
    }
    return;
  }
  if (__builtin_expect(ShouldSampleAlloc(size), 0)) RecordSample(new_address, size, caller);
}

void* ReallocCommon(AllocSymbol symbol, void* address, size_t nmemb, size_t size,
                    void* caller) {
  LiveHeapTable* live = g_live.load(std::memory_order_acquire);
  LiveHeapTable::Entry old_entry;
  const bool had_entry = address != nullptr && live != nullptr && live->Take(address, &old_entry);
  void* result;
  size_t bytes = 0;
  if (symbol == kSymRealloc) {
    result = Real<void* (*)(void*, size_t)>(kSymRealloc)(address, size);
    bytes = size;
  } else {
    // glibc's reallocarray calls realloc through libc's own (patched)
    // slot: that inner call runs under a guard and is neither sampled nor
    // counted, so the call counts once.
    AllocGuard nested;
    result = Real<void* (*)(void*, size_t, size_t)>(kSymReallocarray)(address, nmemb, size);
    if (__builtin_mul_overflow(nmemb, size, &bytes)) bytes = SIZE_MAX;
  }
  AfterRealloc(address, had_entry, old_entry, result, bytes, caller);
  return result;
}

void PatchLoadedObjects();

// The wrappers. Each calls its symbol's original, then samples.
extern "C" {
void* inprof_malloc(size_t size) { return Allocate<void* (*)(size_t)>(kSymMalloc, size, size); }
void inprof_free(void* p) {
  BeforeFree(p);
  Real<void (*)(void*)>(kSymFree)(p);
}
// C23's sized frees: a free like any other (a libc without them has no
// definition to bind, and their slots are left alone).
void inprof_free_sized(void* p, size_t size) {
  BeforeFree(p);
  Real<void (*)(void*, size_t)>(kSymFreeSized)(p, size);
}
void inprof_free_aligned_sized(void* p, size_t alignment, size_t size) {
  BeforeFree(p);
  Real<void (*)(void*, size_t, size_t)>(kSymFreeAlignedSized)(p, alignment, size);
}
void* inprof_calloc(size_t nmemb, size_t size) {
  size_t bytes;
  if (__builtin_mul_overflow(nmemb, size, &bytes)) bytes = 0;  // fails: nothing to count
  return Allocate<void* (*)(size_t, size_t)>(kSymCalloc, bytes, nmemb, size);
}
void* inprof_realloc(void* p, size_t size) {
  return ReallocCommon(kSymRealloc, p, 1, size, __builtin_return_address(0));
}
void* inprof_reallocarray(void* p, size_t nmemb, size_t size) {
  return ReallocCommon(kSymReallocarray, p, nmemb, size, __builtin_return_address(0));
}
int inprof_posix_memalign(void** out, size_t alignment, size_t size) {
  const auto real = Real<int (*)(void**, size_t, size_t)>(kSymPosixMemalign);
  if (__builtin_expect(!ShouldSampleAlloc(size), 1)) return real(out, alignment, size);
  const int rc = real(out, alignment, size);
  if (rc == 0) RecordSample(*out, size, __builtin_return_address(0));
  return rc;
}
void* inprof_aligned_alloc(size_t alignment, size_t size) {
  return Allocate<void* (*)(size_t, size_t)>(kSymAlignedAlloc, size, alignment, size);
}
void* inprof_memalign(size_t alignment, size_t size) {
  return Allocate<void* (*)(size_t, size_t)>(kSymMemalign, size, alignment, size);
}
void* inprof_valloc(size_t size) {
  return Allocate<void* (*)(size_t)>(kSymValloc, size, size);
}
void* inprof_pvalloc(size_t size) {
  return Allocate<void* (*)(size_t)>(kSymPvalloc, size, size);
}
// The host's dlopen: an exception (no memory for the patch's bookkeeping)
// never reaches its C caller; the new object's slots stay unpatched.
void* inprof_dlopen(const char* file, int mode) {
  void* handle = Real<void* (*)(const char*, int)>(kSymDlopen)(file, mode);
  if (handle != nullptr) RunContained("patching a dlopen()ed object's allocation slots", [] {
    PatchLoadedObjects();
  });
  return handle;
}
void* inprof_dlmopen(Lmid_t lmid, const char* file, int mode) {
  void* handle = Real<void* (*)(Lmid_t, const char*, int)>(kSymDlmopen)(lmid, file, mode);
  if (handle != nullptr) RunContained("patching a dlopen()ed object's allocation slots", [] {
    PatchLoadedObjects();
  });
  return handle;
}
}  // extern "C"


template <typename Fn>
uintptr_t Address(Fn* fn) {
  return reinterpret_cast<uintptr_t>(fn);
}

// The wrappers by symbol, in AllocSymbol's order. Made on first use, not
// by a dynamic initialiser: in the preload library (inprof run --alloc)
// the constructor that starts the profiler may run before this file's
// initialisers, and a table still zero wrote 0 into the slots it patched.
struct WrapperTable {
  uintptr_t at[kAllocSymbolCount];
};
const WrapperTable& Wrappers() {
  static const WrapperTable table = [] {
    WrapperTable t = {{
    Address(inprof_malloc), Address(inprof_free), Address(inprof_calloc),
    Address(inprof_realloc), Address(inprof_reallocarray), Address(inprof_posix_memalign),
    Address(inprof_aligned_alloc), Address(inprof_memalign), Address(inprof_valloc),
    Address(inprof_pvalloc),
    Address(inprof_free_sized), Address(inprof_free_aligned_sized),
    0, 0, 0, 0, 0, 0, 0, 0,  // the operators: below
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    Address(inprof_dlopen), Address(inprof_dlmopen),
    }};
    for (int i = kSymNew; i <= kSymDeleteArrayAlignedNothrow; ++i) {
      t.at[i] = OperatorWrapperAddress(static_cast<AllocSymbol>(i));
    }
    for (int i = kSymMutexLock; i < kAllocSymbolCount; ++i) {
      t.at[i] = LockWrapperAddress(static_cast<AllocSymbol>(i));
    }
    return t;
  }();
  return table;
}

bool IsWrapper(uintptr_t value) {
  const WrapperTable& w = Wrappers();
  return std::find(std::begin(w.at), std::end(w.at), value) != std::end(w.at);
}

// Install's state, under g_mu. A fork lock (base/fork_guard.h): a child
// forked while another thread patched an object dlopen() had just loaded
// would otherwise find it held forever, and its first Install or dlopen
// hung (39 of 40 children of a program that forks beside a dlopen loop).
// Leaf rank: Install and Uninstall run under a profiler's registry lock,
// and nothing registered is taken under this one (its allocations run
// under a guard, never reaching the provider's lock).
std::mutex g_mu;
[[maybe_unused]] const bool g_mu_registered =
    (RegisterForkLock(&g_mu, kForkRankLeaf), true);
struct HookState {
  bool installed = false;  // the allocation group
  pid_t installed_pid = 0;  // the process that installed (a forked child's parent)
  bool locks_installed = false;  // the lock group (lock_hooks.h)
  pid_t locks_pid = 0;
  AllocHooks::Options options;
  // Slot address -> the value it held before we wrote it.
  internal::ThrowSafeMap<uintptr_t, uintptr_t> saved;
  // Objects already logged about, so that each failure is one line.
  internal::ThrowSafeSet<std::string> logged;
  // What dlsym(RTLD_DEFAULT) gives per symbol: the definition the loader
  // binds a slot to (0: none yet).
  uintptr_t bound[kAllocSymbolCount] = {};
};
HookState& State() {
  static HookState* state = new HookState;  // never destroyed: wrappers outlive exit
  return *state;
}

std::string NameOf(const ObjectImage& image) {
  return image.name[0] != '\0' ? std::string(image.name) : std::string("the main program");
}

void LogOnce(HookState& state, const ObjectImage& image, const std::string& message) {
  if (state.logged.insert(absl::StrCat(NameOf(image), "\n", message)).second) {
    Log(absl::StrCat("alloc hooks: ", message));
  }
}

// Writes `value` into each slot, making its page writable for the write
// when the loader left it read-only (RELRO), and its protection as it was
// afterwards. False (and nothing more written) when mprotect fails to make
// a page writable; `warning` says when it failed to make one read-only again.
bool WriteSlots(const std::vector<std::pair<GotSlot, uintptr_t>>& writes, std::string* error,
                std::string* warning) {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  for (const auto& [slot, value] : writes) {
    void* const page_start = reinterpret_cast<void*>(slot.address & ~(page - 1));
    const bool read_only = (slot.prot & PROT_WRITE) == 0;
    if (read_only && mprotect(page_start, page, slot.prot | PROT_READ | PROT_WRITE) != 0) {
      *error = absl::StrCat("mprotect of its GOT page failed (errno ", errno, ")");
      return false;
    }
    // An aligned 8-byte store: a thread calling through the slot meanwhile
    // reads the old or the new target, both valid.
    __atomic_store_n(reinterpret_cast<uintptr_t*>(slot.address), value, __ATOMIC_RELEASE);
    if (read_only && mprotect(page_start, page, slot.prot) != 0 && warning->empty()) {
      // The write is done; the page stays writable (RELRO lost there).
      *warning = absl::StrCat("mprotect could not make its GOT page read-only again (errno ",
                              errno, "); it stays writable");
    }
  }
  return true;
}

enum class Mode { kPatch, kRestore };

// Whether `symbol`'s group is installed: its slots are patched by a walk
// and written back by a restoring one when it is not.
bool Active(const HookState& state, AllocSymbol symbol) {
  if (symbol >= kSymMutexLock) return state.locks_installed;
  if (symbol == kSymDlopen || symbol == kSymDlmopen) {
    return state.installed || state.locks_installed;
  }
  return state.installed;
}

#if defined(INPROF_TSAN)
// libc.so.6 (or libc.so), by the file's base name.
bool IsLibc(const char* path) {
  if (path == nullptr) return false;
  const char* base = std::strrchr(path, '/');
  base = base == nullptr ? path : base + 1;
  return std::strncmp(base, "libc.so", 7) == 0;
}
#endif

struct WalkContext {
  HookState* state;
  Mode mode;
};

// One object: patch its slots (kPatch) or write their originals back
// (kRestore). Runs inside dl_iterate_phdr: the object stays mapped.
void VisitObject(WalkContext& walk, const ObjectImage& image) {
  HookState& state = *walk.state;
  if (walk.mode == Mode::kPatch && state.options.object_filter != nullptr &&
      !state.options.object_filter(image.name)) {
    return;
  }
#if defined(INPROF_TSAN)
  // Under ThreadSanitizer the wrappers are instrumented, and glibc frees a
  // thread's own state through its slot for free() after TSan has torn the
  // thread down (__libc_thread_freeres): the instrumented wrapper crashed
  // in TSan's trace there. libc's own slots are left alone in such builds.
  if (walk.mode == Mode::kPatch && IsLibc(image.name)) return;
#endif
  std::vector<GotSlot> slots;
  if (absl::Status s = ScanGotSlots(image, &slots); !s.ok()) {
    if (walk.mode == Mode::kPatch) {
      g_objects_failed.fetch_add(1, std::memory_order_relaxed);
      LogOnce(state, image, std::string(s.message()));
    }
    return;
  }
  if (slots.empty()) return;
  std::vector<std::pair<GotSlot, uintptr_t>> writes;
  for (const GotSlot& slot : slots) {
    const uintptr_t current = *reinterpret_cast<const uintptr_t*>(slot.address);
    if (Active(state, slot.symbol) == (walk.mode == Mode::kRestore)) continue;
    if (walk.mode == Mode::kRestore) {
      auto it = state.saved.find(slot.address);
      if (it == state.saved.end()) continue;
      // Only a slot that still holds our wrapper: anything else was written
      // by someone after us (or the object is a new one at the same place).
      if (current == Wrappers().at[slot.symbol]) writes.push_back({slot, it->second});
      continue;
    }
    if (current == Wrappers().at[slot.symbol]) continue;  // done by an earlier pass
    const uintptr_t bound = state.bound[slot.symbol];
    // A slot that points into its own object is an unresolved PLT stub,
    // unless it points at the object's own definition of the symbol: then
    // the loader bound it there (RTLD_DEEPBIND, -Bsymbolic, a private
    // allocator), and if that is not the global definition, forwarding to
    // the global one would free through one allocator what another made.
    // (A slot of such an object still unresolved, loaded RTLD_LAZY, cannot
    // be told from one that binds globally: it is patched.)
    const bool own_bound =
        slot.own_definition != 0 && current == image.base + slot.own_definition;
    const bool lazy = ImageContains(image, current, 1) && !own_bound;
    const bool own_plt = slot.symbol_value != 0 && bound == image.base + slot.symbol_value;
    if (bound == 0 || g_hook_real[slot.symbol].load(std::memory_order_relaxed) == nullptr ||
        own_plt || (!lazy && current != bound) || IsWrapper(bound)) {
      // No definition to call, the definition is this object's own PLT entry
      // (a non-PIE executable: calling it would loop), or the slot is bound
      // to another definition than the global one (RTLD_DEEPBIND, a private
      // allocator): forwarding would mix allocators.
      g_slots_skipped.fetch_add(1, std::memory_order_relaxed);
      if (bound != 0 && !lazy && current != bound) {
        LogOnce(state, image,
                absl::StrCat(NameOf(image), ": ", kAllocSymbolNames[slot.symbol],
                             " is bound to another definition than the global one; "
                             "not intercepted there"));
      }
      continue;
    }
    writes.push_back({slot, Wrappers().at[slot.symbol]});
  }
  if (writes.empty()) return;
  // Save before writing: a wrapper never runs without its original known,
  // and Uninstall never misses a slot written here.
  if (walk.mode == Mode::kPatch) {
    for (const auto& [slot, value] : writes) {
      state.saved[slot.address] = *reinterpret_cast<const uintptr_t*>(slot.address);
    }
  }
  std::string error;
  std::string warning;
  const bool written = WriteSlots(writes, &error, &warning);
  if (!warning.empty()) LogOnce(state, image, absl::StrCat(NameOf(image), ": ", warning));
  if (!written) {
    g_objects_failed.fetch_add(1, std::memory_order_relaxed);
    LogOnce(state, image,
            absl::StrCat(NameOf(image), ": ", error,
                         walk.mode == Mode::kPatch ? "; some of its allocation calls are "
                                                     "not intercepted"
                                                   : "; some of its slots still point at "
                                                     "inprof's wrappers"));
  }
  // Count what is in the slots now (a failed mprotect wrote a prefix).
  for (const auto& [slot, value] : writes) {
    const bool written = *reinterpret_cast<const uintptr_t*>(slot.address) == value;
    if (!written) continue;
    if (walk.mode == Mode::kPatch) {
      g_slots_patched.fetch_add(1, std::memory_order_relaxed);
    } else {
      g_slots_restored.fetch_add(1, std::memory_order_relaxed);
      state.saved.erase(slot.address);
    }
  }
}

void Walk(HookState& state, Mode mode) {
  // The hooks' own allocations (the maps above, log lines) are not sampled.
  AllocGuard guard;
  WalkContext walk{&state, mode};
  // Only the caller's link-map namespace is listed: objects that dlmopen()
  // put in another one (with their own libc and allocator) are never
  // visited, which is what they need. An object whose visit throws (no
  // memory) ends the walk; the objects visited keep what was written.
  RunContained("patching allocation slots", [&] {
    ForEachLoadedObject([&](dl_phdr_info* info, size_t) {
      VisitObject(walk, ObjectImageOf(*info));
      return 0;
    });
  });
}

// What each symbol resolves to now. Outside g_mu: dlsym takes the
// loader's lock, which a thread inside dlopen (a library's constructor
// calling dlopen, then our wrapper, then g_mu) holds while it waits.
struct Resolution {
  uintptr_t bound[kAllocSymbolCount] = {};
  void* real[kAllocSymbolCount] = {};
  bool new_is_malloc = false;  // g_new_is_malloc
};

// Whether `address` is in libstdc++.so (by the file's base name).
bool InLibstdcxx(uintptr_t address) {
  Dl_info info;
  if (address == 0 || dladdr(reinterpret_cast<void*>(address), &info) == 0 ||
      info.dli_fname == nullptr) {
    return false;
  }
  const char* base = std::strrchr(info.dli_fname, '/');
  base = base == nullptr ? info.dli_fname : base + 1;
  return std::strncmp(base, "libstdc++.so", 12) == 0;
}
Resolution Resolve(void* (*resolve)(const char*)) {
  AllocGuard guard;
  Resolution r;
  for (int i = 0; i < kAllocSymbolCount; ++i) {
    r.bound[i] = reinterpret_cast<uintptr_t>(dlsym(RTLD_DEFAULT, kAllocSymbolNames[i]));
    void* real = resolve != nullptr ? resolve(kAllocSymbolNames[i])
                                    : reinterpret_cast<void*>(r.bound[i]);
    if (real != nullptr && !IsWrapper(reinterpret_cast<uintptr_t>(real))) r.real[i] = real;
  }
  // The operators' shortcut to malloc and free holds only for libstdc++'s
  // own definitions, and only when the wrappers call the global malloc and
  // free (not a test's stand-ins).
  r.new_is_malloc = resolve == nullptr && r.real[kSymMalloc] != nullptr &&
                    r.real[kSymFree] != nullptr;
  for (AllocSymbol symbol :
       {kSymNew, kSymNewArray, kSymNewNothrow, kSymNewArrayNothrow, kSymDelete, kSymDeleteArray,
        kSymDeleteSized, kSymDeleteArraySized, kSymDeleteNothrow, kSymDeleteArrayNothrow}) {
    if (!r.new_is_malloc) break;
    r.new_is_malloc = InLibstdcxx(r.bound[symbol]);
  }
  return r;
}

// Takes what `r` found for symbols that had nothing yet (`replace`: for
// all, at Install). An original is replaced, never cleared: a wrapper
// address a host kept (a GLOB_DAT pointer read while installed) stays
// callable after Uninstall.
void ApplyResolution(HookState& state, const Resolution& r, bool replace) {
  for (int i = 0; i < kAllocSymbolCount; ++i) {
    if (replace || state.bound[i] == 0) state.bound[i] = r.bound[i];
    if (r.real[i] != nullptr &&
        (replace || g_hook_real[i].load(std::memory_order_relaxed) == nullptr)) {
      g_hook_real[i].store(r.real[i], std::memory_order_release);
    }
  }
  g_new_is_malloc.store(r.new_is_malloc, std::memory_order_relaxed);
}

void PatchLoadedObjects() {
  void* (*resolve)(const char*);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (!State().installed && !State().locks_installed) return;
    resolve = State().installed ? State().options.resolve : nullptr;
  }
  // A symbol first defined by what was just loaded (libstdc++'s operators).
  const Resolution r = Resolve(resolve);
  std::lock_guard<std::mutex> lock(g_mu);
  HookState& state = State();
  if (!state.installed && !state.locks_installed) return;
  ApplyResolution(state, r, /*replace=*/false);
  Walk(state, Mode::kPatch);
}

}  // namespace

absl::Status InstallLockGroup(bool* taken_over) {
  *taken_over = false;
  void* (*resolve)(const char*);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    HookState& state = State();
    if (state.locks_installed && state.locks_pid == getpid()) {
      return absl::FailedPreconditionError("the lock hooks are already installed");
    }
    if (state.locks_installed) {  // a forked child: as AllocHooks::Install
      state.locks_pid = getpid();
      *taken_over = true;
      return absl::OkStatus();
    }
    resolve = state.installed ? state.options.resolve : nullptr;
  }
  const Resolution r = Resolve(resolve);
  std::lock_guard<std::mutex> lock(g_mu);
  HookState& state = State();
  if (state.locks_installed) {
    return absl::FailedPreconditionError("the lock hooks are already installed");
  }
  state.locks_installed = true;
  state.locks_pid = getpid();
  ApplyResolution(state, r, /*replace=*/false);
  Walk(state, Mode::kPatch);
  return absl::OkStatus();
}

void UninstallLockGroup() {
  std::lock_guard<std::mutex> lock(g_mu);
  HookState& state = State();
  if (!state.locks_installed) return;
  state.locks_installed = false;
  Walk(state, Mode::kRestore);
  if (!state.installed) {
    AllocGuard guard;
    state.saved.clear();  // slots of objects unloaded meanwhile
  }
}

bool LockGroupInstalled() {
  std::lock_guard<std::mutex> lock(g_mu);
  return State().locks_installed;
}

bool AllocHooks::Supported() { return true; }

absl::Status AllocHooks::Install(const Options& options) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    HookState& state = State();
    if (state.installed && state.installed_pid == getpid()) {
      return absl::FailedPreconditionError("the allocation hooks are already installed");
    }
    if (state.installed) {
      // A forked child: the slots are patched already, by its parent's
      // installation, whose profiler stopped at the fork (the mean is 0,
      // the wrappers only forward). The child's caller takes it over as it
      // is, without dlsym: the loader's lock may be held forever in a
      // child forked during another thread's dlopen (glibc 2.36 hangs
      // such a child at its first loader call).
      state.options = options;
      state.installed_pid = getpid();
      g_live.store(options.live, std::memory_order_release);
      g_context.store(options.context, std::memory_order_relaxed);
      g_callback.store(options.callback, std::memory_order_release);
      SetAllocSamplingMean(options.mean_bytes);
      return absl::OkStatus();
    }
  }
  const Resolution r = Resolve(options.resolve);
  std::lock_guard<std::mutex> lock(g_mu);
  HookState& state = State();
  if (state.installed) {
    return absl::FailedPreconditionError("the allocation hooks are already installed");
  }
  // The main program is the first object listed.
  ObjectImage main_program;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        *static_cast<ObjectImage*>(data) = ObjectImageOf(*info);
        return 1;
      },
      &main_program);
  if (absl::Status s = CheckInterceptable(main_program, r.bound[kSymMalloc]); !s.ok()) return s;
  state.options = options;
  state.installed = true;
  state.installed_pid = getpid();
  ApplyResolution(state, r, /*replace=*/true);
  g_live.store(options.live, std::memory_order_release);
  g_context.store(options.context, std::memory_order_relaxed);
  g_callback.store(options.callback, std::memory_order_release);
  SetAllocSamplingMean(options.mean_bytes);
  Walk(state, Mode::kPatch);
  return absl::OkStatus();
}

void AllocHooks::Uninstall() {
  std::lock_guard<std::mutex> lock(g_mu);
  HookState& state = State();
  if (!state.installed) return;
  state.installed = false;
  Walk(state, Mode::kRestore);
  // Slots of objects unloaded meanwhile went with them.
  if (!state.locks_installed) {
    AllocGuard guard;
    state.saved.clear();
  }
  SetAllocSamplingMean(0);
  g_callback.store(nullptr, std::memory_order_release);
  g_live.store(nullptr, std::memory_order_release);
}

bool AllocHooks::Installed() {
  std::lock_guard<std::mutex> lock(g_mu);
  return State().installed;
}

AllocHooks::Stats AllocHooks::stats() {
  Stats s;
  s.slots_patched = g_slots_patched.load(std::memory_order_relaxed);
  s.slots_restored = g_slots_restored.load(std::memory_order_relaxed);
  s.slots_skipped = g_slots_skipped.load(std::memory_order_relaxed);
  s.objects_failed = g_objects_failed.load(std::memory_order_relaxed);
  s.samples = g_samples.load(std::memory_order_relaxed);
  return s;
}

void AllocHooks::ForEachPatchedSlot(
    void (*visit)(void* context, const char* symbol, uintptr_t slot, uintptr_t original),
    void* context) {
  std::lock_guard<std::mutex> lock(g_mu);
  HookState& state = State();
  struct Ctx {
    HookState* state;
    void (*visit)(void*, const char*, uintptr_t, uintptr_t);
    void* context;
  } ctx{&state, visit, context};
  AllocGuard guard;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        Ctx& c = *static_cast<Ctx*>(data);
        std::vector<GotSlot> slots;
        if (!ScanGotSlots(ObjectImageOf(*info), &slots).ok()) return 0;
        for (const GotSlot& slot : slots) {
          auto it = c.state->saved.find(slot.address);
          if (it == c.state->saved.end()) continue;
          if (*reinterpret_cast<const uintptr_t*>(slot.address) != Wrappers().at[slot.symbol]) continue;
          c.visit(c.context, kAllocSymbolNames[slot.symbol], slot.address, it->second);
        }
        return 0;
      },
      &ctx);
}

}  // namespace inprof::internal
