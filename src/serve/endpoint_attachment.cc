#include "inprof/internal/endpoint_attachment.h"

#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "inprof/base/log.h"
#include "inprof/base/platform.h"
#include "inprof/internal/debug_endpoint.h"
#include "inprof/pprof_reader.h"
#include "src/report/report.h"

namespace inprof::internal {

absl::StatusOr<std::string> RenderFlamegraphPage(const std::string& pprof,
                                                 absl::string_view title) {
  absl::StatusOr<DecodedProfile> p = DecodePprof(pprof);
  if (!p.ok()) return p.status();
  return report::FlamegraphHtml(*p, title, nullptr, "");
}

EndpointAttachment::EndpointAttachment(std::string http_addr)
    : http_addr_(std::move(http_addr)) {}

EndpointAttachment::~EndpointAttachment() { Stopping(); }

std::string EndpointAttachment::address() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return address_;
}

void EndpointAttachment::Started(Pipeline& pipeline) {
  absl::StatusOr<ListenAddress> address = ParseListenAddress(http_addr_);
  if (!address.ok()) {
    Log(absl::StrCat(address.status().message(), "; no endpoint"));
    return;
  }
  if (endpoint_ == nullptr) {
    endpoint_ = std::make_unique<DebugEndpoint>(
        [&pipeline](absl::Duration d) { return pipeline.Capture(d); },
        &RenderFlamegraphPage, absl::StrCat(ProgramName(), " (pid ", ProcessId(), ")"));
    endpoint_->SetSnapshot(
        [&pipeline](absl::string_view type, absl::Duration delta) {
          return pipeline.Snapshot(type, delta);
        });
    endpoint_->SetThreadDump([&pipeline](absl::string_view type, int debug) {
      return pipeline.ThreadDump(type, debug);
    });
  }
  absl::StatusOr<std::unique_ptr<DebugServer>> server =
      DebugServer::Start(*address, endpoint_.get());
  if (!server.ok()) {
    Log(absl::StrCat("INPROF_HTTP_ADDR='", absl::CHexEscape(http_addr_),
                     "': ", server.status().message(), "; no endpoint"));
    return;
  }
  server_ = std::move(*server);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    address_ = server_->address();
  }
  Log(absl::StrCat("serving http://", server_->address(),
                   "/debug/pprof/ (INPROF_HTTP_ADDR)"));
}

void EndpointAttachment::Stopping() {
  if (server_ == nullptr) return;
  server_->Stop();
  server_.reset();
  std::lock_guard<std::mutex> lock(mutex_);
  address_.clear();
}

void EndpointAttachment::Abandon() {
  if (server_ == nullptr) return;
  server_->Abandon();
  (void)server_.release();
  (void)endpoint_.release();
}

}  // namespace inprof::internal
