// internal: not part of the public API.
//
// Library mode's attachment to the pipeline (internal/pipeline.h): on each
// Start the profiler connects to `inprof agent` (INPROF_AGENT_SOCKET, or an
// agent of its own with INPROF_AGENT=spawn), and from then on the
// pipeline's aggregate forwards to the agent (internal/agent_link.h): no
// window is cut, symbolized or uploaded in the process. After each drain
// the counters follow; when the agent goes away the process profiles
// itself from then on (INPROF_AGENT_FALLBACK=local: the pipeline's exporter
// starts) or keeps no samples (off). At Stop the agent gets the end and
// exports the last window itself.
//
// Thread-safety: Connect and the thread rings' calls under the profiler's
// registry lock; the hooks on the threads internal/pipeline.h names.
#ifndef INPROF_INTERNAL_AGENT_FORWARDING_H_
#define INPROF_INTERNAL_AGENT_FORWARDING_H_

#include <sys/types.h>

#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "inprof/internal/pipeline.h"
#include "inprof/options.h"

namespace inprof::internal {

class AgentLink;

class AgentForwarding final : public PipelineAttachment {
 public:
  // How often the live heap goes to the agent: the inuse_* of a window the
  // agent cuts are those of at most this (and a collector pass) before its
  // end. A walk over the live table (2 MiB) and the stacks whose live sums
  // changed, each time.
  static constexpr absl::Duration kLiveStateInterval = absl::Seconds(1);

  explicit AgentForwarding(const Options& options);
  ~AgentForwarding() override;

  // Connects to the agent (spawning one first with INPROF_AGENT=spawn);
  // from then on `pipeline`'s aggregate forwards to it. When the agent
  // cannot be reached: an error with INPROF_AGENT_FALLBACK=off, else one
  // line logged and profiling stays in the process. Call before the
  // pipeline's StartCollector; OK and nothing done without a socket.
  // `thread_rings`: the profiler's rings can live in the agent's shared
  // region (AcquireThreadRing); null when they cannot.
  absl::Status Connect(Pipeline& pipeline, const ThreadRingLayout* thread_rings) override;

  // Shared memory for a thread's ring (AgentLink's AcquireThreadRing), or
  // null (no agent, or none to spare); back (true: the agent's rings are
  // the only ones an attachment hands out).
  void* AcquireThreadRing(Pipeline& pipeline, pid_t tid, absl::string_view name) override;
  bool ReleaseThreadRing(Pipeline& pipeline, void* ring) override;

  // PipelineAttachment.
  bool TakesSamples() override { return link_ != nullptr; }
  void AfterDrain(Pipeline& pipeline) override;
  std::optional<absl::Status> ExportLast(Pipeline& pipeline,
                                         const ProfilerStats& stats) override;

 private:
  // The pipeline's lock held: the agent is gone; the fallback's state and
  // note.
  void OnLostLocked(Pipeline::Locked& locked, int64_t now);
  // The pipeline's lock held: the event providers' state now (the live
  // heap, only what changed since the last time) as state rows the agent
  // keeps and reports at the end of each window it cuts, then `events`,
  // their counters' line.
  void SendLiveStateLocked(Pipeline::Locked& locked, const std::string& events);

  Options options_;  // agent_socket: the spawned agent's once there is one
  // While connected, and after the agent was lost (for its counts);
  // touched by Start/Stop and the collector thread, never at once.
  std::unique_ptr<AgentLink> link_;
  // The collector thread's: when the state was last sent, and whether the
  // next must be sent in full.
  int64_t last_live_state_ns_ = 0;
  bool resend_live_state_ = false;
};

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_AGENT_FORWARDING_H_
