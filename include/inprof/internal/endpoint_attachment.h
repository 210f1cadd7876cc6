// internal: not part of the public API.
//
// The live endpoint (INPROF_HTTP_ADDR, internal/debug_endpoint.h) as an
// attachment of the pipeline (internal/pipeline.h): it listens from the
// pipeline's StartCollector to its StopCollector, and each capture is a
// window of the pipeline's own (Pipeline::Capture). An address it cannot
// listen on gets one line and no endpoint; the process runs on.
#ifndef INPROF_INTERNAL_ENDPOINT_ATTACHMENT_H_
#define INPROF_INTERNAL_ENDPOINT_ATTACHMENT_H_

#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "inprof/internal/pipeline.h"

namespace inprof::internal {

class DebugEndpoint;
class DebugServer;

// The endpoint's flame graph page of a capture (DebugEndpoint's Render).
absl::StatusOr<std::string> RenderFlamegraphPage(const std::string& pprof,
                                                 absl::string_view title);

class EndpointAttachment final : public PipelineAttachment {
 public:
  // `http_addr`: INPROF_HTTP_ADDR's value.
  explicit EndpointAttachment(std::string http_addr);
  ~EndpointAttachment() override;

  // The address it listens on ("127.0.0.1:6060"), empty when it does not.
  // Any thread.
  std::string address() const;
  std::string ServedAddress() const override { return address(); }

  // PipelineAttachment.
  void Started(Pipeline& pipeline) override;
  void Stopping() override;
  void Abandon() override;

 private:
  const std::string http_addr_;
  std::unique_ptr<DebugEndpoint> endpoint_;
  std::unique_ptr<DebugServer> server_;
  mutable std::mutex mutex_;  // guards address_
  std::string address_;       // set before the server serves
};

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_ENDPOINT_ATTACHMENT_H_
