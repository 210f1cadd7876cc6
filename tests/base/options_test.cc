#include "inprof/options.h"

#include <stdlib.h>

#include <csignal>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inprof/base/log.h"

namespace inprof {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::StartsWith;
using ::testing::EndsWith;
using ::testing::StartsWith;

// FromLookup over a fixed set of variables.
Options FromMap(const std::map<std::string, std::string>& vars,
                std::vector<std::string>* errors) {
  return Options::FromLookup(
      [&vars](const char* name) -> const char* {
        auto it = vars.find(name);
        return it == vars.end() ? nullptr : it->second.c_str();
      },
      errors);
}

void ExpectDefaults(const Options& o) {
  const Options defaults;
  EXPECT_EQ(o.enabled, defaults.enabled);
  EXPECT_EQ(o.output, defaults.output);
  EXPECT_EQ(o.cpu_period, defaults.cpu_period);
  EXPECT_EQ(o.collect_period, defaults.collect_period);
  EXPECT_EQ(o.max_frames, defaults.max_frames);
}

TEST(OptionsTest, DefaultsWhenNothingIsSet) {
  std::vector<std::string> errors;
  const Options o = FromMap({}, &errors);
  EXPECT_THAT(errors, IsEmpty());
  EXPECT_TRUE(o.enabled);
  EXPECT_EQ(o.output, "inprof.pb.gz");
  EXPECT_EQ(o.cpu_period, absl::Milliseconds(10));
  EXPECT_EQ(o.collect_period, absl::Milliseconds(50));
  EXPECT_EQ(o.max_frames, 512);
  EXPECT_TRUE(o.Validate().ok());
}

TEST(OptionsTest, IgnoresUnrelatedVariables) {
  std::vector<std::string> errors;
  const Options o = FromMap({{"INPROF_ENABLE", "0"},
                             {"inprof_enabled", "0"},
                             {"INPROF_CPU_PERIOD_X", "ten"}},
                            &errors);
  EXPECT_THAT(errors, IsEmpty());
  ExpectDefaults(o);
}

TEST(OptionsTest, EnabledAcceptsEveryBooleanSpelling) {
  struct Case {
    const char* value;
    bool expected;
  };
  const Case cases[] = {
      {"1", true},      {"0", false},       {"true", true},  {"false", false},
      {"yes", true},    {"no", false},      {"on", true},    {"off", false},
      {"TRUE", true},   {"False", false},   {"YeS", true},   {"OFF", false},
      {" on ", true},   {"\t0\n", false},   {"  No", false}, {"1  ", true},
  };
  for (const Case& c : cases) {
    // The default is true, so the true spellings are also checked through
    // ParseBoolFlag below, where a no-op cannot pass.
    std::vector<std::string> errors;
    const Options o = FromMap({{"INPROF_ENABLED", c.value}}, &errors);
    EXPECT_EQ(o.enabled, c.expected) << "'" << c.value << "'";
    EXPECT_THAT(errors, IsEmpty()) << "'" << c.value << "'";

    absl::StatusOr<bool> parsed = ParseBoolFlag("INPROF_ENABLED", c.value);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, c.expected) << "'" << c.value << "'";
  }
}

// System libraries' debug info is off by default (symbol tables name their
// functions); the variable turns it on; a bad value says so and keeps off.
TEST(OptionsTest, SystemDebugInfoIsOffUnlessAsked) {
  std::vector<std::string> errors;
  EXPECT_FALSE(FromMap({}, &errors).system_debug_info);
  EXPECT_TRUE(FromMap({{"INPROF_SYSTEM_DEBUG_INFO", "1"}}, &errors).system_debug_info);
  EXPECT_TRUE(FromMap({{"INPROF_SYSTEM_DEBUG_INFO", "On"}}, &errors).system_debug_info);
  EXPECT_THAT(errors, IsEmpty());
  EXPECT_FALSE(FromMap({{"INPROF_SYSTEM_DEBUG_INFO", "maybe"}}, &errors).system_debug_info);
  ASSERT_THAT(errors, ::testing::SizeIs(1));
  EXPECT_THAT(errors[0], StartsWith("INPROF_SYSTEM_DEBUG_INFO='maybe'"));
  EXPECT_THAT(errors[0], HasSubstr("using 0"));
}

// absl::Mutex's tracer is the program's to give (Abseil keeps one): off
// unless asked; a bad value says so and keeps off.
TEST(OptionsTest, LockAbslIsOffUnlessAsked) {
  std::vector<std::string> errors;
  EXPECT_FALSE(FromMap({}, &errors).lock_absl);
  EXPECT_TRUE(FromMap({{"INPROF_LOCK_ABSL", "1"}}, &errors).lock_absl);
  EXPECT_THAT(errors, IsEmpty());
  EXPECT_FALSE(FromMap({{"INPROF_LOCK_ABSL", "absl"}}, &errors).lock_absl);
  ASSERT_THAT(errors, ::testing::SizeIs(1));
  EXPECT_THAT(errors[0], StartsWith("INPROF_LOCK_ABSL='absl'"));
  EXPECT_THAT(errors[0], HasSubstr("using 0"));
}

TEST(OptionsTest, OutputTakesAnyPath) {
  for (const char* path : {"/tmp/service.pb.gz", "relative/dir/p.pb.gz",
                           "with space.pb.gz", "x"}) {
    std::vector<std::string> errors;
    const Options o = FromMap({{"INPROF_OUTPUT", path}}, &errors);
    EXPECT_EQ(o.output, path);
    EXPECT_THAT(errors, IsEmpty());
  }
}

