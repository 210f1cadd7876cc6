// The Linux variant of base/platform.h (WriteFileAtomically included).
#include "inprof/base/platform.h"
#include "inprof/base/alloc_guard.h"
#include "inprof/base/profiler_thread.h"
#include "inprof/base/sanitizers.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

#if defined(INPROF_ASAN)
#include <sanitizer/asan_interface.h>
#endif

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

namespace {

// How long a write into a FIFO or character device may wait for its reader
// to take more bytes before the write is given up: the exporter thread (or
// Stop()) must never wait for a stalled reader without a limit.
constexpr int kOutputStallMs = 10'000;

const char* KindOfFile(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISFIFO(mode)) return "a FIFO";
  return "not a regular file";
}

// Writes all of `bytes` to `fd` (opened O_NONBLOCK), waiting at most
// kOutputStallMs each time the reader takes nothing.
absl::Status WriteAllBounded(int fd, absl::string_view bytes,
                             const std::string& path) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot write '", path, "'"));
    }
    pollfd p{fd, POLLOUT, 0};
    const int ready = poll(&p, 1, kOutputStallMs);
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) {
      return absl::DeadlineExceededError(absl::StrCat(
          "'", path, "': its reader took nothing for ", kOutputStallMs / 1000,
          " s; gave up after ", done, " of ", bytes.size(), " bytes"));
    }
    if (ready < 0) {
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot write '", path, "'"));
    }
  }
  return absl::OkStatus();
}

// `path` (`leaf` in `dir`) names an existing FIFO or character device
// (`seen`, from lstat):
// the bytes go into it; nothing is created, replaced or truncated.
absl::Status WriteIntoSpecialFile(int dir, const std::string& leaf,
                                  const std::string& path,
                                  absl::string_view bytes,
                                  const struct stat& seen) {
  // O_NONBLOCK: opening a FIFO nobody reads fails (ENXIO) instead of
  // waiting for a reader forever. O_NOFOLLOW: a link swapped in since the
  // lstat() is refused.
  const int fd = openat(dir, leaf.c_str(),
                        O_WRONLY | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENXIO && S_ISFIFO(seen.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "'", path, "' is a FIFO that no process reads; not written"));
    }
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot open '", path, "'"));
  }
  struct stat now;
  if (fstat(fd, &now) != 0 || now.st_dev != seen.st_dev ||
      now.st_ino != seen.st_ino) {
    close(fd);
    return absl::AbortedError(absl::StrCat(
        "'", path, "' was replaced while it was being opened; not written"));
  }
  absl::Status written = WriteAllBounded(fd, bytes, path);
  close(fd);
  return written;
}

// A name for the temporary file next to `path` that another user cannot
// guess in advance (a file planted there would only make the write fail:
// it is created with O_EXCL). The final component stays within NAME_MAX.
std::string TemporaryName(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  uint64_t random = 0;
  if (getrandom(&random, sizeof(random), GRND_NONBLOCK) !=
      static_cast<ssize_t>(sizeof(random))) {
    random = static_cast<uint64_t>(
                 std::chrono::steady_clock::now().time_since_epoch().count()) *
             0x9e3779b97f4a7c15ull;
  }
  const std::string suffix = absl::StrCat(
      ".tmp.", getpid(), ".", counter.fetch_add(1), ".",
      absl::Hex(random, absl::kZeroPad16));
  const size_t slash = path.rfind('/');
  const size_t base = slash == std::string::npos ? 0 : slash + 1;
  std::string out = path;
  constexpr size_t kNameMax = 255;
  if (out.size() - base + suffix.size() > kNameMax) {
    out.resize(base + (kNameMax - suffix.size()));
  }
  return out + suffix;
}

// Whether a user other than this process's (and root) can put an entry in
// directory `dir` or replace one of its entries such as `entry` (lstat of a
// symbolic link in it): its owner is another user, or it is writable by
// others (world, or a group not this process's) without the sticky bit, or
// sticky but the link is another user's (what fs.protected_symlinks
// refuses, held whether or not the kernel is set to).
bool OthersCanPlant(const struct stat& dir, const struct stat& entry) {
  const uid_t me = geteuid();
  if (dir.st_uid != me && dir.st_uid != 0) return true;
  const bool sticky = (dir.st_mode & S_ISVTX) != 0;
  const bool shared = (dir.st_mode & S_IWOTH) != 0 ||
                      ((dir.st_mode & S_IWGRP) != 0 && dir.st_gid != getegid());
  if (!shared) return false;
  return !sticky || (entry.st_uid != me && entry.st_uid != 0);
}

