// The Linux variant of internal/platform.h (and sink.h's WriteFileAtomically).
#include "inprof/internal/platform.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <atomic>

#include "absl/strings/str_cat.h"
#include "inprof/sink.h"

namespace inprof {
namespace internal {

std::string ProgramName() {
  const char* name = program_invocation_short_name;
  return name != nullptr && name[0] != '\0' ? std::string(name) : "unknown";
}

std::string HostName() {
  char buf[HOST_NAME_MAX + 1] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') {
    return "unknown";
  }
  return buf;
}

std::string SystemErrorText(uint32_t error) {
  return absl::StrCat(strerror(static_cast<int>(error)), " (errno ", error, ")");
}

int64_t ProcessId() { return getpid(); }

void SetEnvVar(const char* name, const char* value) {
  setenv(name, value, 1);
}

void SetCurrentThreadName(const char* name) {
  char truncated[16] = {};  // the kernel's limit, NUL included
  for (size_t i = 0; i + 1 < sizeof(truncated) && name[i] != '\0'; ++i) {
    truncated[i] = name[i];
  }
  pthread_setname_np(pthread_self(), truncated);
}

}  // namespace internal

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view bytes) {
  // Same directory as `path`, so that rename() is atomic. The counter keeps
  // two writers in one process apart.
  static std::atomic<uint64_t> counter{0};
  const std::string tmp =
      absl::StrCat(path, ".tmp.", getpid(), ".", counter.fetch_add(1));
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat("cannot create '", tmp, "' to write '", path, "'"));
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      close(fd);
      unlink(tmp.c_str());
      return absl::ErrnoToStatus(
          err, absl::StrCat("cannot write '", tmp, "' for '", path, "'"));
    }
    done += static_cast<size_t>(n);
  }
  if (close(fd) != 0) {
    const int err = errno;
    unlink(tmp.c_str());
    return absl::ErrnoToStatus(
        err, absl::StrCat("cannot write '", tmp, "' for '", path, "'"));
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    unlink(tmp.c_str());
    return absl::ErrnoToStatus(
        err, absl::StrCat("cannot rename '", tmp, "' to '", path, "'"));
  }
  return absl::OkStatus();
}

}  // namespace inprof
