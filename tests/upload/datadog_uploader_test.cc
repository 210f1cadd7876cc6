#include "inprof/datadog_uploader.h"

#include <stdlib.h>
#include <time.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "upload/http_receiver.h"
#include "inprof/inprof.h"
#include "inprof/pprof_reader.h"
#include "util/test_util.h"

namespace inprof {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::SizeIs;
using testing::ClosedPort;
using testing::FormPart;
using testing::HttpReceiver;
using testing::LogCapture;
using testing::ReceivedRequest;

// A window with nanoseconds that RFC 3339 must keep.
const absl::Time kStart = absl::FromUnixNanos(1'700'000'000'123'456'789);
const absl::Time kEnd = absl::FromUnixNanos(1'700'000'060'987'654'321);

std::shared_ptr<ExportedProfile> Profile(absl::Time start = kStart,
                                         absl::Time end = kEnd,
                                         uint64_t sequence = 0) {
  auto p = std::make_shared<ExportedProfile>();
  p->pprof = testing::MakeTestPprof(start, end);
  p->start = start;
  p->end = end;
  p->sequence = sequence;
  return p;
}

UploadOptions Fast() {
  UploadOptions u;
  u.timeout = absl::Seconds(20);
  u.backoff = absl::Milliseconds(10);
  u.max_retries = 3;
  return u;
}

DatadogOptions Agent(const std::string& url) {
  DatadogOptions dd;
  dd.enabled = true;
  dd.agent_url = url;
  dd.service = "checkout";
  dd.env = "prod";
  dd.version = "1.2.3";
  dd.tags = {"team:perf", "region:eu"};
  dd.hostname = "test-host";
  return dd;
}

absl::Time Later(absl::Duration d) { return absl::Now() + d; }

// What the agent's intake does with the body: the two parts, the event
// parsed as JSON.
struct ParsedIntake {
  FormPart event;
  FormPart profile;
  google::protobuf::Struct json;
};

ParsedIntake ParseIntake(const ReceivedRequest& req) {
  ParsedIntake out;
  absl::StatusOr<std::vector<FormPart>> parts =
      testing::ParseMultipart(req.headers.at("content-type"), req.body);
  EXPECT_TRUE(parts.ok()) << parts.status();
  if (!parts.ok()) return out;
  for (const FormPart& p : *parts) {
    if (p.name == "event") out.event = p;
    if (p.name == "profile.pprof") out.profile = p;
  }
  EXPECT_THAT(*parts, SizeIs(2));
  auto status =
      google::protobuf::util::JsonStringToMessage(out.event.body, &out.json);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << out.event.body;
  return out;
}

std::string Field(const google::protobuf::Struct& json, const std::string& key) {
  auto it = json.fields().find(key);
  return it == json.fields().end() ? "<missing>" : it->second.string_value();
}

class DatadogUploaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A proxy from the environment would take our 127.0.0.1 requests.
    for (const char* v : {"http_proxy", "HTTP_PROXY", "https_proxy",
                          "HTTPS_PROXY", "all_proxy", "ALL_PROXY"}) {
      unsetenv(v);
    }
  }
};

