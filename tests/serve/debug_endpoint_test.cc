// The live endpoint (INPROF_HTTP_ADDR): request handling without sockets,
// the capture as a window of its own (exact, on a synthetic producer), and a
// real profiler served over HTTP, read back by inprof's decoder and by
// `go tool pprof http://...`.
#include "inprof/internal/debug_endpoint.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <future>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inprof/inprof.h"
#include "inprof/internal/log.h"
#include "inprof/internal/profiler_core.h"
#include "inprof/pprof_reader.h"
#include "util/test_util.h"

namespace inprof {
namespace {

using internal::DebugEndpoint;
using internal::DebugResponse;
using internal::ListenAddress;
using internal::ParseListenAddress;
using ::testing::AllOf;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

// ---------------------------------------------------------------------------
// INPROF_HTTP_ADDR

TEST(ListenAddressTest, LoopbackUnlessAHostIsNamed) {
  struct Case {
    const char* value;
    const char* host;
    int port;
    bool ipv6;
  };
  for (const Case& c : {Case{"6060", "127.0.0.1", 6060, false},
                        Case{":0", "127.0.0.1", 0, false},
                        Case{" :8080 ", "127.0.0.1", 8080, false},
                        Case{"localhost:9", "127.0.0.1", 9, false},
                        Case{"0.0.0.0:6060", "0.0.0.0", 6060, false},
                        Case{"10.1.2.3:65535", "10.1.2.3", 65535, false},
                        Case{"[::1]:6060", "::1", 6060, true},
                        Case{"[::]:1", "::", 1, true}}) {
    SCOPED_TRACE(c.value);
    absl::StatusOr<ListenAddress> a = ParseListenAddress(c.value);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->host, c.host);
    EXPECT_EQ(a->port, c.port);
    EXPECT_EQ(a->ipv6, c.ipv6);
  }
  EXPECT_EQ(internal::FormatListenAddress(*ParseListenAddress("[::1]:80")),
            "[::1]:80");
  EXPECT_EQ(internal::FormatListenAddress(*ParseListenAddress("80")),
            "127.0.0.1:80");
}

TEST(ListenAddressTest, BadValuesAreNamedWithTheAcceptedForm) {
  struct Case {
    const char* value;
    const char* why;
  };
  for (const Case& c : {Case{"", "empty"},
                        Case{"http", "port 'http' is not a number"},
                        Case{"host:", "port '' is not a number"},
                        Case{"1.2.3:80", "'1.2.3' is not an IPv4 address"},
                        Case{"example.com:80", "'example.com' is not an IPv4"},
                        Case{"::1:80", "an IPv6 address must be in brackets"},
                        Case{"[::1]", "no :PORT after the IPv6 address"},
                        Case{"[::1:80", "no ']'"},
                        Case{"[1.2.3.4]:80", "is not an IPv6 address"},
                        Case{"127.0.0.1:65536", "from 0 to 65535"},
                        Case{"127.0.0.1:-1", "from 0 to 65535"}}) {
    SCOPED_TRACE(c.value);
    absl::StatusOr<ListenAddress> a = ParseListenAddress(c.value);
    ASSERT_FALSE(a.ok());
    EXPECT_THAT(a.status().message(),
                HasSubstr(absl::StrCat("INPROF_HTTP_ADDR='", c.value, "'")));
    EXPECT_THAT(a.status().message(), HasSubstr(c.why));
    EXPECT_THAT(a.status().message(), HasSubstr("expected PORT, HOST:PORT"));
  }
}

TEST(ListenAddressTest, TheEnvironmentVariableTurnsTheEndpointOn) {
  std::vector<std::string> errors;
  Options o = Options::FromLookup(
      [](const char* name) -> const char* {
        return std::string(name) == "INPROF_HTTP_ADDR" ? " :6060 " : nullptr;
      },
      &errors);
  EXPECT_THAT(errors, ::testing::IsEmpty());
  EXPECT_EQ(o.http_addr, ":6060");
  o = Options::FromLookup(
      [](const char* name) -> const char* {
        return std::string(name) == "INPROF_HTTP_ADDR" ? "my-host:6060"
                                                       : nullptr;
      },
      &errors);
  EXPECT_EQ(o.http_addr, "");
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_THAT(errors[0], HasSubstr("INPROF_HTTP_ADDR='my-host:6060'"));
  EXPECT_THAT(errors[0], HasSubstr("no endpoint"));
  Options code;
  code.http_addr = "nowhere";
  EXPECT_THAT(code.Validate().message(), HasSubstr("Options.http_addr"));
}

// ---------------------------------------------------------------------------
// Requests, without sockets

std::string Header(const DebugResponse& r, const std::string& name) {
  for (const auto& [n, v] : r.headers) {
    if (n == name) return v;
  }
  return "";
}

struct FakeCaptures {
  std::mutex mutex;
  std::vector<absl::Duration> asked;
  absl::Status result = absl::OkStatus();
  DebugEndpoint::Capture capture() {
    return [this](absl::Duration d) -> absl::StatusOr<std::string> {
      std::lock_guard<std::mutex> lock(mutex);
      asked.push_back(d);
      if (!result.ok()) return result;
      return std::string("PPROF");
    };
  }
};

DebugEndpoint::Render FakeRender(std::string* title) {
  return [title](const std::string& pprof,
                 absl::string_view t) -> absl::StatusOr<std::string> {
    *title = std::string(t);
    return absl::StrCat("<html>", pprof, "</html>");
  };
}

TEST(DebugEndpointTest, AnswersLikeNetHttpPprof) {
  FakeCaptures captures;
  std::string title;
  DebugEndpoint endpoint(captures.capture(), FakeRender(&title), "demo <1>");

  DebugResponse index = endpoint.Respond("GET", "/debug/pprof/");
  EXPECT_EQ(index.status, 200);
  EXPECT_THAT(index.content_type, HasSubstr("text/html"));
  EXPECT_THAT(index.body, HasSubstr("href=\"profile?seconds=30\""));
  EXPECT_THAT(index.body, HasSubstr("href=\"flamegraph?seconds=30\""));
  EXPECT_THAT(index.body, HasSubstr("demo &lt;1&gt;"));  // escaped
  EXPECT_THAT(index.body, HasSubstr("No capture is running"));
  EXPECT_EQ(endpoint.Respond("GET", "/debug/pprof").status, 200);
  EXPECT_EQ(endpoint.Respond("HEAD", "/debug/pprof/").status, 200);
  // go tool pprof's symbolz: captures are symbolized already.
  DebugResponse symbol = endpoint.Respond("GET", "/debug/pprof/symbol");
  EXPECT_EQ(symbol.status, 200);
  EXPECT_EQ(symbol.body, "num_symbols: 1\n");
  EXPECT_EQ(endpoint.Respond("POST", "/debug/pprof/symbol").status, 200);

  DebugResponse profile =
      endpoint.Respond("GET", "/debug/pprof/profile?seconds=2");
  EXPECT_EQ(profile.status, 200);
  EXPECT_EQ(profile.body, "PPROF");
  EXPECT_EQ(profile.content_type, "application/octet-stream");
  EXPECT_THAT(Header(profile, "Content-Disposition"), HasSubstr("attachment"));

  // The default is 30 s; other parameters are ignored, the first seconds=
  // counts, and form encoding is decoded.
  EXPECT_EQ(endpoint.Respond("GET", "/debug/pprof/profile").status, 200);
  EXPECT_EQ(endpoint.Respond("GET", "/debug/pprof/profile?debug=1&seconds=%35&seconds=9")
                .status,
            200);
  DebugResponse page =
      endpoint.Respond("GET", "/debug/pprof/flamegraph?seconds=1");
  EXPECT_EQ(page.status, 200);
  EXPECT_THAT(page.content_type, HasSubstr("text/html"));
  EXPECT_EQ(page.body, "<html>PPROF</html>");
  EXPECT_EQ(title, "demo <1> (live, 1 s)");
  EXPECT_THAT(captures.asked,
              ::testing::ElementsAre(absl::Seconds(2), absl::Seconds(30),
                                     absl::Seconds(5), absl::Seconds(1)));
  EXPECT_EQ(endpoint.captures(), 4u);
}

TEST(DebugEndpointTest, RejectsBadRequestsWithOneLine) {
  FakeCaptures captures;
  std::string title;
  DebugEndpoint endpoint(captures.capture(), FakeRender(&title), "demo");
  struct Case {
    const char* method;
    std::string target;
    int status;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"GET", "/", 404, "no page '/': see /debug/pprof/"},
      {"GET", "/debug/pprof/heap", 404, "no page '/debug/pprof/heap'"},
      {"GET", "/debug/pprof/profile/", 404, "no page"},
      {"POST", "/debug/pprof/profile", 405, "method 'POST' not allowed"},
      {"HEAD", "/debug/pprof/profile", 405, "needs GET"},
      {"GET", "/debug/pprof/profile?seconds=abc", 400,
       "seconds='abc': expected a whole number of seconds from 1 to 600"},
      {"GET", "/debug/pprof/profile?seconds=0", 400, "seconds='0'"},
      {"GET", "/debug/pprof/profile?seconds=601", 400, "seconds='601'"},
      {"GET", "/debug/pprof/profile?seconds=-1", 400, "seconds='-1'"},
      {"GET", "/debug/pprof/profile?seconds=1.5", 400, "seconds='1.5'"},
      {"GET", "/debug/pprof/profile?seconds=", 400, "seconds=''"},
      {"GET", "/debug/pprof/profile?seconds=99999999999999999999", 400,
       "seconds='99999999999999999999'"},
      {"GET", "/debug/pprof/flamegraph?seconds=%zz", 400, "bad %-escape"},
      {"GET", "/debug/pprof/flamegraph?seconds=%4", 400, "bad %-escape"},
      {"GET", "/debug/pprof/" + std::string(5000, 'x'), 414, "longer than"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.target.substr(0, 80));
    DebugResponse r = endpoint.Respond(c.method, c.target);
    EXPECT_EQ(r.status, c.status);
    EXPECT_THAT(r.body, HasSubstr(c.says));
    // One line, whatever the client sent.
    EXPECT_EQ(std::count(r.body.begin(), r.body.end(), '\n'), 1) << r.body;
  }
  EXPECT_TRUE(captures.asked.empty());

