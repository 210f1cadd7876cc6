// Safety of the profiling signal handler on the interrupted thread:
//   - errno is never changed under the handler, at the fastest CPU period and
//     under a stream of samples, and also when the sampling code itself
//     fails a call and sets errno;
//   - frame pointers that are corrupt in a real running thread (unmapped, a
//     PROT_NONE page, a cycle, misaligned, into the heap, garbage, the stack's
//     top edge) end the walk as "truncated" and never fault.
//
// Corrupt frame pointers are set with inline asm around a register-only loop
// (for timer samples) and around the rt_tgsigqueueinfo syscall that sends
// this thread a tagged profiling signal (so every such sample sees the bad
// rbp, deterministically); rbp is restored afterwards. x86-64 only.
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inprof/inprof.h"
#include "inprof/pprof_reader.h"
#include "safety/safety_util.h"
#include "util/test_util.h"

namespace inprof {
namespace {

Options SafetyOptions(const std::string& name) {
  Options options;
  options.output = testing::TestTmpDir() + "/safety_" + name + ".pb.gz";
  options.cpu_period = absl::Milliseconds(1);
  std::remove(options.output.c_str());
  return options;
}

uint64_t SlotTaken() {
  return internal::CurrentThreadSlot()->samples_taken.load();
}
uint64_t SlotTruncated() {
  return internal::CurrentThreadSlot()->samples_truncated.load();
}

// --- errno ------------------------------------------------------------------

// Spins for about `iterations` rounds of arithmetic (no calls, so nothing
// but a signal handler could touch errno) and returns errno afterwards.
__attribute__((noinline)) int SpinAndReadErrno(volatile int* err, int sentinel,
                                               uint64_t iterations) {
  *err = sentinel;
  uint64_t x = iterations;
  for (uint64_t i = 0; i < iterations; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    asm volatile("" : "+r"(x));
  }
  return *err;
}

TEST(SafetyHandlerTest, ErrnoIsNeverChangedUnderSampling) {
  // CI: 2 threads x 40 spins of ~25 ms at the 1 ms period (~2 s of CPU);
  // the full run does 10x. Plus 20,000 self-signals checked one by one.
  const int spins = static_cast<int>(safety::Scaled(40, 400));
  const int self_signals = static_cast<int>(safety::Scaled(20'000, 200'000));
  safety::ProbedProfiler profiler(SafetyOptions("errno"));
  ASSERT_TRUE(profiler.Start().ok());
  std::atomic<int> changed{0};
  std::atomic<uint64_t> samples{0};
  auto body = [&](int sentinel) {
    auto registration = profiler.RegisterThread("errno");
    const uint64_t before = SlotTaken();
    volatile int* err = &errno;
    for (int i = 0; i < spins; ++i) {
      if (SpinAndReadErrno(err, sentinel + i, 25'000'000) != sentinel + i) {
        ++changed;
      }
    }
    const pid_t tid = safety::Gettid();
    for (int i = 0; i < self_signals; ++i) {
      *err = sentinel - i;
      // syscall() leaves errno alone when the call succeeds.
      if (!safety::SendProfilingSignal(tid, true)) ++changed;
      if (*err != sentinel - i) ++changed;
    }
    samples += SlotTaken() - before;
  };
  std::thread a(body, 100'000), b(body, 200'000);
  a.join();
  b.join();
  ASSERT_TRUE(profiler.Stop().ok());
  EXPECT_EQ(changed.load(), 0);
  // The spins alone yield a sample every tick (4 ms at HZ=250); TSan
  // delivers timer signals late, at its next interceptor call.
  EXPECT_GE(samples.load(), 2u * self_signals + (safety::kTsan ? 0u : 20u));
  std::printf("safety_errno: %llu samples on the checking threads, errno "
              "changed %d times\n",
              static_cast<unsigned long long>(samples.load()), changed.load());
}

// A provider whose sampling code fails a call and leaves errno set, as a
// clock read of an exited thread would: the handler must restore errno.
struct ErrnoClobberingProvider {
  static constexpr const char* kName = "errno-clobber";
  static constexpr std::array<SampleTypeSpec, 1> kSampleTypes{
      {{"clobbers", "count"}}};
  static constexpr size_t kPeriodTypeIndex = 0;
  struct ThreadData {};
  absl::Status Configure(const Options&) { return absl::OkStatus(); }
  int64_t Period() const { return 1; }
  // Signals are sent by the test (tagged), not by a timer.
  absl::Status ArmThread(ThreadContext&, ThreadData&, int) {
    return absl::OkStatus();
  }
  void DisarmThread(ThreadContext&, ThreadData&) noexcept {}
  static bool OnSignal(ThreadContext&, ThreadData&, const siginfo_t&,
                       std::span<int64_t> values) noexcept {
    timespec ts;
    clock_gettime(static_cast<clockid_t>(-1000), &ts);  // EINVAL
    values[0] = 1;
    return true;
  }
};
static_assert(SampleProvider<ErrnoClobberingProvider>);

TEST(SafetyHandlerTest, ErrnoIsRestoredWhenSamplingCodeSetsIt) {
  using ClobberProfiler = Profiler<FramePointerUnwinder, SpscRecordRing<4096>,
                                   ErrnoClobberingProvider>;
  ClobberProfiler profiler(SafetyOptions("errno_clobber"));
  ASSERT_TRUE(profiler.Start().ok());
  auto self = profiler.RegisterThread("main");
  ASSERT_TRUE(self.active());
  const uint64_t before = SlotTaken();
  const pid_t tid = safety::Gettid();
  int changed = 0;
  constexpr int kSignals = 1'000;
  for (int i = 0; i < kSignals; ++i) {
    errno = 4242 + i;
    ASSERT_TRUE(safety::SendProfilingSignal(tid, true, /*provider=*/0));
    changed += errno != 4242 + i;
  }
  const uint64_t taken = SlotTaken() - before;
  self.Reset();
  ASSERT_TRUE(profiler.Stop().ok());
  EXPECT_EQ(taken, static_cast<uint64_t>(kSignals));
  EXPECT_EQ(changed, 0);
}

// --- corrupt frame pointers ------------------------------------------------

#if defined(__x86_64__)
// Runs `iterations` rounds of a register-only loop with rbp = fp, then sends
// this thread `signals` tagged profiling signals, each from a syscall made
// with rbp = fp. rbp is saved in r12 and restored.
// A return address inside RunWithFramePointer's body, where its call-frame
// information says CFA = rbp + 16 (set by its first call). The fake frame
// records below return there. (&RunWithFramePointer + 4, used before, is
// right after `mov %rsp,%rbp`: a CFI walk looks a return address up at
// pc - 1, inside the prologue, where the CFA is rsp-based, so the walk left
// the fake cycle and went on through whatever the stack above held --
// "two-frame cycle: truncated=0", deterministic for a given stack layout.)
uintptr_t g_body_return_address = 0;

__attribute__((noinline)) void RunWithFramePointer(uintptr_t fp,
                                                   uint64_t iterations,
                                                   int signals) {
  uintptr_t here;
  asm volatile("lea 0(%%rip), %0" : "=r"(here));
  g_body_return_address = here;
  if (iterations > 0) {
    asm volatile(
        "mov %%rbp, %%r12\n\t"
        "mov %[fp], %%rbp\n\t"
        "1:\n\t"
        "sub $1, %[n]\n\t"
        "jnz 1b\n\t"
        "mov %%r12, %%rbp\n\t"
        : [n] "+r"(iterations)
        : [fp] "r"(fp)
        : "r12", "cc");
  }
  siginfo_t info;
  std::memset(&info, 0, sizeof(info));
  info.si_signo = SIGPROF;
  info.si_code = SI_QUEUE;
  info.si_pid = getpid();
  info.si_uid = getuid();
  info.si_value.sival_int = internal::MakeSignalTag(safety::kProbeProvider);
  const long pid = getpid();
  const long tid = safety::Gettid();
  // Each signal is sent again (100 tries at most) until the probe sampled
  // it: one sent while the CPU timer's SIGPROF is pending is discarded by
  // the kernel and the timer's handled in its place (a standard signal;
  // safety::SendProbeSignalToSelf). That cost one case 499 of 500 in a
  // clean-clone run. The handler runs before the system call returns.
  for (int i = 0; i < signals; ++i) {
    for (int tries = 0; tries < 100; ++tries) {
      const uint64_t before =
          safety::ProbeProvider::signals_taken.load(std::memory_order_relaxed);
      long ret;
      register long r10 asm("r10") = reinterpret_cast<long>(&info);
      asm volatile(
          "mov %%rbp, %%r12\n\t"
          "mov %[fp], %%rbp\n\t"
          "syscall\n\t"
          "mov %%r12, %%rbp\n\t"
          : "=a"(ret)
          : "0"(static_cast<long>(SYS_rt_tgsigqueueinfo)), "D"(pid), "S"(tid),
            "d"(static_cast<long>(SIGPROF)), "r"(r10), [fp] "r"(fp)
          : "rcx", "r11", "r12", "memory", "cc");
      if (ret != 0) std::abort();
      if (safety::ProbeProvider::signals_taken.load(std::memory_order_relaxed) != before) {
        break;
      }
    }
  }
}
constexpr bool kCanCorruptRbp = true;
#else
uintptr_t g_body_return_address = 0;
void RunWithFramePointer(uintptr_t, uint64_t, int) {}
constexpr bool kCanCorruptRbp = false;
#endif

struct BadFramePointer {
  std::string what;
  uintptr_t fp;
  bool truncated;  // what the walk must report
};

struct CorruptRun {
  uint64_t taken = 0;
  uint64_t truncated = 0;
};

// On the calling (registered) thread: spin with `bad.fp`, then take
// `signals` samples with it.
CorruptRun RunCase(const BadFramePointer& bad, int signals) {
  const uint64_t taken0 = SlotTaken(), truncated0 = SlotTruncated();
  // ~30 ms of loop, under the 1 ms CPU timer (about 7 timer samples).
  RunWithFramePointer(bad.fp, 60'000'000, 0);
  const uint64_t taken1 = SlotTaken(), truncated1 = SlotTruncated();
  RunWithFramePointer(bad.fp, 0, signals);
  CorruptRun r;
  r.taken = SlotTaken() - taken1;
  r.truncated = SlotTruncated() - truncated1;
  (void)taken0;
  (void)truncated0;
  return r;
}

// With `P`'s unwinder. rbp = 0 ends a frame-pointer walk as the outermost
// frame (not truncated); for the CFI walk it is a corrupt CFA base
// (RunWithFramePointer's CFA is rbp + 16), so truncated.
template <typename P>
void CheckCorruptFramePointers(const std::string& name, bool zero_truncates) {
  constexpr int kSignals = 500;  // per case; CI and full run alike
  Options options = SafetyOptions("corrupt_fp_" + name);
  P profiler(options);
  ASSERT_TRUE(profiler.Start().ok());

  const long page = sysconf(_SC_PAGESIZE);
  // An address that was mapped and is not any more.
  void* gone = mmap(nullptr, page, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(gone, MAP_FAILED);
  ASSERT_EQ(munmap(gone, page), 0);
  // A PROT_NONE page.
  void* none = mmap(nullptr, page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(none, MAP_FAILED);
  // Heap words that look like a frame chain pointing at itself.
  std::vector<uintptr_t> heap(64);
  for (auto& w : heap) w = reinterpret_cast<uintptr_t>(heap.data());

  std::vector<std::string> failures;
  uint64_t total_truncated = 0, total_signals = 0;
  std::thread worker([&] {
    auto registration = profiler.RegisterThread("corrupt");
    ASSERT_TRUE(registration.active());
    const StackBounds bounds = internal::CurrentThreadSlot()->stack;
    // Frame records in this frame, above the callee's stack pointer.
    RunWithFramePointer(0, 0, 0);  // sets g_body_return_address
    alignas(16) uintptr_t self_cycle[2];
    self_cycle[0] = reinterpret_cast<uintptr_t>(&self_cycle[0]);
    self_cycle[1] = g_body_return_address;
    alignas(16) uintptr_t two_cycle[4];
    two_cycle[0] = reinterpret_cast<uintptr_t>(&two_cycle[2]);
    two_cycle[1] = self_cycle[1];
    two_cycle[2] = reinterpret_cast<uintptr_t>(&two_cycle[0]);
    two_cycle[3] = self_cycle[1];
    alignas(16) uintptr_t garbage[2] = {0xdeadbeefdeadbee8ULL, self_cycle[1]};
    alignas(16) uintptr_t to_unmapped[2] = {reinterpret_cast<uintptr_t>(gone),
                                            self_cycle[1]};
    asm volatile("" ::"r"(self_cycle), "r"(two_cycle), "r"(garbage),
                 "r"(to_unmapped)
                 : "memory");
    const std::vector<BadFramePointer> cases = {
        {"unmapped page", reinterpret_cast<uintptr_t>(gone), true},
        {"PROT_NONE page", reinterpret_cast<uintptr_t>(none), true},
        {"kernel address", 0xffffffff81000000ULL, true},
        {"non-canonical", 0x8000000000000000ULL, true},
        {"small integer", 0x1000, true},
        {"itself (cycle)", reinterpret_cast<uintptr_t>(&self_cycle[0]), true},
        {"two-frame cycle", reinterpret_cast<uintptr_t>(&two_cycle[0]), true},
        {"misaligned", reinterpret_cast<uintptr_t>(&self_cycle[0]) + 3, true},
        {"into the heap", reinterpret_cast<uintptr_t>(heap.data()), true},
        {"garbage next frame", reinterpret_cast<uintptr_t>(&garbage[0]), true},
        {"next frame unmapped", reinterpret_cast<uintptr_t>(&to_unmapped[0]),
         true},
        {"top edge of the stack", bounds.hi - 8, true},
        {"stack top", bounds.hi, true},
        {"zero (outermost frame)", 0, zero_truncates},
    };
    for (const BadFramePointer& c : cases) {
      const CorruptRun r = RunCase(c, kSignals);
      total_signals += kSignals;
      total_truncated += r.truncated;
      std::printf("safety_corrupt_fp(%s): %-24s samples=%llu truncated=%llu\n",
                  name.c_str(), c.what.c_str(), static_cast<unsigned long long>(r.taken),
                  static_cast<unsigned long long>(r.truncated));
      if (r.taken < static_cast<uint64_t>(kSignals)) {
        failures.push_back(c.what + ": only " + std::to_string(r.taken) +
                           " samples");
      }
      const uint64_t want = c.truncated ? static_cast<uint64_t>(kSignals) : 0;
      if (c.truncated ? r.truncated < want : r.truncated != 0) {
        failures.push_back(c.what + ": truncated=" + std::to_string(r.truncated));
      }
    }
  });
  worker.join();
  ASSERT_TRUE(profiler.Stop().ok());
  munmap(none, page);
  EXPECT_THAT(failures, ::testing::IsEmpty());

  // The truncations are counted in the profile as users read it.
  const ProfilerStats stats = profiler.stats();
  EXPECT_GE(stats.stacks_truncated, total_truncated);
  auto profile = ReadPprofFile(options.output);
  ASSERT_TRUE(profile.ok()) << profile.status();
  bool found = false;
  for (const std::string& c : profile->comments) {
    found |= c.find("stacks truncated=" + std::to_string(stats.stacks_truncated)) !=
             std::string::npos;
  }
  EXPECT_TRUE(found) << "no 'stacks truncated=" << stats.stacks_truncated
                     << "' comment";
}

#define INPROF_SKIP_UNLESS_RBP_CAN_BE_CORRUPTED()                            \
  if (!kCanCorruptRbp) GTEST_SKIP() << "needs x86-64 inline asm";           \
  if (safety::kTsan) {                                                       \
    GTEST_SKIP() << "TSan defers asynchronous signals to its next "          \
                    "interceptor call, so the handler no longer runs while " \
                    "rbp is bad";                                            \
  }

TEST(SafetyHandlerTest, CorruptFramePointersAreTruncatedNeverFault) {
  INPROF_SKIP_UNLESS_RBP_CAN_BE_CORRUPTED();
  CheckCorruptFramePointers<safety::ProbedProfilerOf<FramePointerUnwinder>>(
      "frame-pointer",
                                                  /*zero_truncates=*/false);
}

TEST(SafetyHandlerTest, CorruptFramePointersUnderCfiAreTruncatedNeverFault) {
  INPROF_SKIP_UNLESS_RBP_CAN_BE_CORRUPTED();
  if (!DwarfUnwinder::Supported()) GTEST_SKIP() << "no CFI unwinder here";
  CheckCorruptFramePointers<safety::ProbedProfilerOf<DwarfUnwinder>>(
      "dwarf", /*zero_truncates=*/true);
}

// A thread on a stack the application allocated, with its own guard page
// inside the bounds the thread library reports: a frame pointer into that
// guard page lies below the stack pointer and is refused before any read.
TEST(SafetyHandlerTest, FramePointerIntoGuardPageOfApplicationStack) {
  if (!kCanCorruptRbp) GTEST_SKIP() << "needs x86-64 inline asm";
  if (safety::kTsan) GTEST_SKIP() << "TSan defers asynchronous signals";
  safety::ProbedProfiler profiler(SafetyOptions("guard_page"));
  ASSERT_TRUE(profiler.Start().ok());
  const long page = sysconf(_SC_PAGESIZE);
  const size_t size = 64 * page;
  void* stack = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(stack, MAP_FAILED);
  ASSERT_EQ(mprotect(stack, page, PROT_NONE), 0);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  ASSERT_EQ(pthread_attr_setstack(&attr, stack, size), 0);
  struct Args {
    safety::ProbedProfiler* profiler;
    uintptr_t guard;
    CorruptRun run;
    bool in_bounds = false;
  } args{&profiler, reinterpret_cast<uintptr_t>(stack) + 64, {}, false};
  pthread_t thread;
  ASSERT_EQ(pthread_create(
                &thread, &attr,
                [](void* p) -> void* {
                  auto* a = static_cast<Args*>(p);
                  auto registration = a->profiler->RegisterThread("app-stack");
                  a->in_bounds =
                      internal::CurrentThreadSlot()->stack.Contains(a->guard, 16);
                  a->run = RunCase({"guard page", a->guard, true}, 500);
                  return nullptr;
                },
                &args),
            0);
  pthread_join(thread, nullptr);
  pthread_attr_destroy(&attr);
  ASSERT_TRUE(profiler.Stop().ok());
  munmap(stack, size);
  EXPECT_TRUE(args.in_bounds) << "the guard page should lie inside the bounds";
  EXPECT_GE(args.run.taken, 500u);
  EXPECT_GE(args.run.truncated, 500u);
}

}  // namespace
}  // namespace inprof
