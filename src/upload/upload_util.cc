#include "inprof/internal/upload_util.h"

#include <cstdint>

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"

namespace inprof::internal {

std::string RandomUuid() {
  absl::BitGen gen;
  uint64_t hi = absl::Uniform<uint64_t>(gen);
  uint64_t lo = absl::Uniform<uint64_t>(gen);
  hi = (hi & ~0xf000ULL) | 0x4000ULL;                 // version 4
  lo = (lo & ~(3ULL << 62)) | (2ULL << 62);           // RFC 4122 variant
  return absl::StrFormat("%08x-%04x-%04x-%04x-%012x", hi >> 32,
                         (hi >> 16) & 0xffff, hi & 0xffff, lo >> 48,
                         lo & 0xffffffffffffULL);
}

std::string JsonQuote(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrFormat("\\u%04x", static_cast<unsigned char>(c));
        } else {
          out.push_back(c);  // UTF-8 passes through
        }
    }
  }
  out.push_back('"');
  return out;
}

std::string UrlEncode(absl::string_view s) {
  std::string out;
  for (char c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (absl::ascii_isalnum(u) || c == '-' || c == '_' || c == '.' ||
        c == '~') {
      out.push_back(c);
    } else {
      out += absl::StrFormat("%%%02X", u);
    }
  }
  return out;
}

}  // namespace inprof::internal
