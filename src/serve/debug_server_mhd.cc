// The HTTP half of the live endpoint, on GNU libmicrohttpd (Debian's
// libmicrohttpd12): a C library with a stable ABI, so it is loaded with
// dlopen() when INPROF_HTTP_ADDR is set and a host that leaves the endpoint
// off never maps it (as libcurl for uploads, http_client_curl.cc). It
// parses HTTP; what a request means is DebugEndpoint's, which gets the raw
// request target from MHD's URI callback (the path with its query).
//
// Threads: MHD's listening thread, one thread per connection (at most
// DebugServer::kMaxConnections, and a few more for a moment) and
// "inprof-http-watch", which cuts requests that do not arrive in time, all
// started with every signal blocked so that none of them is ever
// interrupted by the profiler's signals.
//
// A full server makes room rather than refusing: MHD's own limits refuse
// a new connection by closing it, and its per-address limit cannot tell
// local clients apart (all 127.0.0.1), so four trickling connections from
// one local client locked every other local client out. Instead, a
// connection beyond kMaxConnections closes the oldest connection that is
// not being answered (its request still arriving, or kept alive between
// requests), from the address holding the most connections: a client that
// sends its request at once is answered, a slow one loses its slot.
//
// The watch closes a late connection with shutdown(2) on MHD's socket,
// under the lock that MHD's MHD_CONNECTION_NOTIFY_CLOSED callback takes to
// forget it: MHD calls that callback before it closes the socket (in every
// release since 0.9.x), so the descriptor shut down is always still that
// connection's, never a number the host reused.
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <microhttpd.h>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "inprof/internal/debug_endpoint.h"
#include "inprof/base/log.h"
#include "inprof/base/profiler_thread.h"
#include "inprof/base/owned_fd.h"
#include "inprof/base/platform.h"

namespace inprof::internal {
namespace {

#define INPROF_MHD_FUNCTIONS(X) \
  X(MHD_start_daemon) \
  X(MHD_stop_daemon) \
  X(MHD_get_daemon_info) \
  X(MHD_create_response_from_buffer) \
  X(MHD_add_response_header) \
  X(MHD_queue_response) \
  X(MHD_destroy_response) \
  X(MHD_get_connection_info) \
  X(MHD_lookup_connection_value)

struct MhdApi {
#define INPROF_MHD_POINTER(name) decltype(&::name) name = nullptr;
  INPROF_MHD_FUNCTIONS(INPROF_MHD_POINTER)
#undef INPROF_MHD_POINTER
  std::string error;  // empty when loaded
};

// Loaded once per process, never unloaded.
const MhdApi& Mhd() {
  static const MhdApi* api = [] {
    auto* a = new MhdApi;
    const char* env = std::getenv("INPROF_LIBMICROHTTPD");
    const std::string path = env != nullptr && env[0] != '\0'
                                 ? std::string(env)
                                 : std::string("libmicrohttpd.so.12");
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* why = dlerror();
      a->error = absl::StrCat(
          "the endpoint needs libmicrohttpd ('", path,
          "', Debian package libmicrohttpd12), which cannot be loaded: ",
          why != nullptr ? why : "unknown");
      return a;
    }
#define INPROF_MHD_LOAD(name)                                                 \
  a->name = reinterpret_cast<decltype(&::name)>(dlsym(lib, #name));           \
  if (a->name == nullptr && a->error.empty()) {                               \
    a->error = absl::StrCat("the endpoint needs libmicrohttpd 0.9.71 or newer: '", \
                            path, "' has no ", #name);                        \
  }
    INPROF_MHD_FUNCTIONS(INPROF_MHD_LOAD)
#undef INPROF_MHD_LOAD
    return a;
  }();
  return *api;
}

// The request's target (MHD's URI callback) and whether its answer is
// under way (counted in Watch::answering).
struct RequestState {
  std::string target;
  bool answering = false;
};

std::string PeerAddress(const sockaddr* addr) {
  char text[INET6_ADDRSTRLEN] = "?";
  if (addr == nullptr) return text;
  if (addr->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(addr)->sin_addr,
              text, sizeof(text));
  } else if (addr->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr,
              text, sizeof(text));
  }
  return text;
}

}  // namespace

struct DebugServer::Watch {
  struct Connection {
    int fd = -1;
    FdIdentity identity;  // what fd was when the connection opened
    std::string peer;
    absl::Time since;     // opened, or its previous answer went out
    bool answering = false;
    bool cut = false;
    // The request arriving now (MHD frees a request's state only once its
    // handler ran: one whose client left before is freed on close).
    RequestState* request = nullptr;
  };
  DebugEndpoint* endpoint = nullptr;
  ListenAddress listening;
  absl::Duration deadline;
  std::mutex mu;
  std::condition_variable cv;
  std::map<const void*, Connection> connections;  // by MHD_Connection*
  bool stop = false;
  std::thread thread;
  // Answers under way: from the access handler to the request's completion.
  std::atomic<int> answering{0};
  std::atomic<uint64_t> cut{0};
  std::atomic<uint64_t> evicted{0};
  std::atomic<uint64_t> hosts_refused{0};
  std::atomic<bool> logged_cut{false};
  std::atomic<bool> logged_evicted{false};
  std::atomic<bool> logged_host{false};
  // The descriptor table the server's sockets are in: the owner thread's
  // own, which MHD's threads share (they are its children).
  DescriptorTableHandle table;
  // "inprof-http": made the private table, started MHD in it, stops it
  // there (Owner). Kept here so that a forked child leaks it (Abandon).
  std::thread owner;
  bool owner_stop = false;  // mu
  bool owner_stopped = false;  // mu

