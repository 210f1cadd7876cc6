#include "inprof/base/owned_fd.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/perf_event.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <system_error>
#include <thread>

#include "absl/strings/str_cat.h"
#include "inprof/base/contained.h"
#include "inprof/base/log.h"
#include "inprof/base/platform.h"
#include "inprof/base/profiler_thread.h"
#include "inprof/base/sanitizers.h"

namespace inprof::internal {
namespace {

std::atomic<uint64_t> g_foreign{0};
std::atomic<bool> g_foreign_said{false};

// The first number MoveAboveProgramRange tries: half the soft limit, at most
// 1024 (a higher number grows the kernel's descriptor table to it).
int HighFloorUnder(rlim_t soft) noexcept {
  if (soft == RLIM_INFINITY || soft >= 2048) return 1024;
  return static_cast<int>(soft / 2);
}
int HighFloor() noexcept {
  rlimit limit;
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return -1;
  return HighFloorUnder(limit.rlim_cur);
}

}  // namespace

namespace {
FdIdentity IdentityOf(const struct stat& st) noexcept {
  FdIdentity id;
  id.dev = st.st_dev;
  id.ino = st.st_ino;
  id.type = st.st_mode & S_IFMT;
  id.valid = true;
  return id;
}
}  // namespace

FdIdentity IdentifyFd(int fd, bool perf_event) noexcept {
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) return FdIdentity{};
  FdIdentity id = IdentityOf(st);
  if (perf_event) {
    uint64_t perf_id = 0;
    if (ioctl(fd, PERF_EVENT_IOC_ID, &perf_id) == 0) id.perf_id = perf_id;
  }
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

namespace {
// The perf event `fd` is now (no ioctl reaches a device): its identity,
// as IdentifyFd(fd, true) says it; false when it is none.
bool PerfEventIdentity(int fd, FdIdentity* identity) noexcept {
  struct stat st;
  if (fstat(fd, &st) != 0 || S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) {
    return false;
  }
  uint64_t perf_id = 0;
  if (ioctl(fd, PERF_EVENT_IOC_ID, &perf_id) != 0) return false;
  *identity = IdentityOf(st);
  identity->perf_id = perf_id;
  return true;
}
}  // namespace

int MovePerfEventAboveProgramRange(int fd, FdIdentity* identity, uint64_t soft_limit) noexcept {
  if (fd < 0) return fd;
  const int saved = errno;
  FdIdentity own;
  if (!PerfEventIdentity(fd, &own)) {
    // The program put a file of its own on the number (dup2) since
    // perf_event_open returned it: the event is gone, the file is left be.
    NoteDescriptorTaken(fd, "a perf event being opened");
    errno = EBADF;
    return -1;
  }
  *identity = own;
  const int floor = soft_limit != 0 ? HighFloorUnder(soft_limit) : HighFloor();
  if (floor <= fd) {
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    errno = saved;
    return fd;
  }
  const int moved = fcntl(fd, F_DUPFD_CLOEXEC, floor);
  if (moved < 0) {
    errno = saved;
    return fd;  // no number free up there: it stays where it is
  }
  FdIdentity copy;
  if (!PerfEventIdentity(moved, &copy) || copy.perf_id != own.perf_id) {
    // The number changed hands between the check and the copy: the copy
    // is of the program's file (a number the program never saw), dropped.
    close(moved);
    NoteDescriptorTaken(fd, "a perf event being opened");
    errno = EBADF;
    return -1;
  }
  *identity = copy;
  FdIdentity still;
  if (PerfEventIdentity(fd, &still) && still.perf_id == own.perf_id) close(fd);
  errno = saved;
  return moved;
}

OwnedFd OwnedFd::Adopt(int fd) noexcept {
  OwnedFd owned;
  if (fd < 0) return owned;
  owned.table_ = CurrentDescriptorTable();
  // A private table holds no number of the program's: nothing to move from.
  owned.fd_ = owned.table_ == 0 ? MoveAboveProgramRange(fd) : fd;
  owned.identity_ = IdentifyFd(owned.fd_);
  return owned;
}

int OwnedFd::Verified() noexcept {
  if (fd_ < 0) return -1;
  if (!InThisTable()) {
    // Not a number of this thread's table (its own table's thread is gone,
    // or keeps it): forgotten here, never used.
    fd_ = -1;
    return -1;
  }
  if (IsStillOurs(fd_, identity_)) return fd_;
  NoteDescriptorTaken(fd_, "kept by inprof");
  fd_ = -1;
  return -1;
}

void OwnedFd::Reset() noexcept {
  if (fd_ < 0) return;
  if (InThisTable()) CloseIfOurs(fd_, identity_);
  fd_ = -1;
}

bool OwnedFd::CloseParked(const Parked& parked) noexcept {
  if (parked.fd < 0) return true;
  if (parked.table != CurrentDescriptorTable()) return false;
  CloseIfOurs(parked.fd, parked.identity);
  return true;
}

namespace {
std::atomic<uint32_t> g_next_table{1};
thread_local uint32_t tls_table = 0;
std::atomic<bool> g_private_refused_said{false};

void SayPrivateRefused(const char* what, int err) noexcept {
  if (g_private_refused_said.exchange(true)) return;
  Log(absl::StrCat(
      "inprof's threads share the program's descriptor table (", what, ": ",
      strerror(err),
      "): a file they open briefly takes a number of the program's for "
      "microseconds, checked before each use and close (said once)"));
}

// Closes every descriptor of the calling thread's table but `keep`.
void CloseAllBut(int keep) noexcept {
#if defined(SYS_close_range)
  bool done = true;
  if (keep > 0 && syscall(SYS_close_range, 0U, static_cast<unsigned>(keep - 1), 0U) != 0) {
    done = false;
  }
  if (done && syscall(SYS_close_range, static_cast<unsigned>(keep + 1), ~0U, 0U) != 0) {
    done = false;
  }
  if (done) return;
#endif
  // Before Linux 5.9: each number this table holds (/proc/thread-self
  // lists this thread's table, /proc/self the main thread's), closed as the
  // listing passes it.
  DIR* dir = opendir("/proc/thread-self/fd");
  if (dir == nullptr) return;
  const int dir_fd = dirfd(dir);
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    const int n = atoi(e->d_name);
    if (n != keep && n != dir_fd) close(n);
  }
  closedir(dir);
}
}  // namespace

