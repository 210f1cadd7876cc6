#include "inprof/internal/pipeline.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "inprof/base/alloc_guard.h"
#include "inprof/base/contained.h"
#include "inprof/base/fork_guard.h"
#include "inprof/base/log.h"
#include "inprof/base/owned_fd.h"
#include "inprof/base/platform.h"
#include "inprof/base/profiler_thread.h"
#include "inprof/pprof_writer.h"
#include "inprof/symbolizer.h"

namespace inprof::internal {
namespace {

ProfilerStats Delta(const ProfilerStats& now, const ProfilerStats& before) {
  ProfilerStats d = now;
#define INPROF_STATS_DELTA(name, per_window, what) \
  if (per_window) d.name -= before.name;
  INPROF_PROFILER_STATS(INPROF_STATS_DELTA)
#undef INPROF_STATS_DELTA
  return d;
}

// Leaves out the sample types of `mask` (bit i: sample_types[i]), whose
// values are all 0 in `data`: a provider's that is off, or those a snapshot
// did not fill.
void OmitTypes(ProfileData& data, uint64_t mask) {
  auto omitted = [mask](size_t i) { return i < 64 && ((mask >> i) & 1) != 0; };
  size_t left = 0;
  for (size_t i = 0; i < data.sample_types.size(); ++i) left += omitted(i) ? 0 : 1;
  if (left == 0) return;  // a profile keeps its types
  auto compact = [&omitted](auto& values) {
    size_t n = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      if (omitted(i)) continue;
      if (n != i) values[n] = std::move(values[i]);
      ++n;
    }
    values.resize(n);
  };
  compact(data.sample_types);
  for (ProfileSample& sample : data.samples) compact(sample.values);
}

}  // namespace

std::vector<uint64_t> StatsToCounters(const ProfilerStats& s) {
  std::vector<uint64_t> counters;
#define INPROF_STATS_PUSH(name, per_window, what) counters.push_back(s.name);
  INPROF_PROFILER_STATS(INPROF_STATS_PUSH)
#undef INPROF_STATS_PUSH
  return counters;
}

ProfilerStats StatsFromCounters(std::span<const uint64_t> c) {
  ProfilerStats s;
  size_t i = 0;
#define INPROF_STATS_READ(name, per_window, what) \
  s.name = i < c.size() ? c[i] : 0;               \
  ++i;
  INPROF_PROFILER_STATS(INPROF_STATS_READ)
#undef INPROF_STATS_READ
  return s;
}

struct Pipeline::Threads {
  std::mutex mutex;
  std::condition_variable cv;
  bool stop = false;
  ProfilerThread collector;
  ProfilerThread exporter;
  std::function<void()> drain;  // for the endpoint's captures
  int captures = 0;  // Capture()s using this object (guarded by `mutex`)
  // The collector's passes begun and finished, and whether one is asked
  // for now (DrainNow; guarded by `mutex`).
  uint64_t passes_begun = 0;
  uint64_t passes_done = 0;
  bool pass_wanted = false;
};

void Pipeline::DrainNow(Threads* t) {
  if (CurrentDescriptorTable() == 0) {
    t->drain();
    return;
  }
  std::unique_lock<std::mutex> lock(t->mutex);
  // A pass begun after this call: the records pushed before it are in.
  const uint64_t wanted = t->passes_begun + 1;
  t->pass_wanted = true;
  t->cv.notify_all();
  t->cv.wait(lock, [t, wanted] { return t->stop || t->passes_done >= wanted; });
}

Pipeline::Pipeline(const Options& options,
                           std::vector<ValueType> sample_types,
                           ValueType period_type, int64_t period,
                           std::string engine)
    : options_(options),
      period_type_(std::move(period_type)),
      period_(period),
      engine_(std::move(engine)),
      aggregator_(std::move(sample_types)) {
  const std::string& wanted = options_.default_sample_type;
  if (wanted.empty()) return;
  std::vector<std::string> names;
  for (const ValueType& t : aggregator_.sample_types()) {
    if (t.type == wanted) return;
    names.push_back(t.type);
  }
  Log(absl::StrCat("default sample type '", wanted, "' (INPROF_DEFAULT_SAMPLE_TYPE): this "
                   "profiler has no such column (it has: ", absl::StrJoin(names, ", "),
                   "); viewers open on ", period_type_.type));
}