TEST_F(DatadogUploaderTest, PostsEventAndProfileAsTheAgentExpects) {
  auto receiver = HttpReceiver::StartTcp();
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  DatadogUploader uploader(Agent((*receiver)->url()), Fast());
  auto profile = Profile();
  ASSERT_FALSE(profile->pprof.empty());
  ASSERT_TRUE(uploader.Consume(profile).ok());
  ASSERT_TRUE(uploader.Flush(Later(absl::Seconds(30))).ok());

  const std::vector<ReceivedRequest> requests = (*receiver)->requests();
  ASSERT_THAT(requests, SizeIs(1));
  const ReceivedRequest& req = requests[0];
  EXPECT_EQ(req.method, "POST");
  EXPECT_EQ(req.path, "/profiling/v1/input");
  EXPECT_EQ(req.headers.at("dd-evp-origin"), "inprof");
  EXPECT_EQ(req.headers.at("dd-evp-origin-version"), "0.1.0");
  EXPECT_THAT(req.headers.at("content-type"),
              HasSubstr("multipart/form-data; boundary="));

  const ParsedIntake intake = ParseIntake(req);
  EXPECT_EQ(intake.event.filename, "event.json");
  EXPECT_EQ(intake.event.content_type, "application/json");
  EXPECT_EQ(intake.profile.filename, "profile.pprof");
  EXPECT_EQ(intake.profile.body, profile->pprof);

  const auto& fields = intake.json.fields();
  ASSERT_TRUE(fields.contains("attachments"));
  const auto& attachments = fields.at("attachments").list_value().values();
  ASSERT_EQ(attachments.size(), 1);
  EXPECT_EQ(attachments[0].string_value(), "profile.pprof");
  EXPECT_EQ(Field(intake.json, "start"), "2023-11-14T22:13:20.123456789Z");
  EXPECT_EQ(Field(intake.json, "end"), "2023-11-14T22:14:20.987654321Z");
  EXPECT_EQ(Field(intake.json, "family"), "native");
  EXPECT_EQ(Field(intake.json, "version"), "4");
  const std::vector<std::string> tags =
      absl::StrSplit(Field(intake.json, "tags_profiler"), ',');
  for (const char* tag : {"service:checkout", "env:prod", "version:1.2.3",
                          "team:perf", "region:eu", "language:native",
                          "profiler_version:0.1.0", "host:test-host"}) {
    EXPECT_THAT(tags, Contains(tag));
  }
  EXPECT_THAT(tags, Contains(MatchesRegex(
                        "runtime-id:[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-"
                        "[89ab][0-9a-f]{3}-[0-9a-f]{12}")));

  // The profile part is the pprof, as pprof tools read it.
  absl::StatusOr<DecodedProfile> decoded = DecodePprof(intake.profile.body);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->Total(decoded->ValueIndex("cpu-time")), 30'000'000);
  INPROF_REQUIRE_TOOL("go");
  {
    const std::string path = testing::TestTmpDir() + "/datadog-intake.pb.gz";
    std::ofstream(path, std::ios::binary) << intake.profile.body;
    auto raw = testing::ReadWithGoPprofRaw(path);
    ASSERT_TRUE(raw.ok()) << raw.status();
    ASSERT_THAT(*raw, SizeIs(1));
    EXPECT_THAT((*raw)[0].stack, Contains(HasSubstr("TestProfileLeaf")));
    EXPECT_EQ((*raw)[0].labels["thread name"], "worker");
  }
  const UploadStats stats = uploader.stats();
  EXPECT_EQ(stats.attempts, 1u);
  EXPECT_EQ(stats.uploaded, 1u);
}

// Allocation profiles go under the names Datadog's intake gives native
// allocation and live-heap types (ddprof's): alloc-samples, alloc-space,
// inuse-objects, inuse-space; the values, stacks and everything else are
// those of the window. A profile without them goes byte for byte.
TEST_F(DatadogUploaderTest, AllocationTypesGoUnderDatadogsNames) {
  auto receiver = HttpReceiver::StartTcp();
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  DatadogUploader uploader(Agent((*receiver)->url()), Fast());
  auto profile = std::make_shared<ExportedProfile>();
  profile->pprof = testing::MakeTestPprof(kStart, kEnd, /*with_heap=*/true);
  profile->start = kStart;
  profile->end = kEnd;
  ASSERT_FALSE(profile->pprof.empty());
  ASSERT_TRUE(uploader.Consume(profile).ok());
  ASSERT_TRUE(uploader.Flush(Later(absl::Seconds(30))).ok());
  const std::vector<ReceivedRequest> requests = (*receiver)->requests();
  ASSERT_THAT(requests, SizeIs(1));
  const ParsedIntake intake = ParseIntake(requests[0]);
  absl::StatusOr<DecodedProfile> sent = DecodePprof(intake.profile.body);
  ASSERT_TRUE(sent.ok()) << sent.status();
  absl::StatusOr<DecodedProfile> window = DecodePprof(profile->pprof);
  ASSERT_TRUE(window.ok()) << window.status();
  std::vector<std::string> types;
  for (const ValueType& t : sent->sample_types) types.push_back(t.type + "/" + t.unit);
  EXPECT_THAT(types, ::testing::ElementsAre("cpu-samples/count", "cpu-time/nanoseconds",
                                            "alloc-samples/count", "alloc-space/bytes",
                                            "inuse-objects/count", "inuse-space/bytes"));
  ASSERT_THAT(sent->samples, SizeIs(1));
  EXPECT_EQ(sent->samples[0].values, window->samples[0].values);
  EXPECT_EQ(sent->samples[0].stack, window->samples[0].stack);
  EXPECT_EQ(sent->period_type.type, "cpu-time");
  EXPECT_EQ(sent->time_nanos, window->time_nanos);
  INPROF_REQUIRE_TOOL("go");
  {
    const std::string path = testing::FreshTestDir("datadog-heap") + "/intake.pb.gz";
    std::ofstream(path, std::ios::binary) << intake.profile.body;
    auto top = testing::GoPprof("-sample_index=inuse-space -top " + path);
    ASSERT_TRUE(top.ok()) << top.status();
    EXPECT_THAT(*top, HasSubstr("TestProfileLeaf"));
  }
}

