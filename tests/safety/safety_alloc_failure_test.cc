// Safety when an allocation of inprof's fails on the host's own thread.
// RegisterThread, ThreadRegistration::Reset and Stop() run on the
// program's threads and allocate (the thread's name, the registry's table,
// a slot, the drain of its last samples, the lines that say an arming
// failed, the profile). With the heap exhausted an allocation throws
// std::bad_alloc; one that escaped would end the program (a std::thread's
// body, a destructor: ScopedProfiler stops the profiler in one) in
// std::terminate, and one caught half-way would leave a thread half
// registered: a slot in the registry for a thread that is gone, a timer or
// a perf event armed for it, a TLS pointer that makes its next
// registration fail, a table of the aggregate corrupt.
//
// The test replaces operator new with one that fails on demand: from
// Inject(k), the k-th allocation of this thread throws, and (a full heap)
// every later one until StopInjecting(). Each allocation point of a
// registration, an unregistration and Stop() is failed in turn (k = 1, 2,
// ... until calls stop reaching k), each in a forked child with a profiler
// of its own. Deterministic for a registration and Stop(); an
// unregistration's drain allocates as many times as its thread's samples
// need, so there the points are tried up to 40 whatever happens.
//
// What must hold at each point: the host runs on; a registration that
// failed says ResourceExhausted and is counted in
// ProfilerStats::registrations_without_memory; the thread registers again
// at once and is profiled; a Stop() that failed stops, and the profiler
// starts again; once it is gone no POSIX timer or descriptor of inprof's
// is left, and the thread that registered again has its CPU in the
// profile under its name.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "inprof/inprof.h"
#include "inprof/pprof_reader.h"
#include "safety/safety_util.h"
#include "util/test_util.h"

namespace {

// This thread's operator new calls counted since Inject(); the `fail_at`-th
// and every later one throw while injecting.
thread_local int64_t t_fail_at = 0;  // 0: not injecting
thread_local int64_t t_count = 0;
thread_local int64_t t_failed = 0;

void Inject(int64_t fail_at) {
  t_count = 0;
  t_failed = 0;
  t_fail_at = fail_at;
}

// Stops failing; how many allocations failed since Inject().
int64_t StopInjecting() {
  t_fail_at = 0;
  return t_failed;
}

}  // namespace

