// Wall and CPU time of many registered threads, measured (issue "every
// second on a real stack"): THREADS threads register and nap 200 ms at a
// time, one more spins for SECONDS, under DefaultProfiler with the defaults
// (INPROF_* variables apply). Prints one line:
//
//   RESULT many_threads threads=N seconds=S
//     wall_real=share of the profile's wall time on real stacks (not on the
//       "[inprof: ...]" pseudo-frames)
//     wall_tail=share on "[inprof: wall time since the thread's last sample]"
//     busy_wall=the spinning thread's wall time on its own stack (Spin), in
//       seconds, and busy_wall_share of its lifetime
//     cpu_real=share of the profile's CPU on real stacks
//     ticker_cpu_ms=the wall sampler's own CPU ("inprof-tick"), and
//       ticker_core_pct its share of one core over the run (from the
//       busy thread's start, once every napper registered)
//     process_cpu_s, rss_kib_per_thread (peak RSS over the threads)
//
//   build/bench/many_threads 10000 3          (nap 200 ms at a time)
//   build/bench/many_threads 10000 3 wait     (wait on a condition variable
//                                             throughout: their clocks stand)
//   INPROF_WALL_THREADS_PER_TICK=5 build/bench/many_threads 1000 3
//   build/bench/many_threads 10000 3 nap stop (Stop() while the nappers
//                                             still nap; by default they end
//                                             and unregister first)
//
// It also prints stop_ms and stop_cpu_ms, the time Profiler::Stop() took and
// its thread's CPU meanwhile (the drain and the export: symbolization,
// encoding, writing), and against the truth the program counts itself
// (each thread's registered span, from inside RegisterThread's return to
// before its registration's end):
//     wall_vs_life=the profile's wall time over the threads' registered
//       lifetimes; windows=the export windows (INPROF_EXPORT_PERIOD=1s:
//       one a second), and for the worst window win_real_min (its share on
//       real stacks) and win_vs_life_min/max (its wall time over the
//       threads' lifetimes within it)
//     nap_running=share of the nappers' wall time labelled running
//     register_us_p50/p90=RegisterThread's CPU on the registering thread,
//       in the burst of THREADS registrations, microseconds;
//       register_sys_us_p90 the kernel's part of it (getrusage's ticks),
//       register_wall_us_p50/p90 its wall time; process_sys_s the
//       kernel's part of process_cpu_s
//     busy_vs_life=the busy thread's wall time over its registered span
//   MANY_THREADS_WINDOWS=1 also prints each window's length, wall time,
//   lifetimes within it and share on real stacks (stderr).
//   MANY_THREADS_SPLIT=1: each napper alternates naps in SplitNapA (50-150
//   ms, uniform) and SplitNapB (150-450 ms) and counts its time in each;
//   also prints split_a_true (A's share of the two), split_a_err (the
//   profile's A time less the truth, over the truth) and split_a_z (that
//   error in standard deviations of the estimator as the profile states
//   it: sqrt(p (1 - p) S), S the squared weights of its estimated wall
//   samples, ProfilerStats::wall_weight_sq_ms2), and split_sd_pct (that
//   standard deviation over A's time).
//
// The same workload for peers (python3 bench/sampling/many_threads.py BUILD
// runs them all and prints one table), one more argument, the profile file:
//
//   build/bench/many_threads_none N S nap -        no profiler ("CPU off";
//     also async-profiler's target: LD_PRELOAD=libasyncProfiler.so
//     ASPROF_COMMAND=start,...)
//   build/bench/many_threads_gperftools N S nap OUT   ProfilerStart(OUT)
//     before the threads start, ProfilerStop() after they are joined
//
// Peers print "RESULT many_threads profiler=none|gperftools threads=N ..."
// with run_s (the busy thread's lifetime), process_cpu_s,
// rss_kib_per_thread and profiler_threads_cpu_ms (CPU of the threads the
// workload did not start: a profiler's own threads); the driver reads
// their profiles.
#include <dirent.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#if defined(INPROF_MANY_THREADS_GPERFTOOLS)
#include <gperftools/profiler.h>
#define INPROF_MANY_THREADS_PEER "gperftools"
#elif defined(INPROF_MANY_THREADS_NONE)
#define INPROF_MANY_THREADS_PEER "none"
#else
#include "absl/synchronization/mutex.h"
#include "inprof/inprof.h"
#include "inprof/pprof_reader.h"
#endif

