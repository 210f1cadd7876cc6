#include "inprof/internal/thread_info.h"

#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <ucontext.h>
#include <unistd.h>

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "inprof/base/owned_fd.h"

namespace inprof::internal {

absl::StatusOr<CurrentThreadInfo> DescribeCurrentThread() {
  CurrentThreadInfo info;
  info.tid = static_cast<pid_t>(syscall(SYS_gettid));
  pthread_attr_t attr;
  int rc = pthread_getattr_np(pthread_self(), &attr);
  if (rc != 0) {
    return absl::InternalError(
        absl::StrCat("pthread_getattr_np failed: ", strerror(rc)));
  }
  void* addr = nullptr;
  size_t size = 0;
  rc = pthread_attr_getstack(&attr, &addr, &size);
  pthread_attr_destroy(&attr);
  if (rc != 0 || addr == nullptr || size == 0) {
    return absl::InternalError("pthread_attr_getstack gave no stack bounds");
  }
  info.stack.lo = reinterpret_cast<uintptr_t>(addr);
  info.stack.hi = info.stack.lo + size;
  rc = pthread_getcpuclockid(pthread_self(), &info.cpu_clock);
  if (rc != 0) {
    return absl::InternalError(
        absl::StrCat("pthread_getcpuclockid failed: ", strerror(rc)));
  }
  return info;
}

namespace {
// 0, 0: not looked up yet; 1, 1: looked up and not found.
__thread uintptr_t t_stack_lo __attribute__((tls_model("initial-exec")));
__thread uintptr_t t_stack_hi __attribute__((tls_model("initial-exec")));
}  // namespace

bool CachedCurrentThreadStack(StackBounds* out) noexcept {
  if (t_stack_hi == 0) {
    // Not from a signal's alternate stack: the lookup itself needs room
    // (the main thread's reads /proc/self/maps with stdio), which a small
    // one lacks. Asked again at the thread's next call.
    stack_t alternate;
    if (sigaltstack(nullptr, &alternate) == 0 && (alternate.ss_flags & SS_ONSTACK) != 0) {
      return false;
    }
    t_stack_lo = t_stack_hi = 1;
    pthread_attr_t attr;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
      void* addr = nullptr;
      size_t size = 0;
      if (pthread_attr_getstack(&attr, &addr, &size) == 0 && addr != nullptr && size != 0) {
        t_stack_lo = reinterpret_cast<uintptr_t>(addr);
        t_stack_hi = t_stack_lo + size;
      }
      pthread_attr_destroy(&attr);
    }
  }
  if (t_stack_hi <= t_stack_lo) return false;
  out->lo = t_stack_lo;
  out->hi = t_stack_hi;
  return true;
}

bool KnownCurrentThreadStack(StackBounds* out) noexcept {
  if (t_stack_hi <= t_stack_lo) return false;
  out->lo = t_stack_lo;
  out->hi = t_stack_hi;
  return true;
}

int CopyOwnMemory(pid_t pid, uintptr_t address, size_t bytes, void* out) noexcept {
  iovec local{out, bytes};
  iovec remote{reinterpret_cast<void*>(address), bytes};
  const ssize_t n = process_vm_readv(pid, &local, 1, &remote, 1, 0);
  if (n == static_cast<ssize_t>(bytes)) return 0;
  return n < 0 ? errno : EFAULT;  // a partial copy: the rest is not mapped
}

pid_t CurrentTid() noexcept { return static_cast<pid_t>(syscall(SYS_gettid)); }

char ThreadState(pid_t tid) noexcept {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/self/task/%d/stat",
                static_cast<int>(tid));
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  // "TID (comm) S ...": comm may hold spaces and parentheses, so the state
  // follows the last ')'. The first 128 bytes always include it (comm is at
  // most 16 bytes).
  char buf[128];
  const ssize_t n = read(fd, buf, sizeof(buf));
  close(fd);
  if (n <= 0) return 0;
  for (ssize_t i = n - 1; i >= 0; --i) {
    if (buf[i] == ')') return i + 2 < n ? buf[i + 2] : 0;
  }
  return 0;
}

