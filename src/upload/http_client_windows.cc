// HTTP uploads on Windows: not built yet (libcurl is not in the Windows
// build). A configured upload says so in one line at its first window
// (internal/http_client.h); the profile file is written as usual.
#include "inprof/internal/http_client.h"

namespace inprof::internal {

absl::Status HttpClient::Available() {
  return absl::UnimplementedError(
      "uploads (Datadog, Pyroscope) are not part of the Windows build yet; "
      "profiles are written to INPROF_OUTPUT");
}

HttpClient::HttpClient() = default;
HttpClient::~HttpClient() = default;

absl::StatusOr<HttpResponse> HttpClient::Send(const HttpRequest& /*request*/) {
  return Available();
}

void HttpClient::Abort() { aborted_.store(true); }

}  // namespace inprof::internal
