// The live endpoint (INPROF_HTTP_ADDR): request handling without sockets
// and the capture as a window of its own (exact, on a synthetic producer).
// The endpoint served over HTTP by a real profiler is in
// debug_server_test.cc, a second source of this executable.
#include "inprof/internal/debug_endpoint.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <future>
#include <memory>
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
#include "inprof/base/log.h"
#include "inprof/base/owned_fd.h"
#include "inprof/internal/pipeline.h"
#include "inprof/pprof_reader.h"
#include "inprof/symbolizer.h"
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
using ::testing::Not;
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

// /debug/pprof/heap and /allocs: the snapshot now, opening on inuse_space
// and alloc_space; no page without one, and what Go takes that a snapshot
// cannot answer is one line.
TEST(DebugEndpointTest, HeapAndAllocsAreSnapshotsOpeningOnTheirType) {
  FakeCaptures captures;
  std::string title;
  DebugEndpoint endpoint(captures.capture(), FakeRender(&title), "demo");
  DebugResponse none = endpoint.Respond("GET", "/debug/pprof/heap");
  EXPECT_EQ(none.status, 404);
  EXPECT_THAT(none.body, HasSubstr("AllocationProvider"));

  std::vector<std::string> asked;
  std::vector<absl::Duration> deltas;
  bool on = false;
  endpoint.SetSnapshot([&](absl::string_view type,
                           absl::Duration delta) -> absl::StatusOr<std::string> {
    asked.emplace_back(type);
    deltas.push_back(delta);
    if (!on) return absl::NotFoundError("allocation profiling is off: INPROF_ALLOC_PERIOD");
    return std::string("HEAP");
  });
  DebugResponse off = endpoint.Respond("GET", "/debug/pprof/heap");
  EXPECT_EQ(off.status, 404);
  EXPECT_THAT(off.body, HasSubstr("INPROF_ALLOC_PERIOD"));
  on = true;
  DebugResponse heap = endpoint.Respond("GET", "/debug/pprof/heap");
  EXPECT_EQ(heap.status, 200);
  EXPECT_EQ(heap.body, "HEAP");
  EXPECT_EQ(heap.content_type, "application/octet-stream");
  EXPECT_THAT(Header(heap, "Content-Disposition"), HasSubstr("heap.pb.gz"));
  DebugResponse allocs = endpoint.Respond("GET", "/debug/pprof/allocs?gc=1");
  EXPECT_EQ(allocs.status, 200);
  EXPECT_THAT(Header(allocs, "Content-Disposition"), HasSubstr("allocs.pb.gz"));
  EXPECT_THAT(asked, ::testing::ElementsAre("inuse_space", "inuse_space", "alloc_space"));

  // seconds=N: Go's delta of two snapshots N seconds apart, asked as such;
  // a bad N is one line and asks nothing.
  DebugResponse seconds = endpoint.Respond("GET", "/debug/pprof/heap?seconds=5");
  EXPECT_EQ(seconds.status, 200);
  EXPECT_EQ(seconds.body, "HEAP");
  EXPECT_THAT(deltas, ::testing::ElementsAre(absl::ZeroDuration(), absl::ZeroDuration(),
                                             absl::ZeroDuration(), absl::Seconds(5)));
  DebugResponse bad_seconds = endpoint.Respond("GET", "/debug/pprof/heap?seconds=0");
  EXPECT_EQ(bad_seconds.status, 400);
  EXPECT_THAT(bad_seconds.body, HasSubstr("seconds='0'"));
  EXPECT_EQ(endpoint.Respond("GET", "/debug/pprof/heap?seconds=601").status, 400);
  EXPECT_EQ(endpoint.Respond("GET", "/debug/pprof/allocs?debug=2").status, 400);
  EXPECT_EQ(endpoint.Respond("POST", "/debug/pprof/heap").status, 405);
  EXPECT_EQ(asked.size(), 4u);  // none of the refused ones asked
  // debug=1 asks for the snapshot and turns it into the legacy text: this
  // one is no pprof, which is one line naming the form.
  DebugResponse text = endpoint.Respond("GET", "/debug/pprof/heap?debug=1");
  EXPECT_EQ(text.status, 500);
  EXPECT_THAT(text.body, HasSubstr("debug=1"));
  EXPECT_THAT(endpoint.Respond("GET", "/debug/pprof/").body, HasSubstr("href=\"heap\""));
}

