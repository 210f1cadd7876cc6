// internal: not part of the public API.
//
// Descriptors inprof keeps from one call to the next (a thread's perf event,
// a kept /proc file, the agent's socket), and how many it may keep (Linux).
//
// The program owns the descriptor table: a daemon closes everything it
// inherited at start (close_range(3, ~0U, 0), closefrom), inprof's
// descriptors included, and its next open() takes the lowest free number,
// often one inprof still thinks it holds. A number is therefore only a
// hint: inprof uses or closes a descriptor it keeps only after checking that
// the number still refers to the object it opened (OwnedFd::Verified,
// CloseIfOurs). It keeps them above the numbers the program's open() takes
// first (MoveAboveProgramRange), so that a closed one is rarely reused, and
// it keeps at most a share of what the program may still open, re-counted
// when the program changes its RLIMIT_NOFILE (DescriptorBudget). What no
// check covers: a program closing descriptors it does not own on one
// thread at the moment inprof opens, reads and closes one on another (a
// window of microseconds).
//
// Thread-safety: OwnedFd is a value (one owner at a time); DescriptorBudget
// is thread-safe. Only IsStillOurs is async-signal-safe.
//
// Example:
//   internal::OwnedFd file =
//       internal::OwnedFd::Adopt(open(path, O_RDONLY | O_CLOEXEC));
//   ...
//   if (const int fd = file.Verified(); fd >= 0) pread(fd, buf, n, 0);
//   file.Reset();  // closes it only if it is still inprof's
#ifndef INPROF_BASE_OWNED_FD_H_
#define INPROF_BASE_OWNED_FD_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

