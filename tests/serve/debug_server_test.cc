// The live endpoint served over HTTP (INPROF_HTTP_ADDR): a real profiler
// read back by inprof's decoder and by `go tool pprof http://...`, and a
// hostile or careless client. Linked into debug_endpoint_test
// (tests/meson.build).
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
  INPROF_REQUIRE_TOOL("go");
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

// Full of connections whose request has not arrived: a new one closes the
// oldest from the address that holds the most, and is answered.
TEST(DebugServerTest, AFullServerClosesTheOldestWaitingConnectionOfTheGreediestAddress) {
  std::vector<std::string> lines;
  KeepLinesIn(&lines);
  BareServer bare;
  const unsigned most = internal::DebugServer::kMaxConnections;
  // 4 from 127.0.0.3 first (the oldest), then the rest from 127.0.0.2.
  std::vector<int> few;
  std::vector<int> many;
  for (unsigned i = 0; i < most; ++i) {
    const bool early = i < 4;
    // A held one's read times out soon: one closed to make room was closed
    // before the request that made it was answered.
    (early ? few : many).push_back(ConnectFrom(
        bare.address(), early ? "127.0.0.3" : "127.0.0.2", absl::Milliseconds(50)));
    ASSERT_GE((early ? few : many).back(), 0);
  }
  testing::HttpReply r = testing::HttpFetch(bare.address(), "GET", "/debug/pprof/");
  StopKeepingLines();
  EXPECT_EQ(r.error, "");
  EXPECT_EQ(r.status, 200);
  // 127.0.0.2's oldest made room; 127.0.0.3's, older, are still held.
  EXPECT_TRUE(ClosedByServer(many.front()));
  for (size_t i = 1; i < many.size(); ++i) EXPECT_FALSE(ClosedByServer(many[i])) << i;
  for (int fd : few) EXPECT_FALSE(ClosedByServer(fd));
  EXPECT_EQ(bare.server().connections_evicted(), 1u);
  EXPECT_EQ(bare.server().requests_cut(), 0u);
  EXPECT_THAT(lines, Contains(AllOf(HasSubstr("closed a connection from 127.0.0.2"),
                                    HasSubstr("to make room for a new one (16 connections"))));
  for (int fd : few) close(fd);
  for (int fd : many) close(fd);
}

// A greedy local client: `count` connections from 127.0.0.1, each sending
// a request's first bytes and then one more byte every 100 ms, never
// finishing it; one the server closes is
// opened again on the next round, as a client that wants its slots back.
class Tricklers {
 public:
  Tricklers(const std::string& address, int count) : address_(address) {
    for (int i = 0; i < count; ++i) fds_.push_back(Open());
    thread_ = std::thread([this] {
      std::unique_lock<std::mutex> lock(mu_);
      while (!cv_.wait_for(lock, std::chrono::milliseconds(100), [this] { return stop_; })) {
        for (int& fd : fds_) {
          const char byte = 'x';
          if (fd >= 0 && send(fd, &byte, 1, MSG_NOSIGNAL | MSG_DONTWAIT) == 1) {
            pollfd p{fd, POLLIN, 0};
            if (poll(&p, 1, 0) == 0) continue;  // still held
          }
          if (fd >= 0) close(fd);
          fd = Open();
          ++reopened_;
        }
      }
    });
  }
  ~Tricklers() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    for (int fd : fds_) {
      if (fd >= 0) close(fd);
    }
  }
  // Connections the server closed (and the client opened again).
  int reopened() {
    std::lock_guard<std::mutex> lock(mu_);
    return reopened_;
  }

 private:
  int Open() {
    const int fd = ConnectFrom(address_, "127.0.0.1", absl::Seconds(1));
    const std::string start = "GET /debug/pprof/ HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
    if (fd >= 0) send(fd, start.data(), start.size(), MSG_NOSIGNAL);
    return fd;
  }
  const std::string address_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<int> fds_;
  int reopened_ = 0;
  std::thread thread_;
};

