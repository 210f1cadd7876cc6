// internal: not part of the public API.
//
// What the registry captures about the calling thread when it registers.
#ifndef INPROF_INTERNAL_THREAD_INFO_H_
#define INPROF_INTERNAL_THREAD_INFO_H_

#include <sys/types.h>
#include <time.h>

#include "absl/status/statusor.h"
#include "inprof/unwinder.h"

namespace inprof::internal {

class OwnedFd;  // owned_fd.h (Linux)

struct CurrentThreadInfo {
  pid_t tid = 0;
  StackBounds stack;       // from pthread_getattr_np
  clockid_t cpu_clock = 0; // pthread_getcpuclockid: readable from any thread
};

// Describes the calling thread. Allocates (reads /proc for the main thread);
// never call it from a signal handler.
absl::StatusOr<CurrentThreadInfo> DescribeCurrentThread();

// The calling thread's stack bounds, found once per thread (by
// pthread_getattr_np, which allocates and takes the thread's own lock:
// never call it from code that pthread_getattr_np may have called, such
// as an allocation made inside libc, where it deadlocked) and kept in
// initial-exec TLS for the thread's life. False when they cannot be found,
// and (without looking, until a later call) on a signal's alternate stack.
// For threads that never registered: a registered thread's slot has its
// own.
bool CachedCurrentThreadStack(StackBounds* out) noexcept;
// The bounds CachedCurrentThreadStack found on this thread; false when it
// has not looked yet or found none. Never looks: safe anywhere but a
// signal handler.
bool KnownCurrentThreadStack(StackBounds* out) noexcept;

// The calling thread's kernel thread id. Async-signal-safe.
pid_t CurrentTid() noexcept;

// The kernel's scheduling state of thread `tid` of this process: field 3 of
// /proc/self/task/TID/stat ('R' running or runnable, 'S' sleeping, 'D'
// uninterruptible, 'T'/'t' stopped, ...), or 0 if it cannot be read (the
// thread is gone). Allocates nothing but opens a file: not for handlers.
char ThreadState(pid_t tid) noexcept;

// Where a blocked thread waits, from /proc/self/task/TID/syscall: the
// system call's number and the user stack pointer and pc it was made from.
// A thread that re-enters the same wait from the same place reads the same.
struct SyscallSite {
  int64_t nr = -2;  // -2: unknown (unreadable, or the thread is running)
  uint64_t sp = 0, pc = 0;
  bool known() const { return nr != -2; }
  bool operator==(const SyscallSite&) const = default;
};
SyscallSite ThreadSyscallSite(pid_t tid) noexcept;

// Whether thread `tid` runs and, when it does not, where it waits, in one
// read of /proc/self/task/TID/syscall: the kernel writes "running" for a
// task in TASK_RUNNING (running or runnable: what 'R' in .../stat means)
// and the system call's site otherwise. The wall sampler used to read
// .../stat and then .../syscall for a blocked thread, ~10 us of CPU each
// on a 2-core VM. `state` is 'R', 'S' (not running: sleeping, in
// I/O, stopped; `site` says where) or 0 (the thread is gone). The calling
// thread is always 'R'. Where .../syscall cannot be read (a kernel without
// it), the state comes from .../stat and the site is unknown.
struct ThreadLook {
  char state = 0;
  SyscallSite site;
};
ThreadLook LookAtThread(pid_t tid) noexcept;
// The same through a descriptor of the thread's .../syscall kept between
// looks: each pread() at offset 0 makes the kernel write it afresh, ~2.4 us
// of CPU on a 2-core VM against ~9 us for open, read and close (the
// path walk through /proc/self is most of it). When `*kept` is empty and
// `keep` is true, the file this look opens stays open there for the next
// (the caller closes it); a kept file that cannot be read any more is a
// thread that is gone (state 0). A kept file the program closed (its number
// maybe reused) is never read: it is forgotten, and this look opens the
// file afresh.
ThreadLook LookAtThread(pid_t tid, OwnedFd* kept, bool keep) noexcept;

// Copies `bytes` of this process's memory at `address` (another thread's
// stack) into `out` with process_vm_readv: an address that is not mapped
// any more fails with EFAULT instead of faulting. Returns 0, or the errno
// (EPERM or ENOSYS where a sandbox forbids the call). `pid` is getpid().
int CopyOwnMemory(pid_t pid, uintptr_t address, size_t bytes, void* out) noexcept;

// The registers a signal's handler reads to tell, later, whether it will
// return into a system call: the context's pc and the register that holds
// a call's number (x86-64: rax; arm64: x8). Reads `ucontext` only, no
// memory it points at: async-signal-safe.
void SyscallRegisters(const void* ucontext, uint64_t* pc, int64_t* nr) noexcept;

// The system call a thread whose handler had those registers returned
// into: `nr` when the instruction at `pc` is a system call (`syscall`,
// `svc #0`), else -1. A thread blocked in a call that the kernel restarts
// after a handler (SA_RESTART, as inprof's are installed) is handed to it
// so: the pc moved back onto the instruction and the number restored. A
// thread running user code right at such an instruction reads the same; it
// is about to make the call. The instruction is read with CopyOwnMemory
// (never a fault, even on execute-only code); not for handlers.
int64_t SyscallAt(pid_t pid, uint64_t pc, int64_t nr) noexcept;

// The name of system call `nr` on this machine's architecture for the
// calls threads wait in ("futex", "epoll_wait", "read"), else "syscall N".
std::string SyscallName(int64_t nr);

// Thread CPU time of `clock` in nanoseconds, or -1 if the thread is gone.
// Async-signal-safe.
int64_t ThreadCpuNanos(clockid_t clock) noexcept;

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_THREAD_INFO_H_
