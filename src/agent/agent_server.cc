#include "src/agent/agent_server.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "inprof/base/log.h"
#include "inprof/internal/endpoint_attachment.h"
#include "inprof/symbolizer.h"
#include "src/agent/agent_session.h"

namespace inprof::agent {
namespace {

// Descriptors a process about to be served will hold: its connection, its
// region, one per file it maps (its symbolizer keeps them open) and about
// as many again once it is symbolized (libdw's copy of each, debug files).
// A compiler process maps ~10 files and held ~24 (the measurement).
constexpr int kFdsPerProcess = 32;

// How long the listening socket goes unwatched when a connection cannot be
// accepted at all (no descriptor, not even the spare).
constexpr auto kAcceptPause = std::chrono::milliseconds(100);

// The descriptors open in this process, and its limit.
struct FdUsage {
  int open = 0;
  int limit = 0;  // INT32_MAX: no limit
};
FdUsage Descriptors() {
  FdUsage usage;
  rlimit rl{};
  usage.limit = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < INT32_MAX
                    ? static_cast<int>(rl.rlim_cur)
                    : INT32_MAX;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) {
    // Out of descriptors, or no /proc: count none free.
    usage.open = errno == EMFILE ? usage.limit : 0;
    return usage;
  }
  while (readdir(dir) != nullptr) ++usage.open;
  closedir(dir);
  usage.open -= 3;  // ".", ".." and the directory's own
  return usage;
}

bool UidAllowed(uid_t uid, const std::vector<uid_t>& allowed) {
  return uid == getuid() || uid == 0 ||
         std::find(allowed.begin(), allowed.end(), uid) != allowed.end();
}

std::string NotAllowed(uid_t uid) {
  return absl::StrFormat(
      "uid %u may not use this agent (it runs as uid %u; "
      "`inprof agent --allow-uid %u` serves that user too)",
      uid, getuid(), uid);
}

}  // namespace

struct AgentServer::Client {
  int fd = -1;
  internal::PeerCredentials peer;
  std::chrono::steady_clock::time_point accepted;
  bool welcomed = false;
  AgentProcess process;
  std::shared_ptr<AgentSession> session;
  std::atomic<bool> finished{false};
};

AgentServer::AgentServer(AgentServerOptions options) : options_(std::move(options)) {}

AgentServer::~AgentServer() { Stop(); }

absl::Status AgentServer::Start() {
  if (thread_.joinable()) return absl::OkStatus();
  auto listener = internal::ListenAgentSocket(options_.address);
  if (!listener.ok()) return listener.status();
  listener_ = *listener;
  wake_fd_ = eventfd(0, EFD_CLOEXEC);
  if (wake_fd_ < 0) {
    const std::string error = std::strerror(errno);
    close(listener_.fd);
    internal::RemoveAgentSocket(options_.address, listener_);
    listener_ = {};
    return absl::InternalError(absl::StrCat("agent: eventfd: ", error));
  }
  spare_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
  thread_ = std::thread([this] { Serve(); });
  if (options_.profile && !options_.profile_options.http_addr.empty()) StartEndpoint();
  return absl::OkStatus();
}

