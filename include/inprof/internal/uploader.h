// internal: not part of the public API.
//
// The delivery machinery the Datadog and Pyroscope sinks share: a bounded
// queue of profiles, one worker thread that POSTs them with libcurl, retries
// with exponential backoff, and logging that says one line per failure
// streak. The endpoint-specific part is a function that turns a profile into
// an HttpRequest.
//
// Thread-safety: Enqueue(), Flush(), stats() from any thread. Enqueue()
// never blocks on the network: it takes a mutex that the worker holds only
// to move queue entries.
#ifndef INPROF_INTERNAL_UPLOADER_H_
#define INPROF_INTERNAL_UPLOADER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "inprof/internal/http_client.h"
#include "inprof/options.h"
#include "inprof/sink.h"

namespace inprof {

// What an uploader did since construction.
struct UploadStats {
  uint64_t attempts = 0;           // requests sent (including retries)
  uint64_t uploaded = 0;           // profiles accepted (2xx)
  uint64_t failed_attempts = 0;    // requests that failed
  uint64_t dropped_queue_full = 0; // oldest profiles dropped for new ones
  uint64_t dropped_failed = 0;     // given up after retries / a 4xx
  uint64_t dropped_at_stop = 0;    // not delivered by Flush's deadline
};

namespace internal {

class Uploader {
 public:
  using BuildRequest = std::function<HttpRequest(const ExportedProfile&)>;

  // `name` ("datadog") and `endpoint` (a URL) appear in log lines.
  Uploader(std::string name, std::string endpoint, const UploadOptions& options,
           BuildRequest build);
  ~Uploader();  // Flush(now): aborts what is in flight
  Uploader(const Uploader&) = delete;
  Uploader& operator=(const Uploader&) = delete;

  // Queues `profile` (dropping the oldest queued one when full) and starts
  // the worker thread if needed. Never blocks on the network.
  void Enqueue(std::shared_ptr<const ExportedProfile> profile);

  // Waits until the queue is empty and nothing is in flight, or `deadline`;
  // then aborts what is left and joins the worker. DeadlineExceeded names
  // how many profiles were not delivered.
  absl::Status Flush(absl::Time deadline);

  // Forked child: the worker does not exist there; leak its state without
  // touching it.
  void Abandon();

  UploadStats stats() const;

 private:
  struct Shared;
  static void Run(Shared* s);
  static void Deliver(Shared* s, const ExportedProfile& profile);
  static void NoteFailure(Shared* s, const std::string& what,
                          const std::string& consequence);

  // Everything the worker touches, on the heap so that a forked child can
  // leak it (its mutex and condition variable may be held by a thread that
  // does not exist there).
  std::unique_ptr<Shared> shared_;
};

}  // namespace internal
}  // namespace inprof

#endif  // INPROF_INTERNAL_UPLOADER_H_
