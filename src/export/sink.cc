#include "inprof/sink.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"

namespace inprof {
namespace {

absl::Status ErrnoError(int err, absl::string_view what) {
  return absl::ErrnoToStatus(err, what);
}

}  // namespace

std::string ExpandOutputPattern(absl::string_view pattern, pid_t pid,
                                absl::Time start) {
  std::string out;
  out.reserve(pattern.size() + 32);
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%' || i + 1 == pattern.size()) {
      out.push_back(pattern[i]);
      continue;
    }
    switch (pattern[i + 1]) {
      case 'p':
        absl::StrAppend(&out, pid);
        ++i;
        break;
      case 't':
        // Fixed width, so names sort by time.
        absl::StrAppend(&out, absl::FormatTime("%Y%m%dT%H%M%E3SZ", start,
                                               absl::UTCTimeZone()));
        ++i;
        break;
      case '%':
        out.push_back('%');
        ++i;
        break;
      default:
        out.push_back('%');
        break;
    }
  }
  return out;
}

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view bytes) {
  // Same directory as `path`, so that rename() is atomic. The counter keeps
  // two writers in one process apart.
  static std::atomic<uint64_t> counter{0};
  const std::string tmp =
      absl::StrCat(path, ".tmp.", getpid(), ".", counter.fetch_add(1));
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    return ErrnoError(errno, absl::StrCat("cannot create '", tmp,
                                          "' to write '", path, "'"));
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      close(fd);
      unlink(tmp.c_str());
      return ErrnoError(err, absl::StrCat("cannot write '", tmp, "' for '",
                                          path, "'"));
    }
    done += static_cast<size_t>(n);
  }
  if (close(fd) != 0) {
    const int err = errno;
    unlink(tmp.c_str());
    return ErrnoError(err,
                      absl::StrCat("cannot write '", tmp, "' for '", path, "'"));
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    unlink(tmp.c_str());
    return ErrnoError(err, absl::StrCat("cannot rename '", tmp, "' to '",
                                        path, "'"));
  }
  return absl::OkStatus();
}

absl::Status FileSink::Consume(std::shared_ptr<const ExportedProfile> profile) {
  std::string path = ExpandOutputPattern(pattern_, getpid(), profile->start);
  absl::Status status = WriteFileAtomically(path, profile->pprof);
  if (status.ok()) last_path_ = std::move(path);
  return status;
}

}  // namespace inprof
