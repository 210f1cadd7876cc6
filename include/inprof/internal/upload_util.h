// internal: not part of the public API.
//
// Small helpers the uploaders share: identity of the process, JSON string
// quoting and URL query encoding.
//
// Thread-safety: reentrant.
#ifndef INPROF_INTERNAL_UPLOAD_UTIL_H_
#define INPROF_INTERNAL_UPLOAD_UTIL_H_

#include <string>

#include "absl/strings/string_view.h"
#include "inprof/base/platform.h"  // ProgramName, HostName

namespace inprof::internal {

// A random (version 4) UUID, lowercase: identifies this process's profiles.
std::string RandomUuid();

// `s` as a JSON string literal, quotes included.
std::string JsonQuote(absl::string_view s);

// Percent-encodes everything but RFC 3986's unreserved characters.
std::string UrlEncode(absl::string_view s);

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_UPLOAD_UTIL_H_