void AgentServer::StartEndpoint() {
  absl::StatusOr<internal::ListenAddress> address =
      internal::ParseListenAddress(options_.profile_options.http_addr);
  if (!address.ok()) {
    Log(absl::StrCat("agent: ", address.status().message(), "; no endpoint"));
    return;
  }
  endpoint_ = std::make_unique<internal::DebugEndpoint>(
      [this](absl::Duration d, int64_t pid) { return Capture(d, pid); },
      [this] {
        std::vector<internal::DebugEndpoint::Process> out;
        std::lock_guard<std::mutex> lock(mutex_);
        for (const auto& c : clients_) {
          if (c->process.connected && c->session != nullptr) {
            out.push_back({c->process.hello.pid, c->process.hello.program});
          }
        }
        return out;
      },
      &internal::RenderFlamegraphPage,
      absl::StrCat("inprof agent (pid ", getpid(), ")"));
  endpoint_->SetProcessSnapshot(
      [this](absl::string_view default_type, int64_t pid, absl::Duration delta) {
        return HeapSnapshot(default_type, pid, delta);
      });
  endpoint_->SetProcessThreadDump([this](absl::string_view type, int debug, int64_t pid) {
    return ThreadDump(type, debug, pid);
  });
  absl::StatusOr<std::unique_ptr<internal::DebugServer>> server =
      internal::DebugServer::Start(
          *address, endpoint_.get(), internal::DebugServer::kRequestDeadline,
          // A capture symbolizes with the session's symbolizer, whose files
          // this thread's table holds (Pipeline::EncodeForRequest).
          internal::DebugServer::Descriptors::kCallersTable);
  if (!server.ok()) {
    Log(absl::StrCat("agent: INPROF_HTTP_ADDR='",
                     absl::CHexEscape(options_.profile_options.http_addr),
                     "': ", server.status().message(), "; no endpoint"));
    endpoint_.reset();
    return;
  }
  http_ = std::move(*server);
  Log(absl::StrCat("agent: serving http://", http_->address(),
                        "/debug/pprof/ for its processes (INPROF_HTTP_ADDR)"));
}

std::string AgentServer::http_address() const {
  return http_ != nullptr ? http_->address() : std::string();
}

std::shared_ptr<AgentSession> AgentServer::ConnectedSession(int64_t pid) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::shared_ptr<AgentSession> session;
  for (const auto& c : clients_) {
    if (c->process.connected && c->session != nullptr && c->process.hello.pid == pid) {
      session = c->session;
    }
  }
  return session;
}

absl::StatusOr<std::string> AgentServer::Capture(absl::Duration duration, int64_t pid) {
  std::shared_ptr<AgentSession> session = ConnectedSession(pid);
  if (session == nullptr) {
    return absl::NotFoundError(absl::StrCat("no process ", pid, " is connected"));
  }
  return session->Capture(duration);
}

absl::StatusOr<std::string> AgentServer::HeapSnapshot(absl::string_view default_type,
                                                      int64_t pid, absl::Duration delta) {
  std::shared_ptr<AgentSession> session = ConnectedSession(pid);
  if (session == nullptr) {
    return absl::NotFoundError(absl::StrCat("no process ", pid, " is connected"));
  }
  return session->HeapSnapshot(default_type, delta);
}

absl::StatusOr<std::string> AgentServer::ThreadDump(absl::string_view type, int debug,
                                                    int64_t pid) {
  std::shared_ptr<AgentSession> session = ConnectedSession(pid);
  if (session == nullptr) {
    return absl::NotFoundError(absl::StrCat("no process ", pid, " is connected"));
  }
  // The request goes over the process's socket, while it is still the
  // one the session was made for (under mutex_: the serving thread closes
  // it under that lock).
  const std::function<absl::Status(uint32_t)> ask = [&](uint32_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& c : clients_) {
      if (c->session == session && c->fd >= 0) {
        return internal::SendAgentMessage(c->fd, internal::AgentDumpRequest{id}, -1,
                                          /*timeout_ms=*/0);
      }
    }
    return absl::UnavailableError("its connection ended");
  };
  return session->ThreadDump(type, debug, ask);
}

void AgentServer::Stop() {
  if (!thread_.joinable()) return;
  // Before the sessions finish: a capture in progress is ended by its
  // session's Finish(), and the server waits for its answer.
  std::unique_ptr<internal::DebugServer> http = std::move(http_);
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  thread_.join();
  close(wake_fd_);
  // The socket file goes first: a new agent may bind the path at once.
  internal::RemoveAgentSocket(options_.address, listener_);
  close(listener_.fd);
  if (spare_fd_ >= 0) close(spare_fd_);
  wake_fd_ = listener_.fd = spare_fd_ = -1;
  std::vector<std::pair<Client*, std::thread>> finishers;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& c : clients_) {
      if (c->fd >= 0) close(c->fd);
      c->fd = -1;
      if (c->process.connected) FinishLocked(*c);  // their last windows
      c->process.connected = false;
    }
    finishers.swap(finishers_);
  }
  for (auto& f : finishers) f.second.join();
  if (http != nullptr) http->Stop();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    finishers_ = std::move(finishers);
    ReapLocked(/*all=*/true);
  }
  endpoint_.reset();
}