TEST(OptionsTest, CpuPeriodAcceptsDurationsInRange) {
  const std::pair<const char*, absl::Duration> cases[] = {
      {"10ms", absl::Milliseconds(10)},
      {"1ms", absl::Milliseconds(1)},  // the minimum, inclusive
      {"2.5ms", absl::Microseconds(2500)},
      {"1500us", absl::Microseconds(1500)},
      {"1s", absl::Seconds(1)},
      {"1h", absl::Hours(1)},  // the maximum, inclusive
      {"20ms", absl::Milliseconds(20)},
  };
  for (const auto& [value, expected] : cases) {
    std::vector<std::string> errors;
    const Options o = FromMap({{"INPROF_CPU_PERIOD", value}}, &errors);
    EXPECT_EQ(o.cpu_period, expected) << value;
    EXPECT_THAT(errors, IsEmpty()) << value;
  }
}

TEST(OptionsTest, AllVariablesTogether) {
  std::vector<std::string> errors;
  const Options o = FromMap({{"INPROF_ENABLED", "off"},
                             {"INPROF_OUTPUT", "/tmp/all.pb.gz"},
                             {"INPROF_CPU_PERIOD", "5ms"}},
                            &errors);
  EXPECT_THAT(errors, IsEmpty());
  EXPECT_FALSE(o.enabled);
  EXPECT_EQ(o.output, "/tmp/all.pb.gz");
  EXPECT_EQ(o.cpu_period, absl::Milliseconds(5));
  EXPECT_TRUE(o.Validate().ok());
}

// One invalid value: the default stays, and exactly one error line names the
// variable, quotes the value, says what is accepted and what is used instead.
struct InvalidCase {
  const char* variable;
  const char* value;
  const char* expected;  // what the line says is accepted
  const char* using_default;
};

TEST(OptionsTest, InvalidValueKeepsDefaultAndReportsOneLine) {
  const InvalidCase cases[] = {
      {"INPROF_CPU_PERIOD", "ten", "expected a duration", "using 10ms"},
      {"INPROF_CPU_PERIOD", "", "expected a duration", "using 10ms"},
      {"INPROF_CPU_PERIOD", "0", "expected a duration", "using 10ms"},
      {"INPROF_CPU_PERIOD", "-5ms", "expected a duration", "using 10ms"},
      {"INPROF_CPU_PERIOD", "10", "expected a duration", "using 10ms"},
      {"INPROF_CPU_PERIOD", "500us", "expected a duration", "using 10ms"},
      {"INPROF_CPU_PERIOD", "999us", "expected a duration", "using 10ms"},
      {"INPROF_CPU_PERIOD", "2h", "expected a duration", "using 10ms"},
      {"INPROF_CPU_PERIOD", "inf", "expected a duration", "using 10ms"},
      {"INPROF_CPU_PERIOD", "10 ms", "expected a duration", "using 10ms"},
      {"INPROF_ENABLED", "maybe", "expected 1/0, true/false, yes/no or on/off",
       "using 1"},
      {"INPROF_ENABLED", "", "expected 1/0", "using 1"},
      {"INPROF_ENABLED", "2", "expected 1/0", "using 1"},
      {"INPROF_ENABLED", "y", "expected 1/0", "using 1"},
      {"INPROF_OUTPUT", "", "expected a file path", "using inprof.pb.gz"},
      {"INPROF_OUTPUT", "   ", "expected a file path", "using inprof.pb.gz"},
      {"INPROF_OUTPUT", "-", "expected a file path", "using inprof.pb.gz"},
  };
  for (const InvalidCase& c : cases) {
    SCOPED_TRACE(absl::StrCat(c.variable, "='", c.value, "'"));
    std::vector<std::string> errors;
    const Options o = FromMap({{c.variable, c.value}}, &errors);
    ExpectDefaults(o);
    ASSERT_EQ(errors.size(), 1u);
    EXPECT_THAT(errors[0],
                AllOf(StartsWith(absl::StrCat(c.variable, "='", c.value, "'")),
                      HasSubstr(c.expected), HasSubstr(c.using_default),
                      Not(HasSubstr("\n"))));
  }
}

TEST(OptionsTest, CpuPeriodErrorStatesRangeAndExample) {
  std::vector<std::string> errors;
  const Options o = FromMap({{"INPROF_CPU_PERIOD", "ten"}}, &errors);
  EXPECT_EQ(o.cpu_period, absl::Milliseconds(10));
  EXPECT_THAT(errors, ElementsAre("INPROF_CPU_PERIOD='ten': expected a "
                                  "duration from 1ms to 1h such as 10ms; "
                                  "using 10ms"));
}

TEST(OptionsTest, EachInvalidVariableReportedOnceValidOnesApplied) {
  std::vector<std::string> errors;
  const Options o = FromMap({{"INPROF_ENABLED", "maybe"},
                             {"INPROF_OUTPUT", "/tmp/kept.pb.gz"},
                             {"INPROF_CPU_PERIOD", "2h"}},
                            &errors);
  EXPECT_TRUE(o.enabled);
  EXPECT_EQ(o.output, "/tmp/kept.pb.gz");
  EXPECT_EQ(o.cpu_period, absl::Milliseconds(10));
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_THAT(errors[0], StartsWith("INPROF_ENABLED='maybe'"));
  EXPECT_THAT(errors[1], StartsWith("INPROF_CPU_PERIOD='2h'"));
}

TEST(OptionsTest, NullErrorVectorStillKeepsDefaults) {
  const Options o = FromMap(
      {{"INPROF_ENABLED", "maybe"}, {"INPROF_CPU_PERIOD", "ten"}}, nullptr);
  ExpectDefaults(o);
}

TEST(OptionsTest, ParseBoolFlagRejectsWithInvalidArgument) {
  absl::StatusOr<bool> parsed = ParseBoolFlag("MY_FLAG", "perhaps");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(parsed.status().message()),
              AllOf(StartsWith("MY_FLAG='perhaps'"), HasSubstr("expected")));
}

