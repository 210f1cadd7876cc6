#include "inprof/options.h"

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "inprof/base/addresses.h"
#include "inprof/base/log.h"

namespace inprof {

absl::StatusOr<bool> ParseBoolFlag(absl::string_view name,
                                   absl::string_view value) {
  const std::string v = absl::AsciiStrToLower(absl::StripAsciiWhitespace(value));
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  return absl::InvalidArgumentError(
      absl::StrCat(name, "='", absl::CHexEscape(value),
                   "': expected 1/0, true/false, yes/no or on/off"));
}

absl::StatusOr<absl::Duration> ParseDurationFlag(absl::string_view name,
                                                 absl::string_view value,
                                                 absl::Duration min,
                                                 absl::Duration max,
                                                 bool allow_zero,
                                                 absl::string_view example) {
  absl::Duration d;
  const absl::string_view v = absl::StripAsciiWhitespace(value);
  const bool parsed = absl::ParseDuration(v, &d);
  const bool in_range = parsed && ((allow_zero && d == absl::ZeroDuration()) ||
                                   (d >= min && d <= max));
  if (!in_range) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, "='", absl::CHexEscape(value), "': expected a duration from ",
        absl::FormatDuration(min), " to ", absl::FormatDuration(max),
        allow_zero ? " (or 0 to disable)" : "", " such as ", example));
  }
  return d;
}

absl::StatusOr<int64_t> ParseIntFlag(absl::string_view name,
                                     absl::string_view value, int64_t min,
                                     int64_t max) {
  int64_t n = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(value), &n) || n < min ||
      n > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, "='", absl::CHexEscape(value),
                     "': expected an integer from ", min, " to ", max));
  }
  return n;
}

namespace {

// The largest INPROF_ALLOC_PERIOD / Options::alloc_period: 1 GiB.
constexpr uint64_t kMaxAllocPeriod = uint64_t{1} << 30;

// "524288", "512KiB", "512k", "1MiB", "1M", "1GiB", "64B": bytes, the
// suffixes binary (KiB = K = 1024), case-insensitive. nullopt otherwise.
std::optional<uint64_t> ParseByteSize(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  size_t digits = 0;
  while (digits < text.size() && absl::ascii_isdigit(static_cast<unsigned char>(text[digits]))) {
    ++digits;
  }
  uint64_t number = 0;
  if (digits == 0 || !absl::SimpleAtoi(text.substr(0, digits), &number)) return std::nullopt;
  std::string suffix = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text.substr(digits)));
  int shift = 0;
  if (suffix.empty() || suffix == "b") {
    shift = 0;
  } else if (suffix == "k" || suffix == "kib" || suffix == "kb") {
    shift = 10;
  } else if (suffix == "m" || suffix == "mib" || suffix == "mb") {
    shift = 20;
  } else if (suffix == "g" || suffix == "gib" || suffix == "gb") {
    shift = 30;
  } else {
    return std::nullopt;
  }
  if (number > (kMaxAllocPeriod >> shift) + 1) return std::nullopt;  // no overflow
  return number << shift;
}


bool HasSpace(absl::string_view s) {
  for (char c : s) {
    if (absl::ascii_isspace(static_cast<unsigned char>(c)) ||
        absl::ascii_iscntrl(static_cast<unsigned char>(c))) {
      return true;
    }
  }
  return false;
}

// http(s)://host[...]; with `allow_unix`, unix:///absolute/path too.
bool IsEndpointUrl(absl::string_view url, bool allow_unix) {
  if (url.empty() || HasSpace(url)) return false;
  for (absl::string_view scheme : {"http://", "https://"}) {
    if (absl::StartsWith(url, scheme)) {
      const absl::string_view rest = url.substr(scheme.size());
      return !rest.empty() && rest[0] != '/';
    }
  }
  if (allow_unix && absl::StartsWith(url, "unix://")) {
    const absl::string_view path = url.substr(7);
    return path.size() > 1 && path[0] == '/';
  }
  return false;
}

bool IsLabelName(absl::string_view s) {
  if (s.empty() || !(absl::ascii_isalpha(s[0]) || s[0] == '_')) return false;
  for (char c : s) {
    if (!(absl::ascii_isalnum(c) || c == '_' || c == '.')) return false;
  }
  return true;
}