namespace inprof::internal {

// What a descriptor referred to when inprof opened it: the file (device and
// inode: sockets, pipes and memfds have inodes of their own), and for a perf
// event (all share one anonymous inode) the kernel's id of the event.
struct FdIdentity {
  dev_t dev = 0;
  ino_t ino = 0;
  mode_t type = 0;  // S_IFMT bits
  uint64_t perf_id = 0;
  bool valid = false;
};

// The identity of `fd` now; `perf_event`: also its PERF_EVENT_IOC_ID.
FdIdentity IdentifyFd(int fd, bool perf_event = false) noexcept;

// Whether `fd` still refers to `identity` (false for a closed number).
// Async-signal-safe (fstat, ioctl).
bool IsStillOurs(int fd, const FdIdentity& identity) noexcept;

// Closes `fd` if it still refers to `identity`; otherwise leaves the number
// alone (the program closed inprof's descriptor and may have reused the
// number) and counts it (ForeignDescriptors). Returns whether it closed.
bool CloseIfOurs(int fd, const FdIdentity& identity) noexcept;

// Counts a descriptor inprof found taken from it (`what` it was) and says
// so once in the log.
void NoteDescriptorTaken(int fd, const char* what) noexcept;

// Descriptors inprof found closed or reused by the program since the
// process started.
uint64_t ForeignDescriptors() noexcept;

// `fd`, moved to a close-on-exec number at or above the floor the program's
// open() reaches last (half the RLIMIT_NOFILE soft limit, at most 1024):
// its own open() calls take the lowest free numbers, so a number of inprof's
// that the program closed is rarely reused. Returns `fd` itself when it
// cannot be moved (no number free there), close-on-exec; -1 stays -1.
int MoveAboveProgramRange(int fd) noexcept;

// A perf event `fd` just opened, moved like MoveAboveProgramRange, but only
// while the number still is a perf event (PERF_EVENT_IOC_ID, an ioctl only
// perf answers, asked of no device), and the same one throughout: a program
// that put a file of its own on that number (dup2) keeps it untouched, and
// -1 (EBADF) is returned, counted as taken. `*identity`: the returned
// number's IdentifyFd(.., true), as the checks read it (no second fstat and
// ioctl). `soft_limit`: the RLIMIT_NOFILE soft limit the caller has just
// read (DescriptorBudget::TryTake), or 0 to read it here. The one kind of
// descriptor inprof must open in the program's table (the kernel routes an
// overflow through it, and the handler re-arms it); between the last check
// and the close of the low number lie nanoseconds.
int MovePerfEventAboveProgramRange(int fd, FdIdentity* identity,
                                   uint64_t soft_limit = 0) noexcept;

// Descriptors this process may still open under its RLIMIT_NOFILE soft
// limit (counted in /proc/self/fd; an unlimited one counts as 2^20), or -1
// when that cannot be told. Not for handlers.
int64_t FreeFileDescriptors() noexcept;

// Descriptor tables. The program's threads share one; a thread of
// inprof's that opens files only for itself (the wall ticker reading
// /proc/self/task/TID/syscall) takes a table of its own
// (EnterPrivateDescriptorTable): what it opens and closes there can never be
// a number of the program's, at any moment, whatever the program does with
// its own table (dup2 onto a number, close_range). The private table starts
// empty of the program's descriptors (a copy would keep the program's files
// open: a pipe's reader would wait for an end that never comes), and lines
// such a thread logs go to the program's stderr as it is at that moment
// (pidfd_getfd, Linux 5.6). Dies with the thread.

// Which table the calling thread uses: 0 for the program's, another number
// for each private table.
uint32_t CurrentDescriptorTable() noexcept;

// Gives the calling thread a table of its own, with none of the program's
// descriptors in it. False (the thread keeps the program's table, with
// today's checks) where the kernel or a seccomp filter refuses unshare
// (CLONE_FILES) or pidfds; says which once. Not for handlers.
bool EnterPrivateDescriptorTable() noexcept;

// A private table as the threads its thread creates share it (clone's
// CLONE_FILES: a thread shares the table its creator has at that moment;
// libmicrohttpd's threads, an uploader's): they find themselves there with
// JoinDescriptorTable, so that they log through the table's pidfd and run
// RunWithOwnDescriptors inline. In a private table 0, 1 and 2 are taken
// (by the pidfd, or copies of the program's stderr): a thread that writes
// to its stdout or stderr without knowing its table writes nowhere, never
// into a file inprof opened there.
struct DescriptorTableHandle {
  uint32_t table = 0;  // 0: the program's
  int stderr_pidfd = -1;
};
// The calling thread's table, for the threads it creates.
DescriptorTableHandle ThisDescriptorTable() noexcept;
// The calling thread was created by a thread of `table` (so it uses that
// table): says so for CurrentDescriptorTable, RunWithOwnDescriptors and its
// log lines. Cheap (thread-local stores); a no-op for table 0.
void JoinDescriptorTable(const DescriptorTableHandle& table) noexcept;

// Runs `fn` where the files it opens and closes are in a table of inprof's
// own: inline on a thread that has one, otherwise on inprof's file thread
// ("inprof-files", started at the first call, one per process), the caller
// waiting (ended by EndFileThread). For work that keeps no descriptor once it returns (a module's
// CFI read, the leaf resolver's module list): a number it opened means
// nothing to another thread. Exceptions `fn` throws are contained there
// (base/contained.h): the call returns false. Without private tables
// (EnterPrivateDescriptorTable refused, ThreadSanitizer) `fn` runs inline.
// Not for handlers.
bool RunWithOwnDescriptors(const std::function<void()>& fn);
// Ends this process's file thread, if it has one (Stop(): a stopped
// profiler leaves no thread behind); the next RunWithOwnDescriptors starts
// another.
void EndFileThread() noexcept;

// A descriptor inprof opened and keeps, with its identity. Move-only.
// Usable (Verified) and closed (Reset) only on a thread of the table it was
// opened in; elsewhere it is only forgotten (Park hands it to that table's
// thread).
class OwnedFd {
 public:
  OwnedFd() = default;
  // Takes `fd` (-1: an empty OwnedFd), moved above the program's range.
  static OwnedFd Adopt(int fd) noexcept;
  ~OwnedFd() { Reset(); }
  OwnedFd(OwnedFd&& other) noexcept
      : fd_(other.fd_), table_(other.table_), identity_(other.identity_) {
    other.fd_ = -1;
  }
  OwnedFd& operator=(OwnedFd&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = other.fd_;
      table_ = other.table_;
      identity_ = other.identity_;
      other.fd_ = -1;
    }
    return *this;
  }
  OwnedFd(const OwnedFd&) = delete;
  OwnedFd& operator=(const OwnedFd&) = delete;

