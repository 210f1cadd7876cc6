#include "inprof/internal/agent_protocol.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace inprof::internal {
namespace {

class Writer {
 public:
  void U16(uint16_t v) { Bytes(&v, 2); }
  void U32(uint32_t v) { Bytes(&v, 4); }
  void I32(int32_t v) { Bytes(&v, 4); }
  void U64(uint64_t v) { Bytes(&v, 8); }
  void Str(absl::string_view s) {
    U32(static_cast<uint32_t>(s.size()));
    out_.append(s.data(), s.size());
  }
  std::string& out() { return out_; }

 private:
  // x86-64 and the other targets inprof builds for are little-endian.
  void Bytes(const void* p, size_t n) {
    out_.append(static_cast<const char*>(p), n);
  }
  std::string out_;
};

class Reader {
 public:
  explicit Reader(absl::string_view in) : in_(in) {}
  absl::Status U16(const char* field, uint16_t& v) { return Fixed(field, &v, 2); }
  absl::Status U32(const char* field, uint32_t& v) { return Fixed(field, &v, 4); }
  absl::Status I32(const char* field, int32_t& v) { return Fixed(field, &v, 4); }
  absl::Status U64(const char* field, uint64_t& v) { return Fixed(field, &v, 8); }
  absl::Status Str(const char* field, std::string& s) {
    uint32_t n = 0;
    if (absl::Status st = U32(field, n); !st.ok()) return st;
    if (n > kAgentMaxStringBytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "agent message: %s is %u bytes, more than %u", field, n,
          static_cast<unsigned>(kAgentMaxStringBytes)));
    }
    if (n > in_.size()) return Truncated(field);
    s.assign(in_.data(), n);
    in_.remove_prefix(n);
    return absl::OkStatus();
  }
  absl::Status End(const char* message) const {
    if (in_.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrFormat(
        "agent message: %u bytes after the end of a %s",
        static_cast<unsigned>(in_.size()), message));
  }

 private:
  absl::Status Fixed(const char* field, void* v, size_t n) {
    if (in_.size() < n) return Truncated(field);
    std::memcpy(v, in_.data(), n);
    in_.remove_prefix(n);
    return absl::OkStatus();
  }
  static absl::Status Truncated(const char* field) {
    return absl::InvalidArgumentError(
        absl::StrCat("agent message: truncated at ", field));
  }
  absl::string_view in_;
};

#define INPROF_RETURN_IF_ERROR(expr)       \
  do {                                     \
    if (absl::Status _st = (expr); !_st.ok()) return _st; \
  } while (0)

std::string Errno(const char* what) {
  return absl::StrCat(what, ": ", std::strerror(errno));
}

absl::StatusOr<sockaddr_un> ToSockaddr(const AgentSocketAddress& address,
                                       socklen_t& length) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  const size_t offset = address.abstract ? 1 : 0;
  if (address.name.empty() || address.name.size() + offset >= sizeof(sa.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "agent socket \"", address.ToString(), "\": name must be 1-",
        sizeof(sa.sun_path) - 1 - offset, " bytes"));
  }
  std::memcpy(sa.sun_path + offset, address.name.data(), address.name.size());
  length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + offset +
                                  address.name.size() + (address.abstract ? 0 : 1));
  return sa;
}

}  // namespace

std::string EncodeAgentMessage(const AgentMessage& message) {
  Writer payload;
  AgentMessageType type;
  if (const auto* hello = std::get_if<AgentHello>(&message)) {
    type = AgentMessageType::kHello;
    payload.I32(hello->pid);
    payload.Str(hello->program);
    payload.U32(static_cast<uint32_t>(hello->tags.size()));
    for (const auto& [key, value] : hello->tags) {
      payload.Str(key);
      payload.Str(value);
    }
    payload.U32(hello->max_threads);
    payload.U32(hello->ring_bytes);
  } else if (const auto* welcome = std::get_if<AgentWelcome>(&message)) {
    type = AgentMessageType::kWelcome;
    payload.I32(welcome->agent_pid);
    payload.U64(welcome->region_bytes);
  } else if (const auto* dump = std::get_if<AgentDumpRequest>(&message)) {
    type = AgentMessageType::kDumpRequest;
    payload.U32(dump->id);
  } else {
    type = AgentMessageType::kReject;
    payload.Str(std::get<AgentReject>(message).reason);
  }
  Writer out;
  out.U32(kAgentMagic);
  out.U16(kAgentProtocolVersion);
  out.U16(static_cast<uint16_t>(type));
  out.U32(static_cast<uint32_t>(payload.out().size()));
  out.U32(0);
  out.out() += payload.out();
  return std::move(out.out());
}

