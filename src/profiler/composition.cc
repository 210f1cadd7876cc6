#include "inprof/internal/composition.h"

#include <memory>

#include "inprof/internal/agent_forwarding.h"
#include "inprof/internal/endpoint_attachment.h"
#include "inprof/internal/sinks_from_options.h"

namespace inprof::internal {

Composition::Composition(Pipeline& pipeline) : pipeline_(pipeline) {
  const Options& options = pipeline.options();
  pipeline.SetSinkFactory([options] { return MakeSinks(options); });
  agent_ = static_cast<AgentForwarding*>(
      pipeline.Attach(std::make_unique<AgentForwarding>(options)));
  if (!options.http_addr.empty()) {
    endpoint_ = static_cast<EndpointAttachment*>(
        pipeline.Attach(std::make_unique<EndpointAttachment>(options.http_addr)));
  }
}

absl::Status Composition::ConnectAgent(const AgentThreadRingLayout* thread_rings) {
  return agent_->Connect(pipeline_, thread_rings);
}

void* Composition::AcquireAgentThreadRing(pid_t tid, absl::string_view name) {
  return agent_->AcquireThreadRing(pipeline_, tid, name);
}

void Composition::ReleaseAgentThreadRing(void* ring) {
  agent_->ReleaseThreadRing(pipeline_, ring);
}

std::string Composition::http_address() const {
  return endpoint_ != nullptr ? endpoint_->address() : std::string();
}

}  // namespace inprof::internal
