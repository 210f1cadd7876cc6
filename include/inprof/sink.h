// inprof/sink.h: where exported profiles go (files, HTTP intakes, your own).
//
// Defines ExportedProfile (one window's gzip-compressed pprof and the window
// it covers), the ProfileSink interface the exporter hands each profile to,
// and FileSink, which writes each profile to a file atomically.
//
// Thread-safety: the profiler calls a sink's Consume() from its exporter
// thread (or from Stop()), one call at a time, then Flush() from Stop().
// Consume() must return promptly: a slow destination queues the profile and
// delivers it from its own thread (see datadog_uploader.h). Never called
// from a signal handler or a sampled thread.
//
// Example:
//   class CountingSink : public inprof::ProfileSink {
//    public:
//     absl::string_view name() const override { return "counting"; }
//     absl::Status Consume(
//         std::shared_ptr<const inprof::ExportedProfile> p) override {
//       ++count;  // p->pprof: gzip-compressed pprof of [p->start, p->end)
//       return absl::OkStatus();
//     }
//     int count = 0;
//   };
//   options.sinks.push_back(std::make_shared<CountingSink>());
#ifndef INPROF_SINK_H_
#define INPROF_SINK_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "inprof/base/platform.h"

namespace inprof {

// One profile window, as every sink receives it (shared, never copied).
struct ExportedProfile {
  std::string pprof;  // gzip-compressed perftools.profiles.Profile
  absl::Time start;   // window start (the profile's time_nanos)
  absl::Time end;     // window end: start + duration_nanos; the next
                      // window's start
  uint64_t sequence = 0;  // windows exported by this profiler before this one
  bool last = false;      // the window Stop() closed
};

class ProfileSink {
 public:
  virtual ~ProfileSink() = default;

  // Short name for log lines ("file", "datadog", "pyroscope").
  virtual absl::string_view name() const = 0;

  // Takes one profile. Returns promptly; an error is logged by the caller
  // (once per streak of failures) and the profile is not retried.
  virtual absl::Status Consume(std::shared_ptr<const ExportedProfile> profile) = 0;

  // Delivers what Consume() accepted, giving up at `deadline`, and stops the
  // sink's background work (a later Consume() starts it again). Returns
  // DeadlineExceeded naming what was not delivered.
  virtual absl::Status Flush(absl::Time deadline) {
    (void)deadline;
    return absl::OkStatus();
  }

  // In a forked child: forget background threads without touching them.
  virtual void Abandon() {}
};

// `pattern` with %p replaced by `pid`, %t by `start` in UTC as
// 20240102T030405.678Z (sortable, millisecond precision) and %% by %.
// Other % sequences are kept as written.
std::string ExpandOutputPattern(absl::string_view pattern, pid_t pid,
                                absl::Time start);

// WriteFileAtomically(path, bytes): base/platform.h.

struct Options;

// The sinks that need nothing above this layer, in the order they get each
// window: the output file (options.write_output), then options.sinks. The
// pipeline's sinks when nothing composes others; MakeSinks
// (internal/sinks_from_options.h) puts the uploaders between the two.
std::vector<std::shared_ptr<ProfileSink>> LocalSinks(const Options& options);

// Writes each profile to ExpandOutputPattern(pattern, getpid(), start):
// without %t each window replaces the previous file; with %t a run leaves a
// series of files. Writes synchronously in Consume() (a local file).
class FileSink final : public ProfileSink {
 public:
  explicit FileSink(std::string pattern) : pattern_(std::move(pattern)) {}
  absl::string_view name() const override { return "file"; }
  absl::Status Consume(std::shared_ptr<const ExportedProfile> profile) override;

  // Path of the last file written; empty before the first.
  const std::string& last_path() const { return last_path_; }

 private:
  std::string pattern_;
  std::string last_path_;
};

}  // namespace inprof

#endif  // INPROF_SINK_H_
