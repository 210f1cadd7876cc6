// The pipeline's answers to requests (from the servers attached to it): a
// profile of the next N seconds (Capture), of the aggregate now (Snapshot,
// SnapshotData), the threads' stacks now (ThreadDump), encoded as a
// request is answered.
#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "inprof/base/alloc_guard.h"
#include "inprof/base/growth_safe_table.h"
#include "inprof/base/log.h"
#include "inprof/base/owned_fd.h"
#include "inprof/internal/pipeline.h"
#include "inprof/internal/thread_dump_text.h"
#include "inprof/pprof_writer.h"
#include "inprof/symbolizer.h"
#include "src/pipeline/pipeline_parts.h"

namespace inprof::internal {

absl::StatusOr<std::string> Pipeline::Capture(absl::Duration duration) {
  // Its callers, servers attached, run between StartCollector and
  // StopCollector, which stops them (Stopping) before threads_ goes.
  Threads* t = threads_.get();
  if (t == nullptr) return absl::UnavailableError("the profiler is not running");
  {
    // StopCollector waits for this count to drop before `t` goes.
    std::lock_guard<std::mutex> lock(t->mutex);
    if (t->stop) return absl::UnavailableError("the profiler is stopping");
    ++t->captures;
  }
  SampleAggregator window(aggregator_.sample_types());
  ShapeLikeOurs(window);
  // The wake-up that stands for the time before the capture, before it.
  if (t->edge) t->edge();
  int64_t start = 0;
  ProfilerStats before;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    aggregator_.SetMirror(&window);
    start = absl::GetCurrentTimeNanos();
    before = stats_ ? stats_() : baseline_;
  }
  bool stopped = false;
  {
    std::unique_lock<std::mutex> lock(t->mutex);
    stopped = t->cv.wait_for(lock, absl::ToChronoNanoseconds(duration),
                             [t] { return t->stop; });
  }
  // Samples still in the rings belong to this window, and those of a
  // wake-up that stands for the time up to its end.
  if (!stopped) {
    if (t->edge) t->edge();
    DrainNow(t);
  }
  {
    // The last use of `t`; notified under the lock, as StopCollector may
    // destroy it as soon as the lock is free.
    std::lock_guard<std::mutex> lock(t->mutex);
    --t->captures;
    t->cv.notify_all();
  }
  ProfileData data;
  ProfilerStats window_stats;
  std::string engine_detail;
  std::string notes;
  std::vector<std::string> event_lines;  // the attachments' (BeforeCutLocked)
  int64_t end = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // Events recorded since the last cut, into both windows (the mirror is
    // still set).
    if (!stopped) {
      for (const auto& a : attachments_) {
        if (std::string line = a->BeforeCutLocked(aggregator_, /*window_end=*/false);
            !line.empty()) {
          event_lines.push_back(std::move(line));
        }
      }
    }
    aggregator_.SetMirror(nullptr);
    if (!stopped) {
      data = window.Take();
      end = absl::GetCurrentTimeNanos();
      window_stats = Delta(stats_ ? stats_() : baseline_, before);
      engine_detail = engine_detail_;
      notes = NotesLocked();
    }
  }
  if (stopped) {
    return absl::UnavailableError(
        "the profiler stopped during the capture; no profile");
  }
  Describe(data, start, end, window_stats, engine_detail, notes);
  for (std::string& line : event_lines) data.comments.push_back(std::move(line));
  data.comments.push_back(absl::StrCat(
      "live capture of ", absl::FormatDuration(duration),
      " (INPROF_HTTP_ADDR); the periodic export's windows are separate"));
  return EncodeForRequest(data);
}

absl::StatusOr<std::string> Pipeline::ThreadDump(absl::string_view type, int debug) {
  if (!thread_dumper_) {
    return absl::NotFoundError("no thread dump here: the profiler has no registry of threads");
  }
  absl::StatusOr<ProfileData> data = thread_dumper_();
  if (!data.ok()) return data.status();
  data->sample_types = {{std::string(type), "count"}};
  data->period_type = data->sample_types[0];
  return EncodeForRequest(*data, debug);
}

