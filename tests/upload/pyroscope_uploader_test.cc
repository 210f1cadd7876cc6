#include "inprof/pyroscope_uploader.h"

#include <stdlib.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "upload/http_receiver.h"
#include "inprof/inprof.h"
#include "inprof/base/log.h"
#include "inprof/pprof_reader.h"
#include "util/test_util.h"

namespace inprof {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::SizeIs;
using testing::ClosedPort;
using testing::HttpReceiver;
using testing::LogCapture;
using testing::ReceivedRequest;

const absl::Time kStart = absl::FromUnixNanos(1'700'000'000'250'000'000);
const absl::Time kEnd = absl::FromUnixNanos(1'700'000'010'500'000'000);

std::shared_ptr<ExportedProfile> Profile() {
  auto p = std::make_shared<ExportedProfile>();
  p->pprof = testing::MakeTestPprof(kStart, kEnd);
  p->start = kStart;
  p->end = kEnd;
  return p;
}

UploadOptions Fast() {
  UploadOptions u;
  u.timeout = absl::Seconds(20);
  u.backoff = absl::Milliseconds(10);
  u.max_retries = 3;
  return u;
}

PyroscopeOptions Server(const std::string& url) {
  PyroscopeOptions p;
  p.url = url;
  p.application_name = "checkout{region=eu,pod=a-1}";
  return p;
}

absl::Time Later(absl::Duration d) { return absl::Now() + d; }

class PyroscopeUploaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : {"http_proxy", "HTTP_PROXY", "https_proxy",
                          "HTTPS_PROXY", "all_proxy", "ALL_PROXY"}) {
      unsetenv(v);
    }
  }
};

TEST_F(PyroscopeUploaderTest, PostsPprofToIngestWithQueryParameters) {
  auto receiver = HttpReceiver::StartTcp();
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  PyroscopeUploader uploader(Server((*receiver)->url()), Fast(),
                             absl::Milliseconds(10));
  auto profile = Profile();
  ASSERT_TRUE(uploader.Consume(profile).ok());
  ASSERT_TRUE(uploader.Flush(Later(absl::Seconds(30))).ok());

  const auto requests = (*receiver)->requests();
  ASSERT_THAT(requests, SizeIs(1));
  const ReceivedRequest& req = requests[0];
  EXPECT_EQ(req.method, "POST");
  EXPECT_EQ(req.path, "/ingest");
  const std::map<std::string, std::string> expected = {
      {"name", "checkout{region=eu,pod=a-1}"},
      {"from", "1700000000"},
      {"until", "1700000011"},  // rounded up: the range holds the window
      {"format", "pprof"},
      {"spyName", "inprof"},
      {"sampleRate", "100"}};
  EXPECT_EQ(req.query, expected);
  EXPECT_EQ(req.headers.at("content-type"), "application/octet-stream");
  EXPECT_FALSE(req.headers.contains("authorization"));
  EXPECT_FALSE(req.headers.contains("x-scope-orgid"));
  EXPECT_EQ(req.body, profile->pprof);

  absl::StatusOr<DecodedProfile> decoded = DecodePprof(req.body);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->Total(decoded->ValueIndex("cpu-samples")), 3);
  INPROF_REQUIRE_TOOL("go");
  {
    const std::string path = testing::TestTmpDir() + "/pyroscope-ingest.pb.gz";
    std::ofstream(path, std::ios::binary) << req.body;
    auto raw = testing::ReadWithGoPprofRaw(path);
    ASSERT_TRUE(raw.ok()) << raw.status();
    ASSERT_THAT(*raw, SizeIs(1));
    EXPECT_THAT((*raw)[0].stack, Contains(HasSubstr("TestProfileLeaf")));
  }
}

// The name Grafana Pyroscope files an /ingest upload under (its
// RawProfile.metricName, pkg/og/convert/pprof): "wall" when a type is
// named so; else the first type naming CPU or allocations decides.
std::string PyroscopeMetricName(const DecodedProfile& p) {
  for (const ValueType& t : p.sample_types) {
    if (t.type == "wall") return "wall";
  }
  for (const ValueType& t : p.sample_types) {
    if (absl::StrContains(t.type, "cpu")) return "process_cpu";
    if (absl::StrContains(t.type, "alloc_") || absl::StrContains(t.type, "inuse_")) {
      return "memory";
    }
    if (t.type == "contentions" || t.type == "delay") return "mutex";
  }
  return "";
}