void AgentServer::ReapLocked(bool all) {
  bool freed = false;
  for (auto it = finishers_.begin(); it != finishers_.end();) {
    Client& c = *it->first;
    if (!all && !c.finished.load()) {
      ++it;
      continue;
    }
    if (it->second.joinable()) it->second.join();
    if (c.session != nullptr) {
      c.process.output = c.session->process_options().output;
      c.process.samples = c.session->samples_read();
      c.process.samples_from_thread_rings = c.session->samples_from_thread_rings();
      c.process.profiles = c.session->windows_exported();
      c.process.ended_cleanly = c.session->ended_cleanly();
      c.process.error = c.session->error();
      c.session.reset();
      freed = true;
    }
    it = finishers_.erase(it);
  }
#ifdef __GLIBC__
  // A session's memory (its label table, aggregate, symbolizer) was
  // allocated on its threads' arenas, which glibc keeps once freed: given
  // back, so that a process that made the agent grow does not leave it so.
  if (freed) malloc_trim(0);
#endif
}

void AgentServer::FinishLocked(Client& client) {
  if (client.session == nullptr) {
    client.finished = true;
    return;
  }
  finishers_.emplace_back(&client, std::thread([&client, session = client.session] {
    session->Finish().IgnoreError();
    client.finished = true;
  }));
}

std::vector<AgentProcess> AgentServer::Processes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<AgentProcess> out;
  for (const auto& c : clients_) {
    if (!c->welcomed) continue;
    out.push_back(c->process);
    AgentProcess& p = out.back();
    p.finished = c->finished.load();
    if (c->session != nullptr) {
      p.output = c->session->process_options().output;
      p.samples = c->session->samples_read();
      p.samples_from_thread_rings = c->session->samples_from_thread_rings();
      p.profiles = c->session->windows_exported();
      p.ended_cleanly = c->session->ended_cleanly();
      p.error = c->session->error();
    }
  }
  return out;
}

void AgentServer::Log(const std::string& line) const {
  // Lines carry what peers say (program names, tags): one line each, no
  // terminal control.
  if (options_.log != nullptr) options_.log(internal::EscapeForLog(line));
}

void AgentServer::LogLimited(const std::string& line) {
  FlushLimitedLog();
  if (limited_lines_ < 10) {
    ++limited_lines_;
    Log(line);
  } else {
    ++limited_suppressed_;
  }
}

void AgentServer::FlushLimitedLog() {
  const auto now = std::chrono::steady_clock::now();
  if (now - limited_since_ < std::chrono::seconds(1)) return;
  if (limited_suppressed_ > 0) {
    Log(absl::StrCat("agent: ", limited_suppressed_,
                     " more lines like the last (connections refused or not "
                     "accepted) in the last second were not logged"));
  }
  limited_since_ = now;
  limited_lines_ = 0;
  limited_suppressed_ = 0;
}

void AgentServer::LogEvent(const std::string& line) const {
  if (options_.log_connections) Log(line);
}

