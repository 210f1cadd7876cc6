// internal: not part of the public API.
//
// One-line diagnostics on stderr, prefixed "inprof: ". Each message is written
// with a single write(2) so lines from several threads never interleave.
//
// Messages carry strings that others control (a peer's program name, a
// socket name from the environment, a file path, a thread name): Log()
// escapes their control characters (EscapeForLog) so that a message stays
// one line and cannot move the cursor or recolour a terminal.
#ifndef INPROF_BASE_LOG_H_
#define INPROF_BASE_LOG_H_

#include <string>

#include "absl/strings/string_view.h"

namespace inprof::internal {

// Writes "inprof: <message>\n" to stderr, `message` escaped with
// EscapeForLog. Thread-safe; not for signal handlers.
void Log(absl::string_view message);

// `text` made safe to show in one line of a log or a terminal: C0 control
// characters, DEL and the C1 controls (U+0080-U+009F) as \n, \r, \t or
// \xNN, and each byte that is not part of valid UTF-8 as \xNN; everything
// else (printable ASCII, valid UTF-8, backslashes) as it is. Idempotent:
// the result has nothing left to escape.
std::string EscapeForLog(absl::string_view text);

// Replaces the destination (tests capture messages). nullptr restores stderr.
using LogSink = void (*)(absl::string_view line);
void SetLogSinkForTesting(LogSink sink);
// The same for a host that filters inprof's lines (the preload library).
inline void SetLogSink(LogSink sink) { SetLogSinkForTesting(sink); }
// Writes `line` to stderr with one write(2) (what Log does without a sink).
// On a thread with a descriptor table of its own
// (EnterPrivateDescriptorTable, owned_fd.h), the program's stderr as it is
// now, fetched through `pidfd` for the one write.
void WriteLineToStderr(absl::string_view line);
// The calling thread's table is private: its stderr lines go to the
// program's descriptor 2, fetched through `pidfd` (a pidfd of this process;
// -1: the thread kept a copy of descriptor 2 instead). Linux.
void UseProgramStderrThrough(int pidfd) noexcept;
// The calling thread's pidfd set by UseProgramStderrThrough (-1: none).
int ProgramStderrPidfd() noexcept;

}  // namespace inprof::internal

#endif  // INPROF_BASE_LOG_H_
