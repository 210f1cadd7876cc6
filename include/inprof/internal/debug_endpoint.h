// internal: not part of the public API.
//
// The live endpoint (INPROF_HTTP_ADDR), after Go's net/http/pprof:
//   /debug/pprof/                      an index (HTML)
//   /debug/pprof/profile?seconds=N     gzip pprof of the next N seconds
//   /debug/pprof/flamegraph?seconds=N  the flame graph page of the same
//   /debug/pprof/symbol                what go tool pprof asks (symbolz):
//                                      captures come symbolized already
//   /debug/pprof/heap                  gzip pprof of the live heap now
//                                      (inuse_*) and what was allocated
//                                      since Start (alloc_*), as Go serves
//                                      it: with INPROF_ALLOC_PERIOD set
//   /debug/pprof/allocs                the same, opening on alloc_space
//   /debug/pprof/mutex, /block         gzip pprof of the lock waits since
//                                      Start (contentions, delay), with
//                                      INPROF_LOCK_PERIOD set; debug=1: Go's
//                                      legacy contention text
//   /debug/pprof/threads, /goroutine   every registered thread's stack now:
//                                      gzip pprof, a sample per thread
//                                      (its name, state, system call and
//                                      wait); debug=2: as text, debug=1:
//                                      grouped by stack (Go's forms)
// An endpoint for several processes (`inprof agent --http`) takes `pid=N`
// on each of these pages (optional while one process is connected), and
// its index lists the processes.
// N defaults to 30 and is bounded (1 to kMaxSeconds); one capture runs at a
// time and a second gets 429. The captures are windows of their own, cut
// from a mirror of the aggregate (SampleAggregator::SetMirror): the periodic
// export's windows are not touched, and sampling never waits for a request.
//
// Two halves: DebugEndpoint turns a request line into a response (parsing,
// validation, the one-capture rule; no sockets, fuzzed in
// fuzz/debug_endpoint_fuzzer.cc), and DebugServer serves it over HTTP with
// libmicrohttpd, loaded at run time (dlopen) by a process that turns the
// endpoint on: a host that does not never maps it.
#ifndef INPROF_INTERNAL_DEBUG_ENDPOINT_H_
#define INPROF_INTERNAL_DEBUG_ENDPOINT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "inprof/base/addresses.h"

namespace inprof::internal {

// Whether a request naming `host` in its Host header ("127.0.0.1:6060",
// "localhost", "[::1]:6060") is answered by an endpoint listening on
// `listening`: an IP address, localhost, or the listening host, each with or
// without a port. Anything else is a name the client resolved, which is how
// DNS rebinding lets a web page in a browser on this machine read the
// endpoint: a page of evil.example that re-resolves its name to 127.0.0.1
// sends "Host: evil.example:6060".
bool HostHeaderAllowed(absl::string_view host, const ListenAddress& listening);

struct DebugResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
};

class DebugEndpoint {
 public:
  static constexpr int kDefaultSeconds = 30;
  static constexpr int kMaxSeconds = 600;
  // Longest request target read (longer: 414).
  static constexpr size_t kMaxTargetLength = 4096;

  // The gzip pprof of the next `duration` (the profiler's); Unavailable
  // when the profiler stopped meanwhile.
  using Capture = std::function<absl::StatusOr<std::string>(absl::Duration)>;
  // The flame graph page of a pprof profile.
  using Render = std::function<absl::StatusOr<std::string>(
      const std::string& pprof, absl::string_view title)>;

  DebugEndpoint(Capture capture, Render render, std::string program);

  // Several processes (`inprof agent`): the capture of process `pid`
  // (NotFound when it is not connected), and the processes to list.
  struct Process {
    int64_t pid = 0;
    std::string program;
  };
  using ProcessCapture =
      std::function<absl::StatusOr<std::string>(absl::Duration, int64_t pid)>;
  using ProcessList = std::function<std::vector<Process>()>;
  DebugEndpoint(ProcessCapture capture, ProcessList processes, Render render,
                std::string program);

