// internal: not part of the public API.
//
// The wire protocol between a profiled process and `inprof agent`, the
// out-of-process agent of ddprof's design (seeds/ddprof-design.md): the
// agent listens on a Unix socket, a profiled process connects, says who it
// is (Hello) and receives the shared memory its threads' sample rings will
// live in (Welcome, with a memfd passed as SCM_RIGHTS), or a Reject naming
// why not. The connection stays open: its end is how each side learns that
// the other is gone.
//
// After the Welcome the process forwards its samples through the region
// (agent_stream.h, agent_link.h) and sends nothing more on the socket. The
// agent may send a DumpRequest (its /debug/pprof/threads of the process):
// the process answers through its ring (AgentDumpThread ops, then an
// AgentDumpEnd with the request's id).
//
// Messages are SOCK_SEQPACKET datagrams (one message, one recv): a 16-byte
// header -- magic "INPA", protocol version (u16), type (u16), payload
// length (u32), zero (u32), little-endian -- then the payload: fixed-width
// integers and strings as u32 length + bytes. The header's layout never
// changes, so a peer of another version is told so rather than misread.
// Every decode error names the field that was wrong; nothing here trusts
// the peer (fuzz/agent_protocol_fuzzer.cc).
//
// Example:
//   internal::AgentHello hello{.pid = getpid(), .program = "server"};
//   std::string bytes = internal::EncodeAgentMessage(hello);
//   absl::StatusOr<internal::AgentMessage> m = internal::DecodeAgentMessage(bytes);
#ifndef INPROF_INTERNAL_AGENT_PROTOCOL_H_
#define INPROF_INTERNAL_AGENT_PROTOCOL_H_

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "inprof/base/addresses.h"

