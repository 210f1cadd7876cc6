// inprof/pprof_writer.h: encodes a ProfileData as a pprof profile.
//
// Produces perftools.profiles.Profile (proto/profile.proto) with mappings for
// every loaded module (file name, build-id), locations, functions with file
// and line, inline frames as extra Line entries, labels "thread id" and
// "thread name", and the profile's comments. Gzip-compressed on disk, as
// `go tool pprof`, Datadog and Pyroscope expect.
//
// Thread-safety: the functions are reentrant; the Symbolizer passed in is not
// and must not be shared between concurrent calls.
//
// Example:
//   inprof::Symbolizer symbolizer;
//   symbolizer.Refresh();
//   absl::Status s = inprof::WritePprofFile("cpu.pb.gz", data, symbolizer);
#ifndef INPROF_PPROF_WRITER_H_
#define INPROF_PPROF_WRITER_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "inprof/profile_data.h"
#include "inprof/symbolizer.h"

namespace inprof {

// Serialized (uncompressed) pprof bytes. Calls symbolizer.Refresh() first,
// so that modules loaded since the last export are named. Fails with
// InvalidArgument when a sample's values do not match sample_types or it
// names an unknown thread.
absl::StatusOr<std::string> EncodePprof(const ProfileData& data,
                                        Symbolizer& symbolizer);

// gzip (RFC 1952) of `bytes`.
absl::StatusOr<std::string> GzipCompress(std::string_view bytes);

// Encodes, compresses and writes to `path` atomically (a temporary file in
// the same directory, then rename), so readers never see a partial profile.
// Errors name the path.
absl::Status WritePprofFile(const std::string& path, const ProfileData& data,
                            Symbolizer& symbolizer);

}  // namespace inprof

#endif  // INPROF_PPROF_WRITER_H_