  // The heap snapshot (/debug/pprof/heap and /allocs): the gzip pprof of
  // the allocation provider's state now, opening on `default_type`
  // (inuse_space, alloc_space), or with `delta` > 0 (?seconds=N) the
  // difference of two snapshots that far apart; NotFound when allocations
  // are not profiled. Unset: those pages answer 404. Before the first
  // request.
  using Snapshot = std::function<absl::StatusOr<std::string>(absl::string_view default_type,
                                                             absl::Duration delta)>;
  void SetSnapshot(Snapshot snapshot) { snapshot_ = std::move(snapshot); }
  // Several processes: process `pid`'s (NotFound when it is not connected
  // or profiles no allocations), `delta` as above. Before the first request.
  using ProcessSnapshot = std::function<absl::StatusOr<std::string>(
      absl::string_view default_type, int64_t pid, absl::Duration delta)>;
  void SetProcessSnapshot(ProcessSnapshot snapshot) {
    process_snapshot_ = std::move(snapshot);
  }

  // The thread dump (/debug/pprof/threads, /goroutine): gzip pprof with
  // one sample type, `type` ("threads", "goroutine"), or text (`debug` 1:
  // grouped by stack; 2: a block per thread). Unset: those pages answer
  // 404. Before the first request.
  using ThreadDump =
      std::function<absl::StatusOr<std::string>(absl::string_view type, int debug)>;
  void SetThreadDump(ThreadDump dump) { thread_dump_ = std::move(dump); }
  // Several processes: process `pid`'s (`pid=`), as it dumps it.
  using ProcessThreadDump = std::function<absl::StatusOr<std::string>(
      absl::string_view type, int debug, int64_t pid)>;
  void SetProcessThreadDump(ProcessThreadDump dump) { process_thread_dump_ = std::move(dump); }

  // One request: `method` ("GET"), `target` as on the request line
  // ("/debug/pprof/profile?seconds=5"). Any thread; a capture blocks the
  // calling thread for its duration.
  DebugResponse Respond(absl::string_view method, absl::string_view target);

  // Captures answered (200) and refused because one was running (429).
  uint64_t captures() const { return captures_.load(); }
  uint64_t refused() const { return refused_.load(); }

 private:
  DebugResponse Index() const;
  std::string Running() const;  // the index's line about a capture
  std::string ProcessTable() const;  // the index's processes (several)

  // /debug/pprof/heap, /allocs, /mutex, /block: `name` is the page's.
  DebugResponse HeapSnapshot(absl::string_view default_type, absl::string_view query,
                             absl::string_view name);
  // /debug/pprof/threads and /goroutine (`name`).
  DebugResponse Threads(absl::string_view query, absl::string_view name);
  // Several processes: `pid=` of a query (0 when absent) as the process
  // it names (the only one connected when 0), with its title; or the
  // answer saying why not.
  std::optional<DebugResponse> ParsePid(const std::string& value, int64_t* pid) const;
  std::optional<DebugResponse> ChooseProcess(int64_t* pid, std::string* title) const;

  Capture capture_;
  Snapshot snapshot_;
  ThreadDump thread_dump_;
  ProcessThreadDump process_thread_dump_;
  ProcessSnapshot process_snapshot_;
  ProcessCapture process_capture_;  // set for several processes
  ProcessList processes_;
  Render render_;
  std::string program_;
  std::atomic<bool> busy_{false};
  std::atomic<int64_t> busy_until_ns_{0};  // the running capture's end
  std::atomic<uint64_t> captures_{0};
  std::atomic<uint64_t> refused_{0};
};

