// The Windows HTTP client (src/upload/http_client_windows.cc, on WinHTTP)
// against a local receiver on Winsock (http_receiver_windows.h), under
// Wine: winhttp.dll loaded only on first use; a POST body with its
// Content-Type and extra headers; multipart/form-data bodies as curl writes
// them, parsed as an intake does; basic and bearer authentication; any HTTP
// status as a value, its body truncated; redirects not followed; connection
// reuse; transport failures (a refused port, https to a plain server) as
// errors naming the address; the whole-request timeout; Abort() from another
// thread during a request that never gets an answer, and every Send() after
// it; unix:// refused. End to end, the Datadog and Pyroscope uploaders
// deliver a profile in the shape their intakes expect, retry a 500, and
// Flush() gives up a hanging request at its deadline.
#include "inprof/internal/http_client.h"

#ifndef NOMINMAX
#define NOMINMAX
#endif
#include <windows.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "http_receiver_windows.h"
#include "inprof/datadog_uploader.h"
#include "inprof/pprof_writer.h"
#include "inprof/pyroscope_uploader.h"

namespace inprof {
namespace {

using ::testing::AllOf;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::SizeIs;
using ::testing::StartsWith;
using internal::HttpClient;
using internal::HttpPart;
using internal::HttpRequest;
using internal::HttpResponse;
using testing::ClosedPort;
using testing::FormPart;
using testing::HttpReceiver;
using testing::ReceivedRequest;

// Whether winhttp.dll was mapped before main(): it must not be (it is
// loaded at run time, by a process that uploads).
const bool g_winhttp_loaded_at_start = GetModuleHandleW(L"winhttp.dll") != nullptr;

// Bytes that a careless encoder would break: NUL, CR LF, a boundary-like
// line, high bytes.
const std::string kBinary = std::string("\x1f\x8b\x08\x00", 4) +
                            std::string("a\0b\r\n--not-a-boundary\r\n\xff\xfe", 26) +
                            std::string(3000, 'x');

class HttpClientWindowsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A proxy from the environment would take our 127.0.0.1 requests.
    for (const char* v : {"http_proxy", "HTTP_PROXY", "https_proxy",
                          "HTTPS_PROXY", "all_proxy", "ALL_PROXY"}) {
      SetEnvironmentVariableA(v, nullptr);
      _putenv_s(v, "");
    }
    auto r = HttpReceiver::StartTcp();
    ASSERT_TRUE(r.ok()) << r.status();
    receiver_ = std::move(*r);
  }

  HttpRequest Post(absl::string_view target = "/upload") const {
    HttpRequest request;
    request.url = absl::StrCat(receiver_->url(), target);
    request.timeout = absl::Seconds(20);
    return request;
  }

  const ReceivedRequest& Only(std::vector<ReceivedRequest>& requests) {
    EXPECT_THAT(requests, SizeIs(1));
    if (requests.empty()) requests.emplace_back();
    return requests[0];
  }

  std::unique_ptr<HttpReceiver> receiver_;
};

TEST_F(HttpClientWindowsTest, WinHttpIsLoadedOnlyOnFirstUse) {
  EXPECT_FALSE(g_winhttp_loaded_at_start)
      << "winhttp.dll was mapped before any upload: it must not be linked";
  ASSERT_TRUE(HttpClient::Available().ok()) << HttpClient::Available();
  EXPECT_NE(GetModuleHandleW(L"winhttp.dll"), nullptr);
}