  // The capture's own failure: 503 when the profiler stopped, 500 else.
  captures.result = absl::UnavailableError("the profiler stopped");
  DebugResponse stopped = endpoint.Respond("GET", "/debug/pprof/profile?seconds=1");
  EXPECT_EQ(stopped.status, 503);
  EXPECT_THAT(stopped.body, HasSubstr("the profiler stopped"));
  captures.result = absl::InternalError("encoder");
  EXPECT_EQ(endpoint.Respond("GET", "/debug/pprof/profile?seconds=1").status,
            500);
  EXPECT_EQ(endpoint.captures(), 0u);
}

// `inprof agent --http`: one endpoint for the processes the agent serves.
TEST(DebugEndpointTest, SeveralProcessesAreListedAndACaptureNamesOne) {
  std::vector<DebugEndpoint::Process> processes = {{4242, "checkout <a>"}};
  std::vector<std::pair<absl::Duration, int64_t>> asked;
  absl::Status result = absl::OkStatus();
  std::string title;
  DebugEndpoint endpoint(
      [&](absl::Duration d, int64_t pid) -> absl::StatusOr<std::string> {
        asked.emplace_back(d, pid);
        if (!result.ok()) return result;
        return absl::StrCat("PPROF of ", pid);
      },
      [&] { return processes; }, FakeRender(&title), "inprof agent (pid 1)");

  DebugResponse index = endpoint.Respond("GET", "/debug/pprof/");
  EXPECT_EQ(index.status, 200);
  EXPECT_THAT(index.body, HasSubstr("1 connected"));
  EXPECT_THAT(index.body, HasSubstr("<td>4242</td><td>checkout &lt;a&gt;</td>"));
  EXPECT_THAT(index.body, HasSubstr("href=\"profile?seconds=30&amp;pid=4242\""));
  // One process: pid= is not needed.
  DebugResponse one = endpoint.Respond("GET", "/debug/pprof/profile?seconds=2");
  EXPECT_EQ(one.status, 200);
  EXPECT_EQ(one.body, "PPROF of 4242");
  processes.push_back({77, "worker"});
  DebugResponse named = endpoint.Respond("GET", "/debug/pprof/flamegraph?pid=77&seconds=1");
  EXPECT_EQ(named.status, 200);
  EXPECT_EQ(named.body, "<html>PPROF of 77</html>");
  EXPECT_EQ(title, "worker (pid 77) (live, 1 s)");
  ASSERT_EQ(asked.size(), 2u);
  EXPECT_EQ(asked[0], std::make_pair(absl::Seconds(2), int64_t{4242}));
  EXPECT_EQ(asked[1], std::make_pair(absl::Seconds(1), int64_t{77}));

  struct Case {
    std::string target;
    int status;
    const char* says;
  };
  for (const Case& c : std::vector<Case>{
           {"/debug/pprof/profile?seconds=1", 400,
            "2 processes are connected: add pid=N (see /debug/pprof/)"},
           {"/debug/pprof/profile?pid=9", 404, "no process 9 is connected"},
           {"/debug/pprof/profile?pid=abc", 400, "pid='abc': expected a process id"},
           {"/debug/pprof/profile?pid=0", 400, "pid='0'"},
           {"/debug/pprof/profile?pid=99999999999", 400, "pid='99999999999'"},
       }) {
    SCOPED_TRACE(c.target);
    DebugResponse r = endpoint.Respond("GET", c.target);
    EXPECT_EQ(r.status, c.status);
    EXPECT_THAT(r.body, HasSubstr(c.says));
    EXPECT_EQ(std::count(r.body.begin(), r.body.end(), '\n'), 1) << r.body;
  }
  // The process left during the request: 404, and none connected: 503.
  result = absl::NotFoundError("no process 77 is connected");
  EXPECT_EQ(endpoint.Respond("GET", "/debug/pprof/profile?pid=77").status, 404);
  processes.clear();
  DebugResponse none = endpoint.Respond("GET", "/debug/pprof/profile");
  EXPECT_EQ(none.status, 503);
  EXPECT_THAT(none.body, HasSubstr("no process is connected"));
  EXPECT_EQ(asked.size(), 3u);
}