absl::StatusOr<std::string> Pipeline::EncodeForRequest(const ProfileData& data, int debug) {
  auto encode = [&](Symbolizer& symbolizer) -> absl::StatusOr<std::string> {
    if (debug != 0) return ThreadDumpText(data, symbolizer, /*grouped=*/debug == 1);
    return EncodePprof(data, symbolizer);
  };
  absl::StatusOr<std::string> encoded;
  if (symbolizer_given_) {
    // Another process's (a session of inprof's own): its symbolizer holds its files
    // open, and it may have exited since; shared with the exporter. Only
    // in the descriptor table those files are in: from another one (a
    // server thread in a table of inprof's) a refresh would open the
    // process's files there and close the old numbers there, and the
    // exporter would later read and close the new numbers in its own
    // table -- files of its own that are not the symbolizer's.
    if (CurrentDescriptorTable() != symbolizer_table_) {
      return absl::FailedPreconditionError(
          "this capture was asked for from a thread whose descriptor table "
          "does not hold the process's symbol files; nothing was symbolized");
    }
    std::lock_guard<std::mutex> lock(export_mutex_);
    encoded = encode(*symbolizer_);
  } else if (!RunWithOwnDescriptors([&] {
               // The request's own symbolizer: the exporter's is not shared
               // (no lock held across symbolization), and this one's caches
               // (and files) go with the request, in a descriptor table of
               // inprof's.
               Symbolizer symbolizer(options_.symbolize);
               symbolizer.set_system_debug_info(options_.system_debug_info);
               symbolizer.Refresh();
               encoded = encode(symbolizer);
             })) {
    encoded = absl::ResourceExhaustedError("the profile could not be symbolized (out of memory)");
  }
  if (encoded.ok() && debug == 0) encoded = GzipCompress(*encoded);
  return encoded;
}

namespace {

// A sample's identity across two snapshots: its thread, stack (or
// synthetic frame) and labels.
std::string SampleKey(const ProfileData& data, const ProfileSample& s) {
  std::string key;
  if (s.thread < data.threads.size()) {
    absl::StrAppend(&key, data.threads[s.thread].tid, "\x1f", data.threads[s.thread].name);
  }
  absl::StrAppend(&key, "\x1e", s.synthetic_frame, "\x1e");
  for (uint64_t f : s.frames) absl::StrAppend(&key, f, ",");
  for (const SampleLabel& l : s.labels) {
    absl::StrAppend(&key, "\x1d", l.key, "=", l.numeric ? absl::StrCat(l.num) : l.str);
  }
  return key;
}

// `later` - `earlier`, sample by sample (Go's delta profile: what changed
// between two snapshots); samples whose every value is 0 go.
void SubtractProfile(ProfileData& later, const ProfileData& earlier) {
  internal::ThrowSafeMap<std::string, size_t> index;
  for (size_t i = 0; i < later.samples.size(); ++i) {
    index.emplace(SampleKey(later, later.samples[i]), i);
  }
  for (const ProfileSample& s : earlier.samples) {
    auto it = index.find(SampleKey(earlier, s));
    if (it == index.end()) {
      // Gone since (a stack whose live blocks were all freed): negative.
      ProfileSample negated = s;
      for (int64_t& v : negated.values) v = -v;
      if (s.thread < earlier.threads.size()) {
        negated.thread = static_cast<uint32_t>(later.threads.size());
        later.threads.push_back(earlier.threads[s.thread]);
      }
      later.samples.push_back(std::move(negated));
      continue;
    }
    std::vector<int64_t>& values = later.samples[it->second].values;
    for (size_t v = 0; v < values.size() && v < s.values.size(); ++v) values[v] -= s.values[v];
  }
  later.samples.erase(
      std::remove_if(later.samples.begin(), later.samples.end(),
                     [](const ProfileSample& s) {
                       return std::all_of(s.values.begin(), s.values.end(),
                                          [](int64_t v) { return v == 0; });
                     }),
      later.samples.end());
}

// The lock-wait provider's types (Go's mutex and block profiles).
bool IsLockType(absl::string_view type) { return type == "contentions" || type == "delay"; }

}  // namespace

