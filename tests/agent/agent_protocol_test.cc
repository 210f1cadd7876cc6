#include "inprof/internal/agent_protocol.h"

#include <unistd.h>

#include <string>

#include "gtest/gtest.h"

namespace inprof::internal {
namespace {

AgentHello SampleHello() {
  AgentHello hello;
  hello.pid = getpid();
  hello.program = "server";
  hello.tags = {{"service", "checkout"}, {"env", "prod"}};
  hello.max_threads = 64;
  hello.ring_bytes = 32768;
  return hello;
}

TEST(AgentProtocolTest, EveryMessageSurvivesTheWire) {
  auto hello = DecodeAgentMessage(EncodeAgentMessage(SampleHello()));
  ASSERT_TRUE(hello.ok()) << hello.status();
  const auto& h = std::get<AgentHello>(*hello);
  EXPECT_EQ(h.pid, getpid());
  EXPECT_EQ(h.program, "server");
  ASSERT_EQ(h.tags.size(), 2u);
  EXPECT_EQ(h.tags[1].first, "env");
  EXPECT_EQ(h.tags[1].second, "prod");
  EXPECT_EQ(h.max_threads, 64u);
  EXPECT_EQ(h.ring_bytes, 32768u);

  auto welcome = DecodeAgentMessage(EncodeAgentMessage(AgentWelcome{1234, 1 << 20}));
  ASSERT_TRUE(welcome.ok()) << welcome.status();
  EXPECT_EQ(std::get<AgentWelcome>(*welcome).agent_pid, 1234);
  EXPECT_EQ(std::get<AgentWelcome>(*welcome).region_bytes, 1u << 20);

  auto reject = DecodeAgentMessage(EncodeAgentMessage(AgentReject{"no room"}));
  ASSERT_TRUE(reject.ok()) << reject.status();
  EXPECT_EQ(std::get<AgentReject>(*reject).reason, "no room");

  auto dump = DecodeAgentMessage(EncodeAgentMessage(AgentDumpRequest{77}));
  ASSERT_TRUE(dump.ok()) << dump.status();
  EXPECT_EQ(std::get<AgentDumpRequest>(*dump).id, 77u);
}

TEST(AgentProtocolTest, EveryTruncationIsAnErrorNamingWhereItStopped) {
  const std::string bytes = EncodeAgentMessage(SampleHello());
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto m = DecodeAgentMessage(bytes.substr(0, n));
    ASSERT_FALSE(m.ok()) << n;
    EXPECT_NE(m.status().message().find("agent message"), absl::string_view::npos)
        << m.status();
  }
  // The header's length field and the payload agree; a payload cut short
  // with a fixed-up length names the field it ended in.
  std::string cut = bytes.substr(0, bytes.size() - 4);
  const uint32_t length = static_cast<uint32_t>(cut.size() - kAgentHeaderBytes);
  cut.replace(8, 4, reinterpret_cast<const char*>(&length), 4);
  auto m = DecodeAgentMessage(cut);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message(), "agent message: truncated at hello.ring_bytes");
}

TEST(AgentProtocolTest, AnotherVersionIsToldApartFromGarbage) {
  std::string bytes = EncodeAgentMessage(SampleHello());
  std::string v2 = bytes;
  v2[4] = static_cast<char>(kAgentProtocolVersion + 1);
  auto m = DecodeAgentMessage(v2);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message(),
            absl::StrCat("agent protocol version ", kAgentProtocolVersion + 1,
                         ", this side speaks version ", kAgentProtocolVersion,
                         " (use an inprof agent and library of the same release)"));
  std::string garbage = bytes;
  garbage[0] = 'X';
  m = DecodeAgentMessage(garbage);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("bad magic"), absl::string_view::npos);
  std::string type = bytes;
  type[6] = 9;
  m = DecodeAgentMessage(type);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message(), "agent message: unknown type 9");
}

TEST(AgentProtocolTest, HellosOutOfBoundsAreRefused) {
  AgentHello hello = SampleHello();
  hello.ring_bytes = 1000;  // not a multiple of a page
  auto m = DecodeAgentMessage(EncodeAgentMessage(hello));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("64 rings of 1000 bytes"), absl::string_view::npos)
      << m.status();
  hello = SampleHello();
  hello.max_threads = kAgentMaxThreads + 1;
  EXPECT_FALSE(DecodeAgentMessage(EncodeAgentMessage(hello)).ok());
  hello = SampleHello();
  hello.program.assign(kAgentMaxStringBytes + 1, 'x');
  m = DecodeAgentMessage(EncodeAgentMessage(hello));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("hello.program is 4097 bytes"), absl::string_view::npos)
      << m.status();
  hello = SampleHello();
  hello.tags.assign(kAgentMaxTags + 1, {"k", "v"});
  EXPECT_FALSE(DecodeAgentMessage(EncodeAgentMessage(hello)).ok());
  hello = SampleHello();
  hello.tags = {{"", "v"}};
  EXPECT_FALSE(DecodeAgentMessage(EncodeAgentMessage(hello)).ok());
  hello = SampleHello();
  hello.pid = -1;
  EXPECT_FALSE(DecodeAgentMessage(EncodeAgentMessage(hello)).ok());
  // Trailing bytes after a complete message.
  std::string bytes = EncodeAgentMessage(AgentReject{"x"}) + "junk";
  const uint32_t length = static_cast<uint32_t>(bytes.size() - kAgentHeaderBytes);
  bytes.replace(8, 4, reinterpret_cast<const char*>(&length), 4);
  m = DecodeAgentMessage(bytes);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message(), "agent message: 4 bytes after the end of a reject");
}

TEST(AgentProtocolTest, SocketAddressesAreAbstractOrPaths) {
  auto a = ParseAgentSocketAddress("@inprof-test");
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->abstract);
  EXPECT_EQ(a->name, "inprof-test");
  EXPECT_EQ(a->ToString(), "@inprof-test");
  auto p = ParseAgentSocketAddress("/run/inprof.sock");
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->abstract);
  EXPECT_FALSE(ParseAgentSocketAddress("").ok());
  EXPECT_FALSE(ParseAgentSocketAddress("@").ok());
  auto long_name = ParseAgentSocketAddress(std::string(200, 'x'));
  ASSERT_FALSE(long_name.ok());
  EXPECT_NE(long_name.status().message().find("name must be 1-107 bytes"),
            absl::string_view::npos)
      << long_name.status();
  const AgentSocketAddress fresh = NewAgentSocketAddress();
  EXPECT_TRUE(fresh.abstract);
  EXPECT_EQ(fresh.name.rfind("inprof-agent-", 0), 0u) << fresh.name;
  EXPECT_NE(NewAgentSocketAddress().name, fresh.name);
}

}  // namespace
}  // namespace inprof::internal