TEST(DebugEndpointTest, OneCaptureAtATimeOthersGet429) {
  std::mutex mutex;
  std::condition_variable cv;
  bool entered = false;
  bool release = false;
  DebugEndpoint endpoint(
      [&](absl::Duration) -> absl::StatusOr<std::string> {
        std::unique_lock<std::mutex> lock(mutex);
        entered = true;
        cv.notify_all();
        cv.wait(lock, [&] { return release; });
        return std::string("first");
      },
      [](const std::string& p, absl::string_view) -> absl::StatusOr<std::string> {
        return p;
      },
      "demo");
  auto first = std::async(std::launch::async, [&] {
    return endpoint.Respond("GET", "/debug/pprof/profile?seconds=20");
  });
  {
    std::unique_lock<std::mutex> lock(mutex);
    cv.wait(lock, [&] { return entered; });
  }
  DebugResponse second = endpoint.Respond("GET", "/debug/pprof/flamegraph?seconds=1");
  EXPECT_EQ(second.status, 429);
  EXPECT_THAT(second.body, HasSubstr("a capture is already running"));
  int retry_after = 0;
  ASSERT_TRUE(absl::SimpleAtoi(Header(second, "Retry-After"), &retry_after));
  EXPECT_GE(retry_after, 1);
  EXPECT_LE(retry_after, 20);
  // The index is always served, and says so.
  DebugResponse index = endpoint.Respond("GET", "/debug/pprof/");
  EXPECT_EQ(index.status, 200);
  EXPECT_THAT(index.body, HasSubstr("A capture is running"));
  {
    std::lock_guard<std::mutex> lock(mutex);
    release = true;
  }
  cv.notify_all();
  EXPECT_EQ(first.get().body, "first");
  EXPECT_EQ(endpoint.refused(), 1u);
  // Free again.
  EXPECT_EQ(endpoint.Respond("GET", "/debug/pprof/profile?seconds=1").status,
            200);
}

// ---------------------------------------------------------------------------
// The capture is a window of its own (ProfilerCore, synthetic samples)

