#include "inprof/alloc/alloc_hooks.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <malloc.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "inprof/alloc/alloc_sampler.h"
#include "inprof/alloc/got_scan.h"
#include "inprof/alloc/live_heap_table.h"
#include "inprof/base/sanitizers.h"

namespace inprof::internal {
namespace {

// ---- Stand-ins for the originals: count the calls that reach them on
// this thread, then call the real function (what the dynamic linker binds).
__thread uint64_t t_reached[kAllocSymbolCount] __attribute__((tls_model("initial-exec")));
void* g_test_real[kAllocSymbolCount];

template <typename Fn>
Fn TestReal(AllocSymbol s) {
  return reinterpret_cast<Fn>(g_test_real[s]);
}

void* CountMalloc(size_t n) {
  ++t_reached[kSymMalloc];
  return TestReal<void* (*)(size_t)>(kSymMalloc)(n);
}
void CountFree(void* p) { ++t_reached[kSymFree]; TestReal<void (*)(void*)>(kSymFree)(p); }
void* CountCalloc(size_t n, size_t s) {
  ++t_reached[kSymCalloc];
  return TestReal<void* (*)(size_t, size_t)>(kSymCalloc)(n, s);
}
void* CountRealloc(void* p, size_t n) {
  ++t_reached[kSymRealloc];
  return TestReal<void* (*)(void*, size_t)>(kSymRealloc)(p, n);
}
void* CountReallocarray(void* p, size_t n, size_t s) {
  ++t_reached[kSymReallocarray];
  return TestReal<void* (*)(void*, size_t, size_t)>(kSymReallocarray)(p, n, s);
}
int CountPosixMemalign(void** out, size_t a, size_t n) {
  ++t_reached[kSymPosixMemalign];
  return TestReal<int (*)(void**, size_t, size_t)>(kSymPosixMemalign)(out, a, n);
}
#define COUNT_ALIGNED(Name, Sym)                                           \
  void* Name(size_t a, size_t n) {                                         \
    ++t_reached[Sym];                                                      \
    return TestReal<void* (*)(size_t, size_t)>(Sym)(a, n);                 \
  }
COUNT_ALIGNED(CountAlignedAlloc, kSymAlignedAlloc)
COUNT_ALIGNED(CountMemalign, kSymMemalign)
#define COUNT_SIZE(Name, Sym)                                              \
  void* Name(size_t n) {                                                   \
    ++t_reached[Sym];                                                      \
    return TestReal<void* (*)(size_t)>(Sym)(n);                            \
  }
void CountFreeSized(void* p, size_t n) {
  ++t_reached[kSymFreeSized];
  TestReal<void (*)(void*, size_t)>(kSymFreeSized)(p, n);
}
void CountFreeAlignedSized(void* p, size_t a, size_t n) {
  ++t_reached[kSymFreeAlignedSized];
  TestReal<void (*)(void*, size_t, size_t)>(kSymFreeAlignedSized)(p, a, n);
}
COUNT_SIZE(CountValloc, kSymValloc)
COUNT_SIZE(CountPvalloc, kSymPvalloc)
COUNT_SIZE(CountNew, kSymNew)
COUNT_SIZE(CountNewArray, kSymNewArray)
#define COUNT_NEW_ARGS(Name, Sym, Params, Args, Types)                     \
  void* Name Params {                                                      \
    ++t_reached[Sym];                                                      \
    return TestReal<void* (*) Types>(Sym) Args;                            \
  }
COUNT_NEW_ARGS(CountNewNothrow, kSymNewNothrow, (size_t n, const std::nothrow_t& t), (n, t),
               (size_t, const std::nothrow_t&))
COUNT_NEW_ARGS(CountNewArrayNothrow, kSymNewArrayNothrow, (size_t n, const std::nothrow_t& t),
               (n, t), (size_t, const std::nothrow_t&))
COUNT_NEW_ARGS(CountNewAligned, kSymNewAligned, (size_t n, std::align_val_t a), (n, a),
               (size_t, std::align_val_t))
COUNT_NEW_ARGS(CountNewArrayAligned, kSymNewArrayAligned, (size_t n, std::align_val_t a), (n, a),
               (size_t, std::align_val_t))
COUNT_NEW_ARGS(CountNewAlignedNothrow, kSymNewAlignedNothrow,
               (size_t n, std::align_val_t a, const std::nothrow_t& t), (n, a, t),
               (size_t, std::align_val_t, const std::nothrow_t&))
COUNT_NEW_ARGS(CountNewArrayAlignedNothrow, kSymNewArrayAlignedNothrow,
               (size_t n, std::align_val_t a, const std::nothrow_t& t), (n, a, t),
               (size_t, std::align_val_t, const std::nothrow_t&))
#define COUNT_DELETE(Name, Sym, Params, Args, Types)                       \
  void Name Params {                                                       \
    ++t_reached[Sym];                                                      \
    TestReal<void (*) Types>(Sym) Args;                                    \
  }
COUNT_DELETE(CountDelete, kSymDelete, (void* p), (p), (void*))
COUNT_DELETE(CountDeleteArray, kSymDeleteArray, (void* p), (p), (void*))
COUNT_DELETE(CountDeleteSized, kSymDeleteSized, (void* p, size_t n), (p, n), (void*, size_t))
COUNT_DELETE(CountDeleteArraySized, kSymDeleteArraySized, (void* p, size_t n), (p, n),
             (void*, size_t))
COUNT_DELETE(CountDeleteAligned, kSymDeleteAligned, (void* p, std::align_val_t a), (p, a),
             (void*, std::align_val_t))
COUNT_DELETE(CountDeleteArrayAligned, kSymDeleteArrayAligned, (void* p, std::align_val_t a),
             (p, a), (void*, std::align_val_t))
COUNT_DELETE(CountDeleteSizedAligned, kSymDeleteSizedAligned,
             (void* p, size_t n, std::align_val_t a), (p, n, a), (void*, size_t, std::align_val_t))
COUNT_DELETE(CountDeleteArraySizedAligned, kSymDeleteArraySizedAligned,
             (void* p, size_t n, std::align_val_t a), (p, n, a), (void*, size_t, std::align_val_t))
COUNT_DELETE(CountDeleteNothrow, kSymDeleteNothrow, (void* p, const std::nothrow_t& t), (p, t),
             (void*, const std::nothrow_t&))
COUNT_DELETE(CountDeleteArrayNothrow, kSymDeleteArrayNothrow, (void* p, const std::nothrow_t& t),
             (p, t), (void*, const std::nothrow_t&))
COUNT_DELETE(CountDeleteAlignedNothrow, kSymDeleteAlignedNothrow,
             (void* p, std::align_val_t a, const std::nothrow_t& t), (p, a, t),
             (void*, std::align_val_t, const std::nothrow_t&))
COUNT_DELETE(CountDeleteArrayAlignedNothrow, kSymDeleteArrayAlignedNothrow,
             (void* p, std::align_val_t a, const std::nothrow_t& t), (p, a, t),
             (void*, std::align_val_t, const std::nothrow_t&))
void* CountDlopen(const char* f, int m) {
  ++t_reached[kSymDlopen];
  return TestReal<void* (*)(const char*, int)>(kSymDlopen)(f, m);
}
void* CountDlmopen(Lmid_t l, const char* f, int m) {
  ++t_reached[kSymDlmopen];
  return TestReal<void* (*)(Lmid_t, const char*, int)>(kSymDlmopen)(l, f, m);
}

template <typename Fn>
void* Ptr(Fn* fn) {
  return reinterpret_cast<void*>(fn);
}
void* const kCounters[kAllocSymbolCount] = {
    Ptr(CountMalloc), Ptr(CountFree), Ptr(CountCalloc), Ptr(CountRealloc),
    Ptr(CountReallocarray), Ptr(CountPosixMemalign), Ptr(CountAlignedAlloc),
    Ptr(CountMemalign), Ptr(CountValloc), Ptr(CountPvalloc), Ptr(CountFreeSized),
    Ptr(CountFreeAlignedSized), Ptr(CountNew),
    Ptr(CountNewArray), Ptr(CountNewNothrow), Ptr(CountNewArrayNothrow),
    Ptr(CountNewAligned), Ptr(CountNewArrayAligned), Ptr(CountNewAlignedNothrow),
    Ptr(CountNewArrayAlignedNothrow), Ptr(CountDelete), Ptr(CountDeleteArray),
    Ptr(CountDeleteSized), Ptr(CountDeleteArraySized), Ptr(CountDeleteAligned),
    Ptr(CountDeleteArrayAligned), Ptr(CountDeleteSizedAligned),
    Ptr(CountDeleteArraySizedAligned), Ptr(CountDeleteNothrow), Ptr(CountDeleteArrayNothrow),
    Ptr(CountDeleteAlignedNothrow), Ptr(CountDeleteArrayAlignedNothrow), Ptr(CountDlopen),
    Ptr(CountDlmopen),
};

void* CountingResolve(const char* name) {
  const int i = AllocSymbolIndex(name);
  if (i < 0) return nullptr;
  g_test_real[i] = dlsym(RTLD_DEFAULT, name);
  return g_test_real[i] != nullptr ? kCounters[i] : nullptr;
}

// ---- The test modules (tests/alloc/alloc_test_lib.cc).
struct TestLib {
  void* handle = nullptr;
  template <typename Fn>
  Fn Get(const char* name) const {
    return reinterpret_cast<Fn>(dlsym(handle, name));
  }
};

std::string LibPath(const char* variable) {
  const char* path = std::getenv(variable);
  return path != nullptr ? path : "";
}

bool OnlyTestLibs(const char* path) { return std::strstr(path, "alloc_test_") != nullptr; }

// Sampled allocations seen by the test callback on this thread.
__thread int t_samples __attribute__((tls_model("initial-exec")));
__thread size_t t_sampled_bytes __attribute__((tls_model("initial-exec")));
uint64_t CountSample(void*, const AllocSample& sample) {
  ++t_samples;
  t_sampled_bytes += sample.size;
  // The sampled path may allocate: this reaches the allocator unsampled.
  void* scratch = std::malloc(64);
  std::free(scratch);
  return 42;
}

class AllocHooksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string path = LibPath("INPROF_ALLOC_TEST_LIB");
    if (path.empty()) GTEST_SKIP() << "INPROF_ALLOC_TEST_LIB is not set (run through meson test)";
    lib_.handle = dlopen(path.c_str(), RTLD_NOW);
    ASSERT_NE(lib_.handle, nullptr) << dlerror();
    std::memset(t_reached, 0, sizeof t_reached);
  }
  void TearDown() override { AllocHooks::Uninstall(); }

