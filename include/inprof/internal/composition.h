// internal: not part of the public API.
//
// The one place that composes a profiler's pipeline (internal/pipeline.h)
// from its Options: the sinks (internal/sinks_from_options.h: file,
// Datadog, Pyroscope, Options::sinks), library mode's forwarding to an
// agent (internal/agent_forwarding.h) and the live endpoint
// (internal/endpoint_attachment.h, when INPROF_HTTP_ADDR is set). Both
// platforms' profilers hold one beside their pipeline; `inprof agent`'s
// sessions compose their own (sinks only).
//
// Thread-safety: as the profiler's registry lock orders its callers
// (ConnectAgent and the thread rings' calls under it).
#ifndef INPROF_INTERNAL_COMPOSITION_H_
#define INPROF_INTERNAL_COMPOSITION_H_

#include <sys/types.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "inprof/internal/pipeline.h"

namespace inprof::internal {

class AgentForwarding;
class EndpointAttachment;
struct AgentThreadRingLayout;

class Composition {
 public:
  // Attaches to `pipeline` (which must outlive this) what its options ask
  // for. Before the pipeline's StartCollector.
  explicit Composition(Pipeline& pipeline);
  Composition(const Composition&) = delete;
  Composition& operator=(const Composition&) = delete;

  // Library mode, at each Start before the pipeline's StartCollector
  // (AgentForwarding::Connect).
  absl::Status ConnectAgent(const AgentThreadRingLayout* thread_rings = nullptr);
  // Library mode: shared memory for a thread's ring, or null.
  void* AcquireAgentThreadRing(pid_t tid, absl::string_view name);
  void ReleaseAgentThreadRing(void* ring);

  // The live endpoint's address ("127.0.0.1:6060"), empty when it is off
  // or could not listen.
  std::string http_address() const;

 private:
  Pipeline& pipeline_;
  AgentForwarding* agent_ = nullptr;         // owned by the pipeline
  EndpointAttachment* endpoint_ = nullptr;   // owned by the pipeline; may be null
};

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_COMPOSITION_H_