TEST(DebugCaptureTest, CaptureHoldsAContiguousRangeAndExportsStayWhole) {
  // Sample i has values {1, i}: a window holding samples [a, a + n) has
  // count n and sum n*a + n(n-1)/2, so a capture that misses or repeats a
  // sample inside its range is caught.
  constexpr int64_t kSamples = 150'000;
  std::mutex sink_mutex;
  std::vector<std::string> exported;
  class Sink : public ProfileSink {
   public:
    Sink(std::mutex* m, std::vector<std::string>* out) : m_(m), out_(out) {}
    absl::string_view name() const override { return "collect"; }
    absl::Status Consume(std::shared_ptr<const ExportedProfile> p) override {
      std::lock_guard<std::mutex> lock(*m_);
      out_->push_back(p->pprof);
      return absl::OkStatus();
    }
   private:
    std::mutex* m_;
    std::vector<std::string>* out_;
  };
  Options options;
  options.write_output = false;
  options.symbolize = false;
  options.export_period = absl::Milliseconds(100);
  options.collect_period = absl::Milliseconds(5);
  options.sinks = {std::make_shared<Sink>(&sink_mutex, &exported)};
  internal::ProfilerCore core(options, {{"samples", "count"}, {"index", "count"}},
                              {"samples", "count"}, 1, "test");
  std::mutex staging_mutex;
  std::vector<int64_t> staging;
  uint64_t drained = 0;  // core.mutex()
  uint32_t thread = 0;
  {
    std::lock_guard<std::mutex> lock(core.mutex());
    thread = core.aggregator().AddThread(1, "producer");
  }
  // The collector, the exporter and the capture's end all drain, as they do
  // in the profiler; like its DrainRings (registry lock held while adding),
  // a batch is taken and added under one lock, so batches reach the
  // aggregator in the order they were produced. (Taken under one lock and
  // added under another, a later batch could overtake an earlier one
  // around the mirror's switch: under TSan, 2 runs of 30 captured a range
  // with a hole; 0 of 40 since.)
  auto drain = [&] {
    std::lock_guard<std::mutex> staging_lock(staging_mutex);
    std::vector<int64_t> batch;
    batch.swap(staging);
    std::lock_guard<std::mutex> lock(core.mutex());
    for (int64_t i : batch) {
      const uint64_t frame = 0x1000 + 16 * static_cast<uint64_t>(i % 97);
      const int64_t values[] = {1, i};
      core.aggregator().Add(thread, std::span<const uint64_t>(&frame, 1), 0,
                            values);
      ++drained;
    }
  };
  core.BeginWindow();
  core.StartCollector(drain, [&] {
    ProfilerStats s;
    s.samples_taken = s.samples_recorded = drained;
    return s;
  });
  std::atomic<bool> producing{true};
  // kSamples over 1.5 s, then on at that pace until the exporter has cut 5
  // windows (it skips a cut it is late for, so how many fall in 1.5 s
  // depends on the machine's load); 60 s of it is a hang check.
  std::atomic<int64_t> produced{0};
  std::thread producer([&] {
    const absl::Time begin = absl::Now();
    const absl::Time give_up = begin + absl::Seconds(60);
    int64_t i = 0;
    for (; i < kSamples || (core.windows_exported() < 5 && absl::Now() < give_up); ++i) {
      {
        std::lock_guard<std::mutex> lock(staging_mutex);
        staging.push_back(i);
      }
      if (i % 64 == 0) {
        const absl::Time due = begin + absl::Milliseconds(1500) *
                                           (static_cast<double>(i) / kSamples);
        const absl::Duration wait = due - absl::Now();
        if (wait > absl::ZeroDuration()) absl::SleepFor(wait);
      }
    }
    produced = i;
    producing = false;
  });
  absl::SleepFor(absl::Milliseconds(300));
  absl::StatusOr<std::string> capture = core.Capture(absl::Milliseconds(500));
  producer.join();
  core.StopCollector();
  drain();
  ASSERT_TRUE(core.Export(ProfilerStats()).ok());
  ASSERT_TRUE(capture.ok()) << capture.status();

  absl::StatusOr<DecodedProfile> c = DecodePprof(*capture);
  ASSERT_TRUE(c.ok()) << c.status();
  const int64_t all = produced.load();
  const int64_t n = c->Total(0);
  const int64_t sum = c->Total(1);
  ASSERT_GT(n, 0);
  EXPECT_LT(n, all);
  const int64_t a2 = sum - n * (n - 1) / 2;  // n * a
  EXPECT_EQ(a2 % n, 0) << "not a contiguous range: n=" << n << " sum=" << sum;
  EXPECT_GE(a2 / n, 0);
  EXPECT_LE(a2 / n + n, all);
  EXPECT_THAT(c->comments, Contains(HasSubstr("live capture of 500ms")));
  EXPECT_GE(c->duration_nanos, absl::ToInt64Nanoseconds(absl::Milliseconds(500)));

  // The export's windows still hold every sample exactly once.
  std::lock_guard<std::mutex> lock(sink_mutex);
  int64_t count = 0;
  int64_t total = 0;
  for (const std::string& p : exported) {
    absl::StatusOr<DecodedProfile> d = DecodePprof(p);
    ASSERT_TRUE(d.ok()) << d.status();
    count += d->Total(0);
    total += d->Total(1);
  }
  EXPECT_GE(exported.size(), 5u);  // waited for
  EXPECT_EQ(count, all);
  EXPECT_EQ(total, all * (all - 1) / 2);
}

