#include "src/agent/agent_server.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "inprof/internal/log.h"
#include "inprof/symbolizer.h"
#include "src/agent/agent_session.h"

namespace inprof::agent {

struct AgentServer::Client {
  int fd = -1;
  int region_fd = -1;
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
      &internal::ProfilerCore::RenderFlamegraph,
      absl::StrCat("inprof agent (pid ", getpid(), ")"));
  absl::StatusOr<std::unique_ptr<internal::DebugServer>> server =
      internal::DebugServer::Start(*address, endpoint_.get());
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

absl::StatusOr<std::string> AgentServer::Capture(absl::Duration duration, int64_t pid) {
  std::shared_ptr<AgentSession> session;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& c : clients_) {
      if (c->process.connected && c->session != nullptr &&
          c->process.hello.pid == pid) {
        session = c->session;
      }
    }
  }
  if (session == nullptr) {
    return absl::NotFoundError(absl::StrCat("no process ", pid, " is connected"));
  }
  return session->Capture(duration);
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
  wake_fd_ = listener_.fd = -1;
  std::vector<std::pair<Client*, std::thread>> finishers;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& c : clients_) {
      if (c->fd >= 0) close(c->fd);
      if (c->region_fd >= 0) close(c->region_fd);
      c->fd = c->region_fd = -1;
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
    }
    it = finishers_.erase(it);
  }
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

void AgentServer::LogEvent(const std::string& line) const {
  if (options_.log_connections) Log(line);
}

void AgentServer::Serve() {
  std::vector<pollfd> fds;
  std::vector<Client*> polled;
  for (;;) {
    fds.clear();
    polled.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({listener_.fd, POLLIN, 0});
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
    const int ready = poll(fds.data(), fds.size(),
                           options_.profile && !polled.empty() ? 20 : 100);
    if (ready < 0 && errno != EINTR) {
      Log(absl::StrCat("agent: poll: ", std::strerror(errno)));
      return;
    }
    if ((fds[0].revents & POLLIN) != 0) return;
    if ((fds[1].revents & POLLIN) != 0) Accept();
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
    // Connections that never became a process are forgotten.
    std::lock_guard<std::mutex> lock(mutex_);
    ReapLocked(/*all=*/false);
    clients_.erase(std::remove_if(clients_.begin(), clients_.end(),
                                  [](const std::unique_ptr<Client>& c) {
                                    return c->fd < 0 && !c->welcomed;
                                  }),
                   clients_.end());
  }
}

void AgentServer::Accept() {
  const int fd = accept4(listener_.fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) return;
  auto client = std::make_unique<Client>();
  client->fd = fd;
  client->accepted = std::chrono::steady_clock::now();
  auto peer = internal::GetPeerCredentials(fd);
  if (!peer.ok()) {
    Log(absl::StrCat("agent: ", peer.status().message()));
    close(fd);
    return;
  }
  client->peer = *peer;
  std::lock_guard<std::mutex> lock(mutex_);
  clients_.push_back(std::move(client));
}

void AgentServer::Refuse(Client& client, const std::string& reason) {
  refused_.fetch_add(1);
  Log(absl::StrFormat("agent: refused pid %d (uid %u): %s", client.peer.pid,
                      client.peer.uid, reason));
  (void)internal::SendAgentMessage(client.fd, internal::AgentReject{reason});
  close(client.fd);
  client.fd = -1;
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
    Refuse(client, std::string(message.status().message()));
    return;
  }
  // Refused after its hello is read: closing a socket with unread data
  // resets it, and the process would see "connection reset" instead of
  // the reason.
  const uid_t self = getuid();
  const uid_t uid = client.peer.uid;
  if (uid != self && uid != 0 &&
      std::find(options_.allowed_uids.begin(), options_.allowed_uids.end(),
                uid) == options_.allowed_uids.end()) {
    Refuse(client, absl::StrFormat(
                       "uid %u may not use this agent (it runs as uid %u; "
                       "`inprof agent --allow-uid %u` serves that user too)",
                       uid, self, uid));
    return;
  }
  const auto* hello = std::get_if<internal::AgentHello>(&*message);
  if (hello == nullptr) {
    Refuse(client, "the first message must be a hello");
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
  // symbolized).
  std::shared_ptr<AgentSession> session;
  if (options_.profile) {
    auto symbolizer = Symbolizer::ForProcess(client.peer.pid,
                                             options_.profile_options.symbolize);
    if (!symbolizer.ok()) {
      Log(absl::StrFormat("agent: pid %d: %s", client.peer.pid,
                          symbolizer.status().message()));
    }
    internal::AgentHello described = *hello;
    described.pid = client.peer.pid;
    session = std::make_shared<AgentSession>(
        options_.profile_options, described, client.peer.pid, region, bytes,
        symbolizer.ok() ? std::move(*symbolizer) : nullptr,
        [this](const std::string& line) { Log(line); },
        [this](const std::string& line) { LogEvent(line); });
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
  std::lock_guard<std::mutex> lock(mutex_);
  client.region_fd = region;
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
