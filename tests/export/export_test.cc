// Periodic export: windows, file series, atomic replacement, stop timeout.
#include "inprof/sink.h"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "upload/http_receiver.h"
#include "inprof/inprof.h"
#include "inprof/internal/composition.h"
#include "inprof/internal/pipeline.h"
#include "inprof/pprof_reader.h"
#include "util/test_util.h"

namespace inprof {
namespace {

using ::testing::HasSubstr;
using ::testing::SizeIs;
using ::testing::StartsWith;

// Keeps every profile it is given.
class CollectingSink : public ProfileSink {
 public:
  absl::string_view name() const override { return "collecting"; }
  absl::Status Consume(std::shared_ptr<const ExportedProfile> p) override {
    std::lock_guard<std::mutex> lock(mutex_);
    profiles_.push_back(std::move(p));
    return absl::OkStatus();
  }
  std::vector<std::shared_ptr<const ExportedProfile>> profiles() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return profiles_;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::shared_ptr<const ExportedProfile>> profiles_;
};

std::vector<DecodedProfile> Decode(
    const std::vector<std::shared_ptr<const ExportedProfile>>& profiles) {
  std::vector<DecodedProfile> out;
  for (const auto& p : profiles) {
    absl::StatusOr<DecodedProfile> d = DecodePprof(p->pprof);
    EXPECT_TRUE(d.ok()) << d.status();
    if (d.ok()) out.push_back(*std::move(d));
  }
  return out;
}

// Samples a profile holds: the sum of its "...-samples" (count) types, one
// per provider (cpu-samples, wall-samples).
int64_t SampleCount(const DecodedProfile& p) {
  int64_t n = 0;
  for (size_t i = 0; i < p.sample_types.size(); ++i) {
    if (absl::EndsWith(p.sample_types[i].type, "-samples")) {
      n += p.Total(static_cast<int>(i));
    }
  }
  return n;
}

// The counters in a window's comment "samples taken=T recorded=R dropped=D".
struct CommentCounts {
  int64_t taken = -1, recorded = -1, dropped = -1;
};
CommentCounts ParseCounts(const DecodedProfile& p) {
  CommentCounts c;
  for (const std::string& comment : p.comments) {
    if (!absl::StartsWith(comment, "samples taken=")) continue;
    for (absl::string_view kv : absl::StrSplit(comment, ' ')) {
      const size_t eq = kv.find('=');
      if (eq == absl::string_view::npos) continue;
      int64_t v = 0;
      if (!absl::SimpleAtoi(kv.substr(eq + 1), &v)) continue;
      if (absl::StartsWith(kv, "taken")) c.taken = v;
      if (absl::StartsWith(kv, "recorded")) c.recorded = v;
      if (absl::StartsWith(kv, "dropped")) c.dropped = v;
    }
  }
  return c;
}

// A deterministic producer drained like the profiler's rings: sample i has
// values {1, i}, so a window that holds samples [a, b) holds count b - a and
// sum a + ... + (b - 1). Adding goes through a staging buffer and the drain
// callback, under the pipeline's lock, as the Profiler template does.
struct WindowTotals {
  int64_t produced = 0;
  std::vector<int64_t> counts, sums;
  std::vector<std::shared_ptr<const ExportedProfile>> profiles;
  std::vector<DecodedProfile> decoded;
};

// Produces `samples` samples over about 1.2 s and then, with export windows,
// goes on at that pace until the exporter has cut at least `min_windows`
// (the exporter skips a cut it is late for, so how many fall in a fixed
// time depends on the machine's load); 60 s of it is a hang check.
WindowTotals RunSyntheticProducer(absl::Duration export_period, int64_t samples,
                                  uint64_t min_windows = 0) {
  auto sink = std::make_shared<CollectingSink>();
  Options options;
  options.write_output = false;
  options.symbolize = false;
  options.export_period = export_period;
  options.collect_period = absl::Milliseconds(5);
  options.sinks = {sink};
  internal::Pipeline core(options, {{"samples", "count"}, {"index", "count"}},
                              {"samples", "count"}, 1, "test");
  std::mutex staging_mutex;
  std::vector<int64_t> staging;
  uint64_t drained = 0;  // the pipeline's lock
  uint32_t thread = 0;
  {
    internal::Pipeline::Ingesting ingest = core.Ingest();
    thread = ingest.aggregator().AddThread(1, "producer");
  }
  // The collector and the exporter both drain, as in the profiler; like
  // its DrainRings (registry lock held while adding), a batch is taken and
  // added under one lock, so batches reach the aggregator in the order
  // they were produced. (Taken under one lock and added under another, a
  // later batch could overtake an earlier one around a cut, and a window
  // hold a range with a hole: debug_endpoint_test's copy of this producer
  // did, under TSan.)
  auto drain = [&] {
    std::lock_guard<std::mutex> staging_lock(staging_mutex);
    std::vector<int64_t> batch;
    batch.swap(staging);
    internal::Pipeline::Ingesting ingest = core.Ingest();
    for (int64_t i : batch) {
      const uint64_t frame = 0x1000 + 16 * static_cast<uint64_t>(i % 97);
      const int64_t values[] = {1, i};
      ingest.aggregator().Add(thread, std::span<const uint64_t>(&frame, 1), 0,
                            values);
      ++drained;
    }
  };
  core.BeginWindow();
  core.StartCollector(drain, [&] {
    ProfilerStats s;  // called with the pipeline's lock held
    s.samples_taken = s.samples_recorded = drained;
    return s;
  });
  // Spread the samples over about 1.2 s so that many cuts fall among them.
  const absl::Time begin = absl::Now();
  const absl::Time give_up = begin + absl::Seconds(60);
  int64_t i = 0;
  for (; i < samples || (core.windows_exported() < min_windows && absl::Now() < give_up);
       ++i) {
    {
      std::lock_guard<std::mutex> lock(staging_mutex);
      staging.push_back(i);
    }
    if (i % 64 == 0) {
      const absl::Time due =
          begin + absl::Milliseconds(1200) * (static_cast<double>(i) / samples);
      const absl::Duration wait = due - absl::Now();
      if (wait > absl::ZeroDuration()) absl::SleepFor(wait);
    }
  }
  core.StopCollector();
  drain();
  ProfilerStats final_stats;
  EXPECT_TRUE(core.Export(final_stats).ok());

  WindowTotals out;
  out.produced = i;
  out.profiles = sink->profiles();
  out.decoded = Decode(out.profiles);
  for (const DecodedProfile& p : out.decoded) {
    out.counts.push_back(p.Total(0));
    out.sums.push_back(p.Total(1));
  }
  return out;
}

TEST(ExportTest, WindowsPartitionSamplesExactly) {
  constexpr int64_t kSamples = 200'000;
  // At least 8 periodic windows (deterministic: the producer waits for
  // them), then the last one.
  const WindowTotals windows =
      RunSyntheticProducer(absl::Milliseconds(100), kSamples, 8);
  const int64_t n = windows.produced;
  const WindowTotals whole = RunSyntheticProducer(absl::ZeroDuration(), n);

  // One long profile holds everything.
  ASSERT_THAT(whole.counts, SizeIs(1));
  EXPECT_EQ(whole.counts[0], n);
  EXPECT_EQ(whole.sums[0], n * (n - 1) / 2);

  // Many short ones hold the same, each a contiguous range of samples: none
  // lost or counted twice at a boundary.
  ASSERT_GE(windows.counts.size(), 9u);
  int64_t next = 0;
  int64_t total = 0;
  for (size_t w = 0; w < windows.counts.size(); ++w) {
    SCOPED_TRACE(absl::StrCat("window ", w));
    const int64_t a = next, count = windows.counts[w];
    EXPECT_EQ(windows.sums[w], count == 0 ? 0 : (a + a + count - 1) * count / 2);
    // The comment counts the window's own samples.
    const CommentCounts c = ParseCounts(windows.decoded[w]);
    EXPECT_EQ(c.taken, count);
    EXPECT_EQ(c.recorded, count);
    next += count;
    total += count;
  }
  EXPECT_EQ(total, whole.counts[0]);
  EXPECT_EQ(next, n);
}

TEST(ExportTest, WindowsTileTimeAndCarryTheirRealBounds) {
  const WindowTotals windows =
      RunSyntheticProducer(absl::Milliseconds(100), 20'000, 8);
  ASSERT_GE(windows.decoded.size(), 9u);
  for (size_t w = 0; w < windows.decoded.size(); ++w) {
    SCOPED_TRACE(absl::StrCat("window ", w));
    const DecodedProfile& p = windows.decoded[w];
    const ExportedProfile& e = *windows.profiles[w];
    EXPECT_EQ(p.time_nanos, absl::ToUnixNanos(e.start));
    EXPECT_EQ(p.duration_nanos, absl::ToInt64Nanoseconds(e.end - e.start));
    EXPECT_EQ(e.sequence, w);
    EXPECT_EQ(e.last, w + 1 == windows.decoded.size());
    if (w > 0) {
      EXPECT_EQ(e.start, windows.profiles[w - 1]->end);
    }
    EXPECT_GT(e.end, e.start);
    // The exporter keeps its schedule and never cuts early: the k-th cut
    // (k from 1) comes no sooner than k periods after the first window
    // began (its schedule starts after that; a late cut only moves the
    // next ones later). Deterministic; 1 ms for the wall clock's slewing
    // against the steady one the exporter waits on. How late the cuts are
    // on a loaded machine is not a property of the code.
    if (!e.last) {
      EXPECT_GE(e.end - windows.profiles[0]->start,
                absl::Milliseconds(100) * static_cast<double>(w + 1) -
                    absl::Milliseconds(1));
    }
  }
}

// ---------------------------------------------------------------------------
// With a real profiler.

using ::inprof::testing::ThreadCpuNow;

__attribute__((noinline)) uint64_t BurnCpu(int64_t ns) {
  const int64_t end = ThreadCpuNow() + ns;
  uint64_t x = 88172645463325252ULL;
  while (ThreadCpuNow() < end) {
    for (int i = 0; i < 2000; ++i) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
    }
  }
  return x;
}

// CPU sampling only: every sample is one signal, so the windows' sample
// counts add up exactly to the profiler's counters. (The wall-time provider
// also credits blocked threads without a signal.)
using CpuProfiler =
    Profiler<FramePointerUnwinder, DefaultSampleRing, CpuTimeProvider>;

std::string FreshDir(const std::string& name) { return testing::FreshTestDir(name); }

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') names.emplace_back(e->d_name);
    }
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Burns CPU in 20 ms steps until `done()` (at most 60 s). Tests that need
// several windows wait for them instead of burning a fixed stretch: the
// exporter skips a cut it is late for rather than bursting, so a slow
// window (a loaded machine, a sanitizer build) means fewer windows in the
// same time.
template <typename Done>
void BurnCpuUntil(Done done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!done() && std::chrono::steady_clock::now() < deadline) {
    BurnCpu(20'000'000);
  }
}

