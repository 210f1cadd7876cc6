#include "inprof/sample_provider.h"

#include <time.h>

#include <array>
#include <atomic>
#include <chrono>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inprof/inprof.h"
#include "inprof/pprof_reader.h"
#include "util/test_util.h"

namespace inprof {
namespace {

// A user-defined provider: piggybacks on a CPU timer and reports a constant
// per sample, under its own sample type.
class TicksProvider {
 public:
  static constexpr const char* kName = "ticks";
  static constexpr std::array<SampleTypeSpec, 1> kSampleTypes{
      {{"ticks", "count"}}};
  static constexpr size_t kPeriodTypeIndex = 0;
  struct ThreadData {
    CpuTimeProvider::ThreadData timer;
  };
  // Its own CPU timer, on the POSIX timer engine: a thread has one perf
  // event the handler can tell by its descriptor (the CPU provider's), and
  // a timer's signal is queued even while another SIGPROF is pending, so
  // none of its signals is lost to the CPU provider's: 200 ms of CPU at
  // 10 ms make ~20 of them, >= 1 deterministically.
  absl::Status Configure(const Options& options) {
    Options timer = options;
    timer.cpu_engine = CpuEngine::kTimer;
    return cpu_.Configure(timer);
  }
  int64_t Period() const { return 1; }
  absl::Status ArmThread(ThreadContext& thread, ThreadData& data, int tag) {
    return cpu_.ArmThread(thread, data.timer, tag);
  }
  void DisarmThread(ThreadContext& thread, ThreadData& data) noexcept {
    cpu_.DisarmThread(thread, data.timer);
  }
  static bool OnSignal(ThreadContext& thread, ThreadData& data, const siginfo_t& info,
                       std::span<int64_t> values) noexcept {
    int64_t cpu[2] = {};  // the timer's own bookkeeping; every signal is a tick
    CpuTimeProvider::OnSignal(thread, data.timer, info, cpu);
    values[0] = 7;
    return true;
  }

