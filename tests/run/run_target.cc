// An unmodified program for tests/run/run_test.cc: it knows nothing of
// inprof (no include, no link) and is profiled only by `inprof run`.
//
//   run_target threads OUT      main + 3 threads named after they start
//                               (pthread_setname_np on itself and on
//                               another thread, prctl); writes each
//                               thread's CPU to OUT ("name ns" lines)
//   run_target renames N        N threads, each named by main right after
//                               pthread_create returns (as it registers),
//                               each asleep 500 ms
//   run_target end HOW PIDFILE  spins, then: return (3), exit (4), wait (for
//                               a signal, default action), handler (its own
//                               SIGTERM handler; exits 5), quick_exit (6),
//                               _exit (7), _Exit (8), handler-_exit (its
//                               SIGTERM handler calls _exit(9)), segv (dies
//                               of SIGSEGV), abort
//   run_target fork-_exit       a forked child that works and ends with
//                               _exit(0)
//   run_target term-child       a forked child that waits is sent SIGTERM;
//                               exits 0 when the child died of it
//   run_target children         a forked child and a fork+exec'd child
//   run_target prefork N        a pre-fork server: N children forked at
//                               once, each spins 200 ms and exits 0
//   run_target exec-self N      spins 20 ms and exec()s itself N times
//   run_target sigprof          installs its own SIGPROF handler midway
//   run_target churn N ROUNDS DIR   short threads, N at a time: VmRSS once
//                               the profiler is steady (windows in DIR), and
//                               after ROUNDS x N more threads
//   run_target spin MS          spins MS ms of CPU
//   run_target spin-windows MS N DIR   spins at least MS ms of CPU and until
//                               DIR holds N profiles; prints "spun_ns=NS"
//   run_target sigwait          a server that blocks every signal and waits
//                               for them: main in sigwait (SIGALRM after
//                               2 s), a thread in sigtimedwait (500 ms), a
//                               thread spinning 300 ms; prints what the
//                               waits returned
//   run_target alloc N M        on a thread it creates: N mallocs of 64 KiB
//                               at RunAllocFreedSite, freed, and M of 4 KiB
//                               at RunAllocLiveSite, still allocated at exit
//   run_target locks N          N rounds: main holds a mutex, a thread it
//                               creates waits for it at RunLockWaitSite, and
//                               main lets go 2 ms after that thread waits in
//                               the kernel (N waits, each over 2 ms)
//   run_target block-sigprof    blocks SIGPROF alone, spins 100 ms, unblocks
//   run_target fill-fds         spins 100 ms, then opens /dev/null until
//                               EMFILE and exits holding every descriptor;
//                               prints "filled=N"
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

int64_t ThreadCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1'000'000'000LL + ts.tv_nsec;
}

volatile uint64_t sink;

// Burns `ms` of this thread's CPU; returns what it burned. `salt` keeps the
// work functions distinct (identical bodies would be folded into one).
__attribute__((noinline)) int64_t Burn(int64_t ms, uint64_t salt) {
  const int64_t start = ThreadCpuNs();
  uint64_t x = 88172645463325252ULL ^ salt;
  while (ThreadCpuNs() - start < ms * 1'000'000) {
    for (int i = 0; i < 2000; ++i) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
    }
  }
  sink = x;
  return ThreadCpuNs() - start;
}

#define WORK_FUNCTION(name, salt)                                   \
  __attribute__((noipa)) int64_t name(int64_t ms) {                 \
    int64_t used = Burn(ms, salt);                                  \
    asm volatile("" ::: "memory");                                  \
    return used;                                                    \
  }