Pipeline::~Pipeline() {
  StopCollector();
  // Sinks with threads stop them in their destructors (aborting what is in
  // flight); Export() normally flushed them already.
}

void Pipeline::SetSinkFactory(SinkFactory factory) {
  std::lock_guard<std::mutex> lock(export_mutex_);
  sink_factory_ = std::move(factory);
}

PipelineAttachment* Pipeline::Attach(std::unique_ptr<PipelineAttachment> attachment) {
  attachments_.push_back(std::move(attachment));
  return attachments_.back().get();
}

void Pipeline::RegisterForkLock(ForkLockRank rank) {
  internal::RegisterForkLock(&mutex_, rank);
}

void Pipeline::UnregisterForkLock() { internal::UnregisterForkLock(&mutex_); }

ProfilerStats Pipeline::Locked::stats(const ProfilerStats* fallback) const {
  if (p_.stats_) return p_.stats_();
  return fallback != nullptr ? *fallback : p_.baseline_;
}

void Pipeline::Locked::RestartWindow(int64_t now_ns) {
  p_.window_start_ns_ = now_ns;
  p_.baseline_ = stats();
}

void Pipeline::EnsureSinks() {
  if (sinks_built_) return;
  sinks_built_ = true;
  sinks_ = sink_factory_ ? sink_factory_() : LocalSinks(options_);
  sink_failing_.assign(sinks_.size(), false);
}

void Pipeline::StartCollector(std::function<void()> drain,
                              StatsFunction stats) {
  StopCollector();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_ = std::move(stats);
  }
  // While an attachment takes the samples (library mode: the agent has the
  // sinks), the sinks are made only if the process goes on to export
  // itself (ExportHere).
  bool forwarding = false;
  for (const auto& a : attachments_) forwarding = a->TakesSamples() || forwarding;
  if (!forwarding) {
    std::lock_guard<std::mutex> lock(export_mutex_);
    EnsureSinks();
  }
  threads_ = std::make_unique<Threads>();
  Threads* t = threads_.get();
  t->drain = drain;
  const auto period = absl::ToChronoNanoseconds(options_.collect_period);
  std::function<void()> step = drain;
  if (!attachments_.empty()) {
    step = [this, drain] {
      drain();
      for (const auto& a : attachments_) a->AfterDrain(*this);
    };
  }
  t->collector = ProfilerThread([t, step, period] {
    SetCurrentThreadName("inprof-collect");
    // A first pass right away: unwinders with per-module tables build them
    // here, off the thread that called Start(). A pass that throws (no
    // memory) is skipped; its records wait in the rings for the next.
    std::unique_lock<std::mutex> lock(t->mutex);
    bool first = true;
    while (!t->stop) {
      if (!first) {
        t->cv.wait_for(lock, period, [t] { return t->stop || t->pass_wanted; });
        if (t->stop) break;
      }
      first = false;
      t->pass_wanted = false;
      ++t->passes_begun;
      lock.unlock();
      RunContained("a collector pass", step);
      lock.lock();
      ++t->passes_done;
      t->cv.notify_all();
    }
  });
  if (!forwarding) StartExporter(t, t->drain);
  for (const auto& a : attachments_) a->Started(*this);
}

void Pipeline::ExportHere() {
  {
    std::lock_guard<std::mutex> lock(export_mutex_);
    EnsureSinks();
  }
  StartExporter(threads_.get(), threads_->drain);
}

void Pipeline::StartExporter(Threads* t, const std::function<void()>& drain) {
  if (options_.export_period <= absl::ZeroDuration()) return;
  t->exporter = ProfilerThread([this, t, drain] {
    SetCurrentThreadName("inprof-export");
    ExporterLoop(t, drain);
  });
}

void Pipeline::UseSymbolizer(std::unique_ptr<Symbolizer> symbolizer) {
  std::lock_guard<std::mutex> lock(export_mutex_);
  symbolizer_ = std::move(symbolizer);
  symbolizer_given_ = symbolizer_ != nullptr;
}

void Pipeline::SetLabelTable(const LabelTable* table) {
  std::lock_guard<std::mutex> lock(mutex_);
  label_table_ = table;
  aggregator_.SetLabelTable(table);
}