// noinline: once inlined, GCC's -Wmismatched-new-delete sees free() on a
// pointer from operator new and (wrongly) rejects the pair.
__attribute__((noinline)) void* operator new(size_t size) {
  if (t_fail_at > 0 && ++t_count >= t_fail_at) {
    ++t_failed;
    throw std::bad_alloc();
  }
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
__attribute__((noinline)) void operator delete(void* p) noexcept { std::free(p); }
__attribute__((noinline)) void operator delete(void* p, size_t) noexcept { std::free(p); }
// The other forms too: a sanitizer's runtime defines each form, and
// memory from its new[] freed by this delete reads as a mismatch.
__attribute__((noinline)) void* operator new[](size_t size) { return ::operator new(size); }
__attribute__((noinline)) void* operator new(size_t size, const std::nothrow_t&) noexcept {
  try {
    return ::operator new(size);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
__attribute__((noinline)) void* operator new[](size_t size, const std::nothrow_t&) noexcept {
  return ::operator new(size, std::nothrow);
}
__attribute__((noinline)) void operator delete[](void* p) noexcept { std::free(p); }
__attribute__((noinline)) void operator delete[](void* p, size_t) noexcept { std::free(p); }
__attribute__((noinline)) void operator delete(void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}
__attribute__((noinline)) void operator delete[](void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}

namespace inprof {
namespace {

// Longer than a string's inline buffer: copying it allocates.
constexpr char kLongName[] = "a thread registered while the heap is exhausted";
constexpr int64_t kMaxPoints = 300;

// 3 ms of this thread's CPU under `depth` frames: a stack the profile has
// not seen yet for each depth, so the drain of its samples allocates.
__attribute__((noinline)) uint64_t BurnAt(int depth, uint64_t x) {
  if (depth > 0) {
    x = BurnAt(depth - 1, x + 1);
    asm volatile("" : "+r"(x) : : "memory");
    return x;
  }
  const int64_t end = testing::ThreadCpuNow() + 3'000'000;
  while (testing::ThreadCpuNow() < end) {
    for (int i = 0; i < 1000; ++i) x = x * 6364136223846793005ULL + 1;
  }
  return x;
}

// Which call fails (the thread's registration or unregistration, or
// Stop() on the main thread), and whether a thread registered and
// unregistered first (its slot then comes from the pool, the registry's
// table has room) or this is the process's first registration.
enum class Phase { kRegister, kUnregister, kStop };

// Exit codes of a scenario's child.
enum Result {
  kFailedAndSurvived = 0,  // the k-th allocation failed; all held
  kNothingFailed = 2,      // the call made fewer than k allocations (not 1: a
                           // sanitizer's report exits 1)
  kStartFailed = 10,
  kWrongStatus,      // a refused registration did not say ResourceExhausted
  kStillActive,      // a registration is active after Reset()
  kCannotRegister,   // the thread could not register again afterwards
  kMiscounted,       // registrations_without_memory is off
  kStopFailed,
  kTimerLeft,        // a POSIX timer outlived the profiler
  kDescriptorLeft,   // a descriptor outlived the profiler
  kNotInProfile,     // the thread's second registration is not in the profile
};

const char* Explain(int rc) {
  switch (rc) {
    case kStartFailed: return "Start() failed";
    case kWrongStatus: return "a refused registration did not say ResourceExhausted";
    case kStillActive: return "the registration is still active after Reset()";
    case kCannotRegister: return "the thread could not register again";
    case kMiscounted: return "registrations_without_memory is off";
    case kStopFailed: return "Stop() failed";
    case kTimerLeft: return "a POSIX timer outlived the profiler";
    case kDescriptorLeft: return "a descriptor outlived the profiler";
    case kNotInProfile: return "the thread's second registration is not in the profile";
    case 128 + SIGABRT: return "aborted (std::terminate: a bad_alloc escaped?)";
    case 128 + SIGSEGV: return "SIGSEGV";
    case 128 + SIGALRM: return "hung";
    default: return "see the exit code";
  }
}

// In a forked child: a profiler with every provider of the default
// composition (CPU and wall time at 1 ms, allocations at period 1), one
// thread whose registration or unregistration meets a heap exhausted from
// its `k`-th allocation, which then registers again and works.
template <typename P = DefaultProfiler>
int Scenario(Phase phase, bool warm, int64_t k) {
  const int timers_before = safety::CountPosixTimers();
  const int fds_before = safety::CountFds();
  Options options;
  options.output = testing::FreshTestDir(absl::StrCat("safety_alloc_failure_", getpid())) +
                   "/profile.pb.gz";
  options.cpu_period = absl::Milliseconds(1);
  options.wall_period = absl::Milliseconds(1);
  options.alloc_period = 1;  // the thread's own allocations sampled too
  int result = kFailedAndSurvived;
  {
    P profiler(options);
    if (!profiler.Start().ok()) return kStartFailed;
    if (warm) {
      std::thread([&] {
        ThreadRegistration r = profiler.RegisterThread(kLongName);
        BurnAt(1, 0);
      }).join();
    }
    int64_t failed = 0;
    bool refused = false;
    std::thread([&] {
      if (phase == Phase::kRegister) Inject(k);
      ThreadRegistration r = profiler.RegisterThread(kLongName);
      if (phase == Phase::kRegister) failed = StopInjecting();
      if (!r.active()) {
        refused = true;
        if (r.status().code() != absl::StatusCode::kResourceExhausted) {
          result = kWrongStatus;
          return;
        }
      }
      BurnAt(static_cast<int>(k % 64) + 2, 0);
      if (phase == Phase::kUnregister) Inject(k);
      r.Reset();
      if (phase == Phase::kUnregister) failed = StopInjecting();
      if (r.active()) {
        result = kStillActive;
        return;
      }
      ThreadRegistration again = profiler.RegisterThread("again");
      if (!again.active()) {
        result = kCannotRegister;
        return;
      }
      BurnAt(1, 0);
    }).join();
    if (result != kFailedAndSurvived) return result;
    // A refused registration is counted; an unregistration that lost the
    // thread's last samples is counted too.
    const uint64_t counted = profiler.stats().registrations_without_memory;
    if (phase == Phase::kRegister ? counted != (refused ? 1u : 0u) : counted > 1) {
      std::fprintf(stderr, "registrations_without_memory=%llu\n",
                   static_cast<unsigned long long>(counted));
      return kMiscounted;
    }
    if (phase == Phase::kStop) Inject(k);
    const absl::Status stopped = profiler.Stop();
    if (phase == Phase::kStop) failed = StopInjecting();
    // A Stop() that met the exhausted heap stops anyway, and may not have
    // written the profile (it says so); the profiler starts again, and
    // that session's profile holds a thread's CPU.
    if (!stopped.ok() && !(phase == Phase::kStop && failed > 0 &&
                           stopped.code() == absl::StatusCode::kResourceExhausted)) {
      return kStopFailed;
    }
    if (phase == Phase::kStop) {
      if (!profiler.Start().ok()) return kStartFailed;
      std::thread([&] {
        ThreadRegistration again = profiler.RegisterThread("again");
        BurnAt(1, 0);
      }).join();
      if (!profiler.Stop().ok()) return kStopFailed;
    }
    if (failed == 0) result = kNothingFailed;
  }
  // Nothing armed for a thread outlives the profiler.
  if (safety::CountPosixTimers() != timers_before) return kTimerLeft;
  if (safety::CountFds() != fds_before) return kDescriptorLeft;
  // The second registration is in the profile under its name: all the CPU
  // it burned while registered (3 ms) is credited there (its samples, and
  // the tail of its account taken when it leaves: deterministic).
  absl::StatusOr<DecodedProfile> profile = ReadPprofFile(options.output);
  if (!profile.ok()) return kNotInProfile;
  const auto by_thread = profile->ByLabel("thread name", profile->ValueIndex("cpu-time"));
  auto it = by_thread.find("again");
  if (it == by_thread.end() || it->second < 3'000'000) return kNotInProfile;
  return result;
}

// Fails the `k`-th allocation for k = 1, 2, ... (at least to `at_least`)
// until three calls in a row made fewer than k (one may have made fewer by
// chance: the registry lock taken by the sampler sends an unregistration
// down a path that does not drain); the last point that failed.
template <typename P = DefaultProfiler>
int64_t FailEachPoint(Phase phase, bool warm, const char* what, int64_t at_least = 0) {
  int64_t points = 0;
  int quiet = 0;
  // Under a sanitizer (5-15x slower), past the first 40 points every 8th.
  for (int64_t k = 1; k <= kMaxPoints && (quiet < 3 || k <= at_least);
       k += (k < 40 || !safety::kSanitized) ? 1 : 8) {
    const int rc = safety::RunInChild([&] { return Scenario<P>(phase, warm, k); }, 60);
    if (rc == kNothingFailed) {
      ++quiet;
      continue;
    }
    EXPECT_EQ(rc, kFailedAndSurvived)
        << what << ", allocation " << k << " and later failing: " << Explain(rc);
    if (rc != kFailedAndSurvived) break;
    quiet = 0;
    points = k;
  }
  std::fprintf(stderr, "%s: allocation points failed in turn up to the %lld-th\n", what,
               static_cast<long long>(points));
  return points;
}

TEST(SafetyAllocFailureTest, EachAllocationOfAThreadsRegistrationMayFail) {
  // The process's first registration (a new slot, the registry's table
  // grown) and one after a thread left (a pooled slot).
  EXPECT_GT(FailEachPoint(Phase::kRegister, /*warm=*/false, "a first registration"), 0);
  FailEachPoint(Phase::kRegister, /*warm=*/true, "a registration with a pooled slot");
}

// A provider that cannot arm any thread, and says so in a message made on
// the heap: a registration that meets the exhausted heap there has armed
// the providers before it (CPU time's timer or perf event, wall time), and
// must undo them.
struct RefusingProvider {
  static constexpr const char* kName = "refusing";
  static constexpr std::array<SampleTypeSpec, 1> kSampleTypes{{{"refused", "count"}}};
  static constexpr size_t kPeriodTypeIndex = 0;
  struct ThreadData {};
  absl::Status Configure(const Options&) { return absl::OkStatus(); }
  int64_t Period() const { return 1; }
  absl::Status ArmThread(ThreadContext&, ThreadData&, int) {
    return absl::UnavailableError(absl::StrCat(kLongName, ": this provider arms no thread"));
  }
  void DisarmThread(ThreadContext&, ThreadData&) noexcept {}
  static bool OnSignal(ThreadContext&, ThreadData&, const siginfo_t&,
                       std::span<int64_t>) noexcept {
    return false;
  }
};
static_assert(SampleProvider<RefusingProvider>);
using RefusingProfiler = Profiler<FramePointerUnwinder, DefaultSampleRing, CpuTimeProvider,
                                  WallTimeProvider, RefusingProvider>;

TEST(SafetyAllocFailureTest, EachAllocationOfAnArmingThatFailsMayFail) {
  // A pooled slot: the registration's first allocations are the arming's.
  EXPECT_GT(FailEachPoint<RefusingProfiler>(Phase::kRegister, /*warm=*/true,
                                            "a registration whose arming fails"),
            0);
}

TEST(SafetyAllocFailureTest, EachAllocationOfStopMayFail) {
  // Stop() drains every thread, takes their tails and writes the profile
  // on the caller's thread; ScopedProfiler calls it from a destructor.
  EXPECT_GT(FailEachPoint(Phase::kStop, /*warm=*/false, "Stop()", 40), 0);
}

TEST(SafetyAllocFailureTest, EachAllocationOfAThreadsUnregistrationMayFail) {
  // The drain of the thread's last samples meets stacks the profile has
  // not seen: it allocates.
  EXPECT_GT(FailEachPoint(Phase::kUnregister, /*warm=*/false, "an unregistration", 40), 0);
}

// In a forked child: a thread dump (the live endpoint's /debug/pprof/
// goroutine) that meets a heap exhausted from its `k`-th allocation, with a
// waiting thread (read from a copy of its stack) and a running one
// (signalled: its handler writes into the dump's room). The dump fails or
// not; then the running thread unregisters (one left marked as being
// visited waited for ever there: SIGALRM), the waiting one is dumped whole
// again, and the profiler stops.
enum DumpResult { kDumpFine = 0, kDumpNothingFailed = 2, kDumpStartFailed = 10,
                  kDumpAgainFailed, kDumpAgainIncomplete, kDumpStopFailed };

int DumpScenario(int64_t k) {
  Options options;
  options.output = testing::FreshTestDir(absl::StrCat("safety_alloc_failure_dump_", getpid())) +
                   "/profile.pb.gz";
  DefaultProfiler profiler(options);
  if (!profiler.Start().ok()) return kDumpStartFailed;
  std::mutex mutex;
  std::condition_variable cv;
  bool stop = false;
  std::atomic<bool> running_stop{false};
  std::atomic<int> registered{0};
  std::thread waiter([&] {
    ThreadRegistration r = profiler.RegisterThread(kLongName);
    registered.fetch_add(1);
    std::unique_lock<std::mutex> lock(mutex);
    cv.wait(lock, [&] { return stop; });
  });
  std::atomic<bool> runner_done{false};
  std::thread runner([&] {
    {
      ThreadRegistration r = profiler.RegisterThread("runner");
      registered.fetch_add(1);
      uint64_t x = 0;
      while (!running_stop.load()) x = BurnAt(1, x);
      asm volatile("" : : "r"(x) : "memory");
    }
    runner_done.store(true);
  });
  while (registered.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the waiter waits
  Inject(k);
  try {
    absl::StatusOr<ProfileData> first = profiler.DumpThreads(absl::Milliseconds(500));
    (void)first;
  } catch (const std::bad_alloc&) {
    // Thrown to the caller (the endpoint's request fails); the host runs on.
  }
  const int64_t failed = StopInjecting();
  int result = failed == 0 ? kDumpNothingFailed : kDumpFine;
  // The running thread unregisters while the registry lock is taken, so
  // that it queues its slot without the lock: it waited for ever there on
  // the mark the failed dump left.
  {
    std::lock_guard<std::mutex> held(profiler.registry_mutex_for_testing());
    running_stop.store(true);
    for (int i = 0; i < 1000 && !runner_done.load(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  runner.join();
  // The waiting thread is dumped whole again.
  absl::StatusOr<ProfileData> again = profiler.DumpThreads(absl::Seconds(5));
  if (!again.ok()) {
    result = kDumpAgainFailed;
  } else {
    int whole = 0;
    for (const ProfileSample& sample : again->samples) {
      if (again->threads[sample.thread].name == kLongName && !sample.frames.empty()) ++whole;
    }
    if (whole != 1) result = kDumpAgainIncomplete;
  }
  {
    std::lock_guard<std::mutex> lock(mutex);
    stop = true;
  }
  cv.notify_all();
  waiter.join();
  if (!profiler.Stop().ok()) return kDumpStopFailed;
  return result;
}

TEST(SafetyAllocFailureTest, EachAllocationOfAThreadDumpMayFail) {
  int64_t points = 0;
  int quiet = 0;
  for (int64_t k = 1; k <= kMaxPoints && quiet < 3; k += (k < 40 || !safety::kSanitized) ? 1 : 8) {
    const int rc = safety::RunInChild([&] { return DumpScenario(k); }, 30);
    if (rc == kDumpNothingFailed) {
      ++quiet;
      continue;
    }
    EXPECT_EQ(rc, kDumpFine) << "a thread dump, allocation " << k << " and later failing: "
                             << (rc == kDumpAgainFailed       ? "the next dump failed"
                                 : rc == kDumpAgainIncomplete ? "the next dump lacked a thread's stack"
                                 : rc == kDumpStopFailed      ? "Stop() failed"
                                                              : Explain(rc));
    if (rc != kDumpFine) break;
    quiet = 0;
    points = k;
  }
  std::fprintf(stderr, "a thread dump: allocation points failed in turn up to the %lld-th\n",
               static_cast<long long>(points));
  EXPECT_GT(points, 0);
}

}  // namespace
}  // namespace inprof
