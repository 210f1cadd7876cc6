// HTTP uploads on Windows (Datadog, Pyroscope): internal/http_client.h on
// WinHTTP, the HTTP client that ships with every Windows.
//
// winhttp.dll is loaded with LoadLibrary the first time it is needed (an
// HttpClient is built or Available() is asked), that is, only in a process
// that configured an upload: a host that only writes files never maps it.
// It is not linked; <winhttp.h> gives the types and the calls go through
// the function pointers below (the Linux version does the same with
// libcurl, http_client_curl.cc).
//
// The session is asynchronous (WINHTTP_FLAG_ASYNC): Send() starts each step
// (send, receive the head, read the body) and waits for its completion
// callback, the request's deadline or Abort(), whichever comes first. So
// Abort() and the deadline never depend on WinHTTP giving up a blocked
// socket (Wine's does not when the handle is closed under it): the request
// handle is closed and Send() returns at once. What the callbacks may still
// touch afterwards (the bytes being sent, the read buffer, an event) lives
// in a reference-counted RequestContext that the last callback,
// WINHTTP_CALLBACK_STATUS_HANDLE_CLOSING, frees.
//
// What is sent matches http_client_curl.cc: "User-Agent: inprof/0.1.0",
// "Accept: */*", the request's headers, Content-Type and Content-Length,
// curl's multipart/form-data layout; redirects are not followed and no
// cookies are kept. The session and the connection handle are kept across
// requests to the same scheme, host and port (WinHTTP then reuses the
// connection). The proxy is WinHTTP's default (netsh winhttp set proxy).
#include "inprof/internal/http_client.h"

#include <windows.h>
#include <winhttp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"