void AgentServer::Serve() {
  std::vector<pollfd> fds;
  std::vector<Client*> polled;
  for (;;) {
    fds.clear();
    polled.clear();
    const auto before = std::chrono::steady_clock::now();
    // Not watched while accepting is paused: poll would report it ready at
    // once, again and again.
    const bool accepting = before >= accept_paused_until_;
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({listener_.fd, static_cast<short>(accepting ? POLLIN : 0), 0});
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto& c : clients_) {
        if (c->fd < 0) continue;
        fds.push_back({c->fd, POLLIN, 0});
        polled.push_back(c.get());
      }
    }
    // Rings are read every 20 ms (a 1 MiB ring holds over a second of a
    // busy process's samples); with no process connected the agent only
    // waits (the timeout then bounds a handshake's wait for its hello).
    int timeout = options_.profile && !polled.empty() ? 20 : 100;
    if (!accepting) {
      const auto paused = std::chrono::duration_cast<std::chrono::milliseconds>(
          accept_paused_until_ - before);
      timeout = std::min<int>(timeout, static_cast<int>(paused.count()) + 1);
    }
    const int ready = poll(fds.data(), fds.size(), timeout);
    if (ready < 0 && errno != EINTR) {
      Log(absl::StrCat("agent: poll: ", std::strerror(errno)));
      return;
    }
    if ((fds[0].revents & POLLIN) != 0) return;
    if ((fds[1].revents & POLLIN) != 0) Accept();
    FlushLimitedLog();
    const auto now = std::chrono::steady_clock::now();
    if (options_.profile) {
      std::vector<std::shared_ptr<AgentSession>> sessions;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        for (auto& c : clients_) {
          if (c->session != nullptr && c->fd >= 0) sessions.push_back(c->session);
        }
      }
      for (auto& session : sessions) session->Drain();
    }
    for (size_t i = 0; i < polled.size(); ++i) {
      Client& c = *polled[i];
      if ((fds[i + 2].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
        if (!c.welcomed) {
          Handshake(c);
          continue;
        }
        // Version 1 says nothing after its hello: the process is gone, or
        // it speaks garbage.
        auto message = internal::ReceiveAgentMessage(c.fd, 0);
        if (absl::IsDeadlineExceeded(message.status())) continue;  // nothing after all
        std::lock_guard<std::mutex> lock(mutex_);
        if (message.ok() || absl::IsUnavailable(message.status())) {
          LogEvent(absl::StrFormat("agent: pid %d (%s) disconnected", c.peer.pid,
                                   c.process.hello.program));
        } else {
          Log(absl::StrFormat("agent: pid %d (%s) dropped: %s", c.peer.pid,
                              c.process.hello.program, message.status().message()));
        }
        close(c.fd);
        c.fd = -1;
        c.process.connected = false;
        FinishLocked(c);
      } else if (!c.welcomed &&
                 now - c.accepted > std::chrono::milliseconds(options_.handshake_timeout_ms)) {
        Refuse(c, absl::StrCat("no hello within ", options_.handshake_timeout_ms, " ms"));
      }
    }
    std::lock_guard<std::mutex> lock(mutex_);
    ReapLocked(/*all=*/false);
    // Connections that never became a process are forgotten, and so are
    // the oldest finished processes beyond max_finished_kept.
    auto done = [](const std::unique_ptr<Client>& c) {
      return c->welcomed && c->fd < 0 && c->finished.load() && c->session == nullptr;
    };
    size_t finished = 0;
    if (options_.max_finished_kept > 0) {
      finished = static_cast<size_t>(std::count_if(clients_.begin(), clients_.end(), done));
    }
    clients_.erase(std::remove_if(clients_.begin(), clients_.end(),
                                  [&](const std::unique_ptr<Client>& c) {
                                    if (c->fd < 0 && !c->welcomed) return true;
                                    if (options_.max_finished_kept > 0 &&
                                        finished > options_.max_finished_kept && done(c)) {
                                      --finished;
                                      return true;
                                    }
                                    return false;
                                  }),
                   clients_.end());
  }
}

void AgentServer::Accept() {
  // A burst of connections (a build starting) is taken in one go, a flood
  // a bounded part at a time.
  for (int taken = 0; taken < 64; ++taken) {
    int fd = accept4(listener_.fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) {
      Admit(fd);
      continue;
    }
    const int error = errno;
    if (error == EAGAIN || error == EWOULDBLOCK) return;
    if (error == EINTR || error == ECONNABORTED || error == EPROTO) continue;
    if ((error == EMFILE || error == ENFILE) && spare_fd_ >= 0) {
      // Out of descriptors: the spare makes room for the connection, which
      // is refused (its process then profiles itself), and is taken back.
      close(spare_fd_);
      spare_fd_ = -1;
      fd = accept4(listener_.fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd >= 0) {
        auto peer = internal::GetPeerCredentials(fd);
        const rlimit limit = [] {
          rlimit rl{};
          getrlimit(RLIMIT_NOFILE, &rl);
          return rl;
        }();
        RefuseNow(fd, peer.ok() ? *peer : internal::PeerCredentials{},
                  absl::StrFormat("the agent is out of file descriptors (%s; "
                                  "its limit is %d)",
                                  std::strerror(error),
                                  static_cast<int>(limit.rlim_cur)));
      }
      spare_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
      if (fd >= 0) continue;
    }
    // No way to take the connection now: the socket is left alone for a
    // while (it would read as ready at once, forever).
    accept_paused_until_ = std::chrono::steady_clock::now() + kAcceptPause;
    LogLimited(absl::StrCat("agent: cannot accept connections: ", std::strerror(error),
                            "; trying again in ", kAcceptPause.count(), " ms"));
    return;
  }
}