uint32_t CurrentDescriptorTable() noexcept { return tls_table; }

DescriptorTableHandle ThisDescriptorTable() noexcept {
  return DescriptorTableHandle{tls_table, tls_table != 0 ? ProgramStderrPidfd() : -1};
}

void JoinDescriptorTable(const DescriptorTableHandle& table) noexcept {
  if (table.table == 0 || tls_table == table.table) return;
  tls_table = table.table;
  UseProgramStderrThrough(table.stderr_pidfd);
}

namespace {

// inprof's file thread: one job at a time, the caller waiting. Made per
// process (a forked child starts its own; the parent's, whose thread the
// child lacks, is left as it was) and never destroyed (a thread may call in
// while static destructors run).
struct FileThread {
  pid_t pid = 0;
  bool private_table = false;
  std::thread thread;
  std::mutex call;  // one caller at a time
  std::mutex mutex;
  std::condition_variable cv;
  const std::function<void()>* job = nullptr;  // mutex
  bool done = false;                           // mutex
  bool ok = false;                             // mutex
  bool exit = false;                           // mutex
  pid_t tid = 0;  // set before `started`
};

std::mutex g_file_thread_mutex;
FileThread* g_file_thread = nullptr;  // g_file_thread_mutex

void ServeFiles(FileThread* f, std::promise<bool>* started) {
  SetCurrentThreadName("inprof-files");
  MarkProfilerThread();
  f->tid = static_cast<pid_t>(syscall(SYS_gettid));
  f->private_table = EnterPrivateDescriptorTable();
  started->set_value(f->private_table);
  std::unique_lock<std::mutex> lock(f->mutex);
  for (;;) {
    f->cv.wait(lock, [f] { return f->job != nullptr || f->exit; });
    if (f->job == nullptr) return;  // EndFileThread
    const std::function<void()>* job = f->job;
    lock.unlock();
    const bool ok = RunContained("a file read of inprof's", *job);
    lock.lock();
    f->job = nullptr;
    f->ok = ok;
    f->done = true;
    f->cv.notify_all();
  }
}

// This process's file thread, started if need be; nullptr when it cannot
// run (no thread, or no table of its own: the caller runs the job itself).
FileThread* FileThreadForThisProcess() {
  std::lock_guard<std::mutex> lock(g_file_thread_mutex);
  const pid_t pid = getpid();
  if (g_file_thread != nullptr && g_file_thread->pid == pid) {
    return g_file_thread->private_table ? g_file_thread : nullptr;
  }
  auto* f = new FileThread;  // never freed (see FileThread)
  f->pid = pid;
  std::promise<bool> started;
  std::future<bool> table = started.get_future();
  try {
    f->thread = std::thread(ServeFiles, f, &started);
  } catch (const std::system_error&) {
    // No thread now: inline this time, another try at the next call.
    delete f;
    return nullptr;
  }
  table.wait();
  g_file_thread = f;
  return f->private_table ? f : nullptr;
}

}  // namespace

