#include "inprof/internal/composition.h"

#include <memory>

#include "inprof/internal/agent_forwarding.h"
#if !defined(_WIN32)
#include "inprof/internal/dump_signal.h"
#endif
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
#if !defined(_WIN32)
  if (options.dump_signal != 0) {
    pipeline.Attach(std::make_unique<DumpSignalAttachment>(options.dump_signal));
  }
#endif
}

}  // namespace inprof::internal