absl::StatusOr<AgentMessage> DecodeAgentMessage(absl::string_view bytes) {
  if (bytes.size() > kAgentMaxMessageBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "agent message: %u bytes, more than %u", static_cast<unsigned>(bytes.size()),
        static_cast<unsigned>(kAgentMaxMessageBytes)));
  }
  Reader header(bytes.substr(0, kAgentHeaderBytes));
  uint32_t magic = 0, length = 0, zero = 0;
  uint16_t version = 0, type = 0;
  INPROF_RETURN_IF_ERROR(header.U32("header (magic)", magic));
  if (magic != kAgentMagic) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "agent message: bad magic 0x%08x (not an inprof agent peer?)", magic));
  }
  INPROF_RETURN_IF_ERROR(header.U16("header (version)", version));
  if (version != kAgentProtocolVersion) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "agent protocol version %u, this side speaks version %u (use an "
        "inprof agent and library of the same release)",
        version, kAgentProtocolVersion));
  }
  INPROF_RETURN_IF_ERROR(header.U16("header (type)", type));
  INPROF_RETURN_IF_ERROR(header.U32("header (length)", length));
  INPROF_RETURN_IF_ERROR(header.U32("header (reserved)", zero));
  if (zero != 0) {
    return absl::InvalidArgumentError(
        "agent message: header (reserved) is not zero");
  }
  if (length != bytes.size() - kAgentHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "agent message: header says %u payload bytes, %u came", length,
        static_cast<unsigned>(bytes.size() - kAgentHeaderBytes)));
  }
  Reader in(bytes.substr(kAgentHeaderBytes));
  switch (static_cast<AgentMessageType>(type)) {
    case AgentMessageType::kHello: {
      AgentHello hello;
      int32_t pid = 0;
      INPROF_RETURN_IF_ERROR(in.I32("hello.pid", pid));
      if (pid <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("agent message: hello.pid ", pid, " is not a process id"));
      }
      hello.pid = pid;
      INPROF_RETURN_IF_ERROR(in.Str("hello.program", hello.program));
      uint32_t tags = 0;
      INPROF_RETURN_IF_ERROR(in.U32("hello.tags", tags));
      if (tags > kAgentMaxTags) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "agent message: %u tags, more than %u", tags,
            static_cast<unsigned>(kAgentMaxTags)));
      }
      for (uint32_t i = 0; i < tags; ++i) {
        std::string key, value;
        INPROF_RETURN_IF_ERROR(in.Str("hello.tags (key)", key));
        INPROF_RETURN_IF_ERROR(in.Str("hello.tags (value)", value));
        if (key.empty()) {
          return absl::InvalidArgumentError("agent message: a hello tag has an empty key");
        }
        hello.tags.emplace_back(std::move(key), std::move(value));
      }
      INPROF_RETURN_IF_ERROR(in.U32("hello.max_threads", hello.max_threads));
      INPROF_RETURN_IF_ERROR(in.U32("hello.ring_bytes", hello.ring_bytes));
      if (hello.max_threads == 0 || hello.max_threads > kAgentMaxThreads ||
          hello.ring_bytes < 4096 || hello.ring_bytes > kAgentMaxRingBytes ||
          hello.ring_bytes % 4096 != 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "agent message: hello asks for %u rings of %u bytes (accepted: "
            "1-%u rings, 4 KiB-1 MiB each, a multiple of 4 KiB)",
            hello.max_threads, hello.ring_bytes,
            static_cast<unsigned>(kAgentMaxThreads)));
      }
      INPROF_RETURN_IF_ERROR(in.End("hello"));
      return hello;
    }
    case AgentMessageType::kWelcome: {
      AgentWelcome welcome;
      int32_t pid = 0;
      INPROF_RETURN_IF_ERROR(in.I32("welcome.agent_pid", pid));
      welcome.agent_pid = pid;
      INPROF_RETURN_IF_ERROR(in.U64("welcome.region_bytes", welcome.region_bytes));
      if (welcome.region_bytes == 0 ||
          welcome.region_bytes > uint64_t{kAgentMaxThreads} * kAgentMaxRingBytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            "agent message: welcome.region_bytes ", welcome.region_bytes,
            " is out of range"));
      }
      INPROF_RETURN_IF_ERROR(in.End("welcome"));
      return welcome;
    }
    case AgentMessageType::kReject: {
      AgentReject reject;
      INPROF_RETURN_IF_ERROR(in.Str("reject.reason", reject.reason));
      INPROF_RETURN_IF_ERROR(in.End("reject"));
      return reject;
    }
    case AgentMessageType::kDumpRequest: {
      AgentDumpRequest dump;
      INPROF_RETURN_IF_ERROR(in.U32("dump_request.id", dump.id));
      INPROF_RETURN_IF_ERROR(in.End("dump_request"));
      return dump;
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("agent message: unknown type ", type));
}

