// Safety of the allocation hooks (AllocationProvider, inprof/heap): with
// every allocation sampled (Options::alloc_period = 1), the host's
// allocator behaves as it does unprofiled.
//
//   - errno: a sampled allocation, free, realloc or calloc that succeeds
//     leaves the host's errno as it was (when unprofiled libc does too);
//     one that fails keeps its error (ENOMEM, EINVAL) and realloc's old
//     block;
//   - small stacks: a registered thread that allocates on an 8 KiB
//     makecontext stack (a coroutine's), with a PROT_NONE guard page below
//     it, does not crash: on a stack that is not the thread's own the
//     sampled path records nothing (the room is unknown) and counts it;
//     a thread near the end of its own stack, and a signal handler on a
//     4 KiB alternate stack, that allocate where the program alone
//     survives, survive too;
//   - Start/Stop: the hooks are installed and removed 10 times while three
//     registered threads allocate, reallocate and free without pause: no
//     crash, every block freed by the allocator that made it, every profile
//     readable, and allocations sampled.
//
// The small-stack scenario runs in a forked child (safety::RunInChild): an
// overflow hits the guard page and the child dies of SIGSEGV, which the
// test reports instead of taking the test binary down.
#include <alloca.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "inprof/inprof.h"
#include "inprof/pprof_reader.h"
#include "safety/safety_util.h"
#include "util/test_util.h"

