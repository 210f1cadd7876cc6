#include "inprof/internal/uploader.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "inprof/base/log.h"
#include "inprof/base/platform.h"
#include "inprof/base/profiler_thread.h"

namespace inprof::internal {
namespace {

// Longest wait between two attempts (the default export period: waiting
// longer only lets the queue overflow).
constexpr absl::Duration kMaxBackoff = absl::Seconds(60);

std::chrono::steady_clock::time_point SteadyDeadline(absl::Time deadline) {
  const absl::Duration left =
      std::max(deadline - absl::Now(), absl::ZeroDuration());
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
             absl::ToChronoNanoseconds(std::min(left, absl::Hours(24 * 365))));
}

// The first line of an error page, printable and short, for a log line.
std::string Excerpt(absl::string_view body) {
  body = absl::StripAsciiWhitespace(body.substr(0, body.find('\n')));
  std::string out;
  for (char c : body.substr(0, 160)) {
    out.push_back(absl::ascii_isprint(static_cast<unsigned char>(c)) ? c : '?');
  }
  return out;
}

bool Retryable(long status) {
  return status >= 500 || status == 408 || status == 429;
}

}  // namespace

struct Uploader::Shared {
  Shared(std::string n, std::string e, const UploadOptions& o, BuildRequest b)
      : name(std::move(n)), endpoint(std::move(e)), options(o),
        build(std::move(b)) {}

  const std::string name;
  const std::string endpoint;
  const UploadOptions options;
  const BuildRequest build;

  std::mutex mutex;
  std::condition_variable cv;
  std::deque<std::shared_ptr<const ExportedProfile>> queue;
  ProfilerThread worker;
  std::unique_ptr<HttpClient> client;  // lives while `worker` does
  bool closing = false;   // Flush: exit once the queue is empty
  bool abort = false;     // Flush's deadline passed: drop everything
  bool finished = false;  // the worker has left its loop
  UploadStats stats;
  bool failing = false;   // a failure streak is on (it was logged)
  uint64_t streak_failures = 0;
  bool logged_queue_full = false;
};

Uploader::Uploader(std::string name, std::string endpoint,
                   const UploadOptions& options, BuildRequest build)
    : shared_(std::make_unique<Shared>(std::move(name), std::move(endpoint),
                                       options, std::move(build))) {}

Uploader::~Uploader() {
  if (shared_ != nullptr) Flush(absl::InfinitePast()).IgnoreError();
}

void Uploader::Enqueue(std::shared_ptr<const ExportedProfile> profile) {
  Shared* s = shared_.get();
  if (s == nullptr) return;
  std::lock_guard<std::mutex> lock(s->mutex);
  if (s->queue.size() >= static_cast<size_t>(s->options.max_queued)) {
    s->queue.pop_front();
    ++s->stats.dropped_queue_full;
    if (!s->logged_queue_full) {
      s->logged_queue_full = true;
      Log(absl::StrCat(s->name, " upload to ", s->endpoint,
                       " is not keeping up: ", s->options.max_queued,
                       " profiles are waiting; dropping the oldest (further "
                       "drops are counted, not logged)"));
    }
  }
  s->queue.push_back(std::move(profile));
  if (!s->worker.joinable()) {
    s->closing = s->abort = s->finished = false;
    s->client = std::make_unique<HttpClient>();
    s->worker = ProfilerThread([s] { Uploader::Run(s); });
  }
  s->cv.notify_all();
}

absl::Status Uploader::Flush(absl::Time deadline) {
  Shared* s = shared_.get();
  if (s == nullptr) return absl::OkStatus();
  std::unique_lock<std::mutex> lock(s->mutex);
  if (!s->worker.joinable()) return absl::OkStatus();
  const uint64_t dropped_before = s->stats.dropped_at_stop;
  s->closing = true;
  s->cv.notify_all();
  if (!s->cv.wait_until(lock, SteadyDeadline(deadline),
                        [s] { return s->finished; })) {
    s->abort = true;
    s->client->Abort();  // the request in flight returns within ms
    s->cv.notify_all();
  }
  ProfilerThread worker = std::move(s->worker);
  lock.unlock();
  worker.join();
  lock.lock();
  s->client.reset();
  const uint64_t not_delivered = s->stats.dropped_at_stop - dropped_before;
  if (not_delivered > 0) {
    return absl::DeadlineExceededError(absl::StrCat(
        s->name, ": ", not_delivered, " profile(s) not delivered to ",
        s->endpoint, " before the stop timeout"));
  }
  return absl::OkStatus();
}

