#include "inprof/internal/sinks_from_options.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "inprof/base/log.h"
#include "inprof/datadog_uploader.h"
#include "inprof/internal/http_client.h"
#include "inprof/pyroscope_uploader.h"

namespace inprof::internal {

std::vector<std::shared_ptr<ProfileSink>> MakeSinks(const Options& options) {
  std::vector<std::shared_ptr<ProfileSink>> sinks = LocalSinks(options);
  // The uploaders go after the output file, before Options::sinks.
  auto uploaders = sinks.begin() + (options.write_output ? 1 : 0);
  if (options.datadog.enabled || !options.pyroscope.url.empty()) {
    if (absl::Status http = HttpClient::Available(); !http.ok()) {
      std::vector<std::string> configured;
      if (options.datadog.enabled) configured.push_back("Datadog");
      if (!options.pyroscope.url.empty()) {
        configured.push_back(absl::StrCat("Pyroscope (", options.pyroscope.url, ")"));
      }
      Log(absl::StrCat(absl::StrJoin(configured, " and "),
                       " upload configured, but ", http.message(),
                       "; profiles are not uploaded"));
    } else {
      if (options.datadog.enabled) {
        uploaders = sinks.insert(uploaders, std::make_shared<DatadogUploader>(
                                                options.datadog, options.upload)) + 1;
      }
      if (!options.pyroscope.url.empty()) {
        sinks.insert(uploaders, std::make_shared<PyroscopeUploader>(
                                    options.pyroscope, options.upload, options.cpu_period,
                                    options.alloc_period));
      }
    }
  }
  return sinks;
}

}  // namespace inprof::internal
