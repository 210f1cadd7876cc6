#include "inprof/base/addresses.h"

#if defined(_WIN32)
#include <ws2tcpip.h>  // inet_pton
#else
#include <arpa/inet.h>
#include <sys/un.h>
#endif

#include <string>

#include "absl/algorithm/container.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace inprof::internal {
namespace {

absl::Status BadAddress(absl::string_view value, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(
      "INPROF_HTTP_ADDR='", absl::CHexEscape(value), "': ", why,
      "; expected PORT, HOST:PORT or [IPV6]:PORT such as 127.0.0.1:6060"));
}

// What is shown of a client's input in an error: printable, bounded.
std::string Quote(absl::string_view s) {
  constexpr size_t kShown = 64;
  std::string out = absl::CHexEscape(s.substr(0, kShown));
  if (s.size() > kShown) out += "...";
  return absl::StrCat("'", out, "'");
}

}  // namespace

absl::StatusOr<ListenAddress> ParseListenAddress(absl::string_view value) {
  const absl::string_view v = absl::StripAsciiWhitespace(value);
  if (v.empty()) return BadAddress(value, "empty");
  ListenAddress address;
  absl::string_view host;
  absl::string_view port;
  if (v.front() == '[') {
    const size_t close = v.find(']');
    if (close == absl::string_view::npos) {
      return BadAddress(value, "no ']' after the IPv6 address");
    }
    host = v.substr(1, close - 1);
    const absl::string_view rest = v.substr(close + 1);
    if (rest.size() < 2 || rest.front() != ':') {
      return BadAddress(value, "no :PORT after the IPv6 address");
    }
    port = rest.substr(1);
    address.ipv6 = true;
  } else {
    const size_t colon = v.rfind(':');
    if (colon == absl::string_view::npos) {
      port = v;  // PORT alone
    } else {
      host = v.substr(0, colon);
      port = v.substr(colon + 1);
      if (host.find(':') != absl::string_view::npos) {
        return BadAddress(value, "an IPv6 address must be in brackets");
      }
    }
  }
  int port_number = 0;
  if (port.empty() || port.size() > 5 ||
      !absl::c_all_of(port, [](char c) { return absl::ascii_isdigit(c); }) ||
      !absl::SimpleAtoi(port, &port_number) || port_number > 65535) {
    return BadAddress(value, absl::StrCat("port ", Quote(port),
                                          " is not a number from 0 to 65535"));
  }
  address.port = port_number;
  if (host.empty() && !address.ipv6) {
    address.host = "127.0.0.1";  // loopback unless a host is named
    return address;
  }
  if (!address.ipv6 && absl::AsciiStrToLower(host) == "localhost") {
    address.host = "127.0.0.1";
    return address;
  }
  unsigned char buffer[16];
  const std::string h(host);
  if (inet_pton(address.ipv6 ? AF_INET6 : AF_INET, h.c_str(), buffer) != 1) {
    return BadAddress(value, absl::StrCat(Quote(host), " is not an ",
                                          address.ipv6 ? "IPv6" : "IPv4",
                                          " address or localhost"));
  }
  address.host = h;
  return address;
}

std::string FormatListenAddress(const ListenAddress& address) {
  if (address.ipv6) return absl::StrCat("[", address.host, "]:", address.port);
  return absl::StrCat(address.host, ":", address.port);
}

#if defined(_WIN32)
absl::StatusOr<AgentSocketAddress> ParseAgentSocketAddress(absl::string_view /*value*/) {
  return absl::UnimplementedError(
      "library mode (inprof agent) is not available on Windows");
}
#else
static_assert(sizeof(sockaddr_un::sun_path) == kSunPathBytes);

absl::StatusOr<AgentSocketAddress> ParseAgentSocketAddress(absl::string_view value) {
  AgentSocketAddress address;
  address.abstract = !value.empty() && value.front() == '@';
  address.name = std::string(address.abstract ? value.substr(1) : value);
  if (address.name.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(
        "agent socket: the name contains a NUL byte");
  }
  // sockaddr_un's sun_path holds the name, its NUL for a path, and the
  // leading NUL byte for an abstract name.
  const size_t offset = address.abstract ? 1 : 0;
  if (address.name.empty() || address.name.size() + offset >= kSunPathBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "agent socket \"", address.ToString(), "\": name must be 1-",
        kSunPathBytes - 1 - offset, " bytes"));
  }
  return address;
}
#endif

}  // namespace inprof::internal
