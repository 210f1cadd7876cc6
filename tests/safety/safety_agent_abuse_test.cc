// The out-of-process agent in a hostile or careless environment: a socket
// somebody squats on and never accepts, a stopped agent, another user's
// connection flood, an agent run out of descriptors, connections that come
// and go by the hundred, an agent restarted on its path after SIGTERM or
// SIGKILL, peers whose names carry newlines and terminal escapes, and a
// greedy process that sends the agent more strings, threads and stacks than
// any profile needs.
//
// Each test states what a host or the agent must never do (hang at
// Start(), spin, lose a profile silently, leak a descriptor, refuse to
// restart, print a peer's control characters) and checks what is
// observable: the one line a host logs, the Reject a process reads, the
// agent's CPU time and descriptors in /proc, the socket file.
//
// "Another user" is uid 65534 (nobody), in a forked child, when the test
// runs as root; those tests skip otherwise.
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inprof/inprof.h"
#include "inprof/internal/agent_protocol.h"
#include "inprof/internal/agent_stream.h"
#include "inprof/pprof_reader.h"
#include "inprof/base/log.h"
#include "safety/safety_util.h"
#include "src/agent/agent_server.h"
#include "util/test_util.h"

namespace inprof {
namespace {

using ::testing::HasSubstr;

constexpr uid_t kNobody = 65534;

std::string Cli() { return testing::EnvOrEmpty("INPROF_CLI"); }

// Becomes nobody (a forked child of a root test).
bool BecomeNobody() {
  return setgroups(0, nullptr) == 0 && setresgid(kNobody, kNobody, kNobody) == 0 &&
         setresuid(kNobody, kNobody, kNobody) == 0;
}

internal::AgentHello Hello(const std::string& program) {
  internal::AgentHello hello;
  hello.pid = getpid();
  hello.program = program;
  hello.max_threads = 1;
  hello.ring_bytes = 4096;
  return hello;
}

// Everything until EOF (or `timeout_ms` without a byte); closes `fd`.
std::string ReadAll(int fd, int timeout_ms = 20000) {
  std::string out;
  char buf[4096];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0) break;
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

// One line from `fd`, waiting at most `timeout_ms` in all.
std::string ReadLine(int fd, int timeout_ms) {
  std::string line;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  char c;
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    if (read(fd, &c, 1) != 1 || c == '\n') break;
    line.push_back(c);
  }
  return line;
}

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

// CPU time (user + system) the process has used, in seconds. The kernel
// splits its exact runtime into /proc's tick fields, so the sum is exact
// to a tick, whatever the machine's load.
double CpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Fields after the command name (which may hold spaces) in parentheses.
  const size_t close_paren = stat.rfind(')');
  if (close_paren == std::string::npos) return -1;
  std::vector<std::string> fields =
      absl::StrSplit(stat.substr(close_paren + 2), ' ', absl::SkipEmpty());
  // fields[0] is field 3 (state); utime and stime are fields 14 and 15.
  if (fields.size() < 13) return -1;
  double utime = 0, stime = 0;
  if (!absl::SimpleAtod(fields[11], &utime) || !absl::SimpleAtod(fields[12], &stime)) {
    return -1;
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// The share of one core `pid` used over the next `seconds`.
double CpuShareOver(pid_t pid, double seconds) {
  const double before = CpuSeconds(pid);
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  const double after = CpuSeconds(pid);
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return (after - before) / wall;
}

// The descriptors `pid` holds, less those open on /proc or /sys: the
// agent reads its own /proc/self/fd (and a library may read /sys) for
// microseconds at a time, and one such read seen by a count is not a leak.
int CountFdsOf(pid_t pid) {
  const std::string dir_path = absl::StrCat("/proc/", pid, "/fd");
  DIR* dir = opendir(dir_path.c_str());
  if (dir == nullptr) return -1;
  int n = 0;
  while (const dirent* entry = readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    char target[256] = {};
    const ssize_t len = readlink(absl::StrCat(dir_path, "/", entry->d_name).c_str(), target,
                                 sizeof(target) - 1);
    if (len > 0 && (absl::StartsWith(target, "/proc/") || absl::StartsWith(target, "/sys/"))) {
      continue;
    }
    ++n;
  }
  closedir(dir);
  return n;
}

// The least of 20 counts 5 ms apart: a descriptor open for a moment adds to
// one count, a leaked or kept one to all.
int SettledFdsOf(pid_t pid) {
  int least = CountFdsOf(pid);
  for (int i = 0; i < 19; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    least = std::min(least, CountFdsOf(pid));
  }
  return least;
}

// `inprof agent --socket ADDRESS` in a child, optionally with its
// descriptor limit (soft and hard) set to `nofile`; ready once it printed
// its address.
struct Agent {
  pid_t pid = -1;
  int err = -1;  // its stderr
  int out = -1;  // its stdout, after the first line
  std::string first_line;

  // Stops it with `sig` and returns its stderr; `status` gets its wait status.
  std::string Stop(int sig = SIGTERM, int* status = nullptr) {
    if (pid <= 0) return "";
    kill(pid, sig);
    std::string log = ReadAll(err);
    int st = 0;
    waitpid(pid, &st, 0);
    if (status != nullptr) *status = st;
    close(out);
    pid = -1;
    return log;
  }
  ~Agent() { Stop(SIGKILL); }
};

void StartAgent(Agent& agent, const std::string& address, rlim_t nofile = 0,
                std::vector<std::string> extra = {}) {
  int out[2], err[2];
  ASSERT_EQ(pipe2(out, O_CLOEXEC), 0);
  ASSERT_EQ(pipe2(err, O_CLOEXEC), 0);
  std::vector<std::string> args = {Cli(), "agent", "--socket", address};
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  fflush(nullptr);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(out[1], 1);
    dup2(err[1], 2);
    if (nofile != 0) {
      const rlimit rl{nofile, nofile};
      if (setrlimit(RLIMIT_NOFILE, &rl) != 0) _exit(126);
    }
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  agent.pid = pid;
  agent.err = err[0];
  agent.out = out[0];
  agent.first_line = ReadLine(out[0], 10000);
}

// A host: a forked child whose profiler has `socket` as INPROF_AGENT_SOCKET.
struct HostRun {
  int exit_code = -1;
  bool started = false;
  int64_t start_ms = -1;  // how long Start() took
  std::string err;        // its stderr
};

HostRun RunHost(const std::function<void(Options&)>& configure) {
  HostRun run;
  int err[2], result[2];
  if (pipe2(err, O_CLOEXEC) != 0 || pipe2(result, O_CLOEXEC) != 0) return run;
  const std::string output =
      absl::StrCat(testing::TestTmpDir(), "/safety_agent_abuse_host.pb.gz");
  fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    // A hang is killed here, and reads as exit code 128 + SIGALRM.
    signal(SIGALRM, SIG_DFL);
    alarm(30);
    dup2(err[1], 2);
    Options options;
    options.output = output;
    options.wall_period = absl::ZeroDuration();
    configure(options);
    DefaultProfiler profiler(options);
    const auto t0 = std::chrono::steady_clock::now();
    const absl::Status st = profiler.Start();
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::steady_clock::now() - t0)
                        .count();
    const std::string line = absl::StrCat(st.ok() ? 1 : 0, " ", ms);
    (void)!write(result[1], line.data(), line.size());
    profiler.Stop().IgnoreError();
    _exit(0);
  }
  close(err[1]);
  close(result[1]);
  run.err = ReadAll(err[0], 60000);
  const std::string result_text = ReadAll(result[0], 1000);
  int status = 0;
  waitpid(pid, &status, 0);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::vector<std::string> parts = absl::StrSplit(result_text, ' ');
  if (parts.size() == 2) {
    run.started = parts[0] == "1";
    absl::SimpleAtoi(parts[1], &run.start_ms);
  }
  return run;
}

