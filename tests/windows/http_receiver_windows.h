// tests/windows/http_receiver_windows.h: a local HTTP/1.1 receiver on
// Winsock for the Windows upload tests (tests/upload/http_receiver.h's
// counterpart, which is written on POSIX sockets).
//
// Defines HttpReceiver, a test double of an intake (a Datadog agent, a
// Pyroscope server) on 127.0.0.1: it records each request (method, path,
// decoded query, headers, body) and answers with scripted status codes and
// body, or never answers. A connection that does not start with an HTTP
// request line (a TLS ClientHello) is counted and closed. Also the parsers a
// real intake applies: multipart/form-data parts and URL query strings; and
// ClosedPort, an address where nothing listens.
//
// Thread-safety: the receiver serves on its own threads; its methods may be
// called from any thread.
//
// Example:
//   auto receiver = inprof::testing::HttpReceiver::StartTcp();
//   (*receiver)->SetStatuses({500, 200});
//   ... upload to (*receiver)->url() ...
//   ASSERT_TRUE((*receiver)->WaitForRequests(2, absl::Seconds(10)));
//   auto parts = ParseMultipart(req.headers["content-type"], req.body);
#ifndef INPROF_TESTS_WINDOWS_HTTP_RECEIVER_WINDOWS_H_
#define INPROF_TESTS_WINDOWS_HTTP_RECEIVER_WINDOWS_H_

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace inprof::testing {

struct ReceivedRequest {
  std::string method;  // "POST"
  std::string target;  // as sent: /ingest?name=...
  std::string path;    // target without the query
  std::map<std::string, std::string> query;    // decoded
  std::map<std::string, std::string> headers;  // names in lower case
  std::string body;                            // de-chunked
  int connection = 0;  // which accepted connection (1, 2, ...) carried it
};

// One part of a multipart/form-data body.
struct FormPart {
  std::map<std::string, std::string> headers;  // names in lower case
  std::string name;          // from Content-Disposition
  std::string filename;      // from Content-Disposition; empty if none
  std::string content_type;  // the part's Content-Type
  std::string body;
};

// Splits a multipart/form-data body as a server does (RFC 7578), using the
// boundary from `content_type`. Fails on a malformed body.
absl::StatusOr<std::vector<FormPart>> ParseMultipart(
    absl::string_view content_type, absl::string_view body);

// Decodes "a=1&b=x%20y" (+ as space).
std::map<std::string, std::string> ParseQuery(absl::string_view query);

class HttpReceiver {
 public:
  // Listens on 127.0.0.1 on a free port.
  static absl::StatusOr<std::unique_ptr<HttpReceiver>> StartTcp();
  ~HttpReceiver();
  HttpReceiver(const HttpReceiver&) = delete;
  HttpReceiver& operator=(const HttpReceiver&) = delete;

  // Status codes for successive requests; the last one repeats. Default:
  // {200}.
  void SetStatuses(std::vector<int> statuses);
  // The body of every answer (default: empty) and extra header lines
  // ("Name: value") in it.
  void SetResponse(std::string body, std::vector<std::string> headers = {});
  // True: record requests but hold the answers, until destruction or until
  // set back to false (then the held requests are answered).
  void SetNeverAnswer(bool never);

  // http://127.0.0.1:<port>
  std::string url() const;
  int port() const { return port_; }
  std::vector<ReceivedRequest> requests() const;
  size_t request_count() const;
  // Connections accepted, and those closed for not speaking HTTP.
  int connection_count() const;
  int rejected_count() const;
  // Waits until at least `n` requests arrived; false on timeout.
  bool WaitForRequests(size_t n, absl::Duration timeout) const;
  // Waits until at least `n` connections were rejected; false on timeout.
  bool WaitForRejected(int n, absl::Duration timeout) const;

 private:
  HttpReceiver() = default;
  void Serve();
  void ServeConnection(uintptr_t socket, int connection);

  uintptr_t listen_socket_ = ~uintptr_t{0};  // SOCKET
  void* accept_event_ = nullptr;             // WSAEVENT
  void* stop_event_ = nullptr;               // HANDLE
  int port_ = 0;
  std::thread acceptor_;

  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
  std::vector<ReceivedRequest> requests_;
  std::vector<int> statuses_ = {200};
  std::string response_body_;
  std::vector<std::string> response_headers_;
  bool never_answer_ = false;
  bool stopping_ = false;
  int connection_count_ = 0;
  int rejected_count_ = 0;
  std::vector<uintptr_t> connections_;
  std::vector<std::thread> connection_threads_;
};

// A TCP port on 127.0.0.1 where connections are refused (bound, not
// listening, so no one else takes it while the test runs).
class ClosedPort {
 public:
  ClosedPort();
  ~ClosedPort();
  ClosedPort(const ClosedPort&) = delete;
  ClosedPort& operator=(const ClosedPort&) = delete;
  int port() const { return port_; }
  std::string url() const;  // http://127.0.0.1:<port>

 private:
  uintptr_t socket_ = ~uintptr_t{0};
  int port_ = 0;
};

}  // namespace inprof::testing

#endif  // INPROF_TESTS_WINDOWS_HTTP_RECEIVER_WINDOWS_H_