namespace {

// "NR ARG1 ... ARG6 SP PC" (hex after NR), "-1 SP PC" when blocked outside a
// system call, "running" otherwise: the first `n` bytes of `buf`, which has
// room for a terminating NUL after them.
ThreadLook ParseSyscallFile(char* buf, ssize_t n) noexcept {
  ThreadLook look;
  if (n <= 0) return look;
  buf[n] = '\0';
  if (std::strncmp(buf, "running", 7) == 0) {
    look.state = 'R';
    return look;
  }
  if (buf[0] != '-' && (buf[0] < '0' || buf[0] > '9')) return look;
  look.state = 'S';
  unsigned long long words[9] = {};
  long long nr = 0;
  int count = 0;
  if (buf[0] == '-') {
    count = std::sscanf(buf, "%lld %llx %llx", &nr, &words[6], &words[7]);
    if (count != 3) return look;
  } else {
    count = std::sscanf(buf, "%lld %llx %llx %llx %llx %llx %llx %llx %llx",
                        &nr, &words[0], &words[1], &words[2], &words[3],
                        &words[4], &words[5], &words[6], &words[7]);
    if (count != 9) return look;
  }
  look.site.nr = nr;
  look.site.sp = words[6];
  look.site.pc = words[7];
  return look;
}

// One read of /proc/self/task/TID/syscall. `opened` is false when the file
// could not be opened (the thread is gone, or the kernel lacks the file).
// With `kept`, the descriptor is left open there instead of closed.
ThreadLook ReadSyscallFile(pid_t tid, bool& opened, OwnedFd* kept = nullptr) noexcept {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/self/task/%d/syscall",
                static_cast<int>(tid));
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  opened = fd >= 0;
  if (fd < 0) return ThreadLook();
  char buf[256];
  const ssize_t n = read(fd, buf, sizeof(buf) - 1);
  if (kept != nullptr && n > 0) {
    *kept = OwnedFd::Adopt(fd);
  } else {
    close(fd);
  }
  return ParseSyscallFile(buf, n);
}

}  // namespace

SyscallSite ThreadSyscallSite(pid_t tid) noexcept {
  bool opened = false;
  return ReadSyscallFile(tid, opened).site;
}

ThreadLook LookAtThread(pid_t tid, OwnedFd* kept, bool keep) noexcept {
  ThreadLook look;
  // The calling thread's own file would name the read() that reads it.
  // (Its id cached: gettid is a system call, and the ticker looks often.)
  static thread_local const pid_t self = CurrentTid();
  if (tid == self) {
    look.state = 'R';
    return look;
  }
  if (kept != nullptr && kept->valid()) {
    // Read only if the number still is the file inprof opened (else it is
    // forgotten, and the file opened afresh below).
    if (const int fd = kept->Verified(); fd >= 0) {
      char buf[256];
      const ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
      // ESRCH once the thread has exited: gone, like a file that cannot be
      // opened.
      return n > 0 ? ParseSyscallFile(buf, n) : ThreadLook();
    }
  }
  bool opened = false;
  look = ReadSyscallFile(tid, opened, kept != nullptr && keep ? kept : nullptr);
  if (look.state == 0 && !opened) {
    // No .../syscall here, or the thread is gone: .../stat tells which.
    const char state = ThreadState(tid);
    look.state = state == 0 ? 0 : (state == 'R' ? 'R' : 'S');
  }
  return look;
}

ThreadLook LookAtThread(pid_t tid) noexcept {
  return LookAtThread(tid, nullptr, false);
}

