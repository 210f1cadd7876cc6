// internal: not part of the public API.
//
// The listening half of `inprof agent` (include/inprof/internal/
// agent_protocol.h): one thread accepts profiled processes on a Unix
// socket, checks who they are (SO_PEERCRED: the agent's own user, root, or
// a uid it was told to accept), answers each Hello with a Welcome and a
// memfd sized for the rings it asked for -- or a one-line Reject -- and
// keeps the connection to learn when the process is gone. A peer that
// sends garbage, stalls in its handshake or vanishes is logged and dropped;
// the agent goes on serving the others.
//
// Limits, so that nobody -- another user's connection flood included --
// makes the agent spin, run out of descriptors or lose a profile silently:
// a peer of a user the agent does not serve is refused as it is accepted
// (it never holds a descriptor here); at most kMaxPendingPerUid
// connections of one user and kMaxPending in all may wait for their
// hello; a process is refused, with a line saying why, when serving it
// would leave the agent fewer than kFdReserve descriptors (a connected
// process holds one per file it maps, and more as it is symbolized); and
// when accept() fails for want of descriptors, a spare one is given back
// to take the connection and refuse it (the process then profiles
// itself), or the socket is not watched for 100 ms, never polled in a
// loop. Every refused process is told why (a Reject) and falls back.
// Repeated lines (a flood's) are limited to 10 a second, the rest
// counted in one line.
//
// With `profile` set, each process that describes its profile gets an
// AgentSession (agent_session.h): its ring is read every 20 ms, aggregated,
// symbolized from its maps and exported to the sinks of `profile_options`
// (the agent's INPROF_*); when its connection ends (it stopped, exited or
// died) the rest is read and its last window exported, on a thread of its
// own so the other processes are not kept waiting. Stop() finishes the
// processes still connected the same way. Without `profile`: registration
// only (the handshake and the regions, for tests of the protocol).
//
// Example:
//   AgentServer server({.address = internal::NewAgentSocketAddress()});
//   if (absl::Status st = server.Start(); !st.ok()) { ... }
//   ... processes connect ...
//   for (const auto& p : server.Processes()) { ... }
//   server.Stop();
#ifndef INPROF_SRC_AGENT_AGENT_SERVER_H_
#define INPROF_SRC_AGENT_AGENT_SERVER_H_

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "inprof/internal/agent_protocol.h"
#include "inprof/internal/debug_endpoint.h"
#include "inprof/options.h"

namespace inprof::agent {

class AgentSession;

struct AgentServerOptions {
  internal::AgentSocketAddress address;
  // Users besides the agent's own (and root) whose processes it serves.
  std::vector<uid_t> allowed_uids;
  // A connected peer must say hello within this time.
  int handshake_timeout_ms = 2000;
  // Where one line per event goes (nullptr: nowhere).
  void (*log)(const std::string& line) = nullptr;
  // False: only errors are logged (processes connecting and leaving,
  // and each one's summary, are not).
  bool log_connections = true;
  // Finished processes whose records Processes() keeps, the oldest
  // dropped first (served() counts them all); 0: every one (`inprof run`
  // reports each process's file at the end). A long-running agent keeps a
  // bounded number.
  size_t max_finished_kept = 0;
  // Aggregate, symbolize and export what the processes forward.
  bool profile = false;
  // The agent's own (INPROF_*): its sinks, windows, and with http_addr
  // set a live endpoint for the processes it serves (/debug/pprof/, a
  // capture naming the process with pid=N).
  Options profile_options;
};

// A process the agent serves or served.
struct AgentProcess {
  internal::AgentHello hello;
  internal::PeerCredentials peer;
  uint64_t region_bytes = 0;
  bool connected = false;
  // With AgentServerOptions::profile:
  std::string output;        // its windows' file pattern (%p expanded)
  uint64_t samples = 0;      // samples read from its ring
  // Of those, read from its threads' rings after it died (it never stopped
  // its profiler: what its collector had not drained).
  uint64_t samples_from_thread_rings = 0;
  uint64_t profiles = 0;     // windows exported
  bool ended_cleanly = false;  // it stopped its profiler before it went
  bool finished = false;     // its last window was exported
  std::string error;         // why its ring stopped being read
};

class AgentServer {
 public:
  explicit AgentServer(AgentServerOptions options);
  ~AgentServer();
  AgentServer(const AgentServer&) = delete;
  AgentServer& operator=(const AgentServer&) = delete;