  AllocHooks::Options CountingOptions(uint64_t mean) {
    AllocHooks::Options options;
    options.mean_bytes = mean;
    options.resolve = CountingResolve;
    options.object_filter = OnlyTestLibs;
    return options;
  }

  TestLib lib_;
};

// Calls every intercepted allocation entry point of `lib` once and checks
// each result; returns how many allocations (not frees) it made.
int CallEveryForm(const TestLib& lib) {
  constexpr size_t n = 48;
  int allocations = 0;
  auto check = [&](void* p, size_t align) {
    EXPECT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % align, 0u);
    std::memset(p, 0xab, n);  // usable (ASan checks the bounds)
    ++allocations;
  };
  void* p = lib.Get<void* (*)(size_t)>("LibMalloc")(n);
  check(p, alignof(max_align_t));
  lib.Get<void (*)(void*)>("LibFree")(p);

  auto* c = static_cast<unsigned char*>(lib.Get<void* (*)(size_t, size_t)>("LibCalloc")(6, 8));
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(c[i], 0) << i;
  check(c, alignof(max_align_t));
  c[0] = 7;
  c = static_cast<unsigned char*>(lib.Get<void* (*)(void*, size_t)>("LibRealloc")(c, 4096));
  check(c, 16);
  c[0] = 9;
  c = static_cast<unsigned char*>(
      lib.Get<void* (*)(void*, size_t, size_t)>("LibReallocarray")(c, 2, n));
  EXPECT_EQ(c[0], 9);  // kept across the moves
  check(c, 16);
  lib.Get<void (*)(void*)>("LibFree")(c);

  void* m = nullptr;
  EXPECT_EQ(lib.Get<int (*)(void**, size_t, size_t)>("LibPosixMemalign")(&m, 256, n), 0);
  check(m, 256);
  lib.Get<void (*)(void*)>("LibFree")(m);
  p = lib.Get<void* (*)(size_t, size_t)>("LibAlignedAlloc")(128, 128);
  check(p, 128);
  lib.Get<void (*)(void*)>("LibFree")(p);
  p = lib.Get<void* (*)(size_t, size_t)>("LibMemalign")(64, n);
  check(p, 64);
  lib.Get<void (*)(void*)>("LibFree")(p);
  p = lib.Get<void* (*)(size_t)>("LibValloc")(n);
  check(p, 4096);
  lib.Get<void (*)(void*)>("LibFree")(p);
  p = lib.Get<void* (*)(size_t)>("LibPvalloc")(n);
  check(p, 4096);
  lib.Get<void (*)(void*)>("LibFree")(p);

  using New = void* (*)(size_t);
  using NewA = void* (*)(size_t, size_t);
  using Del = void (*)(void*);
  using DelN = void (*)(void*, size_t);
  using DelNA = void (*)(void*, size_t, size_t);
  p = lib.Get<New>("LibNew")(n), check(p, 16), lib.Get<Del>("LibDelete")(p);
  p = lib.Get<New>("LibNewArray")(n), check(p, 16), lib.Get<Del>("LibDeleteArray")(p);
  p = lib.Get<New>("LibNew")(n), check(p, 16), lib.Get<DelN>("LibDeleteSized")(p, n);
  p = lib.Get<New>("LibNewArray")(n), check(p, 16), lib.Get<DelN>("LibDeleteArraySized")(p, n);
  p = lib.Get<New>("LibNewNothrow")(n), check(p, 16), lib.Get<Del>("LibDeleteNothrow")(p);
  p = lib.Get<New>("LibNewArrayNothrow")(n), check(p, 16),
  lib.Get<Del>("LibDeleteArrayNothrow")(p);
  p = lib.Get<NewA>("LibNewAligned")(n, 64), check(p, 64),
  lib.Get<DelN>("LibDeleteAligned")(p, 64);
  p = lib.Get<NewA>("LibNewArrayAligned")(n, 64), check(p, 64),
  lib.Get<DelN>("LibDeleteArrayAligned")(p, 64);
  p = lib.Get<NewA>("LibNewAligned")(n, 64), check(p, 64),
  lib.Get<DelNA>("LibDeleteSizedAligned")(p, n, 64);
  p = lib.Get<NewA>("LibNewArrayAligned")(n, 64), check(p, 64),
  lib.Get<DelNA>("LibDeleteArraySizedAligned")(p, n, 64);
  p = lib.Get<NewA>("LibNewAlignedNothrow")(n, 64), check(p, 64),
  lib.Get<DelN>("LibDeleteAlignedNothrow")(p, 64);
  p = lib.Get<NewA>("LibNewArrayAlignedNothrow")(n, 64), check(p, 64),
  lib.Get<DelN>("LibDeleteArrayAlignedNothrow")(p, 64);
  return allocations;
}