TEST_F(HttpClientWindowsTest, PostsBodyWithContentTypeAndHeaders) {
  HttpClient client;
  HttpRequest request = Post("/ingest?name=app%7Bregion%3Deu%7D&from=17");
  request.body = kBinary;
  request.content_type = "application/x-test";
  request.headers = {"X-Scope-OrgID: tenant-1", "DD-EVP-ORIGIN: inprof",
                     "X-Removed:"};
  absl::StatusOr<HttpResponse> response = client.Send(request);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->body, "");

  std::vector<ReceivedRequest> requests = receiver_->requests();
  const ReceivedRequest& req = Only(requests);
  EXPECT_EQ(req.method, "POST");
  EXPECT_EQ(req.path, "/ingest");
  EXPECT_EQ(req.target, "/ingest?name=app%7Bregion%3Deu%7D&from=17");
  EXPECT_EQ(req.query.at("name"), "app{region=eu}");
  EXPECT_EQ(req.query.at("from"), "17");
  EXPECT_EQ(req.headers.at("content-type"), "application/x-test");
  EXPECT_EQ(req.headers.at("content-length"), absl::StrCat(kBinary.size()));
  EXPECT_EQ(req.headers.at("x-scope-orgid"), "tenant-1");
  EXPECT_EQ(req.headers.at("dd-evp-origin"), "inprof");
  EXPECT_EQ(req.headers.at("user-agent"), "inprof/0.1.0");
  EXPECT_EQ(req.headers.at("host"), absl::StrCat("127.0.0.1:", receiver_->port()));
  EXPECT_EQ(req.headers.count("x-removed"), 0u);
  EXPECT_EQ(req.headers.count("authorization"), 0u);
  EXPECT_EQ(req.headers.count("expect"), 0u) << req.headers.at("expect");
  EXPECT_EQ(req.headers.count("cookie"), 0u);
  EXPECT_EQ(req.body, kBinary);
}

TEST_F(HttpClientWindowsTest, EmptyBodyIsAPostWithContentLengthZero) {
  HttpClient client;
  absl::StatusOr<HttpResponse> response = client.Send(Post());
  ASSERT_TRUE(response.ok()) << response.status();
  std::vector<ReceivedRequest> requests = receiver_->requests();
  const ReceivedRequest& req = Only(requests);
  EXPECT_EQ(req.method, "POST");
  EXPECT_EQ(req.headers.at("content-length"), "0");
  EXPECT_EQ(req.headers.at("content-type"), "application/octet-stream");
  EXPECT_EQ(req.body, "");
}

TEST_F(HttpClientWindowsTest, MultipartPartsArriveIntact) {
  HttpClient client;
  HttpRequest request = Post("/profiling/v1/input");
  const std::string json = R"({"attachments":["profile.pprof"],"family":"native"})";
  request.parts.push_back({.name = "event", .filename = "event.json",
                           .content_type = "application/json", .data = {},
                           .owned = json});
  request.parts.push_back({.name = "profile.pprof", .filename = "profile.pprof",
                           .content_type = "application/octet-stream",
                           .data = kBinary, .owned = {}});
  // curl's defaults: a file without a type is application/octet-stream, a
  // plain field has no Content-Type.
  request.parts.push_back({.name = "note", .filename = {}, .content_type = {},
                           .data = "hello", .owned = {}});
  request.parts.push_back({.name = "raw", .filename = "raw.bin",
                           .content_type = {}, .data = "\x01\x02", .owned = {}});
  request.parts.push_back({.name = "quote\"d", .filename = "a\"b.txt",
                           .content_type = "text/plain", .data = {},
                           .owned = {}});
  absl::StatusOr<HttpResponse> response = client.Send(request);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 200);

  std::vector<ReceivedRequest> requests = receiver_->requests();
  const ReceivedRequest& req = Only(requests);
  EXPECT_EQ(req.path, "/profiling/v1/input");
  const std::string& type = req.headers.at("content-type");
  // curl's boundary: 24 dashes and 22 letters or digits.
  const std::string prefix = "multipart/form-data; boundary=" + std::string(24, '-');
  ASSERT_THAT(type, StartsWith(prefix));
  const std::string random = type.substr(prefix.size());
  EXPECT_EQ(random.size(), 22u) << type;
  EXPECT_TRUE(std::all_of(random.begin(), random.end(),
                          [](char c) { return absl::ascii_isalnum(static_cast<unsigned char>(c)); }))
      << type;
  EXPECT_EQ(req.headers.at("content-length"), absl::StrCat(req.body.size()));
  EXPECT_THAT(req.body, EndsWith("--\r\n"));

  absl::StatusOr<std::vector<FormPart>> parts = testing::ParseMultipart(type, req.body);
  ASSERT_TRUE(parts.ok()) << parts.status() << "\n" << req.body;
  ASSERT_THAT(*parts, SizeIs(5));
  EXPECT_EQ((*parts)[0].name, "event");
  EXPECT_EQ((*parts)[0].filename, "event.json");
  EXPECT_EQ((*parts)[0].content_type, "application/json");
  EXPECT_EQ((*parts)[0].body, json);
  EXPECT_EQ((*parts)[1].name, "profile.pprof");
  EXPECT_EQ((*parts)[1].filename, "profile.pprof");
  EXPECT_EQ((*parts)[1].content_type, "application/octet-stream");
  EXPECT_EQ((*parts)[1].body, kBinary);
  EXPECT_EQ((*parts)[2].name, "note");
  EXPECT_EQ((*parts)[2].filename, "");
  EXPECT_EQ((*parts)[2].headers.count("content-type"), 0u);
  EXPECT_EQ((*parts)[2].body, "hello");
  EXPECT_EQ((*parts)[3].content_type, "application/octet-stream");
  EXPECT_EQ((*parts)[3].body, "\x01\x02");
  // Quotes escaped as curl and browsers do.
  EXPECT_EQ((*parts)[4].name, "quote%22d");
  EXPECT_EQ((*parts)[4].filename, "a%22b.txt");
  EXPECT_EQ((*parts)[4].body, "");
}

