#include "http_receiver_windows.h"

#ifndef NOMINMAX
#define NOMINMAX
#endif
#include <winsock2.h>
#include <ws2tcpip.h>
#include <windows.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace inprof::testing {
namespace {

std::string Lower(absl::string_view s) { return absl::AsciiStrToLower(s); }

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string UrlDecode(absl::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      out.push_back(' ');
    } else if (s[i] == '%' && i + 2 < s.size() && HexDigit(s[i + 1]) >= 0 &&
               HexDigit(s[i + 2]) >= 0) {
      out.push_back(static_cast<char>(HexDigit(s[i + 1]) * 16 + HexDigit(s[i + 2])));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

// A parameter of a header value: name="value" or name=value.
std::string HeaderParam(absl::string_view value, absl::string_view name) {
  for (absl::string_view piece : absl::StrSplit(value, ';')) {
    piece = absl::StripAsciiWhitespace(piece);
    const size_t eq = piece.find('=');
    if (eq == absl::string_view::npos) continue;
    if (Lower(absl::StripAsciiWhitespace(piece.substr(0, eq))) != name) continue;
    absl::string_view v = absl::StripAsciiWhitespace(piece.substr(eq + 1));
    if (v.size() >= 2 && v.front() == '"' && v.back() == '"') {
      v = v.substr(1, v.size() - 2);
    }
    return std::string(v);
  }
  return "";
}

// Winsock is started once for the process (never cleaned up: the
// receivers' sockets may outlive a test).
bool StartWinsock() {
  static const bool ok = [] {
    WSADATA data;
    return WSAStartup(MAKEWORD(2, 2), &data) == 0;
  }();
  return ok;
}

// Reads from and writes to a non-blocking socket, waiting on its event or
// the receiver's stop event (a blocking recv() is not reliably woken by
// shutdown() from another thread under Wine, and WinHTTP keeps idle
// connections open for a while).
class Connection {
 public:
  Connection(SOCKET s, HANDLE stop) : socket_(s), stop_(stop) {
    event_ = WSACreateEvent();
    WSAEventSelect(socket_, event_, FD_READ | FD_WRITE | FD_CLOSE);
  }
  ~Connection() {
    WSAEventSelect(socket_, nullptr, 0);
    WSACloseEvent(event_);
  }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  bool Fill() {
    char buf[16384];
    while (true) {
      const int n = recv(socket_, buf, sizeof(buf), 0);
      if (n > 0) {
        data_.append(buf, static_cast<size_t>(n));
        return true;
      }
      if (n == 0 || WSAGetLastError() != WSAEWOULDBLOCK || !Wait()) return false;
    }
  }
  bool SendAll(absl::string_view data) {
    while (!data.empty()) {
      const int n = send(socket_, data.data(),
                         static_cast<int>(std::min<size_t>(data.size(), 1 << 20)), 0);
      if (n > 0) {
        data.remove_prefix(static_cast<size_t>(n));
      } else if (WSAGetLastError() != WSAEWOULDBLOCK || !Wait()) {
        return false;
      }
    }
    return true;
  }
  // The first byte, without taking it.
  bool Peek(char* c) {
    if (data_.empty() && !Fill()) return false;
    *c = data_[0];
    return true;
  }
  // Up to and including "\r\n"; the line without it.
  bool Line(std::string* line) {
    while (true) {
      const size_t at = data_.find("\r\n");
      if (at != std::string::npos) {
        *line = data_.substr(0, at);
        data_.erase(0, at + 2);
        return true;
      }
      if (data_.size() > 65536 || !Fill()) return false;
    }
  }
  bool Bytes(size_t n, std::string* out) {
    while (data_.size() < n) {
      if (!Fill()) return false;
    }
    out->append(data_, 0, n);
    data_.erase(0, n);
    return true;
  }

 private:
  // False when the receiver stops.
  bool Wait() {
    const HANDLE events[2] = {event_, stop_};
    if (WaitForMultipleObjects(2, events, FALSE, INFINITE) != WAIT_OBJECT_0) {
      return false;
    }
    WSANETWORKEVENTS what{};
    WSAEnumNetworkEvents(socket_, event_, &what);  // resets the event
    return true;
  }

  SOCKET socket_;
  HANDLE stop_;
  WSAEVENT event_;
  std::string data_;
};

const char* Reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 202: return "Accepted";
    case 307: return "Temporary Redirect";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 408: return "Request Timeout";
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "Status";
  }
}

}  // namespace