// What CallEveryForm makes reach each original.
std::map<std::string, uint64_t> ExpectedReach() {
  std::map<std::string, uint64_t> expected;
  for (const char* one :
       {"calloc", "realloc", "reallocarray", "posix_memalign", "aligned_alloc", "memalign",
        "valloc", "pvalloc", "_ZdlPv", "_ZdaPv", "_ZdlPvm", "_ZdaPvm", "_ZnwmRKSt9nothrow_t",
        "_ZnamRKSt9nothrow_t", "_ZdlPvRKSt9nothrow_t", "_ZdaPvRKSt9nothrow_t",
        "_ZdlPvSt11align_val_t", "_ZdaPvSt11align_val_t", "_ZdlPvmSt11align_val_t",
        "_ZdaPvmSt11align_val_t", "_ZnwmSt11align_val_tRKSt9nothrow_t",
        "_ZnamSt11align_val_tRKSt9nothrow_t", "_ZdlPvSt11align_val_tRKSt9nothrow_t",
        "_ZdaPvSt11align_val_tRKSt9nothrow_t"}) {
    expected[one] = 1;
  }
  expected["malloc"] = 1;
  expected["free"] = 7;
  expected["_Znwm"] = 2;
  expected["_Znam"] = 2;
  expected["_ZnwmSt11align_val_t"] = 2;
  expected["_ZnamSt11align_val_t"] = 2;
  return expected;
}

