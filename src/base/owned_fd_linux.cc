#include "inprof/base/owned_fd.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/perf_event.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "inprof/base/log.h"

namespace inprof::internal {
namespace {

std::atomic<uint64_t> g_foreign{0};
std::atomic<bool> g_foreign_said{false};

// The first number MoveAboveProgramRange tries: half the soft limit, at most
// 1024 (a higher number grows the kernel's descriptor table to it).
int HighFloor() noexcept {
  rlimit limit;
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return -1;
  const rlim_t soft = limit.rlim_cur;
  if (soft == RLIM_INFINITY || soft >= 2048) return 1024;
  return static_cast<int>(soft / 2);
}

}  // namespace

FdIdentity IdentifyFd(int fd, bool perf_event) noexcept {
  FdIdentity id;
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) return id;
  id.dev = st.st_dev;
  id.ino = st.st_ino;
  id.type = st.st_mode & S_IFMT;
  if (perf_event) {
    uint64_t perf_id = 0;
    if (ioctl(fd, PERF_EVENT_IOC_ID, &perf_id) == 0) id.perf_id = perf_id;
  }
  id.valid = true;
  return id;
}

bool IsStillOurs(int fd, const FdIdentity& identity) noexcept {
  if (fd < 0 || !identity.valid) return false;
  const int saved = errno;
  struct stat st;
  bool same = fstat(fd, &st) == 0 && st.st_dev == identity.dev &&
              st.st_ino == identity.ino &&
              (st.st_mode & S_IFMT) == identity.type;
  // Every perf event has the same anonymous inode; its id tells them apart.
  // (fstat said the number is an anonymous-inode file, so the perf ioctl
  // never reaches a device of the program's.)
  if (same && identity.perf_id != 0) {
    uint64_t perf_id = 0;
    same = ioctl(fd, PERF_EVENT_IOC_ID, &perf_id) == 0 &&
           perf_id == identity.perf_id;
  }
  errno = saved;
  return same;
}

void NoteDescriptorTaken(int fd, const char* what) noexcept {
  g_foreign.fetch_add(1, std::memory_order_relaxed);
  if (g_foreign_said.exchange(true)) return;
  Log(absl::StrCat("descriptor ", fd, " (", what,
                   ") is no longer inprof's: the program closed it and may "
                   "have reused the number; inprof leaves that number alone "
                   "(said once)"));
}

uint64_t ForeignDescriptors() noexcept {
  return g_foreign.load(std::memory_order_relaxed);
}

bool CloseIfOurs(int fd, const FdIdentity& identity) noexcept {
  if (fd < 0) return false;
  if (!IsStillOurs(fd, identity)) {
    NoteDescriptorTaken(fd, "kept by inprof");
    return false;
  }
  close(fd);
  return true;
}

int MoveAboveProgramRange(int fd) noexcept {
  if (fd < 0) return fd;
  const int saved = errno;
  const int floor = HighFloor();
  int moved = -1;
  if (floor > fd) {
    // The original is closed only while it still is what was duplicated:
    // a program closing descriptors on another thread meanwhile (and
    // opening one on this number) keeps its file.
    const FdIdentity identity = IdentifyFd(fd);
    moved = fcntl(fd, F_DUPFD_CLOEXEC, floor);
    if (moved >= 0) {
      if (IsStillOurs(moved, identity) && IsStillOurs(fd, identity)) {
        close(fd);
      }
      fd = moved;
    }
  }
  if (moved < 0) fcntl(fd, F_SETFD, FD_CLOEXEC);
  errno = saved;
  return fd;
}

OwnedFd OwnedFd::Adopt(int fd) noexcept {
  OwnedFd owned;
  if (fd < 0) return owned;
  owned.fd_ = MoveAboveProgramRange(fd);
  owned.identity_ = IdentifyFd(owned.fd_);
  return owned;
}

int OwnedFd::Verified() noexcept {
  if (fd_ < 0) return -1;
  if (IsStillOurs(fd_, identity_)) return fd_;
  NoteDescriptorTaken(fd_, "kept by inprof");
  fd_ = -1;
  return -1;
}

void OwnedFd::Reset() noexcept {
  if (fd_ < 0) return;
  CloseIfOurs(fd_, identity_);
  fd_ = -1;
}

void DescriptorBudget::Configure(int64_t numerator, int64_t denominator,
                                 int cap, const char* what,
                                 const char* fallback) {
  std::lock_guard<std::mutex> lock(recount_mutex_);
  numerator_ = numerator;
  denominator_ = denominator > 0 ? denominator : 1;
  cap_ = cap;
  what_ = what;
  fallback_ = fallback;
  refused_.store(0, std::memory_order_relaxed);
  said_.store(false, std::memory_order_relaxed);
  rlimit limit;
  Recount(getrlimit(RLIMIT_NOFILE, &limit) == 0 ? limit.rlim_cur : 0);
}

// recount_mutex_ held.
void DescriptorBudget::Recount(uint64_t soft_limit) {
  soft_limit_.store(soft_limit, std::memory_order_relaxed);
  const int64_t free_fds = FreeFileDescriptors();
  if (free_fds < 0) {
    limit_.store(0, std::memory_order_relaxed);
    return;
  }
  // What the program could open if inprof held none of these.
  const int64_t available = free_fds + held_.load(std::memory_order_relaxed);
  limit_.store(static_cast<int>(std::clamp<int64_t>(
                   available * numerator_ / denominator_, 0, cap_)),
               std::memory_order_relaxed);
}

bool DescriptorBudget::TryTake() {
  rlimit now;
  if (getrlimit(RLIMIT_NOFILE, &now) == 0 &&
      now.rlim_cur != soft_limit_.load(std::memory_order_relaxed)) {
    std::lock_guard<std::mutex> lock(recount_mutex_);
    if (now.rlim_cur != soft_limit_.load(std::memory_order_relaxed)) {
      Recount(now.rlim_cur);
    }
  }
  if (held_.fetch_add(1, std::memory_order_relaxed) <
      limit_.load(std::memory_order_relaxed)) {
    return true;
  }
  held_.fetch_sub(1, std::memory_order_relaxed);
  refused_.fetch_add(1, std::memory_order_relaxed);
  if (!said_.exchange(true)) {
    const uint64_t soft = soft_limit_.load(std::memory_order_relaxed);
    Log(absl::StrCat(
        what_, " keeps at most ", limit(), " descriptors (a share of those "
        "the program may open under RLIMIT_NOFILE=",
        soft == RLIM_INFINITY ? std::string("unlimited") : absl::StrCat(soft),
        "): ", fallback_, " (said once)"));
  }
  return false;
}

std::string DescriptorBudget::Describe() const {
  const uint64_t refused = this->refused();
  if (refused == 0) return "";
  const uint64_t soft = soft_limit_.load(std::memory_order_relaxed);
  return absl::StrCat(
      "held back ", refused, " time", refused == 1 ? "" : "s", " at ", limit(),
      " descriptors under RLIMIT_NOFILE=",
      soft == RLIM_INFINITY ? std::string("unlimited") : absl::StrCat(soft),
      ": ", fallback_);
}

int64_t FreeFileDescriptors() noexcept {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int64_t open_fds = -1;  // the directory's own descriptor
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++open_fds;
  }
  closedir(dir);
  rlimit limit;
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return -1;
  const int64_t soft =
      limit.rlim_cur == RLIM_INFINITY
          ? int64_t{1} << 20
          : static_cast<int64_t>(std::min<rlim_t>(limit.rlim_cur, 1 << 20));
  return std::max<int64_t>(0, soft - open_fds);
}

}  // namespace inprof::internal