void Pipeline::SetStackLimits(size_t max_stacks, size_t max_frame_words,
                              std::string overflow_frame) {
  std::lock_guard<std::mutex> lock(mutex_);
  max_stacks_ = max_stacks;
  max_frame_words_ = max_frame_words;
  overflow_frame_ = std::move(overflow_frame);
  aggregator_.SetStackLimits(max_stacks_, max_frame_words_, overflow_frame_);
}

void Pipeline::ShapeLikeOurs(SampleAggregator& aggregator) const {
  aggregator.SetLabelTable(label_table_);
  if (!overflow_frame_.empty()) {
    aggregator.SetStackLimits(max_stacks_, max_frame_words_, overflow_frame_);
  }
}

void Pipeline::SetProcessNote(std::string note) {
  std::lock_guard<std::mutex> lock(mutex_);
  process_note_ = std::move(note);
}

std::string Pipeline::NotesLocked() const {
  if (process_note_.empty()) return attachment_note_;
  if (attachment_note_.empty()) return process_note_;
  return absl::StrCat(process_note_, "; ", attachment_note_);
}

absl::StatusOr<std::string> Pipeline::Capture(absl::Duration duration) {
  // The endpoint, the only caller, runs between StartCollector and
  // StopCollector, which stops it (Stopping) before threads_ goes.
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
  // Samples still in the rings belong to this window.
  if (!stopped) DrainNow(t);
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

absl::StatusOr<std::string> Pipeline::EncodeForRequest(const ProfileData& data) {
  absl::StatusOr<std::string> encoded;
  if (symbolizer_given_) {
    // Another process's (`inprof agent`): its symbolizer holds its files
    // open, and it may have exited since; shared with the exporter.
    std::lock_guard<std::mutex> lock(export_mutex_);
    encoded = EncodePprof(data, *symbolizer_);
  } else if (!RunWithOwnDescriptors([&] {
               // The request's own symbolizer: the exporter's is not shared
               // (no lock held across symbolization), and this one's caches
               // (and files) go with the request, in a descriptor table of
               // inprof's.
               Symbolizer symbolizer(options_.symbolize);
               symbolizer.set_system_debug_info(options_.system_debug_info);
               symbolizer.Refresh();
               encoded = EncodePprof(data, symbolizer);
             })) {
    encoded = absl::ResourceExhaustedError("the profile could not be symbolized (out of memory)");
  }
  if (encoded.ok()) encoded = GzipCompress(*encoded);
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
  absl::flat_hash_map<std::string, size_t> index;
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

}  // namespace

absl::Status Pipeline::SnapshotData(ProfileData* out, uint64_t* types) {
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
      const PipelineAttachment::SnapshotShape s = a->SnapshotLocked(snapshot);
      if (s.types != 0 && shape.types == 0) shape = s;
    }
  }
  if (shape.types == 0) {
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
  if (absl::Status s = SnapshotData(&data, &types); !s.ok()) return s;
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
    if (absl::Status s = SnapshotData(&later, &types); !s.ok()) return s;
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
  data.comments.push_back(
      delta > absl::ZeroDuration()
          ? absl::StrCat("heap delta (INPROF_HTTP_ADDR, seconds=",
                         absl::ToInt64Seconds(delta),
                         "): alloc_* made and inuse_* changed in those seconds")
          : "heap snapshot (INPROF_HTTP_ADDR): alloc_* since the profiler started, inuse_* now");
  return EncodeForRequest(data);
}

void Pipeline::ExporterLoop(Threads* t,
                                const std::function<void()>& drain) {
  using Clock = std::chrono::steady_clock;
  const auto period = std::chrono::duration_cast<Clock::duration>(
      absl::ToChronoNanoseconds(options_.export_period));
  auto next = Clock::now() + period;
  std::unique_lock<std::mutex> lock(t->mutex);
  while (!t->stop) {
    if (t->cv.wait_until(lock, next, [t] { return t->stop; })) break;
    lock.unlock();
    // Samples still in the rings belong to this window. A window that
    // throws (no memory) is not written; its samples go to the next.
    RunContained("an export window", [&] {
      drain();
      std::lock_guard<std::mutex> export_lock(export_mutex_);
      ExportWindow(nullptr, /*last=*/false).IgnoreError();
    });
    lock.lock();
    // Keep the schedule; after a stall, restart it rather than catch up.
    next += period;
    if (next <= Clock::now()) next = Clock::now() + period;
  }
}