namespace {

int64_t Now(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return ts.tv_sec * 1'000'000'000LL + ts.tv_nsec;
}

__attribute__((noinline)) uint64_t Spin(int64_t ns) {
  const int64_t end = Now(CLOCK_MONOTONIC) + ns;
  uint64_t x = 1;
  while (Now(CLOCK_MONOTONIC) < end) {
    for (int i = 0; i < 1000; ++i) x = x * 2862933555777941757ULL + 3037000493ULL;
  }
  return x;
}

__attribute__((noinline)) void NapLoop(const std::atomic<bool>& stop) {
  const timespec nap{0, 200'000'000};
  while (!stop.load(std::memory_order_relaxed)) nanosleep(&nap, nullptr);
}

// MANY_THREADS_SPLIT: two places to nap, of one frame size (so the same sp
// and pc in nanosleep's wrapper).
__attribute__((noinline)) void SplitNapA(int64_t ns) {
  const timespec nap{0, ns};
  nanosleep(&nap, nullptr);
  asm volatile("" : : : "memory");
}
__attribute__((noinline)) void SplitNapB(int64_t ns) {
  const timespec nap{0, ns};
  nanosleep(&nap, nullptr);
  asm volatile("nop" : : : "memory");  // not folded into A (identical code)
}
// Naps in A and B until `stop`; the time in each, ns.
void SplitLoop(const std::atomic<bool>& stop, uint64_t seed, int64_t* a_ns, int64_t* b_ns) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
  auto uniform = [&](int64_t lo, int64_t hi) {  // splitmix64
    x += 0x9E3779B97F4A7C15ULL;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return lo + static_cast<int64_t>(z % static_cast<uint64_t>(hi - lo));
  };
  while (!stop.load(std::memory_order_relaxed)) {
    const int64_t t0 = Now(CLOCK_MONOTONIC);
    SplitNapA(uniform(50'000'000, 150'000'000));
    const int64_t t1 = Now(CLOCK_MONOTONIC);
    SplitNapB(uniform(150'000'000, 450'000'000));
    *a_ns += t1 - t0;
    *b_ns += Now(CLOCK_MONOTONIC) - t1;
  }
}

std::mutex g_mu;
std::condition_variable g_cv;

__attribute__((noinline)) void WaitLoop(const std::atomic<bool>& stop) {
  std::unique_lock<std::mutex> lock(g_mu);
  g_cv.wait(lock, [&] { return stop.load(); });
}

// User + system CPU of /proc/self/task/TID, ms (-1 if it is gone).
double TaskCpuMs(const std::string& tid, std::string* comm) {
  const std::string base = "/proc/self/task/" + tid;
  if (comm != nullptr) std::getline(std::ifstream(base + "/comm"), *comm);
  // schedstat's first field: nanoseconds on a CPU (stat's ticks are 10 ms).
  std::string sched;
  double on_cpu_ns = 0;
  if (std::getline(std::ifstream(base + "/schedstat"), sched) &&
      absl::SimpleAtod(sched.substr(0, sched.find(' ')), &on_cpu_ns)) {
    return on_cpu_ns / 1e6;
  }
  std::string stat;
  if (!std::getline(std::ifstream(base + "/stat"), stat)) return -1;
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return -1;
  std::vector<std::string> f = absl::StrSplit(stat.substr(paren + 2), ' ');
  double utime = 0, stime = 0;
  // Fields after "(comm) ": state is 0, utime 11, stime 12.
  if (f.size() > 12 && absl::SimpleAtod(f[11], &utime) && absl::SimpleAtod(f[12], &stime)) {
    return (utime + stime) * 1000.0 / static_cast<double>(sysconf(_SC_CLK_TCK));
  }
  return -1;
}

// CPU of this process's threads, ms: those named `name` (/proc/self/task/*/comm)
// into *named, and those whose ids are not in `ours` (threads the workload
// did not start: a profiler's) into *others.
void ThreadCpuMs(const char* name, const std::vector<pid_t>& ours, double* named,
                 double* others) {
  *named = 0;
  *others = 0;
  std::vector<pid_t> sorted = ours;
  std::sort(sorted.begin(), sorted.end());
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    std::string comm;
    const double ms = TaskCpuMs(e->d_name, &comm);
    if (ms < 0) continue;
    if (comm == name) *named += ms;
    if (!std::binary_search(sorted.begin(), sorted.end(), std::atoi(e->d_name))) {
      *others += ms;
      // MANY_THREADS_PROFILER_THREADS=1: each of a profiler's threads.
      if (getenv("MANY_THREADS_PROFILER_THREADS") != nullptr) {
        fprintf(stderr, "profiler thread %s %s: %.0f ms\n", e->d_name, comm.c_str(), ms);
      }
    }
  }
  closedir(dir);
}