std::vector<std::string> TypeNames(const DecodedProfile& p) {
  std::vector<std::string> names;
  for (const ValueType& t : p.sample_types) names.push_back(t.type + "/" + t.unit);
  return names;
}

TEST_F(PyroscopeUploaderTest, AllocationTypesGoAsAMemoryUploadWithTheirConfig) {
  auto receiver = HttpReceiver::StartTcp();
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  PyroscopeUploader uploader(Server((*receiver)->url()), Fast(),
                             absl::Milliseconds(10), /*alloc_period=*/524288);
  auto profile = std::make_shared<ExportedProfile>();
  profile->pprof = testing::MakeTestPprof(kStart, kEnd, /*with_heap=*/true);
  profile->start = kStart;
  profile->end = kEnd;
  ASSERT_FALSE(profile->pprof.empty());
  ASSERT_TRUE(uploader.Consume(profile).ok());
  ASSERT_TRUE(uploader.Flush(Later(absl::Seconds(30))).ok());
  const std::vector<ReceivedRequest> requests = (*receiver)->requests();
  ASSERT_THAT(requests, SizeIs(2));
  absl::StatusOr<DecodedProfile> window = DecodePprof(profile->pprof);
  ASSERT_TRUE(window.ok()) << window.status();
  ASSERT_THAT(window->samples, SizeIs(1));

  // The CPU types: a bare pprof body, as before, under process_cpu.
  const ReceivedRequest& cpu_request = requests[0];
  EXPECT_EQ(cpu_request.query.at("format"), "pprof");
  EXPECT_EQ(cpu_request.headers.at("content-type"), "application/octet-stream");
  absl::StatusOr<DecodedProfile> cpu = DecodePprof(cpu_request.body);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_THAT(TypeNames(*cpu), ::testing::ElementsAre("cpu-samples/count",
                                                      "cpu-time/nanoseconds"));
  EXPECT_EQ(PyroscopeMetricName(*cpu), "process_cpu");
  ASSERT_THAT(cpu->samples, SizeIs(1));
  EXPECT_EQ(cpu->samples[0].values, (std::vector<int64_t>{3, 30'000'000}));
  EXPECT_EQ(cpu->samples[0].stack, window->samples[0].stack);
  EXPECT_EQ(cpu->period_type.type, "cpu-time");
  EXPECT_EQ(cpu->period, 10'000'000);

  // The allocation types: a form (which Pyroscope reads only without
  // format=pprof) with the profile and the types' configuration.
  const ReceivedRequest& mem_request = requests[1];
  EXPECT_EQ(mem_request.path, "/ingest");
  EXPECT_FALSE(mem_request.query.contains("format"));
  EXPECT_EQ(mem_request.query.at("name"), "checkout{region=eu,pod=a-1}");
  EXPECT_EQ(mem_request.query.at("from"), "1700000000");
  EXPECT_EQ(mem_request.query.at("until"), "1700000011");
  auto parts = testing::ParseMultipart(mem_request.headers.at("content-type"),
                                       mem_request.body);
  ASSERT_TRUE(parts.ok()) << parts.status();
  std::map<std::string, std::string> bodies;
  for (const testing::FormPart& part : *parts) bodies[part.name] = part.body;
  ASSERT_TRUE(bodies.contains("profile"));
  ASSERT_TRUE(bodies.contains("sample_type_config"));
  absl::StatusOr<DecodedProfile> mem = DecodePprof(bodies["profile"]);
  ASSERT_TRUE(mem.ok()) << mem.status();
  EXPECT_THAT(TypeNames(*mem),
              ::testing::ElementsAre("alloc_objects/count", "alloc_space/bytes",
                                     "inuse_objects/count", "inuse_space/bytes"));
  EXPECT_EQ(PyroscopeMetricName(*mem), "memory");
  ASSERT_THAT(mem->samples, SizeIs(1));
  EXPECT_EQ(mem->samples[0].values, (std::vector<int64_t>{5, 5'000, 2, 2'000}));
  EXPECT_EQ(mem->samples[0].stack, window->samples[0].stack);
  EXPECT_EQ(mem->period_type, (ValueType{"space", "bytes"}));  // Go's heap profile's
  EXPECT_EQ(mem->period, 524288);
  EXPECT_EQ(mem->time_nanos, window->time_nanos);
  EXPECT_EQ(mem->duration_nanos, window->duration_nanos);

  // The configuration as Pyroscope decodes it (map of SampleTypeConfig):
  // alloc_* are what the window allocated, not running totals.
  google::protobuf::Struct config;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(bodies["sample_type_config"],
                                                          &config)
                  .ok())
      << bodies["sample_type_config"];
  for (const char* type : {"alloc_objects", "alloc_space", "inuse_objects", "inuse_space"}) {
    SCOPED_TRACE(type);
    ASSERT_TRUE(config.fields().contains(type));
    const auto& fields = config.fields().at(type).struct_value().fields();
    const bool cumulative =
        fields.contains("cumulative") && fields.at("cumulative").bool_value();
    EXPECT_FALSE(cumulative);
    EXPECT_EQ(fields.at("units").string_value(),
              absl::StrContains(type, "space") ? "bytes" : "objects");
    if (absl::StartsWith(type, "inuse_")) {
      EXPECT_EQ(fields.at("aggregation").string_value(), "average");
    }
  }
  EXPECT_EQ(uploader.stats().uploaded, 2u);
  INPROF_REQUIRE_TOOL("go");
  {
    const std::string path = testing::FreshTestDir("pyroscope-memory") + "/memory.pb.gz";
    std::ofstream(path, std::ios::binary) << bodies["profile"];
    auto top = testing::GoPprof("-sample_index=inuse_space -top " + path);
    ASSERT_TRUE(top.ok()) << top.status();
    EXPECT_THAT(*top, HasSubstr("TestProfileLeaf"));
  }
}