HostRun RunHost(const std::string& socket) {
  return RunHost([&socket](Options& options) { options.agent_socket = socket; });
}

// The host's lines that name its agent socket.
std::vector<std::string> SocketLines(const HostRun& run) {
  std::vector<std::string> out;
  for (const std::string& line : Lines(run.err)) {
    if (absl::StrContains(line, "INPROF_AGENT_SOCKET=")) out.push_back(line);
  }
  return out;
}

// Non-blocking connections to `address` until its backlog refuses more
// (EAGAIN) or `max` are made.
std::vector<int> FillBacklog(const internal::AgentSocketAddress& address, int max) {
  std::vector<int> fds;
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path + 1, address.name.data(), address.name.size());
  const socklen_t length =
      static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + address.name.size());
  while (static_cast<int>(fds.size()) < max) {
    const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) break;
    if (connect(fd, reinterpret_cast<const sockaddr*>(&sa), length) != 0) {
      close(fd);
      break;
    }
    fds.push_back(fd);
  }
  return fds;
}

// --- A host never hangs at Start() ------------------------------------------

// Whether every thread of `pid` is stopped ('T' in /proc/PID/task/TID/stat).
bool AllThreadsStopped(pid_t pid) {
  DIR* dir = opendir(absl::StrCat("/proc/", pid, "/task").c_str());
  if (dir == nullptr) return false;
  bool all = true;
  int threads = 0;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    ++threads;
    std::ifstream in(absl::StrCat("/proc/", pid, "/task/", e->d_name, "/stat"));
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t close_paren = stat.rfind(')');
    all &= close_paren != std::string::npos && close_paren + 2 < stat.size() &&
           stat[close_paren + 2] == 'T';
  }
  closedir(dir);
  return all && threads > 0;
}

// Somebody binds the agent's name, listens with a backlog of 0, fills it and
// never accepts: a connect() without a time limit waits forever. Start()
// must return after its bounded wait (1 s) -- at once when the kernel says
// the squatter is another user -- with one line, and profile in-process.
TEST(SafetyAgentAbuseTest, ASquatterThatNeverAcceptsCannotHangStart) {
  const bool other_user = geteuid() == 0;
  const internal::AgentSocketAddress address = internal::NewAgentSocketAddress();
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  fflush(nullptr);
  const pid_t squatter = fork();
  ASSERT_GE(squatter, 0);
  if (squatter == 0) {
    close(ready[0]);
    alarm(60);
    if (other_user && !BecomeNobody()) _exit(3);
    const int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::memcpy(sa.sun_path + 1, address.name.data(), address.name.size());
    const socklen_t length =
        static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + address.name.size());
    if (bind(fd, reinterpret_cast<const sockaddr*>(&sa), length) != 0 || listen(fd, 0) != 0) {
      _exit(4);
    }
    const std::vector<int> pending = FillBacklog(address, 8);
    const std::string n = std::to_string(pending.size());
    (void)!write(ready[1], n.data(), n.size());
    close(ready[1]);
    pause();
    _exit(0);
  }
  close(ready[1]);
  const std::string pending = ReadAll(ready[0], 10000);
  ASSERT_NE(pending, "") << "the squatter did not start";
  ASSERT_NE(pending, "0") << "the squatter's backlog took no connection";

  const HostRun host = RunHost(address.ToString());
  kill(squatter, SIGKILL);
  waitpid(squatter, nullptr, 0);
  std::printf("squatter (%s) with %s pending: Start() took %lld ms\n",
              other_user ? "uid 65534" : "this user", pending.c_str(),
              static_cast<long long>(host.start_ms));
  ASSERT_EQ(host.exit_code, 0) << "the host hung (128 + SIGALRM = 142) or failed\n"
                               << host.err;
  EXPECT_TRUE(host.started) << host.err;
  const std::vector<std::string> lines = SocketLines(host);
  ASSERT_EQ(lines.size(), 1u) << host.err;
  EXPECT_THAT(lines[0], HasSubstr("inprof: INPROF_AGENT_SOCKET=" + address.ToString()));
  EXPECT_THAT(lines[0], HasSubstr("; profiling in this process (INPROF_AGENT_FALLBACK=local)"));
  if (other_user) {
    EXPECT_THAT(lines[0], HasSubstr("the socket there is held by uid 65534, not by this "
                                    "process's user (uid 0) or root"));
  } else {
    EXPECT_THAT(lines[0], HasSubstr("no connection taken within 1000 ms (its backlog is "
                                    "full: the agent is stopped or overloaded)"));
    // It waited its whole second for the backlog (deterministic; the
    // printed time is truncated to a millisecond), and the alarm above
    // bounds the wait from above: no hang.
    EXPECT_GE(host.start_ms, 999);
  }
}

