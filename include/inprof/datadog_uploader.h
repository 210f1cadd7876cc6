// inprof/datadog_uploader.h: sends profiles to a Datadog agent.
//
// Defines DatadogUploader, a ProfileSink that POSTs each profile to
// {agent}/profiling/v1/input the way Datadog's native profilers do: a
// multipart/form-data body with an "event" part (event.json: attachments,
// tags_profiler, start, end, family "native", version "4") and the
// gzip-compressed pprof as "profile.pprof", plus DD-EVP-ORIGIN headers. The
// agent may be reached over TCP (http://host:8126) or a unix socket
// (unix:///var/run/datadog/apm.socket). Delivery runs on its own thread with
// a bounded queue, timeouts and retries (UploadOptions).
//
// Thread-safety: as ProfileSink (sink.h); stats() from any thread.
//
// Example:
//   inprof::Options options;
//   options.datadog.enabled = true;       // or DD_AGENT_HOST=... in the env
//   options.datadog.service = "checkout";
//   inprof::DefaultProfiler profiler(options);  // uploads every 60 s
#ifndef INPROF_DATADOG_UPLOADER_H_
#define INPROF_DATADOG_UPLOADER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "inprof/internal/uploader.h"
#include "inprof/options.h"
#include "inprof/sink.h"

namespace inprof {

class DatadogUploader final : public ProfileSink {
 public:
  // The profiler's version, as tags and headers report it.
  static constexpr absl::string_view kProfilerVersion = "0.1.0";

  DatadogUploader(const DatadogOptions& datadog, const UploadOptions& upload);

  absl::string_view name() const override { return "datadog"; }
  // Queues the profile; never blocks on the network.
  absl::Status Consume(std::shared_ptr<const ExportedProfile> profile) override;
  absl::Status Flush(absl::Time deadline) override;
  void Abandon() override;

  UploadStats stats() const { return uploader_->stats(); }

  // Where profiles go: http(s)://.../profiling/v1/input (for a unix socket
  // agent, http://localhost/... through unix_socket()).
  const std::string& intake_url() const { return url_; }
  const std::string& unix_socket() const { return unix_socket_; }
  // service:..., env:..., version:..., DD_TAGS, language:native,
  // profiler_version:..., runtime-id:..., host:... in that order.
  const std::vector<std::string>& tags() const { return tags_; }

  // The event.json part for a profile of [start, end).
  static std::string EventJson(const std::vector<std::string>& tags,
                               absl::Time start, absl::Time end);

  // RFC 3339 in UTC with nanoseconds: 2024-01-02T03:04:05.123456789Z.
  static std::string Rfc3339(absl::Time t);

 private:
  std::string url_;
  std::string unix_socket_;
  std::vector<std::string> tags_;
  std::unique_ptr<internal::Uploader> uploader_;
};

}  // namespace inprof

#endif  // INPROF_DATADOG_UPLOADER_H_