std::map<std::string, uint64_t> Reached() {
  std::map<std::string, uint64_t> reached;
  for (int i = 0; i < kAllocSymbolCount; ++i) {
    if (t_reached[i] != 0) reached[kAllocSymbolNames[i]] = t_reached[i];
  }
  return reached;
}

// What every call form through `lib` reaches, from a clean count.
std::map<std::string, uint64_t> ReachedByEveryForm(const TestLib& lib) {
  std::memset(t_reached, 0, sizeof t_reached);
  CallEveryForm(lib);
  return Reached();
}

TEST_F(AllocHooksTest, EveryCallFormReachesItsOriginalExactlyOnce) {
  ASSERT_TRUE(AllocHooks::Install(CountingOptions(/*mean=*/0)).ok());
  EXPECT_GE(AllocHooks::stats().slots_patched, 30u);
  EXPECT_EQ(ReachedByEveryForm(lib_), ExpectedReach());

  // Uninstalled: the same calls reach no stand-in.
  AllocHooks::Uninstall();
  EXPECT_EQ(ReachedByEveryForm(lib_), (std::map<std::string, uint64_t>{}));
}

TEST_F(AllocHooksTest, SecondInstallIsRefused) {
  ASSERT_TRUE(AllocHooks::Install(CountingOptions(0)).ok());
  EXPECT_EQ(AllocHooks::Install(CountingOptions(0)).code(),
            absl::StatusCode::kFailedPrecondition);
}

// The GOT slots of every loaded object: address -> (value, symbol).
using SlotMap = std::map<uintptr_t, std::pair<uintptr_t, AllocSymbol>>;
SlotMap AllSlots() {
  SlotMap slots;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        std::vector<GotSlot> found;
        if (!ScanGotSlots(ObjectImageOf(*info), &found).ok()) return 0;
        for (const GotSlot& s : found) {
          (*static_cast<SlotMap*>(data))[s.address] = {
              *reinterpret_cast<const uintptr_t*>(s.address), s.symbol};
        }
        return 0;
      },
      &slots);
  return slots;
}

