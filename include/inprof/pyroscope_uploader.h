// inprof/pyroscope_uploader.h: sends profiles to Grafana Pyroscope.
//
// Defines PyroscopeUploader, a ProfileSink that POSTs each gzip-compressed
// pprof as the body of
//   {url}/ingest?name=<app{tags}>&from=<s>&until=<s>&format=pprof
//               &spyName=inprof&sampleRate=<Hz>
// with optional basic authentication, a bearer token and X-Scope-OrgID (a
// multi-tenant Pyroscope or Grafana Cloud). A window with allocation types
// (alloc_*, inuse_*) goes as two uploads: its other types as above, and the
// allocation types as a multipart form (fields "profile" and
// "sample_type_config", without format=pprof), period type space/bytes, so
// that Pyroscope files them under "memory", as Go's heap profiles, and takes
// alloc_* as what the window allocated, not as a running total. Delivery runs on its own thread
// with a bounded queue, timeouts and retries (UploadOptions).
//
// Thread-safety: as ProfileSink (sink.h); stats() from any thread.
//
// Example:
//   inprof::Options options;
//   options.pyroscope.url = "http://localhost:4040";
//   options.pyroscope.application_name = "checkout{region=eu}";
//   inprof::DefaultProfiler profiler(options);  // uploads every 60 s
#ifndef INPROF_PYROSCOPE_UPLOADER_H_
#define INPROF_PYROSCOPE_UPLOADER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "inprof/internal/uploader.h"
#include "inprof/options.h"
#include "inprof/sink.h"

namespace inprof {

class PyroscopeUploader final : public ProfileSink {
 public:
  // `cpu_period` gives sampleRate (samples per second of CPU);
  // `alloc_period` (Options::alloc_period) the allocation part's period.
  PyroscopeUploader(const PyroscopeOptions& pyroscope,
                    const UploadOptions& upload, absl::Duration cpu_period,
                    uint64_t alloc_period = 0);

  absl::string_view name() const override { return "pyroscope"; }
  // Queues the profile; never blocks on the network.
  absl::Status Consume(std::shared_ptr<const ExportedProfile> profile) override;
  absl::Status Flush(absl::Time deadline) override;
  void Abandon() override;

  // Counts requests' profiles: a window with allocation types is two.
  UploadStats stats() const { return uploader_->stats(); }

  // The application name sent, tags included ("app{k=v}").
  const std::string& application_name() const { return name_; }

  // The ingest URL for a profile of [start, end).
  std::string IngestUrl(absl::Time start, absl::Time end) const;

 private:
  std::string base_url_;
  std::string name_;
  int64_t sample_rate_ = 100;
  uint64_t alloc_period_ = 0;
  std::unique_ptr<internal::Uploader> uploader_;
};

}  // namespace inprof

#endif  // INPROF_PYROSCOPE_UPLOADER_H_