absl::Status Pipeline::SnapshotData(absl::string_view type, ProfileData* out,
                                    uint64_t* types) {
  // Events still in the threads' slots (a registered thread's sampled
  // allocations wait there for the next drain, 50 ms) belong in it.
  if (Threads* t = threads_.get(); t != nullptr) {
    bool counted = false;
    {
      std::lock_guard<std::mutex> lock(t->mutex);
      if (!t->stop) {
        ++t->captures;  // StopCollector waits for it, as for a capture
        counted = true;
      }
    }
    if (counted) {
      DrainNow(t);
      std::lock_guard<std::mutex> lock(t->mutex);
      --t->captures;
      t->cv.notify_all();
    }
  }
  SampleAggregator snapshot(aggregator_.sample_types());
  ShapeLikeOurs(snapshot);
  PipelineAttachment::SnapshotShape shape;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& a : attachments_) {
      const PipelineAttachment::SnapshotShape s = a->SnapshotLocked(snapshot, type);
      if (s.types != 0 && shape.types == 0) shape = s;
    }
  }
  if (shape.types == 0) {
    if (IsLockType(type)) {
      return absl::NotFoundError(
          "lock-wait profiling is off in this process: set INPROF_LOCK_PERIOD (e.g. 1ms) "
          "before Start");
    }
    return absl::NotFoundError(
        "allocation profiling is off in this process: set INPROF_ALLOC_PERIOD "
        "(e.g. 512KiB) before Start");
  }
  *out = snapshot.Take();
  const std::vector<ValueType> all = out->sample_types;
  OmitTypes(*out, ~shape.types);
  if (shape.period_type < all.size()) out->period_type = all[shape.period_type];
  out->period = shape.period;
  *types = shape.types;
  return absl::OkStatus();
}

absl::StatusOr<std::string> Pipeline::Snapshot(absl::string_view default_type,
                                               absl::Duration delta) {
  // What this does on a host's thread (HeapProfilerDump) is inprof's, not
  // the host's: never sampled as its allocations.
  AllocGuard guard;
  ProfileData data;
  uint64_t types = 0;
  if (absl::Status s = SnapshotData(default_type, &data, &types); !s.ok()) return s;
  int64_t start;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    start = run_start_ns_;
  }
  if (delta > absl::ZeroDuration()) {
    // Go's ?seconds=N: the difference of two snapshots N seconds apart.
    // The wait ends early, Unavailable, when the profiler stops.
    Threads* t = threads_.get();
    if (t == nullptr) return absl::UnavailableError("the profiler is not running");
    {
      std::unique_lock<std::mutex> lock(t->mutex);
      if (t->stop) return absl::UnavailableError("the profiler is stopping");
      ++t->captures;
      const bool stopped = t->cv.wait_for(lock, absl::ToChronoNanoseconds(delta),
                                          [t] { return t->stop; });
      --t->captures;
      t->cv.notify_all();
      if (stopped) return absl::UnavailableError("the profiler stopped during the wait");
    }
    start = absl::GetCurrentTimeNanos() - absl::ToInt64Nanoseconds(delta);
    ProfileData later;
    if (absl::Status s = SnapshotData(default_type, &later, &types); !s.ok()) return s;
    SubtractProfile(later, data);
    data = std::move(later);
  }
  for (size_t i = 0; i < data.sample_types.size(); ++i) {
    if (data.sample_types[i].type == default_type) {
      data.default_sample_type = static_cast<int64_t>(i);
    }
  }
  std::string engine_detail;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    engine_detail = engine_detail_;
  }
  const int64_t now = absl::GetCurrentTimeNanos();
  data.time_nanos = start > 0 ? start : now;
  data.duration_nanos = now - data.time_nanos;
  data.comments.push_back(absl::StrCat("inprof 0.1.0 ", engine_));
  if (!engine_detail.empty()) data.comments.push_back(engine_detail);
  if (IsLockType(default_type)) {
    data.comments.push_back(
        delta > absl::ZeroDuration()
            ? absl::StrCat("lock waits (INPROF_HTTP_ADDR, seconds=", absl::ToInt64Seconds(delta),
                           "): contentions and delay in those seconds")
            : "lock waits (INPROF_HTTP_ADDR): contentions and delay since the profiler started");
  } else {
    data.comments.push_back(
        delta > absl::ZeroDuration()
            ? absl::StrCat("heap delta (INPROF_HTTP_ADDR, seconds=",
                           absl::ToInt64Seconds(delta),
                           "): alloc_* made and inuse_* changed in those seconds")
            : "heap snapshot (INPROF_HTTP_ADDR): alloc_* since the profiler started, inuse_* now");
  }
  return EncodeForRequest(data);
}


}  // namespace inprof::internal