// Before: libmicrohttpd's limit of 4 connections per client address let 4
// trickling connections from 127.0.0.1 lock every other local client out
// (each was closed at once) until the 10 s request deadline cut them, and
// the greedy client took them back within 100 ms.
TEST(DebugServerTest, TricklingClientsDoNotLockOutOtherLocalClients) {
  for (int count : {4, static_cast<int>(internal::DebugServer::kMaxConnections)}) {
    SCOPED_TRACE(absl::StrCat(count, " tricklers"));
    std::vector<std::string> lines;
    KeepLinesIn(&lines);
    BareServer bare;
    const std::string address = bare.address();
    ASSERT_NE(address, "");
    int answered = 0;
    int nosniff = 0;
    absl::Duration took;
    int reopened = 0;
    {
      Tricklers tricklers(address, count);
      // The server has taken them in (a round of bytes went out).
      absl::SleepFor(absl::Milliseconds(300));
      const absl::Time begin = absl::Now();
      for (int i = 0; i < 56; ++i) {
        testing::HttpReply r = testing::HttpFetch(address, "GET", "/debug/pprof/");
        answered += r.status == 200;
        nosniff += r.header("X-Content-Type-Options") == "nosniff";
      }
      took = absl::Now() - begin;
      reopened = tricklers.reopened();
    }
    StopKeepingLines();
    std::printf("%d tricklers: %d of 56 requests answered in %s; %d trickling "
                "connections closed to make room (%llu counted), %llu cut late\n",
                count, answered, absl::FormatDuration(took).c_str(), reopened,
                static_cast<unsigned long long>(bare.server().connections_evicted()),
                static_cast<unsigned long long>(bare.server().requests_cut()));
    EXPECT_EQ(answered, 56);
    EXPECT_EQ(nosniff, 56);
    // Each request was let in at once, never by the deadline cutting a
    // trickler: none was cut (a request waiting for that would have
    // taken 10 s).
    EXPECT_EQ(bare.server().requests_cut(), 0u);
    if (count < static_cast<int>(internal::DebugServer::kMaxConnections)) {
      // Room for all: nothing closed.
      EXPECT_EQ(bare.server().connections_evicted(), 0u);
    } else {
      // Full: a request closed the oldest trickler (counted, one line).
      EXPECT_GT(bare.server().connections_evicted(), 0u);
      EXPECT_THAT(lines, Contains(AllOf(HasSubstr("closed a connection from 127.0.0.1"),
                                        HasSubstr("to make room"))));
    }
  }
}

// Before: 500 short parameters (2 KiB) overflowed libmicrohttpd's 32 KiB
// per connection (each parameter is a ~50-byte record there), and the
// request was answered by closing the connection.
TEST(DebugServerTest, AQueryOfManyParametersGetsAnAnswer) {
  BareServer bare;
  const std::string address = bare.address();
  ASSERT_NE(address, "");
  std::string many = "/debug/pprof/?";
  for (int i = 0; i < 500; ++i) absl::StrAppend(&many, "p=1&");
  testing::HttpReply served = testing::HttpFetch(address, "GET", many);
  EXPECT_EQ(served.error, "");
  EXPECT_EQ(served.status, 200);
  // The most the endpoint reads: a target of kMaxTargetLength bytes, all
  // one-letter parameters.
  std::string most = "/debug/pprof/?";
  while (most.size() + 2 <= DebugEndpoint::kMaxTargetLength) most += "a&";
  testing::HttpReply longest = testing::HttpFetch(address, "GET", most);
  EXPECT_EQ(longest.error, "");
  EXPECT_EQ(longest.status, 200);
  // One byte more: 414 naming the limit, in one line.
  std::string over = "/debug/pprof/?";
  while (over.size() + 2 <= DebugEndpoint::kMaxTargetLength + 1) over += "&a";
  while (over.size() < DebugEndpoint::kMaxTargetLength + 1) over += "a";
  testing::HttpReply refused = testing::HttpFetch(address, "GET", over);
  EXPECT_EQ(refused.error, "");
  EXPECT_EQ(refused.status, 414);
  EXPECT_EQ(refused.body, absl::StrCat("request target longer than ",
                                       DebugEndpoint::kMaxTargetLength, " bytes\n"));
}

// Before: only the pprof downloads said nosniff; an error's text (which
// may echo the request) could be sniffed as HTML by a browser.
TEST(DebugServerTest, EveryAnswerSaysNosniff) {
  BareServer bare;
  const std::string address = bare.address();
  ASSERT_NE(address, "");
  const std::string port = address.substr(address.rfind(':') + 1);
  const std::vector<std::pair<int, testing::HttpReply>> replies = {
      {200, testing::HttpFetch(address, "GET", "/debug/pprof/")},
      {400, testing::HttpFetch(address, "GET", "/debug/pprof/profile?seconds=<b>")},
      {404, testing::HttpFetch(address, "GET", "/<script>")},
      {405, testing::HttpFetch(address, "DELETE", "/debug/pprof/")},
      {403, testing::HttpFetch(address, "GET", "/debug/pprof/",
                               ("evil.example:" + port).c_str())},
      {414, testing::HttpFetch(address, "GET",
                               "/" + std::string(DebugEndpoint::kMaxTargetLength, 'x'))},
  };
  for (const auto& [status, r] : replies) {
    SCOPED_TRACE(status);
    EXPECT_EQ(r.error, "");
    EXPECT_EQ(r.status, status);
    EXPECT_EQ(r.header("X-Content-Type-Options"), "nosniff");
  }
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