  bool valid() const { return fd_ >= 0; }
  // The number, unchecked: for comparisons only, never to use or close.
  int number() const { return fd_; }
  // The number if it still refers to what inprof opened; otherwise -1, and
  // the descriptor is forgotten without being closed (counted).
  int Verified() noexcept;
  // Closes it if it is still inprof's, and forgets it either way. On a
  // thread of another table it is only forgotten: that table's thread
  // closes it (Park), or its table went with its thread.
  void Reset() noexcept;
  // Whether it was opened in the calling thread's table.
  bool InThisTable() const noexcept {
    return table_ == CurrentDescriptorTable();
  }

  // What a descriptor was, to be closed later by a thread of its table.
  struct Parked {
    int fd = -1;
    uint32_t table = 0;
    FdIdentity identity;
  };
  // Forgets it, returning what it was.
  Parked Park() noexcept {
    Parked parked{fd_, table_, identity_};
    fd_ = -1;
    return parked;
  }
  // Closes a parked descriptor if the calling thread uses its table and it
  // is still inprof's. Returns whether it was of this table (closed or
  // found taken); one of another table is left alone.
  static bool CloseParked(const Parked& parked) noexcept;

 private:
  int fd_ = -1;
  uint32_t table_ = 0;
  FdIdentity identity_;
};

// How many descriptors a component may keep open: a share (numerator /
// denominator, at most `cap`) of those the program may still open plus those
// the component holds. Counted at Configure and again whenever the program
// has changed its RLIMIT_NOFILE soft limit since (TryTake reads it: one
// getrlimit), so that a program that lowers its limit after Start() keeps
// what it could open.
class DescriptorBudget {
 public:
  // `what` names the component in the log ("the perf engine"), `cap_name`
  // the setting that fixed `cap` (null: none the user sets).
  void Configure(int64_t numerator, int64_t denominator, int cap,
                 const char* what, const char* fallback,
                 const char* cap_name = nullptr);
  // Reserves one descriptor; false when the component holds its share
  // already (the first refusal is logged, once per Configure). The soft
  // limit it read goes to `*soft_limit` when given (unchanged when it
  // could not be read).
  bool TryTake(uint64_t* soft_limit = nullptr);
  // Returns one that TryTake reserved.
  void Give() noexcept { held_.fetch_sub(1, std::memory_order_relaxed); }
  // The share now (changes with the limit).
  int limit() const { return limit_.load(std::memory_order_relaxed); }
  int held() const { return held_.load(std::memory_order_relaxed); }
  // Reservations refused since Configure.
  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }
  // "" or, once something was refused, what inprof held back, e.g. "held
  // back 9 times at 3 descriptors under RLIMIT_NOFILE=16: ...".
  std::string Describe() const;

 private:
  void Recount(uint64_t soft_limit);
  // What bounds the share now: "under RLIMIT_NOFILE=N" or the cap's name.
  std::string Bound() const;

  int64_t numerator_ = 0;
  int64_t denominator_ = 1;
  int cap_ = 0;
  const char* what_ = "";
  const char* fallback_ = "";
  const char* cap_name_ = nullptr;
  std::atomic<bool> capped_{false};  // the cap, not the share, bounds it
  std::mutex recount_mutex_;
  std::atomic<uint64_t> soft_limit_{0};
  std::atomic<int> limit_{0};
  std::atomic<int> held_{0};
  std::atomic<uint64_t> refused_{0};
  std::atomic<bool> said_{false};
};

}  // namespace inprof::internal

#endif  // INPROF_BASE_OWNED_FD_H_