// The whole process patched with the real originals: every slot written
// is written back, and the test module's GLOB_DAT slot shows it.
TEST_F(AllocHooksTest, UninstallRestoresEverySlotOfEveryObject) {
  using MallocFn = void* (*)(size_t);
  const auto malloc_address = lib_.Get<MallocFn (*)()>("LibMallocAddress");
  const MallocFn bound = reinterpret_cast<MallocFn>(dlsym(RTLD_DEFAULT, "malloc"));
  EXPECT_EQ(malloc_address(), bound);
  const SlotMap before = AllSlots();

  AllocHooks::Options options;
  options.mean_bytes = 0;
  ASSERT_TRUE(AllocHooks::Install(options).ok());
  std::map<uintptr_t, uintptr_t> originals;
  AllocHooks::ForEachPatchedSlot(
      [](void* ctx, const char*, uintptr_t slot, uintptr_t original) {
        (*static_cast<std::map<uintptr_t, uintptr_t>*>(ctx))[slot] = original;
      },
      &originals);
  EXPECT_NE(malloc_address(), bound);  // the GOT now holds the wrapper
  void* p = std::malloc(10);           // and the process still works
  std::free(p);
  ASSERT_FALSE(originals.empty());
  const SlotMap during = AllSlots();
  for (const auto& [slot, original] : originals) EXPECT_NE(during.at(slot).first, original);

  AllocHooks::Uninstall();
  EXPECT_EQ(malloc_address(), bound);
  EXPECT_GE(AllocHooks::stats().slots_restored, originals.size());
  const SlotMap after = AllSlots();
  for (const auto& [slot, original] : originals) {
    EXPECT_EQ(after.at(slot).first, original) << std::hex << slot;
  }
  // Every slot of every object is as it was, except a lazily bound slot
  // that a call resolved meanwhile: that one now holds the definition.
  ASSERT_EQ(after.size(), before.size());
  for (const auto& [slot, was] : before) {
    const auto& [now, symbol] = after.at(slot);
    if (now != was.first) {
      EXPECT_EQ(now, reinterpret_cast<uintptr_t>(dlsym(RTLD_DEFAULT, kAllocSymbolNames[symbol])))
          << kAllocSymbolNames[symbol] << " at " << std::hex << slot;
    }
  }
}

// A module dlopen()ed after Install (through a patched dlopen slot) is
// patched before dlopen returns, and restored by Uninstall.
TEST_F(AllocHooksTest, LibraryLoadedAfterInstallIsPatchedThenRestored) {
  const std::string late_path = LibPath("INPROF_ALLOC_TEST_LATE_LIB");
  ASSERT_FALSE(late_path.empty());
  ASSERT_TRUE(AllocHooks::Install(CountingOptions(0)).ok());
  std::memset(t_reached, 0, sizeof t_reached);
  TestLib late;
  late.handle = lib_.Get<void* (*)(const char*, int)>("LibDlopen")(late_path.c_str(), RTLD_NOW);
  ASSERT_NE(late.handle, nullptr) << dlerror();
  EXPECT_EQ(t_reached[kSymDlopen], 1u);
  EXPECT_EQ(ReachedByEveryForm(late), ExpectedReach());

  AllocHooks::Uninstall();
  EXPECT_EQ(ReachedByEveryForm(late), (std::map<std::string, uint64_t>{}));
  using MallocFn = void* (*)(size_t);
  EXPECT_EQ(late.Get<MallocFn (*)()>("LibMallocAddress")(),
            reinterpret_cast<MallocFn>(dlsym(RTLD_DEFAULT, "malloc")));
}

// dlmopen() into a new namespace: the call is forwarded, and the objects
// it loads (a second libc among them) are left alone -- dl_iterate_phdr
// lists only its caller's namespace -- since forwarding their calls to the
// base namespace's allocator would mix two allocators.
TEST_F(AllocHooksTest, ObjectsInAnotherNamespaceAreLeftAlone) {
#if defined(INPROF_ASAN) || defined(INPROF_TSAN)
  GTEST_SKIP() << "a sanitizer's runtime cannot be loaded again into a new link-map namespace";
#endif
  const std::string late_path = LibPath("INPROF_ALLOC_TEST_LATE_LIB");
  ASSERT_FALSE(late_path.empty());
  ASSERT_TRUE(AllocHooks::Install(CountingOptions(0)).ok());
  std::memset(t_reached, 0, sizeof t_reached);
  TestLib other;
  other.handle = lib_.Get<void* (*)(long, const char*, int)>("LibDlmopen")(
      LM_ID_NEWLM, late_path.c_str(), RTLD_NOW);
  ASSERT_NE(other.handle, nullptr) << dlerror();
  EXPECT_EQ(t_reached[kSymDlmopen], 1u);
  std::memset(t_reached, 0, sizeof t_reached);
  void* p = other.Get<void* (*)(size_t)>("LibMalloc")(48);
  other.Get<void (*)(void*)>("LibFree")(p);
  EXPECT_EQ(Reached(), (std::map<std::string, uint64_t>{}));
  using MallocFn = void* (*)(size_t);
  const MallocFn wrapper = lib_.Get<MallocFn (*)()>("LibMallocAddress")();
  EXPECT_NE(wrapper, reinterpret_cast<MallocFn>(dlsym(RTLD_DEFAULT, "malloc")));
  EXPECT_NE(other.Get<MallocFn (*)()>("LibMallocAddress")(), wrapper);
}