namespace inprof::internal {

// 2: the describe record's omitted types, state rows and the events note
// (agent_stream.h); an agent of version 1 could not read them.
// 3: the events note's lock-wait period (the agent's /debug/pprof/mutex),
// the DumpRequest and its answer's ops.
inline constexpr uint16_t kAgentProtocolVersion = 3;
inline constexpr uint32_t kAgentMagic = 0x41504e49;  // "INPA", little-endian
inline constexpr size_t kAgentHeaderBytes = 16;
// Largest message either side sends or accepts.
inline constexpr size_t kAgentMaxMessageBytes = 64 * 1024;
inline constexpr size_t kAgentMaxStringBytes = 4096;
inline constexpr size_t kAgentMaxTags = 64;
// Bounds on the shared region a process may ask for.
inline constexpr uint32_t kAgentMaxThreads = 4096;
inline constexpr uint32_t kAgentMaxRingBytes = 1u << 20;

enum class AgentMessageType : uint16_t {
  kHello = 1,    // process -> agent
  kWelcome = 2,  // agent -> process, with the region's memfd
  kReject = 3,   // agent -> process, then the agent closes
  kDumpRequest = 4,  // agent -> process: a thread dump, answered in the ring
};

// Who is connecting, and the rings it wants: `max_threads` rings of
// `ring_bytes` each (library mode asks for one: agent_link.h).
struct AgentHello {
  pid_t pid = 0;
  std::string program;  // the name its profiles carry (`service` by default)
  // Labels every profile of the process carries (service, env, version, ...).
  std::vector<std::pair<std::string, std::string>> tags;
  uint32_t max_threads = 0;
  uint32_t ring_bytes = 0;
};

struct AgentWelcome {
  pid_t agent_pid = 0;
  uint64_t region_bytes = 0;  // the memfd's size
};

struct AgentReject {
  std::string reason;  // one line, shown by the process as it is
};

struct AgentDumpRequest {
  uint32_t id = 0;  // the answer's AgentDumpThread and AgentDumpEnd carry it
};

using AgentMessage = std::variant<AgentHello, AgentWelcome, AgentReject, AgentDumpRequest>;

std::string EncodeAgentMessage(const AgentMessage& message);
// The message of a version other than kAgentProtocolVersion is an error
// naming both versions (the header's layout is the same in every version).
absl::StatusOr<AgentMessage> DecodeAgentMessage(absl::string_view bytes);

// AgentSocketAddress and ParseAgentSocketAddress: base/addresses.h.
// A fresh abstract address for this user: "@inprof-agent-UID-PID-RANDOM".
AgentSocketAddress NewAgentSocketAddress();

// Socket helpers (SOCK_SEQPACKET, close-on-exec, non-blocking). Sending
// never raises SIGPIPE: a gone peer is an error. Nothing here waits without
// a time limit.
//
// Listens at `address`. A path where a stale socket lies (one this user
// owns and nothing listens on: an agent that was killed) is replaced;
// anything else there -- a socket an agent listens on, another user's
// socket, a file that is not a socket -- is left alone and named in the
// error. `listener`, when given, gets what Stop() needs to remove the
// socket file again (RemoveAgentSocket) and whether a stale one was
// replaced.
struct AgentListener {
  int fd = -1;
  // The socket file the agent bound (a path address only; 0 otherwise).
  uint64_t dev = 0, ino = 0;
  bool replaced_stale = false;
};
absl::StatusOr<AgentListener> ListenAgentSocket(const AgentSocketAddress& address);
// Removes the socket file `listener` bound, if that file is still there
// (never another agent's socket that replaced it, never anything else).
void RemoveAgentSocket(const AgentSocketAddress& address,
                       const AgentListener& listener);
// Connects within `timeout_ms`. A listener that does not take the
// connection (its backlog is full: a stopped agent, or a socket that
// somebody holds and never accepts on) is tried again until then; where
// the kernel says who holds the address (a path's owner; an abstract
// name's listener, through sock_diag), one held by another user than this
// process's (or root) is refused at once. The error names the address.
absl::StatusOr<int> ConnectAgentSocket(const AgentSocketAddress& address,
                                       int timeout_ms = 2000);
// Sends one message within `timeout_ms` (0: only if the socket has room
// now), passing `pass_fd` (SCM_RIGHTS) when >= 0.
absl::Status SendAgentMessage(int socket, const AgentMessage& message,
                              int pass_fd = -1, int timeout_ms = 0);
// Receives one message within `timeout_ms` (-1: no limit). `received_fd`,
// when given, gets the descriptor passed with it, or -1. The peer closing
// is an error saying so. A peer that answered and closed before reading
// what this side sent (its answer then comes with a reset) is read anyway.
absl::StatusOr<AgentMessage> ReceiveAgentMessage(int socket, int timeout_ms,
                                                 int* received_fd = nullptr);
// The uid of whoever listens at `address` when the kernel says (a path:
// the socket file's owner; an abstract name: sock_diag's view of the
// listening SOCK_SEQPACKET socket, Linux 5.3+); nullopt when it does not.
std::optional<uint32_t> AgentSocketHolderUid(const AgentSocketAddress& address);

// The peer's credentials (SO_PEERCRED).
struct PeerCredentials {
  pid_t pid = 0;
  uint32_t uid = 0;  // uid_t
  uint32_t gid = 0;  // gid_t
};
absl::StatusOr<PeerCredentials> GetPeerCredentials(int socket);

// The process side of the handshake, all of it within `timeout_ms`:
// connects, checks that the agent runs as this user (or root) before it
// sends anything, says hello and waits for the answer. On success the
// connected socket, the welcome and the region's memfd (the caller owns
// both); a Reject, another user's socket, a timeout or a gone agent is an
// error naming the socket.
struct AgentConnection {
  int socket = -1;
  int region_fd = -1;
  AgentWelcome welcome;
};
absl::StatusOr<AgentConnection> ConnectToAgent(const AgentSocketAddress& address,
                                               const AgentHello& hello,
                                               int timeout_ms);

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_AGENT_PROTOCOL_H_