TEST(ExportTest, ProfilerWindowsSumToTheWholeRun) {
  auto sink = std::make_shared<CollectingSink>();
  Options options;
  options.write_output = false;
  options.export_period = absl::Milliseconds(100);
  options.sinks = {sink};
  CpuProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  int64_t measured = 0, outer = 0;  // inside / around the registration
  std::thread worker([&] {
    const int64_t outer0 = ThreadCpuNow();
    auto registration = profiler.RegisterThread("worker");
    const int64_t t0 = ThreadCpuNow();
    // Three periodic windows (the last one at Stop makes four).
    BurnCpuUntil([&] { return sink->profiles().size() >= 3; });
    measured = ThreadCpuNow() - t0;
    registration.Reset();
    outer = ThreadCpuNow() - outer0;
  });
  worker.join();
  ASSERT_TRUE(profiler.Stop().ok());

  const auto decoded = Decode(sink->profiles());
  ASSERT_GE(decoded.size(), 4u);
  int64_t samples = 0, cpu = 0, taken = 0;
  for (const DecodedProfile& p : decoded) {
    const int64_t n = SampleCount(p);
    // Each window's comment counts its own samples. ("taken" may move by
    // one across a boundary: a handler counts before it pushes.)
    const CommentCounts c = ParseCounts(p);
    EXPECT_EQ(c.recorded + c.dropped, n);
    taken += c.taken;
    samples += n;
    cpu += p.Total(p.ValueIndex("cpu-time"));
  }
  const ProfilerStats stats = profiler.stats();
  EXPECT_EQ(samples, static_cast<int64_t>(stats.samples_taken));
  EXPECT_EQ(taken, static_cast<int64_t>(stats.samples_taken));
  // The sample points the worker's CPU crossed, a period apart: within
  // one period of its registered CPU, between what it measured inside and
  // around its registration (deterministic; it allowed 1% more, by hand,
  // for the calls around `measured`).
  const int64_t period = absl::ToInt64Nanoseconds(options.cpu_period);
  EXPECT_GT(cpu, measured - period);
  EXPECT_LT(cpu, outer + period);
}

