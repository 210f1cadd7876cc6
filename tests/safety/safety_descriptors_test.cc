// inprof and the host's file descriptors (DESIGN.md, "Hard rules of the
// host"): inprof never uses or closes a descriptor number it cannot prove
// is still its own, and leaves the program the descriptors its
// RLIMIT_NOFILE allows.
//   - Linked in: a program that closes every descriptor it inherited
//     (close_range, as daemons do) after Start() and opens its own files
//     finds them open, unchanged and unwritten after Stop(): with perf
//     events, kept /proc files and the symbolizer's files, with an agent
//     link, with the live endpoint. The upload client and the leaf
//     resolver keep no descriptor between calls.
//   - Under `inprof run`: such a program still ends on SIGTERM (143) and its
//     files get no byte from inprof; its descriptors never turn into
//     inprof's files while it runs. A forked child ends on the SIGTERM sent
//     to it.
//   - A program that lowers RLIMIT_NOFILE and starts threads opens as many
//     files under `inprof run` as alone.
//
// The programs run in a forked child (linked in) or as
// safety_descriptors_target (under `inprof run`).
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <malloc.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <iterator>
#include <climits>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inprof/inprof.h"
#include "inprof/internal/debug_endpoint.h"
#include "inprof/internal/http_client.h"
#include "inprof/internal/leaf_frame_resolver.h"
#include "safety/safety_util.h"
#include "src/agent/agent_server.h"
#include "upload/http_receiver.h"
#include "util/test_util.h"