void AgentServer::Admit(int fd) {
  auto peer = internal::GetPeerCredentials(fd);
  if (!peer.ok()) {
    LogLimited(absl::StrCat("agent: ", peer.status().message()));
    close(fd);
    return;
  }
  // Another user's process is refused now, never kept waiting for its
  // hello: a flood of them holds no descriptor here.
  if (!UidAllowed(peer->uid, options_.allowed_uids)) {
    RefuseNow(fd, *peer, NotAllowed(peer->uid));
    return;
  }
  int pending = 0, pending_uid = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& c : clients_) {
      if (c->welcomed || c->fd < 0) continue;
      ++pending;
      pending_uid += c->peer.uid == peer->uid;
    }
  }
  if (pending_uid >= kMaxPendingPerUid || pending >= kMaxPending) {
    RefuseNow(fd, *peer,
              absl::StrFormat("too many connections wait for their hello (%d of "
                              "uid %u, %d in all; at most %d and %d)",
                              pending_uid, peer->uid, pending, kMaxPendingPerUid,
                              kMaxPending));
    return;
  }
  auto client = std::make_unique<Client>();
  client->fd = fd;
  client->accepted = std::chrono::steady_clock::now();
  client->peer = *peer;
  std::lock_guard<std::mutex> lock(mutex_);
  clients_.push_back(std::move(client));
}

void AgentServer::RefuseNow(int fd, const internal::PeerCredentials& peer,
                            const std::string& reason) {
  refused_.fetch_add(1);
  LogLimited(absl::StrFormat("agent: refused pid %d (uid %u): %s", peer.pid,
                             peer.uid, reason));
  // What it sent is read first: a socket closed with unread data resets,
  // and the process would read the reset before the reason (it reads on
  // past one, ReceiveAgentMessage, but an older one would not).
  char sink[256];
  for (int i = 0; i < 4 && recv(fd, sink, sizeof(sink), MSG_DONTWAIT) > 0; ++i) {
  }
  (void)internal::SendAgentMessage(fd, internal::AgentReject{reason});
  close(fd);
}

void AgentServer::Refuse(Client& client, const std::string& reason) {
  refused_.fetch_add(1);
  LogLimited(absl::StrFormat("agent: refused pid %d (uid %u): %s", client.peer.pid,
                             client.peer.uid, reason));
  (void)internal::SendAgentMessage(client.fd, internal::AgentReject{reason});
  close(client.fd);
  client.fd = -1;
}

std::string AgentServer::DescriptorShortage(int connected, int needed) const {
  const FdUsage fds = Descriptors();
  if (fds.limit == INT32_MAX || fds.open + needed + kFdReserve <= fds.limit) {
    return "";
  }
  return absl::StrFormat(
      "the agent is near its descriptor limit (%d of %d open, serving %d "
      "processes; it keeps %d free for them and needs about %d for a new one)",
      fds.open, fds.limit, connected, kFdReserve, kFdsPerProcess);
}

