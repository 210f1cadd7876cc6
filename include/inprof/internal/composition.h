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
// The profiler reaches what it attached only through the pipeline's
// neutral hooks (PipelineAttachment: Connect, the threads' ring memory,
// the served address), so the core names none of them.
#ifndef INPROF_INTERNAL_COMPOSITION_H_
#define INPROF_INTERNAL_COMPOSITION_H_

#include "inprof/internal/pipeline.h"

namespace inprof::internal {

// Attaches to `pipeline` what its options ask for. Before the pipeline's
// StartCollector; once per pipeline.
void ComposePipeline(Pipeline& pipeline);

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_COMPOSITION_H_