TEST(ExportTest, OutputWithPidAndTimeLeavesASeriesOfFiles) {
  const std::string dir = FreshDir("series");
  Options options;
  options.output = dir + "/cpu-%p-%t.pb.gz";
  options.export_period = absl::Milliseconds(100);
  DefaultProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  {
    auto self = profiler.RegisterThread("main");
    // Three periodic windows (the last one at Stop makes four).
    BurnCpuUntil([&] { return ListDir(dir).size() >= 3; });
  }
  ASSERT_TRUE(profiler.Stop().ok());

  const std::vector<std::string> names = ListDir(dir);
  ASSERT_GE(names.size(), 4u);
  const std::string prefix = absl::StrCat("cpu-", getpid(), "-");
  int64_t previous_end = 0;
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    // cpu-<pid>-20240102T030405.678Z.pb.gz, nothing half-written left over.
    EXPECT_THAT(name, StartsWith(prefix));
    EXPECT_THAT(name, ::testing::MatchesRegex(
                          "cpu-[0-9]+-[0-9]{8}T[0-9]{6}\\.[0-9]{3}Z\\.pb\\.gz"));
    auto p = ReadPprofFile(dir + "/" + name);
    ASSERT_TRUE(p.ok()) << p.status();
    // Sorted names are in time order, and the windows tile time.
    if (previous_end != 0) {
      EXPECT_EQ(p->time_nanos, previous_end);
    }
    previous_end = p->time_nanos + p->duration_nanos;
    EXPECT_EQ(ExpandOutputPattern("%t", 0, absl::FromUnixNanos(p->time_nanos)),
              name.substr(prefix.size(), 20));
  }
}