bool IsLabelValue(absl::string_view s) {
  return !s.empty() && !HasSpace(s) &&
         s.find_first_of("{}=,") == absl::string_view::npos;
}

}  // namespace

bool IsValidApplicationName(absl::string_view name) {
  const size_t brace = name.find('{');
  const absl::string_view base = name.substr(0, brace);
  if (base.empty() || HasSpace(base) ||
      base.find_first_of("{}=,&?#") != absl::string_view::npos) {
    return false;
  }
  if (brace == absl::string_view::npos) return true;
  if (name.back() != '}') return false;
  const absl::string_view tags = name.substr(brace + 1, name.size() - brace - 2);
  if (tags.empty()) return true;  // "app{}"
  for (absl::string_view tag : absl::StrSplit(tags, ',')) {
    const size_t eq = tag.find('=');
    if (eq == absl::string_view::npos || !IsLabelName(tag.substr(0, eq)) ||
        !IsLabelValue(tag.substr(eq + 1))) {
      return false;
    }
  }
  return true;
}

const char* CpuEngineName(CpuEngine engine) {
  switch (engine) {
    case CpuEngine::kAuto:
      return "auto";
    case CpuEngine::kPerf:
      return "perf";
    case CpuEngine::kTimer:
      return "timer";
    case CpuEngine::kItimer:
      return "itimer";
  }
  return "auto";
}

namespace {

// Whether `signal` may be handed over for thread dumps (Options::
// dump_signal): none that reports a fault, stops or ends the process
// unasked, SIGPROF (inprof's) or SIGCHLD/SIGPIPE/SIGALRM (the program's
// machinery).
bool DumpSignalAllowed(int signal) {
#if defined(_WIN32)
  return signal == 0;
#else
  if (signal == 0) return true;
  if (signal >= SIGRTMIN && signal <= SIGRTMAX) return true;
  return signal == SIGQUIT || signal == SIGUSR1 || signal == SIGUSR2 || signal == SIGHUP ||
         signal == SIGWINCH;
#endif
}

absl::StatusOr<int> ParseDumpSignal(absl::string_view text) {
  std::string v = absl::AsciiStrToUpper(absl::StripAsciiWhitespace(text));
  int signal = -1;
  if (v.empty() || v == "0" || v == "OFF") return 0;
#if !defined(_WIN32)
  absl::string_view name = v;
  absl::ConsumePrefix(&name, "SIG");
  static constexpr struct {
    const char* name;
    int signal;
  } kNames[] = {{"QUIT", SIGQUIT}, {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"HUP", SIGHUP},
                {"WINCH", SIGWINCH}};
  for (const auto& n : kNames) {
    if (name == n.name) signal = n.signal;
  }
  if (signal < 0 && !absl::SimpleAtoi(v, &signal)) signal = -1;
#endif
  if (signal <= 0 || !DumpSignalAllowed(signal)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "INPROF_DUMP_SIGNAL='", absl::CHexEscape(text), "': expected QUIT, USR1, USR2, HUP, "
        "WINCH or a real-time signal's number (a signal the program hands over for thread "
        "dumps), or 0 for none",
#if defined(_WIN32)
        " (Windows has no signals: /debug/pprof/threads serves the dump)",
#else
        "",
#endif
        ""));
  }
  return signal;
}

}  // namespace