TEST_F(HttpClientWindowsTest, BasicAuthentication) {
  HttpClient client;
  HttpRequest request = Post();
  request.basic_auth_user = "user";
  request.basic_auth_password = "pa:ss word";
  request.bearer_token = "ignored-when-basic-is-set";
  ASSERT_TRUE(client.Send(request).ok());
  std::vector<ReceivedRequest> requests = receiver_->requests();
  EXPECT_EQ(Only(requests).headers.at("authorization"),
            "Basic " + absl::Base64Escape("user:pa:ss word"));
}

TEST_F(HttpClientWindowsTest, BasicAuthenticationFromTheUrl) {
  HttpClient client;
  HttpRequest request;
  request.url = absl::StrCat("http://me%40corp:s%3Acret@127.0.0.1:",
                             receiver_->port(), "/x");
  ASSERT_TRUE(client.Send(request).ok());
  std::vector<ReceivedRequest> requests = receiver_->requests();
  EXPECT_EQ(Only(requests).headers.at("authorization"),
            "Basic " + absl::Base64Escape("me@corp:s:cret"));
}

TEST_F(HttpClientWindowsTest, BearerToken) {
  HttpClient client;
  HttpRequest request = Post();
  request.bearer_token = "glc_token123";
  ASSERT_TRUE(client.Send(request).ok());
  std::vector<ReceivedRequest> requests = receiver_->requests();
  EXPECT_EQ(Only(requests).headers.at("authorization"), "Bearer glc_token123");
}

TEST_F(HttpClientWindowsTest, ErrorStatusIsAValueWithItsBody) {
  receiver_->SetStatuses({500});
  receiver_->SetResponse("intake is down\nsecond line");
  HttpClient client;
  absl::StatusOr<HttpResponse> response = client.Send(Post());
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 500);
  EXPECT_EQ(response->body, "intake is down\nsecond line");
}

TEST_F(HttpClientWindowsTest, LongResponseBodyIsTruncatedAndTheConnectionReused) {
  receiver_->SetStatuses({400});
  receiver_->SetResponse(std::string(100'000, 'e'));
  HttpClient client;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<HttpResponse> response = client.Send(Post());
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_EQ(response->status, 400);
    EXPECT_EQ(response->body, std::string(HttpClient::kMaxResponseBody, 'e'));
  }
  // The whole body was read each time: one connection carried all three.
  std::vector<ReceivedRequest> requests = receiver_->requests();
  ASSERT_THAT(requests, SizeIs(3));
  EXPECT_EQ(receiver_->connection_count(), 1);
  EXPECT_EQ(requests[2].connection, requests[0].connection);
}

TEST_F(HttpClientWindowsTest, RedirectIsNotFollowed) {
  receiver_->SetStatuses({307});
  receiver_->SetResponse("", {"Location: /elsewhere"});
  HttpClient client;
  absl::StatusOr<HttpResponse> response = client.Send(Post("/first"));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 307);
  std::vector<ReceivedRequest> requests = receiver_->requests();
  EXPECT_EQ(Only(requests).path, "/first");
}