TEST(OptionsTest, ParseDurationFlagHonoursRangeAndZero) {
  const absl::Duration lo = absl::Milliseconds(1);
  const absl::Duration hi = absl::Seconds(10);
  // A failed parse reads as InfiniteDuration, which no case expects.
  auto value = [](const absl::StatusOr<absl::Duration>& d) {
    EXPECT_TRUE(d.ok()) << d.status();
    return d.ok() ? *d : absl::InfiniteDuration();
  };
  EXPECT_EQ(value(ParseDurationFlag("D", "1ms", lo, hi)), lo);
  EXPECT_EQ(value(ParseDurationFlag("D", "10s", lo, hi)), hi);
  EXPECT_EQ(value(ParseDurationFlag("D", "250ms", lo, hi)),
            absl::Milliseconds(250));

  absl::StatusOr<absl::Duration> zero = ParseDurationFlag("D", "0", lo, hi);
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(zero.status().message()),
              AllOf(StartsWith("D='0'"), HasSubstr("from 1ms to 10s"),
                    Not(HasSubstr("or 0"))));

  absl::StatusOr<absl::Duration> allowed =
      ParseDurationFlag("D", "0", lo, hi, /*allow_zero=*/true);
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  EXPECT_EQ(*allowed, absl::ZeroDuration());

  absl::StatusOr<absl::Duration> too_long =
      ParseDurationFlag("D", "11s", lo, hi, /*allow_zero=*/true);
  ASSERT_FALSE(too_long.ok());
  EXPECT_THAT(std::string(too_long.status().message()),
              AllOf(StartsWith("D='11s'"), HasSubstr("or 0 to disable")));
}

// ---------------------------------------------------------------------------
// FromEnv: the real environment, errors logged.

std::vector<std::string>* captured = nullptr;
void Capture(absl::string_view line) {
  if (captured != nullptr) captured->emplace_back(line);
}

class OptionsFromEnvTest : public ::testing::Test {
 protected:
  static constexpr const char* kVariables[] = {
      "INPROF_ENABLED", "INPROF_OUTPUT", "INPROF_CPU_PERIOD"};

  void SetUp() override {
    for (const char* name : kVariables) {
      if (const char* v = getenv(name)) saved_[name] = v;
      unsetenv(name);
    }
    captured = &lines_;
    internal::SetLogSinkForTesting(&Capture);
  }
  void TearDown() override {
    internal::SetLogSinkForTesting(nullptr);
    captured = nullptr;
    for (const char* name : kVariables) {
      auto it = saved_.find(name);
      if (it == saved_.end()) {
        unsetenv(name);
      } else {
        setenv(name, it->second.c_str(), 1);
      }
    }
  }

  std::vector<std::string> lines_;
  std::map<std::string, std::string> saved_;
};

TEST_F(OptionsFromEnvTest, ReadsValidValuesSilently) {
  setenv("INPROF_ENABLED", "no", 1);
  setenv("INPROF_OUTPUT", "/tmp/env.pb.gz", 1);
  setenv("INPROF_CPU_PERIOD", "3ms", 1);
  const Options o = Options::FromEnv();
  EXPECT_FALSE(o.enabled);
  EXPECT_EQ(o.output, "/tmp/env.pb.gz");
  EXPECT_EQ(o.cpu_period, absl::Milliseconds(3));
  EXPECT_THAT(lines_, IsEmpty());
}

TEST_F(OptionsFromEnvTest, LogsOneLinePerInvalidValueAndKeepsDefault) {
  setenv("INPROF_ENABLED", "1", 1);
  setenv("INPROF_CPU_PERIOD", "ten", 1);
  const Options o = Options::FromEnv();
  EXPECT_TRUE(o.enabled);
  EXPECT_EQ(o.cpu_period, absl::Milliseconds(10));
  EXPECT_THAT(lines_,
              ElementsAre("inprof: INPROF_CPU_PERIOD='ten': expected a "
                          "duration from 1ms to 1h such as 10ms; using "
                          "10ms\n"));
}

TEST_F(OptionsFromEnvTest, EveryVariableInvalidStillReturns) {
  setenv("INPROF_ENABLED", "maybe", 1);
  setenv("INPROF_OUTPUT", "", 1);
  setenv("INPROF_CPU_PERIOD", "-5ms", 1);
  const Options o = Options::FromEnv();
  ExpectDefaults(o);
  ASSERT_EQ(lines_.size(), 3u);
  EXPECT_THAT(lines_[0], StartsWith("inprof: INPROF_ENABLED='maybe'"));
  EXPECT_THAT(lines_[1], StartsWith("inprof: INPROF_OUTPUT=''"));
  EXPECT_THAT(lines_[2], StartsWith("inprof: INPROF_CPU_PERIOD='-5ms'"));
}

TEST_F(OptionsFromEnvTest, WritesLinesToStderrWithoutSink) {
  internal::SetLogSinkForTesting(nullptr);
  setenv("INPROF_CPU_PERIOD", "10", 1);
  ::testing::internal::CaptureStderr();
  const Options o = Options::FromEnv();
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(o.cpu_period, absl::Milliseconds(10));
  EXPECT_EQ(err,
            "inprof: INPROF_CPU_PERIOD='10': expected a duration from 1ms to "
            "1h such as 10ms; using 10ms\n");
}

// ---------------------------------------------------------------------------
// Validate: fields set in code.

TEST(OptionsValidateTest, AcceptsDefaultsAndBounds) {
  Options o;
  EXPECT_TRUE(o.Validate().ok());
  o.cpu_period = Options::kMinCpuPeriod;
  EXPECT_TRUE(o.Validate().ok());
  o.cpu_period = Options::kMaxCpuPeriod;
  EXPECT_TRUE(o.Validate().ok());
  o.max_frames = 1;
  EXPECT_TRUE(o.Validate().ok());
}

