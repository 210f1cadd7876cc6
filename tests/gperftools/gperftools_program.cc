// A program written against gperftools' CPU profiler API, built twice by
// tests/meson.build: with inprof's drop-in (inprof-gperftools) and, where
// gperftools is installed, with the real -lprofiler (then run with
// libinprof_preload.so preloaded). tests/gperftools/gperftools_test.cc runs
// it.
//
//   gperftools_program api FILE   ProfilerStart(FILE); two threads and main
//                                 work; ProfilerStop; then more work that
//                                 must not be in FILE. Prints the states.
//   gperftools_program env        works 300 ms, no API call (CPUPROFILE)
//   gperftools_program signal     raises CPUPROFILESIGNAL's signal around
//                                 200 ms of work, then works unprofiled
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <gperftools/profiler.h>

namespace {

int64_t ThreadCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1'000'000'000LL + ts.tv_nsec;
}

volatile uint64_t sink;

__attribute__((noinline)) void Burn(int64_t ms, uint64_t salt) {
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
}

#define WORK(name, salt)                                     \
  __attribute__((noipa)) void name(int64_t ms) {             \
    Burn(ms, salt);                                          \
    asm volatile("" ::: "memory");                           \
  }
WORK(ApiMainWork, 1)
WORK(ApiThreadWork, 2)
WORK(AfterStopWork, 3)
WORK(EnvWork, 4)
WORK(SignalledWork, 5)
WORK(UnsignalledWork, 6)

void* Thread(void*) {
  ApiThreadWork(200);
  return nullptr;
}

void PrintState(const char* when) {
  ProfilerState st;
  ProfilerGetCurrentState(&st);
  printf("%s: enabled=%d all_threads=%d name=%s samples=%d\n", when, st.enabled,
         ProfilingIsEnabledForAllThreads(), st.profile_name,
         st.samples_gathered);
}

int Api(const char* file) {
  PrintState("before");
  if (!ProfilerStart(file)) return 10;
  if (ProfilerStart(file)) return 11;  // already on
  PrintState("during");
  pthread_t a, b;
  pthread_create(&a, nullptr, &Thread, nullptr);
  pthread_create(&b, nullptr, &Thread, nullptr);
  ApiMainWork(200);
  pthread_join(a, nullptr);
  pthread_join(b, nullptr);
  ProfilerFlush();
  PrintState("working");
  ProfilerStop();
  PrintState("after");
  AfterStopWork(100);
  return 0;
}

// Until profiling is `on` (the toggle is handled on a thread of its own);
// false after 60 s, a hang check.
bool AwaitProfiling(bool on) {
  for (int i = 0; i < 60'000; ++i) {
    if ((ProfilingIsEnabledForAllThreads() != 0) == on) return true;
    usleep(1'000);
  }
  return false;
}

int Signal() {
  const char* sig = getenv("CPUPROFILESIGNAL");
  if (sig == nullptr) return 12;
  const int n = atoi(sig);
  UnsignalledWork(100);
  raise(n);
  if (!AwaitProfiling(true)) return 13;
  SignalledWork(200);
  raise(n);
  if (!AwaitProfiling(false)) return 14;
  UnsignalledWork(100);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const std::string mode = argv[1];
  if (mode == "api" && argc == 3) return Api(argv[2]);
  if (mode == "env") {
    EnvWork(300);
    return 0;
  }
  if (mode == "signal") return Signal();
  return 2;
}