void EndFileThread() noexcept {
  std::lock_guard<std::mutex> lock(g_file_thread_mutex);
  FileThread* f = g_file_thread;
  // A forked child's is the parent's, whose thread it lacks: left as is.
  if (f == nullptr || f->pid != getpid()) return;
  {
    std::lock_guard<std::mutex> call(f->call);  // after the job in flight
    std::lock_guard<std::mutex> state(f->mutex);
    f->exit = true;
  }
  f->cv.notify_all();
  if (f->thread.joinable()) f->thread.join();
  // join() returns when the thread's stack is free, a moment before the
  // kernel lets its task go: Stop() returns once it is gone from
  // /proc/self/task (bounded: 50 ms).
  if (f->tid > 0) {
    char task[64];  // not on the heap: this runs with the heap exhausted too
    std::snprintf(task, sizeof(task), "/proc/self/task/%d", static_cast<int>(f->tid));
    for (int i = 0; i < 1000 && access(task, F_OK) == 0; ++i) {
      usleep(50);
    }
  }
  g_file_thread = nullptr;
  delete f;
}

bool RunWithOwnDescriptors(const std::function<void()>& fn) {
#if defined(INPROF_TSAN)
  // ThreadSanitizer tracks descriptors by number, process-wide: one table's
  // close would read as a race with another's use of the same number.
  return RunContained("a file read of inprof's", fn);
#else
  if (tls_table != 0) return RunContained("a file read of inprof's", fn);
  FileThread* f = nullptr;
  RunContained("starting inprof's file thread", [&] { f = FileThreadForThisProcess(); });
  if (f == nullptr) return RunContained("a file read of inprof's", fn);
  std::lock_guard<std::mutex> call(f->call);
  std::unique_lock<std::mutex> lock(f->mutex);
  f->done = false;
  f->job = &fn;
  f->cv.notify_all();
  f->cv.wait(lock, [f] { return f->done; });
  return f->ok;
#endif
}