TEST(OptionsValidateTest, RejectsBadFieldsNamingTheField) {
  struct Case {
    const char* what;
    void (*mutate)(Options&);
    const char* field;
  };
  const Case cases[] = {
      {"empty output", [](Options& o) { o.output.clear(); }, "output"},
      {"zero cpu_period",
       [](Options& o) { o.cpu_period = absl::ZeroDuration(); },
       "cpu_period=0"},
      {"cpu_period below min",
       [](Options& o) { o.cpu_period = absl::Microseconds(500); },
       "cpu_period=500us"},
      {"cpu_period above max",
       [](Options& o) { o.cpu_period = absl::Hours(2); }, "cpu_period=2h"},
      {"zero collect_period",
       [](Options& o) { o.collect_period = absl::ZeroDuration(); },
       "collect_period=0"},
      {"huge collect_period",
       [](Options& o) { o.collect_period = absl::Hours(1); },
       "collect_period=1h"},
      {"zero max_frames", [](Options& o) { o.max_frames = 0; },
       "max_frames=0"},
      {"negative max_frames", [](Options& o) { o.max_frames = -3; },
       "max_frames=-3"},
      {"too many max_frames", [](Options& o) { o.max_frames = 513; },
       "max_frames=513"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Options o;
    c.mutate(o);
    const absl::Status status = o.Validate();
    ASSERT_FALSE(status.ok());
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()),
                AllOf(HasSubstr(c.field), HasSubstr("expected")));
  }
}

// ---------------------------------------------------------------------------
// Periodic export and uploads.

TEST(OptionsExportTest, DefaultsWhenNothingIsSet) {
  std::vector<std::string> errors;
  const Options o = FromMap({}, &errors);
  EXPECT_THAT(errors, IsEmpty());
  EXPECT_EQ(o.export_period, absl::Seconds(60));
  EXPECT_EQ(o.stop_timeout, absl::Seconds(5));
  EXPECT_TRUE(o.write_output);
  EXPECT_FALSE(o.datadog.enabled);
  EXPECT_EQ(o.datadog.agent_url, "http://localhost:8126");
  EXPECT_THAT(o.datadog.tags, IsEmpty());
  EXPECT_EQ(o.pyroscope.url, "");
  EXPECT_EQ(o.upload.timeout, absl::Seconds(10));
  EXPECT_EQ(o.upload.max_retries, 3);
  EXPECT_EQ(o.upload.backoff, absl::Seconds(1));
  EXPECT_EQ(o.upload.max_queued, 4);
}

TEST(OptionsExportTest, ExportPeriodAndStopTimeoutAcceptTheirRanges) {
  const std::pair<const char*, absl::Duration> periods[] = {
      {"0", absl::ZeroDuration()}, {"100ms", absl::Milliseconds(100)},
      {"60s", absl::Seconds(60)},  {"5m", absl::Minutes(5)},
      {"24h", absl::Hours(24)}};
  for (const auto& [value, expected] : periods) {
    std::vector<std::string> errors;
    const Options o = FromMap({{"INPROF_EXPORT_PERIOD", value}}, &errors);
    EXPECT_EQ(o.export_period, expected) << value;
    EXPECT_THAT(errors, IsEmpty()) << value;
    EXPECT_TRUE(o.Validate().ok()) << value;
  }
  const std::pair<const char*, absl::Duration> timeouts[] = {
      {"0", absl::ZeroDuration()}, {"250ms", absl::Milliseconds(250)},
      {"10m", absl::Minutes(10)}};
  for (const auto& [value, expected] : timeouts) {
    std::vector<std::string> errors;
    const Options o = FromMap({{"INPROF_STOP_TIMEOUT", value}}, &errors);
    EXPECT_EQ(o.stop_timeout, expected) << value;
    EXPECT_THAT(errors, IsEmpty()) << value;
  }
}

TEST(OptionsExportTest, DatadogAgentFromHostAndPort) {
  std::vector<std::string> errors;
  Options o = FromMap({{"DD_AGENT_HOST", "datadog-agent"}}, &errors);
  EXPECT_TRUE(o.datadog.enabled);
  EXPECT_EQ(o.datadog.agent_url, "http://datadog-agent:8126");
  o = FromMap({{"DD_AGENT_HOST", " 10.0.0.7 "}, {"DD_TRACE_AGENT_PORT", "9126"}},
              &errors);
  EXPECT_EQ(o.datadog.agent_url, "http://10.0.0.7:9126");
  o = FromMap({{"DD_AGENT_HOST", "::1"}}, &errors);
  EXPECT_EQ(o.datadog.agent_url, "http://[::1]:8126");
  // A port alone does not turn the upload on.
  o = FromMap({{"DD_TRACE_AGENT_PORT", "9126"}}, &errors);
  EXPECT_FALSE(o.datadog.enabled);
  EXPECT_THAT(errors, IsEmpty());
}

TEST(OptionsExportTest, DatadogAgentUrlWinsAndUnixSocketsWork) {
  std::vector<std::string> errors;
  Options o = FromMap({{"DD_AGENT_HOST", "ignored"},
                       {"DD_TRACE_AGENT_URL", "http://127.0.0.1:18126/"}},
                      &errors);
  EXPECT_TRUE(o.datadog.enabled);
  EXPECT_EQ(o.datadog.agent_url, "http://127.0.0.1:18126");
  o = FromMap({{"DD_TRACE_AGENT_URL", "unix:///var/run/datadog/apm.socket"}},
              &errors);
  EXPECT_TRUE(o.datadog.enabled);
  EXPECT_EQ(o.datadog.agent_url, "unix:///var/run/datadog/apm.socket");
  o = FromMap({{"DD_TRACE_AGENT_URL", "https://agent.example:443"}}, &errors);
  EXPECT_EQ(o.datadog.agent_url, "https://agent.example:443");
  EXPECT_THAT(errors, IsEmpty());
  EXPECT_TRUE(o.Validate().ok());
}