AgentSocketAddress NewAgentSocketAddress() {
  std::random_device rd;
  AgentSocketAddress address;
  address.abstract = true;
  address.name = absl::StrFormat("inprof-agent-%u-%d-%08x", getuid(), getpid(), rd());
  return address;
}

namespace {
// A socket and the address to bind or connect it to.
struct UnboundSocket {
  int fd = -1;
  sockaddr_un sa{};
  socklen_t length = 0;
  const sockaddr* addr() const { return reinterpret_cast<const sockaddr*>(&sa); }
};
absl::StatusOr<UnboundSocket> NewSocket(const AgentSocketAddress& address) {
  UnboundSocket s;
  auto sa = ToSockaddr(address, s.length);
  if (!sa.ok()) return sa.status();
  s.sa = *sa;
  s.fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (s.fd < 0) return absl::InternalError(Errno("agent socket: socket"));
  return s;
}

int MillisecondsLeft(absl::Time deadline) {
  const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
  return static_cast<int>(std::clamp<int64_t>(left, 0, INT32_MAX));
}

absl::Time DeadlineIn(int timeout_ms) {
  return timeout_ms < 0 ? absl::InfiniteFuture()
                        : absl::Now() + absl::Milliseconds(timeout_ms);
}

// Waits until `fd` is ready for `events` or `deadline` passes; false then.
bool WaitFor(int fd, short events, absl::Time deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int timeout =
        deadline == absl::InfiniteFuture() ? -1 : MillisecondsLeft(deadline);
    const int ready = poll(&p, 1, timeout);
    if (ready > 0) return true;
    if (ready == 0) return false;
    if (errno != EINTR) return false;
  }
}

// Whether something listens at `address` (a connect is taken or queued).
bool SomethingListens(const AgentSocketAddress& address) {
  auto s = NewSocket(address);
  if (!s.ok()) return false;
  int rc;
  do {
    rc = connect(s->fd, s->addr(), s->length);
  } while (rc != 0 && errno == EINTR);
  const bool listens = rc == 0 || errno == EAGAIN || errno == EPROTOTYPE;
  close(s->fd);
  return listens;
}

std::string HolderRefusal(uint32_t holder) {
  return absl::StrFormat(
      "the socket there is held by uid %u, not by this process's user (uid "
      "%u) or root, and takes no connection: refusing to wait for it or hand "
      "it this process's samples",
      holder, static_cast<unsigned>(getuid()));
}
}  // namespace

