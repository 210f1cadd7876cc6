// Tests of AllocationProvider (inprof/heap/allocation_provider.h) composed
// into a Profiler: each allocation site's bytes in the profile against what
// the test allocated, the live heap at the window's end, stacks cut at the
// allocating code, unregistered threads, and Stop() putting the GOT back.
#include "inprof/heap/allocation_provider.h"

#include <dlfcn.h>
#include <signal.h>
#include <malloc.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "inprof/inprof.h"
#include "inprof/pprof_reader.h"
#include "util/stat_bounds.h"
#include "util/test_util.h"

namespace inprof {
namespace {

using HeapProfiler =
    Profiler<DefaultUnwinder, DefaultSampleRing, CpuTimeProvider, AllocationProvider>;

#if defined(INPROF_TSAN) || (defined(INPROF_ASAN) && !defined(INPROF_SANITIZER_RUNTIME_SHARED))
// A sanitizer's runtime linked statically (clang's TSan) defines malloc and
// operator new in the test executable itself, whose calls to them are
// direct (no GOT slot): they are not intercepted (allocation_provider.h).
// Under ASan this test links the runtime as a shared library
// (tests/meson.build: INPROF_SANITIZER_RUNTIME_SHARED), reached through
// the slots like libc.
constexpr bool kIntercepted = false;
#else
constexpr bool kIntercepted = true;
#endif

constexpr uint64_t kPeriod = 64 * 1024;

Options TestOptions(const std::string& name) {
  Options options;
  // A directory of this run's own: meson test --repeat runs copies at once.
  options.output = testing::FreshTestDir(name) + "/profile.pb.gz";
  options.alloc_period = kPeriod;
  options.wall_period = absl::ZeroDuration();
  options.export_period = absl::ZeroDuration();
  return options;
}

// What an allocation site returns, kept so that its call to the allocator
// is no tail call: the site's frame stays the stack's leaf.
template <typename T>
inline __attribute__((always_inline)) T* Kept(T* p) {
  asm volatile("" : : "r"(p) : "memory");
  return p;
}

// The allocation sites. noinline, and each keeps what it made, so that the
// calls stay and their frames are the stacks' leaves.
__attribute__((noinline)) char* AllocSiteSmallNew() { return Kept(new char[1000]); }
__attribute__((noinline)) void* AllocSiteLargeMalloc() { return Kept(std::malloc(64 * 1024)); }
__attribute__((noinline)) void* AllocSiteLive() { return Kept(std::malloc(4096)); }
__attribute__((noinline)) void* AllocSiteUnregistered() { return Kept(std::malloc(64 * 1024)); }

using testing::LeafSum;

// The estimate's range over the truth for `n` allocations of `size` bytes
// at kPeriod (stats::SampledAllocationRange: 1e-7 a side).
stats::EstimateRange EstimateBounds(int64_t n, double size) {
  return stats::SampledAllocationRange(n, size, static_cast<double>(kPeriod));
}

TEST(AllocationProviderTest, SitesBytesAndLiveHeapWithinTheirBounds) {
  Options options = TestOptions("heap_sites");
  HeapProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  constexpr int kSmall = 50'000;       // x 1,000 B through operator new[]
  constexpr int kLarge = 1'000;        // x 64 KiB through malloc
  constexpr int kLive = 10'000;        // x 4 KiB, still allocated at Stop
  constexpr int kUnregistered = 1'000; // x 64 KiB on a thread not registered
  std::vector<void*> live;
  {
    auto self = profiler.RegisterThread("main");
    ASSERT_TRUE(self.active());
    std::vector<char*> small;
    small.reserve(kSmall);
    for (int i = 0; i < kSmall; ++i) small.push_back(AllocSiteSmallNew());
    for (char* p : small) delete[] p;
    for (int i = 0; i < kLarge; ++i) std::free(AllocSiteLargeMalloc());
    live.reserve(kLive);
    for (int i = 0; i < kLive; ++i) live.push_back(AllocSiteLive());
    std::thread([] {
      for (int i = 0; i < kUnregistered; ++i) std::free(AllocSiteUnregistered());
    }).join();
  }
  ASSERT_TRUE(profiler.Stop().ok());
  const AllocationProvider::Stats stats = AllocationProvider::stats();
  for (void* p : live) std::free(p);

  auto profile = ReadPprofFile(options.output);
  ASSERT_TRUE(profile.ok()) << profile.status();
  const int alloc_objects = profile->ValueIndex("alloc_objects");
  const int alloc_space = profile->ValueIndex("alloc_space");
  const int inuse_objects = profile->ValueIndex("inuse_objects");
  const int inuse_space = profile->ValueIndex("inuse_space");
  ASSERT_GE(alloc_objects, 0);
  ASSERT_EQ(alloc_space, alloc_objects + 1);
  ASSERT_EQ(inuse_objects, alloc_objects + 2);
  ASSERT_EQ(inuse_space, alloc_objects + 3);
  EXPECT_GE(profile->ValueIndex("cpu-time"), 0);
  if (!kIntercepted) {
    GTEST_SKIP() << "the sanitizer's allocator is called without a GOT slot here";
  }
  // Every walk reached the allocating code: no hook frame is left.
  EXPECT_EQ(stats.samples_untrimmed, 0u);
  for (const auto& s : profile->samples) {
    if (s.values[alloc_objects] == 0 && s.values[inuse_objects] == 0) continue;
    for (const std::string& frame : s.stack) {
      EXPECT_FALSE(absl::StrContains(frame, "OnAllocSample") ||
                   absl::StrContains(frame, "RecordSample") ||
                   absl::StrContains(frame, "UnwindHere") ||
                   absl::StrContains(frame, "inprof_malloc") ||
                   absl::StrContains(frame, "NewArrayWrapper"))
          << frame;
    }
  }

  // Expected values: the truth (n x size); bounds from EstimateBounds (four
  // sides checked at 1e-7 each: a false failure at most 4e-7 in all).
  const struct {
    const char* site;
    int index;
    int64_t n;
    double size;
  } checks[] = {
      {"AllocSiteSmallNew", alloc_space, kSmall, 1000},  // counted once, not again in malloc
      {"AllocSiteLargeMalloc", alloc_space, kLarge, 64 * 1024},
  };
  for (const auto& c : checks) {
    const double truth = static_cast<double>(c.n) * c.size;
    const stats::EstimateRange b = EstimateBounds(c.n, c.size);
    const double got = static_cast<double>(LeafSum(*profile, c.index, c.site));
    EXPECT_GE(got, b.low * truth) << c.site << ": " << got << " of " << truth;
    EXPECT_LE(got, b.high * truth) << c.site << ": " << got << " of " << truth;
  }
  // Live at the window's end: the kLive blocks (alloc_space and
  // inuse_space are the same samples' estimates); the freed sites none.
  {
    const double truth = kLive * 4096.0;
    const stats::EstimateRange b = EstimateBounds(kLive, 4096);
    const double got = static_cast<double>(LeafSum(*profile, inuse_space, "AllocSiteLive"));
    EXPECT_GE(got, b.low * truth) << got << " of " << truth;
    EXPECT_LE(got, b.high * truth) << got << " of " << truth;
    // Each value is within one byte of its exact sum, and both sum the
    // same samples (at most kLive of them).
    EXPECT_NEAR(static_cast<double>(LeafSum(*profile, inuse_space, "AllocSiteLive")),
                static_cast<double>(LeafSum(*profile, alloc_space, "AllocSiteLive")),
                kLive + 1);
  }
  // go tool pprof, the canonical reader, reads the same bytes per site
  // (-raw: values in sample-type order, leaf first).
  INPROF_REQUIRE_TOOL("go");
  {
    auto raw = testing::ReadWithGoPprofRaw(options.output);
    ASSERT_TRUE(raw.ok()) << raw.status();
    for (const auto& c : checks) {
      int64_t go_sum = 0;
      for (const auto& sample : *raw) {
        if (!sample.stack.empty() && absl::StrContains(sample.stack[0], c.site)) {
          ASSERT_GT(sample.values.size(), static_cast<size_t>(c.index));
          go_sum += sample.values[c.index];
        }
      }
      EXPECT_EQ(go_sum, LeafSum(*profile, c.index, c.site)) << c.site;
    }
    auto top = testing::GoPprof("-sample_index=inuse_space -top " + options.output);
    ASSERT_TRUE(top.ok()) << top.status();
    EXPECT_TRUE(absl::StrContains(*top, "AllocSiteLive")) << *top;
  }
  // inprof's own viewers offer the types: `inprof top -t inuse_space`
  // ranks the live site first (its ~41 MB against nothing else live).
  if (const char* cli = std::getenv("INPROF_CLI"); cli != nullptr && *cli != '\0') {
    auto top = testing::RunCommandSeparately(testing::ShellQuote(cli) + " top -t inuse_space " +
                                             testing::ShellQuote(options.output));
    ASSERT_TRUE(top.ok()) << top.status();
    EXPECT_EQ(top->exit_code, 0) << top->err;
    EXPECT_TRUE(absl::StrContains(top->out, "AllocSiteLive")) << top->out;
    EXPECT_TRUE(absl::StrContains(top->out, "inuse_space")) << top->out;
  }
  EXPECT_EQ(LeafSum(*profile, inuse_space, "AllocSiteSmallNew"), 0);
  EXPECT_EQ(LeafSum(*profile, inuse_space, "AllocSiteLargeMalloc"), 0);
  // The unregistered thread's allocations: walked on that thread, on their
  // own site, labelled as a thread that never registered (expected value
  // the truth; two more sides at 1e-8).
  {
    const double truth = kUnregistered * 65536.0;
    const stats::EstimateRange b =
        stats::SampledAllocationRange(kUnregistered, 65536, static_cast<double>(kPeriod), 1e-8);
    const double got =
        static_cast<double>(LeafSum(*profile, alloc_space, "AllocSiteUnregistered"));
    EXPECT_GE(got, b.low * truth) << got << " of " << truth;
    EXPECT_LE(got, b.high * truth) << got << " of " << truth;
    int64_t labelled = 0;
    for (const auto& sample : profile->samples) {
      if (sample.stack.empty() || !absl::StrContains(sample.stack[0], "AllocSiteUnregistered")) {
        continue;
      }
      auto it = sample.str_labels.find(AllocationProvider::kUnregisteredLabel[0]);
      if (it != sample.str_labels.end() && it->second == AllocationProvider::kUnregisteredLabel[1]) {
        labelled += sample.values[alloc_space];
      }
    }
    EXPECT_EQ(labelled, LeafSum(*profile, alloc_space, "AllocSiteUnregistered"));
  }
  EXPECT_GE(stats.samples_unregistered, 1u);  // expected ~632; P(0) = (1 - 0.632)^1000
  EXPECT_EQ(LeafSum(*profile, alloc_space, "allocations of unregistered"), 0);
  bool commented = false;
  for (const std::string& c : profile->comments) {
    commented |= absl::StrContains(c, "allocations sampled=");
  }
  EXPECT_TRUE(commented);
}

// The paths where C and C++ code grows its memory: a buffer grown by
// realloc, reallocarray, and one site that mixes malloc, calloc and
// realloc. noinline, so that each site is its stacks' leaf.
__attribute__((noinline)) void* AllocSiteReallocGrow(size_t keep_every) {
  static size_t calls = 0;
  void* p = Kept(std::malloc(128));
  for (size_t size = 256; size <= 64 * 1024; size *= 2) p = Kept(std::realloc(p, size));
  if (++calls % keep_every == 0) return p;
  std::free(p);
  return nullptr;
}
__attribute__((noinline)) void* AllocSiteReallocarray() {
  return Kept(reallocarray(nullptr, 512, 64));  // 32 KiB
}
__attribute__((noinline)) void AllocSiteMixed(std::vector<void*>& keep, bool kept) {
  void* a = Kept(std::malloc(1000));
  void* b = Kept(std::calloc(10, 1000));
  a = Kept(std::realloc(a, 20'000));
  if (kept) {
    keep.push_back(a);
    keep.push_back(b);
  } else {
    std::free(a);
    std::free(b);
  }
}

// How far an estimate may stray from its truth: groups of n allocations of
// `size` bytes, each sampled independently with p = 1 - exp(-size/period)
// and weighing size/p, so that each is a term of mean `size`, variance
// size^2 (1 - p) / p and range size/p: Bernstein's bound on the sum at
// `chance` a side, plus one byte a sample for the profile's rounding.
struct SizeGroup {
  int64_t n;
  double size;
};
double EstimateDeviation(std::initializer_list<SizeGroup> groups, double chance) {
  double variance = 0;
  double range = 0;
  double samples = 0;
  for (const SizeGroup& g : groups) {
    const double p = 1 - std::exp(-g.size / static_cast<double>(kPeriod));
    variance += static_cast<double>(g.n) * g.size * g.size * (1 - p) / p;
    range = std::max(range, g.size / p);
    samples += static_cast<double>(g.n);
  }
  return stats::BernsteinDeviation(variance, range, chance) + samples;
}

// What a site allocated, its own frame anywhere on the stack: a call counted
// twice (glibc's reallocarray calls realloc through libc's own slot) shows
// under the site with the inner call's frame as leaf.
int64_t SiteSum(const DecodedProfile& profile, int index, const std::string& site) {
  int64_t sum = 0;
  for (const auto& sample : profile.samples) {
    for (const std::string& frame : sample.stack) {
      if (absl::StrContains(frame, site)) {
        sum += sample.values[index];
        break;
      }
    }
  }
  return sum;
}

// Realloc is a free and a new allocation (as jemalloc, tcmalloc and Go
// account it), reallocarray counts once, and a mixed site's live bytes are
// its blocks': each against the truth the test counts itself, at the
// test's 64 KiB period. Before, a buffer grown 9 times showed ~7x the
// memory it held and reallocarray counted twice. Five two-sided checks at
// 1e-8 a side: a false failure at most 1e-7 a run.
TEST(AllocationProviderTest, ReallocReallocarrayAndMixedSitesMatchTheTruth) {
  if (!kIntercepted) GTEST_SKIP() << "the sanitizer's allocator is not intercepted";
  Options options = TestOptions("heap_realloc");
  HeapProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  constexpr int kGrown = 4'000;   // each 128 B -> 64 KiB in 9 reallocs, one in 4 kept
  constexpr int kKeepEvery = 4;
  constexpr int kArrays = 4'000;  // reallocarray(NULL, 512, 64), half kept
  constexpr int kMixed = 4'000;   // malloc 1,000 -> realloc 20,000 + calloc 10 x 1,000; half kept
  std::vector<void*> keep;
  {
    auto self = profiler.RegisterThread("main");
    for (int i = 0; i < kGrown; ++i) {
      if (void* p = AllocSiteReallocGrow(kKeepEvery)) keep.push_back(p);
    }
    for (int i = 0; i < kArrays; ++i) {
      void* p = AllocSiteReallocarray();
      ASSERT_NE(p, nullptr);
      if (i % 2 == 0) {
        keep.push_back(p);
      } else {
        std::free(p);
      }
    }
    for (int i = 0; i < kMixed; ++i) AllocSiteMixed(keep, i % 2 == 0);
  }
  ASSERT_TRUE(profiler.Stop().ok());
  for (void* p : keep) std::free(p);
  auto profile = ReadPprofFile(options.output);
  ASSERT_TRUE(profile.ok()) << profile.status();
  const int alloc_space = profile->ValueIndex("alloc_space");
  const int inuse_space = profile->ValueIndex("inuse_space");
  ASSERT_GE(alloc_space, 0);
  ASSERT_GE(inuse_space, 0);
  constexpr double kChance = 1e-8;
  // The grown buffers: allocated 128 + 256 + ... + 64 KiB each; live, the
  // kept quarter's 64 KiB.
  double grown_truth = 0;
  for (double size = 128; size <= 64 * 1024; size *= 2) grown_truth += kGrown * size;
  const struct {
    const char* site;
    int index;
    double truth;
    double deviation;
  } checks[] = {
      {"AllocSiteReallocGrow", alloc_space, grown_truth,
       EstimateDeviation({{kGrown, 128}, {kGrown, 256}, {kGrown, 512}, {kGrown, 1024},
                          {kGrown, 2048}, {kGrown, 4096}, {kGrown, 8192}, {kGrown, 16384},
                          {kGrown, 32768}, {kGrown, 65536}},
                         kChance)},
      {"AllocSiteReallocGrow", inuse_space, kGrown / kKeepEvery * 65536.0,
       EstimateDeviation({{kGrown / kKeepEvery, 65536}}, kChance)},
      {"AllocSiteReallocarray", alloc_space, kArrays * 32768.0,
       EstimateDeviation({{kArrays, 32768}}, kChance)},
      {"AllocSiteReallocarray", inuse_space, kArrays / 2 * 32768.0,
       EstimateDeviation({{kArrays / 2, 32768}}, kChance)},
      {"AllocSiteMixed", inuse_space, kMixed / 2 * 30'000.0,
       EstimateDeviation({{kMixed / 2, 20'000}, {kMixed / 2, 10'000}}, kChance)},
  };
  for (const auto& c : checks) {
    const double got = static_cast<double>(SiteSum(*profile, c.index, c.site));
    EXPECT_NEAR(got, c.truth, c.deviation)
        << c.site << " (" << (c.index == inuse_space ? "inuse" : "alloc") << "_space)";
  }
}

// The sites of the peak test. noinline, each the leaf of its stacks.
__attribute__((noinline)) void* PeakSiteA() { return Kept(std::malloc(3000)); }
__attribute__((noinline)) char* PeakSiteB() { return Kept(new char[20'000]); }
__attribute__((noinline)) void* PeakSiteC() {
  // A buffer grown by realloc to 64 KiB: only its last size is live.
  void* p = Kept(std::malloc(1024));
  for (size_t size = 2048; size <= 64 * 1024; size *= 2) p = Kept(std::realloc(p, size));
  return p;
}
__attribute__((noinline)) void* PeakSiteD() { return Kept(std::malloc(10'000)); }

// peak_inuse_*: the live heap when it was highest, by site, against the
// truth the test counts itself, for a program that frees everything
// before it stops (inuse_* is then empty: what a batch program's exit
// profile shows). Phase 1 grows the heap to 110 MB: site A on the main
// thread (60 MB), B on a registered thread that ends (40 MB), D on a
// thread that never registers (10 MB). Phase 2 frees A, grows C by
// realloc to 32 MB (below the high), then frees everything.
//
// Expected at the peak: A, B and D's full bytes, C none. Each site's
// estimate is a sum of independent terms (each block sampled with
// p = 1 - exp(-size/period), weighing size/p): EstimateDeviation's
// Bernstein bound at 1e-8 a side. The peak is phase 1's end unless C's
// estimate passed A's (then the peak would be in phase 2), which needs one
// of them outside its bound: the bounds below are checked not to overlap
// first. Eight two-sided checks at 1e-8 a side: a false failure at most
// 1.6e-7 a run.
TEST(AllocationProviderTest, PeakInuseIsTheHeapAtItsHighestPerSite) {
  if (!kIntercepted) GTEST_SKIP() << "the sanitizer's allocator is not intercepted";
  Options options = TestOptions("heap_peak");
  options.default_sample_type = "peak_inuse_space";
  HeapProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  constexpr int kA = 20'000, kB = 2'000, kC = 500, kD = 1'000;
  std::vector<void*> a, c, d;
  std::vector<char*> b;
  {
    auto self = profiler.RegisterThread("main");
    a.reserve(kA);
    b.reserve(kB);
    c.reserve(kC);
    d.reserve(kD);
    std::thread([&] {
      auto registered = profiler.RegisterThread("ends");
      for (int i = 0; i < kB; ++i) b.push_back(PeakSiteB());
    }).join();
    std::thread([&] {
      for (int i = 0; i < kD; ++i) d.push_back(PeakSiteD());
    }).join();
    for (int i = 0; i < kA; ++i) a.push_back(PeakSiteA());
    // Phase 2.
    for (void* p : a) std::free(p);
    for (int i = 0; i < kC; ++i) c.push_back(PeakSiteC());
    for (char* p : b) delete[] p;
    for (void* p : c) std::free(p);
    for (void* p : d) std::free(p);
  }
  ASSERT_TRUE(profiler.Stop().ok());
  auto profile = ReadPprofFile(options.output);
  ASSERT_TRUE(profile.ok()) << profile.status();
  const int inuse_space = profile->ValueIndex("inuse_space");
  const int peak_objects = profile->ValueIndex("peak_inuse_objects");
  const int peak_space = profile->ValueIndex("peak_inuse_space");
  ASSERT_GE(inuse_space, 0);
  ASSERT_EQ(peak_objects, inuse_space + 1);
  ASSERT_EQ(peak_space, inuse_space + 2);
  EXPECT_EQ(profile->sample_types[peak_space].unit, "bytes");
  EXPECT_EQ(profile->sample_types[peak_objects].unit, "count");
  // The profile opens on the peak (Options::default_sample_type).
  EXPECT_EQ(profile->default_sample_type, "peak_inuse_space");
  constexpr double kChance = 1e-8;
  const double dev_a = EstimateDeviation({{kA, 3000}}, kChance);
  const double dev_c = EstimateDeviation({{kC, 65536}}, kChance);
  // The premise: A's estimate within its bound is above C's within its.
  ASSERT_GT(kA * 3000.0 - dev_a, kC * 65536.0 + dev_c);
  const struct {
    const char* site;
    double truth;
    double deviation;
  } checks[] = {
      {"PeakSiteA", kA * 3000.0, dev_a},
      {"PeakSiteB", kB * 20'000.0, EstimateDeviation({{kB, 20'000}}, kChance)},
      {"PeakSiteD", kD * 10'000.0, EstimateDeviation({{kD, 10'000}}, kChance)},
  };
  for (const auto& site : checks) {
    const double got = static_cast<double>(SiteSum(*profile, peak_space, site.site));
    EXPECT_NEAR(got, site.truth, site.deviation) << site.site << " (peak_inuse_space)";
  }
  // Objects: the same samples' counts (each term 1/p, at most 1/p apart
  // per sample from the bytes / size; checked on A at its own bound).
  {
    const double got = static_cast<double>(SiteSum(*profile, peak_objects, "PeakSiteA"));
    EXPECT_NEAR(got, kA, dev_a / 3000 + 1) << "PeakSiteA (peak_inuse_objects)";
  }
  EXPECT_EQ(SiteSum(*profile, peak_space, "PeakSiteC"), 0);
  // Everything was freed: nothing in use at the end.
  EXPECT_EQ(SiteSum(*profile, inuse_space, "PeakSite"), 0);
  // The unregistered thread's part carries its label, on "[events]".
  int64_t labelled = 0;
  for (const auto& sample : profile->samples) {
    if (sample.stack.empty() || !absl::StrContains(sample.stack[0], "PeakSiteD")) continue;
    auto it = sample.str_labels.find(AllocationProvider::kUnregisteredLabel[0]);
    if (it != sample.str_labels.end()) labelled += sample.values[peak_space];
  }
  EXPECT_EQ(labelled, SiteSum(*profile, peak_space, "PeakSiteD"));
  // The readers: go tool pprof and inprof top rank A first on the peak.
  INPROF_REQUIRE_TOOL("go");
  {
    auto raw = testing::ReadWithGoPprofRaw(options.output);
    ASSERT_TRUE(raw.ok()) << raw.status();
    int64_t go_sum = 0;
    for (const auto& sample : *raw) {
      if (!sample.stack.empty() && absl::StrContains(sample.stack[0], "PeakSiteA")) {
        ASSERT_GT(sample.values.size(), static_cast<size_t>(peak_space));
        go_sum += sample.values[peak_space];
      }
    }
    EXPECT_EQ(go_sum, SiteSum(*profile, peak_space, "PeakSiteA"));
    // Its default index is the profile's default type.
    auto top = testing::GoPprof("-top -nodecount=3 " + options.output);
    ASSERT_TRUE(top.ok()) << top.status();
    EXPECT_TRUE(absl::StrContains(*top, "peak_inuse_space")) << *top;
    EXPECT_TRUE(absl::StrContains(*top, "PeakSiteA")) << *top;
  }
  if (const char* cli = std::getenv("INPROF_CLI"); cli != nullptr && *cli != '\0') {
    auto top = testing::RunCommandSeparately(testing::ShellQuote(cli) + " top " +
                                             testing::ShellQuote(options.output));
    ASSERT_TRUE(top.ok()) << top.status();
    EXPECT_EQ(top->exit_code, 0) << top->err;
    EXPECT_TRUE(absl::StrContains(top->out, "peak_inuse_space")) << top->out;
    const size_t a_at = top->out.find("PeakSiteA"), b_at = top->out.find("PeakSiteB");
    EXPECT_NE(a_at, std::string::npos) << top->out;
    EXPECT_LT(a_at, b_at) << top->out;
  }
}

// A host that asks the allocator about its blocks sees what it would see
// unprofiled: the hooks keep no header in a block (sampled or not), and
// malloc_usable_size, mallopt and malloc_trim are not intercepted.
TEST(AllocationProviderTest, MallocUsableSizeTrimAndMalloptAreUnchanged) {
  std::vector<size_t> before;
  for (size_t size : {size_t{1}, size_t{48}, size_t{1000}, size_t{64} << 10, size_t{1} << 20}) {
    // Twice, the second answer kept: glibc serves 1 MiB by mmap until the
    // first such block is freed, which raises its mmap threshold (the
    // dynamic threshold) so that the next one comes from the heap, 4 KiB
    // smaller. Whether an earlier test of this process freed one decided
    // which of the two the first answer was.
    size_t usable = 0;
    for (int pass = 0; pass < 2; ++pass) {
      void* p = std::malloc(size);
      usable = malloc_usable_size(p);
      std::free(p);
    }
    before.push_back(usable);
  }
  // What the allocator answers unprofiled (glibc: 1; ASan's runtime: 0).
  const int mallopt_before = mallopt(M_TRIM_THRESHOLD, 1 << 20);
  Options options = TestOptions("heap_usable");
  options.alloc_period = 1;  // nearly every allocation sampled: blocks with entries
  HeapProfiler profiler(options);
  const uint64_t samples_before = AllocationProvider::stats().samples;
  ASSERT_TRUE(profiler.Start().ok());
  {
    auto self = profiler.RegisterThread("main");
    size_t i = 0;
    for (size_t size :
         {size_t{1}, size_t{48}, size_t{1000}, size_t{64} << 10, size_t{1} << 20}) {
      void* p = std::malloc(size);
      // The allocator's own answer for its own block: at least `size`, and
      // what it was unprofiled give or take one 16-byte step (glibc hands
      // over a whole free chunk when splitting it would leave less than
      // its 32-byte minimum, whichever call it is: measured once, 40 for
      // 24 for malloc(1), depending on what the heap held). A header of the
      // hooks' would move the pointer off the chunk the size is read from.
      const size_t usable = malloc_usable_size(p);
      EXPECT_GE(usable, size);
      EXPECT_LE(usable, before[i] + 16) << size;
      EXPECT_GE(usable + 16, before[i]) << size;
      ++i;
      std::memset(p, 0xab, usable);  // all of it is the host's
      std::free(p);
    }
    EXPECT_EQ(mallopt(M_TRIM_THRESHOLD, 1 << 20), mallopt_before);
    (void)malloc_trim(0);
  }
  ASSERT_TRUE(profiler.Stop().ok());
  // At a period of 1 byte an allocation of `size` is sampled with chance
  // 1 - e^-size: the four of 48 B and more all are but for e^-48 (1e-21);
  // the 1-byte one is with chance 0.63, not counted on.
  if (kIntercepted) {
    EXPECT_GE(AllocationProvider::stats().samples - samples_before, 4u);
  }
}

__attribute__((noinline)) void* AllocSiteServedLive() { return Kept(std::malloc(4096)); }
__attribute__((noinline)) void* AllocSiteServedFreed() { return Kept(std::malloc(64 * 1024)); }
__attribute__((noinline)) void* AllocSiteServedDuring() { return Kept(std::malloc(64 * 1024)); }

// How many of a profile's samples have `site` as their leaf.
int StacksAt(const DecodedProfile& profile, const std::string& site) {
  int n = 0;
  for (const auto& s : profile.samples) n += !s.stack.empty() && absl::StrContains(s.stack[0], site);
  return n;
}

// /debug/pprof/heap, as Go serves it: the live heap now (inuse_*) and what
// was allocated since Start (alloc_*), only those four types, opening on
// inuse_space; /allocs opens on alloc_space. The profile's window is not
// cut: the file written at Stop still has every allocation.
TEST(AllocationProviderTest, TheLiveEndpointServesTheHeapNow) {
  Options options = TestOptions("heap_endpoint");
  options.http_addr = "127.0.0.1:0";
  HeapProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  constexpr int kLive = 10'000;  // x 4 KiB, live when the page is fetched
  constexpr int kFreed = 1'000;  // x 64 KiB, freed before
  std::vector<void*> live;
  {
    auto self = profiler.RegisterThread("main");
    for (int i = 0; i < kFreed; ++i) std::free(AllocSiteServedFreed());
    live.reserve(kLive);
    for (int i = 0; i < kLive; ++i) live.push_back(AllocSiteServedLive());
  }
  const std::string address = profiler.http_address();
  ASSERT_FALSE(address.empty());
  testing::HttpReply heap = testing::HttpFetch(address, "GET", "/debug/pprof/heap");
  testing::HttpReply allocs = testing::HttpFetch(address, "GET", "/debug/pprof/allocs");
  testing::HttpReply text = testing::HttpFetch(address, "GET", "/debug/pprof/heap?debug=1");
  // seconds=2: the delta of two snapshots two seconds apart. A thread makes
  // kDuring blocks at AllocSiteServedDuring between them: it starts once
  // the index page says the delta runs (its first snapshot is taken right
  // after that flag is set), 100 ms later; the sites made before are not
  // in the delta.
  constexpr int kDuring = 1'000;  // x 64 KiB, freed
  std::thread during([&] {
    auto registration = profiler.RegisterThread("during");
    for (int i = 0; i < 2000; ++i) {
      testing::HttpReply index = testing::HttpFetch(address, "GET", "/debug/pprof/");
      if (absl::StrContains(index.body, "id=\"running\"")) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    for (int i = 0; i < kDuring; ++i) std::free(AllocSiteServedDuring());
  });
  testing::HttpReply delta =
      testing::HttpFetch(address, "GET", "/debug/pprof/allocs?seconds=2");
  during.join();
  ASSERT_TRUE(profiler.Stop().ok());
  for (void* p : live) std::free(p);
  ASSERT_EQ(heap.error, "");
  ASSERT_EQ(heap.status, 200) << heap.body;
  ASSERT_EQ(allocs.status, 200) << allocs.body;
  absl::StatusOr<DecodedProfile> p = DecodePprof(heap.body);
  ASSERT_TRUE(p.ok()) << p.status();
  std::vector<std::string> types;
  for (const ValueType& t : p->sample_types) types.push_back(t.type);
  ASSERT_EQ(types, (std::vector<std::string>{"alloc_objects", "alloc_space", "inuse_objects",
                                             "inuse_space"}));
  EXPECT_EQ(p->period_type.type, "alloc_space");
  EXPECT_EQ(p->period, static_cast<int64_t>(kPeriod));
  EXPECT_EQ(p->default_sample_type, "inuse_space");
  absl::StatusOr<DecodedProfile> a = DecodePprof(allocs.body);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->default_sample_type, "alloc_space");
  ASSERT_EQ(delta.status, 200) << delta.body;
  absl::StatusOr<DecodedProfile> d = DecodePprof(delta.body);
  ASSERT_TRUE(d.ok()) << d.status();
  // Made before the window: none of it in the delta but each snapshot's
  // rounding (each stack's sum rounded unbiasedly, within one of it, in
  // each: deterministic, at most one a stack).
  EXPECT_LE(std::abs(LeafSum(*d, 1, "AllocSiteServedFreed")),
            StacksAt(*p, "AllocSiteServedFreed"));
  EXPECT_LE(std::abs(LeafSum(*d, 3, "AllocSiteServedLive")), StacksAt(*p, "AllocSiteServedLive"));
  // debug=1: the legacy text form, as Go's page serves it: its header line,
  // a line per stack, then the process's mappings.
  ASSERT_EQ(text.status, 200) << text.body;
  EXPECT_TRUE(absl::StartsWith(text.body, "heap profile: ")) << text.body.substr(0, 200);
  EXPECT_TRUE(absl::StrContains(text.body, "\nMAPPED_LIBRARIES:\n")) << text.body.substr(0, 200);
  EXPECT_TRUE(absl::StrContains(text.body, "allocation_provider_test")) << "no mapping of the test";
  if (!kIntercepted) {
    // Not "no sample in this process": libstdc++'s own allocations (through
    // its slots) were sampled by the tests before this one.
    GTEST_SKIP() << "the sanitizer's allocator is called without a GOT slot here";
  }
  // Bounds as in SitesBytesAndLiveHeapWithinTheirBounds (EstimateBounds:
  // 1e-7 a side; four sides here, the file's check adds two).
  const double live_truth = kLive * 4096.0;
  const stats::EstimateRange live_b = EstimateBounds(kLive, 4096);
  const double served_live = static_cast<double>(LeafSum(*p, 3, "AllocSiteServedLive"));
  EXPECT_GE(served_live, live_b.low * live_truth) << served_live << " of " << live_truth;
  EXPECT_LE(served_live, live_b.high * live_truth) << served_live << " of " << live_truth;
  EXPECT_EQ(LeafSum(*p, 3, "AllocSiteServedFreed"), 0);  // freed: not in use
  const double freed_truth = kFreed * 65536.0;
  const stats::EstimateRange freed_b = EstimateBounds(kFreed, 65536);
  const double served_freed = static_cast<double>(LeafSum(*p, 1, "AllocSiteServedFreed"));
  EXPECT_GE(served_freed, freed_b.low * freed_truth) << served_freed << " of " << freed_truth;
  EXPECT_LE(served_freed, freed_b.high * freed_truth) << served_freed << " of " << freed_truth;
  // Made inside the delta's seconds: its estimate within its bounds (two
  // more sides at 1e-8).
  const double during_truth = kDuring * 65536.0;
  const stats::EstimateRange during_b =
      stats::SampledAllocationRange(kDuring, 65536, static_cast<double>(kPeriod), 1e-8);
  const double served_during = static_cast<double>(LeafSum(*d, 1, "AllocSiteServedDuring"));
  EXPECT_GE(served_during, during_b.low * during_truth) << served_during << " of " << during_truth;
  EXPECT_LE(served_during, during_b.high * during_truth) << served_during << " of " << during_truth;
  // The same samples in the file at Stop: the page took nothing from it.
  // The file's value is rounded per drained event (at most one per sample,
  // each within one byte), the page's once.
  auto file = ReadPprofFile(options.output);
  ASSERT_TRUE(file.ok()) << file.status();
  const int file_alloc_space = file->ValueIndex("alloc_space");
  EXPECT_NEAR(static_cast<double>(LeafSum(*file, file_alloc_space, "AllocSiteServedFreed")),
              served_freed, kFreed + 1);
  INPROF_REQUIRE_TOOL("go");
  {
    // The endpoint is gone after Stop: go tool pprof reads the page saved.
    const std::string saved = testing::FreshTestDir("heap_endpoint_page") + "/heap.pb.gz";
    {
      std::ofstream out(saved, std::ios::binary);
      out << heap.body;
      ASSERT_TRUE(out.good());
    }
    auto top = testing::GoPprof("-sample_index=inuse_space -top " + saved);
    ASSERT_TRUE(top.ok()) << top.status();
    EXPECT_TRUE(absl::StrContains(*top, "AllocSiteServedLive")) << *top;
  }
}

__attribute__((noinline)) void* AllocSiteLabeled() { return Kept(std::malloc(64 * 1024)); }

// A registered thread's allocations carry its thread (id and registered
// name) and its labels, as its CPU samples do; what is still live at the
// window's end carries the labels on the "[events]" thread.
TEST(AllocationProviderTest, SamplesCarryTheThreadAndItsLabels) {
  Options options = TestOptions("heap_labels");
  HeapProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  std::vector<void*> live;
  std::thread worker([&] {
    auto self = profiler.RegisterThread("heap-worker");
    ScopedLabels labels(profiler, {{"request", "upload"}});
    // 400 x 64 KiB at a 64 KiB period: each sampled with p = 1 - 1/e, so
    // the chance that none is, (1/e)^400, is nil; all of them stay live.
    for (int i = 0; i < 400; ++i) live.push_back(AllocSiteLabeled());
  });
  worker.join();
  ASSERT_TRUE(profiler.Stop().ok());
  for (void* p : live) std::free(p);
  if (!kIntercepted) {
    // (The tests before this one sampled libstdc++'s own allocations: the
    // process's count is not 0 here.)
    GTEST_SKIP() << "the sanitizer's allocator is called without a GOT slot here";
  }
  auto profile = ReadPprofFile(options.output);
  ASSERT_TRUE(profile.ok()) << profile.status();
  const int alloc_space = profile->ValueIndex("alloc_space");
  const int inuse_space = profile->ValueIndex("inuse_space");
  int64_t allocated_on_worker = 0;
  int64_t live_labeled = 0;
  for (const auto& s : profile->samples) {
    if (s.stack.empty() || !absl::StrContains(s.stack[0], "AllocSiteLabeled")) continue;
    auto label = s.str_labels.find("request");
    ASSERT_NE(label, s.str_labels.end()) << "a sample without its label";
    EXPECT_EQ(label->second, "upload");
    auto thread = s.str_labels.find("thread name");
    ASSERT_NE(thread, s.str_labels.end());
    if (s.values[alloc_space] > 0) {
      EXPECT_EQ(thread->second, "heap-worker");
      allocated_on_worker += s.values[alloc_space];
    }
    if (s.values[inuse_space] > 0) {
      EXPECT_EQ(thread->second, "[events]");
      live_labeled += s.values[inuse_space];
    }
  }
  EXPECT_GT(allocated_on_worker, 0);
  // The same samples, all live: each value is its exact sum rounded to a
  // whole byte (alloc_space once per sample, inuse_space once per stack),
  // so they differ by less than one byte per sample and one more.
  EXPECT_NEAR(static_cast<double>(live_labeled), static_cast<double>(allocated_on_worker),
              400 + 1);
}

// tests/alloc/alloc_test_lib.cc, opened: its functions allocate through
// the library's own GOT. handle is null when dlopen failed (dlerror says
// why); a function is null when the library lacks it.
struct AllocTestLib {
  void* handle = nullptr;
  void* (*malloc_fn)(size_t) = nullptr;
  void* (*realloc_fn)(void*, size_t) = nullptr;
  void (*free_fn)(void*) = nullptr;
};
AllocTestLib OpenAllocTestLib(const std::string& path) {
  AllocTestLib lib;
  lib.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib.handle == nullptr) return lib;
  lib.malloc_fn = reinterpret_cast<void* (*)(size_t)>(dlsym(lib.handle, "LibMalloc"));
  lib.realloc_fn = reinterpret_cast<void* (*)(void*, size_t)>(dlsym(lib.handle, "LibRealloc"));
  lib.free_fn = reinterpret_cast<void (*)(void*)>(dlsym(lib.handle, "LibFree"));
  return lib;
}

// Allocations a loaded library makes through its own GOT, from two
// registered threads at once. Unlike the test executable's own calls, these
// are intercepted under the sanitizers too (their runtime's malloc is the
// global definition the library's slots are bound to), so the sampled path
// (walk, interning, the thread's events, the collector's drain) runs under
// ASan and TSan here.
TEST(AllocationProviderTest, AllocationsInALoadedLibraryAreProfiled) {
  const std::string path = testing::EnvOrEmpty("INPROF_ALLOC_TEST_LIB");
  if (path.empty()) GTEST_SKIP() << "INPROF_ALLOC_TEST_LIB is not set (run through meson test)";
  const AllocTestLib lib = OpenAllocTestLib(path);
  ASSERT_NE(lib.handle, nullptr) << dlerror();
  auto lib_malloc = lib.malloc_fn;
  auto lib_free = lib.free_fn;
  ASSERT_NE(lib_malloc, nullptr);
  ASSERT_NE(lib_free, nullptr);
  Options options = TestOptions("heap_lib");
  HeapProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  const uint64_t before = AllocationProvider::stats().samples;
  std::vector<void*> kept[2];
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      auto self = profiler.RegisterThread(t == 0 ? "lib-a" : "lib-b");
      // 400 x 64 KiB a thread at a 64 KiB period, half kept: the chance
      // that none is sampled, (1/e)^400, is nil.
      for (int i = 0; i < 400; ++i) {
        void* p = lib_malloc(64 * 1024);
        if (i % 2 == 0) {
          kept[t].push_back(p);
        } else {
          lib_free(p);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(profiler.Stop().ok());
  for (auto& k : kept) {
    for (void* p : k) lib_free(p);
  }
  EXPECT_GT(AllocationProvider::stats().samples, before);
  auto profile = ReadPprofFile(options.output);
  ASSERT_TRUE(profile.ok()) << profile.status();
  const int alloc_space = profile->ValueIndex("alloc_space");
  const int inuse_space = profile->ValueIndex("inuse_space");
  // The samples are on this test's threads' stacks (LibMalloc, at -O2,
  // tail-calls malloc and leaves no frame; the thread body is an inline
  // frame named "operator()"), cut before the hooks' frames.
  for (int index : {alloc_space, inuse_space}) {
    int64_t on_test = 0;
    for (const auto& sample : profile->samples) {
      if (sample.values[index] == 0) continue;
      bool test_frame = false;
      for (const std::string& frame : sample.stack) {
        test_frame |= absl::StrContains(frame, "AllocationsInALoadedLibraryAreProfiled");
        EXPECT_FALSE(absl::StrContains(frame, "inprof_malloc")) << frame;
      }
      if (test_frame) on_test += sample.values[index];
    }
    EXPECT_GT(on_test, 0) << profile->sample_types[index].type;
  }
  auto by_thread = profile->ByLabel("thread name", alloc_space);
  EXPECT_GT(by_thread["lib-a"], 0);
  EXPECT_GT(by_thread["lib-b"], 0);
  dlclose(lib.handle);
}

// Threads that come and go, each growing blocks with realloc through a
// loaded library's GOT, while the collector drains: the path the
// sanitizer suites check for races and memory errors even where the test
// executable's own calls are not hooked (TSan's runtime is linked into the
// executable). Twelve threads in three waves of four; each allocates 200
// blocks of 16 KiB, grows each to 64 KiB with realloc, keeps every other
// one and frees the rest, then ends. At Stop() the live heap is exactly
// the 1,200 kept 64 KiB blocks (realloc: the 16 KiB block freed, a 64 KiB
// one allocated), threads long gone included.
TEST(AllocationProviderTest, ThreadsThatEndLeaveTheirReallocatedBlocksInTheLiveHeap) {
  const std::string path = testing::EnvOrEmpty("INPROF_ALLOC_TEST_LIB");
  if (path.empty()) GTEST_SKIP() << "INPROF_ALLOC_TEST_LIB is not set (run through meson test)";
  const AllocTestLib lib = OpenAllocTestLib(path);
  ASSERT_NE(lib.handle, nullptr) << dlerror();
  auto lib_malloc = lib.malloc_fn;
  auto lib_realloc = lib.realloc_fn;
  auto lib_free = lib.free_fn;
  ASSERT_NE(lib_malloc, nullptr);
  ASSERT_NE(lib_realloc, nullptr);
  ASSERT_NE(lib_free, nullptr);
  constexpr int kWaves = 3, kPerWave = 4, kBlocks = 200;
  constexpr size_t kSmall = 16 * 1024, kLarge = 64 * 1024;
  Options options = TestOptions("heap_lib_threads");
  HeapProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  // Room made before the threads start: their only allocations are the
  // library's.
  std::vector<std::vector<void*>> kept(kWaves * kPerWave, std::vector<void*>(kBlocks / 2));
  for (int wave = 0; wave < kWaves; ++wave) {
    std::vector<std::thread> threads;
    for (int t = 0; t < kPerWave; ++t) {
      const int index = wave * kPerWave + t;
      threads.emplace_back([&, index] {
        auto self = profiler.RegisterThread(index % 2 == 0 ? "lib-even" : "lib-odd");
        for (int i = 0; i < kBlocks; ++i) {
          void* p = lib_realloc(lib_malloc(kSmall), kLarge);
          if (i % 2 == 0) {
            kept[index][i / 2] = p;
          } else {
            lib_free(p);
          }
        }
      });
    }
    for (auto& t : threads) t.join();
  }
  ASSERT_TRUE(profiler.Stop().ok());
  for (auto& blocks : kept) {
    for (void* p : blocks) lib_free(p);
  }
  auto profile = ReadPprofFile(options.output);
  ASSERT_TRUE(profile.ok()) << profile.status();
  const int inuse_space = profile->ValueIndex("inuse_space");
  const int alloc_space = profile->ValueIndex("alloc_space");
  ASSERT_GE(inuse_space, 0);
  ASSERT_GE(alloc_space, 0);
  // The live heap is the process's, not a thread's (its blocks outlive
  // their threads): on the "[events]" thread, at the allocating stacks.
  int64_t live = 0;
  for (const auto& sample : profile->samples) {
    for (const std::string& frame : sample.stack) {
      if (absl::StrContains(frame, "ThreadsThatEndLeaveTheirReallocatedBlocksInTheLiveHeap")) {
        live += sample.values[inuse_space];
        break;
      }
    }
  }
  // Each kept block was sampled when realloc allocated it, with chance
  // 1 - exp(-64 KiB / period), independently, and stands for its size
  // over that chance: stats::SampledAllocationRange, 1e-7 a side.
  constexpr int64_t kLive = int64_t{kWaves} * kPerWave * (kBlocks / 2);
  const stats::EstimateRange range =
      stats::SampledAllocationRange(kLive, static_cast<double>(kLarge), static_cast<double>(kPeriod));
  const double truth = static_cast<double>(kLive) * static_cast<double>(kLarge);
  EXPECT_GE(static_cast<double>(live), range.low * truth);
  EXPECT_LE(static_cast<double>(live), range.high * truth);
  // The allocations are each thread's, ended or not: both halves of the
  // threads made 1,200 reallocations of 64 KiB (the chance that none of
  // one half's is sampled is (1/e)^1200).
  auto by_thread = profile->ByLabel("thread name", alloc_space);
  EXPECT_GT(by_thread["lib-even"], 0);
  EXPECT_GT(by_thread["lib-odd"], 0);
  dlclose(lib.handle);
}

// Stop() writes every GOT slot back: a malloc after it is the allocator's
// own, through the slot (dlsym's malloc is what the slot holds).
TEST(AllocationProviderTest, StopPutsTheAllocatorBack) {
  Options options = TestOptions("heap_restore");
  HeapProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  const uint64_t before = AllocationProvider::stats().samples;
  {
    auto self = profiler.RegisterThread("main");
    for (int i = 0; i < 100; ++i) std::free(AllocSiteLargeMalloc());
  }
  ASSERT_TRUE(profiler.Stop().ok());
  const uint64_t during = AllocationProvider::stats().samples - before;
  for (int i = 0; i < 100; ++i) std::free(AllocSiteLargeMalloc());
  EXPECT_EQ(AllocationProvider::stats().samples - before, during);
  if (kIntercepted) {
    // 100 allocations of 64 KiB at a 64 KiB period: ~63 expected; the
    // chance of none is (1 - 0.632)^100 ~ 1e-43.
    EXPECT_GT(during, 0u);
  }
}

// Stats' byte estimates (what the gperftools drop-in's dump intervals
// read): at a period of 1 byte every allocation of 1,000 bytes is sampled
// with p = 1 - exp(-1000) = 1 in a double, so each weighs exactly its
// size and the estimates are the truth (deterministic).
TEST(AllocationProviderTest, ByteEstimatesAreExactWhenEveryAllocationIsSampled) {
  if (!kIntercepted) GTEST_SKIP() << "the sanitizer's allocator is not intercepted";
  Options options = TestOptions("heap_stats_bytes");
  options.alloc_period = 1;
  HeapProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  auto self = profiler.RegisterThread("main");
  char* blocks[10];
  const AllocationProvider::Stats before = AllocationProvider::stats();
  for (char*& b : blocks) b = AllocSiteSmallNew();
  const AllocationProvider::Stats allocated = AllocationProvider::stats();
  for (int i = 0; i < 4; ++i) delete[] blocks[i];
  const AllocationProvider::Stats freed = AllocationProvider::stats();
  for (int i = 4; i < 10; ++i) delete[] blocks[i];
  EXPECT_EQ(allocated.alloc_bytes - before.alloc_bytes, 10'000u);
  EXPECT_EQ(allocated.inuse_bytes - before.inuse_bytes, 10'000u);
  EXPECT_EQ(freed.freed_bytes - allocated.freed_bytes, 4'000u);
  EXPECT_EQ(freed.inuse_bytes, allocated.inuse_bytes - 4'000u);
  EXPECT_EQ(AllocationProvider::stats().inuse_bytes, before.inuse_bytes);
  EXPECT_EQ(freed.live_overflows, before.live_overflows);
  ASSERT_TRUE(profiler.Stop().ok());
}

// The host keeps working in the states the hooks can be caught in.
__attribute__((noinline)) void* AllocSiteBeforeStart() { return Kept(std::malloc(64 * 1024)); }

// Blocks allocated before Start() and freed while it runs were never
// sampled: their frees find nothing to erase, and nothing of them is live.
// malloc_usable_size and realloc of such a block and of a sampled one see
// the allocator's own blocks.
TEST(AllocationProviderTest, BlocksFromBeforeStartAreHarmless) {
  Options options = TestOptions("heap_before");
  std::vector<void*> before;
  for (int i = 0; i < 200; ++i) before.push_back(AllocSiteBeforeStart());
  HeapProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  {
    auto self = profiler.RegisterThread("main");
    for (void*& p : before) {
      EXPECT_GE(malloc_usable_size(p), 64u * 1024);
      p = std::realloc(p, 128 * 1024);  // moved or not, the allocator's block
      ASSERT_NE(p, nullptr);
      EXPECT_GE(malloc_usable_size(p), 128u * 1024);
    }
    for (void* p : before) std::free(p);
    void* sampled = AllocSiteLargeMalloc();
    EXPECT_GE(malloc_usable_size(sampled), 64u * 1024);
    std::free(sampled);
  }
  ASSERT_TRUE(profiler.Stop().ok());
  auto profile = ReadPprofFile(options.output);
  ASSERT_TRUE(profile.ok()) << profile.status();
  const int inuse_space = profile->ValueIndex("inuse_space");
  // The blocks from before Start(), reallocated and freed, and the sampled
  // one, freed: none is live at the window's end. (inprof's own work on
  // this thread, its registration's end among it, runs under an AllocGuard:
  // before it did, a block of that work was found live here once in ~60
  // runs, on the unregistered-threads frame.)
  EXPECT_EQ(LeafSum(*profile, inuse_space, "AllocSiteBeforeStart"), 0);
  EXPECT_EQ(LeafSum(*profile, inuse_space, "BlocksFromBeforeStartAreHarmless"), 0);
  EXPECT_EQ(LeafSum(*profile, inuse_space, "AllocSiteLargeMalloc"), 0);

}

// fork() while the hooks run: the child allocates and frees through the
// patched slots (sampling on, no collector) and exits normally; the
// parent's profile is unaffected.
TEST(AllocationProviderTest, ForkedChildAllocatesAndExits) {
#if defined(INPROF_TSAN)
  GTEST_SKIP() << "TSan does not support fork() of a multi-threaded process";
#endif
#if defined(INPROF_ASAN)
  // GCC 12's libasan takes no allocator locks around fork(): a child forked
  // while one of inprof's threads (the collector, the ticker, the file
  // thread exporting) is inside malloc hangs in its first allocation
  // (SafetyForkTest.ChildForkedWhileCollectorRunsCanStop says more; a
  // clean-clone ASan run: this test's child hung until the 240 s timeout,
  // 1 of 2 runs). The plain build runs this test.
  GTEST_SKIP() << "this libasan does not lock its allocator across fork()";
#endif
  Options options = TestOptions("heap_fork");
  HeapProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  auto self = profiler.RegisterThread("main");
  fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    for (int i = 0; i < 2000; ++i) std::free(AllocSiteLargeMalloc());
    std::vector<char*> small;
    for (int i = 0; i < 10000; ++i) small.push_back(new char[100]);
    for (char* p : small) delete[] p;
    _exit(0);
  }
  ASSERT_GT(pid, 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  for (int i = 0; i < 100; ++i) std::free(AllocSiteLargeMalloc());
  self = ThreadRegistration();
  ASSERT_TRUE(profiler.Stop().ok());
  auto profile = ReadPprofFile(options.output);
  ASSERT_TRUE(profile.ok()) << profile.status();
}

// INPROF_ALLOC_PERIOD=0 (the default): nothing is patched, and the profile
// has no allocation types.
// fork() while another thread is inside dlopen(): the hooks patch the new
// object under their install lock, and a child forked at that moment found
// it held forever: the child's own profiler (what inprof run's preload
// starts in every child, and what library mode's child constructs) hung in
// Start(), inside the hooks (39 of 40 children of such a program). The lock
// is a fork lock now (base/fork_guard.h), and a child takes its parent's
// installation over without a loader call (glibc 2.36 hangs a child forked
// during a dlopen at its first one: 27 of 200 children that dlopen()ed,
// without inprof). 40 children each stop the inherited profiler, start one
// of their own with allocations sampled, allocate and _exit, while a
// thread loads and unloads a library; a child still there after 10 s
// counts as hung (deterministic: none may hang).
TEST(AllocationProviderTest, ChildrenForkedDuringDlopenNeverHang) {
#if defined(INPROF_TSAN)
  GTEST_SKIP() << "TSan does not support fork() of a multi-threaded process";
#else
  const char* late = std::getenv("INPROF_ALLOC_TEST_LATE_LIB");
  if (late == nullptr) GTEST_SKIP() << "INPROF_ALLOC_TEST_LATE_LIB is not set (run through meson test)";
  Options options = TestOptions("heap_fork_dlopen");
  HeapProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  std::atomic<bool> stop{false};
  std::atomic<int> loads{0};
  std::thread loader([&] {
    while (!stop.load()) {
      void* h = dlopen(late, RTLD_NOW);
      if (h != nullptr) dlclose(h);
      loads.fetch_add(1);
    }
  });
  while (loads.load() < 5) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  int hung = 0;
  int failed = 0;
  for (int i = 0; i < 40; ++i) {
    fflush(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
      alarm(10);
      (void)profiler.Stop();  // the parent's, stopped in the child
      Options child_options = TestOptions("heap_fork_dlopen_child");
      child_options.output = "/dev/null";
      HeapProfiler child(child_options);
      if (!child.Start().ok()) _exit(1);
      std::free(AllocSiteLargeMalloc());
      // No Stop(): its walk over the loaded objects (dl_iterate_phdr) would
      // wait for the loader's list lock, which glibc 2.36 leaves held in a
      // child forked during a dlopen (docs/measurements.md); most forked
      // children exec or _exit.
      _exit(0);
    }
    ASSERT_GT(pid, 0);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM) {
      ++hung;
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ++failed;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(500 + 97 * i));
  }
  stop.store(true);
  loader.join();
  ASSERT_TRUE(profiler.Stop().ok());
  EXPECT_EQ(hung, 0) << "children hung in their profiler's Start (of 40)";
  EXPECT_EQ(failed, 0);
#endif
}

TEST(AllocationProviderTest, OffByDefault) {
  Options options = TestOptions("heap_off");
  options.alloc_period = 0;
  HeapProfiler profiler(options);
  const uint64_t before = AllocationProvider::stats().samples;
  ASSERT_TRUE(profiler.Start().ok());
  {
    auto self = profiler.RegisterThread("main");
    for (int i = 0; i < 100; ++i) std::free(AllocSiteLargeMalloc());
  }
  ASSERT_TRUE(profiler.Stop().ok());
  EXPECT_EQ(AllocationProvider::stats().samples, before);
  auto profile = ReadPprofFile(options.output);
  ASSERT_TRUE(profile.ok()) << profile.status();
  // Off, its sample types are left out of the profile (and no "[events]"
  // thread is added); the CPU types stay.
  EXPECT_EQ(profile->ValueIndex("alloc_space"), -1);
  EXPECT_EQ(profile->ValueIndex("inuse_space"), -1);
  EXPECT_GE(profile->ValueIndex("cpu-time"), 0);
  for (const auto& s : profile->samples) {
    EXPECT_EQ(s.values.size(), profile->sample_types.size());
  }
}

TEST(AllocationProviderTest, ByteSizesFromTheEnvironment) {
  struct Case {
    const char* text;
    uint64_t bytes;
  } cases[] = {{"0", 0}, {"524288", 524288}, {"512KiB", 524288}, {"512k", 524288},
               {"1MiB", 1 << 20}, {" 2m ", 2 << 20}, {"1GiB", 1u << 30}, {"64B", 64}};
  for (const Case& c : cases) {
    std::vector<std::string> errors;
    Options o = Options::FromLookup(
        [&](const char* name) -> const char* {
          return std::string(name) == "INPROF_ALLOC_PERIOD" ? c.text : nullptr;
        },
        &errors);
    EXPECT_EQ(o.alloc_period, c.bytes) << c.text;
    EXPECT_TRUE(errors.empty()) << c.text;
  }
  for (const char* bad : {"-1", "2GiB", "12 parsecs", "KiB", "1.5MiB"}) {
    std::vector<std::string> errors;
    Options o = Options::FromLookup(
        [&](const char* name) -> const char* {
          return std::string(name) == "INPROF_ALLOC_PERIOD" ? bad : nullptr;
        },
        &errors);
    EXPECT_EQ(o.alloc_period, 0u) << bad;
    // One line naming the variable and the value.
    ASSERT_EQ(errors.size(), 1u) << bad;
    EXPECT_TRUE(absl::StrContains(errors[0], "INPROF_ALLOC_PERIOD")) << errors[0];
  }
}

}  // namespace
}  // namespace inprof