  // Marks `c` closed (mu held); whether its descriptor is still its own
  // to shut down: a number the program closed (and may have reused) is
  // left alone. The caller counts and logs first, then calls Shut(): a
  // client that sees the end finds it counted.
  static bool CutLocked(Connection& c) {
    c.cut = true;
    return c.fd >= 0 && IsStillOurs(c.fd, c.identity);
  }
  // MHD's thread sees the end and closes the connection.
  static void Shut(const Connection& c) { shutdown(c.fd, SHUT_RDWR); }

  // `newcomer` just opened: beyond kMaxConnections, closes the oldest
  // connection not being answered, from the address with the most
  // connections; when every other one is answering, the newcomer (mu held).
  void MakeRoomLocked(const void* newcomer) {
    std::map<std::string, int> per_peer;
    unsigned open = 0;
    for (const auto& [conn, c] : connections) {
      if (c.cut) continue;  // closing already
      ++open;
      ++per_peer[c.peer];
    }
    if (open <= kMaxConnections) return;
    Connection* victim = nullptr;
    for (auto& [conn, c] : connections) {
      if (conn == newcomer || c.cut || c.answering || c.fd < 0) continue;
      if (victim == nullptr || per_peer[c.peer] > per_peer[victim->peer] ||
          (per_peer[c.peer] == per_peer[victim->peer] && c.since < victim->since)) {
        victim = &c;
      }
    }
    const bool newest = victim == nullptr;
    if (newest) victim = &connections[newcomer];
    const absl::Duration waited = absl::Now() - victim->since;
    if (!CutLocked(*victim)) return;
    evicted.fetch_add(1);
    if (!logged_evicted.exchange(true)) {
      Log(newest ? absl::StrCat("live endpoint: closed a new connection from ", victim->peer,
                                ": all ", kMaxConnections,
                                " connections are being answered (further ones are not "
                                "logged)")
                 : absl::StrCat("live endpoint: closed a connection from ", victim->peer,
                                " whose request had not arrived in ",
                                absl::FormatDuration(absl::Trunc(waited, absl::Milliseconds(1))),
                                ", to make room for a new one (", kMaxConnections,
                                " connections at most; further ones are not logged)"));
    }
    Shut(*victim);
  }