// Lock waits go as a third upload, a form with their configuration: Go's
// mutex names and units, not cumulative (a window holds its own waits).
TEST_F(PyroscopeUploaderTest, LockTypesGoAsAMutexUploadWithTheirConfig) {
  auto receiver = HttpReceiver::StartTcp();
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  PyroscopeUploader uploader(Server((*receiver)->url()), Fast(),
                             absl::Milliseconds(10), /*alloc_period=*/524288);
  auto profile = std::make_shared<ExportedProfile>();
  profile->pprof = testing::MakeTestPprof(kStart, kEnd, /*with_heap=*/true,
                                          /*with_locks=*/true);
  profile->start = kStart;
  profile->end = kEnd;
  ASSERT_TRUE(uploader.Consume(profile).ok());
  ASSERT_TRUE(uploader.Flush(Later(absl::Seconds(30))).ok());
  const std::vector<ReceivedRequest> requests = (*receiver)->requests();
  ASSERT_THAT(requests, SizeIs(3));
  std::vector<std::string> metrics;
  for (const ReceivedRequest& r : requests) {
    std::string body = r.body;
    std::string config;
    if (!r.query.contains("format")) {
      auto parts = testing::ParseMultipart(r.headers.at("content-type"), r.body);
      ASSERT_TRUE(parts.ok()) << parts.status();
      for (const testing::FormPart& part : *parts) {
        if (part.name == "profile") body = part.body;
        if (part.name == "sample_type_config") config = part.body;
      }
    }
    absl::StatusOr<DecodedProfile> p = DecodePprof(body);
    ASSERT_TRUE(p.ok()) << p.status();
    metrics.push_back(PyroscopeMetricName(*p));
    if (metrics.back() != "mutex") continue;
    EXPECT_THAT(TypeNames(*p), ::testing::ElementsAre("contentions/count", "delay/nanoseconds"));
    ASSERT_THAT(p->samples, SizeIs(1));
    EXPECT_EQ(p->samples[0].values, (std::vector<int64_t>{4, 8'000'000}));
    EXPECT_EQ(p->period_type, (ValueType{"contentions", "count"}));
    google::protobuf::Struct parsed;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(config, &parsed).ok()) << config;
    ASSERT_TRUE(parsed.fields().contains("delay"));
    const auto& delay = parsed.fields().at("delay").struct_value().fields();
    EXPECT_EQ(delay.at("units").string_value(), "lock_nanoseconds");
    EXPECT_FALSE(delay.contains("cumulative") && delay.at("cumulative").bool_value());
  }
  EXPECT_THAT(metrics, ::testing::ElementsAre("process_cpu", "memory", "mutex"));
}