// The directory that holds `path`'s last component, opened (O_PATH) by
// walking its components one at a time from / (or the current directory):
// a symbolic link among them is followed only where no other user could
// have put it there (OthersCanPlant); one that another user could have is
// refused, since following it lets them choose where inprof writes, root's
// files included. Sets `leaf` to the last component.
absl::StatusOr<int> OpenParentDirectory(const std::string& path, std::string& leaf) {
  const size_t slash = path.rfind('/');
  leaf = slash == std::string::npos ? path : path.substr(slash + 1);
  if (leaf.empty() || leaf == "." || leaf == "..") {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' names a directory, not a file"));
  }
  const std::string dir = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  int fd = open(!dir.empty() && dir[0] == '/' ? "/" : ".",
                O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot write '", path, "'"));
  std::deque<std::string> todo = absl::StrSplit(dir, '/', absl::SkipEmpty());
  std::string walked = !dir.empty() && dir[0] == '/' ? "" : ".";  // for messages
  int links = 0;
  while (!todo.empty()) {
    const std::string name = std::move(todo.front());
    todo.pop_front();
    if (name == ".") continue;
    const int next = openat(fd, name.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (next >= 0) {
      close(fd);
      fd = next;
      walked = absl::StrCat(walked, "/", name);
      continue;
    }
    const int err = errno;
    struct stat entry, here;
    if ((err != ENOTDIR && err != ELOOP) ||
        fstatat(fd, name.c_str(), &entry, AT_SYMLINK_NOFOLLOW) != 0 ||
        !S_ISLNK(entry.st_mode) || fstat(fd, &here) != 0) {
      close(fd);
      return absl::ErrnoToStatus(err, absl::StrCat("cannot write '", path, "': '",
                                                   walked, "/", name, "'"));
    }
    if (OthersCanPlant(here, entry)) {
      close(fd);
      return absl::FailedPreconditionError(absl::StrCat(
          "'", path, "': '", walked, "/", name,
          "' is a symbolic link in a directory that other users can write; "
          "inprof does not follow it (another user could choose where the "
          "profile goes): not written (name the directory itself)"));
    }
    char target[PATH_MAX];
    const ssize_t n = readlinkat(fd, name.c_str(), target, sizeof(target) - 1);
    if (n <= 0 || ++links > 40) {  // 40: the kernel's own limit (ELOOP)
      close(fd);
      return absl::ErrnoToStatus(n <= 0 ? errno : ELOOP,
                                 absl::StrCat("cannot write '", path, "': '",
                                              walked, "/", name, "'"));
    }
    target[n] = '\0';
    std::vector<std::string> parts = absl::StrSplit(target, '/', absl::SkipEmpty());
    todo.insert(todo.begin(), parts.begin(), parts.end());
    if (target[0] == '/') {
      const int root = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
      close(fd);
      if (root < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot write '", path, "'"));
      fd = root;
      walked = "";
    }
  }
  return fd;
}

}  // namespace

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view bytes) {
  if (path.empty()) return absl::InvalidArgumentError("empty output path");
  std::string leaf;
  absl::StatusOr<int> opened = OpenParentDirectory(path, leaf);
  if (!opened.ok()) return opened.status();
  const int dir = *opened;
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{dir};
  // Everything below is relative to `dir`: a directory renamed or relinked
  // since the walk does not move the write elsewhere.
  const std::string dir_part = path.substr(0, path.size() - leaf.size());
  struct stat seen;
  if (fstatat(dir, leaf.c_str(), &seen, AT_SYMLINK_NOFOLLOW) == 0) {
    if (S_ISCHR(seen.st_mode) || S_ISFIFO(seen.st_mode)) {
      return WriteIntoSpecialFile(dir, leaf, path, bytes, seen);
    }
    if (S_ISLNK(seen.st_mode)) {
      // Neither followed (the target may be anything, chosen by whoever can
      // write the directory) nor replaced (a link the user made is theirs).
      return absl::FailedPreconditionError(absl::StrCat(
          "'", path, "' is a symbolic link; inprof writes neither through "
          "nor over a link: not written (name the file itself)"));
    }
    if (!S_ISREG(seen.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "'", path, "' is ", KindOfFile(seen.st_mode),
          ", not a regular file; not written"));
    }
  } else if (errno != ENOENT) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot write '", path, "'"));
  }
  // A new file in the same directory, renamed over `path` (atomic: a reader
  // sees the old file or the new one). O_EXCL|O_NOFOLLOW: never opens what
  // someone planted under the temporary name.
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; attempt < 16 && fd < 0; ++attempt) {
    tmp = TemporaryName(leaf);
    fd = openat(dir, tmp.c_str(),
                O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0 && errno != EEXIST) break;
  }
  const std::string tmp_path = dir_part + tmp;
  if (fd < 0) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat("cannot write '", path, "' (creating '", tmp_path, "')"));
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      close(fd);
      unlinkat(dir, tmp.c_str(), 0);
      return absl::ErrnoToStatus(
          err, absl::StrCat("cannot write '", tmp_path, "' for '", path, "'"));
    }
    done += static_cast<size_t>(n);
  }
  if (close(fd) != 0) {
    const int err = errno;
    unlinkat(dir, tmp.c_str(), 0);
    return absl::ErrnoToStatus(
        err, absl::StrCat("cannot write '", tmp_path, "' for '", path, "'"));
  }
  if (renameat(dir, tmp.c_str(), dir, leaf.c_str()) != 0) {
    const int err = errno;
    unlinkat(dir, tmp.c_str(), 0);
    return absl::ErrnoToStatus(
        err, absl::StrCat("cannot rename '", tmp_path, "' to '", path, "'"));
  }
  return absl::OkStatus();
}