  // Shuts down the connections whose request is late (mu held).
  absl::Duration CutLateLocked(absl::Time now) {
    absl::Duration next = deadline;
    for (auto& [conn, c] : connections) {
      if (c.answering || c.cut || c.fd < 0) continue;
      const absl::Duration waited = now - c.since;
      if (waited < deadline) {
        next = std::min(next, deadline - waited);
        continue;
      }
      if (!CutLocked(c)) continue;
      cut.fetch_add(1);
      if (!logged_cut.exchange(true)) {
        Log(absl::StrCat("live endpoint: closed a connection from ", c.peer,
                         " whose request did not arrive within ",
                         absl::FormatDuration(deadline),
                         " (further ones are not logged)"));
      }
      Shut(c);
    }
    return next;
  }

  void Run() {
    SetCurrentThreadName("inprof-http-watch");
    JoinDescriptorTable(table);
    std::unique_lock<std::mutex> lock(mu);
    while (!stop) {
      const absl::Duration next = CutLateLocked(absl::Now());
      cv.wait_for(lock, absl::ToChronoNanoseconds(
                            std::max(next, absl::Milliseconds(10))));
    }
  }
};

namespace {

// MHD_OPTION_NOTIFY_CONNECTION: a connection opened or closed (before MHD
// closes its socket).
void NotifyConnection(void* cls, struct MHD_Connection* connection, void**,
                      enum MHD_ConnectionNotificationCode code) {
  MarkProfilerThread();  // libmicrohttpd's connection threads are inprof's
  auto* watch = static_cast<DebugServer::Watch*>(cls);
  JoinDescriptorTable(watch->table);
  std::lock_guard<std::mutex> lock(watch->mu);
  if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
    if (auto it = watch->connections.find(connection);
        it != watch->connections.end()) {
      delete it->second.request;
      watch->connections.erase(it);
    }
    return;
  }
  const MhdApi& mhd = Mhd();
  DebugServer::Watch::Connection c;
  if (const union MHD_ConnectionInfo* info = mhd.MHD_get_connection_info(
          connection, MHD_CONNECTION_INFO_CONNECTION_FD)) {
    c.fd = info->connect_fd;
    c.identity = IdentifyFd(c.fd);
  }
  if (const union MHD_ConnectionInfo* info = mhd.MHD_get_connection_info(
          connection, MHD_CONNECTION_INFO_CLIENT_ADDRESS)) {
    c.peer = PeerAddress(info->client_addr);
  }
  // Without its descriptor it is not cut (the idle timeout still applies).
  c.since = absl::Now();
  watch->connections[connection] = std::move(c);
  watch->MakeRoomLocked(connection);
  watch->cv.notify_all();
}

// MHD_OPTION_URI_LOG_CALLBACK: the raw target, kept as the request's state.
void* KeepTarget(void* cls, const char* uri, struct MHD_Connection* connection) {
  auto* watch = static_cast<DebugServer::Watch*>(cls);
  auto* state = new RequestState;
  state->target = uri != nullptr ? uri : "";
  std::lock_guard<std::mutex> lock(watch->mu);
  if (auto it = watch->connections.find(connection); it != watch->connections.end()) {
    delete it->second.request;  // one whose handler never ran (cannot be)
    it->second.request = state;
  }
  return state;
}

// MHD_OPTION_NOTIFY_COMPLETED: the response is sent (or the client gone).
// A kept-alive connection's next request has a deadline of its own.
void FreeTarget(void* cls, struct MHD_Connection* connection, void** state,
                enum MHD_RequestTerminationCode) {
  auto* watch = static_cast<DebugServer::Watch*>(cls);
  auto* request = static_cast<RequestState*>(*state);
  *state = nullptr;
  if (request != nullptr && request->answering) watch->answering.fetch_sub(1);
  std::lock_guard<std::mutex> lock(watch->mu);
  if (auto it = watch->connections.find(connection); it != watch->connections.end()) {
    if (it->second.request == request) it->second.request = nullptr;
    it->second.answering = false;
    it->second.since = absl::Now();
  }
  delete request;
}

enum MHD_Result Queue(struct MHD_Connection* connection, const DebugResponse& r) {
  const MhdApi& mhd = Mhd();
  struct MHD_Response* response = mhd.MHD_create_response_from_buffer(
      r.body.size(), const_cast<char*>(r.body.data()), MHD_RESPMEM_MUST_COPY);
  if (response == nullptr) return MHD_NO;
  mhd.MHD_add_response_header(response, "Content-Type", r.content_type.c_str());
  mhd.MHD_add_response_header(response, "Cache-Control", "no-store");
  // Every answer, errors too: an error's text may quote the request, and
  // a browser must not take it for HTML.
  mhd.MHD_add_response_header(response, "X-Content-Type-Options", "nosniff");
  for (const auto& [name, value] : r.headers) {
    if (name == "X-Content-Type-Options") continue;  // said above
    mhd.MHD_add_response_header(response, name.c_str(), value.c_str());
  }
  const enum MHD_Result queued = mhd.MHD_queue_response(
      connection, static_cast<unsigned>(r.status), response);
  mhd.MHD_destroy_response(response);
  return queued;
}

enum MHD_Result Answer(void* cls, struct MHD_Connection* connection,
                       const char*, const char* method, const char*,
                       const char*, size_t* upload_size, void** state) {
  MarkProfilerThread();  // the allocation profiler leaves this thread out
  auto* watch = static_cast<DebugServer::Watch*>(cls);
  JoinDescriptorTable(watch->table);
  const MhdApi& mhd = Mhd();
  auto* request = static_cast<RequestState*>(*state);
  // A body (never expected) is answered by the 405 below without reading it.
  if (upload_size != nullptr) *upload_size = 0;
  if (request != nullptr && !request->answering) {
    request->answering = true;
    watch->answering.fetch_add(1);
    std::lock_guard<std::mutex> lock(watch->mu);
    if (auto it = watch->connections.find(connection); it != watch->connections.end()) {
      it->second.answering = true;
    }
  }
  // No Host header: an HTTP/1.0 client (MHD refuses HTTP/1.1 without one),
  // never a browser.
  const char* host =
      mhd.MHD_lookup_connection_value(connection, MHD_HEADER_KIND, "Host");
  if (host != nullptr && !HostHeaderAllowed(host, watch->listening)) {
    watch->hosts_refused.fetch_add(1);
    std::string shown = absl::CHexEscape(absl::string_view(host).substr(0, 64));
    if (!watch->logged_host.exchange(true)) {
      Log(absl::StrCat("live endpoint: refused a request for Host '", shown,
                       "' (403): only an IP address, localhost or ",
                       watch->listening.host,
                       " is answered, against DNS rebinding (further refusals "
                       "are not logged)"));
    }
    DebugResponse r;
    r.status = 403;
    r.body = absl::StrCat("Host '", shown,
                          "' refused: address the endpoint by its IP address "
                          "or localhost (names are refused against DNS "
                          "rebinding)\n");
    return Queue(connection, r);
  }
  return Queue(connection,
               watch->endpoint->Respond(method != nullptr ? method : "",
                                        request != nullptr ? request->target : ""));
}

}  // namespace

