// internal: not part of the public API.
//
// The few operating-system services the portable core (options, export,
// sinks, uploads) needs, behind one header with a variant per OS:
// src/base/platform_linux.cc and src/base/platform_windows.cc.
// Those files also hold sink.h's WriteFileAtomically, the one writer of
// output files, whose replacing of an existing file is the OS's (rename(2);
// MoveFileEx on Windows) and which never replaces what is not a regular file.
//
// Thread-safety: reentrant. None of these is async-signal-safe.
#ifndef INPROF_BASE_PLATFORM_H_
#define INPROF_BASE_PLATFORM_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace inprof::internal {

// The program's short name (e.g. "checkout"; "checkout.exe" loses its
// extension), "unknown" if none.
std::string ProgramName();

// The host's name, "unknown" on failure.
std::string HostName();

// The OS's text for error number `error` (errno; Windows: GetLastError),
// with the number: "Access is denied (Windows error 5)".
std::string SystemErrorText(uint32_t error);

// This process's id.
int64_t ProcessId();

// Sets an environment variable of this process (programs it starts inherit it).
void SetEnvVar(const char* name, const char* value);

// Names the calling thread (shown by debuggers, ps and inprof's own thread
// labels on Windows); truncated where the OS limits names.
void SetCurrentThreadName(const char* name);

}  // namespace inprof::internal

namespace inprof {

// Writes `bytes` to `path`: inprof's one writer of output files (profiles,
// the report commands' pages). A new or regular file is written through a
// temporary file in the same directory (created with O_CREAT|O_EXCL|
// O_NOFOLLOW, mode 0644, an unguessable name; removed on failure) that then
// replaces `path` (rename(2); MoveFileEx on Windows), so a reader sees the
// old file or the new one, never a partial one. An existing FIFO or
// character device (/dev/null) is written into as what it is, never
// replaced: opened without blocking (a FIFO nobody reads is an error), and
// given up when its reader takes nothing for 10 s. A symbolic link, a
// directory, a block device or a socket at `path` is refused: nothing is
// written, and neither it nor what a link points to is touched. Errors name
// the path in one line.
absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view bytes);

}  // namespace inprof

#endif  // INPROF_BASE_PLATFORM_H_
