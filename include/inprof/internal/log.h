// internal: not part of the public API.
//
// One-line diagnostics on stderr, prefixed "inprof: ". Each message is written
// with a single write(2) so lines from several threads never interleave.
#ifndef INPROF_INTERNAL_LOG_H_
#define INPROF_INTERNAL_LOG_H_

#include "absl/strings/string_view.h"

namespace inprof::internal {

// Writes "inprof: <message>\n" to stderr. Thread-safe; not for signal handlers.
void Log(absl::string_view message);

// Replaces the destination (tests capture messages). nullptr restores stderr.
using LogSink = void (*)(absl::string_view line);
void SetLogSinkForTesting(LogSink sink);
// The same for a host that filters inprof's lines (the preload library).
inline void SetLogSink(LogSink sink) { SetLogSinkForTesting(sink); }
// Writes `line` to stderr with one write(2) (what Log does without a sink).
void WriteLineToStderr(absl::string_view line);

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_LOG_H_