void AgentServer::Handshake(Client& client) {
  int stray_fd = -1;
  auto message = internal::ReceiveAgentMessage(client.fd, 0, &stray_fd);
  if (stray_fd >= 0) close(stray_fd);  // a process passes nothing
  if (!message.ok()) {
    if (absl::IsUnavailable(message.status())) {  // gone before its hello
      close(client.fd);
      client.fd = -1;
      return;
    }
    if (absl::IsDeadlineExceeded(message.status())) return;  // not yet after all
    Refuse(client, std::string(message.status().message()));
    return;
  }
  // Refused after its hello is read: closing a socket with unread data
  // resets it, and the process would see "connection reset" instead of
  // the reason.
  if (!UidAllowed(client.peer.uid, options_.allowed_uids)) {  // checked at accept
    Refuse(client, NotAllowed(client.peer.uid));
    return;
  }
  const auto* hello = std::get_if<internal::AgentHello>(&*message);
  if (hello == nullptr) {
    Refuse(client, "the first message must be a hello");
    return;
  }
  int connected = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& c : clients_) connected += c->process.connected;
  }
  // Serving a process that would run the agent out of descriptors loses
  // its profile (and others'); it is told, and profiles itself.
  if (std::string shortage = DescriptorShortage(connected, kFdsPerProcess);
      !shortage.empty()) {
    Refuse(client, shortage);
    return;
  }
  const uint64_t bytes = uint64_t{hello->max_threads} * hello->ring_bytes;
  const int region = memfd_create(absl::StrCat("inprof-rings-", client.peer.pid).c_str(),
                                  MFD_CLOEXEC | MFD_ALLOW_SEALING);
  // The process must not shrink the region under the agent's mapping (a
  // read past the end would be SIGBUS in the agent).
  if (region < 0 || ftruncate(region, static_cast<off_t>(bytes)) != 0 ||
      fcntl(region, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) != 0) {
    const std::string error = std::strerror(errno);
    if (region >= 0) close(region);
    Refuse(client, absl::StrCat("the agent could not make ", bytes,
                                " bytes of shared memory: ", error));
    return;
  }
  // The process's symbolizer is made now, while the process waits for its
  // welcome and so is certainly alive: its maps are read and its mapped
  // files opened (kept open: a process that lives a millisecond is still
  // symbolized). A process the agent could not profile (its maps
  // unreadable, its region unmappable, the agent short of descriptors
  // after opening its files) is refused rather than welcomed into a
  // session that would never write its profile.
  std::shared_ptr<AgentSession> session;
  if (options_.profile) {
    auto symbolizer = Symbolizer::ForProcess(client.peer.pid,
                                             options_.profile_options.symbolize);
    std::string why;
    if (!symbolizer.ok()) {
      why = absl::StrCat("the agent cannot read the process's memory map: ",
                         symbolizer.status().message());
    } else if (std::string shortage = DescriptorShortage(connected, 0);
               !shortage.empty()) {
      // Its files are open now: what is left must still cover the reserve.
      why = shortage;
    }
    if (why.empty()) {
      internal::AgentHello described = *hello;
      described.pid = client.peer.pid;
      session = std::make_shared<AgentSession>(
          options_.profile_options, described, client.peer.pid, region, bytes,
          std::move(*symbolizer), [this](const std::string& line) { Log(line); },
          [this](const std::string& line) { LogEvent(line); });
      why = session->error();
    }
    if (!why.empty()) {
      session.reset();
      close(region);
      Refuse(client, why);
      return;
    }
  }
  if (absl::Status st = internal::SendAgentMessage(
          client.fd, internal::AgentWelcome{getpid(), bytes}, region);
      !st.ok()) {
    Log(absl::StrFormat("agent: pid %d: %s", client.peer.pid, st.message()));
    close(region);
    close(client.fd);
    client.fd = -1;
    return;
  }
  // The process has its copy and the session its own: the agent's is not
  // needed any more.
  close(region);
  served_.fetch_add(1);
  std::lock_guard<std::mutex> lock(mutex_);
  client.session = std::move(session);
  client.welcomed = true;
  client.process.hello = *hello;
  // The kernel's view of the pid (another PID namespace may say otherwise)
  // is the one /proc answers to.
  client.process.hello.pid = client.peer.pid;
  client.process.peer = client.peer;
  client.process.region_bytes = bytes;
  client.process.connected = true;
  LogEvent(absl::StrFormat("agent: pid %d (%s) connected: %u rings of %u bytes",
                      client.peer.pid, hello->program, hello->max_threads,
                      hello->ring_bytes));
}

}  // namespace inprof::agent
