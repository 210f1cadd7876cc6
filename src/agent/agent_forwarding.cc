#include "inprof/internal/agent_forwarding.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "inprof/base/log.h"
#include "inprof/base/platform.h"
#include "inprof/internal/agent_link.h"

namespace inprof::internal {

AgentForwarding::AgentForwarding(const Options& options) : options_(options) {}

AgentForwarding::~AgentForwarding() = default;

absl::Status AgentForwarding::Connect(Pipeline& pipeline,
                                      const ThreadRingLayout* thread_rings) {
  if (options_.agent_socket.empty() && options_.agent_spawn) {
    // ddprof's library mode: an agent of the process's own, and the
    // variable exported for the programs it exec's (they join it).
    absl::StatusOr<std::string> spawned = SpawnAgent(options_, /*timeout_ms=*/2000);
    if (!spawned.ok()) {
      if (options_.agent_fallback == AgentFallback::kOff) {
        return absl::Status(spawned.status().code(),
                            absl::StrCat(spawned.status().message(),
                                         "; not profiling (INPROF_AGENT_FALLBACK=off)"));
      }
      Log(absl::StrCat(spawned.status().message(),
                       "; profiling in this process (INPROF_AGENT_FALLBACK=local)"));
      pipeline.WithLock([&](Pipeline::Locked& l) {
        l.SetAttachmentNote(absl::StrCat("library mode: ", spawned.status().message(),
                                         "; profiled in the process"));
      });
      return absl::OkStatus();
    }
    options_.agent_socket = *spawned;
    SetEnvVar("INPROF_AGENT_SOCKET", spawned->c_str());
  }
  if (options_.agent_socket.empty()) return absl::OkStatus();
  pipeline.WithLock([](Pipeline::Locked& l) {
    l.aggregator().SetForwarder(nullptr);
    l.SetAttachmentNote("");
  });
  link_.reset();
  AgentDescribe describe{pipeline.sample_types(), pipeline.period_type(),
                         pipeline.period(), pipeline.engine(), pipeline.omitted_types()};
  absl::StatusOr<std::unique_ptr<AgentLink>> link =
      AgentLink::Connect(options_, describe, /*timeout_ms=*/1000);
  if (!link.ok()) {
    const std::string why = absl::StrCat(
        "INPROF_AGENT_SOCKET=", options_.agent_socket, ": ", link.status().message());
    if (options_.agent_fallback == AgentFallback::kOff) {
      return absl::Status(link.status().code(),
                          absl::StrCat(why, "; not profiling (INPROF_AGENT_FALLBACK=off)"));
    }
    Log(absl::StrCat(why, "; profiling in this process (INPROF_AGENT_FALLBACK=local)"));
    pipeline.WithLock([&](Pipeline::Locked& l) {
      l.SetAttachmentNote(absl::StrCat("library mode: ", why, "; profiled in the process"));
    });
    return absl::OkStatus();
  }
  link_ = std::move(*link);
  last_live_state_ns_ = 0;
  resend_live_state_ = false;
  if (thread_rings != nullptr) link_->EnableThreadRings(*thread_rings);
  pipeline.WithLock([&](Pipeline::Locked& l) { l.aggregator().SetForwarder(link_.get()); });
  return absl::OkStatus();
}

// Under the pipeline's lock: the link's gone_ is written under it, and
// ExportLast lets the link go under it (a thread may unregister after Stop
// began).
void* AgentForwarding::AcquireThreadRing(Pipeline& pipeline, pid_t tid,
                                         absl::string_view name) {
  return pipeline.WithLock([&](Pipeline::Locked&) -> void* {
    return link_ == nullptr ? nullptr : link_->AcquireThreadRing(tid, name);
  });
}

bool AgentForwarding::ReleaseThreadRing(Pipeline& pipeline, void* ring) {
  pipeline.WithLock([&](Pipeline::Locked&) {
    if (link_ != nullptr) link_->ReleaseThreadRing(ring);
  });
  return true;
}

void AgentForwarding::AfterDrain(Pipeline& pipeline) {
  if (link_ == nullptr) return;
  std::string line;
  uint32_t dump_request = 0;
  const bool lost_now = pipeline.WithLock([&](Pipeline::Locked& l) {
    if (link_->lost()) return false;
    // The agent cuts the windows: what the event providers recorded goes on
    // after each drain, as samples do; their state (the live heap) and
    // their counters' line every kLiveStateInterval.
    const std::string events = l.FlushEventsAtAttachments();
    const int64_t now = absl::GetCurrentTimeNanos();
    if (now - last_live_state_ns_ >= absl::ToInt64Nanoseconds(kLiveStateInterval)) {
      last_live_state_ns_ = now;
      SendLiveStateLocked(l, events);
    }
    if (link_->Flush(StatsToCounters(l.stats()), l.engine_detail())) {
      dump_request = link_->TakeDumpRequest();
      return false;
    }
    OnLostLocked(l, absl::GetCurrentTimeNanos());
    line = l.attachment_note();
    return true;
  });
  if (dump_request != 0) {
    // The agent's /debug/pprof/threads of this process: the dump is taken
    // here, on the collector's thread, without the pipeline's lock (it
    // signals threads and waits for them, 1 s at most); the agent
    // symbolizes it.
    const absl::StatusOr<ProfileData> dump =
        pipeline.thread_dumper() ? pipeline.thread_dumper()()
                                 : absl::NotFoundError("this profiler has no registry of threads");
    pipeline.WithLock([&](Pipeline::Locked&) {
      if (!link_->lost()) link_->SendDump(dump_request, dump);
    });
  }
  if (!lost_now) return;
  const bool local = options_.agent_fallback == AgentFallback::kLocal;
  Log(absl::StrCat(line, local ? "; profiling in this process from now on "
                                 "(INPROF_AGENT_FALLBACK=local)"
                               : "; samples are no longer kept "
                                 "(INPROF_AGENT_FALLBACK=off)"));
  if (local) pipeline.ExportHere();
}

void AgentForwarding::SendLiveStateLocked(Pipeline::Locked& l, const std::string& events) {
  // A state row the full ring refused leaves the agent's row behind: the
  // next state is sent in full.
  // The note first: the period it carries is there before any row.
  link_->EventsNote(events, static_cast<int64_t>(options_.alloc_period),
                    absl::ToInt64Nanoseconds(options_.lock_period));
  const uint64_t dropped = link_->state_rows_dropped();
  link_->SetStateRows(true);
  l.LiveStateAtAttachments(/*all=*/resend_live_state_);
  link_->SetStateRows(false);
  resend_live_state_ = link_->state_rows_dropped() != dropped;
}

void AgentForwarding::OnLostLocked(Pipeline::Locked& l, int64_t now) {
  l.SetAttachmentNote(absl::StrCat(
      "library mode: the agent at ", link_->address(), " (pid ",
      link_->agent_pid(), ") went away after ", link_->samples_forwarded(),
      " samples were forwarded; ", link_->samples_unconsumed(),
      " of them it had not read are lost"));
  if (options_.agent_fallback == AgentFallback::kLocal) {
    l.aggregator().SetForwarder(nullptr);
    l.RestartWindow(now);
  }
}

std::optional<absl::Status> AgentForwarding::ExportLast(Pipeline& pipeline,
                                                        const ProfilerStats& stats) {
  if (link_ == nullptr) return std::nullopt;
  std::string line;
  const bool ended = pipeline.WithLock([&](Pipeline::Locked& l) {
    if (link_->lost()) return false;
    // The window ends in the process too: the allocations still pending,
    // the live heap at Stop and the counters' line are forwarded before
    // the end, as a local last window would hold them.
    SendLiveStateLocked(l, l.FlushEventsAtAttachments());
    const std::vector<uint64_t> counters = StatsToCounters(l.stats(&stats));
    if (link_->lost()) {
      OnLostLocked(l, absl::GetCurrentTimeNanos());
      line = l.attachment_note();
      return false;
    }
    // The agent exports the last window once it reads the end.
    link_->End(counters);
    if (!link_->lost()) {
      l.aggregator().SetForwarder(nullptr);
      link_.reset();
      return true;
    }
    OnLostLocked(l, absl::GetCurrentTimeNanos());
    line = l.attachment_note();
    return false;
  });
  if (ended) return absl::OkStatus();
  if (!line.empty()) Log(line);
  if (options_.agent_fallback == AgentFallback::kOff) {
    return pipeline.WithLock([&](Pipeline::Locked& l) {
      return absl::UnavailableError(absl::StrCat(
          l.attachment_note(), "; ", link_->samples_after_loss(),
          " samples taken after that were not kept (INPROF_AGENT_FALLBACK=off)"));
    });
  }
  return std::nullopt;
}

}  // namespace inprof::internal
