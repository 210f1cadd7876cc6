// internal: not part of the public API.
//
// The addresses a user names in the configuration, parsed where the
// configuration is read (options.cc) and again where they are used: the
// live endpoint's INPROF_HTTP_ADDR (serve/) and library mode's
// INPROF_AGENT_SOCKET (agent/). Pure parsing, no sockets.
#ifndef INPROF_BASE_ADDRESSES_H_
#define INPROF_BASE_ADDRESSES_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace inprof::internal {

// Where the live endpoint listens.
struct ListenAddress {
  std::string host;  // numeric: "127.0.0.1", "::1", "0.0.0.0", "::"
  int port = 0;      // 0: any free port (the bound one is logged)
  bool ipv6 = false;
};

// INPROF_HTTP_ADDR: "PORT", ":PORT", "HOST:PORT" or "[V6]:PORT", where HOST
// is an IPv4 address, "localhost" or (bracketed) an IPv6 address. Without a
// host the endpoint is on 127.0.0.1 only: other interfaces must be named.
// The error names the value and the accepted form.
absl::StatusOr<ListenAddress> ParseListenAddress(absl::string_view value);

// "127.0.0.1:6060", "[::1]:6060".
std::string FormatListenAddress(const ListenAddress& address);

// Where the agent listens: "@NAME" is Linux's abstract namespace (no file;
// ddprof's default), anything else a filesystem path. The error names the
// value. Accepted: a path of 1-107 bytes, or an abstract name of 1-106
// bytes after its '@'; no NUL byte. On Windows (no library mode) every
// value is an error that says so.
struct AgentSocketAddress {
  std::string name;  // without the '@'
  bool abstract = true;
  std::string ToString() const { return abstract ? "@" + name : name; }
};
absl::StatusOr<AgentSocketAddress> ParseAgentSocketAddress(absl::string_view value);

// sizeof(sockaddr_un::sun_path) on Linux.
inline constexpr size_t kSunPathBytes = 108;

}  // namespace inprof::internal

#endif  // INPROF_BASE_ADDRESSES_H_