Options Options::FromLookup(const Lookup& lookup,
                            std::vector<std::string>* errors) {
  Options options;
  auto report = [&](const absl::Status& status, absl::string_view kept) {
    if (errors != nullptr) {
      errors->push_back(absl::StrCat(status.message(), "; using ", kept));
    }
  };
  if (const char* v = lookup("INPROF_ENABLED")) {
    auto parsed = ParseBoolFlag("INPROF_ENABLED", v);
    if (parsed.ok()) {
      options.enabled = *parsed;
    } else {
      report(parsed.status(), "1");
    }
  }
  if (const char* v = lookup("INPROF_SYSTEM_DEBUG_INFO")) {
    auto parsed = ParseBoolFlag("INPROF_SYSTEM_DEBUG_INFO", v);
    if (parsed.ok()) {
      options.system_debug_info = *parsed;
    } else {
      report(parsed.status(), "0");
    }
  }
  if (const char* v = lookup("INPROF_SYMBOLIZE")) {
    auto parsed = ParseBoolFlag("INPROF_SYMBOLIZE", v);
    if (parsed.ok()) {
      options.symbolize = *parsed;
    } else {
      report(parsed.status(), "1");
    }
  }
  if (const char* v = lookup("INPROF_WALL_PERIOD")) {
    auto parsed = ParseDurationFlag("INPROF_WALL_PERIOD", v,
                                    absl::Milliseconds(1), absl::Hours(1),
                                    /*allow_zero=*/true);
    if (parsed.ok()) {
      options.wall_period = *parsed;
    } else {
      report(parsed.status(), absl::FormatDuration(options.wall_period));
    }
  }
  if (const char* v = lookup("INPROF_WALL_THREADS_PER_TICK")) {
    int n = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(v), &n) && n >= 1 &&
        n <= 10000) {
      options.wall_threads_per_tick = n;
    } else {
      report(absl::InvalidArgumentError(absl::StrCat(
                 "INPROF_WALL_THREADS_PER_TICK='", absl::CHexEscape(v),
                 "': expected a whole number from 1 to 10000")),
             "5");
    }
  }
  if (const char* v = lookup("INPROF_WALL_CPU_BUDGET")) {
    absl::string_view text = absl::StripAsciiWhitespace(v);
    absl::ConsumeSuffix(&text, "%");
    double percent = 0;
    if (absl::SimpleAtod(absl::StripAsciiWhitespace(text), &percent) &&
        (percent == 0 || (percent >= 0.1 && percent <= 100))) {
      options.wall_cpu_budget = percent;
    } else {
      report(absl::InvalidArgumentError(absl::StrCat(
                 "INPROF_WALL_CPU_BUDGET='", absl::CHexEscape(v),
                 "': expected 0 (no budget) or a percentage of one core from "
                 "0.1% to 100%, e.g. 1%")),
             "1%");
    }
  }
  if (const char* v = lookup("INPROF_ALLOC_PERIOD")) {
    if (absl::StatusOr<uint64_t> bytes = ParseAllocPeriodFlag("INPROF_ALLOC_PERIOD", v);
        bytes.ok()) {
      options.alloc_period = *bytes;
      options.alloc_period_source = "INPROF_ALLOC_PERIOD";
    } else {
      report(bytes.status(), "0");
    }
  }
  if (const char* v = lookup("INPROF_LOCK_PERIOD")) {
    auto parsed = ParseDurationFlag("INPROF_LOCK_PERIOD", v, absl::Microseconds(1),
                                    absl::Hours(1), /*allow_zero=*/true, "1ms");
    if (parsed.ok()) {
      options.lock_period = *parsed;
      options.lock_period_source = "INPROF_LOCK_PERIOD";
    } else {
      report(parsed.status(), "0");
    }
  }
  if (const char* v = lookup("INPROF_LOCK_ABSL")) {
    auto parsed = ParseBoolFlag("INPROF_LOCK_ABSL", v);
    if (parsed.ok()) {
      options.lock_absl = *parsed;
    } else {
      report(parsed.status(), "0");
    }
  }
  if (const char* v = lookup("INPROF_DEFAULT_SAMPLE_TYPE")) {
    // A sample type's name: letters, digits, '_' and '-' (checked against
    // the composition's columns at Start, which Options does not know).
    const absl::string_view name = v;
    const bool valid = !name.empty() && name.size() <= 64 &&
                       std::all_of(name.begin(), name.end(), [](char c) {
                         return absl::ascii_isalnum(c) || c == '_' || c == '-';
                       });
    if (valid) {
      options.default_sample_type = std::string(name);
    } else {
      report(absl::InvalidArgumentError(absl::StrCat(
                 "INPROF_DEFAULT_SAMPLE_TYPE='", absl::CHexEscape(v),
                 "': expected a sample type's name, e.g. peak_inuse_space")),
             "the default");
    }
  }
  if (const char* v = lookup("INPROF_OUTPUT")) {
    if (absl::StripAsciiWhitespace(v).empty()) {
      report(absl::InvalidArgumentError(absl::StrCat(
                 "INPROF_OUTPUT='", absl::CHexEscape(v),
                 "': expected a file path")),
             options.output);
    } else if (absl::string_view(v) == "-") {
      // Descriptor 1 may no longer be the program's standard output (it may
      // have closed it and reused the number): never written blindly.
      report(absl::InvalidArgumentError(
                 "INPROF_OUTPUT='-': expected a file path (profiles are not "
                 "written to standard output)"),
             options.output);
    } else {
      options.output = v;
    }
  }
  if (const char* v = lookup("INPROF_CPU_PERIOD")) {
    auto parsed = ParseDurationFlag("INPROF_CPU_PERIOD", v, kMinCpuPeriod,
                                    kMaxCpuPeriod);
    if (parsed.ok()) {
      options.cpu_period = *parsed;
    } else {
      report(parsed.status(), absl::FormatDuration(options.cpu_period));
    }
  }
  if (const char* v = lookup("INPROF_CPU_ENGINE")) {
    const std::string value =
        absl::AsciiStrToLower(absl::StripAsciiWhitespace(v));
    bool known = false;
    for (CpuEngine e : {CpuEngine::kAuto, CpuEngine::kPerf, CpuEngine::kTimer,
                        CpuEngine::kItimer}) {
      if (value == CpuEngineName(e)) {
        options.cpu_engine = e;
        known = true;
      }
    }
    if (!known) {
      report(absl::InvalidArgumentError(absl::StrCat(
                 "INPROF_CPU_ENGINE='", absl::CHexEscape(v),
                 "': expected auto, perf, timer or itimer")),
             "auto");
    }
  }
  auto duration = [&](const char* name, absl::Duration* field,
                      absl::Duration min, absl::Duration max, bool allow_zero,
                      absl::string_view example) {
    if (const char* v = lookup(name)) {
      auto parsed = ParseDurationFlag(name, v, min, max, allow_zero, example);
      if (parsed.ok()) {
        *field = *parsed;
      } else {
        report(parsed.status(), absl::FormatDuration(*field));
      }
    }
  };
  auto integer = [&](const char* name, int* field, int min, int max) {
    if (const char* v = lookup(name)) {
      auto parsed = ParseIntFlag(name, v, min, max);
      if (parsed.ok()) {
        *field = static_cast<int>(*parsed);
      } else {
        report(parsed.status(), absl::StrCat(*field));
      }
    }
  };
  // Free text: surrounding whitespace dropped.
  auto text = [&](const char* name, std::string* field) {
    if (const char* v = lookup(name)) {
      *field = std::string(absl::StripAsciiWhitespace(v));
    }
  };
  duration("INPROF_EXPORT_PERIOD", &options.export_period, kMinExportPeriod,
           kMaxExportPeriod, /*allow_zero=*/true, "60s");
  duration("INPROF_STOP_TIMEOUT", &options.stop_timeout, absl::Milliseconds(1),
           kMaxStopTimeout, /*allow_zero=*/true, "5s");

  // Datadog: DD_TRACE_AGENT_URL wins over DD_AGENT_HOST[:DD_TRACE_AGENT_PORT];
  // either one turns the upload on unless INPROF_DATADOG says otherwise.
  DatadogOptions& dd = options.datadog;
  bool dd_implied = false;
  std::string agent_host = "localhost";
  int agent_port = 8126;
  if (const char* v = lookup("DD_AGENT_HOST")) {
    const absl::string_view host = absl::StripAsciiWhitespace(v);
    if (host.empty() || HasSpace(host) ||
        host.find_first_of("/?#@") != absl::string_view::npos) {
      report(absl::InvalidArgumentError(absl::StrCat(
                 "DD_AGENT_HOST='", absl::CHexEscape(v),
                 "': expected a host name or IP address such as localhost")),
             agent_host);
    } else {
      // An IPv6 literal goes in brackets in a URL.
      agent_host = host.find(':') != absl::string_view::npos &&
                           host.front() != '['
                       ? absl::StrCat("[", host, "]")
                       : std::string(host);
      dd_implied = true;
    }
  }
  integer("DD_TRACE_AGENT_PORT", &agent_port, 1, 65535);
  dd.agent_url = absl::StrCat("http://", agent_host, ":", agent_port);
  if (const char* v = lookup("DD_TRACE_AGENT_URL")) {
    std::string url(absl::StripAsciiWhitespace(v));
    if (!absl::StartsWith(url, "unix://")) {
      while (!url.empty() && url.back() == '/') url.pop_back();
    }
    if (IsEndpointUrl(url, /*allow_unix=*/true)) {
      dd.agent_url = url;
      dd_implied = true;
    } else {
      report(absl::InvalidArgumentError(absl::StrCat(
                 "DD_TRACE_AGENT_URL='", absl::CHexEscape(v),
                 "': expected http://host:port, https://host:port or "
                 "unix:///path/to/socket")),
             dd.agent_url);
    }
  }
  dd.enabled = dd_implied;
  if (const char* v = lookup("INPROF_DATADOG")) {
    auto parsed = ParseBoolFlag("INPROF_DATADOG", v);
    if (parsed.ok()) {
      dd.enabled = *parsed;
    } else {
      report(parsed.status(), dd_implied ? "1" : "0");
    }
  }
  text("DD_SERVICE", &dd.service);
  text("DD_ENV", &dd.env);
  text("DD_VERSION", &dd.version);
  text("DD_HOSTNAME", &dd.hostname);
  if (const char* v = lookup("DD_TAGS")) {
    for (absl::string_view tag :
         absl::StrSplit(v, absl::ByAnyChar(", \t\n"), absl::SkipEmpty())) {
      dd.tags.emplace_back(tag);
    }
  }

  PyroscopeOptions& py = options.pyroscope;
  if (const char* v = lookup("INPROF_PYROSCOPE_URL")) {
    std::string url(absl::StripAsciiWhitespace(v));
    while (!url.empty() && url.back() == '/') url.pop_back();
    if (IsEndpointUrl(url, /*allow_unix=*/false)) {
      py.url = url;
    } else {
      report(absl::InvalidArgumentError(absl::StrCat(
                 "INPROF_PYROSCOPE_URL='", absl::CHexEscape(v),
                 "': expected http://host:port or https://host:port")),
             "no Pyroscope upload");
    }
  }
  if (const char* v = lookup("INPROF_APPLICATION_NAME")) {
    const absl::string_view name = absl::StripAsciiWhitespace(v);
    if (IsValidApplicationName(name)) {
      py.application_name = std::string(name);
    } else {
      report(absl::InvalidArgumentError(absl::StrCat(
                 "INPROF_APPLICATION_NAME='", absl::CHexEscape(v),
                 "': expected a name such as my.app or "
                 "my.app{region=eu,pod=a}")),
             "the program's name");
    }
  }
  text("INPROF_PYROSCOPE_BASIC_AUTH_USER", &py.basic_auth_user);
  text("INPROF_PYROSCOPE_BASIC_AUTH_PASSWORD", &py.basic_auth_password);
  text("INPROF_PYROSCOPE_AUTH_TOKEN", &py.auth_token);
  text("INPROF_PYROSCOPE_TENANT_ID", &py.tenant_id);

  if (const char* v = lookup("INPROF_DUMP_SIGNAL")) {
    if (absl::StatusOr<int> parsed = ParseDumpSignal(v); parsed.ok()) {
      options.dump_signal = *parsed;
    } else {
      report(parsed.status(), "no thread dump on a signal");
    }
  }
  if (const char* v = lookup("INPROF_HTTP_ADDR")) {
    if (absl::StripAsciiWhitespace(v).empty()) {
      options.http_addr.clear();  // set but empty: off
    } else if (auto parsed = internal::ParseListenAddress(v); parsed.ok()) {
      options.http_addr = std::string(absl::StripAsciiWhitespace(v));
    } else {
      report(parsed.status(), "no endpoint");
    }
  }

  UploadOptions& up = options.upload;
  duration("INPROF_UPLOAD_TIMEOUT", &up.timeout, absl::Milliseconds(100),
           absl::Minutes(10), /*allow_zero=*/false, "10s");
  integer("INPROF_PERF_FD_SHARE", &options.perf_fd_share, 0, 100);
  integer("INPROF_PERF_THREADS", &options.perf_threads, 0, kMaxPerfThreads);
  integer("INPROF_UPLOAD_RETRIES", &up.max_retries, 0, kMaxUploadRetries);
  duration("INPROF_UPLOAD_BACKOFF", &up.backoff, absl::Milliseconds(10),
           absl::Minutes(10), /*allow_zero=*/false, "1s");
  integer("INPROF_UPLOAD_QUEUE", &up.max_queued, 1, kMaxUploadQueue);

  // Library mode: profile through `inprof agent` (internal/agent_link.h).
  if (const char* v = lookup("INPROF_AGENT_SOCKET"); v != nullptr && *v != '\0') {
    auto parsed = internal::ParseAgentSocketAddress(v);
    if (parsed.ok()) {
      options.agent_socket = parsed->ToString();
    } else {
      report(absl::InvalidArgumentError(absl::StrCat(
                 "INPROF_AGENT_SOCKET='", absl::CHexEscape(v), "': ",
                 parsed.status().message())),
             "none, profiling in this process");
    }
  }
  if (const char* v = lookup("INPROF_AGENT_FALLBACK")) {
    const std::string value = absl::AsciiStrToLower(absl::StripAsciiWhitespace(v));
    if (value == "local") {
      options.agent_fallback = AgentFallback::kLocal;
    } else if (value == "off") {
      options.agent_fallback = AgentFallback::kOff;
    } else {
      report(absl::InvalidArgumentError(absl::StrCat(
                 "INPROF_AGENT_FALLBACK='", absl::CHexEscape(v),
                 "': expected local or off")),
             "local");
    }
  }
  if (const char* v = lookup("INPROF_AGENT"); v != nullptr && *v != '\0') {
    const std::string value = absl::AsciiStrToLower(absl::StripAsciiWhitespace(v));
    if (value == "spawn") {
      options.agent_spawn = true;
    } else {
      report(absl::InvalidArgumentError(absl::StrCat(
                 "INPROF_AGENT='", absl::CHexEscape(v),
                 "': expected spawn (start an agent when INPROF_AGENT_SOCKET "
                 "is not set)")),
             "none, profiling in this process");
    }
  }
  text("INPROF_AGENT_BINARY", &options.agent_binary);

  // A service that uploads does not also leave files behind unless asked.
  if ((dd.enabled || !py.url.empty()) && lookup("INPROF_OUTPUT") == nullptr) {
    options.write_output = false;
  }
  return options;
}

