// tests/upload/http_receiver.h: a local HTTP/1.1 receiver for the upload tests.
//
// Defines HttpReceiver, a test double of an intake (a Datadog agent, a
// Pyroscope server) on 127.0.0.1 or a unix socket, written on plain sockets:
// it records each request (method, path, decoded query, headers, body,
// chunked or not) and answers with scripted status codes, or never answers.
// Also the parsers a real intake applies: multipart/form-data parts and URL
// query strings; and ClosedPort, an address where nothing listens.
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
#ifndef INPROF_TESTS_HTTP_RECEIVER_H_
#define INPROF_TESTS_HTTP_RECEIVER_H_

#include <atomic>
#include <condition_variable>
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
  // Listens on a unix socket at `path` (replaced if present).
  static absl::StatusOr<std::unique_ptr<HttpReceiver>> StartUnix(
      const std::string& path);
  ~HttpReceiver();

  // Status codes for successive requests; the last one repeats. Default:
  // {200}.
  void SetStatuses(std::vector<int> statuses);
  // True: record requests but hold the answers, until destruction or until
  // set back to false (then the held requests are answered).
  void SetNeverAnswer(bool never);

  // http://127.0.0.1:<port> (TCP) or unix://<path>.
  std::string url() const;
  std::vector<ReceivedRequest> requests() const;
  size_t request_count() const;
  // Waits until at least `n` requests arrived; false on timeout.
  bool WaitForRequests(size_t n, absl::Duration timeout) const;

 private:
  HttpReceiver() = default;
  void Serve();
  void ServeConnection(int fd);

  int listen_fd_ = -1;
  int wake_pipe_[2] = {-1, -1};
  std::string url_;
  std::string unix_path_;
  std::thread acceptor_;

  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
  std::vector<ReceivedRequest> requests_;
  std::vector<int> statuses_ = {200};
  bool never_answer_ = false;
  bool stopping_ = false;
  std::vector<int> connections_;
  std::vector<std::thread> connection_threads_;
};

// A gzip-compressed pprof of one CPU sample in TestProfileLeaf() (a function
// of the test binary, so pprof names it), covering [start, end). with_heap:
// the allocation provider's four types too (Go's names), the sample
// {3, 30 ms, 5 objects, 5,000 bytes, 2 objects, 2,000 bytes}. with_locks:
// the lock-wait provider's two after them (contentions 4, delay 8 ms), and
// the thread named "delay", a string the sample type shares.
std::string MakeTestPprof(absl::Time start, absl::Time end, bool with_heap = false,
                          bool with_locks = false);
// The function MakeTestPprof's sample is in.
void TestProfileLeaf();

// Captures inprof's log lines (from any thread) while alive.
class LogCapture {
 public:
  LogCapture();
  ~LogCapture();
  std::vector<std::string> lines() const;
  // Lines that contain `text`.
  size_t Count(absl::string_view text) const;
};

// A TCP port on 127.0.0.1 where connections are refused (bound, not
// listening, so no one else takes it while the test runs).
class ClosedPort {
 public:
  ClosedPort();
  ~ClosedPort();
  std::string url() const;

 private:
  int fd_ = -1;
  int port_ = 0;
};

}  // namespace inprof::testing

#endif  // INPROF_TESTS_HTTP_RECEIVER_H_
