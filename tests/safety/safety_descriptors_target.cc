// A program for tests/safety/safety_descriptors_test.cc, run under
// `inprof run`; it links nothing of inprof.
//
//   rlimit N T      lowers RLIMIT_NOFILE to N, starts T threads that wait,
//                   then opens /dev/null up to 8 times and prints
//                   "opened K".
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

__attribute__((noinline)) void Burn(int ms) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  volatile unsigned long x = 0;
  while (std::chrono::steady_clock::now() < end) {
    for (int i = 0; i < 1000; ++i) x = x + static_cast<unsigned long>(i);
  }
}

int Rlimit(int limit, int thread_count) {
  rlimit r;
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) return 2;
  r.rlim_cur = static_cast<rlim_t>(limit);
  if (setrlimit(RLIMIT_NOFILE, &r) != 0) return 2;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::vector<std::thread> threads;
  for (int i = 0; i < thread_count; ++i) {
    threads.emplace_back([&] {
      Burn(20);
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return done; });
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  int opened = 0;
  std::vector<int> fds;
  for (int i = 0; i < 8; ++i) {
    const int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      ++opened;
      fds.push_back(fd);
    }
  }
  std::printf("opened %d\n", opened);
  std::fflush(stdout);
  {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
  }
  cv.notify_all();
  for (std::thread& t : threads) t.join();
  for (int fd : fds) close(fd);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::strcmp(argv[1], "rlimit") == 0) {
    return Rlimit(std::atoi(argv[2]), std::atoi(argv[3]));
  }
  std::fprintf(stderr, "usage: %s rlimit N THREADS\n", argv[0]);
  return 2;
}
