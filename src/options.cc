#include "inprof/options.h"

#include <cstdlib>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "inprof/internal/log.h"

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
                                                 bool allow_zero) {
  absl::Duration d;
  const absl::string_view v = absl::StripAsciiWhitespace(value);
  const bool parsed = absl::ParseDuration(v, &d);
  const bool in_range = parsed && ((allow_zero && d == absl::ZeroDuration()) ||
                                   (d >= min && d <= max));
  if (!in_range) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, "='", absl::CHexEscape(value), "': expected a duration from ",
        absl::FormatDuration(min), " to ", absl::FormatDuration(max),
        allow_zero ? " (or 0 to disable)" : "", " such as 10ms"));
  }
  return d;
}

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
  if (const char* v = lookup("INPROF_SYMBOLIZE")) {
    auto parsed = ParseBoolFlag("INPROF_SYMBOLIZE", v);
    if (parsed.ok()) {
      options.symbolize = *parsed;
    } else {
      report(parsed.status(), "1");
    }
  }
  if (const char* v = lookup("INPROF_OUTPUT")) {
    if (absl::StripAsciiWhitespace(v).empty()) {
      report(absl::InvalidArgumentError(absl::StrCat(
                 "INPROF_OUTPUT='", absl::CHexEscape(v),
                 "': expected a file path")),
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
  if (collect_period < absl::Milliseconds(1) ||
      collect_period > absl::Seconds(10)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Options.collect_period=", absl::FormatDuration(collect_period),
        ": expected a duration from 1ms to 10s"));
  }
  if (max_frames < 1 || max_frames > 512) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Options.max_frames=", max_frames, ": expected 1 to 512"));
  }
  return absl::OkStatus();
}

}  // namespace inprof