std::map<std::string, std::string> ParseQuery(absl::string_view query) {
  std::map<std::string, std::string> out;
  for (absl::string_view kv : absl::StrSplit(query, '&', absl::SkipEmpty())) {
    const size_t eq = kv.find('=');
    if (eq == absl::string_view::npos) {
      out[UrlDecode(kv)] = "";
    } else {
      out[UrlDecode(kv.substr(0, eq))] = UrlDecode(kv.substr(eq + 1));
    }
  }
  return out;
}

absl::StatusOr<std::vector<FormPart>> ParseMultipart(
    absl::string_view content_type, absl::string_view body) {
  if (!absl::StartsWith(Lower(content_type), "multipart/form-data")) {
    return absl::InvalidArgumentError(
        absl::StrCat("not multipart/form-data: ", content_type));
  }
  const std::string boundary = HeaderParam(content_type, "boundary");
  if (boundary.empty()) return absl::InvalidArgumentError("no boundary");
  const std::string delimiter = "--" + boundary;
  std::vector<FormPart> parts;
  if (!absl::StartsWith(body, delimiter)) {
    return absl::InvalidArgumentError("body does not start with the boundary");
  }
  size_t at = delimiter.size();
  while (true) {
    if (body.substr(at) == "--\r\n" || body.substr(at) == "--") {
      return parts;  // closing delimiter, nothing after it
    }
    if (body.substr(at, 2) == "--") {
      return absl::InvalidArgumentError("bytes after the closing boundary");
    }
    if (body.substr(at, 2) != "\r\n") {
      return absl::InvalidArgumentError("boundary not followed by CRLF");
    }
    at += 2;
    const size_t headers_end = body.find("\r\n\r\n", at);
    if (headers_end == absl::string_view::npos) {
      return absl::InvalidArgumentError("part headers not terminated");
    }
    FormPart part;
    for (absl::string_view line :
         absl::StrSplit(body.substr(at, headers_end - at), "\r\n")) {
      const size_t colon = line.find(':');
      if (colon == absl::string_view::npos) {
        return absl::InvalidArgumentError(absl::StrCat("bad part header: ", line));
      }
      part.headers[Lower(line.substr(0, colon))] =
          std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
    }
    const std::string& disposition = part.headers["content-disposition"];
    if (!absl::StartsWith(Lower(disposition), "form-data")) {
      return absl::InvalidArgumentError("part without form-data disposition");
    }
    part.name = HeaderParam(disposition, "name");
    part.filename = HeaderParam(disposition, "filename");
    if (auto it = part.headers.find("content-type"); it != part.headers.end()) {
      part.content_type = it->second;
    }
    const size_t content = headers_end + 4;
    const size_t next = body.find("\r\n" + delimiter, content);
    if (next == absl::string_view::npos) {
      return absl::InvalidArgumentError("part not terminated by a boundary");
    }
    part.body = std::string(body.substr(content, next - content));
    parts.push_back(std::move(part));
    at = next + 2 + delimiter.size();
  }
}