TEST_F(PyroscopeUploaderTest, AWindowOfAllocationsAloneIsOneMemoryUpload) {
  auto receiver = HttpReceiver::StartTcp();
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  PyroscopeUploader uploader(Server((*receiver)->url()), Fast(),
                             absl::Milliseconds(10), /*alloc_period=*/4096);
  auto profile = std::make_shared<ExportedProfile>();
  // The with_heap window cut to its allocation types.
  absl::StatusOr<std::string> alloc_only = SelectPprofSampleTypes(
      testing::MakeTestPprof(kStart, kEnd, /*with_heap=*/true),
      [](std::string_view type) { return !type.starts_with("cpu-"); });
  ASSERT_TRUE(alloc_only.ok()) << alloc_only.status();
  profile->pprof = *alloc_only;
  profile->start = kStart;
  profile->end = kEnd;
  ASSERT_TRUE(uploader.Consume(profile).ok());
  ASSERT_TRUE(uploader.Flush(Later(absl::Seconds(30))).ok());
  const std::vector<ReceivedRequest> requests = (*receiver)->requests();
  ASSERT_THAT(requests, SizeIs(1));
  EXPECT_FALSE(requests[0].query.contains("format"));
  EXPECT_TRUE(absl::StartsWith(requests[0].headers.at("content-type"),
                               "multipart/form-data"));
}

TEST_F(PyroscopeUploaderTest, UrlPrefixAndDefaultName) {
  auto receiver = HttpReceiver::StartTcp();
  ASSERT_TRUE(receiver.ok());
  PyroscopeOptions p;
  p.url = (*receiver)->url() + "/pyroscope/";
  PyroscopeUploader uploader(p, Fast(), absl::Milliseconds(4));
  EXPECT_EQ(uploader.application_name(), program_invocation_short_name);
  ASSERT_TRUE(uploader.Consume(Profile()).ok());
  ASSERT_TRUE(uploader.Flush(Later(absl::Seconds(30))).ok());
  const auto requests = (*receiver)->requests();
  ASSERT_THAT(requests, SizeIs(1));
  EXPECT_EQ(requests[0].path, "/pyroscope/ingest");
  EXPECT_EQ(requests[0].query.at("name"), program_invocation_short_name);
  EXPECT_EQ(requests[0].query.at("sampleRate"), "250");
}

TEST_F(PyroscopeUploaderTest, SendsBasicAuthentication) {
  auto receiver = HttpReceiver::StartTcp();
  ASSERT_TRUE(receiver.ok());
  PyroscopeOptions p = Server((*receiver)->url());
  p.basic_auth_user = "123456";
  p.basic_auth_password = "glc_secret:x";
  PyroscopeUploader uploader(p, Fast(), absl::Milliseconds(10));
  ASSERT_TRUE(uploader.Consume(Profile()).ok());
  ASSERT_TRUE(uploader.Flush(Later(absl::Seconds(30))).ok());
  const auto requests = (*receiver)->requests();
  ASSERT_THAT(requests, SizeIs(1));
  std::string decoded;
  const std::string& auth = requests[0].headers.at("authorization");
  ASSERT_TRUE(absl::StartsWith(auth, "Basic ")) << auth;
  ASSERT_TRUE(absl::Base64Unescape(auth.substr(6), &decoded));
  EXPECT_EQ(decoded, "123456:glc_secret:x");
}

TEST_F(PyroscopeUploaderTest, SendsBearerTokenAndTenant) {
  auto receiver = HttpReceiver::StartTcp();
  ASSERT_TRUE(receiver.ok());
  PyroscopeOptions p = Server((*receiver)->url());
  p.auth_token = "tok-123";
  p.tenant_id = "team-a";
  PyroscopeUploader uploader(p, Fast(), absl::Milliseconds(10));
  ASSERT_TRUE(uploader.Consume(Profile()).ok());
  ASSERT_TRUE(uploader.Flush(Later(absl::Seconds(30))).ok());
  const auto requests = (*receiver)->requests();
  ASSERT_THAT(requests, SizeIs(1));
  EXPECT_EQ(requests[0].headers.at("authorization"), "Bearer tok-123");
  EXPECT_EQ(requests[0].headers.at("x-scope-orgid"), "team-a");
}