// Lock waits go under the names Datadog's profilers give them
// (lock-acquire, lock-acquire-wait); a label that shares the string "delay"
// (the thread's name here) keeps it.
TEST_F(DatadogUploaderTest, LockTypesGoUnderDatadogsNamesAndSharedStringsStay) {
  auto receiver = HttpReceiver::StartTcp();
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  DatadogUploader uploader(Agent((*receiver)->url()), Fast());
  auto profile = std::make_shared<ExportedProfile>();
  profile->pprof = testing::MakeTestPprof(kStart, kEnd, /*with_heap=*/false,
                                          /*with_locks=*/true);
  profile->start = kStart;
  profile->end = kEnd;
  ASSERT_FALSE(profile->pprof.empty());
  ASSERT_TRUE(uploader.Consume(profile).ok());
  ASSERT_TRUE(uploader.Flush(Later(absl::Seconds(30))).ok());
  const std::vector<ReceivedRequest> requests = (*receiver)->requests();
  ASSERT_THAT(requests, SizeIs(1));
  absl::StatusOr<DecodedProfile> sent = DecodePprof(ParseIntake(requests[0]).profile.body);
  ASSERT_TRUE(sent.ok()) << sent.status();
  std::vector<std::string> types;
  for (const ValueType& t : sent->sample_types) types.push_back(t.type + "/" + t.unit);
  EXPECT_THAT(types, ::testing::ElementsAre("cpu-samples/count", "cpu-time/nanoseconds",
                                            "lock-acquire/count",
                                            "lock-acquire-wait/nanoseconds"));
  ASSERT_THAT(sent->samples, SizeIs(1));
  EXPECT_EQ(sent->samples[0].values,
            (std::vector<int64_t>{3, 30'000'000, 4, 8'000'000}));
  EXPECT_EQ(sent->samples[0].str_labels.at("thread name"), "delay");
}

TEST_F(DatadogUploaderTest, ServiceDefaultsToProgramNameAndTagsAreOrdered) {
  DatadogOptions dd;
  dd.enabled = true;
  dd.hostname = "h";
  DatadogUploader uploader(dd, Fast());
  EXPECT_EQ(uploader.intake_url(), "http://localhost:8126/profiling/v1/input");
  ASSERT_THAT(uploader.tags(), SizeIs(5));
  EXPECT_EQ(uploader.tags()[0],
            absl::StrCat("service:", program_invocation_short_name));
  EXPECT_EQ(uploader.tags()[1], "language:native");
  EXPECT_EQ(uploader.tags()[4], "host:h");
  // Two uploaders (two processes' worth) never share a runtime-id.
  DatadogUploader other(dd, Fast());
  EXPECT_NE(uploader.tags()[3], other.tags()[3]);
}

TEST_F(DatadogUploaderTest, EventJsonEscapesTags) {
  const std::string json = DatadogUploader::EventJson(
      {"service:a\"b", "k:\\v"}, absl::UnixEpoch(), absl::UnixEpoch());
  google::protobuf::Struct parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &parsed).ok())
      << json;
  EXPECT_EQ(Field(parsed, "tags_profiler"), "service:a\"b,k:\\v");
  EXPECT_EQ(Field(parsed, "start"), "1970-01-01T00:00:00.000000000Z");
}

TEST_F(DatadogUploaderTest, UnixSocketAgent) {
  const std::string path = testing::TestTmpDir() + "/dd-agent.sock";
  auto receiver = HttpReceiver::StartUnix(path);
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  DatadogUploader uploader(Agent("unix://" + path), Fast());
  EXPECT_EQ(uploader.unix_socket(), path);
  ASSERT_TRUE(uploader.Consume(Profile()).ok());
  ASSERT_TRUE(uploader.Flush(Later(absl::Seconds(30))).ok());
  const auto requests = (*receiver)->requests();
  ASSERT_THAT(requests, SizeIs(1));
  EXPECT_EQ(requests[0].path, "/profiling/v1/input");
  const ParsedIntake intake = ParseIntake(requests[0]);
  EXPECT_EQ(Field(intake.json, "family"), "native");
}