TEST(OptionsExportTest, InprofDatadogSwitchesTheUploadExplicitly) {
  std::vector<std::string> errors;
  Options o = FromMap({{"INPROF_DATADOG", "1"}}, &errors);
  EXPECT_TRUE(o.datadog.enabled);
  EXPECT_EQ(o.datadog.agent_url, "http://localhost:8126");
  o = FromMap({{"INPROF_DATADOG", "off"}, {"DD_AGENT_HOST", "agent"}}, &errors);
  EXPECT_FALSE(o.datadog.enabled);
  EXPECT_TRUE(o.write_output);  // nothing uploads: the file is written
  EXPECT_THAT(errors, IsEmpty());
}

TEST(OptionsExportTest, DatadogTagsAndIdentity) {
  std::vector<std::string> errors;
  const Options o = FromMap({{"DD_SERVICE", " checkout "},
                             {"DD_ENV", "prod"},
                             {"DD_VERSION", "1.2.3"},
                             {"DD_HOSTNAME", "web-1"},
                             {"DD_TAGS", "team:perf, region:eu  zone:b,,"},
                             {"INPROF_DATADOG", "yes"}},
                            &errors);
  EXPECT_THAT(errors, IsEmpty());
  EXPECT_EQ(o.datadog.service, "checkout");
  EXPECT_EQ(o.datadog.env, "prod");
  EXPECT_EQ(o.datadog.version, "1.2.3");
  EXPECT_EQ(o.datadog.hostname, "web-1");
  EXPECT_THAT(o.datadog.tags, ElementsAre("team:perf", "region:eu", "zone:b"));
}

TEST(OptionsExportTest, UploadsTurnTheFileOffUnlessOutputIsSet) {
  std::vector<std::string> errors;
  EXPECT_FALSE(FromMap({{"DD_AGENT_HOST", "a"}}, &errors).write_output);
  EXPECT_FALSE(
      FromMap({{"INPROF_PYROSCOPE_URL", "http://p:4040"}}, &errors).write_output);
  const Options o = FromMap(
      {{"DD_AGENT_HOST", "a"}, {"INPROF_OUTPUT", "/tmp/also-%t.pb.gz"}},
      &errors);
  EXPECT_TRUE(o.write_output);
  EXPECT_EQ(o.output, "/tmp/also-%t.pb.gz");
  EXPECT_THAT(errors, IsEmpty());
}

TEST(OptionsExportTest, PyroscopeVariables) {
  std::vector<std::string> errors;
  const Options o =
      FromMap({{"INPROF_PYROSCOPE_URL", "https://profiles.example/prefix/"},
               {"INPROF_APPLICATION_NAME", "checkout{region=eu,pod=a-1}"},
               {"INPROF_PYROSCOPE_BASIC_AUTH_USER", "123"},
               {"INPROF_PYROSCOPE_BASIC_AUTH_PASSWORD", "secret"},
               {"INPROF_PYROSCOPE_AUTH_TOKEN", "tok"},
               {"INPROF_PYROSCOPE_TENANT_ID", "team-a"}},
              &errors);
  EXPECT_THAT(errors, IsEmpty());
  EXPECT_EQ(o.pyroscope.url, "https://profiles.example/prefix");
  EXPECT_EQ(o.pyroscope.application_name, "checkout{region=eu,pod=a-1}");
  EXPECT_EQ(o.pyroscope.basic_auth_user, "123");
  EXPECT_EQ(o.pyroscope.basic_auth_password, "secret");
  EXPECT_EQ(o.pyroscope.auth_token, "tok");
  EXPECT_EQ(o.pyroscope.tenant_id, "team-a");
  EXPECT_TRUE(o.Validate().ok());
}

TEST(OptionsExportTest, ApplicationNames) {
  for (const char* ok : {"app", "my.app", "my-app_2", "app{}", "app{k=v}",
                         "app{region=eu,pod=a-1,x.y=1}"}) {
    EXPECT_TRUE(IsValidApplicationName(ok)) << ok;
  }
  for (const char* bad : {"", "my app", "{k=v}", "app{k}", "app{1k=v}",
                          "app{k=v", "app{k=}", "app{k=v,}", "a=b", "app?x"}) {
    EXPECT_FALSE(IsValidApplicationName(bad)) << bad;
  }
}

TEST(OptionsExportTest, UploadTuning) {
  std::vector<std::string> errors;
  const Options o = FromMap({{"INPROF_UPLOAD_TIMEOUT", "30s"},
                             {"INPROF_UPLOAD_RETRIES", "0"},
                             {"INPROF_UPLOAD_BACKOFF", "250ms"},
                             {"INPROF_UPLOAD_QUEUE", "16"}},
                            &errors);
  EXPECT_THAT(errors, IsEmpty());
  EXPECT_EQ(o.upload.timeout, absl::Seconds(30));
  EXPECT_EQ(o.upload.max_retries, 0);
  EXPECT_EQ(o.upload.backoff, absl::Milliseconds(250));
  EXPECT_EQ(o.upload.max_queued, 16);
  EXPECT_TRUE(o.Validate().ok());
}

