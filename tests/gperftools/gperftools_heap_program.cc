// A program written against gperftools' heap profiler API
// (<gperftools/heap-profiler.h>), linked with inprof's drop-in
// (inprof-gperftools) and glibc's malloc. tests/gperftools/gperftools_test.cc
// runs it.
//
//   gperftools_heap_program api PREFIX   HeapProfilerStart(PREFIX); 1,000
//                                        mallocs of 64 KiB freed at
//                                        HeapFreedSite, 4,000 of 4 KiB kept
//                                        at HeapLiveSite; HeapProfilerDump;
//                                        HeapProfilerStop. Prints the states.
//   gperftools_heap_program env          the same allocations, no API call
//                                        (HEAPPROFILE)
//   gperftools_heap_program text FILE    GetHeapProfile before
//                                        HeapProfilerStart (must be ""),
//                                        then HeapProfilerStart(FILE), the
//                                        allocations of `api`, and
//                                        GetHeapProfile's text into FILE
//   gperftools_heap_program intervals N live|freed
//                                        HEAPPROFILE: N mallocs of 1 MiB at
//                                        HeapMiBSite, kept or freed, then
//                                        waits (60 s at most) for the
//                                        interval dump $HEAPPROFILE.0001.heap
//   gperftools_heap_program fork [exec]  HEAPPROFILE: the allocations of
//                                        `api` (kept), then a child -- forked,
//                                        or exec'ing this program in `child`
//                                        mode -- that keeps 8 mallocs of 1 MiB
//                                        at HeapMiBSite, waits for the interval
//                                        dump its HEAP_PROFILE_* say (60 s at
//                                        most) and exits (its exit dump); the
//                                        parent waits for it, then exits.
//                                        Prints "child PID"
//   gperftools_heap_program child PREFIX the child's part, PREFIX the
//                                        dumps' it waits for
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gperftools/heap-profiler.h>

namespace {

// noinline, and what each returns is kept: the call to malloc stays and the
// site's frame is the stack's leaf.
__attribute__((noinline)) void* HeapFreedSite() {
  void* p = std::malloc(64 * 1024);
  asm volatile("" : : "r"(p) : "memory");
  return p;
}
__attribute__((noinline)) void* HeapLiveSite() {
  void* p = std::malloc(4096);
  asm volatile("" : : "r"(p) : "memory");
  return p;
}

__attribute__((noinline)) void* HeapMiBSite() {
  void* p = std::malloc(1 << 20);
  asm volatile("" : : "r"(p) : "memory");
  return p;
}

// The child's part of `fork`: 8 MiB kept, then the first interval dump of
// `prefix` (its HEAP_PROFILE_INUSE_INTERVAL), then exit.
int ChildPart(const std::string& prefix) {
  std::vector<void*> kept;
  for (int i = 0; i < 8; ++i) kept.push_back(HeapMiBSite());
  const std::string first = prefix + ".0001.heap";
  for (int i = 0; i < 6000 && access(first.c_str(), F_OK) != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return access(first.c_str(), F_OK) == 0 ? 0 : 1;
}

std::vector<void*>* Allocate() {
  for (int i = 0; i < 1000; ++i) std::free(HeapFreedSite());
  auto* live = new std::vector<void*>;
  live->reserve(4000);
  for (int i = 0; i < 4000; ++i) live->push_back(HeapLiveSite());
  return live;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const std::string mode = argv[1];
  if (mode == "api" && argc == 3) {
    std::printf("before: running=%d\n", IsHeapProfilerRunning());
    HeapProfilerStart(argv[2]);
    std::printf("started: running=%d\n", IsHeapProfilerRunning());
    std::vector<void*>* live = Allocate();
    HeapProfilerDump("test");
    HeapProfilerStop();
    std::printf("after: running=%d\n", IsHeapProfilerRunning());
    HeapProfilerDump("stopped");  // no file: heap profiling is off
    for (void* p : *live) std::free(p);
    delete live;
    return 0;
  }
  if (mode == "text" && argc == 3) {
    char* before = GetHeapProfile();
    std::printf("before start: %s\n", before != nullptr && *before == '\0' ? "empty" : "not empty");
    std::free(before);
    HeapProfilerStart(argv[2]);
    std::vector<void*>* live = Allocate();
    char* text = GetHeapProfile();
    HeapProfilerStop();
    if (text == nullptr) return 3;
    FILE* f = std::fopen(argv[2], "w");
    if (f == nullptr) return 4;
    std::fputs(text, f);
    std::fclose(f);
    std::free(text);
    for (void* p : *live) std::free(p);
    delete live;
    return 0;
  }
  if (mode == "intervals" && argc == 4) {
    const char* prefix = std::getenv("HEAPPROFILE");
    if (prefix == nullptr) return 2;
    const int n = std::atoi(argv[2]);
    const bool keep = std::strcmp(argv[3], "live") == 0;
    std::vector<void*> live;
    live.reserve(n);
    for (int i = 0; i < n; ++i) {
      void* p = HeapMiBSite();
      if (keep) {
        live.push_back(p);
      } else {
        std::free(p);
      }
    }
    const std::string first = std::string(prefix) + ".0001.heap";
    bool dumped = false;
    for (int i = 0; i < 6000 && !dumped; ++i) {
      dumped = access(first.c_str(), F_OK) == 0;
      if (!dumped) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::printf("interval dump: %s\n", dumped ? "yes" : "no");
    std::fflush(stdout);
    for (void* p : live) std::free(p);
    return dumped ? 0 : 1;
  }
  if (mode == "fork" && (argc == 2 || argc == 3)) {
    const char* prefix = std::getenv("HEAPPROFILE");
    if (prefix == nullptr) return 2;
    (void)Allocate();  // still allocated at exit
    const pid_t child = fork();
    if (child == 0) {
      const std::string own = std::string(prefix) + "_" + std::to_string(getpid());
      if (argc == 3) {
        execl("/proc/self/exe", "gperftools_heap_program", "child", own.c_str(), nullptr);
        _exit(127);
      }
      std::exit(ChildPart(own));
    }
    std::printf("child %d\n", static_cast<int>(child));
    std::fflush(stdout);
    int status = 0;
    waitpid(child, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
  }
  if (mode == "child" && argc == 3) return ChildPart(argv[2]);
  if (mode == "env") {
    std::printf("env: running=%d\n", IsHeapProfilerRunning());
    (void)Allocate();  // still allocated at exit
    return 0;
  }
  return 2;
}