// A stopped agent (SIGSTOP) whose backlog of 64 is full: the same bound.
TEST(SafetyAgentAbuseTest, AStoppedAgentWithAFullBacklogCannotHangStart) {
  if (Cli().empty()) GTEST_SKIP() << "INPROF_CLI not set (run under meson test)";
  const internal::AgentSocketAddress address = internal::NewAgentSocketAddress();
  Agent agent;
  StartAgent(agent, address.ToString(), 0, {"--quiet"});
  ASSERT_EQ(agent.first_line, "INPROF_AGENT_SOCKET=" + address.ToString());
  ASSERT_EQ(kill(agent.pid, SIGSTOP), 0);
  // Every thread stopped (a signal is not delivered at once): none takes a
  // connection after the backlog was filled.
  bool stopped = false;
  for (int i = 0; i < 1000 && !stopped; ++i) {
    stopped = AllThreadsStopped(agent.pid);
    if (!stopped) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(stopped);
  const std::vector<int> pending = FillBacklog(address, 1000);
  const HostRun host = RunHost(address.ToString());
  for (int fd : pending) close(fd);
  kill(agent.pid, SIGCONT);
  std::printf("stopped agent, %zu connections pending: Start() took %lld ms\n",
              pending.size(), static_cast<long long>(host.start_ms));
  EXPECT_GE(pending.size(), 64u);  // listen(64) takes 65
  EXPECT_LT(pending.size(), 1000u) << "connect() never said the backlog was full";
  ASSERT_EQ(host.exit_code, 0) << "the host hung (142 = SIGALRM) or failed\n" << host.err;
  EXPECT_TRUE(host.started);
  const std::vector<std::string> lines = SocketLines(host);
  ASSERT_EQ(lines.size(), 1u) << host.err;
  EXPECT_THAT(lines[0], HasSubstr("no connection taken within 1000 ms (its backlog is full: "
                                  "the agent is stopped or overloaded); profiling in this "
                                  "process (INPROF_AGENT_FALLBACK=local)"));
  EXPECT_GE(host.start_ms, 999);  // its whole second, as above
}

// INPROF_AGENT=spawn with a binary that never detaches (not the inprof
// tool, or a hung one): Start() waited for it to exit, without a limit.
// It now waits its 2 s for the agent's first line, kills what is left and
// profiles in-process with one line.
TEST(SafetyAgentAbuseTest, AnAgentBinaryThatNeverDetachesCannotHangStart) {
  const std::string binary =
      absl::StrCat(testing::TestTmpDir(), "/safety_agent_abuse_hang_", getpid(), ".sh");
  {
    std::ofstream script(binary);
    script << "#!/bin/sh\nexec sleep 100\n";
  }
  ASSERT_EQ(chmod(binary.c_str(), 0755), 0);
  const HostRun host = RunHost([&binary](Options& options) {
    options.agent_spawn = true;
    options.agent_binary = binary;
  });
  unlink(binary.c_str());
  std::printf("an agent binary that never detaches: Start() took %lld ms\n",
              static_cast<long long>(host.start_ms));
  ASSERT_EQ(host.exit_code, 0) << "the host hung (142 = SIGALRM) or failed\n" << host.err;
  EXPECT_TRUE(host.started);
  std::vector<std::string> lines;
  for (const std::string& line : Lines(host.err)) {
    if (absl::StrContains(line, "INPROF_AGENT=spawn")) lines.push_back(line);
  }
  ASSERT_EQ(lines.size(), 1u) << host.err;
  EXPECT_THAT(lines[0], HasSubstr("INPROF_AGENT=spawn: '" + binary +
                                  "' did not start an agent within 2000 ms"));
  EXPECT_THAT(lines[0], HasSubstr("; profiling in this process (INPROF_AGENT_FALLBACK=local)"));
}

// --- The agent neither spins nor starves ------------------------------------

// The agent runs out of descriptors (here: its own process fills them) and
// a process connects. accept() fails with EMFILE, the connection stays
// pending and poll() reports the socket ready at once, forever: a spin,
// and a process left waiting. The agent must take the connection with its
// spare descriptor and refuse it (the process then profiles itself), and
// stay idle.
//
// The bound: an idle agent wakes from poll() at most 10 times a second
// (its 100 ms timeout), microseconds each, so it uses far below 1% of a
// core; CPU time is what the kernel charged it, which a loaded machine
// does not inflate. 30% leaves a margin of more than 30x. A spinning one
// is runnable all the time (100% on an idle core).
TEST(SafetyAgentAbuseTest, AnAgentOutOfDescriptorsTellsTheProcessAndDoesNotSpin) {
  const internal::AgentSocketAddress address = internal::NewAgentSocketAddress();
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  fflush(nullptr);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(ready[0]);
    alarm(60);
    agent::AgentServerOptions options;
    options.address = address;
    agent::AgentServer server(options);
    if (!server.Start().ok()) _exit(3);
    // Every descriptor in use, up to a limit near the current count.
    const rlimit rl{static_cast<rlim_t>(safety::CountFds() + 16),
                    static_cast<rlim_t>(safety::CountFds() + 16)};
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) _exit(4);
    while (open("/dev/null", O_RDONLY) >= 0) {
    }
    (void)!write(ready[1], "r", 1);  // kept open: closing it would free one
    pause();
    _exit(0);
  }
  close(ready[1]);
  char r = 0;
  pollfd p{ready[0], POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 10000), 1);
  ASSERT_EQ(read(ready[0], &r, 1), 1);
  close(ready[0]);
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto connection = internal::ConnectToAgent(address, Hello("late"), 2000);
    ASSERT_FALSE(connection.ok());
    EXPECT_THAT(std::string(connection.status().message()),
                HasSubstr("the agent refused: the agent is out of file descriptors (Too "
                          "many open files; its limit is "))
        << "attempt " << attempt;
  }
  const double share = CpuShareOver(child, 1.0);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  std::printf("agent out of descriptors: %.1f%% of a core over 1 s\n", 100 * share);
  EXPECT_GE(share, 0.0);
  EXPECT_LT(share, 0.30);
}