TEST(OptionsExportTest, InvalidValueKeepsDefaultAndReportsOneLine) {
  const InvalidCase cases[] = {
      {"INPROF_EXPORT_PERIOD", "ten", "expected a duration from 100ms to 24h "
       "(or 0 to disable) such as 60s", "using 1m"},
      {"INPROF_EXPORT_PERIOD", "50ms", "from 100ms to 24h", "using 1m"},
      {"INPROF_EXPORT_PERIOD", "25h", "from 100ms to 24h", "using 1m"},
      {"INPROF_STOP_TIMEOUT", "11m", "(or 0 to disable) such as 5s",
       "using 5s"},
      {"INPROF_STOP_TIMEOUT", "-1s", "expected a duration", "using 5s"},
      {"INPROF_DATADOG", "maybe", "expected 1/0", "using 0"},
      {"DD_TRACE_AGENT_URL", "localhost:8126",
       "expected http://host:port, https://host:port or unix:///path/to/socket",
       "using http://localhost:8126"},
      {"DD_TRACE_AGENT_URL", "ftp://x", "expected http://", "using http://"},
      {"DD_TRACE_AGENT_URL", "unix://relative", "unix:///path", "using http://"},
      {"DD_TRACE_AGENT_URL", "http://", "expected http://", "using http://"},
      {"DD_AGENT_HOST", "", "expected a host name", "using localhost"},
      {"DD_AGENT_HOST", "http://x", "expected a host name", "using localhost"},
      {"DD_TRACE_AGENT_PORT", "70000", "expected an integer from 1 to 65535",
       "using 8126"},
      {"DD_TRACE_AGENT_PORT", "http", "expected an integer", "using 8126"},
      {"INPROF_PYROSCOPE_URL", "localhost:4040",
       "expected http://host:port or https://host:port",
       "using no Pyroscope upload"},
      {"INPROF_APPLICATION_NAME", "my app",
       "expected a name such as my.app or my.app{region=eu,pod=a}",
       "using the program's name"},
      {"INPROF_UPLOAD_TIMEOUT", "50ms", "from 100ms to 10m", "using 10s"},
      {"INPROF_UPLOAD_RETRIES", "11", "expected an integer from 0 to 10",
       "using 3"},
      {"INPROF_UPLOAD_RETRIES", "-1", "expected an integer", "using 3"},
      {"INPROF_UPLOAD_BACKOFF", "1us", "from 10ms to 10m", "using 1s"},
      {"INPROF_UPLOAD_QUEUE", "0", "expected an integer from 1 to 64",
       "using 4"},
      {"INPROF_UPLOAD_QUEUE", "65", "from 1 to 64", "using 4"},
  };
  const Options defaults;
  for (const InvalidCase& c : cases) {
    SCOPED_TRACE(absl::StrCat(c.variable, "='", c.value, "'"));
    std::vector<std::string> errors;
    const Options o = FromMap({{c.variable, c.value}}, &errors);
    ExpectDefaults(o);
    EXPECT_EQ(o.export_period, defaults.export_period);
    EXPECT_EQ(o.stop_timeout, defaults.stop_timeout);
    EXPECT_FALSE(o.datadog.enabled);
    EXPECT_EQ(o.datadog.agent_url, defaults.datadog.agent_url);
    EXPECT_EQ(o.pyroscope.url, "");
    EXPECT_EQ(o.pyroscope.application_name, "");
    EXPECT_EQ(o.upload.timeout, defaults.upload.timeout);
    EXPECT_EQ(o.upload.max_retries, defaults.upload.max_retries);
    EXPECT_EQ(o.upload.backoff, defaults.upload.backoff);
    EXPECT_EQ(o.upload.max_queued, defaults.upload.max_queued);
    EXPECT_TRUE(o.write_output);
    ASSERT_EQ(errors.size(), 1u);
    EXPECT_THAT(errors[0],
                AllOf(StartsWith(absl::StrCat(c.variable, "='", c.value, "'")),
                      HasSubstr(c.expected), HasSubstr(c.using_default),
                      Not(HasSubstr("\n"))));
  }
}

TEST(OptionsValidateTest, RejectsBadExportAndUploadFields) {
  struct Case {
    const char* what;
    void (*mutate)(Options&);
    const char* field;
  };
  const Case cases[] = {
      {"export_period below min",
       [](Options& o) { o.export_period = absl::Milliseconds(10); },
       "export_period=10ms"},
      {"negative stop_timeout",
       [](Options& o) { o.stop_timeout = absl::Seconds(-1); },
       "stop_timeout=-1s"},
      {"bad agent url",
       [](Options& o) {
         o.datadog.enabled = true;
         o.datadog.agent_url = "agent:8126";
       },
       "datadog.agent_url"},
      {"bad pyroscope url",
       [](Options& o) { o.pyroscope.url = "pyroscope"; }, "pyroscope.url"},
      {"bad application name",
       [](Options& o) { o.pyroscope.application_name = "a b"; },
       "pyroscope.application_name"},
      {"zero upload timeout",
       [](Options& o) { o.upload.timeout = absl::ZeroDuration(); },
       "upload.timeout"},
      {"zero backoff",
       [](Options& o) { o.upload.backoff = absl::ZeroDuration(); },
       "upload.backoff"},
      {"too many retries", [](Options& o) { o.upload.max_retries = 11; },
       "upload.max_retries=11"},
      {"empty queue", [](Options& o) { o.upload.max_queued = 0; },
       "upload.max_queued=0"},
      {"null sink", [](Options& o) { o.sinks.push_back(nullptr); }, "sinks"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Options o;
    c.mutate(o);
    const absl::Status status = o.Validate();
    ASSERT_FALSE(status.ok());
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()),
                AllOf(HasSubstr(c.field), HasSubstr("expected")));
  }
  Options zero;
  zero.export_period = absl::ZeroDuration();
  zero.stop_timeout = absl::ZeroDuration();
  EXPECT_TRUE(zero.Validate().ok());
}

