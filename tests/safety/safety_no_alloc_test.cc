// Safety: the profiling signal handler never allocates.
//
// This executable interposes malloc, calloc, realloc, free, the aligned
// allocators and mmap: each aborts with a message when called while a
// profiling signal handler runs on the calling thread. "While the handler
// runs" is a thread-local flag set by a wrapper installed around inprof's
// handler after Start(), so the whole handler is covered (dispatch, provider,
// unwinder, ring push), not only the sampling callback.
//
// Samples: the main thread sends itself the profiling signal tagged as inprof
// sends it (rt_tgsigqueueinfo, SI_QUEUE) for the test's probe provider
// (safety_util.h), so each one is a real sample; a second thread burns CPU
// under the 1 ms CPU timer meanwhile.
// CI and the full run both take 100,000 signals (about a second).
//
// Not built into the sanitizer runs' checks: ASan and TSan supply their own
// malloc, which this file would replace (the test skips there).
#include <dlfcn.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "gtest/gtest.h"
#include "inprof/inprof.h"
#include "safety/safety_util.h"
#include "util/test_util.h"

namespace {

// Set by the wrapper while the real handler runs on this thread. Initial-exec
// in the executable: reading it never allocates or calls into the loader.
__thread int t_in_handler __attribute__((tls_model("initial-exec"))) = 0;
std::atomic<uint64_t> g_wrapped_calls{0};

[[noreturn]] void DieAllocatingInHandler(const char* what) {
  static const char kPrefix[] = "safety: ";
  static const char kSuffix[] = " called inside the profiling signal handler\n";
  (void)!write(2, kPrefix, sizeof(kPrefix) - 1);
  (void)!write(2, what, std::strlen(what));
  (void)!write(2, kSuffix, sizeof(kSuffix) - 1);
  abort();
}

}  // namespace

#if !defined(INPROF_SAFETY_ASAN) && !defined(INPROF_SAFETY_TSAN)
// glibc's exported allocator entry points (GLIBC_2.2.5, still exported).
extern "C" void* __libc_malloc(size_t);
extern "C" void* __libc_calloc(size_t, size_t);
extern "C" void* __libc_realloc(void*, size_t);
extern "C" void __libc_free(void*);
extern "C" void* __libc_memalign(size_t, size_t);

extern "C" {
void* malloc(size_t n) {
  if (t_in_handler) DieAllocatingInHandler("malloc");
  return __libc_malloc(n);
}
void* calloc(size_t n, size_t size) {
  if (t_in_handler) DieAllocatingInHandler("calloc");
  return __libc_calloc(n, size);
}
void* realloc(void* p, size_t n) {
  if (t_in_handler) DieAllocatingInHandler("realloc");
  return __libc_realloc(p, n);
}
void free(void* p) {
  if (t_in_handler && p != nullptr) DieAllocatingInHandler("free");
  __libc_free(p);
}
void* memalign(size_t alignment, size_t n) {
  if (t_in_handler) DieAllocatingInHandler("memalign");
  return __libc_memalign(alignment, n);
}
void* aligned_alloc(size_t alignment, size_t n) {
  if (t_in_handler) DieAllocatingInHandler("aligned_alloc");
  return __libc_memalign(alignment, n);
}
int posix_memalign(void** out, size_t alignment, size_t n) {
  if (t_in_handler) DieAllocatingInHandler("posix_memalign");
  if (alignment % sizeof(void*) != 0 || (alignment & (alignment - 1)) != 0) {
    return EINVAL;
  }
  void* p = __libc_memalign(alignment, n);
  if (p == nullptr) return ENOMEM;
  *out = p;
  return 0;
}
void* mmap(void* addr, size_t length, int prot, int flags, int fd,
           off_t offset) {
  if (t_in_handler) DieAllocatingInHandler("mmap");
  const long r = syscall(SYS_mmap, addr, length, prot, flags, fd, offset);
  return r == -1 ? MAP_FAILED : reinterpret_cast<void*>(r);
}
}  // extern "C"
constexpr bool kInterposed = true;
#else
constexpr bool kInterposed = false;
#endif

namespace inprof {
namespace {

// In front of inprof's handler (safety::WrapInprofHandler).
void WrappingHandler(int signo, siginfo_t* info, void* ucontext) {
  ++t_in_handler;
  g_wrapped_calls.fetch_add(1, std::memory_order_relaxed);
  safety::CallInprofHandler(signo, info, ucontext);
  --t_in_handler;
}

// The interposer itself works: an allocation with the flag set aborts.
TEST(SafetyNoAllocTest, InterposerCatchesAllocationsInsideTheHandler) {
  if (!kInterposed) GTEST_SKIP() << "the sanitizer owns malloc in this build";
  EXPECT_DEATH(
      {
        t_in_handler = 1;
        void* p = std::malloc(16);
        t_in_handler = 0;
        std::free(p);
      },
      "malloc called inside the profiling signal handler");
}

TEST(SafetyNoAllocTest, HandlerNeverAllocatesOver100kSamples) {
  if (!kInterposed) GTEST_SKIP() << "the sanitizer owns malloc in this build";
  // 100,000 in CI too: self-signals cost ~3 us each.
  constexpr int kSignals = 100'000;
  Options options;
  options.output = testing::TestTmpDir() + "/safety_no_alloc.pb.gz";
  options.cpu_period = absl::Milliseconds(1);
  safety::ProbedProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  ASSERT_TRUE(safety::WrapInprofHandler(&WrappingHandler));

  std::atomic<bool> stop{false};
  std::thread burner([&] {
    auto registration = profiler.RegisterThread("burner");
    while (!stop.load(std::memory_order_relaxed)) safety::BurnCpu(5'000'000);
  });

  auto self = profiler.RegisterThread("main");
  ASSERT_TRUE(self.active());
  auto* slot = internal::CurrentThreadSlot();
  ASSERT_NE(slot, nullptr);
  const uint64_t taken_before = slot->samples_taken.load();
  // Each sent until the probe sampled it (a timer's pending SIGPROF takes
  // the place of one sent meanwhile: safety::SendProbeSignalToSelf).
  for (int i = 0; i < kSignals; ++i) {
    ASSERT_TRUE(safety::SendProbeSignalToSelf());
  }
  const uint64_t taken_here = slot->samples_taken.load() - taken_before;

  stop = true;
  burner.join();
  self.Reset();
  ASSERT_TRUE(safety::UnwrapInprofHandler());
  ASSERT_TRUE(profiler.Stop().ok());

  // Every self-signal was a sample that went through the whole handler.
  EXPECT_GE(taken_here, static_cast<uint64_t>(kSignals));
  EXPECT_GE(g_wrapped_calls.load(), static_cast<uint64_t>(kSignals));
  EXPECT_GE(profiler.stats().samples_taken, static_cast<uint64_t>(kSignals));
  std::printf("safety_no_alloc: %d self-signals, %llu handler runs, %llu "
              "samples taken, %llu dropped (ring full)\n",
              kSignals,
              static_cast<unsigned long long>(g_wrapped_calls.load()),
              static_cast<unsigned long long>(profiler.stats().samples_taken),
              static_cast<unsigned long long>(profiler.stats().samples_dropped));
}

}  // namespace
}  // namespace inprof