namespace inprof {
namespace {

using HeapProfiler =
    Profiler<DefaultUnwinder, DefaultSampleRing, CpuTimeProvider, AllocationProvider>;

// A sanitizer's runtime linked statically (clang's TSan) defines malloc in
// the executable itself, whose own calls to it go through no GOT slot: they
// are not intercepted (allocation_provider.h), and nothing here is sampled.
// Under ASan this test links the runtime as a shared library
// (tests/meson.build: INPROF_SANITIZER_RUNTIME_SHARED): hooked like libc.
#if defined(INPROF_TSAN) || (defined(INPROF_ASAN) && !defined(INPROF_SANITIZER_RUNTIME_SHARED))
constexpr bool kIntercepted = false;
#else
constexpr bool kIntercepted = true;
#endif

// The tests that measure how little stack the hooks need: a sanitizer's
// instrumented frames do not fit the stacks they leave, whatever inprof
// does (under ASan, measured with the hooks reached: stack-overflow in
// CpuTimeProvider::OnSignal below the allocation, and in the loader's
// _dl_lookup_symbol_x; the small alternate stack hung until its 60 s
// limit).
#if defined(INPROF_ASAN) || defined(INPROF_TSAN)
#define SKIP_UNDER_SANITIZER_FRAMES() \
  GTEST_SKIP() << "a sanitizer's instrumented frames do not fit the small stack this measures"
#else
#define SKIP_UNDER_SANITIZER_FRAMES() static_cast<void>(0)
#endif

Options EverySampled(const std::string& name) {
  Options options;
  options.output = testing::FreshTestDir(name) + "/profile.pb.gz";
  options.alloc_period = 1;  // every allocation
  options.wall_period = absl::ZeroDuration();
  options.export_period = absl::ZeroDuration();
  return options;
}

// Kept so that the calls to the allocator stay.
template <typename T>
inline __attribute__((always_inline)) T* Kept(T* p) {
  asm volatile("" : : "r"(p) : "memory");
  return p;
}

// Successful calls of each form, with errno set to a sentinel before each:
// how many left it changed.
int ErrnoChangesOnSuccess(int rounds) {
  constexpr int kSentinel = 4242;
  int changed = 0;
  auto check = [&] {
    if (errno != kSentinel) ++changed;
    errno = kSentinel;
  };
  errno = kSentinel;
  for (int i = 0; i < rounds; ++i) {
    void* p = Kept(std::malloc(64 + static_cast<size_t>(i % 7) * 512));
    check();
    p = Kept(std::realloc(p, 128 * 1024));
    check();
    std::free(p);
    check();
    void* c = Kept(std::calloc(16, 100));
    check();
    std::free(c);
    check();
    char* n = Kept(new char[300]);
    check();
    delete[] n;
    check();
    void* a = nullptr;
    if (posix_memalign(&a, 64, 1000) == 0) std::free(Kept(a));
    check();
  }
  return changed;
}

// Failed calls keep their errors; a failed realloc keeps the old block.
void ExpectFailuresKeepTheirErrors() {
  // Through a volatile: sizes the compiler would refuse to see called.
  volatile size_t huge_v = static_cast<size_t>(PTRDIFF_MAX) - 4096;
  volatile size_t half_v = SIZE_MAX / 2;
  const size_t huge = huge_v, half = half_v;
  errno = 0;
  EXPECT_EQ(Kept(std::malloc(huge)), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  errno = 0;
  EXPECT_EQ(Kept(std::calloc(half, 4)), nullptr);  // overflows
  EXPECT_EQ(errno, ENOMEM);
  char* block = static_cast<char*>(Kept(std::malloc(100)));
  ASSERT_NE(block, nullptr);
  std::memset(block, 'x', 100);
  errno = 0;
  EXPECT_EQ(Kept(std::realloc(block, huge)), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  EXPECT_EQ(block[0], 'x');
  EXPECT_EQ(block[99], 'x');
  std::free(block);
  void* aligned = nullptr;
  EXPECT_EQ(posix_memalign(&aligned, 3, 16), EINVAL);  // not a power of two
  EXPECT_EQ(aligned, nullptr);
}

TEST(SafetyAllocTest, SampledCallsKeepTheHostsErrnoAndErrors) {
  // Unprofiled first: where libc itself changes errno on success, the
  // profiled run is held to the same count.
  const int unprofiled = ErrnoChangesOnSuccess(200);
  HeapProfiler profiler(EverySampled("safety_alloc_errno"));
  ASSERT_TRUE(profiler.Start().ok());
  const uint64_t before = AllocationProvider::stats().samples;
  int profiled = 0;
  {
    auto self = profiler.RegisterThread("main");
    profiled = ErrnoChangesOnSuccess(200);
    // A sanitizer's allocator reports an impossible size or alignment and
    // aborts the process (allocator_may_return_null=0) instead of failing
    // the call: that is its behaviour, not the host's.
    if (!safety::kSanitized) ExpectFailuresKeepTheirErrors();
  }
  const uint64_t sampled = AllocationProvider::stats().samples - before;
  ASSERT_TRUE(profiler.Stop().ok());
  std::printf("errno changed by %d of 1400 successful calls unprofiled, %d "
              "profiled; %llu allocations sampled\n",
              unprofiled, profiled, static_cast<unsigned long long>(sampled));
  EXPECT_EQ(profiled, unprofiled);
  // Every allocation is sampled at period 1: 1,000 successful ones at least
  // (deterministic).
  if (kIntercepted) {
    EXPECT_GE(sampled, 1000u);
  }
}

constexpr size_t kSmallStack = 8 * 1024;
constexpr int kAllocationsOnSmallStack = 1000;
std::atomic<int> g_done{0};

void AllocateOnSmallStack() {
  for (int i = 0; i < kAllocationsOnSmallStack; ++i) {
    void* p = Kept(std::malloc(32 + static_cast<size_t>(i % 5) * 1000));
    p = Kept(std::realloc(p, 8000));
    std::free(p);
    g_done.fetch_add(1, std::memory_order_relaxed);
  }
}

enum SmallStackResult { kOk = 0, kStartFailed = 10, kStackFailed, kNotAllDone, kNotSampled };

int AllocateOnASmallStackScenario() {
  HeapProfiler profiler(EverySampled("safety_alloc_small_stack"));
  if (!profiler.Start().ok()) return kStartFailed;
  int result = kOk;
  const uint64_t before = AllocationProvider::stats().samples;
  std::thread worker([&] {
    auto registration = profiler.RegisterThread("coroutine");
    safety::GuardedStack stack(kSmallStack);
    if (stack.base() == nullptr) {
      result = kStackFailed;
      return;
    }
    ucontext_t main_context, coroutine;
    getcontext(&coroutine);
    coroutine.uc_stack.ss_sp = stack.base();
    coroutine.uc_stack.ss_size = stack.size();
    coroutine.uc_link = &main_context;
    makecontext(&coroutine, &AllocateOnSmallStack, 0);
    if (swapcontext(&main_context, &coroutine) != 0) result = kStackFailed;
  });
  worker.join();
  const uint64_t sampled = AllocationProvider::stats().samples - before;
  if (!profiler.Stop().ok() && result == kOk) result = kStartFailed;
  if (result == kOk && g_done.load() != kAllocationsOnSmallStack) result = kNotAllDone;
  // 2,000 allocations, each sampled (deterministic), none recorded: the
  // coroutine's stack is not the thread's, its room unknown.
  if (result == kOk && kIntercepted &&
      (sampled < 2u * kAllocationsOnSmallStack ||
       AllocationProvider::stats().samples_no_room < 2u * kAllocationsOnSmallStack)) {
    result = kNotSampled;
  }
  return result;
}

// Near the end of a thread's own stack: the thread uses all but `kLeft`
// bytes of its 64 KiB stack (a guard page below), then allocates 100
// blocks. glibc's malloc alone runs with ~1.9 KiB left; the sampled path
// needed several KiB and checked none: with 3,000 bytes left a registered
// thread hit the guard page (the test failed so before the check).
constexpr size_t kThreadStack = 64 * 1024;
constexpr size_t kLeft = 3000;

__attribute__((noinline)) int AllocateWithLittleLeft(uintptr_t stack_lo) {
  const auto sp = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
  if (sp < stack_lo + kLeft + 512) return 1;
  // Take all but kLeft bytes (and this frame's) of what is left.
  volatile char* used = static_cast<volatile char*>(alloca(sp - stack_lo - kLeft));
  used[0] = 1;
  int failed = 0;
  for (int i = 0; i < 100; ++i) {
    void* p = Kept(std::malloc(64 + static_cast<size_t>(i) * 8));
    if (p == nullptr) ++failed;
    std::free(p);
  }
  return failed + (used[0] == 1 ? 0 : 1);
}

int NearTheStacksEnd(bool profiled, bool registered) {
  HeapProfiler* profiler = nullptr;
  if (profiled) {
    profiler = new HeapProfiler(EverySampled("safety_alloc_stack_end"));
    if (!profiler->Start().ok()) return kStartFailed;
  }
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, kThreadStack);
  struct Arg {
    HeapProfiler* profiler;
    bool registered;
    int result;
  } arg{profiler, registered, kStackFailed};
  pthread_t thread;
  if (pthread_create(
          &thread, &attr,
          [](void* a) -> void* {
            Arg& arg = *static_cast<Arg*>(a);
            std::optional<ThreadRegistration> registration;
            if (arg.profiler != nullptr && arg.registered) {
              registration.emplace(arg.profiler->RegisterThread("near the end"));
            }
            std::free(Kept(std::malloc(100)));  // the thread's first, with room
            pthread_attr_t self;
            void* lo = nullptr;
            size_t size = 0;
            if (pthread_getattr_np(pthread_self(), &self) != 0) return nullptr;
            pthread_attr_getstack(&self, &lo, &size);
            pthread_attr_destroy(&self);
            arg.result = AllocateWithLittleLeft(reinterpret_cast<uintptr_t>(lo)) == 0
                             ? kOk
                             : kNotAllDone;
            return nullptr;
          },
          &arg) != 0) {
    return kStackFailed;
  }
  pthread_join(thread, nullptr);
  pthread_attr_destroy(&attr);
  if (profiler != nullptr && !profiler->Stop().ok() && arg.result == kOk) return kStartFailed;
  return arg.result;
}

TEST(SafetyAllocTest, AllocationsNearTheEndOfAThreadsStackNeverOverflowIt) {
  SKIP_UNDER_SANITIZER_FRAMES();
  // The program alone, then profiled with the thread registered and not.
  ASSERT_EQ(safety::RunInChild([] { return NearTheStacksEnd(false, false); }, 60), kOk)
      << "the program alone does not fit " << kLeft << " bytes here";
  for (bool registered : {true, false}) {
    const int rc = safety::RunInChild([&] { return NearTheStacksEnd(true, registered); }, 60);
    EXPECT_EQ(rc, kOk) << (registered ? "registered: " : "unregistered: ")
                       << (rc == 128 + SIGSEGV ? "the stack overflowed (SIGSEGV)"
                                               : "see the exit code");
  }
}

// A signal handler on a 4 KiB alternate stack that allocates (not
// async-signal-safe, but programs do it from a signal they raise
// themselves): profiled with every allocation sampled, it survives as it
// does alone.
constexpr size_t kAltStack = 4096;
std::atomic<int> g_handler_failures{0};

void AllocatingHandler(int) {
  for (int i = 0; i < 10; ++i) {
    void* p = Kept(std::malloc(200));
    if (p == nullptr) g_handler_failures.fetch_add(1);
    std::free(p);
  }
}

int AltStackHandler(bool profiled) {
  HeapProfiler* profiler = nullptr;
  if (profiled) {
    profiler = new HeapProfiler(EverySampled("safety_alloc_altstack"));
    if (!profiler->Start().ok()) return kStartFailed;
  }
  safety::GuardedStack alt(kAltStack);
  if (alt.base() == nullptr) return kStackFailed;
  stack_t ss{};
  ss.ss_sp = alt.base();
  ss.ss_size = alt.size();
  if (sigaltstack(&ss, nullptr) != 0) return kStackFailed;
  struct sigaction sa {};
  sa.sa_handler = &AllocatingHandler;
  sa.sa_flags = SA_ONSTACK | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGUSR2, &sa, nullptr) != 0) return kStackFailed;
  for (int i = 0; i < 20; ++i) raise(SIGUSR2);
  ss.ss_flags = SS_DISABLE;
  sigaltstack(&ss, nullptr);
  if (profiler != nullptr && !profiler->Stop().ok()) return kStartFailed;
  if (g_handler_failures.load() != 0) return kNotAllDone;
  // 200 allocations sampled, none recorded: the alternate stack is not the
  // thread's (deterministic at period 1).
  if (profiled && kIntercepted && AllocationProvider::stats().samples_no_room < 200) {
    return kNotSampled;
  }
  return kOk;
}

TEST(SafetyAllocTest, AnAllocatingHandlerOnASmallAlternateStackSurvives) {
  SKIP_UNDER_SANITIZER_FRAMES();
  ASSERT_EQ(safety::RunInChild([] { return AltStackHandler(false); }, 60), kOk)
      << "the program alone does not fit a " << kAltStack << "-byte alternate stack here";
  const int rc = safety::RunInChild([] { return AltStackHandler(true); }, 60);
  EXPECT_EQ(rc, kOk) << (rc == 128 + SIGSEGV ? "the alternate stack overflowed (SIGSEGV)"
                         : rc == kNotSampled ? "the handler's allocations were not counted"
                                             : "see the exit code");
}

TEST(SafetyAllocTest, AllocationsOnACoroutinesSmallStackNeverOverflowIt) {
  SKIP_UNDER_SANITIZER_FRAMES();
  const int rc = safety::RunInChild(AllocateOnASmallStackScenario, 60);
  EXPECT_EQ(rc, kOk) << (rc == 128 + SIGSEGV ? "the 8 KiB stack overflowed (SIGSEGV)"
                         : rc == 128 + SIGALRM ? "the child hung"
                         : rc == kNotSampled  ? "the allocations were not sampled"
                                              : "see the exit code");
}

// pthread_getattr_np allocates (its CPU set; the main thread's
// /proc/self/maps) while it holds the calling thread's own lock. A sampled
// allocation there on a thread that never registered, whose stack bounds
// were not known yet, looked them up with pthread_getattr_np and waited
// for that lock forever: ASan's thread start did it. Every allocation is
// sampled here, on a new unregistered thread whose first allocations are
// pthread_getattr_np's (in a child: a deadlock reads as SIGALRM).
int GetattrScenario() {
  HeapProfiler profiler(EverySampled("safety_alloc_getattr"));
  if (!profiler.Start().ok()) return kStartFailed;
  int result = kOk;
  std::thread unregistered([&] {
    for (int i = 0; i < 100; ++i) {
      pthread_attr_t attr;
      if (pthread_getattr_np(pthread_self(), &attr) != 0) {
        result = kStackFailed;
        return;
      }
      pthread_attr_destroy(&attr);
    }
    // An allocation of its own code: now its bounds are looked up.
    std::free(Kept(std::malloc(1000)));
  });
  unregistered.join();
  for (int i = 0; i < 20; ++i) {
    pthread_attr_t attr;
    if (pthread_getattr_np(pthread_self(), &attr) != 0) return kStackFailed;
    pthread_attr_destroy(&attr);
  }
  if (!profiler.Stop().ok() && result == kOk) result = kStartFailed;
  return result;
}

TEST(SafetyAllocTest, AStackLookupNeverRunsInsidePthreadGetattrNp) {
  const int rc = safety::RunInChild(GetattrScenario, 60);
  EXPECT_EQ(rc, kOk) << (rc == 128 + SIGALRM ? "deadlocked inside pthread_getattr_np"
                                             : "see the exit code");
}

// Three registered threads allocate without pause while the hooks come and
// go: the GOT slots are patched and put back under them.
TEST(SafetyAllocTest, StartStopCyclesWhileThreadsAllocate) {
  constexpr int kCycles = 10;
  std::atomic<bool> stop{false};
  std::atomic<int64_t> operations{0};
  uint64_t sampled = 0;
  int64_t in_profiles = 0;
  {
    HeapProfiler profiler(EverySampled("safety_alloc_cycles"));
    const std::string output = profiler.options().output;
    std::vector<std::thread> workers;
    for (int t = 0; t < 3; ++t) {
      workers.emplace_back([&, t] {
        auto registration = profiler.RegisterThread("allocator");
        std::vector<void*> held(64, nullptr);
        uint64_t i = static_cast<uint64_t>(t);
        while (!stop.load(std::memory_order_relaxed)) {
          void*& slot = held[i % held.size()];
          if (slot == nullptr) {
            slot = Kept(std::malloc(16 + (i * 37) % 4000));
          } else if (i % 3 == 0) {
            slot = Kept(std::realloc(slot, 16 + (i * 53) % 9000));
          } else {
            // The allocator's own size for the block, profiled or not.
            if (malloc_usable_size(slot) < 16) std::abort();
            std::free(slot);
            slot = nullptr;
          }
          ++i;
          operations.fetch_add(1, std::memory_order_relaxed);
        }
        for (void* p : held) std::free(p);
      });
    }
    for (int cycle = 0; cycle < kCycles; ++cycle) {
      const uint64_t before = AllocationProvider::stats().samples;
      ASSERT_TRUE(profiler.Start().ok()) << "cycle " << cycle;
      // Until this window has seen allocations (at least 50 ms).
      const int64_t until = safety::MonotonicNow() + 50'000'000;
      while (safety::MonotonicNow() < until ||
             (kIntercepted && AllocationProvider::stats().samples - before < 100 &&
              safety::MonotonicNow() < until + 5'000'000'000)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      ASSERT_TRUE(profiler.Stop().ok()) << "cycle " << cycle;
      sampled += AllocationProvider::stats().samples - before;
      absl::StatusOr<DecodedProfile> profile = ReadPprofFile(output);
      ASSERT_TRUE(profile.ok()) << "cycle " << cycle << ": " << profile.status();
      if (const int objects = profile->ValueIndex("alloc_objects"); objects >= 0) {
        in_profiles += profile->Total(objects);
      }
    }
    stop.store(true);
    for (std::thread& w : workers) w.join();
  }
  std::printf("%d start/stop cycles; %lld allocator calls; %llu sampled; "
              "%lld objects in the profiles\n",
              kCycles, static_cast<long long>(operations.load()),
              static_cast<unsigned long long>(sampled),
              static_cast<long long>(in_profiles));
  EXPECT_GT(operations.load(), 0);
  if (kIntercepted) {
    // Each window waited for 100 samples (every allocation is sampled).
    EXPECT_GE(sampled, 100u * kCycles);
    EXPECT_GT(in_profiles, 0);
  }
}

}  // namespace
}  // namespace inprof
