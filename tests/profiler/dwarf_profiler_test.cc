// DwarfProfiler end to end: profiles of a program whose library keeps no
// frame pointers, against FramePointerProfiler on the same program. Linked
// into dwarf_unwinder_test (tests/meson.build), with whose test library and
// helpers (tests/unwind/dwarf_unwinder_test_util.h) it runs.
#include "inprof/inprof.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "inprof/dwarf_unwinder.h"
#include "inprof/pprof_reader.h"
#include "unwind/dwarf_unwinder_test_util.h"
#include "util/test_util.h"

namespace inprof {
namespace {

using dwarf_unwinder_test::AnsweredFromEhFrame;
using dwarf_unwinder_test::HasModule;
using dwarf_unwinder_test::Joined;
using dwarf_unwinder_test::LibraryCopy;

// --- End to end ---------------------------------------------------------------------

using ::inprof::testing::ThreadCpuNow;

struct LeafStacks {
  int64_t leaf_samples = 0;     // CPU samples whose leaf is DwarfLibLeaf
  int64_t complete = 0;         // ... whose stack goes on to main
  std::vector<std::string> example_incomplete;
};

// Profiles DwarfLibLeaf called through the library's two frameless frames
// from DwarfTestFpCaller, with the library dlopen()ed after Start().
template <typename P>
LeafStacks ProfileFramelessLeaf(const std::string& tag) {
  LeafStacks result;
  Options options;
  options.output = absl::StrCat(testing::TestTmpDir(), "/dwarf_unwinder_", tag,
                                ".pb.gz");
  // 1 ms: a sample at every scheduler tick (see profiler_e2e_test.cc).
  options.cpu_period = absl::Milliseconds(1);
  LibraryCopy lib(tag);
  {
    P profiler(options);
    EXPECT_TRUE(profiler.Start().ok());
    {
      auto self = profiler.RegisterThread("main");
      EXPECT_TRUE(lib.Open()) << dlerror();
      auto outer = lib.template Symbol<uint64_t (*)(uint64_t)>("DwarfLibOuter");
      EXPECT_NE(outer, nullptr);
      if (outer == nullptr) return result;
      volatile uint64_t sink = 0;
      if constexpr (std::is_same_v<typename P::unwinder_type, DwarfUnwinder>) {
        // The collector's next pass (every 50 ms) sees the library and
        // gives walks its CFI: from its .eh_frame until a table is built.
        // Run it until then (without refreshing ourselves), outside the
        // measured phase, so that the samples below measure the CFI walk.
        const auto start = std::chrono::steady_clock::now();
        auto has_cfi = [&] {
          const DwarfUnwinderStats stats = DwarfUnwinder::Stats();
          return HasModule(stats, lib.path()) || AnsweredFromEhFrame(stats, lib.path());
        };
        while (!has_cfi() &&
               std::chrono::steady_clock::now() - start < std::chrono::seconds(30)) {
          sink = sink + DwarfTestFpCaller(outer, 200'000);
        }
        std::printf("the collector gave the library its CFI after %.0f ms\n",
                    std::chrono::duration<double, std::milli>(
                        std::chrono::steady_clock::now() - start)
                        .count());
        EXPECT_TRUE(has_cfi());
      }
      ScopedLabels measured(profiler, {{"phase", "measured"}});
      const int64_t start = ThreadCpuNow();
      while (ThreadCpuNow() - start < 800'000'000) {
        sink = sink + DwarfTestFpCaller(outer, 200'000);
      }
    }
    EXPECT_TRUE(profiler.Stop().ok());
  }
  auto samples = testing::ReadWithGoPprofRaw(options.output);
  EXPECT_TRUE(samples.ok()) << samples.status();
  if (!samples.ok()) return result;
  for (const auto& s : *samples) {
    if (s.stack.empty() || s.stack[0] != "DwarfLibLeaf" || s.values.empty()) {
      continue;
    }
    auto phase = s.labels.find("phase");
    if (phase == s.labels.end() || phase->second != "measured") continue;
    result.leaf_samples += s.values[0];
    const bool complete =
        s.stack.size() > 4 && s.stack[1] == "DwarfLibMiddle" &&
        s.stack[2] == "DwarfLibOuter" && s.stack[3] == "DwarfTestFpCaller" &&
        std::find(s.stack.begin(), s.stack.end(), "main") != s.stack.end();
    if (complete) {
      result.complete += s.values[0];
    } else if (s.values[0] > 0 && result.example_incomplete.size() < 3) {
      result.example_incomplete.push_back(Joined(s.stack));
    }
  }
  return result;
}

// Start() builds no CFI table on the calling thread: the collector builds
// them right after, and the walks taken before (frame pointers only) are
// counted, in stats() and in the profile's comments, which agree.
// (LoadedLibraryGetsItsTableOnlyOnceAWalkMeetsIt: the same count for a
// module built on demand.)
TEST(DwarfProfilerTest, WalksBeforeTheTablesAreCountedAndReported) {
  Options options;
  options.output = absl::StrCat(testing::TestTmpDir(), "/dwarf_before_tables.pb.gz");
  options.cpu_period = absl::Milliseconds(1);
  options.wall_period = absl::ZeroDuration();
  DwarfProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  {
    auto self = profiler.RegisterThread("main");
    const int64_t start = ThreadCpuNow();
    volatile uint64_t sink = 0;
    while (ThreadCpuNow() - start < 200'000'000) sink = sink + 1;
  }
  ASSERT_TRUE(profiler.Stop().ok());
  const ProfilerStats stats = profiler.stats();
  EXPECT_LE(stats.stacks_before_tables, stats.samples_taken);
  // The tables exist once the collector has run.
  EXPECT_GT(DwarfUnwinder::Stats().modules.size(), 0u);
  auto profile = ReadPprofFile(options.output);
  ASSERT_TRUE(profile.ok()) << profile.status();
  const std::string expected =
      absl::StrCat("walked by frame pointers through a module without its CFI table yet=",
                   stats.stacks_before_tables);
  bool found = false;
  for (const auto& c : profile->comments) {
    found |= c.find(expected) != std::string::npos;
  }
  EXPECT_TRUE(found) << "no comment '" << expected << "'";
  std::printf("%llu of %llu samples walked before the tables were built\n",
              static_cast<unsigned long long>(stats.stacks_before_tables),
              static_cast<unsigned long long>(stats.samples_taken));
}

// A library loaded while a profiler runs gets no table: walks through it
// are answered from its .eh_frame (no frame-pointer step, so none counted
// as before the tables), and a library run a little never pays for a table.
TEST(DwarfProfilerTest, LoadedLibraryIsWalkedFromItsEhFrameWithoutATable) {
  Options options;
  options.output = absl::StrCat(testing::TestTmpDir(), "/dwarf_eh_frame.pb.gz");
  options.cpu_period = absl::Milliseconds(1);
  options.wall_period = absl::ZeroDuration();
  LibraryCopy lib("eh_frame");
  DwarfProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  uint64_t lookups_before = 0;
  {
    auto self = profiler.RegisterThread("main");
    ASSERT_TRUE(lib.Open()) << dlerror();
    auto outer = lib.Symbol<uint64_t (*)(uint64_t)>("DwarfLibOuter");
    ASSERT_NE(outer, nullptr);
    // The collector's next pass (every 50 ms) sees the library.
    const auto start = std::chrono::steady_clock::now();
    while (!AnsweredFromEhFrame(DwarfUnwinder::Stats(), lib.path()) &&
           std::chrono::steady_clock::now() - start < std::chrono::seconds(30)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_TRUE(AnsweredFromEhFrame(DwarfUnwinder::Stats(), lib.path()));
    const ProfilerStats before = profiler.stats();
    lookups_before = DwarfUnwinder::Stats().eh_frame_lookups;
    // In the library until 100 walks went through it: ~100 ms of CPU with
    // the perf engine (a sample per 1 ms point), ~400 ms with the timer
    // engine at HZ=250 (a sample per tick). 60 s of wall time is a hang
    // check.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    volatile uint64_t sink = 0;
    while (profiler.stats().samples_taken < before.samples_taken + 100 &&
           std::chrono::steady_clock::now() < deadline) {
      sink = sink + DwarfTestFpCaller(outer, 200'000);
    }
    EXPECT_EQ(profiler.stats().stacks_before_tables, before.stacks_before_tables);
    EXPECT_GE(profiler.stats().samples_taken, before.samples_taken + 100);
  }
  const DwarfUnwinderStats stats = DwarfUnwinder::Stats();
  EXPECT_GT(stats.eh_frame_lookups, lookups_before);
  EXPECT_FALSE(HasModule(stats, lib.path()));
  EXPECT_TRUE(AnsweredFromEhFrame(stats, lib.path()));
  ASSERT_TRUE(profiler.Stop().ok());
}

// A library whose .eh_frame cannot be searched gets its table on demand:
// a library loaded but never run gets none, and the first walks through
// it, by frame pointers, ask for its table, which the collector then builds.
TEST(DwarfProfilerTest, LoadedLibraryGetsItsTableOnlyOnceAWalkMeetsIt) {
  Options options;
  options.output = absl::StrCat(testing::TestTmpDir(), "/dwarf_on_demand.pb.gz");
  options.cpu_period = absl::Milliseconds(1);
  options.wall_period = absl::ZeroDuration();
  LibraryCopy lib("on_demand", /*without_eh_frame_hdr=*/true);
  DwarfProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  ProfilerStats before_use;
  {
    auto self = profiler.RegisterThread("main");
    ASSERT_TRUE(lib.Open()) << dlerror();
    auto outer = lib.Symbol<uint64_t (*)(uint64_t)>("DwarfLibOuter");
    ASSERT_NE(outer, nullptr);
    // Sampled for 300 ms of CPU outside the library, the collector passing
    // every 50 ms meanwhile: the library stays without a table.
    const int64_t t0 = ThreadCpuNow();
    volatile uint64_t sink = 0;
    while (ThreadCpuNow() - t0 < 300'000'000) sink = sink + 1;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_FALSE(HasModule(DwarfUnwinder::Stats(), lib.path()));
    EXPECT_GE(DwarfUnwinder::Stats().modules_pending, 1u);
    before_use = profiler.stats();
    // Now run it until its table exists.
    const auto start = std::chrono::steady_clock::now();
    while (!HasModule(DwarfUnwinder::Stats(), lib.path()) &&
           std::chrono::steady_clock::now() - start < std::chrono::seconds(30)) {
      sink = sink + DwarfTestFpCaller(outer, 200'000);
    }
    EXPECT_TRUE(HasModule(DwarfUnwinder::Stats(), lib.path()));
  }
  ASSERT_TRUE(profiler.Stop().ok());
  // The walks through it before its table existed were counted.
  EXPECT_GT(profiler.stats().stacks_before_tables, before_use.stacks_before_tables);
}

TEST(DwarfProfilerTest, LeafSamplesInFramelessCodeCarryTheStackUpToMain) {
  INPROF_REQUIRE_TOOL("go");
  const LeafStacks r = ProfileFramelessLeaf<DwarfProfiler>("dwarf_e2e");
  std::printf("DwarfProfiler: %lld of %lld leaf CPU samples complete (%.1f%%)\n",
              static_cast<long long>(r.complete),
              static_cast<long long>(r.leaf_samples),
              r.leaf_samples > 0 ? 100.0 * r.complete / r.leaf_samples : 0.0);
  for (const auto& e : r.example_incomplete) std::printf("  incomplete: %s\n", e.c_str());
  ASSERT_GE(r.leaf_samples, 50);
  EXPECT_GE(r.complete * 10, r.leaf_samples * 9)
      << "e.g. " << (r.example_incomplete.empty() ? "" : r.example_incomplete[0]);
}

// Frame pointers alone lose the callers above the -fomit-frame-pointer
// frames, and the program still runs to the end.
TEST(DwarfProfilerTest, FramePointerProfilerSurvivesTheSameProgram) {
  INPROF_REQUIRE_TOOL("go");
  const LeafStacks r = ProfileFramelessLeaf<FramePointerProfiler>("fp_e2e");
  std::printf("FramePointerProfiler: %lld of %lld leaf CPU samples complete (%.1f%%)\n",
              static_cast<long long>(r.complete),
              static_cast<long long>(r.leaf_samples),
              r.leaf_samples > 0 ? 100.0 * r.complete / r.leaf_samples : 0.0);
  EXPECT_GE(r.leaf_samples, 50);
  EXPECT_LT(r.complete * 10, r.leaf_samples)
      << "frame pointers alone should not recover these stacks";
}

// DefaultProfiler is the CFI composition where CFI unwinding works.
TEST(DwarfProfilerTest, DefaultProfilerUnwindsWithCfiWhereSupported) {
  if constexpr (DwarfUnwinder::Supported()) {
    EXPECT_TRUE((std::is_same_v<DefaultProfiler, DwarfProfiler>));
    EXPECT_EQ(DefaultProfiler::Engine(), "unwinder=dwarf providers=cpu,wall,alloc,locks");
  } else {
    EXPECT_TRUE((std::is_same_v<DefaultProfiler, FramePointerProfiler>));
    EXPECT_EQ(DefaultProfiler::Engine(),
              "unwinder=frame-pointer providers=cpu,wall,alloc,locks");
  }
}

}  // namespace
}  // namespace inprof