TEST_F(AllocHooksTest, MeanOneSamplesEveryAllocationAndFreesEmptyTheTable) {
  LiveHeapTable live(1024);
  AllocHooks::Options options = CountingOptions(/*mean=*/1);
  options.callback = CountSample;
  options.live = &live;
  ASSERT_TRUE(AllocHooks::Install(options).ok());
  t_samples = 0;
  t_sampled_bytes = 0;
  const int allocations = CallEveryForm(lib_);
  // Each allocation and each realloc sampled; the callback's own malloc not.
  EXPECT_EQ(t_samples, allocations);
  EXPECT_EQ(live.Sum().entries, 0u);  // every block freed through a wrapper
  EXPECT_EQ(live.stats().inserts, static_cast<uint64_t>(allocations));

  // A live block: in the table with the callback's tag and weight ~1.
  void* p = lib_.Get<void* (*)(size_t)>("LibMalloc")(100);
  bool found = false;
  live.ForEach([&](const void* a, const LiveHeapTable::Entry& e) {
    if (a != p) return;
    found = true;
    EXPECT_EQ(e.size, 100u);
    EXPECT_EQ(e.tag, 42u);
    EXPECT_NEAR(e.weight_objects, 1.0, 1e-9);
  });
  EXPECT_TRUE(found);
  lib_.Get<void (*)(void*)>("LibFree")(p);
  EXPECT_EQ(live.Sum().entries, 0u);
}

TEST_F(AllocHooksTest, MeanZeroSamplesNothing) {
  LiveHeapTable live(1024);
  AllocHooks::Options options = CountingOptions(/*mean=*/0);
  options.callback = CountSample;
  options.live = &live;
  ASSERT_TRUE(AllocHooks::Install(options).ok());
  t_samples = 0;
  CallEveryForm(lib_);
  EXPECT_EQ(t_samples, 0);
  EXPECT_EQ(live.stats().inserts, 0u);
}

// realloc is a free and a new allocation: the old block's entry leaves
// the table whatever the realloc's own sampling, and the new block is in
// it only when the realloc itself was sampled, with the new size and the
// weight of that size. (Before, an unsampled realloc moved the entry with
// its old weight to the new size: a buffer regrown k times counted ~k+1
// times.)
TEST_F(AllocHooksTest, ReallocFreesTheOldBlockAndSamplesTheNewOneOnItsOwn) {
  LiveHeapTable live(1024);
  AllocHooks::Options options = CountingOptions(/*mean=*/1);
  options.live = &live;
  ASSERT_TRUE(AllocHooks::Install(options).ok());
  void* p = lib_.Get<void* (*)(size_t)>("LibMalloc")(100);
  ASSERT_EQ(live.Sum().entries, 1u);
  SetAllocSamplingMean(0);  // the realloc itself is not sampled
  void* q = lib_.Get<void* (*)(void*, size_t)>("LibRealloc")(p, 1 << 16);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(live.Sum().entries, 0u);
  SetAllocSamplingMean(1);  // this one is: the new block, at its size
  void* r = lib_.Get<void* (*)(void*, size_t)>("LibRealloc")(q, 1 << 17);
  ASSERT_NE(r, nullptr);
  std::vector<std::pair<const void*, uint64_t>> entries;
  live.ForEach([&](const void* a, const LiveHeapTable::Entry& e) {
    entries.push_back({a, e.size});
    EXPECT_NEAR(e.weight_objects, 1.0, 1e-9);
  });
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].first, r);
  EXPECT_EQ(entries[0].second, uint64_t{1} << 17);
  lib_.Get<void (*)(void*)>("LibFree")(r);
  EXPECT_EQ(live.Sum().entries, 0u);
}

