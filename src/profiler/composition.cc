#include "inprof/internal/composition.h"

#include <memory>

#include "inprof/internal/agent_forwarding.h"
#include "inprof/internal/endpoint_attachment.h"
#include "inprof/internal/sinks_from_options.h"

namespace inprof::internal {

void ComposePipeline(Pipeline& pipeline) {
  const Options& options = pipeline.options();
  pipeline.SetSinkFactory([options] { return MakeSinks(options); });
  pipeline.Attach(std::make_unique<AgentForwarding>(options));
  if (!options.http_addr.empty()) {
    pipeline.Attach(std::make_unique<EndpointAttachment>(options.http_addr));
  }
}

}  // namespace inprof::internal
