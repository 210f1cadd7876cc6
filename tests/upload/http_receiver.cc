#include "upload/http_receiver.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "inprof/base/log.h"
#include "inprof/pprof_writer.h"
#include "inprof/symbolizer.h"

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

// Reads from a socket with a buffer; false when the peer closed.
class Reader {
 public:
  explicit Reader(int fd) : fd_(fd) {}
  bool Fill() {
    char buf[16384];
    const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
    if (n <= 0) return false;
    data_.append(buf, static_cast<size_t>(n));
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
      if (!Fill()) return false;
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
  int fd_;
  std::string data_;
};

bool SendAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

const char* Reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 202: return "Accepted";
    case 400: return "Bad Request";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
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
  size_t at = body.find(delimiter);
  if (at == absl::string_view::npos) {
    return absl::InvalidArgumentError("no opening boundary");
  }
  at += delimiter.size();
  while (true) {
    if (body.substr(at, 2) == "--") return parts;  // closing delimiter
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
  std::unique_ptr<HttpReceiver> r(new HttpReceiver);
  r->listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (r->listen_fd_ < 0) return absl::ErrnoToStatus(errno, "socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (bind(r->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(r->listen_fd_, 64) != 0) {
    return absl::ErrnoToStatus(errno, "bind/listen 127.0.0.1");
  }
  socklen_t len = sizeof(addr);
  getsockname(r->listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  r->url_ = absl::StrCat("http://127.0.0.1:", ntohs(addr.sin_port));
  if (pipe2(r->wake_pipe_, O_CLOEXEC) != 0) return absl::ErrnoToStatus(errno, "pipe");
  r->acceptor_ = std::thread(&HttpReceiver::Serve, r.get());
  return r;
}

absl::StatusOr<std::unique_ptr<HttpReceiver>> HttpReceiver::StartUnix(
    const std::string& path) {
  std::unique_ptr<HttpReceiver> r(new HttpReceiver);
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("path too long: ", path));
  }
  unlink(path.c_str());
  r->listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (r->listen_fd_ < 0) return absl::ErrnoToStatus(errno, "socket");
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (bind(r->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(r->listen_fd_, 64) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("bind/listen ", path));
  }
  r->unix_path_ = path;
  r->url_ = absl::StrCat("unix://", path);
  if (pipe2(r->wake_pipe_, O_CLOEXEC) != 0) return absl::ErrnoToStatus(errno, "pipe");
  r->acceptor_ = std::thread(&HttpReceiver::Serve, r.get());
  return r;
}

HttpReceiver::~HttpReceiver() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    for (int fd : connections_) shutdown(fd, SHUT_RDWR);
  }
  cv_.notify_all();
  if (wake_pipe_[1] >= 0) {
    const char c = 'x';
    (void)!write(wake_pipe_[1], &c, 1);
  }
  if (acceptor_.joinable()) acceptor_.join();
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    threads.swap(connection_threads_);
  }
  for (std::thread& t : threads) t.join();
  for (int fd : connections_) close(fd);
  if (listen_fd_ >= 0) close(listen_fd_);
  for (int fd : wake_pipe_) {
    if (fd >= 0) close(fd);
  }
  if (!unix_path_.empty()) unlink(unix_path_.c_str());
}

void HttpReceiver::SetStatuses(std::vector<int> statuses) {
  std::lock_guard<std::mutex> lock(mutex_);
  statuses_ = std::move(statuses);
}

void HttpReceiver::SetNeverAnswer(bool never) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    never_answer_ = never;
  }
  cv_.notify_all();
}

std::string HttpReceiver::url() const { return url_; }

std::vector<ReceivedRequest> HttpReceiver::requests() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return requests_;
}

size_t HttpReceiver::request_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return requests_.size();
}

bool HttpReceiver::WaitForRequests(size_t n, absl::Duration timeout) const {
  std::unique_lock<std::mutex> lock(mutex_);
  return cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                      [&] { return requests_.size() >= n; });
}

void HttpReceiver::Serve() {
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_pipe_[0], POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) {
      close(fd);
      return;
    }
    connections_.push_back(fd);
    connection_threads_.emplace_back(&HttpReceiver::ServeConnection, this, fd);
  }
}

