#include "inprof/internal/pipeline.h"

#include <algorithm>
#include <chrono>
#include <cmath>
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
#include "src/pipeline/pipeline_parts.h"

namespace inprof::internal {

ProfilerStats Delta(const ProfilerStats& now, const ProfilerStats& before) {
  ProfilerStats d = now;
#define INPROF_STATS_DELTA(name, per_window, what) \
  if (per_window) d.name -= before.name;
  INPROF_PROFILER_STATS(INPROF_STATS_DELTA)
#undef INPROF_STATS_DELTA
  return d;
}

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

absl::Status Pipeline::ConnectAttachments(const ThreadRingLayout* rings) {
  for (const auto& a : attachments_) {
    if (absl::Status s = a->Connect(*this, rings); !s.ok()) return s;
  }
  return absl::OkStatus();
}

void* Pipeline::AcquireThreadRing(pid_t tid, absl::string_view name) {
  for (const auto& a : attachments_) {
    if (void* ring = a->AcquireThreadRing(*this, tid, name)) return ring;
  }
  return nullptr;
}

void Pipeline::ReleaseThreadRing(void* ring) {
  for (const auto& a : attachments_) {
    if (a->ReleaseThreadRing(*this, ring)) return;
  }
}

std::string Pipeline::ServedAddress() const {
  for (const auto& a : attachments_) {
    if (std::string address = a->ServedAddress(); !address.empty()) return address;
  }
  return {};
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
                              StatsFunction stats, std::function<void()> edge) {
  StopCollector();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_ = std::move(stats);
  }
  // While an attachment takes the samples (library mode: another process
  // has the sinks), the sinks are made only if the process goes on to export
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
  t->edge = std::move(edge);
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
  // Its files are numbers in the table of the thread that hands it over
  // (owned_fd.h): used from another table, they would read and close
  // whatever that table has there.
  symbolizer_table_ = CurrentDescriptorTable();
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
      if (t->edge) t->edge();
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
  // A capture in progress has been woken (it answers 503); a server
  // attached waits for its connections' threads.
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
        "wall-time weights: each wake-up of the wall sampler hands the "
        "time since the last one of the threads still registered out to "
        "the threads it visits, in equal shares when it visits only some of "
        "them (a thread visited with chance k/n weighs n/k intervals); a "
        "thread that ends credits its time since the last wake-up, over its "
        "chance of a visit since it began, to where its last visit saw it; "
        "so each window holds its threads' lifetimes in it (a wake-up is "
        "made at each window's edge) and a thread's expected wall time on a "
        "stack is the time it spent there; "
        "when it visits every thread, a visit weighs the time since the "
        "thread's previous one; a followed thread's running samples carry "
        "their CPU time as wall time, and its account stays exact. Longest "
        "round of the threads at the sampler's pace=",
        absl::FormatDuration(absl::Nanoseconds(
            static_cast<int64_t>(window_stats.wall_longest_round_ns))),
        " (so far; the threads over the visits a wake-up, times the "
        "wake-ups' spacing: a thread's mean wait between two visits, which "
        "can be longer than the run when the budget defers visits)"));
  }
  if (window_stats.wall_weight_sq_ms2 > 0) {
    // Var(a stack's estimate) = sum(w^2) p (1 - p) for visits that find it
    // there with chance p: at most sum(w^2) / 4.
    const double sd_ms = 0.5 * std::sqrt(static_cast<double>(window_stats.wall_weight_sq_ms2));
    data.comments.push_back(absl::StrCat(
        "wall-time sampling error: a stack's wall time is within one standard "
        "deviation of about sqrt(p (1 - p) S) of the time the threads spent "
        "there, p being its share of the estimated wall time, so at most ",
        absl::FormatDuration(absl::Milliseconds(std::llround(sd_ms))),
        " for any stack (S=", window_stats.wall_weight_sq_ms2,
        " ms^2: the squared weights of the wall samples that took a share of "
        "the threads' time or an ended thread's tail over its chance of a "
        "visit)"));
  }
  if (window_stats.wall_visits_deferred > 0) {
    data.comments.push_back(absl::StrCat(
        "wall sampler visits deferred to keep its CPU within "
        "INPROF_WALL_CPU_BUDGET: ", window_stats.wall_visits_deferred,
        " (fewer a wake-up than INPROF_WALL_THREADS_PER_TICK asks, or than a "
        "round of the threads in 2 s needs; each visit weighs the longer "
        "round)"));
  }
  if (window_stats.wall_unattributed_ns > 0) {
    data.comments.push_back(absl::StrCat(
        "wall time of threads that all ended before the wall sampler could "
        "visit one of them (a burst of exits kept it off the CPU), on no "
        "stack=",
        absl::FormatDuration(absl::Nanoseconds(
            static_cast<int64_t>(window_stats.wall_unattributed_ns)))));
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
  if (window_stats.registrations_without_memory > 0) {
    data.comments.push_back(absl::StrCat(
        "thread registrations and unregistrations that failed for want of "
        "memory=",
        window_stats.registrations_without_memory,
        " (the heap was exhausted: those threads were not profiled, or their "
        "last samples were lost)"));
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
  // A given symbolizer (another process's, in a process of inprof's own)
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
  // Each HTTP sink has been delivering on its own thread since Consume(), so
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
