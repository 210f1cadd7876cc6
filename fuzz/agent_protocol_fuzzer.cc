// libFuzzer target: the agent's wire protocol (DecodeAgentMessage), what
// `inprof agent` reads from any process that connects to its socket, and
// the agent socket addresses (ParseAgentSocketAddress: INPROF_AGENT_SOCKET).
//
// Checked: nothing crashes or reads out of bounds; a message that decodes
// encodes back to the same bytes (the format has one encoding per
// message); every error is one line beginning "agent".
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "inprof/internal/agent_protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  auto message = inprof::internal::DecodeAgentMessage(input);
  if (message.ok()) {
    if (inprof::internal::EncodeAgentMessage(*message) != input) std::abort();
  } else {
    const absl::string_view error = message.status().message();
    if (!absl::StartsWith(error, "agent") || absl::StrContains(error, "\n")) {
      std::abort();
    }
  }
  auto address = inprof::internal::ParseAgentSocketAddress(input);
  if (address.ok() && address->name.empty()) std::abort();
  return 0;
}