void Pipeline::StopCollector() {
  if (threads_ == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(threads_->mutex);
    threads_->stop = true;
  }
  threads_->cv.notify_all();
  // A capture in progress has been woken (it answers 503); an endpoint's
  // server waits for its connections' threads.
  for (const auto& a : attachments_) a->Stopping();
  {
    // And a capture called directly (not through the server) is let go.
    std::unique_lock<std::mutex> lock(threads_->mutex);
    threads_->cv.wait(lock, [this] { return threads_->captures == 0; });
  }
  if (threads_->collector.joinable()) threads_->collector.join();
  if (threads_->exporter.joinable()) threads_->exporter.join();
  threads_.reset();
}

void Pipeline::AbandonCollector() {
  // Leaked, never destroyed or detached: the std::thread objects name
  // threads that do not exist here (pthread_detach on them fails or reads
  // the parent's reclaimed thread descriptors), and destroying a joinable
  // std::thread would terminate the process.
  (void)threads_.release();
  for (const auto& a : attachments_) a->Abandon();
  // No lock: in the child the lock may be held by a thread that is gone.
  for (const auto& sink : sinks_) sink->Abandon();
}

void Pipeline::SetEngineDetail(std::string detail) {
  std::lock_guard<std::mutex> lock(mutex_);
  engine_detail_ = std::move(detail);
}

void Pipeline::BeginWindow() {
  std::lock_guard<std::mutex> lock(mutex_);
  window_start_ns_ = absl::GetCurrentTimeNanos();
  run_start_ns_ = window_start_ns_;
}