// The process's CPU, user + system and system alone, seconds: one reading.
struct ProcessCpu {
  double total_s = 0;
  double sys_s = 0;
};

ProcessCpu ReadProcessCpu() {
  rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  const double user = usage.ru_utime.tv_sec + usage.ru_utime.tv_usec / 1e6;
  const double sys = usage.ru_stime.tv_sec + usage.ru_stime.tv_usec / 1e6;
  return ProcessCpu{user + sys, sys};
}

int64_t ThreadSysNs() {
  rusage usage;
  getrusage(RUSAGE_THREAD, &usage);
  return usage.ru_stime.tv_sec * 1'000'000'000LL + usage.ru_stime.tv_usec * 1'000LL;
}

double RssKibPerThread(int threads) {
  rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return threads > 0 ? static_cast<double>(usage.ru_maxrss) / threads : 0.0;
}

struct Span {
  absl::Time begin, end;  // registered: after RegisterThread, before its end
  int64_t register_cpu_ns = 0;  // RegisterThread's CPU on the thread
  int64_t register_sys_ns = 0;  // of which in the kernel (getrusage's split, from ticks)
  int64_t register_wall_ns = 0;
  int64_t split_a_ns = 0, split_b_ns = 0;  // MANY_THREADS_SPLIT: time in each
};

struct Run {
  int64_t run_ns = 0;        // the busy thread's lifetime
  double ticker_ms = 0;      // "inprof-tick"
  double profiler_ms = 0;    // threads the workload did not start
  std::vector<Span> nappers;  // each napper's registered span
  Span busy;
};

// THREADS nappers (or waiters) and one busy thread; `register_thread(name)`
// is called first in each of them and its result kept for the thread's life;
// `before_release()` once the busy thread ended, before the nappers are
// told to end.
template <typename Register, typename BeforeRelease>
Run RunWorkload(int threads, double seconds, bool wait, Register register_thread,
                BeforeRelease before_release) {
  std::atomic<bool> stop{false};
  std::atomic<int> registered{0};
  // Ids of the threads started here (and main's): the rest are a profiler's.
  std::vector<pid_t> ours(threads + 2, 0);
  ours[threads + 1] = gettid();
  std::vector<std::thread> nappers;
  nappers.reserve(threads);
  Run run;
  run.nappers.resize(threads);
  for (int i = 0; i < threads; ++i) {
    nappers.emplace_back([&, i] {
      ours[i] = gettid();
      Span& span = run.nappers[i];
      const int64_t cpu0 = Now(CLOCK_THREAD_CPUTIME_ID);
      const int64_t sys0 = ThreadSysNs();
      const int64_t wall0 = Now(CLOCK_MONOTONIC);
      {
        auto registration = register_thread("napper");
        (void)registration;
        span.register_cpu_ns = Now(CLOCK_THREAD_CPUTIME_ID) - cpu0;
        span.register_sys_ns = ThreadSysNs() - sys0;
        span.register_wall_ns = Now(CLOCK_MONOTONIC) - wall0;
        span.begin = absl::Now();
        registered.fetch_add(1);
        if (wait) {
          WaitLoop(stop);
        } else if (std::getenv("MANY_THREADS_SPLIT") != nullptr) {
          SplitLoop(stop, static_cast<uint64_t>(i), &span.split_a_ns, &span.split_b_ns);
        } else {
          NapLoop(stop);
        }
        span.end = absl::Now();
      }
    });
  }
  while (registered.load() < threads) usleep(1000);
  // The profiler's threads' CPU from here: the run, not the registrations
  // (whose cost register_us_* gives).
  double ticker_before = 0, profiler_before = 0;
  ThreadCpuMs("inprof-tick", ours, &ticker_before, &profiler_before);
  const int64_t start = Now(CLOCK_MONOTONIC);
  std::atomic<pid_t> busy_tid{0};
  std::thread busy([&] {
    busy_tid = gettid();
    {
      auto registration = register_thread("busy");
      (void)registration;
      run.busy.begin = absl::Now();
      Spin(static_cast<int64_t>(seconds * 1e9));
      run.busy.end = absl::Now();
    }
  });
  busy.join();
  run.run_ns = Now(CLOCK_MONOTONIC) - start;
  ours[threads] = busy_tid.load();
  ThreadCpuMs("inprof-tick", ours, &run.ticker_ms, &run.profiler_ms);
  run.ticker_ms -= ticker_before;
  run.profiler_ms -= profiler_before;
  before_release();
  {
    std::lock_guard<std::mutex> lock(g_mu);
    stop = true;
  }
  g_cv.notify_all();
  for (auto& t : nappers) t.join();
  return run;
}

}  // namespace

