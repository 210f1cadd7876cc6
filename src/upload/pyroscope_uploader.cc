#include "inprof/pyroscope_uploader.h"

#include <algorithm>
#include <iterator>
#include <string_view>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "inprof/internal/upload_util.h"
#include "inprof/pprof_reader.h"

namespace inprof {
namespace {

// `form`: a multipart body, which Pyroscope reads only without
// format=pprof (that names a bare pprof body).
std::string IngestUrlFor(absl::string_view base, absl::string_view name,
                         int64_t sample_rate, absl::Time start, absl::Time end,
                         bool form = false) {
  // Pyroscope reads from/until as Unix seconds; until is rounded up so the
  // range always contains the window.
  const int64_t from = absl::ToUnixSeconds(start);
  const int64_t until = std::max<int64_t>(
      from, absl::ToUnixSeconds(end) +
                (end > absl::FromUnixSeconds(absl::ToUnixSeconds(end)) ? 1 : 0));
  return absl::StrCat(base, "/ingest?name=", internal::UrlEncode(name),
                      "&from=", from, "&until=", until,
                      form ? "" : "&format=pprof", "&spyName=inprof&sampleRate=",
                      sample_rate);
}

// Go's names for the allocation types (pprof_writer), which Pyroscope
// files under "memory".
constexpr std::string_view kAllocationTypes[] = {"alloc_objects",      "alloc_space",
                                                 "inuse_objects",      "inuse_space",
                                                 "peak_inuse_objects", "peak_inuse_space"};

// Go's names for the lock-wait types, which Pyroscope files under "mutex".
constexpr std::string_view kLockTypes[] = {"contentions", "delay"};

// What is queued: a window, or one of its parts (below). Every profile
// this uploader queues is one of these, so the request builder may cast.
struct IngestPart : ExportedProfile {
  // The allocation or lock types, as a form with this sample_type_config;
  // null: the rest, as a plain body.
  const char* config = nullptr;
};

// Pyroscope's per-type settings for the allocation types. Its default
// mapping takes alloc_* as cumulative (Go's heap profile counts since the
// start, and the old server subtracted the previous upload); inprof's
// windows hold what was allocated during the window. inuse_* is the live
// heap at the window's end, peak_inuse_* at the window's highest:
// averaged, not summed, over time.
constexpr char kMemorySampleTypeConfig[] =
    R"({"alloc_objects":{"units":"objects"},)"
    R"("alloc_space":{"units":"bytes"},)"
    R"("inuse_objects":{"units":"objects","aggregation":"average"},)"
    R"("inuse_space":{"units":"bytes","aggregation":"average"},)"
    R"("peak_inuse_objects":{"units":"objects","aggregation":"average"},)"
    R"("peak_inuse_space":{"units":"bytes","aggregation":"average"}})";

// And for the lock-wait types: Pyroscope's Go names and units. Its default
// mapping takes them as cumulative (Go's mutex profile counts since the
// start); inprof's windows hold the waits of the window.
constexpr char kLockSampleTypeConfig[] =
    R"({"contentions":{"units":"lock_samples","display-name":"mutex_count"},)"
    R"("delay":{"units":"lock_nanoseconds","display-name":"mutex_duration"}})";

}  // namespace

PyroscopeUploader::PyroscopeUploader(const PyroscopeOptions& pyroscope,
                                     const UploadOptions& upload,
                                     absl::Duration cpu_period,
                                     uint64_t alloc_period)
    : alloc_period_(alloc_period) {
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
       timeout = upload.timeout](const ExportedProfile& queued) {
        const auto& profile = static_cast<const IngestPart&>(queued);
        internal::HttpRequest request;
        request.url =
            IngestUrlFor(base, name, rate, profile.start, profile.end, profile.config != nullptr);
        request.timeout = timeout;
        if (profile.config != nullptr) {
          internal::HttpPart& part = request.parts.emplace_back();
          part.name = "profile";
          part.filename = "profile.pprof";
          part.content_type = "application/octet-stream";
          part.data = profile.pprof;
          internal::HttpPart& config = request.parts.emplace_back();
          config.name = "sample_type_config";
          config.filename = "sample_type_config.json";
          config.content_type = "application/json";
          config.owned = profile.config;
        } else {
          request.body = profile.pprof;
          request.content_type = "application/octet-stream";
        }
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
  auto part = [&profile](std::string pprof, const char* config) {
    auto p = std::make_shared<IngestPart>();
    static_cast<ExportedProfile&>(*p) = *profile;
    p->pprof = std::move(pprof);
    p->config = config;
    return p;
  };
  auto is_alloc = [](std::string_view type) {
    return std::find(std::begin(kAllocationTypes), std::end(kAllocationTypes), type) !=
           std::end(kAllocationTypes);
  };
  auto is_lock = [](std::string_view type) {
    return std::find(std::begin(kLockTypes), std::end(kLockTypes), type) !=
           std::end(kLockTypes);
  };
  // Pyroscope files a whole upload under one name, "process_cpu" as soon as
  // one type names CPU: a window with allocation or lock types goes as
  // several uploads, so that they land under "memory" and "mutex" as Go's
  // heap and mutex profiles do (with Go's period types and periods).
  absl::StatusOr<std::string> memory =
      SelectPprofSampleTypes(profile->pprof, is_alloc, ValueType{"space", "bytes"},
                             static_cast<int64_t>(alloc_period_));
  absl::StatusOr<std::string> locks =
      SelectPprofSampleTypes(profile->pprof, is_lock, ValueType{"contentions", "count"}, 1);
  if (!memory.ok() && !locks.ok()) {
    // NotFound: neither (CPU and wall only): sent as it is. A profile that
    // cannot be read is sent as it is too: the server says what is wrong
    // with it.
    uploader_->Enqueue(part(profile->pprof, nullptr));
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> others = SelectPprofSampleTypes(
      profile->pprof, [&](std::string_view type) { return !is_alloc(type) && !is_lock(type); });
  if (others.ok()) uploader_->Enqueue(part(std::move(*others), nullptr));
  if (memory.ok()) uploader_->Enqueue(part(std::move(*memory), kMemorySampleTypeConfig));
  if (locks.ok()) uploader_->Enqueue(part(std::move(*locks), kLockSampleTypeConfig));
  return absl::OkStatus();
}

absl::Status PyroscopeUploader::Flush(absl::Time deadline) {
  return uploader_->Flush(deadline);
}

void PyroscopeUploader::Abandon() { uploader_->Abandon(); }

}  // namespace inprof
