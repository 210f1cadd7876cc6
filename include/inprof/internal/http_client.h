// internal: not part of the public API.
//
// A small blocking HTTP client for the uploaders, on libcurl on Linux
// (http_client_curl.cc) and WinHTTP on Windows (http_client_windows.cc),
// each loaded at run time, only by a process that uploads: one request at
// a time, a whole-request timeout, HTTP over a unix socket (Linux),
// multipart/form-data bodies, and Abort() from another thread, which makes
// the request in progress return within milliseconds. On Linux no
// descriptor outlives a Send() (its connection and libcurl's wake-up pair
// are closed before it returns): a descriptor kept between uploads could be
// closed by the program and its number reused for one of the program's
// files, which libcurl would then write a request into, read or close.
//
// Thread-safety: Send() from one thread at a time; Abort() from any thread.
#ifndef INPROF_INTERNAL_HTTP_CLIENT_H_
#define INPROF_INTERNAL_HTTP_CLIENT_H_

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace inprof::internal {

// One part of a multipart/form-data body.
struct HttpPart {
  std::string name;          // form field name
  std::string filename;      // empty: no filename
  std::string content_type;  // empty: curl's default
  absl::string_view data;    // not copied; must outlive Send()
  std::string owned;         // sent instead of `data` when non-empty
};

struct HttpRequest {
  std::string url;          // http(s)://host[:port]/path?query
  std::string unix_socket;  // non-empty: connect to this socket instead
  std::vector<std::string> headers;  // "Name: value"
  // With `parts` empty: a POST of `body` (not copied) as `content_type`.
  absl::string_view body;
  std::string content_type = "application/octet-stream";
  std::vector<HttpPart> parts;  // non-empty: multipart/form-data POST
  std::string basic_auth_user;  // non-empty: HTTP basic authentication
  std::string basic_auth_password;
  std::string bearer_token;  // non-empty: "Authorization: Bearer ..."
  absl::Duration timeout = absl::Seconds(10);
  bool get = false;  // a GET instead (`body` and `parts` unused): `inprof stacks`
  size_t max_response_body = 4096;  // bytes of the response kept (HttpResponse::body)
};

struct HttpResponse {
  long status = 0;   // HTTP status code
  std::string body;  // at most the request's max_response_body bytes kept
};

class HttpClient {
 public:
  // Response bytes kept by default (error pages can be large; one line is
  // logged): HttpRequest::max_response_body.
  static constexpr size_t kMaxResponseBody = 4096;

  // OK when libcurl (loaded on first use, see http_client_curl.cc; on
  // Windows winhttp.dll) is there; otherwise Unavailable with one line
  // naming the library and the package that provides it. INPROF_LIBCURL
  // overrides the file loaded (Linux).
  static absl::Status Available();

  HttpClient();
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Performs `request`. An HTTP response of any status is a value; a
  // transport failure is an error: DeadlineExceeded for the timeout,
  // Cancelled after Abort(), FailedPrecondition when libcurl cannot be
  // loaded (Linux; no retry can succeed), Unavailable otherwise, with
  // curl's reason.
  absl::StatusOr<HttpResponse> Send(const HttpRequest& request);

  // Any thread: the Send() in progress, and every later one, returns
  // Cancelled.
  void Abort();

 private:
  // CURLM* of the Send() in progress, null between them (multi_mutex_;
  // Windows: the WinHTTP client's state).
  void* multi_ = nullptr;
  std::mutex multi_mutex_;  // Abort() wakes the multi handle Send() uses
  void* easy_ = nullptr;   // CURL* (Windows: unused)
  std::atomic<bool> aborted_{false};
};

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_HTTP_CLIENT_H_