#ifdef INPROF_MANY_THREADS_PEER
int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1000;
  const double seconds = argc > 2 ? std::atof(argv[2]) : 3.0;
  const bool wait = argc > 3 && std::string(argv[3]) == "wait";
  const std::string output = argc > 4 ? argv[4] : "-";
#ifdef INPROF_MANY_THREADS_GPERFTOOLS
  if (!ProfilerStart(output.c_str())) {
    std::fprintf(stderr, "many_threads: ProfilerStart(%s) failed\n", output.c_str());
    return 1;
  }
  const Run run = RunWorkload(
      threads, seconds, wait,
      [](const char*) {
        ProfilerRegisterThread();
        return 0;
      },
      [] {});
  ProfilerStop();
#else
  const Run run = RunWorkload(
      threads, seconds, wait, [](const char*) { return 0; }, [] {});
#endif
  const ProcessCpu cpu = ReadProcessCpu();
  std::printf(
      "RESULT many_threads profiler=%s threads=%d %s seconds=%.1f run_s=%.3f "
      "profiler_threads_cpu_ms=%.0f process_cpu_s=%.2f process_sys_s=%.2f "
      "rss_kib_per_thread=%.1f\n",
      INPROF_MANY_THREADS_PEER, threads, wait ? "wait" : "nap", seconds, run.run_ns / 1e9,
      run.profiler_ms, cpu.total_s, cpu.sys_s, RssKibPerThread(threads));
  return 0;
}
#else
// Each window the exporter delivers, kept for reading after the run.
class Windows : public inprof::ProfileSink {
 public:
  absl::string_view name() const override { return "bench"; }
  absl::Status Consume(std::shared_ptr<const inprof::ExportedProfile> p) override {
    absl::MutexLock lock(&mu_);
    kept_.push_back(std::move(p));
    return absl::OkStatus();
  }
  std::vector<std::shared_ptr<const inprof::ExportedProfile>> Take() {
    absl::MutexLock lock(&mu_);
    return kept_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::shared_ptr<const inprof::ExportedProfile>> kept_;
};

double Overlap(const Span& s, absl::Time begin, absl::Time end) {
  const absl::Time b = std::max(s.begin, begin);
  const absl::Time e = std::min(s.end, end);
  return e > b ? absl::ToDoubleSeconds(e - b) : 0.0;
}

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1000;
  const double seconds = argc > 2 ? std::atof(argv[2]) : 3.0;
  const bool wait = argc > 3 && std::string(argv[3]) == "wait";
  const bool stop_first = argc > 4 && std::string(argv[4]) == "stop";
  inprof::Options options = inprof::Options::FromEnv();
  // INPROF_OUTPUT=FILE also writes the profile (its comments count the
  // wall sampler's visits).
  options.write_output = std::getenv("INPROF_OUTPUT") != nullptr;
  auto windows = std::make_shared<Windows>();
  options.sinks.push_back(windows);
  inprof::DefaultProfiler profiler(options);
  Run run;
  int64_t stop_ns = -1, stop_cpu_ns = -1;
  absl::Time stop_begin = absl::InfiniteFuture();
  auto stop = [&] {
    if (stop_ns >= 0) return;
    stop_begin = absl::Now();
    const int64_t t0 = Now(CLOCK_MONOTONIC);
    const int64_t cpu0 = Now(CLOCK_THREAD_CPUTIME_ID);
    (void)profiler.Stop();
    stop_cpu_ns = Now(CLOCK_THREAD_CPUTIME_ID) - cpu0;
    stop_ns = Now(CLOCK_MONOTONIC) - t0;
  };
  {
    inprof::ScopedProfiler running(profiler);
    run = RunWorkload(
        threads, seconds, wait, [&](const char* name) { return profiler.RegisterThread(name); },
        [&] {
          if (stop_first) stop();
        });
    stop();
  }
  const ProcessCpu cpu = ReadProcessCpu();
  const uint64_t weight_sq_ms2 = profiler.stats().wall_weight_sq_ms2;
  const int64_t run_ns = run.run_ns;
  const double ticker_ms = run.ticker_ms;
  if (stop_first) {
    // Stopped while they napped: their spans end when Stop() began (its
    // last wall wake-up comes first thing). They were cut at the busy
    // thread's end, ~0.25 s earlier at 10,000 threads (the reads of the
    // threads' CPU from /proc come between): that read as 8% too much.
    for (Span& s : run.nappers) s.end = std::min(s.end, stop_begin);
  }
  int64_t wall_total = 0, wall_pseudo = 0, wall_tail = 0, busy_wall = 0;
  int64_t cpu_total = 0, cpu_pseudo = 0, nap_wall = 0, nap_running = 0;
  int64_t split_a = 0, split_b = 0;  // MANY_THREADS_SPLIT: the profile's
  double life_total = 0, win_real_min = 1, win_ratio_min = 1e9, win_ratio_max = 0;
  const auto kept = windows->Take();
  for (const auto& window : kept) {
    absl::StatusOr<inprof::DecodedProfile> profile = inprof::DecodePprof(window->pprof);
    if (!profile.ok()) {
      std::fprintf(stderr, "many_threads: cannot read window %llu: %s\n",
                   static_cast<unsigned long long>(window->sequence),
                   std::string(profile.status().message()).c_str());
      return 1;
    }
    const int wall = profile->ValueIndex("wall-time");
    const int cpu = profile->ValueIndex("cpu-time");
    int64_t w_total = 0, w_pseudo = 0;
    for (const auto& s : profile->samples) {
      const bool pseudo = !s.stack.empty() && absl::StartsWith(s.stack[0], "[inprof:");
      bool in_spin = false, in_a = false, in_b = false;
      for (const std::string& f : s.stack) {
        in_spin |= absl::StrContains(f, "Spin");
        in_a |= absl::StrContains(f, "SplitNapA");
        in_b |= absl::StrContains(f, "SplitNapB");
      }
      if (wall >= 0) {
        w_total += s.values[wall];
        if (pseudo) w_pseudo += s.values[wall];
        if (pseudo && absl::StrContains(s.stack[0], "wall time since")) wall_tail += s.values[wall];
        if (in_spin) busy_wall += s.values[wall];
        if (in_a) split_a += s.values[wall];
        if (in_b) split_b += s.values[wall];
        auto name = s.str_labels.find("thread name");
        if (name != s.str_labels.end() && name->second == "napper") {
          nap_wall += s.values[wall];
          auto state = s.str_labels.find("thread state");
          if (state != s.str_labels.end() && state->second == "running") {
            nap_running += s.values[wall];
          }
        }
      }
      if (cpu >= 0) {
        cpu_total += s.values[cpu];
        if (pseudo) cpu_pseudo += s.values[cpu];
      }
    }
    wall_total += w_total;
    wall_pseudo += w_pseudo;
    double life = Overlap(run.busy, window->start, window->end);
    for (const Span& s : run.nappers) life += Overlap(s, window->start, window->end);
    life_total += life;
    if (std::getenv("MANY_THREADS_WINDOWS") != nullptr) {
      std::fprintf(stderr, "window %llu: %.3f s, wall %.1f s, lifetimes %.1f s, real %.3f\n",
                   static_cast<unsigned long long>(window->sequence),
                   absl::ToDoubleSeconds(window->end - window->start), w_total / 1e9, life,
                   w_total > 0 ? 1 - static_cast<double>(w_pseudo) / static_cast<double>(w_total)
                               : 0.0);
    }
    // Windows of under 100 ms of thread time (the last one, cut at Stop()
    // after the threads ended) say little.
    if (life >= 0.1) {
      win_real_min = std::min(win_real_min, w_total > 0 ? 1 - static_cast<double>(w_pseudo) /
                                                                  static_cast<double>(w_total)
                                                        : 0.0);
      const double ratio = static_cast<double>(w_total) / 1e9 / life;
      win_ratio_min = std::min(win_ratio_min, ratio);
      win_ratio_max = std::max(win_ratio_max, ratio);
    }
  }
  auto share = [](int64_t part, int64_t total) {
    return total > 0 ? static_cast<double>(part) / static_cast<double>(total) : 0.0;
  };
  // p50 and p90 of one of the spans' registration figures.
  auto percentiles = [&](int64_t Span::*field) {
    std::vector<int64_t> v;
    for (const Span& s : run.nappers) v.push_back(s.*field);
    std::sort(v.begin(), v.end());
    return std::pair<double, double>(v.empty() ? 0.0 : v[v.size() / 2] / 1e3,
                                     v.empty() ? 0.0 : v[v.size() * 9 / 10] / 1e3);
  };
  const auto reg = percentiles(&Span::register_cpu_ns);
  const auto reg_sys = percentiles(&Span::register_sys_ns);
  const auto reg_wall = percentiles(&Span::register_wall_ns);
  const double busy_life = absl::ToDoubleSeconds(run.busy.end - run.busy.begin);
  std::printf(
      "RESULT many_threads profiler=inprof threads=%d %s%s seconds=%.1f run_s=%.3f "
      "stop_ms=%.0f stop_cpu_ms=%.0f wall_real=%.3f wall_tail=%.3f "
      "wall_total_s=%.0f wall_vs_life=%.3f windows=%zu win_real_min=%.3f "
      "win_vs_life_min=%.3f win_vs_life_max=%.3f nap_running=%.4f "
      "busy_wall=%.2f busy_wall_share=%.3f busy_vs_life=%.3f cpu_real=%.3f "
      "ticker_cpu_ms=%.0f ticker_core_pct=%.2f profiler_threads_cpu_ms=%.0f process_cpu_s=%.2f "
      "process_sys_s=%.2f rss_kib_per_thread=%.1f register_us_p50=%.1f register_us_p90=%.1f "
      "register_sys_us_p90=%.0f register_wall_us_p50=%.1f register_wall_us_p90=%.1f\n",
      threads, wait ? "wait" : "nap", stop_first ? " stop-first" : "", seconds, run_ns / 1e9,
      stop_ns / 1e6, stop_cpu_ns / 1e6, 1 - share(wall_pseudo, wall_total), share(wall_tail, wall_total),
      wall_total / 1e9, life_total > 0 ? wall_total / 1e9 / life_total : 0.0, kept.size(),
      win_real_min, win_ratio_min, win_ratio_max, share(nap_running, nap_wall),
      busy_wall / 1e9, share(busy_wall, run_ns), busy_life > 0 ? busy_wall / 1e9 / busy_life : 0.0,
      1 - share(cpu_pseudo, cpu_total), ticker_ms, 100.0 * ticker_ms / (run_ns / 1e6),
      run.profiler_ms, cpu.total_s, cpu.sys_s, RssKibPerThread(threads), reg.first, reg.second,
      reg_sys.second, reg_wall.first, reg_wall.second);
  if (std::getenv("MANY_THREADS_SPLIT") != nullptr) {
    double true_a = 0, true_b = 0;
    for (const Span& sp : run.nappers) {
      true_a += static_cast<double>(sp.split_a_ns);
      true_b += static_cast<double>(sp.split_b_ns);
    }
    // The estimator's standard deviation for A, as the profile states it.
    const double p = true_a + true_b > 0 ? true_a / (true_a + true_b) : 0;
    const double sd_ns = std::sqrt(p * (1 - p) * static_cast<double>(weight_sq_ms2)) * 1e6;
    std::printf("RESULT many_threads_split threads=%d split_a_true=%.3f split_a_err=%+.4f "
                "split_a_z=%+.2f split_sd_pct=%.2f weight_sq_s2=%.0f est_a_s=%.1f true_a_s=%.1f "
                "est_b_s=%.1f true_b_s=%.1f\n",
                threads, p, true_a > 0 ? (static_cast<double>(split_a) - true_a) / true_a : 0.0,
                sd_ns > 0 ? (static_cast<double>(split_a) - true_a) / sd_ns : 0.0,
                true_a > 0 ? 100 * sd_ns / true_a : 0.0, static_cast<double>(weight_sq_ms2) / 1e6,
                split_a / 1e9, true_a / 1e9, split_b / 1e9, true_b / 1e9);
  }
  return 0;
}
#endif
