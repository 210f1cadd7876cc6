// internal: not part of the public API.
//
// What `inprof run` is told (INPROF_RUN_REPORT): one line per event of each
// profiled process, and the file sink that adds a line for each profile it
// writes. Used by the automatic profiler (auto_profiler_linux.cc).
//
// Thread-safety: AppendToReport may be called from any thread (one write(2)
// per line); ReportingFileSink takes its own lock. Neither from a signal
// handler.
#ifndef INPROF_RUN_RUN_REPORT_H_
#define INPROF_RUN_RUN_REPORT_H_

#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "inprof/sink.h"

namespace inprof::run {

// Appends "FIRST\tPID\tCOMM[\tDETAIL]\n" to INPROF_RUN_REPORT (`report`;
// nothing when empty): FIRST is a profile's path, or "started" (this
// process began sampling), "off" (it could not; DETAIL says why) or
// "failed" (writing its profile failed, DETAIL, logged already), so that
// `inprof run` can say which processes ended without writing one.
void AppendToReport(const std::string& report, absl::string_view first,
                    absl::string_view detail = {});

// Appends each written profile to INPROF_RUN_REPORT and writes the file
// like FileSink.
// The output pattern is set at each Start() (the gperftools API names a file
// per run); the exporter's thread reads it under the sink's own lock.
class ReportingFileSink final : public ProfileSink {
 public:
  explicit ReportingFileSink(std::string report) : report_(std::move(report)) {}
  absl::string_view name() const override { return "file"; }
  void SetPattern(const std::string& pattern) {
    std::lock_guard<std::mutex> lock(mu_);
    file_ = std::make_unique<FileSink>(pattern);
  }
  absl::Status Consume(std::shared_ptr<const ExportedProfile> p) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (file_ == nullptr) return absl::OkStatus();
    absl::Status s = file_->Consume(p);
    if (s.ok()) AppendToReport(report_, file_->last_path());
    return s;
  }

 private:
  std::mutex mu_;
  std::unique_ptr<FileSink> file_;
  std::string report_;
};

}  // namespace inprof::run

#endif  // INPROF_RUN_RUN_REPORT_H_