Options Options::FromEnv() {
  std::vector<std::string> errors;
  Options options = FromLookup(
      [](const char* name) -> const char* { return std::getenv(name); },
      &errors);
  for (const std::string& e : errors) internal::Log(e);
  return options;
}

absl::Status Options::Validate() const {
  if (output.empty()) {
    return absl::InvalidArgumentError("Options.output: expected a file path");
  }
  if (cpu_period < kMinCpuPeriod || cpu_period > kMaxCpuPeriod) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Options.cpu_period=", absl::FormatDuration(cpu_period),
        ": expected a duration from 1ms to 1h"));
  }
  if (!(wall_cpu_budget == 0 || (wall_cpu_budget >= 0.1 && wall_cpu_budget <= 100))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Options.wall_cpu_budget=", wall_cpu_budget,
        ": expected 0 (no budget) or a percentage from 0.1 to 100"));
  }
  if (perf_fd_share < 0 || perf_fd_share > 100) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Options.perf_fd_share=", perf_fd_share, ": expected 0 to 100"));
  }
  if (perf_threads < 0 || perf_threads > kMaxPerfThreads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Options.perf_threads=", perf_threads, ": expected 0 to ", kMaxPerfThreads));
  }
  if (collect_period < absl::Milliseconds(1) ||
      collect_period > absl::Seconds(10)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Options.collect_period=", absl::FormatDuration(collect_period),
        ": expected a duration from 1ms to 10s"));
  }
  if (alloc_period > kMaxAllocPeriod) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Options.alloc_period=", alloc_period, ": expected 0 to 1GiB (1073741824)"));
  }
  if (lock_period != absl::ZeroDuration() &&
      (lock_period < absl::Microseconds(1) || lock_period > absl::Hours(1))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Options.lock_period=", absl::FormatDuration(lock_period),
        ": expected 0 (off) or a duration from 1us to 1h"));
  }
  if (max_frames < 1 || max_frames > 512) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Options.max_frames=", max_frames, ": expected 1 to 512"));
  }
  if (export_period != absl::ZeroDuration() &&
      (export_period < kMinExportPeriod || export_period > kMaxExportPeriod)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Options.export_period=", absl::FormatDuration(export_period),
        ": expected 0 or a duration from 100ms to 24h"));
  }
  if (stop_timeout < absl::ZeroDuration() || stop_timeout > kMaxStopTimeout) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Options.stop_timeout=", absl::FormatDuration(stop_timeout),
        ": expected a duration from 0 to 10m"));
  }
  if (datadog.enabled && !IsEndpointUrl(datadog.agent_url, true)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Options.datadog.agent_url='", absl::CHexEscape(datadog.agent_url),
        "': expected http://host:port, https://host:port or unix:///path"));
  }
  if (!agent_socket.empty()) {
    if (auto parsed = internal::ParseAgentSocketAddress(agent_socket); !parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Options.agent_socket: ", parsed.status().message()));
    }
  }
  if (!DumpSignalAllowed(dump_signal)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Options.dump_signal=", dump_signal, ": expected SIGQUIT, SIGUSR1, SIGUSR2, SIGHUP, "
        "SIGWINCH, a real-time signal, or 0 (none)"));
  }
  if (!http_addr.empty()) {
    if (auto parsed = internal::ParseListenAddress(http_addr); !parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Options.http_addr: ", parsed.status().message()));
    }
  }
  if (!pyroscope.url.empty() && !IsEndpointUrl(pyroscope.url, false)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Options.pyroscope.url='", absl::CHexEscape(pyroscope.url),
        "': expected http://host:port or https://host:port"));
  }
  if (!pyroscope.application_name.empty() &&
      !IsValidApplicationName(pyroscope.application_name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Options.pyroscope.application_name='",
        absl::CHexEscape(pyroscope.application_name),
        "': expected a name such as my.app or my.app{region=eu}"));
  }
  if (upload.timeout <= absl::ZeroDuration() ||
      upload.timeout > absl::Minutes(10)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Options.upload.timeout=", absl::FormatDuration(upload.timeout),
        ": expected a duration from 1ns to 10m"));
  }
  if (upload.backoff <= absl::ZeroDuration() ||
      upload.backoff > absl::Minutes(10)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Options.upload.backoff=", absl::FormatDuration(upload.backoff),
        ": expected a duration from 1ns to 10m"));
  }
  if (upload.max_retries < 0 || upload.max_retries > kMaxUploadRetries) {
    return absl::InvalidArgumentError(
        absl::StrCat("Options.upload.max_retries=", upload.max_retries,
                     ": expected 0 to ", kMaxUploadRetries));
  }
  if (upload.max_queued < 1 || upload.max_queued > kMaxUploadQueue) {
    return absl::InvalidArgumentError(
        absl::StrCat("Options.upload.max_queued=", upload.max_queued,
                     ": expected 1 to ", kMaxUploadQueue));
  }
  for (const auto& sink : sinks) {
    if (sink == nullptr) {
      return absl::InvalidArgumentError(
          "Options.sinks: expected non-null sinks");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ParseAllocPeriodFlag(absl::string_view name,
                                              absl::string_view value) {
  if (std::optional<uint64_t> bytes = ParseByteSize(value);
      bytes.has_value() && *bytes <= kMaxAllocPeriod) {
    return *bytes;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(name, "='", absl::CHexEscape(value),
                   "': expected 0 (off) or a byte size from 1 to 1GiB, e.g. 512KiB"));
}

}  // namespace inprof