absl::StatusOr<std::unique_ptr<HttpReceiver>> HttpReceiver::StartTcp() {
  if (!StartWinsock()) return absl::UnavailableError("WSAStartup failed");
  std::unique_ptr<HttpReceiver> r(new HttpReceiver);
  const SOCKET s = socket(AF_INET, SOCK_STREAM, IPPROTO_TCP);
  if (s == INVALID_SOCKET) {
    return absl::UnavailableError(absl::StrCat("socket: ", WSAGetLastError()));
  }
  r->listen_socket_ = s;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(s, 64) != 0) {
    return absl::UnavailableError(
        absl::StrCat("bind/listen 127.0.0.1: ", WSAGetLastError()));
  }
  int len = sizeof(addr);
  getsockname(s, reinterpret_cast<sockaddr*>(&addr), &len);
  r->port_ = ntohs(addr.sin_port);
  // The acceptor waits for a connection or the stop event, never polls.
  r->accept_event_ = WSACreateEvent();
  r->stop_event_ = CreateEventW(nullptr, TRUE, FALSE, nullptr);
  if (r->accept_event_ == WSA_INVALID_EVENT || r->stop_event_ == nullptr ||
      WSAEventSelect(s, r->accept_event_, FD_ACCEPT) != 0) {
    return absl::UnavailableError("WSAEventSelect failed");
  }
  r->acceptor_ = std::thread(&HttpReceiver::Serve, r.get());
  return r;
}

HttpReceiver::~HttpReceiver() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    for (uintptr_t c : connections_) shutdown(static_cast<SOCKET>(c), SD_BOTH);
  }
  cv_.notify_all();
  if (stop_event_ != nullptr) SetEvent(stop_event_);
  if (acceptor_.joinable()) acceptor_.join();
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    threads.swap(connection_threads_);
  }
  for (std::thread& t : threads) t.join();
  for (uintptr_t c : connections_) closesocket(static_cast<SOCKET>(c));
  if (listen_socket_ != INVALID_SOCKET) closesocket(static_cast<SOCKET>(listen_socket_));
  if (accept_event_ != nullptr && accept_event_ != WSA_INVALID_EVENT) {
    WSACloseEvent(accept_event_);
  }
  if (stop_event_ != nullptr) CloseHandle(stop_event_);
}

void HttpReceiver::SetStatuses(std::vector<int> statuses) {
  std::lock_guard<std::mutex> lock(mutex_);
  statuses_ = std::move(statuses);
}

void HttpReceiver::SetResponse(std::string body, std::vector<std::string> headers) {
  std::lock_guard<std::mutex> lock(mutex_);
  response_body_ = std::move(body);
  response_headers_ = std::move(headers);
}

void HttpReceiver::SetNeverAnswer(bool never) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    never_answer_ = never;
  }
  cv_.notify_all();
}

std::string HttpReceiver::url() const {
  return absl::StrCat("http://127.0.0.1:", port_);
}

std::vector<ReceivedRequest> HttpReceiver::requests() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return requests_;
}

size_t HttpReceiver::request_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return requests_.size();
}

int HttpReceiver::connection_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return connection_count_;
}

int HttpReceiver::rejected_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return rejected_count_;
}

bool HttpReceiver::WaitForRequests(size_t n, absl::Duration timeout) const {
  std::unique_lock<std::mutex> lock(mutex_);
  return cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                      [&] { return requests_.size() >= n; });
}

bool HttpReceiver::WaitForRejected(int n, absl::Duration timeout) const {
  std::unique_lock<std::mutex> lock(mutex_);
  return cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                      [&] { return rejected_count_ >= n; });
}

void HttpReceiver::Serve() {
  const SOCKET listener = static_cast<SOCKET>(listen_socket_);
  const HANDLE events[2] = {accept_event_, stop_event_};
  while (true) {
    const DWORD r = WaitForMultipleObjects(2, events, FALSE, INFINITE);
    if (r != WAIT_OBJECT_0) return;  // stop, or an error
    WSANETWORKEVENTS what{};
    WSAEnumNetworkEvents(listener, accept_event_, &what);  // resets the event
    while (true) {
      const SOCKET c = accept(listener, nullptr, nullptr);
      if (c == INVALID_SOCKET) break;  // WSAEWOULDBLOCK: all taken
      // Accepted sockets inherit the listener's event selection and its
      // non-blocking mode; Connection selects its own events.
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) {
        closesocket(c);
        return;
      }
      connections_.push_back(c);
      connection_threads_.emplace_back(&HttpReceiver::ServeConnection, this, c,
                                       ++connection_count_);
    }
  }
}

