// internal: not part of the public API.
//
// /proc/PID/maps, parsed: what another process has mapped, for
// symbolizing its addresses from outside it (the agent, in library mode).
//
// Example:
//   auto maps = internal::ReadProcessMaps(pid);
//   for (const auto& m : *maps) if (m.executable) ...
#ifndef INPROF_INTERNAL_PROCESS_MAPS_H_
#define INPROF_INTERNAL_PROCESS_MAPS_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace inprof::internal {

struct MapsEntry {
  uint64_t start = 0, limit = 0;
  bool readable = false, executable = false;
  uint64_t offset = 0;  // in the file
  uint64_t dev_major = 0, dev_minor = 0, inode = 0;
  std::string path;  // empty (anonymous), "[vdso]", "[stack]", a file
  bool deleted = false;  // the path ended in " (deleted)" (stripped)
};

// Parses the text of a maps file; a malformed line is an error naming its
// number and what was wrong.
absl::StatusOr<std::vector<MapsEntry>> ParseProcessMaps(absl::string_view text);

// Reads and parses /proc/PID/maps; the error names the file (a process
// that is gone: "No such file or directory").
absl::StatusOr<std::vector<MapsEntry>> ReadProcessMaps(pid_t pid,
                                                       std::string* text = nullptr);

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_PROCESS_MAPS_H_
