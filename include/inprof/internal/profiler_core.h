// internal: not part of the public API.
//
// The type-independent half of Profiler: the aggregate, the collector thread
// that drains rings into it, and the export to pprof. The Profiler template
// supplies the drain step (it knows its ring and provider types).
#ifndef INPROF_INTERNAL_PROFILER_CORE_H_
#define INPROF_INTERNAL_PROFILER_CORE_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "inprof/options.h"
#include "inprof/profile_data.h"
#include "inprof/sample_aggregator.h"

namespace inprof {
class Symbolizer;

// Counters a profiler reports (and writes into the profile's comments).
struct ProfilerStats {
  uint64_t samples_taken = 0;      // signals that produced a sample
  uint64_t samples_recorded = 0;   // samples that reached the aggregate
  uint64_t samples_dropped = 0;    // samples lost because a ring was full
  uint64_t stacks_truncated = 0;   // walks stopped at a bad frame / limit
  uint64_t threads_registered = 0; // registrations since construction
  uint64_t profiles_written = 0;
};

namespace internal {

class ProfilerCore {
 public:
  ProfilerCore(const Options& options, std::vector<ValueType> sample_types,
               ValueType period_type, int64_t period, std::string engine);
  ~ProfilerCore();
  ProfilerCore(const ProfilerCore&) = delete;
  ProfilerCore& operator=(const ProfilerCore&) = delete;

  const Options& options() const { return options_; }

  // Runs `drain` every collect_period on the collector thread
  // ("inprof-collect") until StopCollector.
  void StartCollector(std::function<void()> drain);
  // Wakes and joins the collector. Safe to call when not started.
  void StopCollector();
  // In a forked child the collector thread does not exist: forget it.
  void AbandonCollector();

  // Starts a profile window now.
  void BeginWindow();

  // The aggregate, for the drain step; `mutex()` must be held.
  SampleAggregator& aggregator() { return aggregator_; }
  std::mutex& mutex() { return mutex_; }

  // Takes everything aggregated since BeginWindow and writes it to
  // options().output. `stats` goes into the profile's comments.
  absl::Status Export(const ProfilerStats& stats);

 private:
  Options options_;
  ValueType period_type_;
  int64_t period_;
  std::string engine_;

  std::mutex mutex_;  // guards aggregator_
  SampleAggregator aggregator_;
  int64_t window_start_ns_ = 0;

  std::unique_ptr<Symbolizer> symbolizer_;  // kept: caches across exports

  std::mutex collector_mutex_;
  std::condition_variable collector_cv_;
  bool collector_stop_ = false;
  std::thread collector_;
};

}  // namespace internal
}  // namespace inprof

#endif  // INPROF_INTERNAL_PROFILER_CORE_H_