namespace internal {
namespace {
__thread bool tls_profiler_thread __attribute__((tls_model("initial-exec"))) = false;
}  // namespace

// base/alloc_guard.h: here, so that libinprof's own code may guard itself
// whether or not the allocation profiler is linked.
__thread AllocThreadState alloc_thread_state __attribute__((tls_model("initial-exec"))) = {};

#if defined(INPROF_ASAN)
namespace {
// AddressSanitizer poisons the redzones around each live frame's locals and
// unpoisons them when the frame returns. fork() copies that shadow, but
// not the threads: in the child, the frames inprof's threads had live at
// fork() never return, and their poison outlives the stacks. Once glibc
// unmaps such a stack (its stack cache holds 40 MiB), a later mapping
// there (libelf mapping libc.so.6 for the child's symbolizer) reads as
// poisoned, and ASan reports a false error in the host's child, then fails
// a CHECK describing it (the dead thread's frame is gone): about 1 child in
// 10 in safety_fork_test's ForkedChildGetsNoTimers... under ASan. The
// child's handler clears the stacks of inprof's threads, which do not exist
// there; the host's own threads' stacks stay as ASan leaves them.
struct AsanStack {
  std::atomic<uintptr_t> lo{0};  // claimed first; 0: a free entry
  std::atomic<uintptr_t> hi{0};  // set after; hi <= lo: not yet usable
};
constexpr int kAsanStacks = 512;  // inprof's threads alive at once
AsanStack asan_stacks[kAsanStacks];

void ClearDeadStacksInChild() {
  // The forking thread lives on in the child; its frames keep their poison.
  const auto sp = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
  for (AsanStack& stack : asan_stacks) {
    const uintptr_t lo = stack.lo.load();
    const uintptr_t hi = stack.hi.load();
    if (lo == 0 || hi <= lo || (sp >= lo && sp < hi)) continue;
    __asan_unpoison_memory_region(reinterpret_cast<void*>(lo), hi - lo);
    stack.hi.store(0);
    stack.lo.store(0);
  }
}

// Frees the thread's entry when it ends (its frames have returned then).
struct AsanStackEntry {
  int index = -1;
  ~AsanStackEntry() {
    if (index < 0) return;
    asan_stacks[index].hi.store(0);
    asan_stacks[index].lo.store(0);
  }
};
thread_local AsanStackEntry asan_stack_entry;

void NoteProfilerThreadStack() {
  static std::atomic<bool> installed{false};
  if (!installed.exchange(true)) {
    pthread_atfork(nullptr, nullptr, &ClearDeadStacksInChild);
  }
  pthread_attr_t attr;
  if (pthread_getattr_np(pthread_self(), &attr) != 0) return;
  void* addr = nullptr;
  size_t size = 0;
  const bool known = pthread_attr_getstack(&attr, &addr, &size) == 0;
  pthread_attr_destroy(&attr);
  if (!known || size == 0) return;
  const auto lo = reinterpret_cast<uintptr_t>(addr);
  for (int i = 0; i < kAsanStacks; ++i) {
    uintptr_t expected = 0;
    if (asan_stacks[i].lo.compare_exchange_strong(expected, lo)) {
      asan_stacks[i].hi.store(lo + size);
      asan_stack_entry.index = i;
      return;
    }
  }
  // Full: this thread's stack keeps ASan's behaviour (a diagnostic aid only).
}
}  // namespace
#endif

bool IsProfilerThread() noexcept { return tls_profiler_thread; }
void MarkProfilerThread() noexcept {
  if (tls_profiler_thread) return;  // libmicrohttpd's threads mark per call
  tls_profiler_thread = true;
#if defined(INPROF_ASAN)
  NoteProfilerThreadStack();
#endif
}
}  // namespace internal

}  // namespace inprof