 private:
  CpuTimeProvider cpu_;
};
static_assert(SampleProvider<TicksProvider>);
static_assert(!ReportsTail<TicksProvider>);

// Types that do not model the concept.
struct NoOnSignal {
  static constexpr const char* kName = "x";
  static constexpr std::array<SampleTypeSpec, 1> kSampleTypes{{{"x", "count"}}};
  static constexpr size_t kPeriodTypeIndex = 0;
  struct ThreadData {};
  absl::Status Configure(const Options&) { return absl::OkStatus(); }
  int64_t Period() const { return 1; }
  absl::Status ArmThread(ThreadContext&, ThreadData&, int) { return {}; }
  void DisarmThread(ThreadContext&, ThreadData&) noexcept {}
};
struct ThrowingOnSignal : NoOnSignal {
  static bool OnSignal(ThreadContext&, ThreadData&, const siginfo_t&,
                       std::span<int64_t>) {  // not noexcept
    return true;
  }
};
struct NoSampleTypes {
  struct ThreadData {};
};
static_assert(!SampleProvider<NoOnSignal>);
static_assert(!SampleProvider<ThrowingOnSignal>);
static_assert(!SampleProvider<NoSampleTypes>);
static_assert(!SampleProvider<int>);
static_assert(SampleProvider<CpuTimeProvider>);
static_assert(SampleProvider<WallTimeProvider>);

// Arming outside the registry lock is opt-in: a profiler with a provider
// that does not say so (TicksProvider, in the test below) arms all of its
// providers under the lock, in their order.
struct SaysItDoesNotArmConcurrently : TicksProvider {
  static constexpr bool kArmsConcurrently = false;
};
static_assert(ArmsConcurrently<CpuTimeProvider>);
static_assert(ArmsConcurrently<WallTimeProvider>);
static_assert(!ArmsConcurrently<TicksProvider>);
static_assert(!ArmsConcurrently<SaysItDoesNotArmConcurrently>);
static_assert(!ArmsConcurrently<NoOnSignal>);

using ::inprof::testing::ThreadCpuNow;

TEST(SampleProviderTest, UserProviderValuesAppearInTheProfile) {
  using TicksProfiler = Profiler<FramePointerUnwinder, DefaultSampleRing,
                                 CpuTimeProvider, TicksProvider>;
  Options options;
  options.output = testing::TestTmpDir() + "/provider_ticks.pb.gz";
  TicksProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  {
    auto self = profiler.RegisterThread("main");
    const int64_t end = ThreadCpuNow() + 200'000'000;
    volatile uint64_t x = 0;
    while (ThreadCpuNow() < end) x = x + 1;
  }
  ASSERT_TRUE(profiler.Stop().ok());
  auto profile = ReadPprofFile(options.output);
  ASSERT_TRUE(profile.ok()) << profile.status();
  ASSERT_EQ(profile->sample_types.size(), 3u);  // each type exactly once
  EXPECT_EQ(profile->sample_types[2].type, "ticks");
  const int64_t ticks = profile->Total(profile->ValueIndex("ticks"));
  std::printf("ticks=%lld\n", static_cast<long long>(ticks));
  EXPECT_GT(ticks, 0);
  EXPECT_EQ(ticks % 7, 0);
  EXPECT_GT(profile->Total(profile->ValueIndex("cpu-time")), 100'000'000);
  EXPECT_EQ(TicksProfiler::Engine(), "unwinder=frame-pointer providers=cpu,ticks");
}

// Wall samples carry a "thread state" label, so they never merge with CPU
// samples of the same stack: each has zeros for the other's types.
TEST(SampleProviderTest, SamplesOfOneProviderHaveZerosForTheOthers) {
  Options options;
  options.output = testing::TestTmpDir() + "/provider_zeros.pb.gz";
  DefaultProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  {
    auto self = profiler.RegisterThread("main");
    // 200 ms of CPU, and until the wall sampler has taken a sample of the
    // thread: a credit to a CPU sample's stack, or a second signal (never
    // sent before the first one's sample was taken, or taken by a CPU
    // sample that swallowed it). 60 s of wall time is a hang check.
    const int64_t end = ThreadCpuNow() + 200'000'000;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    auto wall_sampled = [&] {
      const ProfilerStats stats = profiler.stats();
      return stats.wall_running_credits >= 1 || stats.wall_signals >= 2;
    };
    volatile uint64_t x = 0;
    while ((ThreadCpuNow() < end || !wall_sampled()) &&
           std::chrono::steady_clock::now() < deadline) {
      for (int i = 0; i < 1000; ++i) x = x + 1;
    }
  }
  ASSERT_TRUE(profiler.Stop().ok());
  auto profile = ReadPprofFile(options.output);
  ASSERT_TRUE(profile.ok()) << profile.status();
  int wall_samples = 0, cpu_samples = 0;
  for (const auto& s : profile->samples) {
    if (s.str_labels.count("thread state")) {
      ++wall_samples;
      EXPECT_EQ(s.values[0], 0);
      EXPECT_EQ(s.values[1], 0);
    } else if (s.values[1] > 0) {
      ++cpu_samples;
      EXPECT_EQ(s.values[3], 0);
    }
  }
  EXPECT_GT(wall_samples, 0) << [&] {
    // What the wall sampler did, for a failure seen once in a clean-clone
    // run and not reproduced since.
    std::string comments;
    for (const std::string& c : profile->comments) comments += "\n  " + c;
    return comments;
  }();
  EXPECT_GT(cpu_samples, 0);
}

// A ticking provider that never signals: each visit after which a running
// sample was taken (SamplesRunningThreads: CpuTimeProvider) is credited to
// that sample's stack, as the wall sampler does for a thread that ran
// throughout its interval. Which visits qualify is the wall provider's
// decision (wall_time_provider_test); this checks the profiler's part.
class RideProvider {
 public:
  static constexpr const char* kName = "ride";
  static constexpr std::array<SampleTypeSpec, 2> kSampleTypes{
      {{"rides", "count"}, {"ride-time", "nanoseconds"}}};
  static constexpr size_t kPeriodTypeIndex = 1;
  static constexpr bool kArmsConcurrently = true;
  struct ThreadData {};
  absl::Status Configure(const Options&) { return absl::OkStatus(); }
  int64_t Period() const { return 1'000'000; }
  absl::Status ArmThread(ThreadContext&, ThreadData&, int) { return {}; }
  void DisarmThread(ThreadContext&, ThreadData&) noexcept {}
  static bool OnSignal(ThreadContext&, ThreadData&, const siginfo_t&,
                       std::span<int64_t>) noexcept {
    return false;  // never signalled
  }
  absl::Duration TickPeriod() const { return absl::Milliseconds(5); }
  size_t ThreadsPerTick() const { return 5; }
  TickDecision VisitThread(ThreadContext&, ThreadData&, TickTime, bool,
                           bool has_running_sample, std::span<int64_t> values) {
    if (!has_running_sample) return TickDecision::kSkip;
    credits.fetch_add(1);
    values[0] = 1;
    values[1] = 1'000;
    return TickDecision::kCreditRunning;
  }
  static bool AwaitsEpisodeStack(const ThreadData&) { return false; }