// Another user floods the agent with connections it holds and never says
// hello on: each used to hold a descriptor in the agent for the 2 s
// handshake wait, so 300 of them ran an agent with 128 descriptors out
// (and into the spin above). Another user's connection is refused as it is
// accepted now: the agent stays idle (the bound above) and its descriptors
// flat, and the agent's own user is served throughout.
TEST(SafetyAgentAbuseTest, AnotherUsersConnectionFloodNeitherSpinsNorStarvesTheAgent) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to act as another user";
  if (Cli().empty()) GTEST_SKIP() << "INPROF_CLI not set (run under meson test)";
  const internal::AgentSocketAddress address = internal::NewAgentSocketAddress();
  Agent agent;
  StartAgent(agent, address.ToString(), 128, {"--quiet"});
  ASSERT_EQ(agent.first_line, "INPROF_AGENT_SOCKET=" + address.ToString());
  const int fds_before = SettledFdsOf(agent.pid);
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  fflush(nullptr);
  const pid_t flood = fork();
  ASSERT_GE(flood, 0);
  if (flood == 0) {
    close(ready[0]);
    alarm(60);
    if (!BecomeNobody()) _exit(3);
    // 300 connections, made as fast as the agent takes them, then held.
    std::vector<int> held;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (held.size() < 300 && std::chrono::steady_clock::now() < deadline) {
      std::vector<int> some = FillBacklog(address, static_cast<int>(300 - held.size()));
      held.insert(held.end(), some.begin(), some.end());
      if (some.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    const std::string n = std::to_string(held.size());
    (void)!write(ready[1], n.data(), n.size());
    close(ready[1]);
    pause();
    _exit(0);
  }
  close(ready[1]);
  const std::string held = ReadAll(ready[0], 20000);
  const double share = CpuShareOver(agent.pid, 1.0);
  const int fds_during = CountFdsOf(agent.pid);
  auto served = internal::ConnectToAgent(address, Hello("legitimate"), 2000);
  kill(flood, SIGKILL);
  waitpid(flood, nullptr, 0);
  std::printf("flood of %s connections from uid 65534: agent %.1f%% of a core, fds %d -> %d\n",
              held.c_str(), 100 * share, fds_before, fds_during);
  EXPECT_EQ(held, "300");
  EXPECT_LT(share, 0.30);  // the bound of the test above
  EXPECT_LE(fds_during, fds_before + 2);
  ASSERT_TRUE(served.ok()) << served.status();
  close(served->socket);
  close(served->region_fd);
  const std::string log = agent.Stop();
  // One line per refusal, at most 10 a second, the rest counted.
  const std::string head = log.substr(0, 2000);
  EXPECT_THAT(log, HasSubstr("(uid 65534): uid 65534 may not use this agent")) << head;
  EXPECT_THAT(log, HasSubstr("more lines like the last (connections refused or not "
                             "accepted) in the last second were not logged"))
      << head;
  EXPECT_LT(Lines(log).size(), 60u) << head;
}

// The agent's own user opening connections that never say hello: at most
// 16 wait at a time; the next is told at once (it does not wait the 2 s
// of the handshake), and once they are gone the user is served again.
TEST(SafetyAgentAbuseTest, SilentConnectionsOfOneUserAreBounded) {
  agent::AgentServerOptions options;
  options.address = internal::NewAgentSocketAddress();
  options.handshake_timeout_ms = 10000;
  agent::AgentServer server(options);
  ASSERT_TRUE(server.Start().ok());
  std::vector<int> silent;
  for (int i = 0; i < agent::AgentServer::kMaxPendingPerUid; ++i) {
    auto fd = internal::ConnectAgentSocket(options.address, 2000);
    ASSERT_TRUE(fd.ok()) << fd.status();
    silent.push_back(*fd);
  }
  // The backlog is taken in order: the 16 wait when the next is accepted.
  auto one_more = internal::ConnectToAgent(options.address, Hello("17th"), 2000);
  ASSERT_FALSE(one_more.ok());
  EXPECT_THAT(std::string(one_more.status().message()),
              HasSubstr("the agent refused: too many connections wait for their hello "
                        "(16 of uid "));
  for (int fd : silent) close(fd);
  bool served = false;
  for (int i = 0; i < 100 && !served; ++i) {
    auto c = internal::ConnectToAgent(options.address, Hello("after"), 2000);
    if (c.ok()) {
      served = true;
      close(c->socket);
      close(c->region_fd);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  EXPECT_TRUE(served);
}

// --- Descriptors --------------------------------------------------------------

// 40 processes connect and leave, one after the other, then 8 at once: the
// agent's descriptors come back to where they were (each connection used
// to leave its region's memfd behind).
TEST(SafetyAgentAbuseTest, TheAgentsDescriptorsStayFlatAcrossConnections) {
  if (Cli().empty()) GTEST_SKIP() << "INPROF_CLI not set (run under meson test)";
  const internal::AgentSocketAddress address = internal::NewAgentSocketAddress();
  Agent agent;
  StartAgent(agent, address.ToString(), 0, {"--quiet"});
  ASSERT_EQ(agent.first_line, "INPROF_AGENT_SOCKET=" + address.ToString());
  const int before = SettledFdsOf(agent.pid);
  auto settle = [&](int want) {
    for (int i = 0; i < 500 && CountFdsOf(agent.pid) != want; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return CountFdsOf(agent.pid);
  };
  for (int i = 0; i < 40; ++i) {
    auto c = internal::ConnectToAgent(address, Hello("cycle"), 2000);
    ASSERT_TRUE(c.ok()) << c.status();
    close(c->socket);
    close(c->region_fd);
  }
  const int after_cycles = settle(before);
  std::vector<internal::AgentConnection> connected;
  for (int i = 0; i < 8; ++i) {
    auto c = internal::ConnectToAgent(address, Hello("held"), 2000);
    ASSERT_TRUE(c.ok()) << c.status();
    connected.push_back(*c);
  }
  const int while_connected = CountFdsOf(agent.pid);
  for (const auto& c : connected) {
    close(c.socket);
    close(c.region_fd);
  }
  const int after_all = settle(before);
  std::printf("agent fds: %d before, %d after 40 cycles, %.1f per connected process, "
              "%d after they left\n",
              before, after_cycles, (while_connected - before) / 8.0, after_all);
  EXPECT_EQ(after_cycles, before);
  EXPECT_EQ(after_all, before);
}

// An agent near its descriptor limit refuses the next process with one
// line, and that process is told why and profiles itself -- rather than
// being welcomed into a session whose files cannot be opened (its profile
// lost or unsymbolized) or the agent running out altogether.
TEST(SafetyAgentAbuseTest, AnAgentNearItsDescriptorLimitRefusesWithOneLine) {
  if (Cli().empty()) GTEST_SKIP() << "INPROF_CLI not set (run under meson test)";
  const internal::AgentSocketAddress address = internal::NewAgentSocketAddress();
  Agent agent;
  StartAgent(agent, address.ToString(), 192);  // soft = hard: not raised
  ASSERT_EQ(agent.first_line, "INPROF_AGENT_SOCKET=" + address.ToString());
  std::vector<internal::AgentConnection> connected;
  std::string refusal;
  for (int i = 0; i < 60 && refusal.empty(); ++i) {
    auto c = internal::ConnectToAgent(address, Hello("many"), 5000);
    if (c.ok()) {
      connected.push_back(*c);
    } else {
      refusal = std::string(c.status().message());
    }
  }
  const int fds = CountFdsOf(agent.pid);
  std::printf("agent with 192 descriptors: %zu processes served, %d open, then: %s\n",
              connected.size(), fds, refusal.c_str());
  EXPECT_GE(connected.size(), 1u);
  EXPECT_THAT(refusal, HasSubstr("the agent refused: the agent is near its descriptor "
                                 "limit ("));
  EXPECT_LE(fds, 192);
  // A process that links inprof: told, and profiles itself.
  const HostRun host = RunHost(address.ToString());
  ASSERT_EQ(host.exit_code, 0) << host.err;
  EXPECT_TRUE(host.started);
  const std::vector<std::string> lines = SocketLines(host);
  ASSERT_EQ(lines.size(), 1u) << host.err;
  EXPECT_THAT(lines[0], HasSubstr("the agent refused: the agent is near its descriptor limit"));
  EXPECT_THAT(lines[0], HasSubstr("; profiling in this process (INPROF_AGENT_FALLBACK=local)"));
  for (const auto& c : connected) {
    close(c.socket);
    close(c.region_fd);
  }
  const std::string log = agent.Stop();
  size_t refusal_lines = 0;
  for (const std::string& line : Lines(log)) {
    refusal_lines += absl::StrContains(line, "near its descriptor limit");
  }
  EXPECT_EQ(refusal_lines, 2u) << log;  // the raw connection and the host
}

// --- Restart on the same path -------------------------------------------------

std::string TempSocketPath() {
  // sun_path holds 107 bytes: a short directory of its own.
  char dir[] = "/tmp/inprof-abuse-XXXXXX";
  if (mkdtemp(dir) == nullptr) return "";
  return std::string(dir) + "/agent.sock";
}

bool IsSocket(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
}

// `inprof agent --socket PATH`: SIGTERM removes PATH; a restart after
// SIGKILL (PATH left behind, nothing listening) replaces the stale socket.
TEST(SafetyAgentAbuseTest, TheAgentRestartsOnItsPathAfterSigtermAndAfterSigkill) {
  if (Cli().empty()) GTEST_SKIP() << "INPROF_CLI not set (run under meson test)";
  const std::string path = TempSocketPath();
  ASSERT_FALSE(path.empty());
  auto address = internal::ParseAgentSocketAddress(path);
  ASSERT_TRUE(address.ok());
  {
    Agent agent;
    StartAgent(agent, path);
    ASSERT_EQ(agent.first_line, "INPROF_AGENT_SOCKET=" + path);
    int status = 0;
    const std::string log = agent.Stop(SIGTERM, &status);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << log;
    EXPECT_FALSE(IsSocket(path)) << "SIGTERM left " << path << " behind";
  }
  {
    Agent agent;
    StartAgent(agent, path);
    ASSERT_EQ(agent.first_line, "INPROF_AGENT_SOCKET=" + path);
    agent.Stop(SIGKILL);
    EXPECT_TRUE(IsSocket(path)) << "SIGKILL leaves the socket (nothing can remove it)";
  }
  Agent agent;
  StartAgent(agent, path);
  EXPECT_EQ(agent.first_line, "INPROF_AGENT_SOCKET=" + path);
  auto c = internal::ConnectToAgent(*address, Hello("after-restart"), 5000);
  ASSERT_TRUE(c.ok()) << c.status();
  close(c->socket);
  close(c->region_fd);
  const std::string log = agent.Stop(SIGINT);
  EXPECT_THAT(log, HasSubstr("inprof agent: replaced the stale socket at " + path)) << log;
  EXPECT_FALSE(IsSocket(path));
  rmdir(path.substr(0, path.rfind('/')).c_str());
}

// What is not this agent's stale socket is never removed: a listening
// agent's socket, a regular file, another user's socket.
TEST(SafetyAgentAbuseTest, TheAgentNeverReplacesWhatIsNotItsStaleSocket) {
  if (Cli().empty()) GTEST_SKIP() << "INPROF_CLI not set (run under meson test)";
  const std::string path = TempSocketPath();
  ASSERT_FALSE(path.empty());
  auto address = internal::ParseAgentSocketAddress(path);
  ASSERT_TRUE(address.ok());
  {
    Agent first;
    StartAgent(first, path);
    ASSERT_EQ(first.first_line, "INPROF_AGENT_SOCKET=" + path);
    Agent second;
    StartAgent(second, path);
    int status = 0;
    const std::string log = second.Stop(SIGTERM, &status);
    EXPECT_EQ(second.first_line, "");
    EXPECT_THAT(log, HasSubstr("agent socket \"" + path +
                               "\": already in use (another agent listens there)"));
    auto c = internal::ConnectToAgent(*address, Hello("first"), 5000);
    ASSERT_TRUE(c.ok()) << c.status();
    close(c->socket);
    close(c->region_fd);
    first.Stop();
    ASSERT_FALSE(IsSocket(path));
  }
  {
    std::ofstream(path) << "not a socket\n";
    Agent agent;
    StartAgent(agent, path);
    const std::string log = agent.Stop();
    EXPECT_THAT(log, HasSubstr("\": a file that is not a socket is there (not replaced)"));
    std::ifstream in(path);
    std::string content;
    std::getline(in, content);
    EXPECT_EQ(content, "not a socket");
    unlink(path.c_str());
  }
  if (geteuid() == 0) {
    // A stale socket of nobody's.
    const int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::memcpy(sa.sun_path, path.data(), path.size());
    ASSERT_EQ(bind(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof(sa)), 0);
    close(fd);
    ASSERT_EQ(chown(path.c_str(), kNobody, kNobody), 0);
    Agent agent;
    StartAgent(agent, path);
    const std::string log = agent.Stop();
    EXPECT_THAT(log, HasSubstr("\": a socket of uid 65534 is there (not replaced"));
    EXPECT_TRUE(IsSocket(path));
    unlink(path.c_str());
  }
  rmdir(path.substr(0, path.rfind('/')).c_str());
}

// --- Untrusted strings in logs ------------------------------------------------

std::string g_captured;
void Capture(absl::string_view line) { g_captured.append(line.data(), line.size()); }

TEST(SafetyAgentAbuseTest, LogEscapesControlCharactersAndKeepsOneLine) {
  g_captured.clear();
  internal::SetLogSinkForTesting(&Capture);
  internal::Log("program \"evil\n\x1b[31mred\r\t\x7f\" caf\xc3\xa9 \xc2\x9b" "2J \xff end");
  internal::SetLogSinkForTesting(nullptr);
  EXPECT_EQ(g_captured,
            "inprof: program \"evil\\n\\x1b[31mred\\r\\t\\x7f\" caf\xc3\xa9 "
            "\\xc2\\x9b2J \\xff end\n");
  const std::string once = internal::EscapeForLog("a\nb\x1b\xc2\x85z\xe2\x82");
  EXPECT_EQ(once, "a\\nb\\x1b\\xc2\\x85z\\xe2\\x82");
  EXPECT_EQ(internal::EscapeForLog(once), once);
}

// A process whose program name carries a newline and a colour escape: the
// agent's lines show it escaped, one line each; and a host whose
// INPROF_AGENT_SOCKET does the same logs one escaped line.
TEST(SafetyAgentAbuseTest, PeerAndUserStringsAreLoggedEscaped) {
  if (Cli().empty()) GTEST_SKIP() << "INPROF_CLI not set (run under meson test)";
  const internal::AgentSocketAddress address = internal::NewAgentSocketAddress();
  Agent agent;
  StartAgent(agent, address.ToString());
  ASSERT_EQ(agent.first_line, "INPROF_AGENT_SOCKET=" + address.ToString());
  const std::string evil = "evil\n\x1b[31mred";
  auto c = internal::ConnectToAgent(address, Hello(evil), 5000);
  ASSERT_TRUE(c.ok()) << c.status();
  close(c->socket);
  close(c->region_fd);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const std::string log = agent.Stop();
  EXPECT_EQ(log.find('\x1b'), std::string::npos) << log;
  EXPECT_THAT(log, HasSubstr(absl::StrCat("inprof agent: pid ", getpid(),
                                          " (evil\\n\\x1b[31mred) connected")))
      << log;
  for (const std::string& line : Lines(log)) {
    EXPECT_TRUE(absl::StartsWith(line, "inprof agent")) << line;
  }

  const std::string socket = absl::StrCat("@inprof-evil\n\x1b[31m-", getpid());
  const HostRun host = RunHost(socket);
  ASSERT_EQ(host.exit_code, 0) << host.err;
  EXPECT_EQ(host.err.find('\x1b'), std::string::npos) << host.err;
  const std::vector<std::string> lines = SocketLines(host);
  ASSERT_EQ(lines.size(), 1u) << host.err;
  EXPECT_THAT(lines[0], HasSubstr(absl::StrCat("INPROF_AGENT_SOCKET=@inprof-evil\\n\\x1b[31m-",
                                               getpid(), ": ")));
}

// --- A greedy process ---------------------------------------------------------

// A process of the agent's written by hand: connects, maps its ring and
// pushes records, waiting (at most 30 s in all) while the ring is full.
struct RawClient {
  internal::AgentConnection connection;
  void* region = nullptr;
  std::unique_ptr<internal::AgentRingWriter> ring;
  int64_t deadline_ns = 0;

  bool Connect(const internal::AgentSocketAddress& address, const std::string& program) {
    internal::AgentHello hello = Hello(program);
    hello.ring_bytes = internal::kAgentMaxRingBytes;
    auto c = internal::ConnectToAgent(address, hello, 5000);
    if (!c.ok()) return false;
    connection = *c;
    region = mmap(nullptr, connection.welcome.region_bytes, PROT_READ | PROT_WRITE,
                  MAP_SHARED, connection.region_fd, 0);
    if (region == MAP_FAILED) return false;
    ring = std::make_unique<internal::AgentRingWriter>(region, connection.welcome.region_bytes);
    deadline_ns = safety::MonotonicNow() + 30'000'000'000LL;
    internal::AgentDescribe d;
    d.sample_types = {{"samples", "count"}, {"cpu-time", "nanoseconds"}};
    d.period_type = {"cpu-time", "nanoseconds"};
    d.period = 10'000'000;
    d.engine = "raw";
    return Push(d);
  }
  bool Push(const internal::AgentOp& op) {
    const std::vector<uint64_t> words = internal::EncodeAgentOp(op);
    while (!ring->Push(words)) {
      if (safety::MonotonicNow() > deadline_ns) return false;
      usleep(500);
    }
    return true;
  }
  // The end record, then the connection closes: the agent exports.
  bool End() {
    const bool ok = Push(internal::AgentEnd{});
    close(connection.socket);
    return ok;
  }
};

// VmRSS (or `field`: VmHWM, the peak) of `pid` in KiB; -1 when unreadable.
int64_t VmRssKiB(pid_t pid, const std::string& field = "VmRSS:") {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    int64_t kib = 0;
    if (absl::StartsWith(line, field) &&
        absl::SimpleAtoi(
            absl::StripSuffix(absl::StripAsciiWhitespace(line.substr(field.size())), " kB"),
            &kib)) {
      return kib;
    }
  }
  return -1;
}

// The mappings of process `pid` holding more than `min_kib` of RSS, a line
// each ("start-end perms name: N KiB"): where a grown process's memory is.
std::string BigMappings(pid_t pid, int64_t min_kib) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/smaps"));
  std::string line, header, out;
  while (std::getline(in, line)) {
    if (!line.empty() && absl::ascii_isxdigit(static_cast<unsigned char>(line[0])) &&
        line.find('-') != std::string::npos && line.find(':') > line.find(' ')) {
      header = line;
      continue;
    }
    int64_t kib = 0;
    if (absl::StartsWith(line, "Rss:") &&
        absl::SimpleAtoi(absl::StripSuffix(absl::StripAsciiWhitespace(line.substr(4)), " kB"),
                         &kib) &&
        kib > min_kib) {
      absl::StrAppend(&out, header, ": ", kib, " KiB\n");
    }
  }
  return out;
}

// Runs `body` in a forked child (a process of its own pid); its exit code.
int InChild(const std::function<bool()>& body) {
  fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(120);
    _exit(body() ? 0 : 1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// One process sends 2,000 label strings of 32 KiB (20,000 with
// INPROF_SAFETY_FULL=1), then 65,535 short ones, 17,000 threads and 1,100
// stacks of 4,096 frames. The agent once interned every string into one
// table shared by all processes, never shrunk (1.29 GB for 20,000 strings,
// still held after the process left), and a later process's labels read
// "[inprof: label table full]". Now each process has its own table and
// quotas, refused once with a line naming it, released when it ends.
TEST(SafetyAgentAbuseTest, AGreedyProcessCannotGrowTheAgentOrSpoilLaterLabels) {
  if (Cli().empty()) GTEST_SKIP() << "INPROF_CLI not set (run under meson test)";
  const std::string dir = testing::FreshTestDir("agent_greedy");
  const internal::AgentSocketAddress address = internal::NewAgentSocketAddress();
  Agent agent;
  StartAgent(agent, address.ToString(), 0, {"-o", dir + "/agent-%p.pb.gz"});
  ASSERT_EQ(agent.first_line, "INPROF_AGENT_SOCKET=" + address.ToString());
  const int64_t rss_start = VmRssKiB(agent.pid);

  const int64_t big = safety::Scaled(2'000, 20'000);
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const int greedy_code = InChild([&] {
    close(pipe_fds[0]);
    const std::string pid = absl::StrCat(getpid());
    (void)!write(pipe_fds[1], pid.data(), pid.size());
    close(pipe_fds[1]);
    RawClient c;
    if (!c.Connect(address, "greedy")) return false;
    const std::string filler(32 * 1024 - 16, 'x');
    for (int64_t i = 0; i < big; ++i) {
      // Ids within the process's table, reused: each text is new.
      if (!c.Push(internal::AgentString{static_cast<uint32_t>(1 + i % 60'000),
                                        absl::StrCat(i, filler)})) {
        return false;
      }
    }
    for (uint32_t id = 1; id < 65'536; ++id) {
      if (!c.Push(internal::AgentString{id, absl::StrCat("s", id)})) return false;
    }
    for (uint32_t t = 0; t < 17'000; ++t) {
      if (!c.Push(internal::AgentThreadAdd{t, 100'000 + t, "greedy"})) return false;
    }
    std::vector<uint64_t> frames(internal::kAgentOpMaxFrames, 0x1000);
    for (uint64_t s = 0; s < 1'100; ++s) {
      frames[0] = 0x2000 + s;
      internal::AgentSample sample;
      sample.thread = 0;
      sample.values = {1, 10'000'000};
      sample.frames = frames;
      if (!c.Push(sample)) return false;
    }
    return c.End();
  });
  close(pipe_fds[1]);
  const std::string greedy_pid = ReadAll(pipe_fds[0], 5000);
  ASSERT_EQ(greedy_code, 0) << "the greedy process could not send (agent stuck?)";

  // Its last window exported (the agent's summary line), its session freed.
  std::string log;
  const int64_t until = safety::MonotonicNow() + 60'000'000'000LL;
  for (;;) {
    ASSERT_LT(safety::MonotonicNow(), until) << log;
    const std::string line = ReadLine(agent.err, 1000);
    log += line + "\n";
    if (absl::StrContains(line, absl::StrCat("pid ", greedy_pid, " (greedy): ")) &&
        absl::StrContains(line, " profiles")) {
      break;
    }
  }
  // What the agent holds after the process left: the smallest of a few
  // readings over up to 5 s (its memory is returned as the session is
  // freed, a moment after the summary line; 16 MiB: settled).
  int64_t rss_after = VmRssKiB(agent.pid);
  for (int i = 0; i < 50 && rss_after - rss_start > 16 * 1024; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    rss_after = std::min(rss_after, VmRssKiB(agent.pid));
  }
  // Where it is, when it stayed: said beside the failure. (It stayed, 20-62
  // MiB in ~1 run of 15, while the agent let its threads have arenas of
  // their own: glibc's malloc_trim never shrinks a thread arena's top;
  // src/cli/agent_command.cc.)
  const std::string kept =
      rss_after - rss_start > 16 * 1024 ? BigMappings(agent.pid, 4 * 1024) : std::string();

  // A later process: its labels are its own.
  const int later_code = InChild([&] {
    RawClient c;
    if (!c.Connect(address, "later")) return false;
    const uint64_t frames[] = {0x3000};
    internal::AgentSample sample;
    sample.thread = 0;
    sample.values = {1, 10'000'000};
    sample.labels = {1, 2};
    sample.frames.assign(std::begin(frames), std::end(frames));
    return c.Push(internal::AgentString{1, "endpoint"}) &&
           c.Push(internal::AgentString{2, "/checkout"}) &&
           c.Push(internal::AgentThreadAdd{0, getpid(), "main"}) && c.Push(sample) && c.End();
  });
  ASSERT_EQ(later_code, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const int64_t rss_peak = VmRssKiB(agent.pid, "VmHWM:");
  log += agent.Stop();
  std::printf("safety_agent_greedy: %lld strings of 32 KiB; agent VmRSS %lld KiB at start, "
              "peak %lld KiB, %lld KiB after the greedy process left\n",
              static_cast<long long>(big), static_cast<long long>(rss_start),
              static_cast<long long>(rss_peak), static_cast<long long>(rss_after));

  // Under a sanitizer the agent's freed memory waits in its quarantine
  // (ASan's: 256 MiB) and no malloc_trim gives it back: RSS says nothing.
  if (!safety::kSanitized) {
    EXPECT_LT(rss_after - rss_start, 48 * 1024)
        << "the agent kept the greedy process's " << big * 32 / 1024
        << " MiB of strings; its mappings over 4 MiB:\n"
        << kept;
  }
  // One line per quota, each naming the process, once.
  for (const char* what : {"label strings", "threads", "stacks"}) {
    int lines = 0;
    for (const std::string& line : Lines(log)) {
      lines += absl::StrContains(line, absl::StrCat("pid ", greedy_pid, " (greedy)")) &&
               absl::StrContains(line, "quota") && absl::StrContains(line, what);
    }
    EXPECT_EQ(lines, 1) << what << "\n" << log;
  }
  std::vector<std::string> later = testing::FilesEndingIn(dir, ".pb.gz");
  std::string later_path;
  for (const std::string& path : later) {
    if (!absl::StrContains(path, absl::StrCat("agent-", greedy_pid, "."))) later_path = path;
  }
  ASSERT_FALSE(later_path.empty()) << log;
  auto profile = ReadPprofFile(later_path);
  ASSERT_TRUE(profile.ok()) << profile.status();
  const auto by_endpoint = profile->ByLabel("endpoint", profile->ValueIndex("samples"));
  EXPECT_EQ(by_endpoint.size(), 1u);
  EXPECT_EQ(by_endpoint.count("/checkout"), 1u)
      << ::testing::PrintToString(by_endpoint) << "\n" << log;
}

}  // namespace
}  // namespace inprof