TEST(OptionsExportTest, ParseIntFlag) {
  absl::StatusOr<int64_t> n = ParseIntFlag("N", " 42 ", 0, 100);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 42);
  n = ParseIntFlag("N", "4x", 0, 100);
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(std::string(n.status().message()),
            "N='4x': expected an integer from 0 to 100");
}

}  // namespace
}  // namespace inprof

namespace inprof {
namespace {

TEST(OptionsEngineTest, CpuEngineAcceptsEachEngineName) {
  std::vector<std::string> errors;
  EXPECT_EQ(FromMap({}, &errors).cpu_engine, CpuEngine::kAuto);
  const std::pair<const char*, CpuEngine> cases[] = {
      {"auto", CpuEngine::kAuto},   {"perf", CpuEngine::kPerf},
      {"timer", CpuEngine::kTimer}, {"itimer", CpuEngine::kItimer},
      {" PERF ", CpuEngine::kPerf}};
  for (const auto& [text, engine] : cases) {
    EXPECT_EQ(FromMap({{"INPROF_CPU_ENGINE", text}}, &errors).cpu_engine,
              engine)
        << text;
  }
  EXPECT_TRUE(errors.empty());
}

// The agent's library mode is not built: a process told to use one says
// so in one line and profiles in-process.
TEST(OptionsTest, LibraryModeVariables) {
  std::vector<std::string> errors;
  Options o = FromMap({{"INPROF_AGENT_SOCKET", "@inprof-agent-x"}}, &errors);
  EXPECT_TRUE(errors.empty());
  EXPECT_EQ(o.agent_socket, "@inprof-agent-x");
  EXPECT_EQ(o.agent_fallback, AgentFallback::kLocal);
  EXPECT_TRUE(o.Validate().ok());
  o = FromMap({{"INPROF_AGENT_SOCKET", "/run/inprof.sock"},
               {"INPROF_AGENT_FALLBACK", "OFF"}},
              &errors);
  EXPECT_EQ(o.agent_socket, "/run/inprof.sock");
  EXPECT_EQ(o.agent_fallback, AgentFallback::kOff);
  EXPECT_TRUE(errors.empty());

  o = FromMap({{"INPROF_AGENT_SOCKET", "@" + std::string(200, 'a')},
               {"INPROF_AGENT_FALLBACK", "maybe"}},
              &errors);
  EXPECT_EQ(o.agent_socket, "");
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_THAT(errors[0], StartsWith("INPROF_AGENT_SOCKET='@aaaa"));
  EXPECT_THAT(errors[0], EndsWith("; using none, profiling in this process"));
  EXPECT_EQ(errors[1], "INPROF_AGENT_FALLBACK='maybe': expected local or off; using local");

  errors.clear();
  o = FromMap({{"INPROF_AGENT", "spawn"}, {"INPROF_AGENT_BINARY", " /opt/inprof "}}, &errors);
  EXPECT_TRUE(errors.empty());
  EXPECT_TRUE(o.agent_spawn);
  EXPECT_EQ(o.agent_binary, "/opt/inprof");
  o = FromMap({{"INPROF_AGENT", "yes"}}, &errors);
  EXPECT_FALSE(o.agent_spawn);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0],
            "INPROF_AGENT='yes': expected spawn (start an agent when "
            "INPROF_AGENT_SOCKET is not set); using none, profiling in this process");
  errors.clear();
  FromMap({{"INPROF_AGENT_SOCKET", ""}, {"INPROF_AGENT", ""}}, &errors);
  EXPECT_TRUE(errors.empty());

  Options code;
  code.agent_socket = "@";
  EXPECT_THAT(std::string(code.Validate().message()), StartsWith("Options.agent_socket: "));
}

TEST(OptionsEngineTest, UnknownCpuEngineKeepsAutoAndSaysWhatIsAccepted) {
  std::vector<std::string> errors;
  const Options o = FromMap({{"INPROF_CPU_ENGINE", "hrtimer"}}, &errors);
  EXPECT_EQ(o.cpu_engine, CpuEngine::kAuto);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0],
            "INPROF_CPU_ENGINE='hrtimer': expected auto, perf, timer or "
            "itimer; using auto");
}

TEST(OptionsEngineTest, PerfFdShareIsAPercentage) {
  std::vector<std::string> errors;
  EXPECT_EQ(FromMap({}, &errors).perf_fd_share, 25);
  EXPECT_EQ(FromMap({{"INPROF_PERF_FD_SHARE", "0"}}, &errors).perf_fd_share,
            0);
  EXPECT_EQ(FromMap({{"INPROF_PERF_FD_SHARE", "100"}}, &errors).perf_fd_share,
            100);
  EXPECT_TRUE(errors.empty());
  EXPECT_EQ(FromMap({{"INPROF_PERF_FD_SHARE", "150"}}, &errors).perf_fd_share,
            25);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_THAT(errors[0], ::testing::HasSubstr("INPROF_PERF_FD_SHARE='150'"));
  Options bad;
  bad.perf_fd_share = -1;
  EXPECT_THAT(std::string(bad.Validate().message()),
              ::testing::HasSubstr("Options.perf_fd_share=-1"));
}

TEST(OptionsEngineTest, PerfThreadsIsACount) {
  std::vector<std::string> errors;
  EXPECT_EQ(FromMap({}, &errors).perf_threads, 256);
  EXPECT_EQ(FromMap({{"INPROF_PERF_THREADS", "0"}}, &errors).perf_threads, 0);
  EXPECT_EQ(FromMap({{"INPROF_PERF_THREADS", "20000"}}, &errors).perf_threads, 20000);
  EXPECT_TRUE(errors.empty());
  EXPECT_EQ(FromMap({{"INPROF_PERF_THREADS", "-3"}}, &errors).perf_threads, 256);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_THAT(errors[0], ::testing::HasSubstr("INPROF_PERF_THREADS='-3'"));
  Options bad;
  bad.perf_threads = Options::kMaxPerfThreads + 1;
  EXPECT_THAT(std::string(bad.Validate().message()),
              ::testing::HasSubstr("Options.perf_threads=1048577"));
}

