// The live endpoint's HTTP server on Windows: not built (libmicrohttpd has
// no mingw-w64 package in Debian). INPROF_HTTP_ADDR is answered with one
// line saying so (internal/debug_endpoint.h).
#include "inprof/internal/debug_endpoint.h"

namespace inprof::internal {

struct DebugServer::Watch {};
DebugServer::DebugServer() = default;

absl::Status DebugServer::Available() {
  return absl::UnimplementedError(
      "the live endpoint is not part of the Windows build (no HTTP server "
      "library for mingw-w64)");
}

absl::StatusOr<std::unique_ptr<DebugServer>> DebugServer::Start(
    const ListenAddress& /*address*/, DebugEndpoint* /*endpoint*/,
    absl::Duration /*request_deadline*/, Descriptors /*descriptors*/) {
  return Available();
}

DebugServer::~DebugServer() = default;
void DebugServer::Stop() {}
void DebugServer::Abandon() {}
uint64_t DebugServer::requests_cut() const { return 0; }
uint64_t DebugServer::hosts_refused() const { return 0; }
uint64_t DebugServer::connections_evicted() const { return 0; }

}  // namespace inprof::internal