void Uploader::Abandon() {
  // Leaked, never destroyed or detached (see Pipeline::AbandonCollector).
  (void)shared_.release();
}

UploadStats Uploader::stats() const {
  if (shared_ == nullptr) return {};
  std::lock_guard<std::mutex> lock(shared_->mutex);
  return shared_->stats;
}

void Uploader::Run(Shared* s) {
  SetCurrentThreadName("inprof-upload");
  std::unique_lock<std::mutex> lock(s->mutex);
  while (true) {
    s->cv.wait(lock, [s] { return s->abort || s->closing || !s->queue.empty(); });
    if (s->abort || s->queue.empty()) break;
    std::shared_ptr<const ExportedProfile> profile = std::move(s->queue.front());
    s->queue.pop_front();
    lock.unlock();
    Deliver(s, *profile);
    profile.reset();
    lock.lock();
  }
  s->stats.dropped_at_stop += s->queue.size();
  s->queue.clear();
  s->finished = true;
  s->cv.notify_all();
}

void Uploader::NoteFailure(Shared* s, const std::string& what,
                           const std::string& consequence) {
  ++s->stats.failed_attempts;
  ++s->streak_failures;
  if (s->failing) return;
  s->failing = true;
  Log(absl::StrCat(s->name, " upload to ", s->endpoint, " failed: ", what,
                   "; ", consequence,
                   " (further failures are not logged until an upload "
                   "succeeds)"));
}

void Uploader::Deliver(Shared* s, const ExportedProfile& profile) {
  const int max_attempts = 1 + s->options.max_retries;
  absl::Duration backoff = s->options.backoff;
  for (int attempt = 1;; ++attempt) {
    {
      std::lock_guard<std::mutex> lock(s->mutex);
      if (s->abort) {
        ++s->stats.dropped_at_stop;
        return;
      }
      ++s->stats.attempts;
    }
    const HttpRequest request = s->build(profile);
    absl::StatusOr<HttpResponse> response = s->client->Send(request);

    std::unique_lock<std::mutex> lock(s->mutex);
    if (response.ok() && response->status >= 200 && response->status < 300) {
      ++s->stats.uploaded;
      if (s->failing) {
        Log(absl::StrCat(s->name, " upload to ", s->endpoint,
                         " works again after ", s->streak_failures,
                         " failed attempt(s)"));
      }
      s->failing = false;
      s->streak_failures = 0;
      return;
    }
    if (s->abort || (!response.ok() && absl::IsCancelled(response.status()))) {
      ++s->stats.dropped_at_stop;
      return;
    }
    std::string what;
    bool retryable = true;
    if (!response.ok()) {
      what = std::string(response.status().message());
      // The HTTP library cannot be loaded (HttpClient::Send): no retry can
      // succeed.
      retryable = !absl::IsFailedPrecondition(response.status());
      if (absl::IsDeadlineExceeded(response.status())) {
        absl::StrAppend(&what, " (INPROF_UPLOAD_TIMEOUT=",
                        absl::FormatDuration(s->options.timeout), ")");
      }
    } else {
      what = absl::StrCat("HTTP ", response->status);
      const std::string excerpt = Excerpt(response->body);
      if (!excerpt.empty()) absl::StrAppend(&what, " '", excerpt, "'");
      retryable = Retryable(response->status);
    }
    if (!retryable) {
      NoteFailure(s, what, response.ok() ? "profile dropped, not retried (the "
                                           "endpoint rejected it)"
                                         : "profile dropped, not retried");
      ++s->stats.dropped_failed;
      return;
    }
    if (attempt >= max_attempts) {
      NoteFailure(s, what, absl::StrCat("profile dropped after ", attempt,
                                        attempt == 1 ? " attempt" : " attempts"));
      ++s->stats.dropped_failed;
      return;
    }
    NoteFailure(s, what, absl::StrCat("retrying up to ", max_attempts - attempt,
                                      " more times with backoff from ",
                                      absl::FormatDuration(backoff)));
    const auto wake = std::chrono::steady_clock::now() +
                      std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                          absl::ToChronoNanoseconds(backoff));
    if (s->cv.wait_until(lock, wake, [s] { return s->abort; })) {
      ++s->stats.dropped_at_stop;
      return;
    }
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
}

}  // namespace inprof::internal
