// Safety of the profiling signal handler on stacks it cannot use: SIGPROF is
// not taken on an alternate stack, so its handler runs on whatever stack the
// interrupted code is on -- a signal handler's small sigaltstack, a
// coroutine's makecontext stack. There the handler must not walk (its record
// alone is kilobytes): the sample is skipped, counted, and its values kept on
// a pseudo-frame, so totals stay true.
//
//   - the handler's stack use, for both unwinders, measured on a thread
//     whose stack is pre-filled with a pattern, is within the bound the
//     first-level handler checks (the figures are printed);
//   - a registered thread working on an 8 KiB sigaltstack (glibc's SIGSTKSZ)
//     and on an 8 KiB makecontext stack, each with a PROT_NONE guard page
//     below it, sampled at the 1 ms period and by the wall sampler, and sent
//     the profiling signal while it is there: no crash, every such signal
//     counted as skipped, and the values on "[inprof: on a small or foreign
//     stack]" with the count in the profile's comments;
//   - a thread waiting on such a stack is signalled once for the wait, not
//     at every wall visit (each signal interrupts the wait with EINTR).
//
// Each scenario runs in a forked child (safety::RunInChild): a handler that
// overflows the small stack hits the guard page and the child dies of
// SIGSEGV, which the test reports, instead of taking the test binary down.
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "inprof/inprof.h"
#include "inprof/pprof_reader.h"
#include "safety/safety_util.h"
#include "util/test_util.h"