void Pipeline::Describe(ProfileData& data, int64_t start, int64_t end,
                            const ProfilerStats& window_stats,
                            const std::string& engine_detail,
                            const std::string& notes) const {
  if (const uint64_t omit = omitted_types_.load(std::memory_order_relaxed); omit != 0) {
    OmitTypes(data, omit);
  }
  data.period_type = period_type_;
  data.period = period_;
  // Viewers open on the period's type (cpu-time), not on the last one
  // (pprof's default: wall-time in DefaultProfiler's profiles).
  for (size_t i = 0; i < data.sample_types.size(); ++i) {
    if (data.sample_types[i].type == period_type_.type) {
      data.default_sample_type = static_cast<int64_t>(i);
    }
  }
  // Unless another is asked for (INPROF_DEFAULT_SAMPLE_TYPE; `inprof run
  // --alloc`: peak_inuse_space).
  for (size_t i = 0; i < data.sample_types.size(); ++i) {
    if (!options_.default_sample_type.empty() &&
        data.sample_types[i].type == options_.default_sample_type) {
      data.default_sample_type = static_cast<int64_t>(i);
    }
  }
  data.time_nanos = start;
  data.duration_nanos = end - start;
  data.comments.push_back(absl::StrCat("inprof 0.1.0 ", engine_));
  if (!engine_detail.empty()) data.comments.push_back(engine_detail);
  if (!notes.empty()) data.comments.push_back(notes);
  data.comments.push_back(absl::StrCat(
      "samples taken=", window_stats.samples_taken,
      " recorded=", window_stats.samples_recorded,
      " dropped=", window_stats.samples_dropped, " (ring full)"));
  if (describe_unwind_tables_) {
    data.comments.push_back(absl::StrCat(
        "stacks truncated=", window_stats.stacks_truncated,
        " walked by frame pointers through a module without its CFI table yet=",
        window_stats.stacks_before_tables,
        "; blocked episodes begun on such a walk=", window_stats.blocked_episodes_provisional,
        ", sampled again once the tables were ready=",
        window_stats.blocked_episodes_resampled));
  } else {
    data.comments.push_back(
        absl::StrCat("stacks truncated=", window_stats.stacks_truncated));
  }
  if (window_stats.wall_signals + window_stats.wall_running_credits +
          window_stats.wall_stacks_read > 0) {
    data.comments.push_back(absl::StrCat(
        window_stats.wall_wakeups > 0
            ? absl::StrCat("wall sampler wake-ups=", window_stats.wall_wakeups, "; ")
            : std::string(),
        "wall sampler signals=", window_stats.wall_signals,
        "; blocked threads' stacks read without a signal=",
        window_stats.wall_stacks_read,
        "; wall samples of threads that ran throughout, credited to or "
        "carried by their CPU samples without a signal=",
        window_stats.wall_running_credits));
    data.comments.push_back(absl::StrCat(
        "wall-time weights: a visit of the wall sampler weighs the time "
        "until the thread's next visit (its first a round of the threads at "
        "the sampler's pace, later ones the interval since the previous), so "
        "a thread that ends or a window that closes between two visits "
        "leaves nothing unattributed, and a thread's expected wall time on a "
        "stack is the time it spent there; a followed thread's running "
        "samples carry their CPU time as wall time, and its account stays "
        "exact. Longest wait between two visits of a thread=",
        absl::FormatDuration(absl::Nanoseconds(
            static_cast<int64_t>(window_stats.wall_longest_round_ns))),
        " (so far)"));
  }
  if (window_stats.wall_visits_deferred > 0) {
    data.comments.push_back(absl::StrCat(
        "wall sampler visits deferred to keep its CPU within "
        "INPROF_WALL_CPU_BUDGET=", window_stats.wall_visits_deferred,
        " (a round of the threads took longer than 2 s; each visit weighs "
        "the longer round)"));
  }
  if (window_stats.wall_tail_frame_ns > 0) {
    data.comments.push_back(absl::StrCat(
        "wall time of threads whose place the wall sampler could not read, on "
        "[inprof: wall time since the thread's last sample]=",
        absl::FormatDuration(absl::Nanoseconds(
            static_cast<int64_t>(window_stats.wall_tail_frame_ns))),
        " (the weight of wall samples whose signal a thread never took "
        "before it ended, and the tails of threads whose running samples "
        "carried their wall time but were never drained)"));
  }
  if (window_stats.threads_armed_by_sampler > 0) {
    data.comments.push_back(absl::StrCat(
        "threads armed by the sampler thread=", window_stats.threads_armed_by_sampler,
        " (they registered in a burst; their CPU counts from their "
        "registration, and what they used before their arming is on the "
        "stack of their first sample after it)"));
  }
  if (window_stats.threads_sigprof_unblocked > 0) {
    data.comments.push_back(absl::StrCat(
        "threads registered with SIGPROF blocked, unblocked so that they "
        "could be sampled=",
        window_stats.threads_sigprof_unblocked));
  }
  if (window_stats.samples_small_stack > 0) {
    data.comments.push_back(absl::StrCat(
        "samples taken on a small or foreign stack, not walked=",
        window_stats.samples_small_stack,
        " (a signal handler's sigaltstack, a coroutine's stack, or a stack "
        "near its end; their values are on [inprof: on a small or foreign "
        "stack])"));
  }
  if (window_stats.samples_unsuspended > 0) {
    data.comments.push_back(absl::StrCat(
        "samples of threads that could not be suspended=",
        window_stats.samples_unsuspended,
        " (their values are on [inprof: thread could not be suspended])"));
  }
}

absl::Status Pipeline::ExportWindow(const ProfilerStats* stats,
                                        bool last) {
  EnsureSinks();
  ProfileData data;
  ProfilerStats window_stats;
  std::string engine_detail;
  std::string notes;
  std::vector<std::string> event_lines;  // the attachments' (BeforeCutLocked)
  int64_t start = 0;
  int64_t end = 0;
  {
    // The cut: the drain step adds under this lock too.
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& a : attachments_) {
      if (std::string line = a->BeforeCutLocked(aggregator_, /*window_end=*/true);
          !line.empty()) {
        event_lines.push_back(std::move(line));
      }
    }
    data = aggregator_.Take();
    end = absl::GetCurrentTimeNanos();
    start = window_start_ns_;
    window_start_ns_ = end;
    const ProfilerStats now =
        stats_ ? stats_() : (stats != nullptr ? *stats : baseline_);
    window_stats = Delta(now, baseline_);
    baseline_ = now;
    engine_detail = engine_detail_;
    notes = NotesLocked();
  }
  if (sinks_.empty()) return absl::OkStatus();

  Describe(data, start, end, window_stats, engine_detail, notes);
  for (std::string& line : event_lines) data.comments.push_back(std::move(line));
  // Module files, debug files and the output file are opened and closed in
  // a descriptor table of inprof's (owned_fd.h): never a number of the
  // program's, whatever it closes or dup2()s meanwhile. One hop per window.
  // A given symbolizer (`inprof agent`'s, in a process of inprof's own)
  // holds files it opened in its caller's table: it stays there.
  if (symbolizer_given_) return DeliverWindow(data, start, end, last);
  absl::Status status;
  if (!RunWithOwnDescriptors([&] { status = DeliverWindow(data, start, end, last); })) {
    status = absl::ResourceExhaustedError(
        "the profile window could not be encoded or written (out of memory)");
  }
  return status;
}