namespace inprof {
namespace {

using ::inprof::testing::CommandOutput;
using ::inprof::testing::RunCommandSeparately;
using ::inprof::testing::ShellQuote;
using ::inprof::testing::TestTmpDir;
using ::testing::HasSubstr;

std::string FreshDir(const std::string& name) {
  return ::inprof::testing::FreshTestDir("descriptors_" + name);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The program's own files: opened after it closed everything it inherited.
struct ProgramFile {
  std::string path;
  std::string content;
  int fd = -1;
  struct stat st {};
};

std::vector<ProgramFile> OpenProgramFiles(const std::string& dir, int n) {
  std::vector<ProgramFile> files(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    ProgramFile& f = files[static_cast<size_t>(i)];
    f.path = absl::StrCat(dir, "/data-", i);
    f.content = absl::StrCat("the program's file ", i, "\n");
    std::ofstream(f.path, std::ios::binary) << f.content;
    f.fd = open(f.path.c_str(), O_RDWR | O_CLOEXEC);
    if (f.fd >= 0) fstat(f.fd, &f.st);
  }
  return files;
}

// What is wrong with the program's files now ("" if nothing): each still
// open on its number, and (`content_only`: only) unwritten.
std::string CheckProgramFiles(const std::vector<ProgramFile>& files,
                              bool content_only = false) {
  std::string wrong;
  for (const ProgramFile& f : files) {
    struct stat now {};
    if (content_only) {
      // The content alone, below.
    } else if (f.fd < 0) {
      absl::StrAppend(&wrong, f.path, ": never opened; ");
    } else if (fstat(f.fd, &now) != 0) {
      absl::StrAppend(&wrong, "fd ", f.fd, " (", f.path, ") closed; ");
    } else if (now.st_dev != f.st.st_dev || now.st_ino != f.st.st_ino) {
      char link[256] = {};
      (void)readlink(absl::StrCat("/proc/self/fd/", f.fd).c_str(), link,
                     sizeof(link) - 1);
      absl::StrAppend(&wrong, "fd ", f.fd, " (", f.path, ") is now ", link,
                      "; ");
    }
    if (const std::string on_disk = ReadFile(f.path); on_disk != f.content) {
      absl::StrAppend(&wrong, f.path, " holds ", on_disk.size(),
                      " bytes instead of ", f.content.size(), "; ");
    }
  }
  return wrong;
}

// Registered threads that block for `ms` (the wall sampler keeps their
// .../syscall files open) and one that burns CPU (a perf event or timer),
// joined at destruction.
class Threads {
 public:
  Threads(DefaultProfiler& profiler, int ms) {
    for (int i = 0; i < 4; ++i) {
      threads_.emplace_back([&profiler, ms, i] {
        auto registration = profiler.RegisterThread(absl::StrCat("sleeper-", i));
        std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      });
    }
    threads_.emplace_back([&profiler, ms] {
      auto registration = profiler.RegisterThread("burner");
      safety::BurnCpu(int64_t{ms} * 1'000'000);
    });
  }
  ~Threads() {
    for (std::thread& t : threads_) t.join();
  }

 private:
  std::vector<std::thread> threads_;
};

// Linked in: the program closes every descriptor from 3 up after Start()
// (inprof's perf events, kept /proc files, the symbolizer's module files),
// opens 8 files of its own, which take those numbers, and keeps profiling.
// Stop() and the profiler's end must leave the 8 open, the same files, and
// unwritten.
// The test forks its program while a server of its own (the agent, the
// receiver) runs threads in the parent. TSan does not support that, and
// GCC 12's ASan allocator is not fork-safe: a child forked while one of
// those threads held the allocator's lock blocks in its first malloc (seen
// beside two busy loops: 2 runs in 4 hung, the child in
// SizeClassAllocator64::GetFromAllocator under pthread_getattr_np). The
// plain suite runs these.
constexpr const char* kForksBesideThreads =
    "forks beside the server's threads: TSan does not support it and GCC "
    "12's ASan allocator is not fork-safe; the plain suite runs it";

// A program that closes inprof's descriptors under its threads races with
// them by design (what these tests check is that inprof survives it); and
// TSan does not intercept close_range, so it reports the numbers' reuse.
constexpr const char* kTsanClosesUnderThreads =
    "the program closes inprof's descriptors under its threads with "
    "close_range, which TSan does not intercept: it reports the numbers' "
    "reuse as a race";

TEST(SafetyDescriptorsTest, ALinkedInProgramThatClosesInheritedDescriptorsKeepsItsOwn) {
  if (safety::kTsan) GTEST_SKIP() << kTsanClosesUnderThreads;
  const std::string dir = FreshDir("linked");
  const int rc = safety::RunInChild(
      [&dir]() -> int {
        Options options;
        options.output = dir + "/p-%t.pb.gz";
        options.cpu_period = absl::Milliseconds(1);
        options.wall_period = absl::Milliseconds(1);
        options.export_period = absl::Milliseconds(100);
        std::vector<ProgramFile> files;
        {
          DefaultProfiler profiler(options);
          auto self = profiler.RegisterThread("main");
          if (!profiler.Start().ok()) return 2;
          {
            // Sampled and exported (symbolized) before the program closes
            // everything, with threads running across it: inprof holds
            // descriptors of each kind then.
            Threads before(profiler, 500);
            std::this_thread::sleep_for(std::chrono::milliseconds(250));
            close_range(3, ~0U, 0);
            files = OpenProgramFiles(dir, 8);
          }
          // Those threads have ended (their descriptors released); new ones
          // start (new descriptors opened) while the program's are open.
          { Threads after(profiler, 250); }
          if (std::string wrong = CheckProgramFiles(files); !wrong.empty()) {
            std::fprintf(stderr, "while profiling: %s\n", wrong.c_str());
            return 3;
          }
          if (!profiler.Stop().ok()) return 4;
          if (std::string wrong = CheckProgramFiles(files); !wrong.empty()) {
            std::fprintf(stderr, "after Stop(): %s\n", wrong.c_str());
            return 5;
          }
        }
        if (std::string wrong = CheckProgramFiles(files); !wrong.empty()) {
          std::fprintf(stderr, "after the profiler's end: %s\n", wrong.c_str());
          return 6;
        }
        return 0;
      },
      /*timeout_s=*/30);
  EXPECT_EQ(rc, 0);
}

// A program that dup2()s a file of its own onto a number it closed a moment
// before (3, the lowest free) and writes through it, in a loop, while
// registered threads come and go: the wall sampler opens each new blocked
// thread's /proc/self/task/TID/syscall file. Every dup2 and every write must
// succeed and land in the program's file: no open of inprof's may hold that
// number (dup2 answers EBUSY while another thread's open has it in flight)
// and no close of inprof's may take it. Deterministic: with the timer engine
// and frame-pointer walks, the sampler's files are the only ones inprof
// opens while the loop runs, and its own descriptor table keeps them away
// from the program's numbers (before that table: thousands of failed dup2
// calls and writes a run, measured: docs/safety.md).
TEST(SafetyDescriptorsTest, AProgramDupingOntoAFreedNumberBesideThreadChurnKeepsEveryWrite) {
  if (safety::kTsan) GTEST_SKIP() << kTsanClosesUnderThreads;
  const std::string dir = FreshDir("dup2");
  const int rc = safety::RunInChild(
      [&dir]() -> int {
        using ChurnProfiler =
            Profiler<FramePointerUnwinder, DefaultSampleRing, CpuTimeProvider,
                     WallTimeProvider>;
        Options options;
        options.cpu_engine = CpuEngine::kTimer;
        options.cpu_period = absl::Milliseconds(1);
        options.wall_period = absl::Milliseconds(1);
        options.output = dir + "/p.pb.gz";
        options.symbolize = false;
        const std::string path = dir + "/out";
        const int opened = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
        const int out = fcntl(opened, F_DUPFD_CLOEXEC, 100);
        close(opened);
        if (out < 0) return 2;
        close(3);  // the number the loop takes and frees
        // glibc opens /sys/devices/system/cpu/online in the malloc that
        // makes a process's 9th arena (to size its arena limit), on
        // whichever thread that is: a churning thread, taking number 3 in
        // the program's table. The loop's dup2 then answered EBUSY, or
        // replaced glibc's file, whose close then failed the loop's write
        // (1 run in 10: "9 EBUSY ... writes failed: 1"; strace showed a
        // churning thread's openat of that file = 3, and no such open of
        // inprof's). glibc's, once in a process's life, whoever's malloc
        // makes that arena: a fixed limit skips it.
        mallopt(M_ARENA_MAX, 16);
        // glibc also reads /proc/sys/vm/overcommit_memory the first time it
        // shrinks a thread arena's heap (check_may_shrink_heap), on the
        // thread whose free() trims it: a churning thread, 1.8 s into a run,
        // holding number 3 as the loop's dup2 came (1 EBUSY; ftrace's
        // syscall events showed that thread's openat = 3, its path
        // libc's string, 1 run in 13-27 beside busy loops). A trim threshold
        // above any heap's size never shrinks one.
        mallopt(M_TRIM_THRESHOLD, 1 << 30);
        ChurnProfiler profiler(options);
        if (!profiler.Start().ok()) return 2;
        std::atomic<bool> stop{false};
        std::atomic<int> batches{0};
        // New registered threads, each blocked a few milliseconds (the
        // sampler looks at it through its .../syscall file).
        std::thread churn([&] {
          int n = 0;
          for (;; batches.fetch_add(1)) {
            if (stop.load()) break;
            std::vector<std::thread> batch;
            for (int i = 0; i < 8; ++i) {
              batch.emplace_back([&profiler, n, i] {
                auto registration = profiler.RegisterThread(absl::StrCat("churn-", n, "-", i));
                std::this_thread::sleep_for(std::chrono::milliseconds(5));
              });
            }
            for (std::thread& t : batch) t.join();
            ++n;
          }
        });
        // The first batches pass before the loop starts: what glibc and the
        // test's own code open once per process (the CPU count, for malloc's
        // arenas) is not inprof's.
        while (batches.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        int64_t ok = 0, busy = 0, dup_failed = 0, write_failed = 0;
        const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(2);
        while (std::chrono::steady_clock::now() < end) {
          if (dup2(out, 3) != 3) {
            ++(errno == EBUSY ? busy : dup_failed);
            continue;
          }
          if (write(3, "x\n", 2) == 2) {
            ++ok;
          } else {
            ++write_failed;
          }
          close(3);
        }
        stop.store(true);
        churn.join();
        if (!profiler.Stop().ok()) return 4;
        const int64_t lines = static_cast<int64_t>(
            std::count(std::istreambuf_iterator<char>(*std::make_unique<std::ifstream>(path)),
                       std::istreambuf_iterator<char>(), '\n'));
        if (ok == 0 || busy != 0 || dup_failed != 0 || write_failed != 0 || lines != ok) {
          std::fprintf(stderr,
                       "writes: %lld ok, %lld lines in the file; dup2: %lld EBUSY, "
                       "%lld other failures; writes failed: %lld\n",
                       static_cast<long long>(ok), static_cast<long long>(lines),
                       static_cast<long long>(busy), static_cast<long long>(dup_failed),
                       static_cast<long long>(write_failed));
          return 3;
        }
        return 0;
      },
      /*timeout_s=*/60);
  EXPECT_EQ(rc, 0);
}

// Descriptors open on a file whose path contains `part`.
int DescriptorsOn(const std::string& part) {
  int count = 0;
  if (DIR* dir = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(dir)) {
      char target[PATH_MAX] = {};
      const std::string link = absl::StrCat("/proc/self/fd/", e->d_name);
      if (readlink(link.c_str(), target, sizeof(target) - 1) > 0 &&
          absl::StrContains(target, part)) {
        ++count;
      }
    }
    closedir(dir);
  }
  return count;
}

// The same with the samples forwarded to an agent (INPROF_AGENT_SOCKET):
// the link's socket and its shared memory (grown with ftruncate when more
// threads need rings) are the agent's, never a file of the program's that
// took their numbers.
TEST(SafetyDescriptorsTest, ALinkedInProgramForwardingToAnAgentKeepsItsOwnDescriptors) {
  if (safety::kSanitized) GTEST_SKIP() << kForksBesideThreads;
  const std::string dir = FreshDir("agent");
  agent::AgentServerOptions server_options;
  server_options.address = internal::NewAgentSocketAddress();
  server_options.profile = true;
  server_options.profile_options.output = dir + "/agent-%p.pb.gz";
  server_options.profile_options.export_period = absl::ZeroDuration();
  agent::AgentServer server(server_options);
  ASSERT_TRUE(server.Start().ok());
  const std::string socket = server_options.address.ToString();
  const int rc = safety::RunInChild(
      [&dir, &socket]() -> int {
        Options options;
        options.output = dir + "/local-%p.pb.gz";
        options.agent_socket = socket;
        options.cpu_period = absl::Milliseconds(1);
        options.wall_period = absl::Milliseconds(1);
        std::vector<ProgramFile> files;
        {
          DefaultProfiler profiler(options);
          auto self = profiler.RegisterThread("main");
          if (!profiler.Start().ok()) return 2;
          { Threads before(profiler, 100); }
          close_range(3, ~0U, 0);
          files = OpenProgramFiles(dir, 8);
          {
            // More threads at once than the first batch of rings holds:
            // the shared memory grows.
            std::vector<std::unique_ptr<Threads>> many;
            for (int i = 0; i < 5; ++i) {
              many.push_back(std::make_unique<Threads>(profiler, 200));
            }
          }
          if (!profiler.Stop().ok()) return 4;
        }
        if (std::string wrong = CheckProgramFiles(files); !wrong.empty()) {
          std::fprintf(stderr, "after the profiler's end: %s\n", wrong.c_str());
          return 6;
        }
        return 0;
      },
      /*timeout_s=*/30);
  server.Stop();
  EXPECT_EQ(rc, 0);
}

// The same with the live endpoint (INPROF_HTTP_ADDR) serving: Stop()
// neither writes into the program's files nor waits forever for the
// server's thread (libmicrohttpd wakes it through a descriptor of its own,
// which the program closed). Only the content is checked: libmicrohttpd's
// own thread may still read or close the numbers it held (README, Safety:
// not covered; seen once in a full-suite run: one file closed).
TEST(SafetyDescriptorsTest, ALinkedInProgramServingTheLiveEndpointWritesNothingAndStops) {
  if (safety::kTsan) GTEST_SKIP() << kTsanClosesUnderThreads;
  // Whether the library is there is asked of the loader, not of
  // DebugServer::Available() (the code under test).
  INPROF_REQUIRE_TOOL("libmicrohttpd");
  ASSERT_TRUE(internal::DebugServer::Available().ok()) << internal::DebugServer::Available();
  const std::string dir = FreshDir("serve");
  const int rc = safety::RunInChild(
      [&dir]() -> int {
        Options options;
        options.output = dir + "/p-%p.pb.gz";
        options.http_addr = "127.0.0.1:0";
        std::vector<ProgramFile> files;
        {
          DefaultProfiler profiler(options);
          auto self = profiler.RegisterThread("main");
          if (!profiler.Start().ok()) return 2;
          close_range(3, ~0U, 0);
          files = OpenProgramFiles(dir, 8);
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
          if (!profiler.Stop().ok()) return 4;
        }
        if (std::string wrong = CheckProgramFiles(files, /*content_only=*/true);
            !wrong.empty()) {
          std::fprintf(stderr, "after the profiler's end: %s\n", wrong.c_str());
          return 6;
        }
        return 0;
      },
      /*timeout_s=*/30);
  EXPECT_EQ(rc, 0);
}

// A daemon that closes everything it inherited at start (close_range(3,
// ~0U, 0)), inprof's descriptors included, opens its log files and writes
// lines to them for 2 s while the profiler samples, exports every 100 ms
// (symbolizing: module files opened and closed) and serves the live
// endpoint to a client asking for 1 s profiles (each symbolized: module
// files again, and a connection socket of the server's). Every line must
// land in its own file: no number of the program's may be closed or taken
// by inprof at any moment (before its files and sockets moved to tables of
// their own: 5 runs in 18 lost a file, its lines in another; README,
// Safety). The endpoint, whose listening socket the program closed, still
// answers.
TEST(SafetyDescriptorsTest, ADaemonClosingEverythingAtStartKeepsEveryLineBesideTheLiveEndpoint) {
  if (safety::kTsan) GTEST_SKIP() << kTsanClosesUnderThreads;
  if (!internal::DebugServer::Available().ok()) {
    GTEST_SKIP() << internal::DebugServer::Available().message();
  }
  const std::string dir = FreshDir("daemon");
  const int rc = safety::RunInChild(
      [&dir]() -> int {
        signal(SIGPIPE, SIG_IGN);  // as a daemon does
        Options options;
        options.output = dir + "/p-%t.pb.gz";
        options.http_addr = "127.0.0.1:0";
        options.cpu_period = absl::Milliseconds(1);
        options.wall_period = absl::Milliseconds(1);
        options.export_period = absl::Milliseconds(100);
        constexpr int kFiles = 4;
        int fds[kFiles];
        int64_t written[kFiles] = {};
        int64_t failed[kFiles] = {};
        std::string tags[kFiles];
        auto log_line = [&](int i) {
          const std::string line = absl::StrCat(tags[i], written[i] + failed[i], "\n");
          if (write(fds[i], line.data(), line.size()) == static_cast<ssize_t>(line.size())) {
            ++written[i];
          } else {
            ++failed[i];
          }
        };
        std::atomic<int> served{0};
        {
          DefaultProfiler profiler(options);
          auto self = profiler.RegisterThread("main");
          if (!profiler.Start().ok()) return 2;
          const std::string address = profiler.http_address();
          if (address.empty()) return 2;
          // The client asks before the program closes everything: one
          // answer, then a capture in flight (its connection open in the
          // server) when close_range runs.
          std::atomic<bool> stop{false};
          std::atomic<int> asked{0};
          std::atomic<bool> closed{false};
          // The client is not the program: its sockets live in a
          // descriptor table of its own, out of the program's close_range.
          std::atomic<bool> unshared{true};
          std::thread client([&] {
            if (unshare(CLONE_FILES) != 0) {
              unshared.store(false);
              asked.store(2);
              return;
            }
            // Until the program is done and at least one request made
            // after close_range has its answer: a capture in flight at
            // close_range that ends after the program's 2 s (a loaded
            // machine, under ASan) left none made after it (a CI run:
            // "answered no request after close_range").
            int answered_after = 0;
            while (!stop.load() || answered_after == 0) {
              const bool after = closed.load();
              asked.fetch_add(1);
              const ::inprof::testing::HttpReply r = ::inprof::testing::HttpFetch(
                  address, "GET", "/debug/pprof/profile?seconds=1");
              if (after) ++answered_after;
              if (r.status == 200 && after) ++served;
              // Refused (the program closed the listening socket): not
              // asked again in a tight loop.
              if (r.status == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
            }
          });
          while (asked.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
          if (!unshared.load()) {
            client.join();
            return 77;
          }
          // Not synchronization: lets the second request's connection
          // reach the server (its capture lasts 1 s).
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          close_range(3, ~0U, 0);
          for (int i = 0; i < kFiles; ++i) {
            tags[i] = absl::StrCat("log-", i, " line ");
            const std::string path = absl::StrCat(dir, "/log-", i);
            fds[i] = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
            if (fds[i] < 0) return 2;
          }
          closed.store(true);
          {
            // Registered threads come and go meanwhile (perf events, the
            // wall sampler's files).
            Threads first(profiler, 1000);
            const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(2);
            while (std::chrono::steady_clock::now() < end) {
              for (int i = 0; i < kFiles; ++i) log_line(i);
              // Pacing, not synchronization: ~2,000 lines per file.
              std::this_thread::sleep_for(std::chrono::microseconds(1000));
            }
            Threads second(profiler, 100);
          }
          stop.store(true);
          client.join();
          if (!profiler.Stop().ok()) return 4;
          for (int i = 0; i < kFiles; ++i) log_line(i);
        }
        for (int i = 0; i < kFiles; ++i) log_line(i);
        std::string wrong;
        for (int i = 0; i < kFiles; ++i) {
          const std::string content = ReadFile(absl::StrCat(dir, "/log-", i));
          int64_t own = 0, foreign = 0;
          for (absl::string_view line : absl::StrSplit(content, '\n', absl::SkipEmpty())) {
            ++(absl::StartsWith(line, tags[i]) ? own : foreign);
          }
          if (failed[i] != 0 || own != written[i] || foreign != 0) {
            absl::StrAppend(&wrong, "log-", i, ": ", written[i], " written, ", failed[i],
                            " failed, ", own, " of its lines and ", foreign,
                            " of others in it; ");
          }
        }
        if (served.load() == 0) {
          absl::StrAppend(&wrong, "the endpoint answered no request after close_range; ");
        }
        if (!wrong.empty()) {
          std::fprintf(stderr, "%s\n", wrong.c_str());
          return 3;
        }
        return 0;
      },
      /*timeout_s=*/60);
  if (rc == 77) GTEST_SKIP() << "unshare(CLONE_FILES) refused: the client cannot keep its sockets apart";
  EXPECT_EQ(rc, 0);
}

// An upload (libcurl) keeps no descriptor from one request to the next:
// neither the connection nor libcurl's wake-up socket pair, whose numbers
// the program could close and reuse before the next upload wrote into them.
TEST(SafetyDescriptorsTest, TheUploadClientKeepsNoDescriptorBetweenRequests) {
  if (safety::kSanitized) GTEST_SKIP() << kForksBesideThreads;
  INPROF_REQUIRE_TOOL("libcurl");
  ASSERT_TRUE(internal::HttpClient::Available().ok()) << internal::HttpClient::Available();
  auto receiver = ::inprof::testing::HttpReceiver::StartTcp();
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  const std::string url = (*receiver)->url() + "/upload";
  // In a child: the receiver's own descriptors (its threads accept and
  // answer here) are not counted.
  const int rc = safety::RunInChild(
      [&url]() -> int {
        internal::HttpClient client;
        internal::HttpRequest request;
        request.url = url;
        request.body = "profile";
        const int before = safety::CountFds();
        for (int i = 0; i < 2; ++i) {
          absl::StatusOr<internal::HttpResponse> r = client.Send(request);
          if (!r.ok() || r->status != 200) return 2;
          if (const int now = safety::CountFds(); now != before) {
            std::fprintf(stderr, "after request %d: %d descriptors, %d before\n",
                         i + 1, now, before);
            return 3;
          }
        }
        return 0;
      },
      /*timeout_s=*/30);
  EXPECT_EQ(rc, 0);
}

// The frame-pointer unwinder's leaf resolver reads a module's call-frame
// information through libdwfl, which would keep the module's file open and
// close that number when the resolver's session ends (at the next dlopen or
// dlclose, or the profiler's end): it keeps no descriptor.
TEST(SafetyDescriptorsTest, TheLeafResolverKeepsNoDescriptorOfTheModulesItReads) {
  Dl_info info;
  ASSERT_NE(dladdr(reinterpret_cast<void*>(&getpid), &info), 0);
  ASSERT_NE(info.dli_fname, nullptr);
  const std::string libc = info.dli_fname;
  const std::string libc_name = libc.substr(libc.rfind('/') + 1);
  const int before = DescriptorsOn(libc_name);
  internal::LeafFrameResolver resolver;
  resolver.Refresh();
  ASSERT_TRUE(resolver.InModule(reinterpret_cast<uintptr_t>(&getpid)));
  // getpid is a leaf without a frame record: its CFA is rsp + 8.
  EXPECT_EQ(resolver.ReturnAddressSlot(reinterpret_cast<uintptr_t>(&getpid)), 0);
  EXPECT_EQ(DescriptorsOn(libc_name), before);
}

std::string Cli() { return ::inprof::testing::EnvOrEmpty("INPROF_CLI"); }
std::string Target() {
  return ::inprof::testing::EnvOrEmpty("INPROF_DESCRIPTORS_TARGET");
}

// The preload library cannot be loaded into a program without the
// sanitizer's runtime loaded first.
#define SKIP_UNDER_SANITIZERS()                                          \
  if (safety::kSanitized) {                                              \
    GTEST_SKIP() << "`inprof run` needs the sanitizer's runtime preloaded " \
                    "first; the plain suite runs this";                  \
  }

// Runs `cmd` under /bin/sh in a child process; the child's pid (-1 when
// fork failed).
pid_t SpawnShell(const std::string& cmd) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

// The pid a program wrote to `path`, waited for up to 30 s; 0 if none came.
pid_t AwaitPidFile(const std::string& path) {
  for (int i = 0; i < 3000; ++i) {
    std::ifstream f(path);
    pid_t pid = 0;
    if (f >> pid && pid > 0) return pid;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return 0;
}

// Under `inprof run`: a program that closes every descriptor it inherited
// (inprof's included) and opens 8 files, which take their numbers. While it
// runs its descriptors stay its own files; SIGTERM's default action still
// ends it (status 143 from `sh`, as for a program killed by SIGTERM) after
// the profile is written; no byte lands in its files.
TEST(SafetyDescriptorsTest, UnderInprofRunAProgramThatClosesInheritedDescriptorsStillEndsOnSigterm) {
  SKIP_UNDER_SANITIZERS();
  const std::string dir = FreshDir("run_closefrom");
  const std::string cmd = absl::StrCat(
      ShellQuote(Cli()), " run --period 1ms --wall-period 1ms -o ",
      ShellQuote(dir + "/p-%p.pb.gz"), " -- ", ShellQuote(Target()),
      " closefrom ", ShellQuote(dir), " 2>", ShellQuote(dir + "/err.txt"));
  const pid_t pid = SpawnShell(cmd);
  ASSERT_GE(pid, 0);
  const pid_t target = AwaitPidFile(dir + "/pid");
  if (target <= 0) kill(pid, SIGKILL);
  ASSERT_GT(target, 0) << "the program never wrote its pid: "
                       << ReadFile(dir + "/err.txt");
  ASSERT_EQ(kill(target, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  const std::string err = ReadFile(dir + "/err.txt");
  ASSERT_TRUE(WIFEXITED(status)) << err;
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGTERM) << err;
  EXPECT_EQ(ReadFile(dir + "/check"), "ok") << err;
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(ReadFile(absl::StrCat(dir, "/data-", i)),
              absl::StrCat("the program's file ", i, "\n"))
        << "data-" << i;
  }
  EXPECT_THAT(err, HasSubstr("inprof run: wrote "));
}

// A forked child has the end signals' handlers the preload installed, and
// a watcher of its own behind them: SIGTERM sent to the child ends the
// child (its parent sees "signal 15") and not the parent, which goes on and
// exits 0. (With a pipe between handler and watcher, the child's handler
// woke the parent's watcher: the parent wrote its profile and killed
// itself, and the child lived on.)
TEST(SafetyDescriptorsTest, UnderInprofRunSigtermEndsTheForkedChildItIsSentTo) {
  SKIP_UNDER_SANITIZERS();
  const std::string dir = FreshDir("run_fork");
  const std::string cmd = absl::StrCat(
      ShellQuote(Cli()), " run -q -o ", ShellQuote(dir + "/p-%p.pb.gz"),
      " -- ", ShellQuote(Target()), " fork ", ShellQuote(dir), " 2>",
      ShellQuote(dir + "/err.txt"));
  const pid_t pid = SpawnShell(cmd);
  ASSERT_GE(pid, 0);
  const pid_t child = AwaitPidFile(dir + "/pid");
  if (child <= 0) kill(pid, SIGKILL);
  ASSERT_GT(child, 0) << ReadFile(dir + "/err.txt");
  ASSERT_EQ(kill(child, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  const std::string err = ReadFile(dir + "/err.txt");
  ASSERT_TRUE(WIFEXITED(status)) << err;
  EXPECT_EQ(WEXITSTATUS(status), 0) << err;
  EXPECT_EQ(ReadFile(dir + "/child"), absl::StrCat("signal ", SIGTERM)) << err;
}

// Opened by the program: "opened K" from the target.
int Opened(const std::string& prefix, const std::string& args) {
  auto r = RunCommandSeparately(
      absl::StrCat(prefix, " ", ShellQuote(Target()), " ", args));
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return -1;
  EXPECT_EQ(r->exit_code, 0) << r->err;
  int opened = -1;
  if (std::sscanf(r->out.c_str(), "opened %d", &opened) != 1) {
    ADD_FAILURE() << "no count in '" << r->out << "': " << r->err;
  }
  return opened;
}

// A program that lowers RLIMIT_NOFILE to 16 and runs 12 threads opens as
// many files under `inprof run` as alone (8 of 8), with each engine, with
// and without wall sampling.
TEST(SafetyDescriptorsTest, UnderInprofRunAProgramThatLowersItsDescriptorLimitKeepsItsDescriptors) {
  SKIP_UNDER_SANITIZERS();
  const int alone = Opened("", "rlimit 16 12");
  ASSERT_EQ(alone, 8);
  const std::string dir = FreshDir("run_rlimit");
  for (const char* flags : {"", "--engine timer", "--engine timer --no-wall",
                            "--engine itimer"}) {
    SCOPED_TRACE(flags);
    EXPECT_EQ(Opened(absl::StrCat(ShellQuote(Cli()), " run -q ", flags, " -o ",
                                  ShellQuote(dir + "/p-%p.pb.gz"), " --"),
                     "rlimit 16 12"),
              alone);
  }
}

}  // namespace
}  // namespace inprof