absl::StatusOr<AgentListener> ListenAgentSocket(const AgentSocketAddress& address) {
  auto s = NewSocket(address);
  if (!s.ok()) return s.status();
  AgentListener listener;
  listener.fd = s->fd;
  auto fail = [&](const std::string& why) -> absl::Status {
    close(listener.fd);
    return absl::UnavailableError(
        absl::StrCat("agent socket \"", address.ToString(), "\": ", why));
  };
  for (int attempt = 0;; ++attempt) {
    if (bind(listener.fd, s->addr(), s->length) == 0) break;
    if (errno != EADDRINUSE) return fail(std::strerror(errno));
    if (address.abstract) {
      return fail("already in use (another agent listens there?)");
    }
    // A path: a socket file of an agent that ended without removing it
    // (SIGKILL, a crash) is replaced; nothing else is.
    struct stat st;
    if (lstat(address.name.c_str(), &st) != 0) {
      if (errno == ENOENT && attempt < 3) continue;  // removed meanwhile
      return fail(std::strerror(errno));
    }
    if (!S_ISSOCK(st.st_mode)) {
      return fail("a file that is not a socket is there (not replaced)");
    }
    if (st.st_uid != geteuid()) {
      return fail(absl::StrFormat(
          "a socket of uid %u is there (not replaced: this agent runs as uid %u)",
          static_cast<unsigned>(st.st_uid), static_cast<unsigned>(geteuid())));
    }
    if (attempt > 0 || SomethingListens(address)) {
      return fail("already in use (another agent listens there)");
    }
    // Still the same stale socket file right before it is removed.
    struct stat again;
    if (lstat(address.name.c_str(), &again) != 0 || again.st_dev != st.st_dev ||
        again.st_ino != st.st_ino || unlink(address.name.c_str()) != 0) {
      return fail("already in use (its stale socket could not be replaced)");
    }
    listener.replaced_stale = true;
  }
  if (listen(listener.fd, 64) != 0) return fail(std::strerror(errno));
  if (!address.abstract) {
    struct stat st;
    if (lstat(address.name.c_str(), &st) == 0) {
      listener.dev = st.st_dev;
      listener.ino = st.st_ino;
    }
  }
  return listener;
}

void RemoveAgentSocket(const AgentSocketAddress& address,
                       const AgentListener& listener) {
  if (address.abstract || listener.ino == 0) return;
  struct stat st;
  if (lstat(address.name.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) &&
      st.st_dev == listener.dev && st.st_ino == listener.ino) {
    unlink(address.name.c_str());
  }
}