TEST_F(HttpClientWindowsTest, SwitchesBetweenHosts) {
  auto other = HttpReceiver::StartTcp();
  ASSERT_TRUE(other.ok()) << other.status();
  HttpClient client;
  HttpRequest a = Post("/a");
  HttpRequest b;
  b.url = absl::StrCat((*other)->url(), "/b");
  ASSERT_TRUE(client.Send(a).ok());
  ASSERT_TRUE(client.Send(b).ok());
  ASSERT_TRUE(client.Send(a).ok());
  EXPECT_EQ(receiver_->request_count(), 2u);
  ASSERT_EQ((*other)->request_count(), 1u);
  EXPECT_EQ((*other)->requests()[0].path, "/b");
}

TEST_F(HttpClientWindowsTest, RefusedPortIsUnavailableNamingTheAddressQuickly) {
  ClosedPort closed;
  ASSERT_NE(closed.port(), 0);
  HttpClient client;
  HttpRequest request;
  request.url = absl::StrCat(closed.url(), "/profiling/v1/input");
  request.timeout = absl::Seconds(20);
  const absl::Time start = absl::Now();
  absl::StatusOr<HttpResponse> response = client.Send(request);
  const absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(response.ok());
  EXPECT_TRUE(absl::IsUnavailable(response.status())) << response.status();
  EXPECT_THAT(std::string(response.status().message()),
              AllOf(StartsWith(absl::StrCat("POST ", request.url, ": ")),
                    HasSubstr(absl::StrCat("cannot connect to 127.0.0.1:",
                                           closed.port(), ": "))));
  EXPECT_THAT(std::string(response.status().message()), Not(HasSubstr("\n")));
  // Windows itself retries a refused SYN for about 2 s; Wine does not.
  EXPECT_LT(took, absl::Seconds(5));
}

TEST_F(HttpClientWindowsTest, NoAnswerIsDeadlineExceededAtTheTimeout) {
  receiver_->SetNeverAnswer(true);
  HttpClient client;
  HttpRequest request = Post();
  request.timeout = absl::Milliseconds(700);
  const absl::Time start = absl::Now();
  absl::StatusOr<HttpResponse> response = client.Send(request);
  const absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(response.ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(response.status())) << response.status();
  EXPECT_THAT(std::string(response.status().message()),
              HasSubstr(absl::StrCat("127.0.0.1:", receiver_->port())));
  EXPECT_GE(took, absl::Milliseconds(650));
  EXPECT_LT(took, absl::Seconds(3));
  EXPECT_EQ(receiver_->request_count(), 1u);
  // The client still works after a timeout.
  receiver_->SetNeverAnswer(false);
  request.timeout = absl::Seconds(20);
  absl::StatusOr<HttpResponse> again = client.Send(request);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->status, 200);
}

TEST_F(HttpClientWindowsTest, AbortFromAnotherThreadCancelsNowAndLater) {
  receiver_->SetNeverAnswer(true);
  HttpClient client;
  absl::Time aborted_at;
  std::thread aborter([&] {
    ASSERT_TRUE(receiver_->WaitForRequests(1, absl::Seconds(30)));
    aborted_at = absl::Now();
    client.Abort();
  });
  HttpRequest request = Post();
  request.body = kBinary;
  request.timeout = absl::Seconds(60);
  absl::StatusOr<HttpResponse> response = client.Send(request);
  const absl::Time returned_at = absl::Now();
  aborter.join();
  ASSERT_FALSE(response.ok());
  EXPECT_TRUE(absl::IsCancelled(response.status())) << response.status();
  // Cancelled by the abort, not by the 60 s timeout: a hang check. How
  // soon it returns is the scheduler's (Wine's) business, not asserted.
  EXPECT_LT(returned_at - aborted_at, request.timeout / 4);

  // A later Send is cancelled without a request (the receiver counts).
  absl::StatusOr<HttpResponse> later = client.Send(request);
  EXPECT_TRUE(absl::IsCancelled(later.status())) << later.status();
  EXPECT_EQ(receiver_->request_count(), 1u);
}

TEST_F(HttpClientWindowsTest, AbortBeforeSendCancelsWithoutConnecting) {
  HttpClient client;
  client.Abort();
  absl::StatusOr<HttpResponse> response = client.Send(Post());
  EXPECT_TRUE(absl::IsCancelled(response.status())) << response.status();
  EXPECT_EQ(receiver_->connection_count(), 0);
}

