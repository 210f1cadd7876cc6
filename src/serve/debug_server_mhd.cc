// The HTTP half of the live endpoint, on GNU libmicrohttpd (Debian's
// libmicrohttpd12): a C library with a stable ABI, so it is loaded with
// dlopen() when INPROF_HTTP_ADDR is set and a host that leaves the endpoint
// off never maps it (as libcurl for uploads, http_client_curl.cc). It
// parses HTTP; what a request means is DebugEndpoint's, which gets the raw
// request target from MHD's URI callback (the path with its query).
//
// Threads: MHD's listening thread and one thread per connection (at most
// DebugServer::kMaxConnections), started with every signal blocked so that
// none of them is ever interrupted by the profiler's signals.
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <microhttpd.h>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "inprof/internal/debug_endpoint.h"
#include "inprof/internal/log.h"
#include "inprof/internal/owned_fd.h"

namespace inprof::internal {
namespace {

#define INPROF_MHD_FUNCTIONS(X) \
  X(MHD_start_daemon) \
  X(MHD_stop_daemon) \
  X(MHD_get_daemon_info) \
  X(MHD_create_response_from_buffer) \
  X(MHD_add_response_header) \
  X(MHD_queue_response) \
  X(MHD_destroy_response)

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

// MHD_OPTION_URI_LOG_CALLBACK: the raw target, kept as the request's state.
// `in_flight` counts requests from here to their completion.
void* KeepTarget(void* in_flight, const char* uri, struct MHD_Connection*) {
  static_cast<std::atomic<int>*>(in_flight)->fetch_add(1);
  return new std::string(uri != nullptr ? uri : "");
}

// MHD_OPTION_NOTIFY_COMPLETED: the response is sent (or the client gone).
void FreeTarget(void* in_flight, struct MHD_Connection*, void** state,
                enum MHD_RequestTerminationCode) {
  if (*state != nullptr) static_cast<std::atomic<int>*>(in_flight)->fetch_sub(1);
  delete static_cast<std::string*>(*state);
  *state = nullptr;
}

enum MHD_Result Answer(void* cls, struct MHD_Connection* connection,
                       const char*, const char* method, const char*,
                       const char*, size_t* upload_size, void** state) {
  auto* endpoint = static_cast<DebugEndpoint*>(cls);
  const MhdApi& mhd = Mhd();
  const std::string* target = static_cast<const std::string*>(*state);
  // A body (never expected) is answered by the 405 below without reading it.
  if (upload_size != nullptr) *upload_size = 0;
  DebugResponse r = endpoint->Respond(method != nullptr ? method : "",
                                      target != nullptr ? *target : "");
  struct MHD_Response* response = mhd.MHD_create_response_from_buffer(
      r.body.size(), r.body.data(), MHD_RESPMEM_MUST_COPY);
  if (response == nullptr) return MHD_NO;
  mhd.MHD_add_response_header(response, "Content-Type", r.content_type.c_str());
  mhd.MHD_add_response_header(response, "Cache-Control", "no-store");
  for (const auto& [name, value] : r.headers) {
    mhd.MHD_add_response_header(response, name.c_str(), value.c_str());
  }
  const enum MHD_Result queued = mhd.MHD_queue_response(
      connection, static_cast<unsigned>(r.status), response);
  mhd.MHD_destroy_response(response);
  return queued;
}

}  // namespace

absl::Status DebugServer::Available() {
  const MhdApi& mhd = Mhd();
  if (!mhd.error.empty()) return absl::UnavailableError(mhd.error);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DebugServer>> DebugServer::Start(
    const ListenAddress& address, DebugEndpoint* endpoint) {
  if (absl::Status s = Available(); !s.ok()) return s;
  const MhdApi& mhd = Mhd();
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
  pthread_sigmask(SIG_SETMASK, &all, &old);
  errno = 0;
  struct MHD_Daemon* daemon = mhd.MHD_start_daemon(
      flags, static_cast<uint16_t>(address.port), nullptr, nullptr, &Answer,
      endpoint, MHD_OPTION_SOCK_ADDR, addr, MHD_OPTION_CONNECTION_LIMIT,
      kMaxConnections, MHD_OPTION_CONNECTION_TIMEOUT, 30u,
      MHD_OPTION_URI_LOG_CALLBACK, &KeepTarget, server->in_flight_.get(),
      MHD_OPTION_NOTIFY_COMPLETED, &FreeTarget, server->in_flight_.get(),
      MHD_OPTION_END);
  const int error = errno;
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (daemon == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", FormatListenAddress(address),
        error != 0 ? absl::StrCat(": ", std::strerror(error)) : ""));
  }
  server->daemon_ = daemon;
  ListenAddress bound = address;
  if (const union MHD_DaemonInfo* info =
          mhd.MHD_get_daemon_info(daemon, MHD_DAEMON_INFO_LISTEN_FD)) {
    server->listen_fd_ = info->listen_fd;
    const FdIdentity identity = IdentifyFd(info->listen_fd);
    server->listen_dev_ = identity.dev;
    server->listen_ino_ = identity.ino;
    sockaddr_storage storage{};
    socklen_t len = sizeof(storage);
    if (getsockname(info->listen_fd, reinterpret_cast<sockaddr*>(&storage),
                    &len) == 0) {
      bound.port = storage.ss_family == AF_INET6
                       ? ntohs(reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port)
                       : ntohs(reinterpret_cast<sockaddr_in*>(&storage)->sin_port);
    }
  }
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
  if (daemon_ == nullptr) return;
  // MHD_stop_daemon() wakes its thread through a descriptor of its own
  // (an eventfd) and closes its descriptors by number. The program closed
  // the listening socket: it closed the rest too (and may have reused the
  // numbers), and that thread would never wake. Leave the server alone.
  if (listen_fd_ >= 0 &&
      !IsStillOurs(listen_fd_, ListenIdentity(listen_dev_, listen_ino_))) {
    NoteDescriptorTaken(listen_fd_, "the live endpoint's listening socket");
    Log(absl::StrCat("the live endpoint ", address_,
                     " is left as it is: the program closed its descriptors"));
    daemon_ = nullptr;
    listen_fd_ = -1;
    return;
  }
  // Requests in progress were told to end (a capture answers 503 once the
  // profiler stops): let their answers go out, for a bounded time, before
  // MHD closes every connection.
  const absl::Time deadline = absl::Now() + kStopGrace;
  while (in_flight_->load() > 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  Mhd().MHD_stop_daemon(static_cast<struct MHD_Daemon*>(daemon_));
  daemon_ = nullptr;
  listen_fd_ = -1;
}

void DebugServer::Abandon() {
  if (listen_fd_ >= 0) {
    CloseIfOurs(listen_fd_, ListenIdentity(listen_dev_, listen_ino_));
  }
  listen_fd_ = -1;
  daemon_ = nullptr;  // leaked: its threads are the parent's
}

}  // namespace inprof::internal