DebugServer::DebugServer() : watch_(std::make_unique<Watch>()) {}

absl::Status DebugServer::Available() {
  const MhdApi& mhd = Mhd();
  if (!mhd.error.empty()) return absl::UnavailableError(mhd.error);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DebugServer>> DebugServer::Start(
    const ListenAddress& address, DebugEndpoint* endpoint,
    absl::Duration request_deadline, Descriptors descriptors) {
  if (absl::Status s = Available(); !s.ok()) return s;
  sockaddr_in v4{};
  sockaddr_in6 v6{};
  const sockaddr* addr = nullptr;
  if (address.ipv6) {
    v6.sin6_family = AF_INET6;
    v6.sin6_port = htons(static_cast<uint16_t>(address.port));
    if (inet_pton(AF_INET6, address.host.c_str(), &v6.sin6_addr) != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", address.host, "' is not an IPv6 address"));
    }
    addr = reinterpret_cast<const sockaddr*>(&v6);
  } else {
    v4.sin_family = AF_INET;
    v4.sin_port = htons(static_cast<uint16_t>(address.port));
    if (inet_pton(AF_INET, address.host.c_str(), &v4.sin_addr) != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", address.host, "' is not an IPv4 address"));
    }
    addr = reinterpret_cast<const sockaddr*>(&v4);
  }
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD |
                   MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL;
  if (address.ipv6) flags |= MHD_USE_IPv6;

  // MHD's threads inherit this mask: all signals blocked but the ones a
  // fault raises.
  sigset_t all;
  sigset_t old;
  sigfillset(&all);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT}) {
    sigdelset(&all, sig);
  }
  std::unique_ptr<DebugServer> server(new DebugServer);
  Watch* watch = server->watch_.get();
  watch->endpoint = endpoint;
  watch->listening = address;
  watch->deadline = request_deadline;
  // The server's sockets live in a descriptor table of inprof's
  // (owned_fd.h): made by "inprof-http", whose children MHD's threads are.
  // The program's close_range or dup2 never reaches them, nor they the
  // program's files. Without private tables (refused, ThreadSanitizer) the
  // owner thread uses the program's, as the server did before; so does it
  // with kCallersTable (the table of the thread calling Start).
  struct Started {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    struct MHD_Daemon* daemon = nullptr;
    int error = 0;
  } started;
  DebugServer* self = server.get();
  pthread_sigmask(SIG_SETMASK, &all, &old);
  try {
    watch->owner = std::thread([self, watch, &started, flags, address, addr,
                                caller = ThisDescriptorTable(), descriptors] {
      MarkProfilerThread();
      SetCurrentThreadName("inprof-http");
      if (descriptors == Descriptors::kOwnTable) {
        EnterPrivateDescriptorTable();
      } else {
        JoinDescriptorTable(caller);
      }
      watch->table = ThisDescriptorTable();
      const MhdApi& mhd = Mhd();
      errno = 0;
      struct MHD_Daemon* daemon = mhd.MHD_start_daemon(
          flags, static_cast<uint16_t>(address.port), nullptr, nullptr, &Answer,
          watch, MHD_OPTION_SOCK_ADDR, addr, MHD_OPTION_CONNECTION_LIMIT,
          kMaxConnections + kSpareConnections, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
          kConnectionMemory, MHD_OPTION_CONNECTION_TIMEOUT,
          static_cast<unsigned>(absl::ToInt64Seconds(kIdleTimeout)),
          MHD_OPTION_NOTIFY_CONNECTION, &NotifyConnection, watch,
          MHD_OPTION_URI_LOG_CALLBACK, &KeepTarget, watch,
          MHD_OPTION_NOTIFY_COMPLETED, &FreeTarget, watch, MHD_OPTION_END);
      const int error = errno;
      if (daemon != nullptr) {
        try {
          watch->thread = std::thread([watch] {
            MarkProfilerThread();
            watch->Run();
          });
        } catch (const std::system_error&) {
          // No watch thread: late requests are cut by MHD's idle timeout.
        }
        self->daemon_ = daemon;
        if (const union MHD_DaemonInfo* info =
                mhd.MHD_get_daemon_info(daemon, MHD_DAEMON_INFO_LISTEN_FD)) {
          self->listen_fd_ = info->listen_fd;
          const FdIdentity identity = IdentifyFd(info->listen_fd);
          self->listen_dev_ = identity.dev;
          self->listen_ino_ = identity.ino;
          sockaddr_storage storage{};
          socklen_t len = sizeof(storage);
          if (getsockname(info->listen_fd, reinterpret_cast<sockaddr*>(&storage),
                          &len) == 0) {
            self->bound_port_ = storage.ss_family == AF_INET6
                ? ntohs(reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port)
                : ntohs(reinterpret_cast<sockaddr_in*>(&storage)->sin_port);
          }
        }
      }
      {
        std::lock_guard<std::mutex> lock(started.mu);
        started.daemon = daemon;
        started.error = error;
        started.done = true;
        started.cv.notify_all();
      }
      if (daemon == nullptr) return;
      // `started` is gone from here on. Stopped in this table.
      std::unique_lock<std::mutex> lock(watch->mu);
      watch->cv.wait(lock, [watch] { return watch->owner_stop; });
      lock.unlock();
      self->StopInOwnTable();
    });
  } catch (const std::system_error& e) {
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", FormatListenAddress(address), ": no thread (", e.what(), ")"));
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  {
    std::unique_lock<std::mutex> lock(started.mu);
    started.cv.wait(lock, [&started] { return started.done; });
  }
  if (started.daemon == nullptr) {
    watch->owner.join();
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", FormatListenAddress(address),
        started.error != 0 ? absl::StrCat(": ", std::strerror(started.error)) : ""));
  }
  ListenAddress bound = address;
  if (server->bound_port_ != 0) bound.port = server->bound_port_;
  server->address_ = FormatListenAddress(bound);
  return server;
}

