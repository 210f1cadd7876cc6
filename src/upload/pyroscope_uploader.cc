#include "inprof/pyroscope_uploader.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "inprof/internal/upload_util.h"

namespace inprof {
namespace {

std::string IngestUrlFor(absl::string_view base, absl::string_view name,
                         int64_t sample_rate, absl::Time start,
                         absl::Time end) {
  // Pyroscope reads from/until as Unix seconds; until is rounded up so the
  // range always contains the window.
  const int64_t from = absl::ToUnixSeconds(start);
  const int64_t until = std::max<int64_t>(
      from, absl::ToUnixSeconds(end) +
                (end > absl::FromUnixSeconds(absl::ToUnixSeconds(end)) ? 1 : 0));
  return absl::StrCat(base, "/ingest?name=", internal::UrlEncode(name),
                      "&from=", from, "&until=", until,
                      "&format=pprof&spyName=inprof&sampleRate=", sample_rate);
}

}  // namespace

PyroscopeUploader::PyroscopeUploader(const PyroscopeOptions& pyroscope,
                                     const UploadOptions& upload,
                                     absl::Duration cpu_period) {
  absl::string_view base = pyroscope.url;
  while (absl::ConsumeSuffix(&base, "/")) {
  }
  base_url_ = std::string(base);
  name_ = pyroscope.application_name.empty() ? internal::ProgramName()
                                             : pyroscope.application_name;
  if (cpu_period > absl::ZeroDuration()) {
    sample_rate_ = std::max<int64_t>(
        1, absl::ToInt64Nanoseconds(absl::Seconds(1)) /
               std::max<int64_t>(1, absl::ToInt64Nanoseconds(cpu_period)));
  }
  uploader_ = std::make_unique<internal::Uploader>(
      "pyroscope", absl::StrCat(base_url_, "/ingest"), upload,
      [base = base_url_, name = name_, rate = sample_rate_, p = pyroscope,
       timeout = upload.timeout](const ExportedProfile& profile) {
        internal::HttpRequest request;
        request.url = IngestUrlFor(base, name, rate, profile.start, profile.end);
        request.timeout = timeout;
        request.body = profile.pprof;
        request.content_type = "application/octet-stream";
        request.basic_auth_user = p.basic_auth_user;
        request.basic_auth_password = p.basic_auth_password;
        request.bearer_token = p.auth_token;
        if (!p.tenant_id.empty()) {
          request.headers.push_back(
              absl::StrCat("X-Scope-OrgID: ", p.tenant_id));
        }
        return request;
      });
}

std::string PyroscopeUploader::IngestUrl(absl::Time start,
                                         absl::Time end) const {
  return IngestUrlFor(base_url_, name_, sample_rate_, start, end);
}

absl::Status PyroscopeUploader::Consume(
    std::shared_ptr<const ExportedProfile> profile) {
  uploader_->Enqueue(std::move(profile));
  return absl::OkStatus();
}

absl::Status PyroscopeUploader::Flush(absl::Time deadline) {
  return uploader_->Flush(deadline);
}

void PyroscopeUploader::Abandon() { uploader_->Abandon(); }

}  // namespace inprof