int64_t ThreadCpuNanos(clockid_t clock) noexcept {
  struct timespec ts;
  if (clock_gettime(clock, &ts) != 0) return -1;
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

void SyscallRegisters(const void* ucontext, uint64_t* pc, int64_t* nr) noexcept {
  *pc = 0;
  *nr = -1;
  if (ucontext == nullptr) return;
  const auto* uc = static_cast<const ucontext_t*>(ucontext);
#if defined(__x86_64__)
  *pc = static_cast<uint64_t>(uc->uc_mcontext.gregs[REG_RIP]);
  *nr = uc->uc_mcontext.gregs[REG_RAX];
#elif defined(__aarch64__)
  *pc = uc->uc_mcontext.pc;
  *nr = static_cast<int64_t>(uc->uc_mcontext.regs[8]);
#else
  (void)uc;
#endif
}

int64_t SyscallAt(pid_t pid, uint64_t pc, int64_t nr) noexcept {
  if (pc == 0 || nr < 0 || nr >= 4096) return -1;
#if defined(__x86_64__)
  unsigned char insn[2];
  if (CopyOwnMemory(pid, pc, sizeof(insn), insn) != 0) return -1;
  return insn[0] == 0x0f && insn[1] == 0x05 ? nr : -1;  // syscall
#elif defined(__aarch64__)
  uint32_t insn = 0;
  if (CopyOwnMemory(pid, pc, sizeof(insn), &insn) != 0) return -1;
  return insn == 0xd4000001u ? nr : -1;  // svc #0
#else
  (void)pid;
  return -1;
#endif
}

std::string SyscallName(int64_t nr) {
  // The calls a thread waits in, by the numbers of this architecture.
  static constexpr struct {
    long nr;
    const char* name;
  } kNames[] = {
#define INPROF_SYSCALL(name) {SYS_##name, #name},
#ifdef SYS_futex
      INPROF_SYSCALL(futex)
#endif
#ifdef SYS_read
      INPROF_SYSCALL(read)
#endif
#ifdef SYS_write
      INPROF_SYSCALL(write)
#endif
#ifdef SYS_readv
      INPROF_SYSCALL(readv)
#endif
#ifdef SYS_writev
      INPROF_SYSCALL(writev)
#endif
#ifdef SYS_pread64
      INPROF_SYSCALL(pread64)
#endif
#ifdef SYS_poll
      INPROF_SYSCALL(poll)
#endif
#ifdef SYS_ppoll
      INPROF_SYSCALL(ppoll)
#endif
#ifdef SYS_select
      INPROF_SYSCALL(select)
#endif
#ifdef SYS_pselect6
      INPROF_SYSCALL(pselect6)
#endif
#ifdef SYS_epoll_wait
      INPROF_SYSCALL(epoll_wait)
#endif
#ifdef SYS_epoll_pwait
      INPROF_SYSCALL(epoll_pwait)
#endif
#ifdef SYS_epoll_pwait2
      INPROF_SYSCALL(epoll_pwait2)
#endif
#ifdef SYS_nanosleep
      INPROF_SYSCALL(nanosleep)
#endif
#ifdef SYS_clock_nanosleep
      INPROF_SYSCALL(clock_nanosleep)
#endif
#ifdef SYS_accept
      INPROF_SYSCALL(accept)
#endif
#ifdef SYS_accept4
      INPROF_SYSCALL(accept4)
#endif
#ifdef SYS_connect
      INPROF_SYSCALL(connect)
#endif
#ifdef SYS_recvfrom
      INPROF_SYSCALL(recvfrom)
#endif
#ifdef SYS_recvmsg
      INPROF_SYSCALL(recvmsg)
#endif
#ifdef SYS_recvmmsg
      INPROF_SYSCALL(recvmmsg)
#endif
#ifdef SYS_sendto
      INPROF_SYSCALL(sendto)
#endif
#ifdef SYS_sendmsg
      INPROF_SYSCALL(sendmsg)
#endif
#ifdef SYS_wait4
      INPROF_SYSCALL(wait4)
#endif
#ifdef SYS_waitid
      INPROF_SYSCALL(waitid)
#endif
#ifdef SYS_pause
      INPROF_SYSCALL(pause)
#endif
#ifdef SYS_rt_sigsuspend
      INPROF_SYSCALL(rt_sigsuspend)
#endif
#ifdef SYS_rt_sigtimedwait
      INPROF_SYSCALL(rt_sigtimedwait)
#endif
#ifdef SYS_io_getevents
      INPROF_SYSCALL(io_getevents)
#endif
#ifdef SYS_io_uring_enter
      INPROF_SYSCALL(io_uring_enter)
#endif
#ifdef SYS_flock
      INPROF_SYSCALL(flock)
#endif
#ifdef SYS_fcntl
      INPROF_SYSCALL(fcntl)
#endif
#ifdef SYS_fsync
      INPROF_SYSCALL(fsync)
#endif
#ifdef SYS_fdatasync
      INPROF_SYSCALL(fdatasync)
#endif
#ifdef SYS_msgrcv
      INPROF_SYSCALL(msgrcv)
#endif
#ifdef SYS_semop
      INPROF_SYSCALL(semop)
#endif
#ifdef SYS_sched_yield
      INPROF_SYSCALL(sched_yield)
#endif
#undef INPROF_SYSCALL
  };
  for (const auto& entry : kNames) {
    if (entry.nr == nr) return entry.name;
  }
  return "syscall " + std::to_string(nr);
}

}  // namespace inprof::internal