std::optional<uint32_t> AgentSocketHolderUid(const AgentSocketAddress& address) {
  if (!address.abstract) {
    struct stat st;
    if (lstat(address.name.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) {
      return std::nullopt;
    }
    return st.st_uid;
  }
  // sock_diag: the listening SOCK_SEQPACKET sockets of this network
  // namespace, each with its name and owner.
  const int nl = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (nl < 0) return std::nullopt;
  const timeval limit{0, 200'000};  // a kernel that never answers is no answer
  setsockopt(nl, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
  struct {
    nlmsghdr header;
    unix_diag_req request;
  } query{};
  query.header.nlmsg_len = sizeof(query);
  query.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  query.header.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  query.request.sdiag_family = AF_UNIX;
  query.request.udiag_states = 1u << 10;  // TCP_LISTEN
  query.request.udiag_show = UDIAG_SHOW_NAME | UDIAG_SHOW_UID;
  std::optional<uint32_t> uid;
  if (send(nl, &query, sizeof(query), 0) != static_cast<ssize_t>(sizeof(query))) {
    close(nl);
    return std::nullopt;
  }
  const std::string wanted = std::string(1, '\0') + address.name;
  std::vector<char> buffer(64 * 1024);
  // Bounded: a dump of at most 4096 reads (each up to 64 KiB).
  bool done = false;
  for (int reads = 0; !done && reads < 4096; ++reads) {
    const ssize_t n = recv(nl, buffer.data(), buffer.size(), 0);
    if (n <= 0) break;
    int left = static_cast<int>(n);
    for (auto* h = reinterpret_cast<nlmsghdr*>(buffer.data()); NLMSG_OK(h, left);
         h = NLMSG_NEXT(h, left)) {
      if (h->nlmsg_type == NLMSG_DONE || h->nlmsg_type == NLMSG_ERROR) {
        done = true;
        break;
      }
      if (h->nlmsg_len < NLMSG_LENGTH(sizeof(unix_diag_msg))) continue;
      const auto* msg = static_cast<const unix_diag_msg*>(NLMSG_DATA(h));
      if (msg->udiag_type != SOCK_SEQPACKET) continue;
      int attr_left = static_cast<int>(h->nlmsg_len - NLMSG_LENGTH(sizeof(*msg)));
      std::optional<std::string> name;
      std::optional<uint32_t> owner;
      for (auto* a = reinterpret_cast<rtattr*>(const_cast<unix_diag_msg*>(msg) + 1);
           RTA_OK(a, attr_left); a = RTA_NEXT(a, attr_left)) {
        const char* data = static_cast<const char*>(RTA_DATA(a));
        const size_t size = RTA_PAYLOAD(a);
        if (a->rta_type == UNIX_DIAG_NAME) {
          name.emplace(data, size);
        } else if (a->rta_type == UNIX_DIAG_UID && size >= sizeof(uint32_t)) {
          uint32_t u;
          std::memcpy(&u, data, sizeof(u));
          owner = u;
        }
      }
      if (name == wanted && owner.has_value() && !uid.has_value()) uid = owner;
    }
  }
  close(nl);
  return uid;
}

absl::StatusOr<int> ConnectAgentSocket(const AgentSocketAddress& address,
                                       int timeout_ms) {
  auto s = NewSocket(address);
  if (!s.ok()) return s.status();
  const int fd = s->fd;
  const absl::Time deadline = DeadlineIn(timeout_ms);
  auto fail = [&](absl::Status status) {
    close(fd);
    return absl::Status(status.code(), absl::StrCat("agent socket \"", address.ToString(),
                                                    "\": ", status.message()));
  };
  bool holder_checked = false;
  absl::Duration pause = absl::Milliseconds(1);
  for (;;) {
    if (connect(fd, s->addr(), s->length) == 0) return fd;
    if (errno == EINTR) continue;
    if (errno == EINPROGRESS) {  // not Unix sockets' way, but harmless
      int error = ETIMEDOUT;
      socklen_t length = sizeof(error);
      if (WaitFor(fd, POLLOUT, deadline)) {
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
      }
      if (error == 0) return fd;
      errno = error;
    }
    if (errno != EAGAIN) {
      return fail(absl::UnavailableError(
          errno == ECONNREFUSED || errno == ENOENT
              ? std::string("no agent listens there (start one with `inprof agent`)")
              : std::string(std::strerror(errno))));
    }
    // Its backlog is full: nobody takes connections there now.
    if (!holder_checked) {
      holder_checked = true;
      const std::optional<uint32_t> holder = AgentSocketHolderUid(address);
      if (holder.has_value() && *holder != getuid() && *holder != 0) {
        return fail(absl::PermissionDeniedError(HolderRefusal(*holder)));
      }
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return fail(absl::DeadlineExceededError(absl::StrCat(
          "no connection taken within ", timeout_ms,
          " ms (its backlog is full: the agent is stopped or overloaded)")));
    }
    absl::SleepFor(std::min(pause, left));
    pause = std::min(pause * 2, absl::Milliseconds(50));
  }
}

absl::Status SendAgentMessage(int socket, const AgentMessage& message, int pass_fd,
                              int timeout_ms) {
  const std::string bytes = EncodeAgentMessage(message);
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (pass_fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
  }
  const absl::Time deadline = DeadlineIn(timeout_ms);
  int error = 0;
  for (;;) {
    if (sendmsg(socket, &msg, MSG_NOSIGNAL | MSG_DONTWAIT) >= 0) return absl::OkStatus();
    error = errno;
    if (error == EINTR) continue;
    if (error != EAGAIN || !WaitFor(socket, POLLOUT, deadline)) break;
  }
  return absl::UnavailableError(
      error == EPIPE || error == ECONNRESET
          ? std::string("agent connection: the peer is gone")
      : error == EAGAIN
          ? absl::StrCat("agent connection: the peer took no message within ",
                         timeout_ms, " ms")
          : absl::StrCat("agent connection: sendmsg: ", std::strerror(error)));
}

absl::StatusOr<AgentMessage> ReceiveAgentMessage(int socket, int timeout_ms,
                                                 int* received_fd) {
  if (received_fd != nullptr) *received_fd = -1;
  const absl::Time deadline = DeadlineIn(timeout_ms);
  std::string buffer(kAgentMaxMessageBytes + 1, '\0');
  iovec iov{buffer.data(), buffer.size()};
  msghdr msg{};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)] = {};
  ssize_t n;
  bool reset_seen = false;
  for (;;) {
    msg = msghdr{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    n = recvmsg(socket, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n >= 0) break;
    if (errno == EINTR) continue;
    // A peer that closed with this side's message unread leaves a reset
    // in front of what it sent before it closed: read on once.
    if (errno == ECONNRESET && !reset_seen) {
      reset_seen = true;
      continue;
    }
    if (errno != EAGAIN) break;
    if (reset_seen) {  // the reset was all there was
      errno = ECONNRESET;
      break;
    }
    if (!WaitFor(socket, POLLIN, deadline)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "agent connection: no message within ", timeout_ms, " ms"));
    }
  }
  // Descriptors that came along are ours to close, whatever the message.
  int fd = -1;
  if (n >= 0) {
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int passed;
        std::memcpy(&passed, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        if (fd < 0 && received_fd != nullptr) {
          fd = passed;
        } else {
          close(passed);
        }
      }
    }
  }
  auto fail = [&](absl::Status status) {
    if (fd >= 0) close(fd);
    return status;
  };
  if (n < 0) {
    return fail(absl::UnavailableError(
        errno == ECONNRESET ? std::string("agent connection: the peer closed it")
                            : Errno("agent connection: recvmsg")));
  }
  if (n == 0) {
    return fail(absl::UnavailableError("agent connection: the peer closed it"));
  }
  if ((msg.msg_flags & MSG_TRUNC) != 0) {
    return fail(absl::InvalidArgumentError(absl::StrFormat(
        "agent message: more than %u bytes", static_cast<unsigned>(kAgentMaxMessageBytes))));
  }
  auto message = DecodeAgentMessage(absl::string_view(buffer.data(), n));
  if (!message.ok()) return fail(message.status());
  if (received_fd != nullptr) *received_fd = fd;
  return message;
}