#if !defined(_WIN32)
// INPROF_DUMP_SIGNAL: a signal handed over by name or number; none that
// reports a fault, stops or ends the process unasked, nor inprof's SIGPROF.
TEST(OptionsTest, DumpSignalIsASignalHandedOver) {
  std::vector<std::string> errors;
  EXPECT_EQ(FromMap({}, &errors).dump_signal, 0);
  EXPECT_EQ(FromMap({{"INPROF_DUMP_SIGNAL", "QUIT"}}, &errors).dump_signal, SIGQUIT);
  EXPECT_EQ(FromMap({{"INPROF_DUMP_SIGNAL", " sigusr2 "}}, &errors).dump_signal, SIGUSR2);
  EXPECT_EQ(FromMap({{"INPROF_DUMP_SIGNAL", absl::StrCat(SIGUSR1)}}, &errors).dump_signal,
            SIGUSR1);
  EXPECT_EQ(FromMap({{"INPROF_DUMP_SIGNAL", absl::StrCat(SIGRTMIN + 2)}}, &errors).dump_signal,
            SIGRTMIN + 2);
  EXPECT_EQ(FromMap({{"INPROF_DUMP_SIGNAL", "0"}}, &errors).dump_signal, 0);
  EXPECT_THAT(errors, IsEmpty());
  for (const char* bad : {"KILL", "SIGPROF", "SEGV", "27", "9", "-3", "QUITT", "usr3"}) {
    errors.clear();
    EXPECT_EQ(FromMap({{"INPROF_DUMP_SIGNAL", bad}}, &errors).dump_signal, 0) << bad;
    ASSERT_EQ(errors.size(), 1u) << bad;
    EXPECT_THAT(errors[0], AllOf(HasSubstr(absl::StrCat("INPROF_DUMP_SIGNAL='", bad, "'")),
                                 HasSubstr("expected QUIT, USR1"),
                                 HasSubstr("using no thread dump on a signal")));
  }
  Options options;
  options.dump_signal = SIGKILL;
  EXPECT_THAT(std::string(options.Validate().message()),
              HasSubstr(absl::StrCat("Options.dump_signal=", SIGKILL)));
  options.dump_signal = SIGUSR2;
  EXPECT_TRUE(options.Validate().ok());
}
#endif

TEST(OptionsTest, WallCpuBudgetIsAPercentageOfOneCore) {
  std::vector<std::string> errors;
  EXPECT_EQ(FromMap({}, &errors).wall_cpu_budget, 1.0);
  EXPECT_EQ(FromMap({{"INPROF_WALL_CPU_BUDGET", "2.5%"}}, &errors).wall_cpu_budget, 2.5);
  EXPECT_EQ(FromMap({{"INPROF_WALL_CPU_BUDGET", " 0.1 "}}, &errors).wall_cpu_budget, 0.1);
  EXPECT_EQ(FromMap({{"INPROF_WALL_CPU_BUDGET", "100%"}}, &errors).wall_cpu_budget, 100.0);
  EXPECT_EQ(FromMap({{"INPROF_WALL_CPU_BUDGET", "0"}}, &errors).wall_cpu_budget, 0.0);
  EXPECT_THAT(errors, IsEmpty());
  for (const char* bad : {"0.05%", "101", "-1", "one", "1%%", ""}) {
    errors.clear();
    EXPECT_EQ(FromMap({{"INPROF_WALL_CPU_BUDGET", bad}}, &errors).wall_cpu_budget, 1.0)
        << bad;
    ASSERT_EQ(errors.size(), 1u) << bad;
    EXPECT_THAT(errors[0], AllOf(HasSubstr(absl::StrCat("INPROF_WALL_CPU_BUDGET='", bad, "'")),
                                 HasSubstr("0.1% to 100%")));
  }
  Options options;
  options.wall_cpu_budget = 0.01;
  EXPECT_THAT(std::string(options.Validate().message()),
              HasSubstr("Options.wall_cpu_budget=0.01"));
  options.wall_cpu_budget = 0;
  EXPECT_TRUE(options.Validate().ok());
}

TEST(OptionsTest, DefaultSampleTypeIsASampleTypesName) {
  std::vector<std::string> errors;
  EXPECT_EQ(FromMap({}, &errors).default_sample_type, "");
  EXPECT_EQ(FromMap({{"INPROF_DEFAULT_SAMPLE_TYPE", "peak_inuse_space"}}, &errors)
                .default_sample_type,
            "peak_inuse_space");
  EXPECT_EQ(FromMap({{"INPROF_DEFAULT_SAMPLE_TYPE", "wall-time"}}, &errors).default_sample_type,
            "wall-time");
  EXPECT_THAT(errors, IsEmpty());
  for (const char* bad : {"", "peak inuse", "a;b", "x\n"}) {
    errors.clear();
    EXPECT_EQ(FromMap({{"INPROF_DEFAULT_SAMPLE_TYPE", bad}}, &errors).default_sample_type, "")
        << bad;
    ASSERT_EQ(errors.size(), 1u) << bad;
    EXPECT_THAT(errors[0], HasSubstr("INPROF_DEFAULT_SAMPLE_TYPE='"));
    EXPECT_THAT(errors[0], HasSubstr("expected a sample type's name"));
  }
}

}  // namespace
}  // namespace inprof