void HttpReceiver::ServeConnection(int fd) {
  Reader reader(fd);
  while (true) {
    ReceivedRequest req;
    std::string line;
    if (!reader.Line(&line)) return;
    std::vector<std::string> request_line = absl::StrSplit(line, ' ');
    if (request_line.size() != 3) return;
    req.method = request_line[0];
    req.target = request_line[1];
    const size_t q = req.target.find('?');
    req.path = req.target.substr(0, q);
    if (q != std::string::npos) req.query = ParseQuery(req.target.substr(q + 1));
    while (true) {
      if (!reader.Line(&line)) return;
      if (line.empty()) break;
      const size_t colon = line.find(':');
      if (colon == std::string::npos) return;
      req.headers[Lower(line.substr(0, colon))] =
          std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
    }
    if (Lower(req.headers["expect"]) == "100-continue") {
      if (!SendAll(fd, "HTTP/1.1 100 Continue\r\n\r\n")) return;
    }
    if (Lower(req.headers["transfer-encoding"]) == "chunked") {
      while (true) {
        if (!reader.Line(&line)) return;
        size_t size = 0;
        if (!absl::SimpleHexAtoi(line.substr(0, line.find(';')), &size)) return;
        if (size == 0) {
          while (reader.Line(&line) && !line.empty()) {
          }
          break;
        }
        if (!reader.Bytes(size, &req.body) || !reader.Line(&line)) return;
      }
    } else if (auto it = req.headers.find("content-length");
               it != req.headers.end()) {
      size_t size = 0;
      if (!absl::SimpleAtoi(it->second, &size) || !reader.Bytes(size, &req.body)) {
        return;
      }
    }
    int status = 200;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      const size_t index = requests_.size();
      status = statuses_.empty() ? 200
                                 : statuses_[std::min(index, statuses_.size() - 1)];
      requests_.push_back(std::move(req));
      cv_.notify_all();
      cv_.wait(lock, [this] { return stopping_ || !never_answer_; });
      if (stopping_) return;
    }
    const std::string body =
        status < 300 ? "" : absl::StrCat("receiver says ", status, "\n");
    const std::string response = absl::StrCat(
        "HTTP/1.1 ", status, " ", Reason(status),
        "\r\nContent-Type: text/plain\r\nContent-Length: ", body.size(),
        "\r\n\r\n", body);
    if (!SendAll(fd, response)) return;
  }
}

__attribute__((noinline)) void TestProfileLeaf() {
  asm volatile("nop; nop; nop; nop; nop; nop; nop; nop");
}

std::string MakeTestPprof(absl::Time start, absl::Time end, bool with_heap,
                          bool with_locks) {
  ProfileData data;
  data.sample_types = {{"cpu-samples", "count"}, {"cpu-time", "nanoseconds"}};
  if (with_heap) {
    data.sample_types.insert(data.sample_types.end(), {{"alloc_objects", "count"},
                                                       {"alloc_space", "bytes"},
                                                       {"inuse_objects", "count"},
                                                       {"inuse_space", "bytes"}});
  }
  if (with_locks) {
    data.sample_types.insert(data.sample_types.end(),
                             {{"contentions", "count"}, {"delay", "nanoseconds"}});
  }
  data.period_type = {"cpu-time", "nanoseconds"};
  data.period = 10'000'000;
  data.time_nanos = absl::ToUnixNanos(start);
  data.duration_nanos = absl::ToInt64Nanoseconds(end - start);
  ThreadIdentity thread;
  thread.tid = 42;
  thread.name = with_locks ? "delay" : "worker";
  data.threads.push_back(thread);
  ProfileSample sample;
  sample.thread = 0;
  sample.frames = {reinterpret_cast<uint64_t>(&TestProfileLeaf) + 2};
  sample.values = {3, 30'000'000};
  if (with_heap) sample.values.insert(sample.values.end(), {5, 5'000, 2, 2'000});
  if (with_locks) sample.values.insert(sample.values.end(), {4, 8'000'000});
  data.samples.push_back(std::move(sample));
  Symbolizer symbolizer;
  absl::StatusOr<std::string> encoded = EncodePprof(data, symbolizer);
  if (!encoded.ok()) return "";
  absl::StatusOr<std::string> gz = GzipCompress(*encoded);
  return gz.ok() ? *gz : "";
}

namespace {
std::mutex g_log_mutex;
std::vector<std::string>* g_log_lines = nullptr;
void CaptureLine(absl::string_view line) {
  std::lock_guard<std::mutex> lock(g_log_mutex);
  if (g_log_lines != nullptr) g_log_lines->emplace_back(line);
}
}  // namespace

LogCapture::LogCapture() {
  std::lock_guard<std::mutex> lock(g_log_mutex);
  g_log_lines = new std::vector<std::string>;
  internal::SetLogSinkForTesting(&CaptureLine);
}

LogCapture::~LogCapture() {
  internal::SetLogSinkForTesting(nullptr);
  std::lock_guard<std::mutex> lock(g_log_mutex);
  delete g_log_lines;
  g_log_lines = nullptr;
}

std::vector<std::string> LogCapture::lines() const {
  std::lock_guard<std::mutex> lock(g_log_mutex);
  return g_log_lines != nullptr ? *g_log_lines : std::vector<std::string>{};
}

size_t LogCapture::Count(absl::string_view text) const {
  size_t n = 0;
  for (const std::string& line : lines()) n += absl::StrContains(line, text);
  return n;
}

ClosedPort::ClosedPort() {
  fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd_ >= 0 && bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    socklen_t len = sizeof(addr);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
  }
}

ClosedPort::~ClosedPort() {
  if (fd_ >= 0) close(fd_);
}

std::string ClosedPort::url() const {
  return absl::StrCat("http://127.0.0.1:", port_);
}

}  // namespace inprof::testing
