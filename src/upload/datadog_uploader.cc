#include "inprof/datadog_uploader.h"

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "inprof/internal/upload_util.h"
#include "inprof/pprof_reader.h"

namespace inprof {
namespace {

// The allocation and lock-wait providers' sample types under the names
// Datadog's intake gives them (ddprof's, libdatadog's): Go's names
// (alloc_objects, ...) are what pprof and Pyroscope read, and are kept in
// the files and the other uploads. Empty: the profile has none of them (or
// could not be read), and goes as it is.
std::string DatadogNamed(const std::string& pprof) {
  static const std::vector<std::pair<std::string_view, std::string_view>> kNames = {
      {"alloc_objects", "alloc-samples"},
      {"alloc_space", "alloc-space"},
      {"inuse_objects", "inuse-objects"},
      {"inuse_space", "inuse-space"},
      // The lock-wait provider's (Go's mutex profile names), as Datadog's
      // profilers for other languages name lock waits.
      {"contentions", "lock-acquire"},
      {"delay", "lock-acquire-wait"},
  };
  absl::StatusOr<std::optional<std::string>> named = RenamePprofStrings(pprof, kNames);
  if (!named.ok() || !named->has_value()) return {};
  return std::move(**named);
}

// tags_profiler is comma-separated: a comma inside a tag would split it.
std::string Tag(absl::string_view key, absl::string_view value) {
  return absl::StrReplaceAll(absl::StrCat(key, ":", value), {{",", "_"}});
}

}  // namespace

DatadogUploader::DatadogUploader(const DatadogOptions& datadog,
                                 const UploadOptions& upload) {
  absl::string_view agent = datadog.agent_url;
  if (absl::ConsumePrefix(&agent, "unix://")) {
    unix_socket_ = std::string(agent);
    url_ = "http://localhost/profiling/v1/input";
  } else {
    while (absl::ConsumeSuffix(&agent, "/")) {
    }
    url_ = absl::StrCat(agent, "/profiling/v1/input");
  }
  tags_.push_back(Tag("service", datadog.service.empty()
                                     ? internal::ProgramName()
                                     : datadog.service));
  if (!datadog.env.empty()) tags_.push_back(Tag("env", datadog.env));
  if (!datadog.version.empty()) tags_.push_back(Tag("version", datadog.version));
  for (const std::string& t : datadog.tags) {
    tags_.push_back(absl::StrReplaceAll(t, {{",", "_"}}));
  }
  tags_.push_back("language:native");
  tags_.push_back(Tag("profiler_version", kProfilerVersion));
  tags_.push_back(Tag("runtime-id", internal::RandomUuid()));
  tags_.push_back(Tag("host", datadog.hostname.empty() ? internal::HostName()
                                                       : datadog.hostname));

  const std::string endpoint =
      unix_socket_.empty() ? url_ : absl::StrCat("unix://", unix_socket_);
  uploader_ = std::make_unique<internal::Uploader>(
      "datadog", endpoint, upload,
      [url = url_, socket = unix_socket_, tags = tags_,
       timeout = upload.timeout](const ExportedProfile& profile) {
        internal::HttpRequest request;
        request.url = url;
        request.unix_socket = socket;
        request.timeout = timeout;
        request.headers = {
            "DD-EVP-ORIGIN: inprof",
            absl::StrCat("DD-EVP-ORIGIN-VERSION: ", kProfilerVersion)};
        request.parts.push_back(
            {.name = "event",
             .filename = "event.json",
             .content_type = "application/json",
             .data = {},
             .owned = EventJson(tags, profile.start, profile.end)});
        request.parts.push_back({.name = "profile.pprof",
                                 .filename = "profile.pprof",
                                 .content_type = "application/octet-stream",
                                 .data = profile.pprof,
                                 .owned = DatadogNamed(profile.pprof)});
        return request;
      });
}

absl::Status DatadogUploader::Consume(
    std::shared_ptr<const ExportedProfile> profile) {
  uploader_->Enqueue(std::move(profile));
  return absl::OkStatus();
}

absl::Status DatadogUploader::Flush(absl::Time deadline) {
  return uploader_->Flush(deadline);
}

void DatadogUploader::Abandon() { uploader_->Abandon(); }

std::string DatadogUploader::Rfc3339(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E9SZ", t, absl::UTCTimeZone());
}

std::string DatadogUploader::EventJson(const std::vector<std::string>& tags,
                                       absl::Time start, absl::Time end) {
  return absl::StrCat(
      "{\"attachments\":[\"profile.pprof\"],\"tags_profiler\":",
      internal::JsonQuote(absl::StrJoin(tags, ",")),
      ",\"start\":", internal::JsonQuote(Rfc3339(start)),
      ",\"end\":", internal::JsonQuote(Rfc3339(end)),
      ",\"family\":\"native\",\"version\":\"4\"}");
}

}  // namespace inprof