WORK_FUNCTION(MainWork, 1)
WORK_FUNCTION(WorkA, 2)
WORK_FUNCTION(WorkB, 3)
WORK_FUNCTION(WorkC, 4)
WORK_FUNCTION(EndWork, 5)
WORK_FUNCTION(ParentWork, 6)
WORK_FUNCTION(ForkChildWork, 7)
WORK_FUNCTION(ExecChildWork, 8)
WORK_FUNCTION(BeforeExecWork, 9)
WORK_FUNCTION(BeforeOwnProfiler, 10)
WORK_FUNCTION(UnderOwnProfiler, 11)
WORK_FUNCTION(SpinWork, 12)
WORK_FUNCTION(ChurnWork, 13)
WORK_FUNCTION(SigwaitServerWork, 14)
WORK_FUNCTION(BlockedMainWork, 15)

std::atomic<bool> b_named{false};
int64_t cpu_a = 0, cpu_b = 0, cpu_c = 0;

void* ThreadA(void*) {
  pthread_setname_np(pthread_self(), "worker-a");
  cpu_a = WorkA(300);
  return nullptr;
}

void* ThreadB(void*) {
  while (!b_named.load()) usleep(100);
  cpu_b = WorkB(500);
  return nullptr;
}

void* ThreadC(void*) {
  prctl(PR_SET_NAME, "worker-c", 0, 0, 0);
  cpu_c = WorkC(200);
  pthread_exit(nullptr);
}

int Threads(const char* out) {
  pthread_t a, b, c;
  pthread_create(&a, nullptr, &ThreadA, nullptr);
  pthread_create(&b, nullptr, &ThreadB, nullptr);
  pthread_setname_np(b, "worker-b");  // another thread's name
  b_named = true;
  pthread_create(&c, nullptr, &ThreadC, nullptr);
  const int64_t cpu_main = MainWork(300);
  pthread_join(a, nullptr);
  pthread_join(b, nullptr);
  pthread_join(c, nullptr);
  FILE* f = fopen(out, "w");
  if (f == nullptr) return 1;
  fprintf(f, "run_target %lld\nworker-a %lld\nworker-b %lld\nworker-c %lld\n",
          static_cast<long long>(cpu_main), static_cast<long long>(cpu_a),
          static_cast<long long>(cpu_b), static_cast<long long>(cpu_c));
  fclose(f);
  return 0;
}

void* Asleep(void*) {
  usleep(500'000);
  return nullptr;
}

// Main names each thread while the thread may still be registering: a
// few microseconds' spin, different for each, spreads the renames across
// the registration's window.
int Renames(int n) {
  std::vector<pthread_t> threads(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    if (pthread_create(&threads[i], nullptr, &Asleep, nullptr) != 0) return 1;
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(i % 16 * 3);
    while (std::chrono::steady_clock::now() < until) {
    }
    char name[16];
    std::snprintf(name, sizeof(name), "rn-%d", i);
    pthread_setname_np(threads[i], name);
  }
  for (pthread_t t : threads) pthread_join(t, nullptr);
  return 0;
}

volatile sig_atomic_t term_seen = 0;
void OnTerm(int) { term_seen = 1; }
void ExitOnTerm(int) { _exit(9); }

int End(const std::string& how, const char* pidfile) {
  EndWork(200);
  if (how == "handler" || how == "handler-_exit") {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof(sa));
    sa.sa_handler = how == "handler" ? &OnTerm : &ExitOnTerm;
    sigaction(SIGTERM, &sa, nullptr);
  }
  if (FILE* f = fopen(pidfile, "w"); f != nullptr) {
    fprintf(f, "%d\n", getpid());
    fclose(f);
  }
  if (how == "return") return 3;
  if (how == "exit") exit(4);
  if (how == "quick_exit") quick_exit(6);
  if (how == "_exit") _exit(7);
  if (how == "_Exit") _Exit(8);
  if (how == "segv") {
    signal(SIGSEGV, SIG_DFL);
    raise(SIGSEGV);
  }
  if (how == "abort") abort();
  if (how == "handler") {
    while (!term_seen) pause();
    exit(5);
  }
  while (true) pause();  // "wait": the signal's default action ends it
}