namespace inprof {
namespace {

// glibc's SIGSTKSZ before it became sysconf(_SC_SIGSTKSZ), and what
// programs still commonly give a sigaltstack or a small coroutine. Under a
// sanitizer the program's own work there does not fit in 8 KiB (ASan's
// interceptors at -O0 overflow it without inprof): 64 KiB, still a stack
// that is not the thread's own.
constexpr size_t kSmallStack = safety::kSanitized ? 64 * 1024 : 8192;
constexpr const char* kSmallStackFrame = "[inprof: on a small or foreign stack]";
// Profiling signals each scenario sends itself while on the small stack.
constexpr int kSignalsOnSmallStack = 25;

Options SmallStackOptions(const std::string& name) {
  Options options;
  options.output = testing::TestTmpDir() + "/safety_small_stack_" + name + ".pb.gz";
  options.cpu_period = absl::Milliseconds(1);
  options.wall_period = absl::Milliseconds(1);
  std::remove(options.output.c_str());
  return options;
}

uint64_t SlotSmallStack() {
  return internal::CurrentThreadSlot()->samples_small_stack.load();
}

// Work done on the small stack: a little CPU, and the profiling signal sent
// to this thread, which handles it right here (sent again when a pending
// timer's signal took its place: safety::SendProbeSignalToSelf).
std::atomic<int> g_sent{0};
__attribute__((noinline)) void WorkOnSmallStack() {
  for (int i = 0; i < kSignalsOnSmallStack; ++i) {
    safety::BurnCpu(200'000);
    if (safety::SendProbeSignalToSelf()) {
      g_sent.fetch_add(1, std::memory_order_relaxed);
    }
  }
}

void OnUsr1(int) { WorkOnSmallStack(); }

// The child's checks: exit codes name the one that failed.
enum ChildResult {
  kOk = 0,
  kStartFailed = 10,
  kStackFailed = 11,
  kNotAllSent = 12,
  kNotSkipped = 13,
  kNoProfile = 14,
  kNoPseudoFrame = 15,
  kNoComment = 16,
  kStatsDisagree = 17,
};

int CheckProfile(const Options& options, uint64_t skipped) {
  auto profile = ReadPprofFile(options.output);
  if (!profile.ok()) {
    std::fprintf(stderr, "%s\n", std::string(profile.status().message()).c_str());
    return kNoProfile;
  }
  const int count = profile->ValueIndex("probe-samples");
  const auto flat = profile->FlatByFunction(count);
  const int64_t on_frame = flat.contains(kSmallStackFrame) ? flat.at(kSmallStackFrame) : 0;
  // Every probe signal sent on the small stack is one sample there (the
  // ring holds thousands of records: none is dropped).
  if (on_frame < kSignalsOnSmallStack) {
    std::fprintf(stderr, "%lld probe samples on %s, expected >= %d\n",
                 static_cast<long long>(on_frame), kSmallStackFrame,
                 kSignalsOnSmallStack);
    return kNoPseudoFrame;
  }
  const std::string want =
      "samples taken on a small or foreign stack, not walked=";
  for (const std::string& c : profile->comments) {
    const size_t at = c.find(want);
    if (at == std::string::npos) continue;
    const uint64_t n = std::stoull(c.substr(at + want.size()));
    return n == skipped ? kOk : kStatsDisagree;
  }
  return kNoComment;
}

// The default composition with the probe (safety_util.h), which samples
// every signal sent with its tag.
using SmallStackProfiler = safety::ProbedProfilerOf<DefaultUnwinder>;

// A registered thread runs WorkOnSmallStack on `kind`'s small stack while
// the profiler samples it at 1 ms (CPU and wall).
int RunScenario(const char* kind) {
  Options options = SmallStackOptions(kind);
  SmallStackProfiler profiler(options);
  if (!profiler.Start().ok()) return kStartFailed;
  int result = kOk;
  uint64_t skipped = 0;
  std::thread worker([&] {
    auto registration = profiler.RegisterThread("small-stack");
    safety::BurnCpu(20'000'000);  // on its own stack: walked
    safety::GuardedStack stack(kSmallStack);
    if (stack.base() == nullptr) {
      result = kStackFailed;
      return;
    }
    const uint64_t before = SlotSmallStack();
    if (std::strcmp(kind, "sigaltstack") == 0) {
      stack_t ss{};
      ss.ss_sp = stack.base();
      ss.ss_size = stack.size();
      struct sigaction action {};
      action.sa_handler = &OnUsr1;
      action.sa_flags = SA_ONSTACK;
      sigemptyset(&action.sa_mask);
      if (sigaltstack(&ss, nullptr) != 0 ||
          sigaction(SIGUSR1, &action, nullptr) != 0) {
        result = kStackFailed;
        return;
      }
      pthread_kill(pthread_self(), SIGUSR1);  // handled on the alternate stack
      ss.ss_flags = SS_DISABLE;
      sigaltstack(&ss, nullptr);
    } else {
      ucontext_t main_context, coroutine;
      getcontext(&coroutine);
      coroutine.uc_stack.ss_sp = stack.base();
      coroutine.uc_stack.ss_size = stack.size();
      coroutine.uc_link = &main_context;
      makecontext(&coroutine, &WorkOnSmallStack, 0);
      if (swapcontext(&main_context, &coroutine) != 0) {
        result = kStackFailed;
        return;
      }
    }
    skipped = SlotSmallStack() - before;
    if (g_sent.load() != kSignalsOnSmallStack) {
      result = kNotAllSent;
    } else if (skipped < static_cast<uint64_t>(kSignalsOnSmallStack)) {
      // Each signal sent there is handled there (a timer's signal pending
      // at that moment takes its place, on the same stack).
      std::fprintf(stderr, "%llu samples skipped, expected >= %d\n",
                   static_cast<unsigned long long>(skipped), kSignalsOnSmallStack);
      result = kNotSkipped;
    }
    safety::BurnCpu(5'000'000);  // back on its own stack
  });
  worker.join();
  if (!profiler.Stop().ok()) return kNoProfile;
  if (result != kOk) return result;
  if (profiler.stats().samples_small_stack < skipped) return kStatsDisagree;
  return CheckProfile(options, profiler.stats().samples_small_stack);
}

// TSan runs a signal's handler from its own interceptor at the thread's next
// call into it, on the thread's stack, not on the sigaltstack it arrived on:
// what these tests measure (the handler on a small alternate stack, its
// stack use) does not happen there: a signal sent on a makecontext stack
// can be handled after the thread swapped back (24 of 25 landed there in
// one clean-clone run). The plain and ASan suites run these; the wait case
// runs under TSan too.
constexpr const char* kTsanHandlerElsewhere =
    "TSan runs signal handlers from its interceptors, not on the stack the "
    "signal arrived on";

TEST(SafetySmallStackTest, ThreadOnASmallSigaltstackIsSkippedNotOverflowed) {
  if (safety::kTsan) GTEST_SKIP() << kTsanHandlerElsewhere;
  const int rc = safety::RunInChild([] { return RunScenario("sigaltstack"); }, 60);
  EXPECT_EQ(rc, kOk) << (rc > 128 ? "the child died of signal " + std::to_string(rc - 128)
                                  : "child check " + std::to_string(rc) + " failed");
}

TEST(SafetySmallStackTest, ThreadOnASmallMakecontextStackIsSkippedNotOverflowed) {
  if (safety::kTsan) GTEST_SKIP() << kTsanHandlerElsewhere;
  const int rc = safety::RunInChild([] { return RunScenario("makecontext"); }, 60);
  EXPECT_EQ(rc, kOk) << (rc > 128 ? "the child died of signal " + std::to_string(rc - 128)
                                  : "child check " + std::to_string(rc) + " failed");
}

// A thread that waits on a coroutine's stack: the wall sampler's first
// signal of the wait takes a sample without a stack, and the rest of the
// wait is credited to the same pseudo-frame without signalling again (each
// signal would interrupt the wait: poll returns EINTR).
std::atomic<int> g_eintr{0};
std::atomic<int64_t> g_wait_end_ns{0};
__attribute__((noinline)) void WaitOnSmallStack() {
  while (true) {
    const int64_t left_ms = (g_wait_end_ns.load() - safety::MonotonicNow()) / 1'000'000;
    if (left_ms <= 0) break;
    if (poll(nullptr, 0, static_cast<int>(left_ms)) < 0 && errno == EINTR) {
      g_eintr.fetch_add(1, std::memory_order_relaxed);
    }
  }
}

int RunWaitScenario() {
  Options options = SmallStackOptions("wait");
  options.wall_period = absl::Milliseconds(5);
  DefaultProfiler profiler(options);
  if (!profiler.Start().ok()) return kStartFailed;
  int result = kOk;
  std::thread worker([&] {
    auto registration = profiler.RegisterThread("small-stack-wait");
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
    makecontext(&coroutine, &WaitOnSmallStack, 0);
    g_wait_end_ns.store(safety::MonotonicNow() + 500'000'000);
    if (swapcontext(&main_context, &coroutine) != 0) result = kStackFailed;
  });
  worker.join();
  if (!profiler.Stop().ok()) return kNoProfile;
  if (result != kOk) return result;
  // 500 ms at a 5 ms wall period: 100 visits. One signal begins the
  // episode; another may follow if a visit sees the thread between two
  // polls (it ran). A signal per visit would be ~100.
  std::fprintf(stderr, "poll returned EINTR %d times in 500 ms\n", g_eintr.load());
  if (g_eintr.load() > 5) return kNotSkipped;
  auto profile = ReadPprofFile(options.output);
  if (!profile.ok()) return kNoProfile;
  const int wall = profile->ValueIndex("wall-time");
  const auto flat = profile->FlatByFunction(wall);
  const int64_t on_frame = flat.contains(kSmallStackFrame) ? flat.at(kSmallStackFrame) : 0;
  std::fprintf(stderr, "wall time on %s: %lld ns\n", kSmallStackFrame,
               static_cast<long long>(on_frame));
  // Most of the 500 ms wait: its first signal's interval is owed to the
  // sample, and every later visit credits the episode.
  return on_frame >= 400'000'000 ? kOk : kNoPseudoFrame;
}

TEST(SafetySmallStackTest, AWaitOnASmallStackIsSignalledOncePerEpisode) {
  const int rc = safety::RunInChild([] { return RunWaitScenario(); }, 60);
  EXPECT_EQ(rc, kOk) << (rc > 128 ? "the child died of signal " + std::to_string(rc - 128)
                                  : "child check " + std::to_string(rc) + " failed");
}

// --- the handler's stack use ------------------------------------------------

constexpr uint8_t kPattern = 0xa5;
constexpr size_t kMeasureStack = 256 * 1024;

std::atomic<uintptr_t> g_handler_frame{0};
void MeasuringWrapper(int signo, siginfo_t* info, void* ucontext) {
  g_handler_frame.store(reinterpret_cast<uintptr_t>(__builtin_frame_address(0)),
                        std::memory_order_relaxed);
  safety::CallInprofHandler(signo, info, ucontext);
}

// What one profiling signal used of a pattern-filled stack. In memory
// shared with the forked child that measures it.
struct StackUse {
  size_t handler = 0;  // below the first-level handler's frame
  size_t total = 0;    // below the signalled code's frame (the kernel's
                       // signal frame included)
  uint64_t taken = 0;
  uint64_t skipped = 0;
};

// Where the signal lands: 40 frames down, for the walk.
__attribute__((noinline)) uintptr_t SignalAtDepth(int depth) {
  if (depth > 0) {
    const uintptr_t r = SignalAtDepth(depth - 1);
    asm volatile("" ::: "memory");
    return r;
  }
  const uintptr_t frame = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
  safety::SendProfilingSignal(safety::Gettid(), /*tagged=*/true);
  return frame;
}

// Fills [lo, 512 bytes below this frame) with the pattern: a loop in the
// caller's frame, no call's frame below it.
#define INPROF_FILL_PATTERN_BELOW_HERE(lo)                                   \
  do {                                                                       \
    const uintptr_t here_ =                                                  \
        reinterpret_cast<uintptr_t>(__builtin_frame_address(0)) - 512;       \
    for (auto* b_ = reinterpret_cast<volatile uint8_t*>(lo);                 \
         reinterpret_cast<uintptr_t>(b_) < here_; ++b_) {                    \
      *b_ = kPattern;                                                        \
    }                                                                        \
  } while (false)

size_t PatternUntouched(uintptr_t lo) {
  uintptr_t p = lo;
  while (*reinterpret_cast<const uint8_t*>(p) == kPattern) ++p;
  return p - lo;
}

struct Measured {
  uintptr_t lo = 0;  // the pattern-filled stack
  StackUse* use = nullptr;
};
Measured* g_measured = nullptr;

// Signals this thread at depth and records what the pattern says.
void SignalAndMeasure() {
  internal::ThreadSlotHeader* slot = internal::CurrentThreadSlot();
  const uint64_t taken = slot->samples_taken.load();
  const uint64_t skipped = slot->samples_small_stack.load();
  INPROF_FILL_PATTERN_BELOW_HERE(g_measured->lo);
  const uintptr_t frame = SignalAtDepth(40);
  StackUse& use = *g_measured->use;
  use.taken = slot->samples_taken.load() - taken;
  use.skipped = slot->samples_small_stack.load() - skipped;
  const uintptr_t lowest = g_measured->lo + PatternUntouched(g_measured->lo);
  use.handler = g_handler_frame.load() - lowest;
  use.total = frame - lowest;
}

// Measures, in a forked child (so that every lookup cache of the walk
// starts cold, its costliest case), one profiling signal on a registered
// thread: on its own stack (`stackless` false: the walk) or on a coroutine's
// stack (true: SampleStackless).
template <typename P>
StackUse MeasureHandlerStackUse(bool stackless) {
  auto* use = static_cast<StackUse*>(mmap(nullptr, sizeof(StackUse),
                                          PROT_READ | PROT_WRITE,
                                          MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (use == MAP_FAILED) return {};
  *use = StackUse{};
  const int rc = safety::RunInChild(
      [use, stackless] {
        Options options;
        options.write_output = false;
        options.cpu_period = absl::Hours(1);  // only the signal sent here
        options.wall_period = absl::ZeroDuration();
        P profiler(options);
        if (!profiler.Start().ok()) return 1;
        if constexpr (std::is_same_v<typename P::unwinder_type, DwarfUnwinder>) {
          // Tables are built on the collector after Start.
          for (int i = 0; i < 2000 && !DwarfUnwinder::TablesReady(); ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
          }
          if (!DwarfUnwinder::TablesReady()) return 2;
        }
        if (!safety::WrapInprofHandler(&MeasuringWrapper)) return 3;
        void* stack = mmap(nullptr, kMeasureStack, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (stack == MAP_FAILED) return 4;
        Measured measured{reinterpret_cast<uintptr_t>(stack), use};
        g_measured = &measured;
        struct Args {
          P* profiler;
          bool stackless;
          void* stack;
        } args{&profiler, stackless, stack};
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        // Its own stack is the measured one, or a normal one that
        // switches to the measured one.
        if (!stackless) pthread_attr_setstack(&attr, stack, kMeasureStack);
        pthread_t thread;
        if (pthread_create(
                &thread, &attr,
                [](void* p) -> void* {
                  auto* a = static_cast<Args*>(p);
                  auto registration = a->profiler->RegisterThread("measured");
                  if (!a->stackless) {
                    SignalAndMeasure();
                    return nullptr;
                  }
                  ucontext_t main_context, coroutine;
                  getcontext(&coroutine);
                  coroutine.uc_stack.ss_sp = a->stack;
                  coroutine.uc_stack.ss_size = kMeasureStack;
                  coroutine.uc_link = &main_context;
                  makecontext(&coroutine, &SignalAndMeasure, 0);
                  swapcontext(&main_context, &coroutine);
                  return nullptr;
                },
                &args) != 0) {
          return 5;
        }
        pthread_join(thread, nullptr);
        pthread_attr_destroy(&attr);
        safety::UnwrapInprofHandler();
        return profiler.Stop().ok() ? 0 : 6;
      },
      60);
  EXPECT_EQ(rc, 0);
  const StackUse result = *use;
  munmap(use, sizeof(StackUse));
  return result;
}

template <typename P>
void ExpectHandlerStackUseWithinBound(const char* name) {
  // The signal was sampled with its walk, not skipped. (The CPU timer's
  // first sample, within the thread's first millisecond of CPU, may come
  // too: it lands higher on the stack, above the deepest point measured.)
  const StackUse walk = MeasureHandlerStackUse<P>(/*stackless=*/false);
  EXPECT_GE(walk.taken, 1u);
  EXPECT_EQ(walk.skipped, 0u);
  const StackUse stackless = MeasureHandlerStackUse<P>(/*stackless=*/true);
  EXPECT_GE(stackless.taken, 1u);
  EXPECT_GE(stackless.skipped, 1u);
  std::printf(
      "%s: the handler used %zu bytes below its first frame (%zu with the "
      "kernel's signal frame); bound checked: %zu. Without the walk (on a "
      "coroutine's stack): %zu bytes (%zu)\n",
      name, walk.handler, walk.total, P::kHandlerStackBytes, stackless.handler,
      stackless.total);
  EXPECT_GT(walk.handler, 0u);
  EXPECT_LE(walk.handler, P::kHandlerStackBytes);
  // What runs on a small stack: the first-level handler, the provider's
  // clock read and a record of a few words (ASan at -O0, with its
  // interceptors: 3.5 KiB).
  EXPECT_GT(stackless.handler, 0u);
  EXPECT_LE(stackless.handler, safety::kSanitized ? 8192u : 1024u);
}

TEST(SafetySmallStackTest, FramePointerHandlerStackUseIsWithinItsBound) {
  if (safety::kTsan) GTEST_SKIP() << kTsanHandlerElsewhere;
  ExpectHandlerStackUseWithinBound<safety::ProbedProfilerOf<FramePointerUnwinder>>(
      "frame-pointer");
}

TEST(SafetySmallStackTest, DwarfHandlerStackUseIsWithinItsBound) {
  if (safety::kTsan) GTEST_SKIP() << kTsanHandlerElsewhere;
  ExpectHandlerStackUseWithinBound<safety::ProbedProfilerOf<DwarfUnwinder>>("dwarf");
}

}  // namespace
}  // namespace inprof