void HttpReceiver::ServeConnection(uintptr_t socket, int connection) {
  const SOCKET fd = static_cast<SOCKET>(socket);
  Connection conn(fd, stop_event_);
  while (true) {
    ReceivedRequest req;
    req.connection = connection;
    char first = 0;
    if (!conn.Peek(&first)) return;
    if (first < 'A' || first > 'Z') {
      // Not HTTP (a TLS ClientHello): hang up, as a plain server would.
      {
        std::lock_guard<std::mutex> lock(mutex_);
        ++rejected_count_;
      }
      cv_.notify_all();
      shutdown(fd, SD_BOTH);
      return;
    }
    std::string line;
    if (!conn.Line(&line)) return;
    std::vector<std::string> request_line = absl::StrSplit(line, ' ');
    if (request_line.size() != 3) return;
    req.method = request_line[0];
    req.target = request_line[1];
    const size_t q = req.target.find('?');
    req.path = req.target.substr(0, q);
    if (q != std::string::npos) req.query = ParseQuery(req.target.substr(q + 1));
    while (true) {
      if (!conn.Line(&line)) return;
      if (line.empty()) break;
      const size_t colon = line.find(':');
      if (colon == std::string::npos) return;
      req.headers[Lower(line.substr(0, colon))] =
          std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
    }
    const auto header = [&req](const char* name) {
      auto it = req.headers.find(name);
      return it == req.headers.end() ? std::string() : Lower(it->second);
    };
    if (header("expect") == "100-continue") {
      if (!conn.SendAll("HTTP/1.1 100 Continue\r\n\r\n")) return;
    }
    if (header("transfer-encoding") == "chunked") {
      while (true) {
        if (!conn.Line(&line)) return;
        size_t size = 0;
        if (!absl::SimpleHexAtoi(line.substr(0, line.find(';')), &size)) return;
        if (size == 0) {
          while (conn.Line(&line) && !line.empty()) {
          }
          break;
        }
        if (!conn.Bytes(size, &req.body) || !conn.Line(&line)) return;
      }
    } else if (auto it = req.headers.find("content-length");
               it != req.headers.end()) {
      size_t size = 0;
      if (!absl::SimpleAtoi(it->second, &size) || !conn.Bytes(size, &req.body)) {
        return;
      }
    }
    int status = 200;
    std::string body;
    std::vector<std::string> headers;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      const size_t index = requests_.size();
      status = statuses_.empty() ? 200
                                 : statuses_[std::min(index, statuses_.size() - 1)];
      requests_.push_back(std::move(req));
      cv_.notify_all();
      cv_.wait(lock, [this] { return stopping_ || !never_answer_; });
      if (stopping_) return;
      body = response_body_;
      headers = response_headers_;
    }
    std::string response = absl::StrCat(
        "HTTP/1.1 ", status, " ", Reason(status),
        "\r\nContent-Type: text/plain\r\nContent-Length: ", body.size(), "\r\n");
    for (const std::string& h : headers) absl::StrAppend(&response, h, "\r\n");
    absl::StrAppend(&response, "\r\n", body);
    if (!conn.SendAll(response)) return;
  }
}

ClosedPort::ClosedPort() {
  if (!StartWinsock()) return;
  const SOCKET s = socket(AF_INET, SOCK_STREAM, IPPROTO_TCP);
  if (s == INVALID_SOCKET) return;
  socket_ = s;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return;
  int len = sizeof(addr);
  getsockname(s, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
}

ClosedPort::~ClosedPort() {
  if (socket_ != INVALID_SOCKET) closesocket(static_cast<SOCKET>(socket_));
}

std::string ClosedPort::url() const {
  return absl::StrCat("http://127.0.0.1:", port_);
}

}  // namespace inprof::testing
