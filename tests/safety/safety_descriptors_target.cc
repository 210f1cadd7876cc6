// A program for tests/safety/safety_descriptors_test.cc, run under
// `inprof run`; it links nothing of inprof.
//
//   closefrom DIR   starts threads, closes every descriptor from 3 up
//                   (close_range, as a daemon does at start), opens 8 files
//                   DIR/data-I of its own, lets those threads end and new
//                   ones run, writes DIR/check ("ok", or what happened to
//                   its descriptors) and DIR/pid, then waits for a signal
//                   (20 s at most, then exits 0).
//   rlimit N T      lowers RLIMIT_NOFILE to N, starts T threads that wait,
//                   then opens /dev/null up to 8 times and prints
//                   "opened K".
//   fork DIR        forks a child that writes DIR/pid and waits for a
//                   signal (10 s at most, then exits 0); writes how the
//                   child ended to DIR/child ("signal N" or "exit N") and
//                   exits 0.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
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

// Threads that sleep `ms` (the wall sampler reads their .../syscall files)
// and one that burns CPU for as long.
std::vector<std::thread> StartThreads(int ms) {
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back(
        [ms] { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); });
  }
  threads.emplace_back([ms] { Burn(ms); });
  return threads;
}

void Join(std::vector<std::thread>& threads) {
  for (std::thread& t : threads) t.join();
  threads.clear();
}

bool WriteFile(const std::string& path, const std::string& content) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  const bool ok = write(fd, content.data(), content.size()) ==
                  static_cast<ssize_t>(content.size());
  close(fd);
  return ok;
}

int CloseFrom(const std::string& dir) {
  std::vector<std::thread> threads = StartThreads(600);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  close_range(3, ~0U, 0);
  struct File {
    int fd;
    struct stat st;
  };
  std::vector<File> files;
  for (int i = 0; i < 8; ++i) {
    const std::string path = dir + "/data-" + std::to_string(i);
    const std::string content = "the program's file " + std::to_string(i) + "\n";
    if (!WriteFile(path, content)) return 2;
    File f{open(path.c_str(), O_RDWR | O_CLOEXEC), {}};
    if (f.fd < 0 || fstat(f.fd, &f.st) != 0) return 2;
    files.push_back(f);
  }
  Join(threads);
  threads = StartThreads(300);
  Join(threads);
  std::string check;
  for (const File& f : files) {
    struct stat now {};
    if (fstat(f.fd, &now) != 0) {
      check += "fd " + std::to_string(f.fd) + " closed; ";
    } else if (now.st_dev != f.st.st_dev || now.st_ino != f.st.st_ino) {
      char link[256] = {};
      (void)readlink(("/proc/self/fd/" + std::to_string(f.fd)).c_str(), link,
                     sizeof(link) - 1);
      check += "fd " + std::to_string(f.fd) + " is now " + link + "; ";
    }
  }
  if (!WriteFile(dir + "/check", check.empty() ? "ok" : check)) return 2;
  if (!WriteFile(dir + "/pid", std::to_string(getpid()))) return 2;
  for (int i = 0; i < 200; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return 0;
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

int Fork(const std::string& dir) {
  Burn(50);
  const pid_t child = fork();
  if (child < 0) return 2;
  if (child == 0) {
    if (!WriteFile(dir + "/pid", std::to_string(getpid()))) _exit(2);
    for (int i = 0; i < 100; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    _exit(0);
  }
  int status = 0;
  while (waitpid(child, &status, 0) < 0) {
  }
  const std::string how =
      WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status))
                          : "exit " + std::to_string(WEXITSTATUS(status));
  return WriteFile(dir + "/child", how) ? 0 : 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "closefrom") == 0) return CloseFrom(argv[2]);
  if (argc == 3 && std::strcmp(argv[1], "fork") == 0) return Fork(argv[2]);
  if (argc == 4 && std::strcmp(argv[1], "rlimit") == 0) {
    return Rlimit(std::atoi(argv[2]), std::atoi(argv[3]));
  }
  std::fprintf(stderr, "usage: %s closefrom DIR | rlimit N THREADS | fork DIR\n", argv[0]);
  return 2;
}
