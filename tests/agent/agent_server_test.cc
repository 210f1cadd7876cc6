#include "src/agent/agent_server.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "inprof/internal/agent_protocol.h"

namespace inprof::agent {
namespace {

using internal::AgentHello;

AgentHello Hello(const std::string& program) {
  AgentHello hello;
  hello.pid = getpid();
  hello.program = program;
  hello.tags = {{"service", program}};
  hello.max_threads = 4;
  hello.ring_bytes = 4096;
  return hello;
}

AgentServerOptions Fresh() {
  AgentServerOptions options;
  options.address = internal::NewAgentSocketAddress();
  options.handshake_timeout_ms = 300;
  return options;
}

// Everything until EOF; closes `fd`.
std::string ReadAll(int fd) {
  std::string out;
  char buf[512];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) out.append(buf, n);
  close(fd);
  return out;
}

template <typename Pred>
bool Eventually(Pred pred) {
  for (int i = 0; i < 300; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

TEST(AgentServerTest, AProcessGetsSharedRingMemoryAndIsKeptAfterItLeaves) {
  AgentServer server(Fresh());
  ASSERT_TRUE(server.Start().ok());
  auto connection = internal::ConnectToAgent(server.address(), Hello("checkout"), 2000);
  ASSERT_TRUE(connection.ok()) << connection.status();
  EXPECT_EQ(connection->welcome.agent_pid, getpid());
  EXPECT_EQ(connection->welcome.region_bytes, 4u * 4096);
  struct stat st;
  ASSERT_EQ(fstat(connection->region_fd, &st), 0);
  EXPECT_EQ(st.st_size, 4 * 4096);
  // Writable by the process; it may not shrink it under the agent.
  void* region = mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED,
                      connection->region_fd, 0);
  ASSERT_NE(region, MAP_FAILED);
  std::memset(region, 0xab, st.st_size);
  munmap(region, st.st_size);
  EXPECT_NE(fcntl(connection->region_fd, F_GET_SEALS) & F_SEAL_SHRINK, 0);
  EXPECT_NE(ftruncate(connection->region_fd, 4096), 0);

  ASSERT_TRUE(Eventually([&] { return server.Processes().size() == 1; }));
  AgentProcess p = server.Processes()[0];
  EXPECT_EQ(p.hello.program, "checkout");
  EXPECT_EQ(p.peer.pid, getpid());
  EXPECT_EQ(p.peer.uid, getuid());
  EXPECT_TRUE(p.connected);

  close(connection->socket);
  close(connection->region_fd);
  EXPECT_TRUE(Eventually([&] { return !server.Processes()[0].connected; }));
  EXPECT_EQ(server.Processes().size(), 1u);  // kept: its samples outlive it
  EXPECT_EQ(server.refused(), 0u);
}

TEST(AgentServerTest, APeerOfAnotherVersionIsToldSo) {
  AgentServer server(Fresh());
  ASSERT_TRUE(server.Start().ok());
  auto fd = internal::ConnectAgentSocket(server.address());
  ASSERT_TRUE(fd.ok()) << fd.status();
  std::string v2 = internal::EncodeAgentMessage(Hello("new"));
  v2[4] = static_cast<char>(internal::kAgentProtocolVersion + 1);
  ASSERT_EQ(send(*fd, v2.data(), v2.size(), MSG_NOSIGNAL), static_cast<ssize_t>(v2.size()));
  auto answer = internal::ReceiveAgentMessage(*fd, 2000);
  ASSERT_TRUE(answer.ok()) << answer.status();
  ASSERT_TRUE(std::holds_alternative<internal::AgentReject>(*answer));
  EXPECT_EQ(std::get<internal::AgentReject>(*answer).reason,
            absl::StrCat("agent protocol version ", internal::kAgentProtocolVersion + 1,
                         ", this side speaks version ", internal::kAgentProtocolVersion,
                         " (use an inprof agent and library of the same release)"));
  close(*fd);
  EXPECT_EQ(server.refused(), 1u);
}

TEST(AgentServerTest, GarbageAndSilenceAreRefusedAndOthersStillServed) {
  AgentServer server(Fresh());
  ASSERT_TRUE(server.Start().ok());
  auto garbage = internal::ConnectAgentSocket(server.address());
  ASSERT_TRUE(garbage.ok());
  ASSERT_EQ(send(*garbage, "GET / HTTP/1.0\r\n\r\n", 18, MSG_NOSIGNAL), 18);
  auto answer = internal::ReceiveAgentMessage(*garbage, 2000);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_NE(std::get<internal::AgentReject>(*answer).reason.find("bad magic"),
            std::string::npos);
  close(*garbage);

  auto silent = internal::ConnectAgentSocket(server.address());
  ASSERT_TRUE(silent.ok());
  answer = internal::ReceiveAgentMessage(*silent, 3000);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(std::get<internal::AgentReject>(*answer).reason, "no hello within 300 ms");
  close(*silent);

  auto good = internal::ConnectToAgent(server.address(), Hello("after"), 2000);
  ASSERT_TRUE(good.ok()) << good.status();
  close(good->socket);
  close(good->region_fd);
  EXPECT_EQ(server.refused(), 2u);
  ASSERT_TRUE(Eventually([&] { return server.Processes().size() == 1; }));
  EXPECT_EQ(server.Processes()[0].hello.program, "after");
}

// The agent stopping (or being killed) under a connected process: the
// process learns it from its socket -- an error, never SIGPIPE.
TEST(AgentServerTest, AGoneAgentIsAnErrorNotASignal) {
  auto server = std::make_unique<AgentServer>(Fresh());
  ASSERT_TRUE(server->Start().ok());
  const internal::AgentSocketAddress address = server->address();
  auto connection = internal::ConnectToAgent(address, Hello("host"), 2000);
  ASSERT_TRUE(connection.ok()) << connection.status();
  server.reset();
  auto next = internal::ReceiveAgentMessage(connection->socket, 2000);
  ASSERT_FALSE(next.ok());
  EXPECT_EQ(next.status().message(), "agent connection: the peer closed it");
  const absl::Status sent = internal::SendAgentMessage(connection->socket, Hello("host"));
  ASSERT_FALSE(sent.ok());
  EXPECT_EQ(sent.message(), "agent connection: the peer is gone");
  close(connection->socket);
  close(connection->region_fd);
  auto again = internal::ConnectToAgent(address, Hello("host"), 2000);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().message(),
            "agent socket \"" + address.ToString() +
                "\": no agent listens there (start one with `inprof agent`)");
}

TEST(AgentServerTest, AnAddressInUseIsNamed) {
  AgentServer first(Fresh());
  ASSERT_TRUE(first.Start().ok());
  AgentServerOptions options = Fresh();
  options.address = first.address();
  AgentServer second(options);
  const absl::Status st = second.Start();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(), "agent socket \"" + first.address().ToString() +
                              "\": already in use (another agent listens there?)");
}