int ForkUnderscoreExit() {
  ParentWork(100);
  const pid_t pid = fork();
  if (pid == 0) {
    ForkChildWork(150);
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 10;
}

int TermChild() {
  alarm(20);  // a hang reads as SIGALRM
  ParentWork(50);
  int ready[2];
  if (pipe(ready) != 0) return 12;
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(10);  // not inherited: the child's own bound
    ForkChildWork(50);
    char b = 1;
    if (write(ready[1], &b, 1) != 1) _exit(13);
    while (true) pause();
  }
  char b = 0;
  if (read(ready[0], &b, 1) != 1) return 14;
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGTERM) return 11;
  ParentWork(50);  // still here
  return 0;
}

int Children(const char* self) {
  ParentWork(100);
  pid_t pid = fork();
  if (pid == 0) {
    ForkChildWork(150);
    exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return 10;
  pid = fork();
  if (pid == 0) {
    execl(self, self, "execd", static_cast<char*>(nullptr));
    _exit(127);
  }
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return 11;
  return 0;
}

int Prefork(int n) {
  alarm(60);  // a hang reads as SIGALRM
  ParentWork(20);
  std::vector<pid_t> children;
  for (int i = 0; i < n; ++i) {
    const pid_t pid = fork();
    if (pid < 0) return 15;
    if (pid == 0) {
      ForkChildWork(200);
      exit(0);
    }
    children.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    failed += !WIFEXITED(status) || WEXITSTATUS(status) != 0;
  }
  return failed == 0 ? 0 : 16;
}

int ExecSelf(const char* self, int n) {
  BeforeExecWork(20);
  if (n <= 0) {
    ExecChildWork(50);
    return 0;
  }
  const std::string next = std::to_string(n - 1);
  char* const args[] = {const_cast<char*>(self), const_cast<char*>("exec-self"),
                        const_cast<char*>(next.c_str()), nullptr};
  execv(self, args);
  return 12;
}

std::atomic<int> own_signals{0};
void OwnSigprof(int) { own_signals.fetch_add(1); }

int OwnProfiler() {
  BeforeOwnProfiler(200);
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = &OwnSigprof;
  sa.sa_flags = SA_RESTART;
  sigaction(SIGPROF, &sa, nullptr);
  itimerval it = {{0, 10000}, {0, 10000}};
  setitimer(ITIMER_PROF, &it, nullptr);
  UnderOwnProfiler(200);
  itimerval off = {};
  setitimer(ITIMER_PROF, &off, nullptr);
  printf("own_sigprof=%d\n", own_signals.load());
  return 0;
}

long RssKb() {
  FILE* f = fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  long kb = -1;
  while (fgets(line, sizeof(line), f) != nullptr) {
    if (std::strncmp(line, "VmRSS:", 6) == 0) kb = std::atol(line + 6);
  }
  fclose(f);
  return kb;
}

void* ChurnThread(void*) {
  ChurnWork(0);  // one pass of the loop: microseconds
  return nullptr;
}

// Profile files in `dir`.
int CountFiles(const char* dir) {
  DIR* d = opendir(dir);
  if (d == nullptr) return 0;
  int n = 0;
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

// Spins at least `ms` of CPU and until `dir` holds `files` profiles (60 s
// of wall time at most, a hang check); returns the CPU it burned.
__attribute__((noipa)) int64_t SpinWindowsWork(int64_t ms, int files, const char* dir) {
  int64_t used = 0;
  timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    const bool late = now.tv_sec - t0.tv_sec > 60;
    if (used >= ms * 1'000'000 && (late || CountFiles(dir) >= files)) break;
    used += Burn(10, 16);
  }
  asm volatile("" ::: "memory");
  return used;
}

void* SpinThread(void*) {
  SpinWork(50);
  return nullptr;
}

// RSS swings by up to 1.5 MiB from one round to the next (each window's
// aggregate and encoding are allocated and freed; malloc returns memory to
// the system at its own pace), so each reading is the lowest of four
// rounds': what stays allocated. The first waits for the profiler's steady
// state: 50 ms of CPU on a thread started like the churning ones (its
// samples walk every module theirs do, so the unwinder's tables that are
// built when a walk first needs them, the preload library's ~5 MiB among
// them, exist), then two more windows written to `dir` (that CPU's window
// exported). Single readings after a count of threads (2,000) or a time
// (300 ms) differed by up to 9 MiB without a leak, one run in three.
int Churn(int n, int rounds, const char* dir) {
  constexpr int kReadings = 4;
  pthread_t spinner;
  if (pthread_create(&spinner, nullptr, &SpinThread, nullptr) != 0) return 13;
  pthread_join(spinner, nullptr);
  const int windows_before = CountFiles(dir);
  bool steady = false;
  long first = -1, last = -1;
  for (int r = 0; !steady || r < rounds; ++r) {
    for (int i = 0; i < n; ++i) {
      pthread_t t;
      if (pthread_create(&t, nullptr, &ChurnThread, nullptr) != 0) return 13;
      pthread_join(t, nullptr);
    }
    if (!steady) {
      if (CountFiles(dir) >= windows_before + 2) {
        steady = true;
        r = -1;  // ROUNDS more from here
      }
      continue;
    }
    const long rss = RssKb();
    if (r < kReadings && (first < 0 || rss < first)) first = rss;
    if (r >= rounds - kReadings && (last < 0 || rss < last)) last = rss;
  }
  printf("rss_first_kb=%ld rss_last_kb=%ld\n", first, last);
  return 0;
}

void* SigwaitSpinner(void*) {
  SigwaitServerWork(300);
  return nullptr;
}

// sigtimedwait for every signal for 500 ms; returns the signal it got, or 0
// for the timeout. A handler that runs meanwhile (inprof's) may end a wait
// with EINTR, as POSIX allows: the wait goes on until the deadline.
void* TimedWaiter(void* out) {
  sigset_t all;
  sigfillset(&all);
  timespec deadline;
  clock_gettime(CLOCK_MONOTONIC, &deadline);
  deadline.tv_nsec += 500'000'000;
  if (deadline.tv_nsec >= 1'000'000'000) {
    deadline.tv_sec += 1;
    deadline.tv_nsec -= 1'000'000'000;
  }
  int got = 0;
  for (;;) {
    timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    int64_t left = (deadline.tv_sec - now.tv_sec) * 1'000'000'000LL +
                   (deadline.tv_nsec - now.tv_nsec);
    if (left <= 0) break;
    const timespec wait = {static_cast<time_t>(left / 1'000'000'000),
                           static_cast<long>(left % 1'000'000'000)};
    siginfo_t info;
    const int sig = sigtimedwait(&all, &info, &wait);
    if (sig > 0) {
      got = sig;
      break;
    }
    if (errno != EINTR) break;  // EAGAIN: the timeout
  }
  *static_cast<int*>(out) = got;
  return nullptr;
}

int SigwaitServer() {
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);
  pthread_t spinner, waiter;
  int timed = -1;
  if (pthread_create(&spinner, nullptr, &SigwaitSpinner, nullptr) != 0) return 13;
  if (pthread_create(&waiter, nullptr, &TimedWaiter, &timed) != 0) return 13;
  BlockedMainWork(50);  // its CPU timer fires while every signal is blocked
  alarm(2);
  int sig = 0;
  sigwait(&all, &sig);
  pthread_join(spinner, nullptr);
  pthread_join(waiter, nullptr);
  printf("sigwait=%d sigtimedwait=%s\n", sig,
         timed == 0 ? "timeout" : std::to_string(timed).c_str());
  return sig == SIGALRM && timed == 0 ? 0 : 1;
}

// The allocation sites: noinline, and what each returns is kept, so that
// the call to malloc stays and the site's frame is the stack's leaf.
__attribute__((noinline)) void* RunAllocFreedSite() {
  void* p = std::malloc(64 * 1024);
  asm volatile("" : : "r"(p) : "memory");
  return p;
}
__attribute__((noinline)) void* RunAllocLiveSite() {
  void* p = std::malloc(4096);
  asm volatile("" : : "r"(p) : "memory");
  return p;
}

struct AllocCounts {
  int freed;
  int live;
};

void* AllocThread(void* arg) {
  const auto* counts = static_cast<const AllocCounts*>(arg);
  for (int i = 0; i < counts->freed; ++i) std::free(RunAllocFreedSite());
  for (int i = 0; i < counts->live; ++i) (void)RunAllocLiveSite();  // kept to the end
  return nullptr;
}

int Alloc(int freed, int live) {
  AllocCounts counts{freed, live};
  pthread_t thread;
  if (pthread_create(&thread, nullptr, &AllocThread, &counts) != 0) return 13;
  pthread_join(thread, nullptr);
  return 0;
}

pthread_mutex_t g_run_lock = PTHREAD_MUTEX_INITIALIZER;

__attribute__((noinline)) void RunLockWaitSite() {
  pthread_mutex_lock(&g_run_lock);
  asm volatile("" ::: "memory");
}

void* LockWaiter(void*) {
  RunLockWaitSite();
  pthread_mutex_unlock(&g_run_lock);
  return nullptr;
}

int Locks(int rounds) {
  for (int i = 0; i < rounds; ++i) {
    pthread_mutex_lock(&g_run_lock);
    pthread_t thread;
    if (pthread_create(&thread, nullptr, &LockWaiter, nullptr) != 0) return 13;
    // glibc's mutex word is 2 once a thread waits for it in the kernel.
    while (__atomic_load_n(&g_run_lock.__data.__lock, __ATOMIC_ACQUIRE) != 2) sched_yield();
    timespec hold = {0, 2'000'000};
    nanosleep(&hold, nullptr);
    pthread_mutex_unlock(&g_run_lock);
    pthread_join(thread, nullptr);
  }
  return 0;
}

int BlockSigprof() {
  sigset_t prof;
  sigemptyset(&prof);
  sigaddset(&prof, SIGPROF);
  pthread_sigmask(SIG_BLOCK, &prof, nullptr);
  SpinWork(100);
  pthread_sigmask(SIG_UNBLOCK, &prof, nullptr);
  return 0;
}

int FillFds() {
  SpinWork(100);
  int filled = 0;
  while (open("/dev/null", O_RDONLY) >= 0) ++filled;
  if (errno != EMFILE) return 1;
  printf("filled=%d\n", filled);
  fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const std::string mode = argv[1];
  if (mode == "threads" && argc == 3) return Threads(argv[2]);
  if (mode == "renames" && argc == 3) return Renames(std::atoi(argv[2]));
  if (mode == "end" && argc == 4) return End(argv[2], argv[3]);
  if (mode == "children") return Children(argv[0]);
  if (mode == "prefork" && argc == 3) return Prefork(std::atoi(argv[2]));
  if (mode == "fork-_exit") return ForkUnderscoreExit();
  if (mode == "term-child") return TermChild();
  if (mode == "execd") {
    ExecChildWork(150);
    return 0;
  }
  if (mode == "exec-self" && argc == 3) return ExecSelf(argv[0], std::atoi(argv[2]));
  if (mode == "sigprof") return OwnProfiler();
  if (mode == "churn" && argc == 5) {
    return Churn(std::atoi(argv[2]), std::atoi(argv[3]), argv[4]);
  }
  if (mode == "sigwait") return SigwaitServer();
  if (mode == "block-sigprof") return BlockSigprof();
  if (mode == "fill-fds") return FillFds();
  if (mode == "alloc" && argc == 4) return Alloc(std::atoi(argv[2]), std::atoi(argv[3]));
  if (mode == "locks" && argc == 3) return Locks(std::atoi(argv[2]));
  if (mode == "spin" && argc == 3) {
    SpinWork(std::atoi(argv[2]));
    return 0;
  }
  if (mode == "spin-windows" && argc == 5) {
    const int64_t spun = SpinWindowsWork(std::atoi(argv[2]), std::atoi(argv[3]), argv[4]);
    printf("spun_ns=%lld\n", static_cast<long long>(spun));
    return 0;
  }
  return 2;
}