TEST_F(HttpClientWindowsTest, HttpsToAPlainServerFailsCleanly) {
  HttpClient client;
  HttpRequest request;
  request.url = absl::StrCat("https://127.0.0.1:", receiver_->port(), "/x");
  request.timeout = absl::Seconds(20);
  const absl::Time start = absl::Now();
  absl::StatusOr<HttpResponse> response = client.Send(request);
  ASSERT_FALSE(response.ok());
  EXPECT_TRUE(absl::IsUnavailable(response.status())) << response.status();
  EXPECT_THAT(std::string(response.status().message()),
              HasSubstr(absl::StrCat("127.0.0.1:", receiver_->port())));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_TRUE(receiver_->WaitForRejected(1, absl::Seconds(10)));
  EXPECT_EQ(receiver_->request_count(), 0u);
  // The same client then speaks plain http to it.
  HttpRequest plain = Post();
  absl::StatusOr<HttpResponse> ok = client.Send(plain);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->status, 200);
}

TEST_F(HttpClientWindowsTest, UnixSocketIsUnimplemented) {
  HttpClient client;
  HttpRequest request;
  request.url = "http://localhost/profiling/v1/input";
  request.unix_socket = "/var/run/datadog/apm.socket";
  absl::StatusOr<HttpResponse> response = client.Send(request);
  EXPECT_TRUE(absl::IsUnimplemented(response.status())) << response.status();
  EXPECT_EQ(response.status().message(),
            "HTTP over a unix socket (unix://) is not available on Windows; "
            "use http://host:port");
}

TEST_F(HttpClientWindowsTest, BadUrlsAreInvalidArguments) {
  HttpClient client;
  for (const char* url : {"ftp://127.0.0.1/x", "127.0.0.1:8126/x", "http:///x",
                          "http://127.0.0.1:99999/x", "http://127.0.0.1:x/"}) {
    HttpRequest request;
    request.url = url;
    absl::StatusOr<HttpResponse> response = client.Send(request);
    EXPECT_TRUE(absl::IsInvalidArgument(response.status()))
        << url << ": " << response.status();
  }
  EXPECT_EQ(receiver_->connection_count(), 0);
}

// --- End to end, through the uploaders ---------------------------------------

const absl::Time kStart = absl::FromUnixNanos(1'700'000'000'123'456'789);
const absl::Time kEnd = absl::FromUnixNanos(1'700'000'060'987'654'321);