bool EnterPrivateDescriptorTable() noexcept {
  if (tls_table != 0) return true;
#if defined(INPROF_TSAN)
  // ThreadSanitizer tracks descriptors by number, process-wide: one
  // table's close would read as a race with another's use of the number.
  return false;
#endif
  const int saved = errno;
  if (unshare(CLONE_FILES) != 0) {
    SayPrivateRefused("unshare(CLONE_FILES)", errno);
    errno = saved;
    return false;
  }
  // From here on this thread's table is a copy of the program's: what it
  // opens is its own. The copy's references to the program's files go
  // below, all but a pidfd to fetch the program's stderr through.
  int pidfd = -1;
  int keep = STDERR_FILENO;
#if defined(SYS_pidfd_open) && defined(SYS_pidfd_getfd)
  pidfd = static_cast<int>(syscall(SYS_pidfd_open, getpid(), 0U));
  if (pidfd >= 0) {
    const int probe = static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, STDERR_FILENO, 0U));
    // EBADF: the program has no descriptor 2 now; the call itself works.
    if (probe >= 0 || errno == EBADF) {
      if (probe >= 0) close(probe);
      keep = pidfd;
    } else {
      SayPrivateRefused("pidfd_getfd", errno);
      close(pidfd);
      pidfd = -1;
    }
  } else {
    SayPrivateRefused("pidfd_open", errno);
  }
#endif
  // Without a pidfd the thread keeps its copy of descriptor 2 (its lines go
  // to the stderr the program had when the thread started). Closing the
  // copies drops references only: the program's POSIX record locks belong
  // to its table (the kernel's lock owner is the files_struct), and epoll
  // and flock hold on until a file's last reference goes.
  CloseAllBut(keep);
  // 0, 1 and 2 taken (see DescriptorTableHandle): a thread created here
  // that writes to them before it knows its table writes nowhere.
  for (int n = 0; n <= STDERR_FILENO; ++n) {
    if (n == keep || dup2(keep, n) == n) continue;
    // No descriptor 2 to copy (no pidfd either): /dev/null.
    const int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null >= 0 && null != n) {
      dup2(null, n);
      close(null);
    }
  }
  UseProgramStderrThrough(pidfd);
  tls_table = g_next_table.fetch_add(1, std::memory_order_relaxed);
  errno = saved;
  return true;
}

void DescriptorBudget::Configure(int64_t numerator, int64_t denominator,
                                 int cap, const char* what,
                                 const char* fallback, const char* cap_name) {
  std::lock_guard<std::mutex> lock(recount_mutex_);
  numerator_ = numerator;
  denominator_ = denominator > 0 ? denominator : 1;
  cap_ = cap;
  what_ = what;
  fallback_ = fallback;
  cap_name_ = cap_name;
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
  const int64_t share = available * numerator_ / denominator_;
  capped_.store(share > cap_, std::memory_order_relaxed);
  limit_.store(static_cast<int>(std::clamp<int64_t>(share, 0, cap_)),
               std::memory_order_relaxed);
}

std::string DescriptorBudget::Bound() const {
  if (capped_.load(std::memory_order_relaxed) && cap_name_ != nullptr) {
    return absl::StrCat("(", cap_name_, ")");
  }
  const uint64_t soft = soft_limit_.load(std::memory_order_relaxed);
  return absl::StrCat(
      "(a share of those the program may open under RLIMIT_NOFILE=",
      soft == RLIM_INFINITY ? std::string("unlimited") : absl::StrCat(soft), ")");
}

bool DescriptorBudget::TryTake(uint64_t* soft_limit) {
  rlimit now;
  const bool read = getrlimit(RLIMIT_NOFILE, &now) == 0;
  if (read && soft_limit != nullptr) *soft_limit = now.rlim_cur;
  if (read && now.rlim_cur != soft_limit_.load(std::memory_order_relaxed)) {
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
    Log(absl::StrCat(what_, " keeps at most ", limit(), " descriptors ", Bound(), ": ",
                     fallback_, " (said once)"));
  }
  return false;
}

std::string DescriptorBudget::Describe() const {
  const uint64_t refused = this->refused();
  if (refused == 0) return "";
  return absl::StrCat("held back ", refused, " time", refused == 1 ? "" : "s", " at ", limit(),
                      " descriptors ", Bound(), ": ", fallback_);
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