TEST(DebugCaptureTest, StoppingCutsACaptureShort) {
  Options options;
  options.write_output = false;
  options.symbolize = false;
  options.export_period = absl::ZeroDuration();
  internal::ProfilerCore core(options, {{"samples", "count"}},
                              {"samples", "count"}, 1, "test");
  EXPECT_EQ(core.Capture(absl::Seconds(1)).status().code(),
            absl::StatusCode::kUnavailable);  // not started
  core.StartCollector([] {});
  const absl::Time begin = absl::Now();
  auto capture = std::async(std::launch::async,
                            [&] { return core.Capture(absl::Seconds(60)); });
  absl::SleepFor(absl::Milliseconds(200));
  core.StopCollector();
  absl::StatusOr<std::string> result = capture.get();
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(result.status().message(), HasSubstr("stopped during the capture"));
  // Woken, not timed out (a 60 s capture).
  EXPECT_LT(absl::Now() - begin, absl::Seconds(30));
}

// ---------------------------------------------------------------------------
// Over HTTP, with a real profiler

// Named frames for the profiles below.
std::atomic<bool> g_spin{true};
__attribute__((noinline)) void EndpointSpinLeaf() {
  volatile uint64_t x = 0;
  while (g_spin.load(std::memory_order_relaxed)) {
    for (int i = 0; i < 10000; ++i) x = x + static_cast<uint64_t>(i);
  }
}
__attribute__((noinline)) void EndpointSpin() {
  EndpointSpinLeaf();
  asm volatile("" ::: "memory");
}

// A profiler with its endpoint on a free loopback port and one registered
// thread spinning in EndpointSpin.
class ServedProfiler {
 public:
  explicit ServedProfiler(
      absl::Duration export_period = absl::ZeroDuration(),
      std::shared_ptr<ProfileSink> sink = nullptr) {
    Options options;
    options.write_output = false;
    options.export_period = export_period;
    if (sink != nullptr) options.sinks = {sink};
    options.http_addr = "127.0.0.1:0";
    profiler_ = std::make_unique<DefaultProfiler>(options);
    g_spin = true;
    std::promise<void> registered;
    spinner_ = std::thread([this, &registered] {
      auto reg = profiler_->RegisterThread("endpoint-spinner");
      registered.set_value();
      EndpointSpin();
    });
    registered.get_future().wait();
    absl::Status s = profiler_->Start();
    EXPECT_TRUE(s.ok()) << s;
  }
  ~ServedProfiler() {
    g_spin = false;
    spinner_.join();
    profiler_->Stop().IgnoreError();
  }
  DefaultProfiler& profiler() { return *profiler_; }
  std::string address() const { return profiler_->http_address(); }

 private:
  std::unique_ptr<DefaultProfiler> profiler_;
  std::thread spinner_;
};

int64_t CpuOf(const DecodedProfile& p, const std::string& function) {
  const int type = p.ValueIndex("cpu-time");
  if (type < 0) return -1;
  const auto cumulative = p.CumulativeByFunction(type);
  for (const auto& [name, value] : cumulative) {
    if (absl::StrContains(name, function)) return value;
  }
  return 0;
}

TEST(DebugServerTest, ServesTheNextSecondsAsPprofAndAFlameGraph) {
  ServedProfiler served;
  const std::string address = served.address();
  ASSERT_THAT(address, ::testing::StartsWith("127.0.0.1:"));
  ASSERT_NE(address, "127.0.0.1:0");

  testing::HttpReply index = testing::HttpFetch(address, "GET", "/debug/pprof/");
  ASSERT_EQ(index.error, "");
  EXPECT_EQ(index.status, 200);
  EXPECT_THAT(index.body, HasSubstr("profile?seconds=30"));
  EXPECT_THAT(index.header("Content-Type"), HasSubstr("text/html"));

  testing::HttpReply profile = testing::HttpFetch(address, "GET", "/debug/pprof/profile?seconds=1");
  ASSERT_EQ(profile.error, "");
  ASSERT_EQ(profile.status, 200) << profile.body;
  EXPECT_EQ(profile.header("Content-Type"), "application/octet-stream");
  ASSERT_GE(profile.body.size(), 2u);
  EXPECT_EQ(static_cast<unsigned char>(profile.body[0]), 0x1f);  // gzip
  EXPECT_EQ(static_cast<unsigned char>(profile.body[1]), 0x8b);
  absl::StatusOr<DecodedProfile> p = DecodePprof(profile.body);
  ASSERT_TRUE(p.ok()) << p.status();
  // The spinning thread's CPU of that second is there, on its stack: at
  // least one sample, worth one 10 ms period. Not computed: it needs a
  // sample point, i.e. 10 ms of the spinner's CPU within the second, which
  // the scheduler gives a runnable thread unless ~200 others share the two
  // cores with it (its fair share is 2 CPU-seconds / runnable threads).
  EXPECT_GE(CpuOf(*p, "EndpointSpinLeaf"),
            absl::ToInt64Nanoseconds(absl::Milliseconds(10)));
  EXPECT_THAT(p->comments, Contains(HasSubstr("live capture of 1s")));
  EXPECT_GE(p->duration_nanos, absl::ToInt64Nanoseconds(absl::Seconds(1)));
  EXPECT_LT(p->duration_nanos, absl::ToInt64Nanoseconds(absl::Seconds(30)));

  testing::HttpReply page = testing::HttpFetch(address, "GET", "/debug/pprof/flamegraph?seconds=1");
  ASSERT_EQ(page.error, "");
  ASSERT_EQ(page.status, 200) << page.body;
  EXPECT_THAT(page.header("Content-Type"), HasSubstr("text/html"));
  EXPECT_THAT(page.body, HasSubstr("EndpointSpinLeaf"));
  EXPECT_THAT(page.body, HasSubstr("(live, 1 s)"));
  EXPECT_THAT(page.body, ::testing::Not(HasSubstr("<script src")));

  testing::HttpReply bad = testing::HttpFetch(address, "GET", "/debug/pprof/profile?seconds=x");
  EXPECT_EQ(bad.status, 400);
  EXPECT_THAT(bad.body, HasSubstr("seconds='x'"));
  testing::HttpReply post = testing::HttpFetch(address, "POST", "/debug/pprof/profile");
  EXPECT_EQ(post.status, 405);
}

