// A program with N registered threads (default 1,000) for the thread dump's
// whole-program comparison (bench/profiler/compare_thread_dumps.py): most
// wait (in read() on a pipe, on a condition variable, in nanosleep), 1 %
// run, and a heartbeat thread ticks every millisecond and keeps the longest
// gap it saw between two ticks -- how long the program was stopped. It
// serves its live endpoint (INPROF_HTTP_ADDR=127.0.0.1:0, unless given)
// and prints "ready PID" once every thread is in place; each line it reads
// on stdin then makes it print "stall_us N" (the longest gap since the
// previous line, reset) ; end of input ends it.
//
//   thread_dump_program [THREADS] [none]   (none: no profiler: for ptrace tools alone)
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "inprof/inprof.h"

namespace {

int64_t NowNs() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1'000'000'000LL + t.tv_nsec;
}

__attribute__((noinline)) void WaitInRead(int fd) {
  char c;
  while (read(fd, &c, 1) < 0) {
  }
  asm volatile("" ::: "memory");
}
__attribute__((noinline)) void WaitOnCondition(std::mutex& m, std::condition_variable& cv,
                                               const bool& go) {
  std::unique_lock<std::mutex> lock(m);
  cv.wait(lock, [&] { return go; });
  asm volatile("" ::: "memory");
}
__attribute__((noinline)) void SleepInLoop(const std::atomic<bool>& stop) {
  while (!stop.load()) usleep(50'000);
  asm volatile("" ::: "memory");
}
__attribute__((noinline)) void Spin(const std::atomic<bool>& stop) {
  while (!stop.load(std::memory_order_relaxed)) asm volatile("" ::: "memory");
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1000;
  const bool profiled = !(argc > 2 && std::strcmp(argv[2], "none") == 0);
  setenv("INPROF_HTTP_ADDR", "127.0.0.1:0", /*overwrite=*/0);
  setenv("INPROF_OUTPUT", "/dev/null", /*overwrite=*/0);
  std::unique_ptr<inprof::DefaultProfiler> profiler;
  if (profiled) {
    profiler = std::make_unique<inprof::DefaultProfiler>();
    if (absl::Status s = profiler->Start(); !s.ok()) {
      std::fprintf(stderr, "Start: %s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
  auto register_thread = [&](const std::string& name) {
    return profiler ? profiler->RegisterThread(name) : inprof::ThreadRegistration();
  };
  int fds[2];
  if (pipe(fds) != 0) return 1;
  std::atomic<bool> stop{false};
  std::atomic<int> ready{0};
  std::mutex m;
  std::condition_variable cv;
  bool go = false;
  std::atomic<int64_t> longest_gap_ns{0};
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) {
    pool.emplace_back([&, i] {
      auto registration = register_thread("worker-" + std::to_string(i));
      ready.fetch_add(1);
      if (i % 100 == 0) {
        Spin(stop);  // 1 % running
        return;
      }
      switch (i % 10) {
        case 0:
        case 1:
        case 2:
        case 3:
          WaitOnCondition(m, cv, go);
          break;
        case 4:
        case 5:
          SleepInLoop(stop);
          break;
        default:
          WaitInRead(fds[0]);
      }
    });
  }
  std::thread heartbeat([&] {
    auto registration = register_thread("heartbeat");
    int64_t last = NowNs();
    while (!stop.load()) {
      usleep(1000);
      const int64_t now = NowNs();
      int64_t seen = longest_gap_ns.load();
      while (now - last > seen && !longest_gap_ns.compare_exchange_weak(seen, now - last)) {
      }
      last = now;
    }
  });
  while (ready.load() < threads) usleep(1000);
  usleep(500'000);
  longest_gap_ns.store(0);
  std::printf("ready %d %s\n", static_cast<int>(getpid()),
              profiler ? profiler->http_address().c_str() : "-");
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
    std::printf("stall_us %lld\n", static_cast<long long>(longest_gap_ns.exchange(0) / 1000));
    std::fflush(stdout);
  }
  stop.store(true);
  {
    std::lock_guard<std::mutex> lock(m);
    go = true;
  }
  cv.notify_all();
  for (int i = 0; i < threads; ++i) {
    if (write(fds[1], "x", 1) != 1) break;
  }
  for (std::thread& t : pool) t.join();
  heartbeat.join();
  if (profiler) (void)profiler->Stop();
  return 0;
}