TEST_F(PyroscopeUploaderTest, RetriesAfter500ThenSucceeds) {
  auto receiver = HttpReceiver::StartTcp();
  ASSERT_TRUE(receiver.ok());
  (*receiver)->SetStatuses({500, 200});
  LogCapture logs;
  PyroscopeUploader uploader(Server((*receiver)->url()), Fast(),
                             absl::Milliseconds(10));
  ASSERT_TRUE(uploader.Consume(Profile()).ok());
  ASSERT_TRUE(uploader.Flush(Later(absl::Seconds(30))).ok());
  const auto requests = (*receiver)->requests();
  ASSERT_THAT(requests, SizeIs(2));
  EXPECT_EQ(requests[0].body, requests[1].body);
  EXPECT_EQ(requests[0].query, requests[1].query);
  EXPECT_EQ(uploader.stats().uploaded, 1u);
  EXPECT_EQ(logs.Count("pyroscope upload to"), 2u);  // failure, recovery
  EXPECT_EQ(logs.Count("HTTP 500"), 1u);
}

TEST_F(PyroscopeUploaderTest, BadRequestIsNotRetried) {
  for (int status : {400, 413}) {
    SCOPED_TRACE(status);
    auto receiver = HttpReceiver::StartTcp();
    ASSERT_TRUE(receiver.ok());
    (*receiver)->SetStatuses({status});
    LogCapture logs;
    PyroscopeUploader uploader(Server((*receiver)->url()), Fast(),
                               absl::Milliseconds(10));
    ASSERT_TRUE(uploader.Consume(Profile()).ok());
    ASSERT_TRUE(uploader.Flush(Later(absl::Seconds(30))).ok());
    EXPECT_EQ((*receiver)->request_count(), 1u);
    EXPECT_EQ(uploader.stats().dropped_failed, 1u);
    ASSERT_THAT(logs.lines(), SizeIs(1));
    EXPECT_THAT(logs.lines()[0], AllOf(HasSubstr(absl::StrCat("HTTP ", status)),
                                       HasSubstr("not retried")));
  }
}

TEST_F(PyroscopeUploaderTest, TooManyRequestsIsRetried) {
  auto receiver = HttpReceiver::StartTcp();
  ASSERT_TRUE(receiver.ok());
  (*receiver)->SetStatuses({429, 429, 200});
  PyroscopeUploader uploader(Server((*receiver)->url()), Fast(),
                             absl::Milliseconds(10));
  ASSERT_TRUE(uploader.Consume(Profile()).ok());
  ASSERT_TRUE(uploader.Flush(Later(absl::Seconds(30))).ok());
  EXPECT_EQ((*receiver)->request_count(), 3u);
  EXPECT_EQ(uploader.stats().uploaded, 1u);
}

TEST_F(PyroscopeUploaderTest, ReceiverThatNeverAnswersTimesOut) {
  auto receiver = HttpReceiver::StartTcp();
  ASSERT_TRUE(receiver.ok());
  (*receiver)->SetNeverAnswer(true);
  LogCapture logs;
  UploadOptions upload = Fast();
  upload.timeout = absl::Milliseconds(250);
  upload.max_retries = 0;
  PyroscopeUploader uploader(Server((*receiver)->url()), upload,
                             absl::Milliseconds(10));
  ASSERT_TRUE(uploader.Consume(Profile()).ok());
  ASSERT_TRUE(uploader.Flush(Later(absl::Seconds(60))).ok());
  EXPECT_EQ((*receiver)->request_count(), 1u);
  EXPECT_EQ(uploader.stats().dropped_failed, 1u);
  ASSERT_THAT(logs.lines(), SizeIs(1));
  EXPECT_THAT(logs.lines()[0], HasSubstr("timed out"));
}