TEST(DebugServerTest, GoToolPprofReadsTheEndpoint) {
  if (!testing::GoPprofAvailable()) GTEST_SKIP() << "INPROF_GO not set";
  ServedProfiler served;
  std::string warnings;
  absl::StatusOr<std::vector<testing::RawSample>> samples =
      testing::ReadWithGoPprofRaw(
          absl::StrCat("http://", served.address(),
                       "/debug/pprof/profile?seconds=1"),
          &warnings);
  ASSERT_TRUE(samples.ok()) << samples.status();
  bool found = false;
  for (const testing::RawSample& s : *samples) {
    for (const std::string& f : s.stack) {
      if (absl::StrContains(f, "EndpointSpinLeaf")) found = true;
    }
  }
  EXPECT_TRUE(found) << "no EndpointSpinLeaf in " << samples->size()
                     << " samples; pprof said: " << warnings;
}

// Keeps the time span of each window it is given.
class SpanSink : public ProfileSink {
 public:
  absl::string_view name() const override { return "spans"; }
  absl::Status Consume(std::shared_ptr<const ExportedProfile> p) override {
    std::lock_guard<std::mutex> lock(mutex_);
    spans_.emplace_back(p->start, p->end);
    return absl::OkStatus();
  }
  std::vector<std::pair<absl::Time, absl::Time>> spans() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return spans_;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::pair<absl::Time, absl::Time>> spans_;
};

TEST(DebugServerTest, ConcurrentCapturesGet429AndExportsGoOn) {
  // Periodic export on: its windows keep coming during the capture.
  auto sink = std::make_shared<SpanSink>();
  auto served = std::make_unique<ServedProfiler>(absl::Milliseconds(200), sink);
  const std::string address = served->address();
  auto a = std::async(std::launch::async, [&] {
    return testing::HttpFetch(address, "GET", "/debug/pprof/profile?seconds=2");
  });
  auto b = std::async(std::launch::async, [&] {
    return testing::HttpFetch(address, "GET", "/debug/pprof/flamegraph?seconds=2");
  });
  testing::HttpReply ra = a.get();
  testing::HttpReply rb = b.get();
  ASSERT_EQ(ra.error, "");
  ASSERT_EQ(rb.error, "");
  // Whichever came first captured; the other was refused.
  EXPECT_THAT((std::vector<int>{ra.status, rb.status}),
              UnorderedElementsAre(200, 429));
  const testing::HttpReply& refused = ra.status == 429 ? ra : rb;
  EXPECT_THAT(refused.body, HasSubstr("a capture is already running"));
  EXPECT_NE(refused.header("Retry-After"), "");
  // The capture's span, when the one that answered was the pprof one.
  absl::Time capture_start = absl::InfiniteFuture(), capture_end = absl::InfinitePast();
  if (ra.status == 200) {
    absl::StatusOr<DecodedProfile> c = DecodePprof(ra.body);
    ASSERT_TRUE(c.ok()) << c.status();
    capture_start = absl::FromUnixNanos(c->time_nanos);
    capture_end = capture_start + absl::Nanoseconds(c->duration_nanos);
  }
  served.reset();  // Stop(): the last window
  // The export went on meanwhile and lost nothing: its windows tile the
  // run, across the capture. How many windows were cut during the capture
  // depends on how the machine schedules the exporter: printed.
  const auto spans = sink->spans();
  ASSERT_FALSE(spans.empty());
  int during = 0;
  for (size_t w = 0; w < spans.size(); ++w) {
    SCOPED_TRACE(absl::StrCat("window ", w));
    if (w > 0) {
      EXPECT_EQ(spans[w].first, spans[w - 1].second);
    }
    EXPECT_GT(spans[w].second, spans[w].first);
    during += spans[w].second > capture_start && spans[w].second < capture_end;
  }
  if (ra.status == 200) {
    EXPECT_LE(spans.front().first, capture_start);
    EXPECT_GE(spans.back().second, capture_end);
  }
  std::printf("%zu windows, %d cut during the capture\n", spans.size(), during);
}

TEST(DebugServerTest, StopEndsACaptureInProgressAndClosesThePort) {
  auto served = std::make_unique<ServedProfiler>();
  const std::string address = served->address();
  auto capture = std::async(std::launch::async, [&] {
    return testing::HttpFetch(address, "GET", "/debug/pprof/profile?seconds=600");
  });
  // Wait until that capture runs (the index says so).
  bool running = false;
  for (int i = 0; i < 600 && !running; ++i) {
    running = absl::StrContains(testing::HttpFetch(address, "GET", "/debug/pprof/").body,
                                "A capture is running");
    if (!running) absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(running);
  const absl::Time begin = absl::Now();
  served.reset();  // Stop()
  const absl::Duration stop = absl::Now() - begin;
  testing::HttpReply r = capture.get();
  // Stop() did not wait out the 600 s capture, and said why.
  EXPECT_LT(stop, absl::Seconds(60));
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.status, 503);
  EXPECT_THAT(r.body, HasSubstr("the profiler stopped during the capture"));
  testing::HttpReply after = testing::HttpFetch(address, "GET", "/debug/pprof/");
  EXPECT_THAT(after.error, HasSubstr("connect"));
}