// Peer credentials, both ways: a process of another user is refused by the
// agent unless allowed, and a process refuses an agent of another user.
// Needs root (setuid to nobody in a child).
TEST(AgentServerTest, OtherUsersAreRefusedBothWays) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to act as another user";
  constexpr uid_t kNobody = 65534;
  // A process running as nobody, connecting to this (root's) agent.
  for (bool allow : {false, true}) {
    AgentServerOptions options = Fresh();
    if (allow) options.allowed_uids.push_back(kNobody);
    AgentServer server(options);
    ASSERT_TRUE(server.Start().ok());
    // A child as nobody connects and writes what it got to a pipe.
    int pipefd[2];
    ASSERT_EQ(pipe(pipefd), 0);
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      close(pipefd[0]);
      if (setuid(kNobody) != 0) _exit(3);
      auto c = internal::ConnectToAgent(server.address(), Hello("nobody"), 2000);
      const std::string out = c.ok() ? "welcome" : std::string(c.status().message());
      (void)!write(pipefd[1], out.data(), out.size());
      _exit(0);
    }
    close(pipefd[1]);
    const std::string got = ReadAll(pipefd[0]);
    int status = 0;
    waitpid(child, &status, 0);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    if (allow) {
      EXPECT_EQ(got, "welcome");
    } else {
      EXPECT_EQ(got, "agent socket \"" + server.address().ToString() +
                         "\": the agent refused: uid 65534 may not use this agent "
                         "(it runs as uid 0; `inprof agent --allow-uid 65534` serves "
                         "that user too)");
    }
  }
  // An agent running as nobody; this process (root) will not hand it its
  // samples.
  const internal::AgentSocketAddress address = internal::NewAgentSocketAddress();
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t agent = fork();
  ASSERT_GE(agent, 0);
  if (agent == 0) {
    close(ready[0]);
    if (setuid(kNobody) != 0) _exit(3);
    AgentServerOptions options;
    options.address = address;
    AgentServer server(options);
    if (!server.Start().ok()) _exit(4);
    (void)!write(ready[1], "r", 1);
    pause();
    _exit(0);
  }
  close(ready[1]);
  char r = 0;
  ASSERT_EQ(read(ready[0], &r, 1), 1);
  close(ready[0]);
  auto c = internal::ConnectToAgent(address, Hello("root"), 2000);
  kill(agent, SIGKILL);
  waitpid(agent, nullptr, 0);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(),
            "agent socket \"" + address.ToString() +
                "\": the agent there runs as uid 65534, not as this process's "
                "user (uid 0): refusing to hand it this process's samples");
}

// `inprof agent`: prints where it listens, logs one line per process,
// stops cleanly on SIGTERM.
TEST(AgentServerTest, TheAgentCommandServesUntilSigterm) {
  const char* cli = getenv("INPROF_CLI");
  if (cli == nullptr) GTEST_SKIP() << "INPROF_CLI not set (run under meson test)";
  const internal::AgentSocketAddress address = internal::NewAgentSocketAddress();
  int out[2], err[2];
  ASSERT_EQ(pipe(out), 0);
  ASSERT_EQ(pipe(err), 0);
  const pid_t agent = fork();
  ASSERT_GE(agent, 0);
  if (agent == 0) {
    dup2(out[1], 1);
    dup2(err[1], 2);
    close(out[0]);
    close(err[0]);
    execl(cli, cli, "agent", "--socket", address.ToString().c_str(), nullptr);
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  // Its first line on stdout: the variable to export.
  std::string first;
  char ch;
  while (read(out[0], &ch, 1) == 1 && ch != '\n') first += ch;
  EXPECT_EQ(first, "INPROF_AGENT_SOCKET=" + address.ToString());
  auto c = internal::ConnectToAgent(address, Hello("via-cli"), 5000);
  ASSERT_TRUE(c.ok()) << c.status();
  close(c->socket);
  close(c->region_fd);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  kill(agent, SIGTERM);
  const std::string log = ReadAll(err[0]);
  close(out[0]);
  int status = 0;
  waitpid(agent, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << log;
  EXPECT_NE(log.find("inprof agent: listening on " + address.ToString()), std::string::npos)
      << log;
  EXPECT_NE(log.find("agent: pid " + std::to_string(getpid()) +
                     " (via-cli) connected: 4 rings of 4096 bytes"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("inprof agent: stopped by signal 15; served 1 processes, refused 0"),
            std::string::npos)
      << log;
}

}  // namespace
}  // namespace inprof::agent