DebugServer::~DebugServer() { Stop(); }

namespace {

FdIdentity ListenIdentity(uint64_t dev, uint64_t ino) {
  FdIdentity identity;
  identity.dev = static_cast<dev_t>(dev);
  identity.ino = static_cast<ino_t>(ino);
  identity.type = S_IFSOCK;
  identity.valid = true;
  return identity;
}

}  // namespace

void DebugServer::Stop() {
  Watch* watch = watch_.get();
  if (watch == nullptr || !watch->owner.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(watch->mu);
    watch->owner_stop = true;
  }
  watch->cv.notify_all();
  watch->owner.join();
  if (watch->owner_stopped) return;
  // The program closed the server's descriptors: MHD's threads may still
  // call back into the watch, which stays (leaked), its thread stopped.
  (void)watch_.release();
}

// On the owner thread, in the server's descriptor table.
void DebugServer::StopInOwnTable() {
  if (daemon_ == nullptr) return;
  // MHD_stop_daemon() wakes its thread through a descriptor of its own
  // (an eventfd) and closes its descriptors by number. Where the server
  // shares the program's table (no table of its own) and the program
  // closed the listening socket, it closed the rest too (and may have
  // reused the numbers), and that thread would never wake. Leave the server
  // alone.
  if (listen_fd_ >= 0 &&
      !IsStillOurs(listen_fd_, ListenIdentity(listen_dev_, listen_ino_))) {
    NoteDescriptorTaken(listen_fd_, "the live endpoint's listening socket");
    Log(absl::StrCat("the live endpoint ", address_,
                     " is left as it is: the program closed its descriptors"));
    daemon_ = nullptr;
    listen_fd_ = -1;
    StopWatch();
    return;
  }
  // Answers under way were told to end (a capture answers 503 once the
  // profiler stops): let them go out, for a bounded time, before MHD
  // closes every connection. A request still arriving is not waited for.
  const absl::Time deadline = absl::Now() + kStopGrace;
  while (watch_->answering.load() > 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  Mhd().MHD_stop_daemon(static_cast<struct MHD_Daemon*>(daemon_));
  daemon_ = nullptr;
  listen_fd_ = -1;
  StopWatch();
  watch_->owner_stopped = true;
}

void DebugServer::StopWatch() {
  {
    std::lock_guard<std::mutex> lock(watch_->mu);
    watch_->stop = true;
  }
  watch_->cv.notify_all();
  if (watch_->thread.joinable()) watch_->thread.join();
}

uint64_t DebugServer::requests_cut() const { return watch_->cut.load(); }
uint64_t DebugServer::connections_evicted() const {
  return watch_->evicted.load();
}
uint64_t DebugServer::hosts_refused() const {
  return watch_->hosts_refused.load();
}

void DebugServer::Abandon() {
  // The child's table is a copy of the program's: the listening socket is
  // in it only where the server had no table of its own.
  if (listen_fd_ >= 0 && watch_ != nullptr && watch_->table.table == 0) {
    CloseIfOurs(listen_fd_, ListenIdentity(listen_dev_, listen_ino_));
  }
  listen_fd_ = -1;
  daemon_ = nullptr;  // leaked: its threads are the parent's
  (void)watch_.release();  // likewise (its thread too)
}

}  // namespace inprof::internal
