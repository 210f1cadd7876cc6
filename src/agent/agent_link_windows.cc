// Library mode on Windows: not built (the agent's rings are shared over a
// Unix socket with a memfd). INPROF_AGENT_SOCKET and INPROF_AGENT=spawn
// get one line saying so, and the process profiles itself
// (internal/agent_link.h, internal/agent_protocol.h).
#include "inprof/internal/agent_link.h"

namespace inprof::internal {
namespace {

absl::Status NotOnWindows() {
  return absl::UnimplementedError(
      "library mode (inprof agent) is not available on Windows");
}

}  // namespace

AgentSocketAddress NewAgentSocketAddress() { return AgentSocketAddress(); }

absl::StatusOr<std::string> SpawnAgent(const Options& /*options*/, int /*timeout_ms*/) {
  return NotOnWindows();
}

absl::StatusOr<std::unique_ptr<AgentLink>> AgentLink::Connect(
    const Options& /*options*/, const AgentDescribe& /*describe*/, int /*timeout_ms*/) {
  return NotOnWindows();
}

// Connect() never succeeds here: no link exists for these to act on.
AgentLink::~AgentLink() = default;
void AgentLink::ForwardThread(uint32_t, int64_t, absl::string_view) {}
void AgentLink::ForwardThreadName(uint32_t, absl::string_view) {}
void AgentLink::ForwardThreadRemoved(uint32_t) {}
void AgentLink::ForwardSample(uint32_t, std::span<const uint64_t>, std::span<const uint64_t>,
                              size_t, std::span<const int64_t>) {}
void AgentLink::ForwardSynthetic(uint32_t, absl::string_view, size_t,
                                 std::span<const int64_t>) {}
bool AgentLink::Flush(const std::vector<uint64_t>&, const std::string&) { return false; }
void AgentLink::End(const std::vector<uint64_t>&) {}
void AgentLink::EventsNote(const std::string&, int64_t, int64_t) {}
void AgentLink::SendDump(uint32_t, const absl::StatusOr<ProfileData>&) {}
void AgentLink::EnableThreadRings(const AgentThreadRingLayout&) {}
void* AgentLink::AcquireThreadRing(pid_t, absl::string_view) { return nullptr; }
void AgentLink::ReleaseThreadRing(void*) {}

}  // namespace inprof::internal