TEST(ExportTest, ExpandOutputPattern) {
  const absl::Time t = absl::FromUnixMillis(1'700'000'000'123);
  EXPECT_EQ(ExpandOutputPattern("a-%p-%t.pb.gz", 77, t),
            "a-77-20231114T221320.123Z.pb.gz");
  EXPECT_EQ(ExpandOutputPattern("100%%-%x-%", 1, t), "100%-%x-%");
  EXPECT_EQ(ExpandOutputPattern("plain.pb.gz", 1, t), "plain.pb.gz");
}

TEST(ExportTest, FileIsReplacedAtomicallyEachWindow) {
  const std::string dir = FreshDir("atomic");
  Options options;
  options.output = dir + "/cpu.pb.gz";
  options.export_period = absl::Milliseconds(100);
  DefaultProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  std::atomic<bool> done{false};
  std::atomic<int> seen_changes{0};
  int reads = 0, bad = 0;
  std::string first_error;
  std::thread reader([&] {
    int64_t last_time = 0;
    int changes = 0;
    while (!done.load()) {
      if (access(options.output.c_str(), F_OK) != 0) continue;
      auto p = ReadPprofFile(options.output);
      ++reads;
      if (!p.ok()) {
        if (bad++ == 0) first_error = std::string(p.status().message());
        continue;
      }
      changes += p->time_nanos != last_time;
      seen_changes = changes;
      last_time = p->time_nanos;
    }
    EXPECT_GE(changes, 3);  // the reader saw successive windows
  });
  {
    auto self = profiler.RegisterThread("main");
    BurnCpuUntil([&] { return seen_changes.load() >= 3; });
  }
  ASSERT_TRUE(profiler.Stop().ok());
  done = true;
  reader.join();
  // How many reads fit in the run is the machine's business; the reader
  // parsed at least its 3 changes whole, and never a partial file.
  std::printf("reads: %d\n", reads);
  EXPECT_EQ(bad, 0) << first_error;
  EXPECT_THAT(ListDir(dir), ::testing::ElementsAre("cpu.pb.gz"));
}

