// inprof/options.h: the profiler's configuration and its INPROF_* variables.
//
// Options is a plain value: construct it in code, or read it from the
// environment with Options::FromEnv(). Reading never fails the host: an
// invalid value prints one line to stderr naming the variable, the value and
// the accepted form, and the default is kept.
//
// | variable          | default       | accepted                              |
// |-------------------|---------------|---------------------------------------|
// | INPROF_ENABLED    | 1             | 1/0, true/false, yes/no, on/off       |
// | INPROF_OUTPUT     | inprof.pb.gz  | a file path (non-empty)               |
// | INPROF_CPU_PERIOD | 10ms          | a duration from 1ms to 1h, e.g. 10ms  |
// | INPROF_SYMBOLIZE  | 1             | 1/0, ...: 0 writes addresses, mappings |
// |                   |               | and build-ids only                    |
//
// Thread-safety: FromEnv reads the environment; call it before starting
// threads that call setenv.
//
// Example:
//   inprof::Options options = inprof::Options::FromEnv();
//   options.output = "/tmp/service.pb.gz";
//   inprof::DefaultProfiler profiler(options);
#ifndef INPROF_OPTIONS_H_
#define INPROF_OPTIONS_H_

#include <functional>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace inprof {

struct Options {
  // False turns the profiler into a no-op: no thread, timer, signal handler
  // or file is created.
  bool enabled = true;
  // Where the pprof profile is written when the profiler stops.
  std::string output = "inprof.pb.gz";
  // CPU time a registered thread runs between two of its samples.
  absl::Duration cpu_period = absl::Milliseconds(10);
  // How often the collector drains the threads' rings (dd-win-prof: 60 ms;
  // 50 ms keeps a 32 KiB ring from filling at the 1 ms period).
  absl::Duration collect_period = absl::Milliseconds(50);
  // Deepest stack recorded (the seed's limit).
  int max_frames = 512;
  // False: the profile carries addresses and mappings with build-ids only,
  // for symbolizing later (go tool pprof with the binaries at hand).
  bool symbolize = true;

  // Accepted range of cpu_period. Below 1 ms the kernel's CPU-timer checks
  // (at scheduler ticks) bunch samples together and the handler's cost grows.
  static constexpr absl::Duration kMinCpuPeriod = absl::Milliseconds(1);
  static constexpr absl::Duration kMaxCpuPeriod = absl::Hours(1);

  // Reads INPROF_* from the process environment; logs each invalid value.
  static Options FromEnv();

  // Same, from any lookup (returns nullptr for unset variables). Each
  // invalid value is appended to `errors` as one line, e.g.
  // "INPROF_CPU_PERIOD='ten': expected a duration from 1ms to 1h such as
  // 10ms; using 10ms".
  using Lookup = std::function<const char*(const char* name)>;
  static Options FromLookup(const Lookup& lookup,
                            std::vector<std::string>* errors);

  // Checks the fields set in code; the message names the field.
  absl::Status Validate() const;
};

// Parsers shared by the variables; each returns InvalidArgument naming
// `name` and `value` and the accepted form.
absl::StatusOr<bool> ParseBoolFlag(absl::string_view name, absl::string_view value);
absl::StatusOr<absl::Duration> ParseDurationFlag(absl::string_view name,
                                                 absl::string_view value,
                                                 absl::Duration min,
                                                 absl::Duration max,
                                                 bool allow_zero = false);

}  // namespace inprof

#endif  // INPROF_OPTIONS_H_
