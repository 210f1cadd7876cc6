// What pprof_reader.cc shares with the rewrites (pprof_rewrite.cc): a
// profile's bytes once inflated, bounded by PprofReadLimits as DecodePprof
// reads them, and the one message both parse by hand.
#ifndef INPROF_SRC_EXPORT_PPROF_RAW_H_
#define INPROF_SRC_EXPORT_PPROF_RAW_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace inprof::internal {

// Whether `bytes` begin as a gzip stream does.
bool IsGzip(std::string_view bytes);

// `bytes` inflated; more than `max_out` bytes of it is an error.
absl::StatusOr<std::string> Gunzip(std::string_view bytes, uint64_t max_out);

// `bytes` gzip-compressed.
absl::StatusOr<std::string> Gzip(std::string_view bytes);

// The protobuf bytes of `pprof`: `pprof` itself, or its gunzipped copy kept
// in `inflated`. `who` names the caller in errors.
absl::StatusOr<std::string_view> RawProfileBytes(std::string_view pprof,
                                                 std::string& inflated,
                                                 absl::string_view who);

// A ValueType message: string-table indexes of its type and unit.
struct RawValueType {
  int64_t type = 0, unit = 0;
};
// Reads one; false when the bytes are not well-formed protobuf.
bool ParseValueType(std::string_view bytes, RawValueType& out);

}  // namespace inprof::internal

#endif  // INPROF_SRC_EXPORT_PPROF_RAW_H_