  static std::atomic<int64_t> credits;
};
std::atomic<int64_t> RideProvider::credits{0};
static_assert(TicksThreads<RideProvider>);
static_assert(SamplesRunningThreads<CpuTimeProvider>);
static_assert(!SamplesRunningThreads<WallTimeProvider>);
static_assert(!SamplesRunningThreads<RideProvider>);

// Each phase runs until the ticker has credited it twice (the second
// credit's sample was taken after the first credit's visit, so inside the
// phase), and for at least `ns` of CPU; 60 s of wall time is a hang check.
__attribute__((noinline)) uint64_t RidePhaseA(int64_t ns) {
  const int64_t end = ThreadCpuNow() + ns;
  const int64_t credits0 = RideProvider::credits.load();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  volatile uint64_t x = 0;
  while ((ThreadCpuNow() < end || RideProvider::credits.load() < credits0 + 2) &&
         std::chrono::steady_clock::now() < deadline) {
    x = x + 1;
  }
  return x;
}
__attribute__((noinline)) uint64_t RidePhaseB(int64_t ns) {
  const int64_t end = ThreadCpuNow() + ns;
  const int64_t credits0 = RideProvider::credits.load();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  volatile uint64_t x = 0;
  while ((ThreadCpuNow() < end || RideProvider::credits.load() < credits0 + 2) &&
         std::chrono::steady_clock::now() < deadline) {
    x = x + 3;
  }
  return x;
}

bool StackHas(const DecodedProfile::Sample& s, const std::string& function) {
  for (const auto& f : s.stack) {
    if (f.find(function) != std::string::npos) return true;
  }
  return false;
}

// Each credit lands on the stack and labels of a CPU sample of that thread
// (here: the phase it was running), and every credit reaches the profile.
void CheckCreditsOfRunningSamples(CpuEngine engine, const std::string& name) {
  using RideProfiler = Profiler<DwarfUnwinder, DefaultSampleRing,
                                CpuTimeProvider, RideProvider>;
  Options options;
  options.output = testing::TestTmpDir() + "/" + name + ".pb.gz";
  options.cpu_period = absl::Milliseconds(2);
  options.cpu_engine = engine;
  RideProvider::credits.store(0);
  RideProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  {
    auto self = profiler.RegisterThread("rider");
    {
      ScopedLabels phase(profiler, {{"phase", "a"}});
      RidePhaseA(150'000'000);
    }
    {
      ScopedLabels phase(profiler, {{"phase", "b"}});
      RidePhaseB(150'000'000);
    }
  }
  ASSERT_TRUE(profiler.Stop().ok());
  EXPECT_EQ(profiler.stats().wall_running_credits,
            static_cast<uint64_t>(RideProvider::credits.load()));
  auto profile = ReadPprofFile(options.output);
  ASSERT_TRUE(profile.ok()) << profile.status();
  const int rides = profile->ValueIndex("rides");
  const int ride_time = profile->ValueIndex("ride-time");
  ASSERT_GE(rides, 0);
  // Each phase ran until it had two credits (deterministic; ~75 CPU
  // samples each and a visit every 5 ms make it ~30 each).
  EXPECT_GE(RideProvider::credits.load(), 4);
  EXPECT_EQ(profile->Total(rides), RideProvider::credits.load());
  EXPECT_EQ(profile->Total(ride_time), 1'000 * RideProvider::credits.load());
  // Each credit carries the labels of the sample it was credited to and
  // lands on that CPU sample's stack: same stack, same labels, so the same
  // pprof sample (under ThreadSanitizer many CPU samples stop in its
  // runtime, and the credits with them). DwarfUnwinder: a frame-pointer
  // walk from a leaf in the vDSO (the clock read) skips its caller.
  const int cpu_samples = profile->ValueIndex("cpu-samples");
  int64_t in_a = 0, in_b = 0;
  for (const auto& s : profile->samples) {
    if (s.values[rides] == 0) continue;
    EXPECT_GT(s.values[cpu_samples], 0)
        << "a credit on a stack no CPU sample had, leaf "
        << (s.stack.empty() ? "(none)" : s.stack[0]);
    // Outside both phases (registering, between the scopes) the thread
    // has no phase label, and neither have its samples.
    auto phase = s.str_labels.find("phase");
    const std::string label = phase == s.str_labels.end() ? "" : phase->second;
    if (StackHas(s, "RidePhaseA")) {
      EXPECT_EQ(label, "a");
    }
    if (StackHas(s, "RidePhaseB")) {
      EXPECT_EQ(label, "b");
    }
    if (label == "a") in_a += s.values[rides];
    if (label == "b") in_b += s.values[rides];
  }
  // The second credit counted in each phase was for a sample taken after
  // the first one's visit, inside the phase, under its label.
  EXPECT_GT(in_a, 0);
  EXPECT_GT(in_b, 0);
}

TEST(SampleProviderTest, TickingProvidersCreditRunningSamplesWithoutASignal) {
  CheckCreditsOfRunningSamples(CpuEngine::kAuto, "provider_ride");
}

// The itimer engine's process-wide signal (SI_KERNEL) counts as a running
// sample too. It did not, and no thread of that engine was ever credited
// or followed: a busy thread among 1,000 registered got its wall time only
// from visits of the round (0 and 1.19x its life in two bench runs). Here
// each phase then ran to its 60 s deadline with no credit.
TEST(SampleProviderTest, TickingProvidersCreditRunningSamplesOfTheItimerEngine) {
  CheckCreditsOfRunningSamples(CpuEngine::kItimer, "provider_ride_itimer");
}

TEST(SampleProviderTest, DefaultProfilerHasCpuWallAllocationAndLockTypesOnce) {
  auto types = DefaultProfiler::SampleTypes();
  ASSERT_EQ(types.size(), 12u);
  EXPECT_EQ(types[0].type, "cpu-samples");
  EXPECT_EQ(types[1].type, "cpu-time");
  EXPECT_EQ(types[2].type, "wall-samples");
  EXPECT_EQ(types[3].type, "wall-time");
  EXPECT_EQ(types[4].type, "alloc_objects");
  EXPECT_EQ(types[5].type, "alloc_space");
  EXPECT_EQ(types[6].type, "inuse_objects");
  EXPECT_EQ(types[7].type, "inuse_space");
  EXPECT_EQ(types[8].type, "peak_inuse_objects");
  EXPECT_EQ(types[9].type, "peak_inuse_space");
  EXPECT_EQ(types[10].type, "contentions");
  EXPECT_EQ(types[11].type, "delay");
  EXPECT_EQ(types[11].unit, "nanoseconds");
}

// With the allocation provider off (INPROF_ALLOC_PERIOD unset), the profile
// has no heap columns and no "[events]" thread; on, it has all six. The
// CPU loop's samples keep their values in the right columns either way.
TEST(SampleProviderTest, DefaultProfilerLeavesOutTheTypesOfAProviderThatIsOff) {
  for (const int64_t alloc_period : {int64_t{0}, int64_t{64} << 10}) {
    SCOPED_TRACE(alloc_period);
    Options options;
    options.output = testing::FreshTestDir("default_types") + "/profile.pb.gz";
    options.alloc_period = alloc_period;
    {
      DefaultProfiler profiler(options);
      ASSERT_TRUE(profiler.Start().ok());
      {
        auto self = profiler.RegisterThread("main");
        const int64_t end = ThreadCpuNow() + 200'000'000;
        volatile uint64_t x = 0;
        while (ThreadCpuNow() < end) x = x + 1;
      }
      ASSERT_TRUE(profiler.Stop().ok());
    }
    auto profile = ReadPprofFile(options.output);
    ASSERT_TRUE(profile.ok()) << profile.status();
    std::vector<std::string> names;
    for (const ValueType& t : profile->sample_types) names.push_back(t.type);
    if (alloc_period == 0) {
      EXPECT_THAT(names, ::testing::ElementsAre("cpu-samples", "cpu-time", "wall-samples",
                                                "wall-time"));
    } else {
      EXPECT_THAT(names, ::testing::ElementsAre("cpu-samples", "cpu-time", "wall-samples",
                                                "wall-time", "alloc_objects", "alloc_space",
                                                "inuse_objects", "inuse_space",
                                                "peak_inuse_objects", "peak_inuse_space"));
    }
    // 200 ms of the thread's CPU at the default 10 ms period is ~20 expiries
    // of its CPU-clock timer, not a draw: none recorded is a failure.
    EXPECT_GT(profile->Total(profile->ValueIndex("cpu-time")), 0);
    for (const auto& s : profile->samples) {
      EXPECT_EQ(s.values.size(), names.size());
    }
  }
}

}  // namespace
}  // namespace inprof
