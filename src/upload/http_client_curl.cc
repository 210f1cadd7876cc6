// libcurl is loaded with dlopen() the first time an HttpClient is built, that
// is, only in a process that configured an upload: a host that only writes
// files never maps libcurl and the ~30 libraries it pulls in (TLS, LDAP,
// SSH, Kerberos, ...). The headers give the types; the calls go through
// the function pointers below.
#include "inprof/internal/http_client.h"

#include <curl/curl.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"

namespace inprof::internal {
namespace {

// The request's method, as its errors name it.
const char* Verb(const HttpRequest& request) { return request.get ? "GET " : "POST "; }

#define INPROF_CURL_FUNCTIONS(X) \
  X(curl_global_init) \
  X(curl_multi_init) \
  X(curl_easy_init) \
  X(curl_easy_cleanup) \
  X(curl_multi_cleanup) \
  X(curl_multi_wakeup) \
  X(curl_easy_reset) \
  X(curl_easy_setopt) \
  X(curl_slist_append) \
  X(curl_slist_free_all) \
  X(curl_mime_init) \
  X(curl_mime_addpart) \
  X(curl_mime_name) \
  X(curl_mime_filename) \
  X(curl_mime_type) \
  X(curl_mime_data) \
  X(curl_mime_free) \
  X(curl_multi_add_handle) \
  X(curl_multi_perform) \
  X(curl_multi_info_read) \
  X(curl_multi_poll) \
  X(curl_multi_remove_handle) \
  X(curl_easy_strerror) \
  X(curl_easy_getinfo)

struct CurlApi {
#define INPROF_CURL_POINTER(name) decltype(&::name) name = nullptr;
  INPROF_CURL_FUNCTIONS(INPROF_CURL_POINTER)
#undef INPROF_CURL_POINTER
  std::string error;  // empty when loaded
};

// Loaded once per process, never unloaded (its handles may outlive us).
const CurlApi& Curl() {
  static const CurlApi* api = [] {
    auto* a = new CurlApi;
    const char* env = std::getenv("INPROF_LIBCURL");
    const std::string path = env != nullptr && env[0] != '\0'
                                 ? std::string(env)
                                 : std::string("libcurl.so.4");
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* why = dlerror();
      a->error = absl::StrCat("uploads need libcurl ('", path,
                              "', Debian package libcurl4), which cannot be "
                              "loaded: ", why != nullptr ? why : "unknown");
      return a;
    }
#define INPROF_CURL_LOAD(name)                                             \
  a->name = reinterpret_cast<decltype(&::name)>(dlsym(lib, #name));        \
  if (a->name == nullptr && a->error.empty()) {                            \
    a->error = absl::StrCat("uploads need libcurl 7.68 or newer: '", path, \
                            "' has no ", #name);                           \
  }
    INPROF_CURL_FUNCTIONS(INPROF_CURL_LOAD)
#undef INPROF_CURL_LOAD
    if (a->error.empty()) {
      // Not thread-safe in every libcurl; once, before any handle. Never
      // cleaned up: other code in the process may use libcurl too.
      a->curl_global_init(CURL_GLOBAL_DEFAULT);
    }
    return a;
  }();
  return *api;
}

// Where a response's body goes, and how much of it is kept.
struct BodySink {
  std::string* body;
  size_t max;
};

size_t KeepBody(char* data, size_t size, size_t n, void* user) {
  auto* sink = static_cast<BodySink*>(user);
  const size_t bytes = size * n;
  if (sink->body->size() < sink->max) {
    sink->body->append(data, std::min(bytes, sink->max - sink->body->size()));
  }
  return bytes;
}

// Frees what one request allocated.
struct RequestResources {
  curl_slist* headers = nullptr;
  curl_mime* mime = nullptr;
  ~RequestResources() {
    if (headers != nullptr) Curl().curl_slist_free_all(headers);
    if (mime != nullptr) Curl().curl_mime_free(mime);
  }
};

}  // namespace

absl::Status HttpClient::Available() {
  const CurlApi& curl = Curl();
  if (!curl.error.empty()) return absl::UnavailableError(curl.error);
  return absl::OkStatus();
}

HttpClient::HttpClient() {
  const CurlApi& curl = Curl();
  if (!curl.error.empty()) return;
  easy_ = curl.curl_easy_init();
}

HttpClient::~HttpClient() {
  if (easy_ != nullptr) Curl().curl_easy_cleanup(static_cast<CURL*>(easy_));
}

void HttpClient::Abort() {
  aborted_.store(true, std::memory_order_release);
  std::lock_guard<std::mutex> lock(multi_mutex_);
  if (multi_ != nullptr) Curl().curl_multi_wakeup(static_cast<CURLM*>(multi_));
}

absl::StatusOr<HttpResponse> HttpClient::Send(const HttpRequest& request) {
  CURL* easy = static_cast<CURL*>(easy_);
  const CurlApi& curl = Curl();
  if (!curl.error.empty()) {  // permanent: the uploader does not retry it
    return absl::FailedPreconditionError(
        absl::StrCat(Verb(request), request.url, ": ", curl.error));
  }
  if (easy == nullptr) {
    return absl::InternalError("libcurl could not be initialized");
  }
  // A multi handle (its connection cache and its wake-up socket pair) for
  // this request only: no descriptor outlives it (see http_client.h).
  CURLM* multi = curl.curl_multi_init();
  if (multi == nullptr) {
    return absl::InternalError("libcurl could not be initialized");
  }
  {
    std::lock_guard<std::mutex> lock(multi_mutex_);
    multi_ = multi;
  }
  struct EndMulti {
    HttpClient* client;
    CURLM* multi;
    ~EndMulti() {
      {
        std::lock_guard<std::mutex> lock(client->multi_mutex_);
        client->multi_ = nullptr;
      }
      Curl().curl_multi_cleanup(multi);
    }
  } end_multi{this, multi};
  // After multi_ is set: an Abort() from now on wakes this request.
  if (aborted_.load(std::memory_order_acquire)) {
    return absl::CancelledError(absl::StrCat(Verb(request), request.url, ": aborted"));
  }
  curl.curl_easy_reset(easy);
  HttpResponse response;
  RequestResources res;
  char error[CURL_ERROR_SIZE] = {};
  curl.curl_easy_setopt(easy, CURLOPT_URL, request.url.c_str());
  if (!request.unix_socket.empty()) {
    curl.curl_easy_setopt(easy, CURLOPT_UNIX_SOCKET_PATH,
                     request.unix_socket.c_str());
  }
  curl.curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);  // we run beside other threads
  curl.curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, error);
  curl.curl_easy_setopt(easy, CURLOPT_USERAGENT, "inprof/0.1.0");
  const long timeout_ms =
      std::max<long>(1, static_cast<long>(absl::ToInt64Milliseconds(request.timeout)));
  curl.curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, timeout_ms);
  curl.curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
  curl.curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, &KeepBody);
  BodySink sink{&response.body, request.max_response_body};
  curl.curl_easy_setopt(easy, CURLOPT_WRITEDATA, &sink);
  curl.curl_easy_setopt(easy, CURLOPT_PROTOCOLS_STR, "http,https");
  if (!request.basic_auth_user.empty()) {
    curl.curl_easy_setopt(easy, CURLOPT_HTTPAUTH, CURLAUTH_BASIC);
    curl.curl_easy_setopt(easy, CURLOPT_USERNAME, request.basic_auth_user.c_str());
    curl.curl_easy_setopt(easy, CURLOPT_PASSWORD,
                     request.basic_auth_password.c_str());
  } else if (!request.bearer_token.empty()) {
    curl.curl_easy_setopt(easy, CURLOPT_HTTPAUTH, CURLAUTH_BEARER);
    curl.curl_easy_setopt(easy, CURLOPT_XOAUTH2_BEARER,
                     request.bearer_token.c_str());
  }
  for (const std::string& h : request.headers) {
    res.headers = curl.curl_slist_append(res.headers, h.c_str());
  }
  // No "Expect: 100-continue" round trip (a receiver that ignores it costs
  // curl a 1 s wait).
  res.headers = curl.curl_slist_append(res.headers, "Expect:");
  if (request.get) {
    curl.curl_easy_setopt(easy, CURLOPT_HTTPGET, 1L);
  } else if (request.parts.empty()) {
    res.headers = curl.curl_slist_append(
        res.headers, absl::StrCat("Content-Type: ", request.content_type).c_str());
    curl.curl_easy_setopt(easy, CURLOPT_POST, 1L);
    curl.curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE,
                     static_cast<curl_off_t>(request.body.size()));
    curl.curl_easy_setopt(easy, CURLOPT_POSTFIELDS, request.body.data());
  } else {
    res.mime = curl.curl_mime_init(easy);
    for (const HttpPart& p : request.parts) {
      curl_mimepart* part = curl.curl_mime_addpart(res.mime);
      curl.curl_mime_name(part, p.name.c_str());
      if (!p.filename.empty()) curl.curl_mime_filename(part, p.filename.c_str());
      if (!p.content_type.empty()) curl.curl_mime_type(part, p.content_type.c_str());
      const absl::string_view data = p.owned.empty() ? p.data : p.owned;
      curl.curl_mime_data(part, data.data(), data.size());
    }
    curl.curl_easy_setopt(easy, CURLOPT_MIMEPOST, res.mime);
  }
  curl.curl_easy_setopt(easy, CURLOPT_HTTPHEADER, res.headers);

  if (curl.curl_multi_add_handle(multi, easy) != CURLM_OK) {
    return absl::InternalError("curl_multi_add_handle failed");
  }
  CURLcode result = CURLE_OK;
  bool done = false;
  bool aborted = false;
  while (!done) {
    int running = 0;
    if (curl.curl_multi_perform(multi, &running) != CURLM_OK) {
      result = CURLE_FAILED_INIT;
      break;
    }
    int left = 0;
    while (CURLMsg* msg = curl.curl_multi_info_read(multi, &left)) {
      if (msg->msg == CURLMSG_DONE && msg->easy_handle == easy) {
        result = msg->data.result;
        done = true;
      }
    }
    if (done) break;
    if (aborted_.load(std::memory_order_acquire)) {
      aborted = true;
      break;
    }
    // Wakes on socket activity, curl's own timers, or Abort().
    curl.curl_multi_poll(multi, nullptr, 0, 1000, nullptr);
    if (aborted_.load(std::memory_order_acquire)) {
      aborted = true;
      break;
    }
  }
  curl.curl_multi_remove_handle(multi, easy);
  if (aborted) {
    return absl::CancelledError(absl::StrCat(Verb(request), request.url, ": aborted"));
  }
  if (result != CURLE_OK) {
    const std::string reason =
        error[0] != '\0' ? std::string(error) : curl.curl_easy_strerror(result);
    const std::string message = absl::StrCat(Verb(request), request.url, ": ", reason);
    if (result == CURLE_OPERATION_TIMEDOUT) {
      return absl::DeadlineExceededError(message);
    }
    return absl::UnavailableError(message);
  }
  curl.curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &response.status);
  return response;
}

}  // namespace inprof::internal
