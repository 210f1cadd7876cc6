// Benchmarks for inprof/profiler.h: the cost of one whole sample (signal
// delivery, dispatch, the provider's clock read, the frame-pointer walk and
// the ring push), next to the cost of a bare signal delivered the same way,
// which is the floor any signal-based profiler pays.
#include "inprof/profiler.h"

#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <benchmark/benchmark.h>

#include <array>
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "inprof/inprof.h"
#include "inprof/internal/signal_dispatch.h"
#include "inprof/options.h"
#include "inprof/sample_provider.h"

namespace inprof {
namespace {

// Not the profiling signal, so the bare round trip never meets inprof's
// handler.
constexpr int kBareSignal = SIGUSR2;

std::atomic<uint64_t> g_bare_handled{0};

void EmptyHandler(int, siginfo_t*, void*) {
  g_bare_handled.fetch_add(1, std::memory_order_relaxed);
}

// Queues `signo` to the calling thread with si_code SI_QUEUE, which inprof's
// handler accepts like its timers' SI_TIMER. A signal sent to the running
// thread is delivered before the syscall returns, so the handler has run
// when this returns.
//
// This is pthread_sigqueue without its getpid() and getuid() syscalls and,
// more importantly, without its frame: glibc's pthread_sigqueue keeps the pid
// in rbp at the syscall, so a frame-pointer walk from there stops after one
// frame. glibc's syscall() leaves rbp alone, so the walk starts at our
// caller's frame, as it does for a timer signal landing in a leaf.
class SelfSignaler {
 public:
  explicit SelfSignaler(int value) : pid_(getpid()), tid_(gettid()) {
    std::memset(&info_, 0, sizeof(info_));
    info_.si_code = SI_QUEUE;
    info_.si_pid = pid_;
    info_.si_uid = getuid();
    info_.si_value.sival_int = value;
  }
  bool Send(int signo) {
    info_.si_signo = signo;
    return syscall(SYS_rt_tgsigqueueinfo, pid_, tid_, signo, &info_) == 0;
  }