namespace inprof::internal {
namespace {

// The request's method, as its errors name it.
const char* Verb(const HttpRequest& request) { return request.get ? "GET " : "POST "; }

#define INPROF_WINHTTP_FUNCTIONS(X) \
  X(WinHttpOpen)                    \
  X(WinHttpConnect)                 \
  X(WinHttpOpenRequest)             \
  X(WinHttpSetOption)               \
  X(WinHttpSetTimeouts)             \
  X(WinHttpSetStatusCallback)       \
  X(WinHttpAddRequestHeaders)       \
  X(WinHttpSendRequest)             \
  X(WinHttpReceiveResponse)         \
  X(WinHttpQueryHeaders)            \
  X(WinHttpReadData)                \
  X(WinHttpCloseHandle)

struct WinHttpApi {
#define INPROF_WINHTTP_POINTER(name) decltype(&::name) name = nullptr;
  INPROF_WINHTTP_FUNCTIONS(INPROF_WINHTTP_POINTER)
#undef INPROF_WINHTTP_POINTER
  HMODULE module = nullptr;
  std::string error;  // empty when loaded
};

std::string WindowsErrorText(DWORD error, HMODULE module) {
  char buf[512] = {};
  DWORD n = 0;
  if (module != nullptr) {
    n = FormatMessageA(FORMAT_MESSAGE_FROM_HMODULE | FORMAT_MESSAGE_IGNORE_INSERTS,
                       module, error, 0, buf, sizeof(buf), nullptr);
  }
  if (n == 0) {
    n = FormatMessageA(FORMAT_MESSAGE_FROM_SYSTEM | FORMAT_MESSAGE_IGNORE_INSERTS,
                       nullptr, error, 0, buf, sizeof(buf), nullptr);
  }
  std::string text(buf, n);
  // One line: FormatMessage ends with ".\r\n" and may wrap.
  absl::StrReplaceAll({{"\r\n", " "}, {"\n", " "}, {"\r", " "}}, &text);
  text = std::string(absl::StripAsciiWhitespace(text));
  while (!text.empty() && text.back() == '.') text.pop_back();
  return text;
}

// Loaded once per process, never unloaded (callbacks may run late).
const WinHttpApi& WinHttp() {
  static const WinHttpApi* api = [] {
    auto* a = new WinHttpApi;
    // System32 only: never a winhttp.dll planted beside the program.
    a->module = LoadLibraryExW(L"winhttp.dll", nullptr,
                               LOAD_LIBRARY_SEARCH_SYSTEM32);
    if (a->module == nullptr) {
      const DWORD error = GetLastError();
      a->error = absl::StrCat(
          "uploads need winhttp.dll, which cannot be loaded: ",
          WindowsErrorText(error, nullptr), " (Windows error ", error, ")");
      return a;
    }
    // Through void (*)(): GCC's -Wcast-function-type accepts that one.
#define INPROF_WINHTTP_LOAD(name)                                              \
  a->name = reinterpret_cast<decltype(&::name)>(                               \
      reinterpret_cast<void (*)()>(GetProcAddress(a->module, #name)));         \
  if (a->name == nullptr && a->error.empty()) {                                \
    a->error = absl::StrCat("uploads need winhttp.dll with ", #name,           \
                            ", which this one lacks");                         \
  }
    INPROF_WINHTTP_FUNCTIONS(INPROF_WINHTTP_LOAD)
#undef INPROF_WINHTTP_LOAD
    return a;
  }();
  return *api;
}

std::wstring Wide(absl::string_view s) {
  if (s.empty()) return {};
  const int n = MultiByteToWideChar(CP_UTF8, 0, s.data(),
                                    static_cast<int>(s.size()), nullptr, 0);
  std::wstring out(static_cast<size_t>(std::max(n, 0)), L'\0');
  if (n > 0) {
    MultiByteToWideChar(CP_UTF8, 0, s.data(), static_cast<int>(s.size()),
                        out.data(), n);
  }
  return out;
}

// The WinHTTP error as one line: "<text> (WinHTTP error 12029)".
std::string ErrorText(DWORD error) {
  std::string text = WindowsErrorText(error, WinHttp().module);
  if (text.empty()) {
    switch (error) {
      case ERROR_WINHTTP_CANNOT_CONNECT: text = "connection refused"; break;
      case ERROR_WINHTTP_CONNECTION_ERROR:
        text = "the connection was reset or closed";
        break;
      case ERROR_WINHTTP_NAME_NOT_RESOLVED:
        text = "the host name could not be resolved";
        break;
      case ERROR_WINHTTP_TIMEOUT: text = "the operation timed out"; break;
      case ERROR_WINHTTP_INVALID_SERVER_RESPONSE:
        text = "the server's response could not be parsed";
        break;
      case ERROR_WINHTTP_SECURE_FAILURE:
        text = "the server's certificate or TLS handshake was rejected";
        break;
      case ERROR_WINHTTP_SECURE_CHANNEL_ERROR:
        text = "TLS channel error";
        break;
      default: text = "error"; break;
    }
  }
  const bool winhttp = error >= WINHTTP_ERROR_BASE && error <= WINHTTP_ERROR_LAST;
  return absl::StrCat(text, winhttp ? " (WinHTTP error " : " (Windows error ",
                      error, ")");
}

// What WINHTTP_CALLBACK_STATUS_SECURE_FAILURE says, in words.
std::string SecureFailureText(DWORD flags) {
  std::string out;
  const auto add = [&](DWORD flag, absl::string_view what) {
    if ((flags & flag) != 0) absl::StrAppend(&out, out.empty() ? "" : ", ", what);
  };
  add(WINHTTP_CALLBACK_STATUS_FLAG_CERT_REV_FAILED, "revocation check failed");
  add(WINHTTP_CALLBACK_STATUS_FLAG_INVALID_CERT, "invalid certificate");
  add(WINHTTP_CALLBACK_STATUS_FLAG_CERT_REVOKED, "certificate revoked");
  add(WINHTTP_CALLBACK_STATUS_FLAG_INVALID_CA, "unknown certificate authority");
  add(WINHTTP_CALLBACK_STATUS_FLAG_CERT_CN_INVALID,
      "certificate name does not match the host");
  add(WINHTTP_CALLBACK_STATUS_FLAG_CERT_DATE_INVALID, "certificate expired");
  add(WINHTTP_CALLBACK_STATUS_FLAG_SECURITY_CHANNEL_ERROR, "TLS channel error");
  return out;
}

struct ParsedUrl {
  bool secure = false;
  std::string host;  // IPv6 without brackets
  INTERNET_PORT port = 0;
  std::string host_port;  // as written in messages: 127.0.0.1:8126
  std::string target;     // /path?query
  std::string user;       // from user:password@ (decoded)
  std::string password;
};

std::string PercentDecode(absl::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    int value = 0;
    if (s[i] == '%' && i + 2 < s.size() &&
        absl::ascii_isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        absl::ascii_isxdigit(static_cast<unsigned char>(s[i + 2])) &&
        absl::SimpleHexAtoi(s.substr(i + 1, 2), &value)) {
      out.push_back(static_cast<char>(value));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

// http(s)://[user[:password]@]host[:port][/path][?query][#fragment]
absl::StatusOr<ParsedUrl> ParseUrl(absl::string_view url) {
  ParsedUrl out;
  absl::string_view rest = url;
  const size_t scheme_end = rest.find("://");
  if (scheme_end == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", url, "' is not an http:// or https:// URL"));
  }
  const std::string scheme = absl::AsciiStrToLower(rest.substr(0, scheme_end));
  if (scheme == "https") {
    out.secure = true;
  } else if (scheme != "http") {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", url, "': only http:// and https:// are supported on Windows"));
  }
  rest.remove_prefix(scheme_end + 3);
  const size_t authority_end = rest.find_first_of("/?#");
  absl::string_view authority = rest.substr(0, authority_end);
  rest = authority_end == absl::string_view::npos ? absl::string_view()
                                                  : rest.substr(authority_end);
  if (const size_t at = authority.rfind('@'); at != absl::string_view::npos) {
    const absl::string_view userinfo = authority.substr(0, at);
    const size_t colon = userinfo.find(':');
    out.user = PercentDecode(userinfo.substr(0, colon));
    if (colon != absl::string_view::npos) {
      out.password = PercentDecode(userinfo.substr(colon + 1));
    }
    authority.remove_prefix(at + 1);
  }
  absl::string_view port;
  if (absl::StartsWith(authority, "[")) {
    const size_t close = authority.find(']');
    if (close == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("'", url, "': bad IPv6 host"));
    }
    out.host = std::string(authority.substr(1, close - 1));
    absl::string_view after = authority.substr(close + 1);
    if (absl::ConsumePrefix(&after, ":")) {
      port = after;
    } else if (!after.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("'", url, "': bad host"));
    }
  } else {
    const size_t colon = authority.find(':');
    out.host = std::string(authority.substr(0, colon));
    if (colon != absl::string_view::npos) port = authority.substr(colon + 1);
  }
  if (out.host.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("'", url, "' has no host"));
  }
  uint32_t port_number = out.secure ? 443 : 80;
  if (!port.empty() &&
      (!absl::SimpleAtoi(port, &port_number) || port_number == 0 ||
       port_number > 65535)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", url, "': bad port '", port, "'"));
  }
  out.port = static_cast<INTERNET_PORT>(port_number);
  out.host_port = absl::StrCat(
      absl::StrContains(out.host, ':') ? absl::StrCat("[", out.host, "]")
                                       : out.host,
      ":", port_number);
  rest = rest.substr(0, rest.find('#'));
  out.target = absl::StartsWith(rest, "/") ? std::string(rest)
                                           : absl::StrCat("/", rest);
  return out;
}

// A form field name or file name inside a quoted header parameter, escaped
// as curl (and browsers, per the HTML standard) do.
std::string QuoteParam(absl::string_view s) {
  return absl::StrReplaceAll(s, {{"\"", "%22"}, {"\r", "%0D"}, {"\n", "%0A"}});
}

// curl's boundary: 24 dashes and 22 random letters and digits.
std::string NewBoundary() {
  static constexpr char kChars[] =
      "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  absl::BitGen gen;
  std::string boundary(24, '-');
  for (int i = 0; i < 22; ++i) {
    boundary.push_back(kChars[absl::Uniform<size_t>(gen, 0, sizeof(kChars) - 1)]);
  }
  return boundary;
}

// The multipart/form-data body curl's mime API writes for `parts`.
std::string MultipartBody(const std::vector<HttpPart>& parts,
                          const std::string& boundary) {
  std::string body;
  for (const HttpPart& p : parts) {
    absl::StrAppend(&body, "--", boundary,
                    "\r\nContent-Disposition: form-data; name=\"",
                    QuoteParam(p.name), "\"");
    if (!p.filename.empty()) {
      absl::StrAppend(&body, "; filename=\"", QuoteParam(p.filename), "\"");
    }
    absl::StrAppend(&body, "\r\n");
    // curl's default: a file is application/octet-stream, a field untyped.
    const std::string type = !p.content_type.empty() ? p.content_type
                             : !p.filename.empty()   ? "application/octet-stream"
                                                     : "";
    if (!type.empty()) absl::StrAppend(&body, "Content-Type: ", type, "\r\n");
    absl::StrAppend(&body, "\r\n", p.owned.empty() ? p.data : p.owned, "\r\n");
  }
  absl::StrAppend(&body, "--", boundary, "--\r\n");
  return body;
}

// What one request shares with WinHTTP's callbacks: alive until both Send()
// and the handle's HANDLE_CLOSING callback let go of it.
struct RequestContext {
  std::atomic<int> refs{1};
  HANDLE done_event = CreateEventW(nullptr, FALSE, FALSE, nullptr);
  std::string body;                 // what WinHttpSendRequest sends
  std::vector<char> buffer = std::vector<char>(16384);  // WinHttpReadData's

  std::mutex mutex;  // guards what follows
  bool done = false;       // the step in progress completed
  DWORD error = 0;         // ... with this error (REQUEST_ERROR)
  DWORD bytes_read = 0;    // READ_COMPLETE
  DWORD secure_flags = 0;  // SECURE_FAILURE

  ~RequestContext() {
    if (done_event != nullptr) CloseHandle(done_event);
  }
  void Unref() {
    if (refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }
  void Start() {
    std::lock_guard<std::mutex> lock(mutex);
    done = false;
    error = 0;
    bytes_read = 0;
  }
  void Complete(DWORD e, DWORD read) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      done = true;
      error = e;
      bytes_read = read;
    }
    SetEvent(done_event);
  }
};

void CALLBACK OnStatus(HINTERNET /*handle*/, DWORD_PTR context, DWORD status,
                       LPVOID info, DWORD info_length) {
  auto* ctx = reinterpret_cast<RequestContext*>(context);
  if (ctx == nullptr) return;
  switch (status) {
    case WINHTTP_CALLBACK_STATUS_SENDREQUEST_COMPLETE:
    case WINHTTP_CALLBACK_STATUS_HEADERS_AVAILABLE:
      ctx->Complete(0, 0);
      break;
    case WINHTTP_CALLBACK_STATUS_READ_COMPLETE:
      ctx->Complete(0, info_length);
      break;
    case WINHTTP_CALLBACK_STATUS_REQUEST_ERROR: {
      const auto* result = static_cast<const WINHTTP_ASYNC_RESULT*>(info);
      ctx->Complete(result != nullptr ? result->dwError : ERROR_WINHTTP_INTERNAL_ERROR,
                    0);
      break;
    }
    case WINHTTP_CALLBACK_STATUS_SECURE_FAILURE:
      if (info != nullptr && info_length >= sizeof(DWORD)) {
        std::lock_guard<std::mutex> lock(ctx->mutex);
        ctx->secure_flags |= *static_cast<const DWORD*>(info);
      }
      break;
    case WINHTTP_CALLBACK_STATUS_HANDLE_CLOSING:
      ctx->Unref();  // the handle's reference: no callback comes after this
      break;
    default:
      break;
  }
}

// The client's state (http_client.h has room for two pointers: this one
// lives in multi_).
struct State {
  HANDLE abort_event = CreateEventW(nullptr, TRUE, FALSE, nullptr);
  std::mutex mutex;  // guards the handles; Abort() takes it from any thread
  HINTERNET session = nullptr;
  HINTERNET connect = nullptr;
  std::string connect_key;  // scheme://host:port of `connect`
  HINTERNET request = nullptr;  // the request in flight; Abort() closes it
};

int RemainingMs(ULONGLONG deadline_ms) {
  const ULONGLONG now = GetTickCount64();
  if (now >= deadline_ms) return 0;
  return static_cast<int>(std::min<ULONGLONG>(deadline_ms - now, INT32_MAX));
}

}  // namespace

absl::Status HttpClient::Available() {
  const WinHttpApi& api = WinHttp();
  if (!api.error.empty()) return absl::UnavailableError(api.error);
  return absl::OkStatus();
}

HttpClient::HttpClient() {
  (void)WinHttp();
  multi_ = new State;
}

HttpClient::~HttpClient() {
  auto* s = static_cast<State*>(multi_);
  if (s == nullptr) return;
  const WinHttpApi& api = WinHttp();
  if (api.error.empty()) {
    for (HINTERNET h : {s->request, s->connect, s->session}) {
      if (h != nullptr) api.WinHttpCloseHandle(h);
    }
  }
  if (s->abort_event != nullptr) CloseHandle(s->abort_event);
  delete s;
}

void HttpClient::Abort() {
  aborted_.store(true, std::memory_order_release);
  auto* s = static_cast<State*>(multi_);
  if (s == nullptr) return;
  SetEvent(s->abort_event);  // wakes Send() at once
  std::lock_guard<std::mutex> lock(s->mutex);
  if (s->request != nullptr) {
    // WinHTTP cancels what is pending on it (REQUEST_ERROR, HANDLE_CLOSING).
    WinHttp().WinHttpCloseHandle(s->request);
    s->request = nullptr;
  }
}

absl::StatusOr<HttpResponse> HttpClient::Send(const HttpRequest& request) {
  const WinHttpApi& api = WinHttp();
  auto* s = static_cast<State*>(multi_);
  const auto prefixed = [&](absl::string_view what) {
    return absl::StrCat(Verb(request), request.url, ": ", what);
  };
  if (!api.error.empty()) return absl::UnavailableError(prefixed(api.error));
  if (s == nullptr || s->abort_event == nullptr) {
    return absl::InternalError("WinHTTP client could not be initialized");
  }
  if (aborted_.load(std::memory_order_acquire)) {
    return absl::CancelledError(prefixed("aborted"));
  }
  if (!request.unix_socket.empty()) {
    return absl::UnimplementedError(
        "HTTP over a unix socket (unix://) is not available on Windows; use "
        "http://host:port");
  }
  absl::StatusOr<ParsedUrl> url = ParseUrl(request.url);
  if (!url.ok()) return url.status();
  const ULONGLONG deadline_ms =
      GetTickCount64() +
      static_cast<ULONGLONG>(std::max<int64_t>(
          1, absl::ToInt64Milliseconds(request.timeout)));

  // The body and the headers WinHTTP does not add itself.
  auto* ctx = new RequestContext;
  std::vector<std::string> headers = {"Accept: */*"};
  if (request.parts.empty()) {
    ctx->body = std::string(request.body);
    headers.push_back(absl::StrCat("Content-Type: ", request.content_type));
  } else {
    const std::string boundary = NewBoundary();
    ctx->body = MultipartBody(request.parts, boundary);
    headers.push_back(
        absl::StrCat("Content-Type: multipart/form-data; boundary=", boundary));
  }
  const std::string& user =
      !request.basic_auth_user.empty() ? request.basic_auth_user : url->user;
  const std::string& password = !request.basic_auth_user.empty()
                                    ? request.basic_auth_password
                                    : url->password;
  if (!user.empty()) {
    headers.push_back(absl::StrCat("Authorization: Basic ",
                                   absl::Base64Escape(absl::StrCat(user, ":", password))));
  } else if (!request.bearer_token.empty()) {
    headers.push_back(absl::StrCat("Authorization: Bearer ", request.bearer_token));
  }
  for (const std::string& h : request.headers) {
    // curl: "Name:" with nothing after it removes a header; skip it.
    const size_t colon = h.find(':');
    if (colon == std::string::npos ||
        absl::StripAsciiWhitespace(absl::string_view(h).substr(colon + 1)).empty()) {
      continue;
    }
    headers.push_back(h);
  }
  std::wstring header_block;
  for (const std::string& h : headers) {
    header_block += Wide(h);
    header_block += L"\r\n";
  }
  if (ctx->body.size() > 0xFFFFFFFFu) {
    ctx->Unref();
    return absl::InvalidArgumentError(prefixed("body larger than 4 GiB"));
  }

  // Closes the request handle (unless Abort() did) and lets go of ctx.
  const auto finish = [&] {
    {
      std::lock_guard<std::mutex> lock(s->mutex);
      if (s->request != nullptr) {
        api.WinHttpCloseHandle(s->request);
        s->request = nullptr;
      }
    }
    ctx->Unref();
  };
  const auto failed_call = [&](absl::string_view call, DWORD error) {
    finish();
    return absl::UnavailableError(
        prefixed(absl::StrCat(call, " failed: ", ErrorText(error))));
  };

  // Session, connection and request handles, under the mutex Abort() takes.
  {
    std::unique_lock<std::mutex> lock(s->mutex);
    if (s->session == nullptr) {
      s->session = api.WinHttpOpen(L"inprof/0.1.0", WINHTTP_ACCESS_TYPE_DEFAULT_PROXY,
                                   WINHTTP_NO_PROXY_NAME, WINHTTP_NO_PROXY_BYPASS,
                                   WINHTTP_FLAG_ASYNC);
      if (s->session == nullptr) {
        const DWORD error = GetLastError();
        lock.unlock();
        return failed_call("WinHttpOpen", error);
      }
      DWORD policy = WINHTTP_OPTION_REDIRECT_POLICY_NEVER;
      api.WinHttpSetOption(s->session, WINHTTP_OPTION_REDIRECT_POLICY, &policy,
                           sizeof(policy));
    }
    const std::string key =
        absl::StrCat(url->secure ? "https://" : "http://", url->host_port);
    if (s->connect == nullptr || s->connect_key != key) {
      if (s->connect != nullptr) api.WinHttpCloseHandle(s->connect);
      s->connect_key = key;
      s->connect = api.WinHttpConnect(s->session, Wide(url->host).c_str(), url->port, 0);
      if (s->connect == nullptr) {
        const DWORD error = GetLastError();
        lock.unlock();
        return failed_call("WinHttpConnect", error);
      }
    }
    s->request = api.WinHttpOpenRequest(
        s->connect, request.get ? L"GET" : L"POST", Wide(url->target).c_str(), nullptr,
        WINHTTP_NO_REFERER, WINHTTP_DEFAULT_ACCEPT_TYPES,
        url->secure ? WINHTTP_FLAG_SECURE : 0);
    if (s->request == nullptr) {
      const DWORD error = GetLastError();
      lock.unlock();
      return failed_call("WinHttpOpenRequest", error);
    }
    DWORD_PTR context = reinterpret_cast<DWORD_PTR>(ctx);
    DWORD disable = WINHTTP_DISABLE_REDIRECTS | WINHTTP_DISABLE_COOKIES;
    const int ms = std::max(1, RemainingMs(deadline_ms));  // 0 is "no limit"
    if (!api.WinHttpSetOption(s->request, WINHTTP_OPTION_CONTEXT_VALUE, &context,
                              sizeof(context))) {
      const DWORD error = GetLastError();
      lock.unlock();
      return failed_call("WinHttpSetOption(CONTEXT_VALUE)", error);
    }
    api.WinHttpSetOption(s->request, WINHTTP_OPTION_DISABLE_FEATURE, &disable,
                         sizeof(disable));
    api.WinHttpSetTimeouts(s->request, ms, ms, ms, ms);
    if (!api.WinHttpAddRequestHeaders(
            s->request, header_block.c_str(), static_cast<DWORD>(header_block.size()),
            WINHTTP_ADDREQ_FLAG_ADD | WINHTTP_ADDREQ_FLAG_REPLACE)) {
      const DWORD error = GetLastError();
      lock.unlock();
      return failed_call("WinHttpAddRequestHeaders", error);
    }
    // From here on the handle holds a reference, dropped by HANDLE_CLOSING.
    ctx->refs.fetch_add(1, std::memory_order_relaxed);
    if (api.WinHttpSetStatusCallback(
            s->request, &OnStatus,
            WINHTTP_CALLBACK_FLAG_ALL_COMPLETIONS | WINHTTP_CALLBACK_FLAG_HANDLES |
                WINHTTP_CALLBACK_FLAG_SECURE_FAILURE,
            0) == WINHTTP_INVALID_STATUS_CALLBACK) {
      ctx->refs.fetch_sub(1, std::memory_order_relaxed);
      const DWORD error = GetLastError();
      lock.unlock();
      return failed_call("WinHttpSetStatusCallback", error);
    }
    if (aborted_.load(std::memory_order_acquire)) {
      lock.unlock();
      finish();
      return absl::CancelledError(prefixed("aborted"));
    }
  }

  // Each step: start it under the mutex (the handle may be gone), then wait
  // for its callback, the deadline or Abort().
  enum class Step { kSend, kReceive, kRead };
  // Wine's WinHTTP completes the send only once the answer starts: no
  // finer phase than "no response" is reported for the first two steps.
  const auto timed_out = [&](Step step) {
    return absl::DeadlineExceededError(prefixed(absl::StrCat(
        step == Step::kRead ? "the response from " : "no response from ",
        url->host_port,
        step == Step::kRead ? " did not complete within " : " within ",
        absl::FormatDuration(request.timeout))));
  };
  // OK when the step completed; else the status Send() returns (the request
  // handle closed).
  const auto run_step = [&](Step step, DWORD* bytes_read) -> absl::Status {
    ctx->Start();
    {
      std::lock_guard<std::mutex> lock(s->mutex);
      if (s->request == nullptr) {
        // Abort() closed it.
      } else {
        BOOL started = FALSE;
        switch (step) {
          case Step::kSend:
            started = api.WinHttpSendRequest(
                s->request, WINHTTP_NO_ADDITIONAL_HEADERS, 0,
                ctx->body.empty() ? WINHTTP_NO_REQUEST_DATA : ctx->body.data(),
                static_cast<DWORD>(ctx->body.size()),
                static_cast<DWORD>(ctx->body.size()),
                reinterpret_cast<DWORD_PTR>(ctx));
            break;
          case Step::kReceive:
            started = api.WinHttpReceiveResponse(s->request, nullptr);
            break;
          case Step::kRead:
            started = api.WinHttpReadData(s->request, ctx->buffer.data(),
                                          static_cast<DWORD>(ctx->buffer.size()),
                                          nullptr);
            break;
        }
        if (!started) {
          const DWORD error = GetLastError();
          ctx->Complete(error == 0 ? ERROR_WINHTTP_INTERNAL_ERROR : error, 0);
        }
      }
    }
    const HANDLE events[2] = {ctx->done_event, s->abort_event};
    while (true) {
      if (aborted_.load(std::memory_order_acquire)) {
        finish();
        return absl::CancelledError(prefixed("aborted"));
      }
      {
        std::lock_guard<std::mutex> lock(ctx->mutex);
        if (ctx->done) break;
      }
      const int ms = RemainingMs(deadline_ms);
      if (ms == 0) {
        finish();
        return timed_out(step);
      }
      WaitForMultipleObjects(2, events, FALSE, static_cast<DWORD>(ms));
    }
    DWORD error = 0;
    DWORD secure_flags = 0;
    {
      std::lock_guard<std::mutex> lock(ctx->mutex);
      error = ctx->error;
      secure_flags = ctx->secure_flags;
      if (bytes_read != nullptr) *bytes_read = ctx->bytes_read;
    }
    if (error == 0) return absl::OkStatus();
    finish();
    if (error == ERROR_WINHTTP_OPERATION_CANCELLED &&
        aborted_.load(std::memory_order_acquire)) {
      return absl::CancelledError(prefixed("aborted"));
    }
    if (error == ERROR_WINHTTP_TIMEOUT) return timed_out(step);
    std::string what;
    switch (error) {
      case ERROR_WINHTTP_CANNOT_CONNECT:
        what = absl::StrCat("cannot connect to ", url->host_port);
        break;
      case ERROR_WINHTTP_NAME_NOT_RESOLVED:
        what = absl::StrCat("cannot resolve ", url->host);
        break;
      case ERROR_WINHTTP_SECURE_FAILURE:
      case ERROR_WINHTTP_SECURE_CHANNEL_ERROR:
      case ERROR_WINHTTP_SECURE_INVALID_CERT:
      case ERROR_WINHTTP_SECURE_INVALID_CA:
      case ERROR_WINHTTP_SECURE_CERT_CN_INVALID:
      case ERROR_WINHTTP_SECURE_CERT_DATE_INVALID:
      case ERROR_WINHTTP_SECURE_CERT_REVOKED:
      case ERROR_WINHTTP_SECURE_CERT_REV_FAILED:
      case ERROR_WINHTTP_SECURE_CERT_WRONG_USAGE:
      case ERROR_WINHTTP_CLIENT_AUTH_CERT_NEEDED:
        what = absl::StrCat("TLS handshake with ", url->host_port, " failed");
        break;
      default:
        what = absl::StrCat(step == Step::kRead ? "reading the response from "
                                                : "exchange with ",
                            url->host_port, " failed");
        break;
    }
    std::string reason = ErrorText(error);
    if (const std::string tls = SecureFailureText(secure_flags); !tls.empty()) {
      absl::StrAppend(&reason, " [", tls, "]");
    }
    return absl::UnavailableError(prefixed(absl::StrCat(what, ": ", reason)));
  };

  if (absl::Status st = run_step(Step::kSend, nullptr); !st.ok()) return st;
  if (absl::Status st = run_step(Step::kReceive, nullptr); !st.ok()) return st;

  HttpResponse response;
  {
    DWORD status = 0;
    DWORD size = sizeof(status);
    bool ok = false;
    DWORD error = 0;
    {
      std::lock_guard<std::mutex> lock(s->mutex);
      ok = s->request != nullptr &&
           api.WinHttpQueryHeaders(
               s->request, WINHTTP_QUERY_STATUS_CODE | WINHTTP_QUERY_FLAG_NUMBER,
               WINHTTP_HEADER_NAME_BY_INDEX, &status, &size, WINHTTP_NO_HEADER_INDEX);
      if (!ok) error = GetLastError();
    }
    if (!ok) {
      finish();
      if (aborted_.load(std::memory_order_acquire)) {
        return absl::CancelledError(prefixed("aborted"));
      }
      return absl::UnavailableError(prefixed(absl::StrCat(
          "no status code from ", url->host_port, ": ", ErrorText(error))));
    }
    response.status = static_cast<long>(status);
  }
  // The whole body is read (so the connection can be reused); the first
  // kMaxResponseBody bytes are kept.
  while (true) {
    DWORD n = 0;
    if (absl::Status st = run_step(Step::kRead, &n); !st.ok()) return st;
    if (n == 0) break;
    if (response.body.size() < request.max_response_body) {
      response.body.append(ctx->buffer.data(),
                           std::min<size_t>(n, request.max_response_body - response.body.size()));
    }
  }
  finish();
  return response;
}

}  // namespace inprof::internal
