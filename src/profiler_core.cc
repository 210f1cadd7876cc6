#include "inprof/internal/profiler_core.h"

#include <pthread.h>

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "inprof/pprof_writer.h"
#include "inprof/symbolizer.h"

namespace inprof::internal {

ProfilerCore::ProfilerCore(const Options& options,
                           std::vector<ValueType> sample_types,
                           ValueType period_type, int64_t period,
                           std::string engine)
    : options_(options),
      period_type_(std::move(period_type)),
      period_(period),
      engine_(std::move(engine)),
      aggregator_(std::move(sample_types)) {}

ProfilerCore::~ProfilerCore() { StopCollector(); }

void ProfilerCore::StartCollector(std::function<void()> drain) {
  StopCollector();
  {
    std::lock_guard<std::mutex> lock(collector_mutex_);
    collector_stop_ = false;
  }
  const auto period = absl::ToChronoNanoseconds(options_.collect_period);
  collector_ = std::thread([this, drain = std::move(drain), period] {
    pthread_setname_np(pthread_self(), "inprof-collect");
    std::unique_lock<std::mutex> lock(collector_mutex_);
    while (!collector_stop_) {
      collector_cv_.wait_for(lock, period, [this] { return collector_stop_; });
      if (collector_stop_) break;
      lock.unlock();
      drain();
      lock.lock();
    }
  });
}

void ProfilerCore::StopCollector() {
  if (!collector_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(collector_mutex_);
    collector_stop_ = true;
  }
  collector_cv_.notify_all();
  collector_.join();
}

void ProfilerCore::AbandonCollector() {
  if (collector_.joinable()) collector_.detach();
}

void ProfilerCore::BeginWindow() {
  window_start_ns_ = absl::GetCurrentTimeNanos();
}

absl::Status ProfilerCore::Export(const ProfilerStats& stats) {
  ProfileData data;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    data = aggregator_.Take();
  }
  const int64_t now = absl::GetCurrentTimeNanos();
  data.period_type = period_type_;
  data.period = period_;
  data.time_nanos = window_start_ns_;
  data.duration_nanos = now - window_start_ns_;
  data.comments.push_back(absl::StrCat("inprof 0.1.0 ", engine_));
  data.comments.push_back(absl::StrCat(
      "samples taken=", stats.samples_taken,
      " recorded=", stats.samples_recorded,
      " dropped=", stats.samples_dropped, " (ring full)"));
  data.comments.push_back(
      absl::StrCat("stacks truncated=", stats.stacks_truncated));
  window_start_ns_ = now;
  if (symbolizer_ == nullptr) {
    symbolizer_ = std::make_unique<Symbolizer>(options_.symbolize);
  }
  symbolizer_->Refresh();
  return WritePprofFile(options_.output, data, *symbolizer_);
}

}  // namespace inprof::internal