std::shared_ptr<ExportedProfile> Profile() {
  auto p = std::make_shared<ExportedProfile>();
  // What the intake gets is opaque here: gzip bytes as a real export has.
  absl::StatusOr<std::string> gz = GzipCompress(kBinary);
  p->pprof = gz.ok() ? *gz : kBinary;
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

DatadogOptions Agent(const std::string& url) {
  DatadogOptions dd;
  dd.enabled = true;
  dd.agent_url = url;
  dd.service = "checkout";
  dd.env = "prod";
  dd.version = "1.2.3";
  dd.tags = {"team:perf"};
  dd.hostname = "test-host";
  return dd;
}

TEST_F(HttpClientWindowsTest, DatadogUploaderPostsWhatTheAgentExpects) {
  receiver_->SetStatuses({500, 200});  // the first attempt is retried
  DatadogUploader uploader(Agent(receiver_->url()), Fast());
  auto profile = Profile();
  ASSERT_TRUE(uploader.Consume(profile).ok());
  ASSERT_TRUE(uploader.Flush(absl::Now() + absl::Seconds(30)).ok());
  EXPECT_EQ(uploader.stats().uploaded, 1u);
  EXPECT_EQ(uploader.stats().attempts, 2u);

  std::vector<ReceivedRequest> requests = receiver_->requests();
  ASSERT_THAT(requests, SizeIs(2));
  const ReceivedRequest& req = requests[1];
  EXPECT_EQ(req.method, "POST");
  EXPECT_EQ(req.path, "/profiling/v1/input");
  EXPECT_EQ(req.headers.at("dd-evp-origin"), "inprof");
  EXPECT_EQ(req.headers.at("dd-evp-origin-version"), "0.1.0");
  absl::StatusOr<std::vector<FormPart>> parts =
      testing::ParseMultipart(req.headers.at("content-type"), req.body);
  ASSERT_TRUE(parts.ok()) << parts.status();
  ASSERT_THAT(*parts, SizeIs(2));
  const FormPart& event = (*parts)[0];
  EXPECT_EQ(event.name, "event");
  EXPECT_EQ(event.filename, "event.json");
  EXPECT_EQ(event.content_type, "application/json");
  EXPECT_THAT(event.body,
              AllOf(StartsWith(R"({"attachments":["profile.pprof"],"tags_profiler":")"),
                    HasSubstr("service:checkout,env:prod,version:1.2.3,team:perf,"
                              "language:native,profiler_version:0.1.0,runtime-id:"),
                    HasSubstr(",host:test-host\""),
                    HasSubstr(R"("start":"2023-11-14T22:13:20.123456789Z")"),
                    HasSubstr(R"("end":"2023-11-14T22:14:20.987654321Z")"),
                    HasSubstr(R"("family":"native","version":"4"})")));
  const FormPart& pprof = (*parts)[1];
  EXPECT_EQ(pprof.name, "profile.pprof");
  EXPECT_EQ(pprof.filename, "profile.pprof");
  EXPECT_EQ(pprof.content_type, "application/octet-stream");
  EXPECT_EQ(pprof.body, profile->pprof);
  EXPECT_EQ(requests[0].path, "/profiling/v1/input");
}

TEST_F(HttpClientWindowsTest, PyroscopeUploaderPostsWhatIngestExpects) {
  PyroscopeOptions py;
  py.url = receiver_->url() + "/";
  py.application_name = "checkout{region=eu,team=perf}";
  py.basic_auth_user = "123456";
  py.basic_auth_password = "glc_key";
  py.tenant_id = "tenant-7";
  PyroscopeUploader uploader(py, Fast(), absl::Milliseconds(10));
  auto profile = Profile();
  ASSERT_TRUE(uploader.Consume(profile).ok());
  ASSERT_TRUE(uploader.Flush(absl::Now() + absl::Seconds(30)).ok());
  EXPECT_EQ(uploader.stats().uploaded, 1u);

  std::vector<ReceivedRequest> requests = receiver_->requests();
  const ReceivedRequest& req = Only(requests);
  EXPECT_EQ(req.method, "POST");
  EXPECT_EQ(req.path, "/ingest");
  EXPECT_EQ(req.query.at("name"), "checkout{region=eu,team=perf}");
  EXPECT_EQ(req.query.at("from"), "1700000000");
  EXPECT_EQ(req.query.at("until"), "1700000061");
  EXPECT_EQ(req.query.at("format"), "pprof");
  EXPECT_EQ(req.query.at("spyName"), "inprof");
  EXPECT_EQ(req.query.at("sampleRate"), "100");
  EXPECT_EQ(req.headers.at("content-type"), "application/octet-stream");
  EXPECT_EQ(req.headers.at("authorization"),
            "Basic " + absl::Base64Escape("123456:glc_key"));
  EXPECT_EQ(req.headers.at("x-scope-orgid"), "tenant-7");
  EXPECT_EQ(req.body, profile->pprof);
}

TEST_F(HttpClientWindowsTest, UploaderFlushAbortsAHangingRequestAtItsDeadline) {
  receiver_->SetNeverAnswer(true);
  UploadOptions upload = Fast();
  upload.timeout = absl::Seconds(60);
  DatadogUploader uploader(Agent(receiver_->url()), upload);
  ASSERT_TRUE(uploader.Consume(Profile()).ok());
  ASSERT_TRUE(receiver_->WaitForRequests(1, absl::Seconds(30)));
  const absl::Time start = absl::Now();
  absl::Status flushed = uploader.Flush(start + absl::Milliseconds(200));
  const absl::Duration took = absl::Now() - start;
  EXPECT_TRUE(absl::IsDeadlineExceeded(flushed)) << flushed;
  EXPECT_LT(took, absl::Seconds(2));
  EXPECT_EQ(uploader.stats().dropped_at_stop, 1u);
  EXPECT_EQ(uploader.stats().uploaded, 0u);
}

}  // namespace
}  // namespace inprof