TEST_F(DatadogUploaderTest, RetriesAfter500ThenSucceedsLoggingOneLine) {
  auto receiver = HttpReceiver::StartTcp();
  ASSERT_TRUE(receiver.ok());
  (*receiver)->SetStatuses({500, 200});
  LogCapture logs;
  DatadogUploader uploader(Agent((*receiver)->url()), Fast());
  ASSERT_TRUE(uploader.Consume(Profile()).ok());
  ASSERT_TRUE(uploader.Flush(Later(absl::Seconds(30))).ok());
  const auto requests = (*receiver)->requests();
  ASSERT_THAT(requests, SizeIs(2));
  EXPECT_EQ(ParseIntake(requests[0]).profile.body,
            ParseIntake(requests[1]).profile.body);
  const UploadStats stats = uploader.stats();
  EXPECT_EQ(stats.attempts, 2u);
  EXPECT_EQ(stats.failed_attempts, 1u);
  EXPECT_EQ(stats.uploaded, 1u);
  EXPECT_EQ(logs.Count("HTTP 500"), 1u) << absl::StrJoin(logs.lines(), "");
  EXPECT_EQ(logs.Count("receiver says 500"), 1u);
  EXPECT_EQ(logs.Count("works again"), 1u);
  EXPECT_THAT(logs.lines(), SizeIs(2));
}

TEST_F(DatadogUploaderTest, RejectedProfileIsNotRetried) {
  for (int status : {413, 400}) {
    SCOPED_TRACE(status);
    auto receiver = HttpReceiver::StartTcp();
    ASSERT_TRUE(receiver.ok());
    (*receiver)->SetStatuses({status});
    LogCapture logs;
    DatadogUploader uploader(Agent((*receiver)->url()), Fast());
    ASSERT_TRUE(uploader.Consume(Profile()).ok());
    ASSERT_TRUE(uploader.Flush(Later(absl::Seconds(30))).ok());
    EXPECT_EQ((*receiver)->request_count(), 1u);
    const UploadStats stats = uploader.stats();
    EXPECT_EQ(stats.attempts, 1u);
    EXPECT_EQ(stats.dropped_failed, 1u);
    EXPECT_EQ(stats.uploaded, 0u);
    ASSERT_THAT(logs.lines(), SizeIs(1));
    EXPECT_THAT(logs.lines()[0],
                AllOf(HasSubstr(absl::StrCat("HTTP ", status)),
                      HasSubstr("not retried"), HasSubstr("/profiling/v1/input")));
  }
}

TEST_F(DatadogUploaderTest, ReceiverThatNeverAnswersTimesOut) {
  auto receiver = HttpReceiver::StartTcp();
  ASSERT_TRUE(receiver.ok());
  (*receiver)->SetNeverAnswer(true);
  LogCapture logs;
  UploadOptions upload = Fast();
  upload.timeout = absl::Milliseconds(300);
  upload.max_retries = 1;
  DatadogUploader uploader(Agent((*receiver)->url()), upload);
  ASSERT_TRUE(uploader.Consume(Profile()).ok());
  // The flush deadline is far: the timeouts, not the deadline, end it.
  ASSERT_TRUE(uploader.Flush(Later(absl::Seconds(60))).ok());
  EXPECT_EQ((*receiver)->request_count(), 2u);
  const UploadStats stats = uploader.stats();
  EXPECT_EQ(stats.attempts, 2u);
  EXPECT_EQ(stats.failed_attempts, 2u);
  EXPECT_EQ(stats.dropped_failed, 1u);
  EXPECT_EQ(stats.dropped_at_stop, 0u);
  ASSERT_THAT(logs.lines(), SizeIs(1));
  EXPECT_THAT(logs.lines()[0], AllOf(HasSubstr("timed out"),
                                     HasSubstr("INPROF_UPLOAD_TIMEOUT=300ms")));
}