// The log lines a test keeps: the server's threads log while the test
// runs, so the vector is filled under a lock, and StopKeepingLines() ends
// that before the test reads it. A std::mutex: TSan sees through it (Debian's
// Abseil is not built with TSan, so its Mutex is invisible there).
std::mutex g_log_mu;
std::vector<std::string>* g_log_lines = nullptr;  // guarded by g_log_mu
void KeepLine(absl::string_view line) {
  std::lock_guard<std::mutex> lock(g_log_mu);
  if (g_log_lines != nullptr) g_log_lines->emplace_back(line);
}
void KeepLinesIn(std::vector<std::string>* lines) {
  {
    std::lock_guard<std::mutex> lock(g_log_mu);
    g_log_lines = lines;
  }
  internal::SetLogSinkForTesting(&KeepLine);
}
void StopKeepingLines() {
  internal::SetLogSinkForTesting(nullptr);
  std::lock_guard<std::mutex> lock(g_log_mu);  // a line being kept now is the last
  g_log_lines = nullptr;
}

TEST(DebugServerTest, APortInUseIsOneLineAndProfilingGoesOn) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof(sa);
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  const std::string taken = absl::StrCat("127.0.0.1:", ntohs(sa.sin_port));

  std::vector<std::string> lines;
  KeepLinesIn(&lines);
  Options options;
  options.write_output = false;
  options.http_addr = taken;
  DefaultProfiler profiler(options);
  absl::Status s = profiler.Start();
  StopKeepingLines();
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(profiler.running());
  EXPECT_EQ(profiler.http_address(), "");
  EXPECT_THAT(lines, Contains(AllOf(HasSubstr("INPROF_HTTP_ADDR='" + taken + "'"),
                                    HasSubstr("cannot listen on " + taken),
                                    HasSubstr("no endpoint"))));
  EXPECT_TRUE(profiler.Stop().ok());
  close(fd);
}

// --- a hostile or careless client ------------------------------------------

TEST(HostHeaderTest, OnlyAddressesLocalhostAndTheListeningHostAreAnswered) {
  const ListenAddress loopback{"127.0.0.1", 6060, false};
  for (const char* host :
       {"127.0.0.1:6060", "127.0.0.1", "10.1.2.3:80", "localhost:6060",
        "LOCALHOST", "localhost.", "[::1]:6060", "[::1]", "[fe80::1]:1"}) {
    EXPECT_TRUE(internal::HostHeaderAllowed(host, loopback)) << host;
  }
  for (const char* host :
       {"evil.example:6060", "evil.example", "127.0.0.1.evil.example",
        "localhost.evil.example:6060", "[evil]:6060", "[::1", "[::1]x",
        "::1", "1.2.3.4:5:6", "", "my-laptop:6060", "0x7f000001"}) {
    EXPECT_FALSE(internal::HostHeaderAllowed(host, loopback)) << host;
  }
}

// A connected socket to `address` from `source` (an IPv4 loopback address),
// with a receive timeout of `timeout`; -1 on failure.
int ConnectFrom(const std::string& address, const char* source,
                absl::Duration timeout) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port)) return -1;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval tv = absl::ToTimeval(timeout);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in from{};
  from.sin_family = AF_INET;
  inet_pton(AF_INET, source, &from.sin_addr);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, address.substr(0, colon).c_str(), &to.sin_addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0 ||
      connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Whether the server closed `fd` (end of stream or reset) before its
// receive timeout.
bool ClosedByServer(int fd) {
  char c;
  while (true) {
    const ssize_t n = recv(fd, &c, 1, 0);
    if (n < 0 && errno == EINTR) continue;
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
  }
}

// A bare server on 127.0.0.1 answering every page with "ok".
class BareServer {
 public:
  explicit BareServer(absl::Duration request_deadline =
                          internal::DebugServer::kRequestDeadline)
      : endpoint_([](absl::Duration) -> absl::StatusOr<std::string> {
                    return std::string("pprof");
                  },
                  [](const std::string&, absl::string_view) -> absl::StatusOr<std::string> {
                    return std::string("page");
                  },
                  "bare") {
    auto server = internal::DebugServer::Start(ListenAddress{"127.0.0.1", 0, false},
                                               &endpoint_, request_deadline);
    EXPECT_TRUE(server.ok()) << server.status();
    if (server.ok()) server_ = std::move(*server);
  }
  internal::DebugServer& server() { return *server_; }
  std::string address() const { return server_ != nullptr ? server_->address() : ""; }

 private:
  DebugEndpoint endpoint_;
  std::unique_ptr<internal::DebugServer> server_;
};

TEST(DebugServerTest, ANameInTheHostHeaderGets403AndOneLogLine) {
  std::vector<std::string> lines;
  KeepLinesIn(&lines);
  BareServer bare;
  const std::string address = bare.address();
  ASSERT_NE(address, "");
  const std::string port = address.substr(address.rfind(':') + 1);
  const std::string evil = "evil.example:" + port;
  testing::HttpReply refused = testing::HttpFetch(address, "GET", "/debug/pprof/", evil.c_str());
  testing::HttpReply again = testing::HttpFetch(address, "GET", "/debug/pprof/", evil.c_str());
  testing::HttpReply by_name =
      testing::HttpFetch(address, "GET", "/debug/pprof/", ("localhost:" + port).c_str());
  testing::HttpReply by_v6 =
      testing::HttpFetch(address, "GET", "/debug/pprof/", ("[::1]:" + port).c_str());
  StopKeepingLines();
  ASSERT_EQ(refused.error, "");
  EXPECT_EQ(refused.status, 403);
  EXPECT_THAT(refused.body, HasSubstr("Host 'evil.example:" + port + "' refused"));
  EXPECT_EQ(again.status, 403);
  EXPECT_EQ(by_name.status, 200);
  EXPECT_EQ(by_v6.status, 200);
  EXPECT_EQ(bare.server().hosts_refused(), 2u);
  int said = 0;
  for (const std::string& line : lines) said += absl::StrContains(line, "Host 'evil.example");
  EXPECT_EQ(said, 1) << absl::StrJoin(lines, "\n");
}