// free_sized and free_aligned_sized (C23) are frees like any other: a
// sampled block freed through them leaves the live table. glibc 2.36 has
// neither, so a module that defines both stands in for a libc that has
// them (loaded RTLD_GLOBAL: the global definitions); its own calls to them
// go through its slots. Before they were hooked, the block stayed live.
TEST_F(AllocHooksTest, SizedFreesLeaveTheLiveTable) {
  const std::string path = LibPath("INPROF_ALLOC_TEST_FREE_SIZED_LIB");
  if (path.empty()) GTEST_SKIP() << "INPROF_ALLOC_TEST_FREE_SIZED_LIB is not set (run through meson test)";
  TestLib sized;
  sized.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  ASSERT_NE(sized.handle, nullptr) << dlerror();
  LiveHeapTable live(1024);
  AllocHooks::Options options = CountingOptions(/*mean=*/1);
  options.live = &live;
  ASSERT_TRUE(AllocHooks::Install(options).ok());
  void* p = lib_.Get<void* (*)(size_t)>("LibMalloc")(100);
  void* q = lib_.Get<void* (*)(size_t, size_t)>("LibAlignedAlloc")(64, 128);
  ASSERT_EQ(live.Sum().entries, 2u);
  sized.Get<void (*)(void*, size_t)>("LibFreeSized")(p, 100);
  EXPECT_EQ(live.Sum().entries, 1u);
  sized.Get<void (*)(void*, size_t, size_t)>("LibFreeAlignedSized")(q, 64, 128);
  EXPECT_EQ(live.Sum().entries, 0u);
  EXPECT_EQ(t_reached[kSymFreeSized], 1u);
  EXPECT_EQ(t_reached[kSymFreeAlignedSized], 1u);
  EXPECT_EQ(sized.Get<int (*)()>("SizedFreesCalled")(), 2);
}

// A library with an allocator of its own, loaded with RTLD_NOW |
// RTLD_DEEPBIND: its slots point at its own malloc and free, inside its
// own object, which the hooks took for unresolved PLT stubs and patched.
// Then a block of its arena freed after Install went to glibc's free and
// the process aborted. Now such slots are left alone (in a child: the
// failure is an abort).
TEST(AllocHooksDeepBindTest, ALibraryBoundToItsOwnAllocatorIsLeftAlone) {
#if defined(INPROF_ASAN) || defined(INPROF_TSAN)
  GTEST_SKIP() << "the sanitizers' runtimes refuse RTLD_DEEPBIND";
#else
  const char* path = std::getenv("INPROF_ALLOC_TEST_DEEPBIND_LIB");
  if (path == nullptr || *path == '\0') {
    GTEST_SKIP() << "INPROF_ALLOC_TEST_DEEPBIND_LIB is not set (run through meson test)";
  }
  std::fflush(nullptr);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    void* handle = dlopen(path, RTLD_NOW | RTLD_DEEPBIND);
    if (handle == nullptr) _exit(10);
    auto deep_malloc = reinterpret_cast<void* (*)(size_t)>(dlsym(handle, "DeepMalloc"));
    auto deep_free = reinterpret_cast<void (*)(void*)>(dlsym(handle, "DeepFree"));
    auto deep_owns = reinterpret_cast<int (*)(const void*)>(dlsym(handle, "DeepOwns"));
    if (deep_malloc == nullptr || deep_free == nullptr || deep_owns == nullptr) _exit(11);
    void* before = deep_malloc(100);
    if (deep_owns(before) != 1) _exit(12);
    static LiveHeapTable live(1024);
    AllocHooks::Options options;
    options.mean_bytes = 1;  // every allocation through a patched slot sampled
    options.live = &live;
    options.object_filter = [](const char* object) {
      return std::strstr(object, "alloc_test_deepbind_lib") != nullptr;
    };
    if (!AllocHooks::Install(options).ok()) _exit(13);
    deep_free(before);  // the arena's block, through the library's slot
    void* after = deep_malloc(100);
    if (deep_owns(after) != 1) _exit(14);  // went to glibc's malloc
    deep_free(after);
    const uint64_t skipped = AllocHooks::stats().slots_skipped;
    AllocHooks::Uninstall();
    _exit(skipped >= 2 ? 0 : 15);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << WTERMSIG(status)
                                 << " (SIGABRT: glibc freed the library's own block)";
  EXPECT_EQ(WEXITSTATUS(status), 0);
#endif
}

// ---- The scanner on malformed objects: errors, never faults.
struct FakeObject {
  alignas(16) unsigned char memory[4096] = {};
  ElfW(Phdr) phdrs[2] = {};
  ObjectImage Image(size_t phnum = 2) {
    phdrs[0].p_type = PT_LOAD;
    phdrs[0].p_flags = PF_R | PF_W;
    phdrs[0].p_vaddr = 0;
    phdrs[0].p_memsz = sizeof memory;
    return {reinterpret_cast<uintptr_t>(memory), phdrs, phnum, "fake.so"};
  }
  ElfW(Dyn)* Dynamic(size_t offset, size_t count) {
    phdrs[1].p_type = PT_DYNAMIC;
    phdrs[1].p_vaddr = offset;
    phdrs[1].p_memsz = count * sizeof(ElfW(Dyn));
    return reinterpret_cast<ElfW(Dyn)*>(memory + offset);
  }
};