TEST_F(DatadogUploaderTest, ReceiverDownLogsOneLinePerFailureStreak) {
  ClosedPort closed;
  LogCapture logs;
  UploadOptions upload = Fast();
  upload.max_retries = 2;
  DatadogUploader uploader(Agent(closed.url()), upload);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(uploader.Consume(Profile(kStart, kEnd, i)).ok());
  }
  ASSERT_TRUE(uploader.Flush(Later(absl::Seconds(60))).ok());
  const UploadStats stats = uploader.stats();
  EXPECT_EQ(stats.attempts, 9u);
  EXPECT_EQ(stats.failed_attempts, 9u);
  EXPECT_EQ(stats.dropped_failed, 3u);
  ASSERT_THAT(logs.lines(), SizeIs(1));
  EXPECT_THAT(logs.lines()[0],
              AllOf(HasSubstr("datadog upload to " + closed.url()),
                    HasSubstr("onnect"), HasSubstr("not logged until")));
}

TEST_F(DatadogUploaderTest, FailureStreakLoggedOnceAndAgainAfterRecovery) {
  auto receiver = HttpReceiver::StartTcp();
  ASSERT_TRUE(receiver.ok());
  (*receiver)->SetStatuses({500, 503, 500, 200, 500, 200});
  LogCapture logs;
  UploadOptions upload = Fast();
  upload.max_retries = 0;
  DatadogUploader uploader(Agent((*receiver)->url()), upload);
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(uploader.Consume(Profile(kStart, kEnd, i)).ok());
    // One at a time, so that the queue never overflows.
    ASSERT_TRUE((*receiver)->WaitForRequests(i + 1, absl::Seconds(30)));
  }
  ASSERT_TRUE(uploader.Flush(Later(absl::Seconds(30))).ok());
  EXPECT_EQ(uploader.stats().uploaded, 2u);
  EXPECT_EQ(uploader.stats().dropped_failed, 4u);
  const std::vector<std::string> lines = logs.lines();
  ASSERT_THAT(lines, SizeIs(4)) << absl::StrJoin(lines, "");
  EXPECT_THAT(lines[0], HasSubstr("HTTP 500"));
  EXPECT_THAT(lines[1], HasSubstr("works again after 3 failed attempt(s)"));
  EXPECT_THAT(lines[2], HasSubstr("HTTP 500"));
  EXPECT_THAT(lines[3], HasSubstr("works again after 1 failed attempt(s)"));
}

TEST_F(DatadogUploaderTest, FlushGivesUpAtDeadlineAndSaysSo) {
  auto receiver = HttpReceiver::StartTcp();
  ASSERT_TRUE(receiver.ok());
  (*receiver)->SetNeverAnswer(true);
  UploadOptions upload = Fast();
  upload.timeout = absl::Seconds(120);
  DatadogUploader uploader(Agent((*receiver)->url()), upload);
  ASSERT_TRUE(uploader.Consume(Profile()).ok());
  ASSERT_TRUE(uploader.Consume(Profile()).ok());
  ASSERT_TRUE((*receiver)->WaitForRequests(1, absl::Seconds(30)));
  const absl::Time before = absl::Now();
  const absl::Status status = uploader.Flush(before + absl::Milliseconds(200));
  const absl::Duration took = absl::Now() - before;
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("2 profile(s) not delivered"));
  // Far below the request timeout: the request in flight was aborted.
  EXPECT_LT(took, upload.timeout / 4);
  EXPECT_EQ(uploader.stats().dropped_at_stop, 2u);
}

TEST_F(DatadogUploaderTest, FullQueueDropsOldestCountsAndLogsOnce) {
  auto receiver = HttpReceiver::StartTcp();
  ASSERT_TRUE(receiver.ok());
  (*receiver)->SetNeverAnswer(true);  // hold the first request
  LogCapture logs;
  UploadOptions upload = Fast();
  upload.max_queued = 2;
  DatadogUploader uploader(Agent((*receiver)->url()), upload);
  auto at = [](int i) { return kStart + absl::Seconds(60 * i); };
  ASSERT_TRUE(uploader.Consume(Profile(at(0), at(1), 0)).ok());
  ASSERT_TRUE((*receiver)->WaitForRequests(1, absl::Seconds(30)));
  for (int i = 1; i < 6; ++i) {
    ASSERT_TRUE(uploader.Consume(Profile(at(i), at(i + 1), i)).ok());
  }
  EXPECT_EQ(uploader.stats().dropped_queue_full, 3u);
  (*receiver)->SetNeverAnswer(false);
  ASSERT_TRUE(uploader.Flush(Later(absl::Seconds(30))).ok());
  // Delivered: the one in flight, then the two newest.
  std::vector<std::string> starts;
  for (const auto& req : (*receiver)->requests()) {
    starts.push_back(Field(ParseIntake(req).json, "start"));
  }
  EXPECT_THAT(starts, ElementsAre(DatadogUploader::Rfc3339(at(0)),
                                  DatadogUploader::Rfc3339(at(4)),
                                  DatadogUploader::Rfc3339(at(5))));
  EXPECT_EQ(logs.Count("not keeping up"), 1u);
  EXPECT_EQ(uploader.stats().uploaded, 3u);
}