TEST(ExportTest, ZeroPeriodWritesOneProfileAtStop) {
  auto sink = std::make_shared<CollectingSink>();
  Options options;
  options.write_output = false;
  options.export_period = absl::ZeroDuration();
  options.sinks = {sink};
  DefaultProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  const absl::Time started = absl::Now();
  {
    auto self = profiler.RegisterThread("main");
    BurnCpu(250'000'000);
  }
  ASSERT_TRUE(profiler.Stop().ok());
  const auto profiles = sink->profiles();
  ASSERT_THAT(profiles, SizeIs(1));
  EXPECT_TRUE(profiles[0]->last);
  // The one window spans the whole run.
  EXPECT_LE(profiles[0]->start, started);
  EXPECT_GE(profiles[0]->end - profiles[0]->start, absl::Milliseconds(250));
}

// A sink that fails: logged once per streak, the profiler keeps going, and
// Stop() reports the last failure.
class FailingSink : public ProfileSink {
 public:
  absl::string_view name() const override { return "failing"; }
  absl::Status Consume(std::shared_ptr<const ExportedProfile>) override {
    ++calls;
    return absl::UnavailableError("disk full");
  }
  std::atomic<int> calls{0};
};

TEST(ExportTest, FailingSinkLogsOncePerStreakAndStopReportsIt) {
  auto sink = std::make_shared<FailingSink>();
  Options options;
  options.write_output = false;
  options.export_period = absl::Milliseconds(100);
  options.sinks = {sink};
  testing::LogCapture logs;
  DefaultProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  // Three periodic windows fail (60 s: a hang check), then Stop()'s.
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (sink->calls.load() < 3 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  const absl::Status status = profiler.Stop();
  EXPECT_GE(sink->calls.load(), 4);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(std::string(status.message()), "failing: disk full");
  // One line for the streak of periodic failures, one from Stop().
  EXPECT_EQ(logs.Count("failing: disk full"), 2u);
}

TEST(ExportTest, StopGivesUpAfterStopTimeoutAndSaysSo) {
  for (const char* v : {"http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"}) {
    unsetenv(v);
  }
  auto receiver = testing::HttpReceiver::StartTcp();
  ASSERT_TRUE(receiver.ok());
  (*receiver)->SetNeverAnswer(true);
  Options options;
  options.write_output = false;
  options.pyroscope.url = (*receiver)->url();
  options.upload.timeout = absl::Seconds(120);
  options.stop_timeout = absl::Milliseconds(300);
  testing::LogCapture logs;
  DefaultProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  {
    auto self = profiler.RegisterThread("main");
    BurnCpu(50'000'000);
  }
  const absl::Time before = absl::Now();
  const absl::Status status = profiler.Stop();
  const absl::Duration took = absl::Now() - before;
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(status.message()),
              ::testing::AllOf(HasSubstr("pyroscope: 1 profile(s) not delivered"),
                               HasSubstr("INPROF_STOP_TIMEOUT=300ms")));
  // Bounded by the stop timeout, not by the 120 s request timeout.
  EXPECT_LT(took, options.upload.timeout / 4);
  // The request may not have left yet on a loaded machine; never two.
  EXPECT_LE((*receiver)->request_count(), 1u);
  EXPECT_EQ(logs.Count("not delivered"), 1u);  // Stop() logged it
}

TEST(ExportTest, ForkedChildForgetsThreadsAndExitsCleanly) {
  for (const char* v : {"http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"}) {
    unsetenv(v);
  }
  auto receiver = testing::HttpReceiver::StartTcp();
  ASSERT_TRUE(receiver.ok());
  Options options;
  options.write_output = false;
  options.export_period = absl::Milliseconds(100);
  options.pyroscope.url = (*receiver)->url();
  auto core = std::make_unique<internal::Pipeline>(
      options, std::vector<ValueType>{{"samples", "count"}},
      ValueType{"samples", "count"}, 1, "test");
  // The Pyroscope sink, as a profiler composes it.
  internal::ComposePipeline(*core);
  core->BeginWindow();
  core->StartCollector([] {});
  // Collector, exporter and upload threads are all up, waiting on their
  // condition variables.
  ASSERT_TRUE((*receiver)->WaitForRequests(2, absl::Seconds(30)));
  fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(30);  // a hang fails the test instead of stalling it
    core->AbandonCollector();
    core.reset();  // must not join or destroy what the parent's threads use
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  core->StopCollector();
  EXPECT_TRUE(core->Export(ProfilerStats()).ok());
}

}  // namespace
}  // namespace inprof