// A static executable: no dynamic section (or no dynamic malloc) in the
// main program. One line says allocations cannot be seen there, instead of
// a profile silently without them.
TEST(GotScanTest, AStaticExecutableIsNamedAsSuch) {
  FakeObject object;
  const absl::Status no_dynamic = CheckInterceptable(object.Image(1), 0x1234);
  EXPECT_EQ(no_dynamic.code(), absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(absl::StrContains(no_dynamic.message(), "static executable")) << no_dynamic;
  object.Dynamic(1024, 1);
  EXPECT_EQ(CheckInterceptable(object.Image(2), 0).code(), absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(CheckInterceptable(object.Image(2), 0x1234).ok());
}

TEST(GotScanTest, ObjectWithoutDynamicSectionHasNoSlots) {
  FakeObject object;
  std::vector<GotSlot> slots;
  EXPECT_TRUE(ScanGotSlots(object.Image(1), &slots).ok());
  EXPECT_TRUE(slots.empty());
}

TEST(GotScanTest, MalformedDynamicDataIsAnErrorNamingTheObject) {
  std::vector<GotSlot> slots;
  {
    FakeObject object;  // PT_DYNAMIC past the end of the segment
    object.Dynamic(4000, 100);
    const absl::Status s = ScanGotSlots(object.Image(), &slots);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("fake.so"), absl::string_view::npos) << s;
  }
  {
    FakeObject object;  // DT_JMPREL far outside the object
    ElfW(Dyn)* d = object.Dynamic(0, 8);
    d[0] = {DT_JMPREL, {0x7fff00000000}};
    d[1] = {DT_PLTRELSZ, {sizeof(ElfW(Rela))}};
    d[2] = {DT_PLTREL, {DT_RELA}};
    d[3] = {DT_SYMTAB, {512}};
    d[4] = {DT_STRTAB, {1024}};
    d[5] = {DT_STRSZ, {16}};
    d[6] = {DT_NULL, {0}};
    EXPECT_EQ(ScanGotSlots(object.Image(), &slots).code(), absl::StatusCode::kInvalidArgument);
  }
  {
    FakeObject object;  // a relocation whose symbol index runs off the end
    ElfW(Dyn)* d = object.Dynamic(0, 8);
    d[0] = {DT_JMPREL, {256}};
    d[1] = {DT_PLTRELSZ, {sizeof(ElfW(Rela))}};
    d[2] = {DT_PLTREL, {DT_RELA}};
    d[3] = {DT_SYMTAB, {512}};
    d[4] = {DT_STRTAB, {1024}};
    d[5] = {DT_STRSZ, {16}};
    d[6] = {DT_NULL, {0}};
    auto* rela = reinterpret_cast<ElfW(Rela)*>(object.memory + 256);
#if defined(__x86_64__)
    rela->r_info = ELF64_R_INFO(1000000, R_X86_64_JUMP_SLOT);
#else
    rela->r_info = ELF64_R_INFO(1000000, R_AARCH64_JUMP_SLOT);
#endif
    EXPECT_EQ(ScanGotSlots(object.Image(), &slots).code(), absl::StatusCode::kInvalidArgument);
    // ... and a name that runs past DT_STRSZ.
    rela->r_info = ELF64_R_INFO(1, ELF64_R_TYPE(rela->r_info));
    auto* sym = reinterpret_cast<ElfW(Sym)*>(object.memory + 512) + 1;
    sym->st_name = 0;
    std::memset(object.memory + 1024, 'x', 16);
    EXPECT_EQ(ScanGotSlots(object.Image(), &slots).code(), absl::StatusCode::kInvalidArgument);
    // ... and, well-formed, a malloc slot outside the object.
    std::memcpy(object.memory + 1024, "\0malloc\0", 8);
    sym->st_name = 1;
    rela->r_offset = 1 << 20;
    EXPECT_EQ(ScanGotSlots(object.Image(), &slots).code(), absl::StatusCode::kInvalidArgument);
    // ... and inside: found.
    rela->r_offset = 2048;
    ASSERT_TRUE(ScanGotSlots(object.Image(), &slots).ok());
    ASSERT_EQ(slots.size(), 1u);
    EXPECT_EQ(slots[0].symbol, kSymMalloc);
    EXPECT_EQ(slots[0].address, reinterpret_cast<uintptr_t>(object.memory + 2048));
  }
}

// The host keeps running: a malformed object is logged (once, naming it)
// and skipped. The real loaded objects (the vdso among them) scan cleanly.
TEST(GotScanTest, EveryLoadedObjectScansCleanly) {
  int objects = 0;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        std::vector<GotSlot> slots;
        const absl::Status s = ScanGotSlots(ObjectImageOf(*info), &slots);
        EXPECT_TRUE(s.ok()) << s;
        ++*static_cast<int*>(data);
        return 0;
      },
      &objects);
  EXPECT_GE(objects, 3);
}

}  // namespace
}  // namespace inprof::internal