absl::StatusOr<PeerCredentials> GetPeerCredentials(int socket) {
  ucred cred{};
  socklen_t length = sizeof(cred);
  if (getsockopt(socket, SOL_SOCKET, SO_PEERCRED, &cred, &length) != 0) {
    return absl::InternalError(Errno("agent connection: SO_PEERCRED"));
  }
  return PeerCredentials{cred.pid, cred.uid, cred.gid};
}

absl::StatusOr<AgentConnection> ConnectToAgent(const AgentSocketAddress& address,
                                               const AgentHello& hello,
                                               int timeout_ms) {
  const absl::Time deadline = DeadlineIn(timeout_ms);
  auto socket = ConnectAgentSocket(address, timeout_ms);
  if (!socket.ok()) return socket.status();
  AgentConnection connection;
  connection.socket = *socket;
  auto fail = [&](absl::Status status) {
    close(connection.socket);
    return absl::Status(status.code(), absl::StrCat("agent socket \"", address.ToString(),
                                                    "\": ", status.message()));
  };
  // Before anything is sent: whose socket it is.
  auto peer = GetPeerCredentials(connection.socket);
  if (!peer.ok()) return fail(peer.status());
  if (peer->uid != getuid() && peer->uid != 0) {
    return fail(absl::PermissionDeniedError(absl::StrFormat(
        "the agent there runs as uid %u, not as this process's user (uid "
        "%u): refusing to hand it this process's samples",
        peer->uid, getuid())));
  }
  const int left = timeout_ms < 0 ? -1 : MillisecondsLeft(deadline);
  int region_fd = -1;
  absl::StatusOr<AgentMessage> answer;
  if (absl::Status st = SendAgentMessage(connection.socket, hello, -1, left); !st.ok()) {
    // An agent that refused at once (out of descriptors, too many
    // connections waiting) answered before it closed: its reason beats
    // "the peer is gone".
    answer = ReceiveAgentMessage(connection.socket, 0, &region_fd);
    if (!answer.ok() || !std::holds_alternative<AgentReject>(*answer)) {
      if (region_fd >= 0) close(region_fd);
      return fail(st);
    }
  } else {
    answer = ReceiveAgentMessage(
        connection.socket, timeout_ms < 0 ? -1 : MillisecondsLeft(deadline), &region_fd);
  }
  if (!answer.ok()) {
    if (absl::IsDeadlineExceeded(answer.status())) {
      return fail(absl::DeadlineExceededError(absl::StrCat(
          "the agent did not answer within ", timeout_ms,
          " ms (it is stopped or overloaded)")));
    }
    return fail(answer.status());
  }
  if (const auto* reject = std::get_if<AgentReject>(&*answer)) {
    if (region_fd >= 0) close(region_fd);
    return fail(absl::PermissionDeniedError(
        absl::StrCat("the agent refused: ", reject->reason)));
  }
  const auto* welcome = std::get_if<AgentWelcome>(&*answer);
  if (welcome == nullptr || region_fd < 0) {
    if (region_fd >= 0) close(region_fd);
    return fail(absl::InvalidArgumentError(
        "the agent answered without a welcome and its shared memory"));
  }
  connection.welcome = *welcome;
  connection.region_fd = region_fd;
  return connection;
}

}  // namespace inprof::internal