  // At most this many connections of one user, and in all, wait for their
  // hello at a time; the next are refused at once.
  static constexpr int kMaxPendingPerUid = 16;
  static constexpr int kMaxPending = 64;
  // Descriptors left free for the processes already served (their
  // symbolizers open debug files as they symbolize, their windows open
  // output files and upload sockets).
  static constexpr int kFdReserve = 64;
  // Binds and listens, then serves on a thread of its own. The error names
  // the address (in use, too long, ...). A stale socket file at a path (an
  // agent killed before it removed it) is replaced (ListenAgentSocket).
  absl::Status Start();
  // Exports the connected processes' last windows and removes the socket
  // file of a path address.
  void Stop();

  const internal::AgentSocketAddress& address() const { return options_.address; }
  // The live endpoint's address ("127.0.0.1:6060"); empty when it is off.
  std::string http_address() const;
  std::vector<AgentProcess> Processes() const;
  // Connections refused (credentials, version, malformed hello, timeout,
  // limits).
  uint64_t refused() const { return refused_.load(); }
  // Processes welcomed since Start().
  uint64_t served() const { return served_.load(); }
  // Whether Start() replaced a stale socket file.
  bool replaced_stale_socket() const { return listener_.replaced_stale; }

 private:
  struct Client;
  void Serve();
  // The client's connection ended: its session's last window, on a thread.
  void FinishLocked(Client& client);
  // Joins the finishers that are done and frees their sessions (the
  // process's region, symbolizer and aggregate), keeping its counts.
  void ReapLocked(bool all);
  void Accept();
  // A connection just accepted: kept to wait for its hello, or refused.
  void Admit(int fd);
  // The client's hello arrived (or did not): welcome it or drop it.
  void Handshake(Client& client);
  void Refuse(Client& client, const std::string& reason);
  // Refuses a connection that is not a client (yet): its Reject, then
  // closed.
  void RefuseNow(int fd, const internal::PeerCredentials& peer,
                 const std::string& reason);
  // Why `needed` more descriptors would leave fewer than kFdReserve free;
  // empty when they would not.
  std::string DescriptorShortage(int connected, int needed) const;
  void StartEndpoint();
  // The endpoint's: process `pid`'s live capture and heap snapshot
  // (NotFound when it is not connected).
  absl::StatusOr<std::string> Capture(absl::Duration duration, int64_t pid);
  absl::StatusOr<std::string> HeapSnapshot(absl::string_view default_type, int64_t pid,
                                           absl::Duration delta = absl::ZeroDuration());
  // Its /debug/pprof/threads and /goroutine of process `pid` (asked of the
  // process over its socket: AgentSession::ThreadDump).
  absl::StatusOr<std::string> ThreadDump(absl::string_view type, int debug, int64_t pid);
  std::shared_ptr<AgentSession> ConnectedSession(int64_t pid);
  void Log(const std::string& line) const;
  void LogEvent(const std::string& line) const;  // unless !log_connections
  // At most 10 such lines a second; the rest are counted, and the count
  // logged when the second is over (FlushLimitedLog).
  void LogLimited(const std::string& line);
  void FlushLimitedLog();

  AgentServerOptions options_;
  internal::AgentListener listener_;
  int wake_fd_ = -1;  // eventfd: Stop() wakes the serving thread
  // Given back when accept() fails for want of descriptors (serving thread).
  int spare_fd_ = -1;
  // The listening socket is not watched until then (serving thread).
  std::chrono::steady_clock::time_point accept_paused_until_{};
  std::chrono::steady_clock::time_point limited_since_{};  // LogLimited's second
  int limited_lines_ = 0;
  uint64_t limited_suppressed_ = 0;
  std::thread thread_;
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Client>> clients_;  // mutex_
  // Threads exporting a gone process's last window (mutex_); joined, and
  // the session freed, by the serving loop once done.
  std::vector<std::pair<Client*, std::thread>> finishers_;
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> served_{0};
  std::unique_ptr<internal::DebugEndpoint> endpoint_;
  std::unique_ptr<internal::DebugServer> http_;
};

}  // namespace inprof::agent

#endif  // INPROF_SRC_AGENT_AGENT_SERVER_H_