absl::Status Pipeline::DeliverWindow(ProfileData& data, int64_t start, int64_t end,
                                     bool last) {
  if (symbolizer_ == nullptr) {
    symbolizer_ = std::make_unique<Symbolizer>(options_.symbolize);
    symbolizer_->set_system_debug_info(options_.system_debug_info);
  }
  symbolizer_->Refresh();
  absl::StatusOr<std::string> encoded = EncodePprof(data, *symbolizer_);
  // The last window's symbolizer goes with the session: the files libdwfl
  // holds are in the table of this session's file thread, which Stop()
  // ends (a later session opens them again in its own).
  if (last && !symbolizer_given_) symbolizer_.reset();
  if (encoded.ok()) encoded = GzipCompress(*encoded);
  if (!encoded.ok()) {
    if (last) return encoded.status();
    if (!encode_failing_) {
      Log(absl::StrCat("profile window not exported: ",
                       encoded.status().message()));
    }
    encode_failing_ = true;
    return encoded.status();
  }
  encode_failing_ = false;
  data = ProfileData();  // free the window before the sinks run

  auto profile = std::make_shared<ExportedProfile>();
  profile->pprof = std::move(*encoded);
  profile->start = absl::FromUnixNanos(start);
  profile->end = absl::FromUnixNanos(end);
  profile->sequence = sequence_++;
  profile->last = last;
  windows_exported_.fetch_add(1, std::memory_order_relaxed);

  absl::Status first_error;
  for (size_t i = 0; i < sinks_.size(); ++i) {
    absl::Status s = sinks_[i]->Consume(profile);
    if (s.ok()) {
      sink_failing_[i] = false;
      continue;
    }
    if (last) {
      first_error.Update(absl::Status(
          s.code(), absl::StrCat(sinks_[i]->name(), ": ", s.message())));
    } else if (!sink_failing_[i]) {
      Log(absl::StrCat(sinks_[i]->name(), ": ", s.message(),
                       " (further failures are not logged until one "
                       "succeeds)"));
    }
    sink_failing_[i] = true;
  }
  return first_error;
}

std::string Pipeline::Locked::FlushEventsAtAttachments() {
  std::string lines;
  for (const auto& a : p_.attachments_) {
    if (std::string line = a->BeforeCutLocked(p_.aggregator_, /*window_end=*/false);
        !line.empty()) {
      absl::StrAppend(&lines, lines.empty() ? "" : "; ", line);
    }
  }
  return lines;
}

void Pipeline::Locked::LiveStateAtAttachments(bool all) {
  // A live capture's window (the mirror) sums samples; state rows are not.
  p_.aggregator_.PauseMirror(true);
  for (const auto& a : p_.attachments_) a->LiveStateLocked(p_.aggregator_, all);
  p_.aggregator_.PauseMirror(false);
}

absl::Status Pipeline::Export(const ProfilerStats& stats) {
  for (const auto& a : attachments_) {
    if (std::optional<absl::Status> taken = a->ExportLast(*this, stats)) {
      return *taken;
    }
  }
  const absl::Time deadline = absl::Now() + options_.stop_timeout;
  std::lock_guard<std::mutex> lock(export_mutex_);
  absl::Status status = ExportWindow(&stats, /*last=*/true);
  // Each uploader has been delivering on its own thread since Consume(), so
  // waiting for them one after the other shares one deadline fairly.
  std::string late;
  for (const auto& sink : sinks_) {
    absl::Status flushed = sink->Flush(deadline);
    if (!flushed.ok()) absl::StrAppend(&late, late.empty() ? "" : "; ", flushed.message());
  }
  if (!late.empty()) {
    status.Update(absl::DeadlineExceededError(
        absl::StrCat(late, " (INPROF_STOP_TIMEOUT=",
                     absl::FormatDuration(options_.stop_timeout), ")")));
  }
  return status;
}

}  // namespace inprof::internal