 private:
  pid_t pid_;
  pid_t tid_;
  siginfo_t info_;
};

void BM_Signal_RoundTrip(benchmark::State& state) {
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_sigaction = &EmptyHandler;
  // The flags inprof installs its handler with.
  action.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&action.sa_mask);
  struct sigaction previous;
  if (sigaction(kBareSignal, &action, &previous) != 0) {
    state.SkipWithError("sigaction failed");
    return;
  }
  SelfSignaler signaler(0);
  const uint64_t before = g_bare_handled.load(std::memory_order_relaxed);
  for (auto _ : state) {
    if (!signaler.Send(kBareSignal)) {
      state.SkipWithError("rt_tgsigqueueinfo failed");
      break;
    }
  }
  const uint64_t handled =
      g_bare_handled.load(std::memory_order_relaxed) - before;
  sigaction(kBareSignal, &previous, nullptr);
  if (handled != static_cast<uint64_t>(state.iterations())) {
    state.SkipWithError("not every signal reached the handler");
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}
BENCHMARK(BM_Signal_RoundTrip);

// A provider that samples every signal sent with its tag. CpuTimeProvider
// samples only where the thread's CPU crossed one of its sample points, so
// signals sent with its tag record nothing (this benchmark reported "only 0
// samples for 10 signals" until it used this).
struct EverySignalProvider {
  static constexpr const char* kName = "every-signal";
  static constexpr std::array<SampleTypeSpec, 1> kSampleTypes{
      {{"signals", "count"}}};
  static constexpr size_t kPeriodTypeIndex = 0;
  struct ThreadData {};
  absl::Status Configure(const Options&) { return absl::OkStatus(); }
  int64_t Period() const { return 1; }
  absl::Status ArmThread(ThreadContext&, ThreadData&, int) { return absl::OkStatus(); }
  void DisarmThread(ThreadContext&, ThreadData&) noexcept {}
  static bool OnSignal(ThreadContext&, ThreadData&, const siginfo_t&,
                       std::span<int64_t> values) noexcept {
    values[0] = 1;
    return true;
  }
};
static_assert(SampleProvider<EverySignalProvider>);

// The sampling loop at the bottom of the recursion; every signal's walk
// covers the whole recursion. Signals carry provider `provider`'s tag.
__attribute__((noinline)) void SampleLoop(benchmark::State& state, int provider) {
  SelfSignaler signaler(internal::MakeSignalTag(provider));
  for (auto _ : state) {
    if (!signaler.Send(internal::kProfilingSignal)) {
      state.SkipWithError("rt_tgsigqueueinfo(SIGPROF) failed");
      break;
    }
  }
}

// The work after the call keeps it from becoming a tail call.
__attribute__((noinline)) int Recurse(benchmark::State& state, int remaining,
                                      int provider) {
  if (remaining == 0) {
    SampleLoop(state, provider);
  } else {
    Recurse(state, remaining - 1, provider);
  }
  benchmark::DoNotOptimize(remaining);
  return remaining;
}

// One whole sample per iteration with profiler type P, whose provider
// `provider` is an EverySignalProvider. Arg: extra stack depth in frames
// under the sampled code.
template <typename P>
void WholeSample(benchmark::State& state, int provider) {
  const int depth = static_cast<int>(state.range(0));
  Options options;
  options.enabled = true;
  options.output =
      absl::StrCat("/tmp/inprof_profiler_benchmark.", getpid(), ".pb.gz");
  // The CPU timer must never fire during the run: every sample here is one
  // we sent.
  options.cpu_period = absl::Hours(1);
  // The shortest drain interval keeps the 32 KiB ring from filling (a
  // full ring drops the record and skips the push, which is cheaper).
  options.collect_period = absl::Milliseconds(1);
  options.max_frames = 512;
  P profiler(options);
  if (absl::Status s = profiler.Start(); !s.ok()) {
    state.SkipWithError(std::string(s.message()).c_str());
    return;
  }
  ThreadRegistration registration = profiler.RegisterThread("benchmark");
  if (!registration.active()) {
    state.SkipWithError(
        absl::StrCat("RegisterThread: ", registration.status().message())
            .c_str());
    return;
  }
  benchmark::DoNotOptimize(Recurse(state, depth, provider));
  const absl::Status stopped = profiler.Stop();
  registration.Reset();
  unlink(options.output.c_str());
  if (!stopped.ok()) {
    state.SkipWithError(
        absl::StrCat("Stop: ", stopped.message()).c_str());
    return;
  }
  const ProfilerStats stats = profiler.stats();
  const auto iterations = static_cast<uint64_t>(state.iterations());
  // A few signals may be lost to nothing we know of; far fewer samples than
  // signals means the handler rejected them and the timing is meaningless.
  if (stats.samples_taken + iterations / 100 + 2 < iterations) {
    state.SkipWithError(absl::StrCat("only ", stats.samples_taken,
                                     " samples for ", iterations, " signals")
                            .c_str());
    return;
  }
  const double n = static_cast<double>(iterations);
  state.counters["taken_per_signal"] =
      static_cast<double>(stats.samples_taken) / n;
  state.counters["dropped_per_signal"] =
      static_cast<double>(stats.samples_dropped) / n;
  state.counters["truncated_per_signal"] =
      static_cast<double>(stats.stacks_truncated) / n;
  state.SetItemsProcessed(static_cast<int64_t>(iterations));
}
// The recommended composition, and a provider whose tag the signals carry:
// the handler runs CpuTimeProvider's and WallTimeProvider's handler-side
// folds as it does for a real sample. Signals come far faster here than any
// timer sends them (about one per 4 us against at most one per 1 ms of
// CPU), so its 32 KiB ring fills between drains and deeper stacks see drops
// (dropped_per_signal); a dropped record skips the copy into the ring.
using WholeSampleProfiler = Profiler<DefaultUnwinder, DefaultSampleRing, CpuTimeProvider,
                                     WallTimeProvider, EverySignalProvider>;
void BM_Profiler_WholeSample(benchmark::State& state) {
  WholeSample<WholeSampleProfiler>(state, /*provider=*/2);
}
BENCHMARK(BM_Profiler_WholeSample)->Arg(8)->Arg(32)->Arg(128);

// The same with an 8 MiB ring (about 7,000 samples of 128 frames), so that
// every sample pays for its push, as it does at real sampling rates.
using LargeRingProfiler = Profiler<FramePointerUnwinder, SpscRecordRing<1 << 20>,
                                   CpuTimeProvider, EverySignalProvider>;
void BM_Profiler_WholeSampleLargeRing(benchmark::State& state) {
  WholeSample<LargeRingProfiler>(state, /*provider=*/1);
}
BENCHMARK(BM_Profiler_WholeSampleLargeRing)->Arg(8)->Arg(32)->Arg(128);

// The profiler of the benchmarks below, and off when `enabled` is false:
// defaults but no symbolization, its profile removed by StopAndRemove().
// From the environment (INPROF_CPU_ENGINE, INPROF_WALL_PERIOD, ...: an
// engine or a period can be compared without rebuilding), then the
// benchmark's own output.
Options BenchmarkOptions(bool enabled) {
  Options options = Options::FromEnv();
  options.enabled = enabled;
  options.output =
      absl::StrCat("/tmp/inprof_profiler_benchmark.", getpid(), ".pb.gz");
  options.symbolize = false;
  return options;
}

// Starts an enabled profiler; false, with the benchmark skipped, when it
// cannot start.
bool StartOrSkip(DefaultProfiler& profiler, benchmark::State& state) {
  if (!profiler.options().enabled) return true;
  if (absl::Status s = profiler.Start(); !s.ok()) {
    state.SkipWithError(std::string(s.message()).c_str());
    return false;
  }
  return true;
}

void StopAndRemove(DefaultProfiler& profiler) {
  if (!profiler.options().enabled) return;
  (void)profiler.Stop();
  unlink(profiler.options().output.c_str());
}

// What a profiled thread pays each time it blocks and wakes, apart from
// samples: two registered threads pass a byte back and forth over two pipes,
// so each round trip is two wake-ups and four context switches. Process CPU
// per round trip, the threads unregistered (no profiler), and registered
// under each CPU engine at the default 10 ms period, wall sampling off. A
// round trip costs ~20 us of CPU here, so samples add ~0.1 us to it alike
// for every engine; what differs is the engine's cost at a context switch.
// The perf engine's per-thread task clock is an hrtimer that the kernel
// starts and cancels whenever the thread is switched in and out, and with a
// 10 ms period it is often the CPU's next timer, so each start and cancel
// reprograms the timer hardware (with a 1 h period it never is, and the
// cost disappears); a POSIX CPU timer is only looked at on scheduler ticks.
void BM_Profiler_ContextSwitch(benchmark::State& state) {
  const int engine = static_cast<int>(state.range(0));  // -1: no profiler
  Options options = BenchmarkOptions(engine >= 0);
  options.wall_period = absl::ZeroDuration();
  if (engine >= 0) options.cpu_engine = static_cast<CpuEngine>(engine);
  DefaultProfiler profiler(options);
  if (!StartOrSkip(profiler, state)) return;
  int there[2], back[2];
  if (pipe(there) != 0 || pipe(back) != 0) {
    state.SkipWithError("pipe failed");
    return;
  }
  std::atomic<bool> partner_registered{false};
  std::thread partner([&] {
    ThreadRegistration registration = profiler.RegisterThread("pong");
    partner_registered.store(registration.active() || !options.enabled);
    char c;
    while (read(there[0], &c, 1) == 1 && c != 0) {
      if (write(back[1], &c, 1) != 1) break;
    }
  });
  ThreadRegistration registration = profiler.RegisterThread("ping");
  char c = 1;
  for (auto _ : state) {
    if (write(there[1], &c, 1) != 1 || read(back[0], &c, 1) != 1) {
      state.SkipWithError("pipe round trip failed");
      break;
    }
  }
  c = 0;
  (void)!write(there[1], &c, 1);
  partner.join();
  for (int fd : {there[0], there[1], back[0], back[1]}) close(fd);
  if (options.enabled && (!partner_registered.load() || !registration.active())) {
    state.SkipWithError("a thread did not register");
  }
  registration.Reset();
  StopAndRemove(profiler);
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}
BENCHMARK(BM_Profiler_ContextSwitch)
    ->ArgName("engine")
    ->Arg(-1)
    ->Arg(static_cast<int>(CpuEngine::kPerf))
    ->Arg(static_cast<int>(CpuEngine::kTimer))
    ->Arg(static_cast<int>(CpuEngine::kItimer))
    ->MeasureProcessCPUTime()
    ->UseRealTime();

// A short-lived thread's registration: process CPU to start a thread, have
// it register and unregister, and join it, against the same thread without
// a profiler (arg 0). The running profiler samples CPU (default engine) and
// wall time at the defaults; its slots are pooled, so after the first
// iteration every thread reuses one, and glibc reuses the thread stacks, so
// what a brand-new thread's first page faults cost is not in it
// (bench/overhead's idle-1000 has 1000 new threads).
void BM_Profiler_ThreadRegistration(benchmark::State& state) {
  const bool profiled = state.range(0) != 0;
  DefaultProfiler profiler(BenchmarkOptions(profiled));
  if (!StartOrSkip(profiler, state)) return;
  uint64_t inactive = 0;
  for (auto _ : state) {
    std::thread thread([&] {
      ThreadRegistration registration = profiler.RegisterThread("short");
      if (profiled && !registration.active()) ++inactive;
    });
    thread.join();
  }
  StopAndRemove(profiler);
  if (inactive > 0) state.SkipWithError("a thread did not register");
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}
BENCHMARK(BM_Profiler_ThreadRegistration)
    ->ArgName("profiled")
    ->Arg(0)
    ->Arg(1)
    ->MeasureProcessCPUTime()
    ->UseRealTime();

// Many threads registering at once and unregistering at once, as a thread
// pool starts and stops (bench/overhead idle-1000): each thread's own CPU
// in RegisterThread and in its registration's destructor, averaged, for
// wall sampling off (arg wall:0: the CPU engine's perf event, the slot, the
// registry) and on (wall:1: the same; the wall sampler's visits and signal
// fall between the two and are not in these counters). Threads: arg.
// BM_Profiler_ThreadRegistration is the same one thread at a time.
void BM_Profiler_RegistrationBurst(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  Options options = BenchmarkOptions(true);
  if (state.range(1) == 0) options.wall_period = absl::ZeroDuration();
  DefaultProfiler profiler(options);
  // BENCH_BURST_THREADS=N: the two-step arming's threshold (0: the
  // sampler's thread arms every thread; a large N: each arms itself).
  if (const char* b = getenv("BENCH_BURST_THREADS")) {
    profiler.SetBurstThreadsForTesting(atoi(b));
  }
  if (!StartOrSkip(profiler, state)) return;
  auto thread_cpu_ns = [] {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1'000'000'000LL + ts.tv_nsec;
  };
  std::atomic<int64_t> register_ns{0}, unregister_ns{0};
  std::atomic<int> inactive{0};
  // The whole process's CPU (the profiler's threads too: with two-step
  // arming the sampler's thread opens most threads' perf events).
  auto process_cpu_ns = [] {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1'000'000'000LL + ts.tv_nsec;
  };
  const int64_t process0 = process_cpu_ns();
  // Each thread's CPU in RegisterThread, every burst (for the median: a
  // few threads of each burst also finish others' unregistrations).
  std::vector<int64_t> each_register_ns;
  for (auto _ : state) {
    std::vector<int64_t> burst_ns(static_cast<size_t>(threads), 0);
    std::mutex mutex;
    std::condition_variable all_ready, go;
    int ready = 0;
    bool done = false;
    std::vector<std::thread> pool;
    pool.reserve(static_cast<size_t>(threads));
    for (int i = 0; i < threads; ++i) {
      pool.emplace_back([&, i] {
        int64_t t0 = thread_cpu_ns();
        ThreadRegistration registration = profiler.RegisterThread("burst");
        burst_ns[static_cast<size_t>(i)] = thread_cpu_ns() - t0;
        register_ns.fetch_add(burst_ns[static_cast<size_t>(i)], std::memory_order_relaxed);
        if (!registration.active()) inactive.fetch_add(1);
        {
          std::unique_lock<std::mutex> lock(mutex);
          if (++ready == threads) all_ready.notify_one();
          go.wait(lock, [&] { return done; });
        }
        t0 = thread_cpu_ns();
        registration.Reset();
        unregister_ns.fetch_add(thread_cpu_ns() - t0, std::memory_order_relaxed);
      });
    }
    {
      std::unique_lock<std::mutex> lock(mutex);
      all_ready.wait(lock, [&] { return ready == threads; });
      done = true;
    }
    go.notify_all();
    for (std::thread& t : pool) t.join();
    each_register_ns.insert(each_register_ns.end(), burst_ns.begin(), burst_ns.end());
  }
  const int64_t process_ns = process_cpu_ns() - process0;
  std::sort(each_register_ns.begin(), each_register_ns.end());
  auto quantile_us = [&](double q) {
    if (each_register_ns.empty()) return 0.0;
    const size_t k = std::min(each_register_ns.size() - 1,
                              static_cast<size_t>(q * static_cast<double>(each_register_ns.size())));
    return static_cast<double>(each_register_ns[k]) / 1e3;
  };
  const uint64_t by_sampler = profiler.stats().threads_armed_by_sampler;
  StopAndRemove(profiler);
  if (inactive.load() > 0) state.SkipWithError("a thread did not register");
  const double n = static_cast<double>(state.iterations()) * threads;
  state.counters["process_us"] = static_cast<double>(process_ns) / n / 1e3;
  // Threads whose CPU engine the sampler's thread armed (a burst), per burst.
  state.counters["armed_by_sampler"] =
      static_cast<double>(by_sampler) / static_cast<double>(state.iterations());
  state.counters["register_us"] = static_cast<double>(register_ns.load()) / n / 1e3;
  // Issue 38's target is on the median.
  state.counters["register_p50_us"] = quantile_us(0.5);
  state.counters["register_p90_us"] = quantile_us(0.9);
  state.counters["unregister_us"] = static_cast<double>(unregister_ns.load()) / n / 1e3;
}
BENCHMARK(BM_Profiler_RegistrationBurst)
    ->ArgNames({"threads", "wall"})
    ->Args({1000, 0})
    ->Args({1000, 1})
    ->Iterations(5)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace inprof

BENCHMARK_MAIN();