TEST(DebugServerTest, ARequestStillArrivingDoesNotDelayStop) {
  BareServer bare;
  const int fd = ConnectFrom(bare.address(), "127.0.0.1", absl::Seconds(5));
  ASSERT_GE(fd, 0);
  const std::string partial = "GET /debug/pprof/ HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  ASSERT_EQ(send(fd, partial.data(), partial.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(partial.size()));
  // Time for the server to read the request line (not needed to pass).
  absl::SleepFor(absl::Milliseconds(200));
  const absl::Time begin = absl::Now();
  bare.server().Stop();
  const absl::Duration stop = absl::Now() - begin;
  // Stop() waits up to kStopGrace for answers under way; this request has
  // none yet, so it waited for nothing (it waited the whole grace before).
  EXPECT_LT(stop, internal::DebugServer::kStopGrace / 2);
  EXPECT_TRUE(ClosedByServer(fd));
  close(fd);
}

TEST(DebugServerTest, ARequestThatDoesNotArriveInTimeIsCut) {
  std::vector<std::string> lines;
  KeepLinesIn(&lines);
  BareServer bare(absl::Milliseconds(300));
  const int fd = ConnectFrom(bare.address(), "127.0.0.1", absl::Seconds(5));
  ASSERT_GE(fd, 0);
  // A byte every 50 ms: never idle (kIdleTimeout), never finished (this
  // header would take 200 s).
  const std::string slow =
      "GET /debug/pprof/ HTTP/1.1\r\nX-Slow: " + std::string(4000, 'x');
  bool cut = false;
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  for (size_t i = 0; i < slow.size() && !cut && absl::Now() < give_up; ++i) {
    cut = send(fd, &slow[i], 1, MSG_NOSIGNAL) != 1;
    if (!cut) {
      pollfd p{fd, POLLIN, 0};
      cut = poll(&p, 1, 50) == 1 && ClosedByServer(fd);
    }
  }
  StopKeepingLines();
  close(fd);
  EXPECT_TRUE(cut);
  EXPECT_EQ(bare.server().requests_cut(), 1u);
  EXPECT_THAT(lines, Contains(AllOf(HasSubstr("closed a connection from 127.0.0.1"),
                                    HasSubstr("did not arrive within 300ms"))));
  // The server still answers.
  EXPECT_EQ(testing::HttpFetch(bare.address(), "GET", "/debug/pprof/").status, 200);
}

TEST(DebugServerTest, OneAddressGetsAtMostItsShareOfTheConnections) {
  BareServer bare;
  std::vector<int> held;
  for (unsigned i = 0; i < internal::DebugServer::kMaxConnectionsPerAddress; ++i) {
    held.push_back(ConnectFrom(bare.address(), "127.0.0.1", absl::Milliseconds(300)));
    ASSERT_GE(held.back(), 0);
  }
  // Held open (no request yet): each read times out.
  for (int fd : held) EXPECT_FALSE(ClosedByServer(fd));
  const int one_more = ConnectFrom(bare.address(), "127.0.0.1", absl::Seconds(5));
  ASSERT_GE(one_more, 0);
  EXPECT_TRUE(ClosedByServer(one_more));  // over the address's share
  close(one_more);
  // Another client address is still served.
  const int other = ConnectFrom(bare.address(), "127.0.0.2", absl::Milliseconds(300));
  ASSERT_GE(other, 0);
  EXPECT_FALSE(ClosedByServer(other));
  close(other);
  for (int fd : held) close(fd);
}

bool MapsMention(absl::string_view what) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (absl::StrContains(line, what)) return true;
  }
  return false;
}

TEST(DebugServerDeathTest, AHostWithoutTheEndpointNeverLoadsTheServer) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        Options options;
        options.write_output = false;
        DefaultProfiler profiler(options);
        if (!profiler.Start().ok()) _exit(3);
        absl::SleepFor(absl::Milliseconds(100));
        profiler.Stop().IgnoreError();
        _exit(MapsMention("libmicrohttpd") ? 1 : 0);
      },
      ::testing::ExitedWithCode(0), "");
  // And one with it does (so that the check above can fail).
  EXPECT_EXIT(
      {
        Options options;
        options.write_output = false;
        options.http_addr = "127.0.0.1:0";
        DefaultProfiler profiler(options);
        if (!profiler.Start().ok()) _exit(3);
        const bool loaded = MapsMention("libmicrohttpd");
        profiler.Stop().IgnoreError();
        _exit(loaded ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(DebugServerDeathTest, AMissingLibraryIsNamedWithItsPackage) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("INPROF_LIBMICROHTTPD", "/nonexistent/libmicrohttpd.so.12", 1);
        Options options;
        options.write_output = false;
        options.http_addr = "127.0.0.1:0";
        DefaultProfiler profiler(options);
        const bool started = profiler.Start().ok();
        const bool served = !profiler.http_address().empty();
        profiler.Stop().IgnoreError();
        _exit(started && !served ? 0 : 1);
      },
      ::testing::ExitedWithCode(0),
      "INPROF_HTTP_ADDR='127.0.0.1:0': the endpoint needs libmicrohttpd "
      "\\('/nonexistent/libmicrohttpd.so.12', Debian package "
      "libmicrohttpd12\\), which cannot be loaded");
}

}  // namespace
}  // namespace inprof