// The HTTP side: libmicrohttpd, a thread per connection, all signals
// blocked on its threads. At most kMaxConnections: one more closes the
// oldest connection not being answered (its request still arriving, or
// kept alive between requests) from the address with the most connections,
// so that slow or greedy clients, local ones included (all 127.0.0.1),
// never lock out one that sends its request at once; only when every
// connection is being answered is the new one closed. A connection idle for
// kIdleTimeout is closed, and so is one whose request has not fully arrived
// kRequestDeadline after the connection opened or its previous answer went
// out (a client that sends a byte now and then is never idle). A request
// whose Host header fails HostHeaderAllowed gets 403, and one line is
// logged. Every answer carries X-Content-Type-Options: nosniff.
class DebugServer {
 public:
  static constexpr unsigned kMaxConnections = 16;
  // Above kMaxConnections, what libmicrohttpd accepts before it refuses
  // (closes) a connection itself: room for those arriving while the ones
  // closed to make room are still closing.
  static constexpr unsigned kSpareConnections = 8;
  // What libmicrohttpd may use per connection for the request (its default
  // is 32 KiB): it keeps each query parameter in a record of ~50 bytes, so
  // 500 short ones (2 KiB) overflowed it and it closed the connection; with
  // this much, DebugEndpoint::kMaxTargetLength of one-letter parameters is
  // read and answered.
  static constexpr size_t kConnectionMemory = 256 * 1024;
  static constexpr absl::Duration kIdleTimeout = absl::Seconds(10);
  static constexpr absl::Duration kRequestDeadline = absl::Seconds(10);
  // How long Stop() lets answers under way (a capture cut short, a page
  // being sent) go out; requests still arriving are not waited for.
  static constexpr absl::Duration kStopGrace = absl::Seconds(2);

  // OK when libmicrohttpd can be loaded; otherwise Unavailable naming the
  // library and its Debian package. INPROF_LIBMICROHTTPD overrides the file.
  static absl::Status Available();

  // Where the server's threads keep their descriptors (owned_fd.h).
  enum class Descriptors {
    // A table of inprof's: in a program's process, where the program's
    // close_range or dup2 must never reach the server's sockets, nor the
    // server the program's files.
    kOwnTable,
    // The table of the thread calling Start: in a process of inprof's own
    // (`inprof agent`), whose answers use files that process opened (each
    // profiled process's symbol files) -- numbers that mean nothing in
    // another table.
    kCallersTable,
  };

  // Listens on `address` and answers with `endpoint` (not owned; it must
  // outlive the server). `request_deadline`: kRequestDeadline (tests
  // shorten it).
  static absl::StatusOr<std::unique_ptr<DebugServer>> Start(
      const ListenAddress& address, DebugEndpoint* endpoint,
      absl::Duration request_deadline = kRequestDeadline,
      Descriptors descriptors = Descriptors::kOwnTable);

  ~DebugServer();  // Stop()
  DebugServer(const DebugServer&) = delete;
  DebugServer& operator=(const DebugServer&) = delete;

  // The address bound ("127.0.0.1:43121").
  const std::string& address() const { return address_; }

  // Lets the answers under way go out (at most kStopGrace: the capture's
  // owner cut captures short first), closes the listening socket and every
  // connection, and waits for their threads. Idempotent. When the program
  // has closed the server's descriptors (a daemon's close_range), stopping
  // it would write to and close numbers that may now be the program's
  // files, and wait for a thread that never wakes: the server is left as it
  // is instead (logged).
  void Stop();

  // Connections closed because their request did not arrive within the
  // deadline, requests refused for their Host header, and connections
  // closed because the server was full (the oldest waiting one, or a new
  // one when all were being answered).
  uint64_t requests_cut() const;
  uint64_t hosts_refused() const;
  uint64_t connections_evicted() const;

  // The connections and their deadlines, the answers under way, and the
  // thread that cuts late requests (debug_server_mhd.cc; public only for
  // its callbacks).
  struct Watch;

  // In a forked child: the server's threads do not exist; closes the
  // child's copy of the listening socket and forgets the rest.
  void Abandon();

 private:
  DebugServer();
  void StopInOwnTable();
  void StopWatch();
  uint16_t bound_port_ = 0;
  void* daemon_ = nullptr;  // struct MHD_Daemon*
  std::unique_ptr<Watch> watch_;
  int listen_fd_ = -1;
  // What listen_fd_ was at Start() (owned_fd.h's FdIdentity): a number the
  // program closed (and may have reused) is never closed here.
  uint64_t listen_dev_ = 0;
  uint64_t listen_ino_ = 0;
  std::string address_;
};

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_DEBUG_ENDPOINT_H_
