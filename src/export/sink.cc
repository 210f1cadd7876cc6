#include "inprof/sink.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "inprof/base/platform.h"
#include "inprof/options.h"

namespace inprof {

std::string ExpandOutputPattern(absl::string_view pattern, pid_t pid,
                                absl::Time start) {
  std::string out;
  out.reserve(pattern.size() + 32);
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%' || i + 1 == pattern.size()) {
      out.push_back(pattern[i]);
      continue;
    }
    switch (pattern[i + 1]) {
      case 'p':
        absl::StrAppend(&out, pid);
        ++i;
        break;
      case 't':
        // Fixed width, so names sort by time.
        absl::StrAppend(&out, absl::FormatTime("%Y%m%dT%H%M%E3SZ", start,
                                               absl::UTCTimeZone()));
        ++i;
        break;
      case '%':
        out.push_back('%');
        ++i;
        break;
      default:
        out.push_back('%');
        break;
    }
  }
  return out;
}

absl::Status FileSink::Consume(std::shared_ptr<const ExportedProfile> profile) {
  std::string path = ExpandOutputPattern(
      pattern_, static_cast<pid_t>(internal::ProcessId()), profile->start);
  absl::Status status = WriteFileAtomically(path, profile->pprof);
  if (status.ok()) last_path_ = std::move(path);
  return status;
}

std::vector<std::shared_ptr<ProfileSink>> LocalSinks(const Options& options) {
  std::vector<std::shared_ptr<ProfileSink>> sinks;
  if (options.write_output) {
    sinks.push_back(std::make_shared<FileSink>(options.output));
  }
  for (const auto& sink : options.sinks) {
    if (sink != nullptr) sinks.push_back(sink);
  }
  return sinks;
}

}  // namespace inprof