// Through the profiler: DD_* variables, periodic windows, the final flush.
TEST_F(DatadogUploaderTest, ProfilerUploadsEachWindowToTheAgent) {
  auto receiver = HttpReceiver::StartTcp();
  ASSERT_TRUE(receiver.ok());
  const std::map<std::string, std::string> env = {
      {"DD_TRACE_AGENT_URL", (*receiver)->url()},
      {"DD_SERVICE", "e2e"},
      {"DD_TAGS", "team:perf"},
      {"INPROF_EXPORT_PERIOD", "200ms"}};
  std::vector<std::string> errors;
  Options options = Options::FromLookup(
      [&](const char* name) -> const char* {
        auto it = env.find(name);
        return it == env.end() ? nullptr : it->second.c_str();
      },
      &errors);
  ASSERT_THAT(errors, SizeIs(0));
  ASSERT_TRUE(options.datadog.enabled);
  EXPECT_FALSE(options.write_output);
  // CPU sampling only, so that sample counts match the counters exactly.
  Profiler<FramePointerUnwinder, DefaultSampleRing, CpuTimeProvider> profiler(
      options);
  ASSERT_TRUE(profiler.Start().ok());
  int64_t used = 0;  // the thread's CPU while registered, by its clock
  {
    auto self = profiler.RegisterThread("main");
    // Work until two periodic windows have arrived (the final one at Stop
    // makes three). Not a fixed stretch of time: the exporter skips a cut
    // it is late for rather than bursting, and the first window's
    // symbolization can take longer than a 200 ms period (under ASan at
    // -O0 it does), so 600 ms of work sometimes gave only two windows.
    // And at least 300 ms of this thread's CPU, for 20-odd samples at the
    // 10 ms period however little of a core a loaded machine gives it.
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(60);
    const int64_t cpu0 = ::inprof::testing::ThreadCpuNow();
    volatile uint64_t x = 0;
    while (((*receiver)->requests().size() < 2 ||
            ::inprof::testing::ThreadCpuNow() - cpu0 < 300'000'000) &&
           std::chrono::steady_clock::now() < deadline) {
      for (int i = 0; i < 1'000'000; ++i) x = x + 1;
    }
    used = ::inprof::testing::ThreadCpuNow() - cpu0;
  }
  ASSERT_TRUE(profiler.Stop().ok());
  const auto requests = (*receiver)->requests();
  ASSERT_GE(requests.size(), 3u);
  int64_t samples = 0;
  std::string previous_end;
  for (const auto& req : requests) {
    const ParsedIntake intake = ParseIntake(req);
    EXPECT_THAT(Field(intake.json, "tags_profiler"),
                AllOf(HasSubstr("service:e2e"), HasSubstr("team:perf")));
    // Consecutive windows: each starts where the previous ended.
    if (!previous_end.empty()) {
      EXPECT_EQ(Field(intake.json, "start"), previous_end);
    }
    previous_end = Field(intake.json, "end");
    absl::StatusOr<DecodedProfile> p = DecodePprof(intake.profile.body);
    ASSERT_TRUE(p.ok()) << p.status();
    // Every provider's samples (cpu-samples, wall-samples, ...).
    for (size_t i = 0; i < p->sample_types.size(); ++i) {
      if (absl::EndsWith(p->sample_types[i].type, "-samples")) {
        samples += p->Total(static_cast<int>(i));
      }
    }
  }
  EXPECT_EQ(samples, static_cast<int64_t>(profiler.stats().samples_taken));
  // Not none: the points its CPU crossed (>= 29 for its >= 300 ms at 10 ms),
  // a signal at least every second one (perf: one a point; the timer
  // engine: one a scheduler tick it ran, a tick <= 10 ms): a separation,
  // computed (it was > 20, by hand).
  const int64_t period = absl::ToInt64Nanoseconds(options.cpu_period);
  EXPECT_GE(samples, (used / period - 1) / 2);
}

}  // namespace
}  // namespace inprof