TEST_F(PyroscopeUploaderTest, ReceiverDownNeverBlocksTheCaller) {
  ClosedPort closed;
  LogCapture logs;
  UploadOptions upload = Fast();
  upload.max_retries = 1;
  upload.max_queued = 2;
  PyroscopeUploader uploader(Server(closed.url()), upload,
                             absl::Milliseconds(10));
  // Handed over back to back, as fast as an exporter could.
  const auto profile = Profile();
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(uploader.Consume(profile).ok());
  ASSERT_TRUE(uploader.Flush(Later(absl::Seconds(60))).ok());
  const UploadStats stats = uploader.stats();
  // Every profile is accounted for: delivered, dropped for space, or given
  // up on; none is kept past the queue's bound. (How many were dropped for
  // space depends on how fast refused connections fail against how fast
  // this thread runs: AStalledReceiverDropsWhatTheQueueCannotHold.)
  EXPECT_EQ(stats.uploaded, 0u);
  EXPECT_EQ(stats.dropped_queue_full + stats.dropped_failed, 20u);
  EXPECT_EQ(logs.Count("failed:"), 1u) << absl::StrJoin(logs.lines(), "");
  EXPECT_LE(logs.Count("not keeping up"), 1u);
}

// A receiver that takes a request and does not answer (then answers 503,
// down): the caller is never blocked, the queue keeps its bound, and the
// rest is dropped and counted. Deterministic: the uploader is held in its
// first request while the other 19 are handed over.
TEST_F(PyroscopeUploaderTest, AStalledReceiverDropsWhatTheQueueCannotHold) {
  auto receiver = HttpReceiver::StartTcp();
  ASSERT_TRUE(receiver.ok());
  (*receiver)->SetStatuses({503});
  (*receiver)->SetNeverAnswer(true);
  LogCapture logs;
  UploadOptions upload = Fast();
  upload.max_retries = 1;
  upload.max_queued = 2;
  PyroscopeUploader uploader(Server((*receiver)->url()), upload,
                             absl::Milliseconds(10));
  const auto profile = Profile();
  ASSERT_TRUE(uploader.Consume(profile).ok());
  ASSERT_TRUE((*receiver)->WaitForRequests(1, absl::Seconds(30)));
  for (int i = 1; i < 20; ++i) ASSERT_TRUE(uploader.Consume(profile).ok());
  // One in flight, two queued, 17 dropped for space; each Consume returned
  // at once.
  EXPECT_EQ(uploader.stats().dropped_queue_full, 17u);
  (*receiver)->SetNeverAnswer(false);
  ASSERT_TRUE(uploader.Flush(Later(absl::Seconds(60))).ok());
  const UploadStats stats = uploader.stats();
  EXPECT_EQ(stats.uploaded, 0u);
  EXPECT_EQ(stats.dropped_queue_full, 17u);
  EXPECT_EQ(stats.dropped_failed, 3u);
  EXPECT_EQ(logs.Count("failed:"), 1u) << absl::StrJoin(logs.lines(), "");
  EXPECT_EQ(logs.Count("not keeping up"), 1u);
}

}  // namespace
}  // namespace inprof

namespace inprof {
namespace {

// Lines the child's log sink saw mentioning libcurl.
int g_libcurl_lines = 0;
void CountLibcurlLines(absl::string_view line) {
  if (absl::StrContains(line, "libcurl")) ++g_libcurl_lines;
  internal::WriteLineToStderr(line);
}

// Without libcurl no upload can succeed: said once, naming both uploads,
// and nothing is retried (each uploader retried every window with backoff,
// holding Stop() up to INPROF_STOP_TIMEOUT with the default 1 s backoff,
// and said the failure again: three lines, the first naming Datadog only).
TEST(UploadWithoutLibcurlDeathTest, IsSaidOnceAndNeverHoldsStop) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("INPROF_LIBCURL", "/nonexistent/libcurl.so.4", 1);
        internal::SetLogSinkForTesting(&CountLibcurlLines);
        Options options;
        options.write_output = false;
        options.pyroscope.url = "http://127.0.0.1:9";
        options.datadog.enabled = true;
        options.stop_timeout = absl::Seconds(2);
        options.upload.backoff = absl::Milliseconds(100);
        DefaultProfiler profiler(options);
        if (!profiler.Start().ok()) _exit(3);
        const absl::Status stopped = profiler.Stop();
        if (!stopped.ok()) {
          fprintf(stderr, "Stop: %s\n", std::string(stopped.message()).c_str());
          _exit(1);
        }
        _exit(g_libcurl_lines == 1 ? 0 : 2);
      },
      ::testing::ExitedWithCode(0),
      "Datadog and Pyroscope \\(http://127.0.0.1:9\\) upload configured, but "
      "uploads need libcurl \\('/nonexistent/libcurl.so.4'");
}

}  // namespace
}  // namespace inprof