// /debug/pprof/mutex and /block: the lock-wait snapshot, asked for by its
// type (delay), each page's file named after it; without a snapshot, one
// line naming the provider.
TEST(DebugEndpointTest, MutexAndBlockAreLockWaitSnapshots) {
  FakeCaptures captures;
  std::string title;
  DebugEndpoint endpoint(captures.capture(), FakeRender(&title), "demo");
  DebugResponse none = endpoint.Respond("GET", "/debug/pprof/mutex");
  EXPECT_EQ(none.status, 404);
  EXPECT_THAT(none.body, HasSubstr("LockWaitProvider"));
  std::vector<std::string> asked;
  std::vector<absl::Duration> deltas;
  endpoint.SetSnapshot([&](absl::string_view type,
                           absl::Duration delta) -> absl::StatusOr<std::string> {
    asked.emplace_back(type);
    deltas.push_back(delta);
    return std::string("LOCKS");
  });
  DebugResponse mutex = endpoint.Respond("GET", "/debug/pprof/mutex");
  EXPECT_EQ(mutex.status, 200);
  EXPECT_EQ(mutex.body, "LOCKS");
  EXPECT_THAT(Header(mutex, "Content-Disposition"), HasSubstr("mutex.pb.gz"));
  DebugResponse block = endpoint.Respond("GET", "/debug/pprof/block?seconds=3");
  EXPECT_EQ(block.status, 200);
  EXPECT_THAT(Header(block, "Content-Disposition"), HasSubstr("block.pb.gz"));
  EXPECT_EQ(endpoint.Respond("GET", "/debug/pprof/block?seconds=0").status, 400);
  EXPECT_THAT(asked, ::testing::ElementsAre("delay", "delay"));
  EXPECT_THAT(deltas, ::testing::ElementsAre(absl::ZeroDuration(), absl::Seconds(3)));
  // debug=1 turns the snapshot into Go's legacy text: this one is no pprof.
  DebugResponse text = endpoint.Respond("GET", "/debug/pprof/mutex?debug=1");
  EXPECT_EQ(text.status, 500);
  EXPECT_THAT(text.body, HasSubstr("legacy contention profile"));
  const std::string index = endpoint.Respond("GET", "/debug/pprof/").body;
  EXPECT_THAT(index, HasSubstr("href=\"mutex\""));
  EXPECT_THAT(index, HasSubstr("href=\"block\""));
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
      {"GET", "/debug/pprof/heap", 404, "no heap profile here"},  // no snapshot given
      {"GET", "/debug/pprof/cmdline", 404, "no page '/debug/pprof/cmdline'"},
      // Without a thread dump (an endpoint for several processes, or none set).
      {"GET", "/debug/pprof/goroutine", 404, "/debug/pprof/goroutine is served by"},
      {"GET", "/debug/pprof/threads?debug=3", 400, "debug='3'"},
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

// GET of each target: its status, and one line that says why.
struct Refusal {
  std::string target;
  int status;
  const char* says;
};
void ExpectOneLineRefusals(DebugEndpoint& endpoint, const std::vector<Refusal>& refusals) {
  for (const Refusal& c : refusals) {
    SCOPED_TRACE(c.target);
    DebugResponse r = endpoint.Respond("GET", c.target);
    EXPECT_EQ(r.status, c.status);
    EXPECT_THAT(r.body, HasSubstr(c.says));
    EXPECT_EQ(std::count(r.body.begin(), r.body.end(), '\n'), 1) << r.body;
  }
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

  ExpectOneLineRefusals(endpoint,
                        {
                            {"/debug/pprof/profile?seconds=1", 400,
                             "2 processes are connected: add pid=N (see /debug/pprof/)"},
                            {"/debug/pprof/profile?pid=9", 404, "no process 9 is connected"},
                            {"/debug/pprof/profile?pid=abc", 400,
                             "pid='abc': expected a process id"},
                            {"/debug/pprof/profile?pid=0", 400, "pid='0'"},
                            {"/debug/pprof/profile?pid=99999999999", 400, "pid='99999999999'"},
                        });
  // The process left during the request: 404, and none connected: 503.
  result = absl::NotFoundError("no process 77 is connected");
  EXPECT_EQ(endpoint.Respond("GET", "/debug/pprof/profile?pid=77").status, 404);
  processes.clear();
  DebugResponse none = endpoint.Respond("GET", "/debug/pprof/profile");
  EXPECT_EQ(none.status, 503);
  EXPECT_THAT(none.body, HasSubstr("no process is connected"));
  EXPECT_EQ(asked.size(), 3u);
}

// `inprof agent --http`: each process's heap, named with pid= as a capture.
TEST(DebugEndpointTest, SeveralProcessesEachHaveTheirHeap) {
  std::vector<DebugEndpoint::Process> processes = {{4242, "checkout"}, {77, "worker"}};
  std::string title;
  DebugEndpoint endpoint(
      [](absl::Duration, int64_t) -> absl::StatusOr<std::string> { return std::string(); },
      [&] { return processes; }, FakeRender(&title), "inprof agent (pid 1)");
  // No snapshot given (an agent without heap pages): 404, and no links.
  DebugResponse none = endpoint.Respond("GET", "/debug/pprof/heap?pid=4242");
  EXPECT_EQ(none.status, 404);
  EXPECT_THAT(none.body, HasSubstr("no heap profile here"));
  EXPECT_THAT(endpoint.Respond("GET", "/debug/pprof/").body, Not(HasSubstr("heap?pid=")));

  std::vector<std::pair<std::string, int64_t>> asked;
  endpoint.SetProcessSnapshot([&](absl::string_view type, int64_t pid,
                                  absl::Duration delta) -> absl::StatusOr<std::string> {
    asked.emplace_back(std::string(type), pid);
    if (pid == 77) {
      return absl::NotFoundError("allocation profiling is off in this process");
    }
    const std::string over =
        delta > absl::ZeroDuration() ? absl::StrCat(" over ", absl::FormatDuration(delta)) : "";
    return absl::StrCat("HEAP ", std::string(type), " of ", pid, over);
  });
  EXPECT_THAT(endpoint.Respond("GET", "/debug/pprof/").body,
              HasSubstr("<a href=\"heap?pid=4242\">heap</a>"));
  DebugResponse heap = endpoint.Respond("GET", "/debug/pprof/heap?pid=4242");
  EXPECT_EQ(heap.status, 200);
  EXPECT_EQ(heap.body, "HEAP inuse_space of 4242");
  DebugResponse allocs = endpoint.Respond("GET", "/debug/pprof/allocs?pid=4242");
  EXPECT_EQ(allocs.status, 200);
  EXPECT_EQ(allocs.body, "HEAP alloc_space of 4242");
  ExpectOneLineRefusals(
      endpoint,
      {
          {"/debug/pprof/heap", 400, "2 processes are connected: add pid=N"},
          {"/debug/pprof/heap?pid=9", 404, "no process 9 is connected"},
          {"/debug/pprof/heap?pid=abc", 400, "pid='abc': expected a process id"},
          {"/debug/pprof/allocs?pid", 400, "pid: expected pid=N"},
          {"/debug/pprof/heap?pid=77", 404, "allocation profiling is off in this process"},
      });
  // seconds=N: the process's delta, as the process's own endpoint serves it.
  EXPECT_EQ(endpoint.Respond("GET", "/debug/pprof/heap?pid=4242&seconds=5").body,
            "HEAP inuse_space of 4242 over 5s");
  // One process: pid= is not needed.
  processes.pop_back();
  EXPECT_EQ(endpoint.Respond("GET", "/debug/pprof/heap").body, "HEAP inuse_space of 4242");
  EXPECT_EQ(asked.size(), 5u);  // the two above, pid 77's refusal, the delta, and this one
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
// The capture is a window of its own (the pipeline, synthetic samples)

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
  internal::Pipeline core(options, {{"samples", "count"}},
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

// `inprof agent` hands each session's pipeline the process's symbolizer,
// whose files are numbers in the table of the thread that made it. A
// capture asked for from a thread in another table is refused rather than
// symbolized there: a refresh would open the files again in that table and
// close the old numbers in it, and the exporter would then close the new
// numbers in its own -- other files of the agent's
// (AgentLibraryTest.TheAgentServesALiveCaptureOfAProcess shows the whole
// path). Deterministic.
TEST(DebugCaptureTest, AGivenSymbolizerIsUsedOnlyInTheTableItsFilesAreIn) {
  Options options;
  options.write_output = false;
  options.export_period = absl::ZeroDuration();
  internal::Pipeline core(options, {{"samples", "count"}}, {"samples", "count"}, 1,
                          "test");
  core.UseSymbolizer(std::make_unique<Symbolizer>());
  core.StartCollector([] {});
  EXPECT_TRUE(core.Capture(absl::Milliseconds(10)).ok());
  bool own_table = false;
  absl::Status elsewhere;
  std::thread([&] {
    own_table = internal::EnterPrivateDescriptorTable();
    elsewhere = core.Capture(absl::Milliseconds(10)).status();
  }).join();
  core.StopCollector();
  if (own_table) {
    EXPECT_EQ(elsewhere.code(), absl::StatusCode::kFailedPrecondition) << elsewhere;
    EXPECT_THAT(elsewhere.message(), HasSubstr("descriptor table"));
  } else {
    // Private tables refused here (ThreadSanitizer, a seccomp filter):
    // every thread shares the program's, and the capture is served.
    EXPECT_TRUE(elsewhere.ok()) << elsewhere;
  }
}

}  // namespace
}  // namespace inprof
