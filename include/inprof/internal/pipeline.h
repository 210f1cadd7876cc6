// internal: not part of the public API.
//
// The profile pipeline: samples in, profiles out. The profiler's drain step
// adds samples to the aggregate through Ingest(), under the pipeline's own
// lock; the collector thread drains every collect_period; the exporter
// thread cuts the aggregate into consecutive windows every export_period,
// symbolizes and encodes each, and hands it to the sinks. The live
// endpoint's captures are windows of their own (Capture()).
//
// The pipeline knows nothing above it. Its sinks come from a factory
// (SetSinkFactory; without one: the output file and Options::sinks), and
// what else joins it attaches through the hooks it declares
// (PipelineAttachment): library mode's forwarding to an agent
// (internal/agent_forwarding.h) and the live endpoint
// (internal/endpoint_attachment.h). One place composes them from Options:
// internal/composition.h.
//
// Windows: a window is cut by taking the aggregate under the pipeline's
// lock, the same lock Ingest() holds while it adds samples, and the cut's
// time is both this window's end and the next one's start. So every sample
// lands in exactly one window, and consecutive windows tile time.
//
// Threads: "inprof-collect" (drain every collect_period), "inprof-export"
// (every export_period: drain, cut, symbolize, encode, hand to sinks;
// only when export_period > 0 and no attachment takes the samples) and one
// "inprof-upload" per HTTP sink. None of them is ever waited for by a
// sampled thread.
//
// Captures: a mirror of the aggregate from the request on
// (SampleAggregator::SetMirror, under the lock), drained and cut after the
// requested seconds, symbolized by a symbolizer of the request's (freed
// after it), so the exporter's windows and its symbolizer are not touched.
#ifndef INPROF_INTERNAL_PIPELINE_H_
#define INPROF_INTERNAL_PIPELINE_H_

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "inprof/base/fork_guard.h"
#include "inprof/internal/sample_record.h"
#include "inprof/options.h"
#include "inprof/profile_data.h"
#include "inprof/sample_aggregator.h"
#include "inprof/sink.h"

namespace inprof {
class Symbolizer;

// The counters a profiler reports (and writes into the profile's
// comments), each once: X(name, per_window, what it counts). per_window:
// each window's comments count its own (the difference since the previous
// cut), else the total since the profiler was made. The order is also the
// order library mode forwards them in (agent_stream.h: AgentStats): add at
// the end.
#define INPROF_PROFILER_STATS(X)                                              \
  X(samples_taken, true, "signals that produced a sample")                    \
  X(samples_recorded, true, "samples that reached the aggregate")             \
  X(samples_dropped, true, "samples lost because a ring was full")            \
  X(stacks_truncated, true, "walks stopped at a bad frame or the limit")      \
  /* Walks before the unwinder's tables were ready (built on the collector    \
     thread after Start): frame pointers only, so maybe incomplete. */        \
  X(stacks_before_tables, true, "walks before the unwind tables were ready")  \
  /* Blocking episodes whose first wall sample was such a walk, sampled       \
     again once the tables were ready (one more signal to that thread). */    \
  X(blocked_episodes_resampled, true, "blocked episodes sampled again")       \
  /* Signals the wall sampler sent (running threads; blocked ones at an      \
     episode's start), and its samples of threads that ran throughout that   \
     CPU samples carried instead (followed: wall_time_provider.h). */        \
  X(wall_signals, true, "signals the wall sampler sent")                      \
  X(wall_running_credits, true, "wall samples credited to a CPU sample")      \
  X(threads_registered, false, "registrations since construction")            \
  X(profiles_written, false, "profiles written")                              \
  /* Windows: samples not taken, the thread not suspended or its registers   \
     not read (it had exited): their values are on a frame of their own. */   \
  X(samples_unsuspended, true, "threads that could not be suspended")         \
  /* Wake-ups of the wall sampler (fewer while every thread is steady), and   \
     its visits to threads. */                                                \
  X(wall_wakeups, true, "wake-ups of the wall sampler")                       \
  X(wall_visits, true, "wall sampler visits to threads")                      \
  /* Threads that registered with SIGPROF blocked in their signal mask        \
     (often inherited from the thread that created them): no sample can be    \
     taken of such a thread, so RegisterThread unblocked it. */               \
  X(threads_sigprof_unblocked, true, "threads registered with SIGPROF blocked") \
  /* Blocked threads whose episode's stack the wall sampler read from a copy  \
     of their stack instead of signalling them (profiler_collector.h:         \
     ReadBlockedStack). */                                                    \
  X(wall_stacks_read, true, "blocked stacks read without a signal")          \
  /* Samples of a thread that was on a stack too small for the handler's      \
     walk (a signal handler's sigaltstack, a coroutine's stack, its own stack \
     near its end): no stack walked, the values kept on "[inprof: on a small  \
     or foreign stack]". */                                                   \
  X(samples_small_stack, true, "samples on a small or foreign stack")        \
  /* Visits the wall sampler deferred to stay within its CPU budget         \
     (Options::wall_cpu_budget): each thread's rounds grew longer. */       \
  X(wall_visits_deferred, true, "wall visits deferred by the CPU budget")  \
  /* Wall time (ns) no visit could take: threads that registered and ended \
     between two wake-ups with no thread left (WallTicker::VisitNext) to    \
     carry it. Not on any stack. */                                         \
  X(wall_unattributed_ns, true, "wall time no visit could take, ns")     \
  /* Wall time (ns) put on "[inprof: wall time since the thread's last       \
     sample]": threads that had no wall sample when their tail was taken     \
     (a sample's signal the thread never took before it ended; a followed    \
     thread's tail with no running sample drained). */                      \
  X(wall_tail_frame_ns, true, "wall time on the tail frame, ns")          \
  /* Threads that registered in a burst and whose CPU engine the wall      \
     sampler's thread armed (sample_provider.h: ArmsInTwoSteps). */         \
  X(threads_armed_by_sampler, true, "threads armed by the sampler thread")   \
  /* Blocking episodes whose first stack was walked before the unwinder's    \
     tables were ready (the walks of stacks_before_tables that began an      \
     episode; others were CPU samples, or reads that were then signalled     \
     for instead): each is sampled again once the tables are ready           \
     (blocked_episodes_resampled). */                                        \
  X(blocked_episodes_provisional, true, "blocked episodes begun before the tables") \
  /* The longest a thread waited between two visits of the wall sampler    \
     (a round of the threads: WallTicker::RoundEstimate at each wake-up,    \
     and at Stop() the time since the last wake-up): what one wall sample   \
     weighs at most. Since the profiler was made. */                        \
  X(wall_longest_round_ns, false, "longest round of the threads at the wall sampler's pace, ns") \
  /* Thread registrations that failed, and unregistrations that could not   \
     drain the thread's last samples, because the heap was exhausted       \
     (std::bad_alloc): the threads are not profiled, or their last samples \
     are lost. */                                                           \
  X(registrations_without_memory, true, "registrations that failed for want of memory") \
  X(wall_weight_sq_ms2, true, "squared weights of estimated wall samples, ms^2")

struct ProfilerStats {
#define INPROF_STATS_FIELD(name, per_window, what) uint64_t name = 0;
  INPROF_PROFILER_STATS(INPROF_STATS_FIELD)
#undef INPROF_STATS_FIELD
};

namespace internal {

// ProfilerStats as the words library mode forwards (agent_stream.h:
// AgentStats), in field order, and back (missing words are zero).
std::vector<uint64_t> StatsToCounters(const ProfilerStats& stats);
ProfilerStats StatsFromCounters(std::span<const uint64_t> counters);

class Pipeline;

// What attaches to a pipeline, each hook called on the thread named and
// never with the pipeline's lock held unless its name ends in Locked. The
// defaults do nothing.
class PipelineAttachment {
 public:
  virtual ~PipelineAttachment() = default;
  // StartCollector, before its threads start: whether the samples go
  // elsewhere for now (the aggregate forwards them): then no exporter runs
  // and no sink is made until the attachment calls ExportHere().
  virtual bool TakesSamples() { return false; }
  // StartCollector, once its threads run.
  virtual void Started(Pipeline& /*pipeline*/) {}
  // The collector thread, after each drain.
  virtual void AfterDrain(Pipeline& /*pipeline*/) {}
  // StopCollector, once its threads were told to stop and before they are
  // joined: stop whatever calls into the pipeline (a server's captures).
  virtual void Stopping() {}
  // Export() (the last window, at Stop): the status of handing it on
  // elsewhere, or nullopt to let the pipeline export it to its sinks.
  virtual std::optional<absl::Status> ExportLast(Pipeline& /*pipeline*/,
                                                 const ProfilerStats& /*stats*/) {
    return std::nullopt;
  }
  // A forked child: the attachment's threads do not exist there.
  virtual void Abandon() {}
  // The thread that cuts a window (the exporter's, Stop()'s, a live
  // capture's), with the pipeline's lock held, just before the cut: what
  // the attachment adds to `aggregator` now is in the window. window_end:
  // a window of the periodic export (or the last one) ends here; false for
  // a live capture's window. Returns a comment line for the window, or "".
  // Must not call into the pipeline.
  virtual std::string BeforeCutLocked(SampleAggregator& /*aggregator*/, bool /*window_end*/) {
    return "";
  }
  // Snapshot(), with the pipeline's lock held: what the attachment adds to
  // `aggregator` (a fresh one) is the snapshot's, of the provider whose
  // types include `type` (the type asked to open on: inuse_space,
  // alloc_space, delay). Returns the sample types it filled (bit i: the
  // i-th; 0: none, it has no such snapshot) and their period. Must not
  // call into the pipeline.
  struct SnapshotShape {
    uint64_t types = 0;
    int64_t period = 0;
    size_t period_type = 0;  // index of the period's sample type
  };
  virtual SnapshotShape SnapshotLocked(SampleAggregator& /*aggregator*/,
                                       absl::string_view /*type*/) {
    return {};
  }
  // Library mode, where the agent cuts the windows (Locked::
  // LiveStateAtAttachments), with the pipeline's lock held: what the
  // attachment reports as of a window's end (the live heap), alone, as rows
  // of `aggregator` (which forwards them as state rows: agent_stream.h):
  // those that changed since its previous call, or every row it has when
  // `all`. Must not call into the pipeline.
  virtual void LiveStateLocked(SampleAggregator& /*aggregator*/, bool /*all*/) {}
  // The profiler's Start(), before StartCollector: connect to what the
  // attachment reaches outside the process. `rings`: the shape of the
  // threads' rings when they can live in memory it shares (null: they
  // cannot). An error stops Start().
  virtual absl::Status Connect(Pipeline& /*pipeline*/, const ThreadRingLayout* /*rings*/) {
    return absl::OkStatus();
  }
  // Memory for a registered thread's ring (null: none), and back (false:
  // it was not this attachment's). The profiler's registry lock held.
  virtual void* AcquireThreadRing(Pipeline& /*pipeline*/, pid_t /*tid*/,
                                  absl::string_view /*name*/) {
    return nullptr;
  }
  virtual bool ReleaseThreadRing(Pipeline& /*pipeline*/, void* /*ring*/) { return false; }
  // The address it serves on ("127.0.0.1:6060"), or empty.
  virtual std::string ServedAddress() const { return {}; }
};

class Pipeline {
 public:
  using StatsFunction = std::function<ProfilerStats()>;
  using SinkFactory = std::function<std::vector<std::shared_ptr<ProfileSink>>()>;

  Pipeline(const Options& options, std::vector<ValueType> sample_types,
           ValueType period_type, int64_t period, std::string engine);
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  const Options& options() const { return options_; }
  const std::vector<ValueType>& sample_types() const {
    return aggregator_.sample_types();
  }
  const ValueType& period_type() const { return period_type_; }
  int64_t period() const { return period_; }
  const std::string& engine() const { return engine_; }

  // What the pipeline's sinks are, made when the first window is exported
  // (or at StartCollector). Before StartCollector.
  void SetSinkFactory(SinkFactory factory);
  // Attaches `attachment` for the pipeline's lifetime; the pointer stays
  // valid until the pipeline goes. Before StartCollector.
  PipelineAttachment* Attach(std::unique_ptr<PipelineAttachment> attachment);
  // Each attachment's Connect, in order; the first error. Memory for a
  // thread's ring from the first attachment that has some, and back. The
  // first address an attachment serves on ("": none). Not from the
  // collector's threads.
  absl::Status ConnectAttachments(const ThreadRingLayout* rings);
  void* AcquireThreadRing(pid_t tid, absl::string_view name);
  void ReleaseThreadRing(void* ring);
  std::string ServedAddress() const;

  // The pipeline's lock as a fork-guard lock (base/fork_guard.h), ranked
  // `rank`; Unregister before the pipeline goes.
  void RegisterForkLock(ForkLockRank rank);
  void UnregisterForkLock();

  // The ingest API: the aggregate, with the pipeline's lock held for as
  // long as the returned object lives. Nothing else of the pipeline may be
  // called meanwhile.
  //   Pipeline::Ingesting in = pipeline.Ingest();
  //   in.aggregator().Add(...);
  class [[nodiscard]] Ingesting {
   public:
    SampleAggregator& aggregator() { return *aggregator_; }

   private:
    friend class Pipeline;
    Ingesting(std::mutex& mutex, SampleAggregator& aggregator)
        : lock_(mutex), aggregator_(&aggregator) {}
    std::unique_lock<std::mutex> lock_;
    SampleAggregator* aggregator_;
  };
  Ingesting Ingest() { return Ingesting(mutex_, aggregator_); }

  // What an attachment reaches under the pipeline's lock (WithLock).
  class Locked {
   public:
    SampleAggregator& aggregator() { return p_.aggregator_; }
    // The counters now: the stats function's, else `fallback` when given,
    // else those at the previous cut.
    ProfilerStats stats(const ProfilerStats* fallback = nullptr) const;
    const std::string& engine_detail() const { return p_.engine_detail_; }
    // The process's own windows start now (`now_ns`), counting from now.
    void RestartWindow(int64_t now_ns);
    // A line every window's comments carry from the next cut on, after the
    // process note (SetProcessNote); empty: none.
    void SetAttachmentNote(std::string note) { p_.attachment_note_ = std::move(note); }
    const std::string& attachment_note() const { return p_.attachment_note_; }
    // Library mode (the aggregate forwards; the agent cuts the windows),
    // after each drain and at the end: what the attachments recorded since
    // their previous flush (BeforeCutLocked without a window's end: the
    // sampled allocations) goes into the aggregate, and on with it. Returns
    // their comment lines, "; "-joined.
    std::string FlushEventsAtAttachments();
    // Library mode: the attachments' state as of now (LiveStateLocked: the
    // live heap), into the aggregate and on.
    void LiveStateAtAttachments(bool all);

   private:
    friend class Pipeline;
    explicit Locked(Pipeline& p) : p_(p) {}
    Pipeline& p_;
  };
  template <typename F>
  decltype(auto) WithLock(F&& f) {
    std::lock_guard<std::mutex> lock(mutex_);
    Locked locked(*this);
    return f(locked);
  }

  // Runs `drain` every collect_period on the collector thread
  // ("inprof-collect") until StopCollector; with options().export_period >
  // 0 also starts the exporter thread ("inprof-export"), which calls `drain`
  // and then exports a window every export_period, unless an attachment
  // takes the samples. `stats`, when given, is called with the lock held at
  // each cut, so that each window's comments count exactly the samples it
  // holds; it must not take locks. `edge`, when given, is called before a
  // window's last drain (the exporter's; a capture's, at its start and its
  // end): the profiler's samplers take the samples that stand for the time
  // up to the edge (the wall sampler's visits).
  void StartCollector(std::function<void()> drain,
                      StatsFunction stats = nullptr,
                      std::function<void()> edge = nullptr);
  // Wakes and joins the collector and the exporter (an export in progress
  // finishes first). Safe to call when not started.
  void StopCollector();
  // In a forked child the threads do not exist: forget them (their state is
  // leaked, never destroyed), the attachments' and the sinks' threads too.
  void AbandonCollector();

  // The collector thread, from an attachment's AfterDrain: the samples stay
  // in the process from now on: the sinks are made and the exporter starts.
  void ExportHere();

  // For `inprof agent`, which runs a pipeline per profiled process: the
  // symbolizer its windows use (Symbolizer::ForProcess) instead of one of
  // this process, and a line every window's comments carry (who the
  // process is). Before StartCollector.
  void UseSymbolizer(std::unique_ptr<Symbolizer> symbolizer);
  void SetProcessNote(std::string note);

  // Whether the comments speak of the unwinder's CFI tables (Linux's
  // unwinders build them; the Windows OS unwinder has none). Before
  // StartCollector.
  void set_describe_unwind_tables(bool on) { describe_unwind_tables_ = on; }

  // Starts a profile window now.
  void BeginWindow();

  // Cuts the last window (everything aggregated since the previous cut),
  // hands it to every sink, then lets the sinks deliver until
  // options().stop_timeout has passed since the call. `stats` goes into the
  // comments unless StartCollector got a stats function. An attachment may
  // take the window instead (ExportLast). Returns the first sink error, or
  // DeadlineExceeded when a sink could not deliver in time.
  absl::Status Export(const ProfilerStats& stats);

  // How the samples are taken (the CPU engine and its thread counts), one
  // comment line in each window from the next cut on. Any thread.
  void SetEngineDetail(std::string detail);

  // The sample types (bit i: sample_types()[i]) left out of the windows
  // from the next cut on: those of a provider that is off, such as
  // DefaultProfiler's allocation provider without INPROF_ALLOC_PERIOD, so
  // that a CPU profile carries no empty heap columns. Any thread.
  // `inprof agent`'s, before StartCollector: label ids are looked up in
  // `table` (the served process's own; it must outlive the pipeline), and
  // each window -- a live capture and a snapshot too -- holds at most
  // `max_stacks` stacks of `max_frame_words` frames (SampleAggregator::
  // SetStackLimits).
  void SetLabelTable(const LabelTable* table);
  void SetStackLimits(size_t max_stacks, size_t max_frame_words, std::string overflow_frame);
  void SetOmittedTypes(uint64_t mask) {
    omitted_types_.store(mask, std::memory_order_relaxed);
  }
  uint64_t omitted_types() const { return omitted_types_.load(std::memory_order_relaxed); }

  // Windows handed to the sinks since construction.
  uint64_t windows_exported() const {
    return windows_exported_.load(std::memory_order_relaxed);
  }

  // A window of its own covering the next `duration` (the live endpoint's
  // capture): gzip pprof bytes. Unavailable when the pipeline is not
  // running or stops meanwhile. Blocks the calling thread for `duration`;
  // one at a time (the endpoint sees to it).
  absl::StatusOr<std::string> Capture(absl::Duration duration);

  // The gzip pprof of the attachments' snapshots now (SnapshotLocked: the
  // allocation provider's alloc_* since Start and inuse_* now, or the
  // lock-wait provider's contentions and delay since Start, whichever has
  // `default_type`), only their sample types, viewers opening on `default_type`. NotFound
  // when no attachment has one (that profiling off). Drains the threads'
  // slots first, as a capture's end does. Any thread, between
  // StartCollector and StopCollector or outside them, not concurrently with
  // either. A `delta` > 0 (Go's ?seconds=N): the difference of two
  // snapshots that far apart (alloc_* made, inuse_* changed in between),
  // Unavailable when the profiler stops meanwhile; it waits as a capture
  // does (StopCollector lets it go).
  absl::StatusOr<std::string> Snapshot(absl::string_view default_type,
                                       absl::Duration delta = absl::ZeroDuration());
  // The thread dump (ProfilerBase::DumpThreads, set before StartCollector) symbolized: `debug`
  // 0, gzip pprof of one type, `type` ("threads", "goroutine"); 1, 2: text (thread_dump_text.h).
  using ThreadDumper = std::function<absl::StatusOr<ProfileData>()>;
  void SetThreadDumper(ThreadDumper dumper) { thread_dumper_ = std::move(dumper); }
  const ThreadDumper& thread_dumper() const { return thread_dumper_; }  // unsymbolized
  absl::StatusOr<std::string> ThreadDump(absl::string_view type, int debug);

 private:
  struct Threads;
  void EnsureSinks();
  // One snapshot of the attachments' state (Snapshot), with the sample
  // types it has; NotFound when none has any.
  absl::Status SnapshotData(absl::string_view type, ProfileData* out, uint64_t* types);
  // Fills a cut window's metadata and comments.
  void Describe(ProfileData& data, int64_t start, int64_t end,
                const ProfilerStats& window_stats,
                const std::string& engine_detail, const std::string& notes) const;
  // Cuts, encodes and hands one window to the sinks. `last`: errors are
  // returned rather than logged. export_mutex_ held.
  absl::Status ExportWindow(const ProfilerStats* stats, bool last);
  // What ExportWindow does after the cut: symbolize, encode, hand to the
  // sinks (in inprof's own descriptor table: module files, the output
  // file). export_mutex_ held.
  absl::Status DeliverWindow(ProfileData& data, int64_t start, int64_t end,
                             bool last);
  // Drains the rings now: inline on a thread of the program's descriptor
  // table; from a thread of a table of inprof's (the endpoint's), by the
  // collector thread (a retiring thread's perf event is closed in the
  // program's table), the caller waiting for that pass.
  static void DrainNow(Threads* threads);
  void ExporterLoop(Threads* threads, const std::function<void()>& drain);
  void StartExporter(Threads* threads, const std::function<void()>& drain);
  std::string NotesLocked() const;  // mutex_ held
  // A live request's profile (Capture, Snapshot), symbolized, gzipped (`text`: a dump's).
  absl::StatusOr<std::string> EncodeForRequest(const ProfileData& data, int debug = 0);
  ThreadDumper thread_dumper_;

  Options options_;
  ValueType period_type_;
  int64_t period_;
  std::string engine_;
  std::string engine_detail_;  // mutex_
  std::atomic<uint64_t> omitted_types_{0};
  bool describe_unwind_tables_ = true;
  // Set before the collector starts (SetLabelTable, SetStackLimits): the
  // windows' aggregates are made like aggregator_.
  void ShapeLikeOurs(SampleAggregator& aggregator) const;
  const LabelTable* label_table_ = nullptr;
  size_t max_stacks_ = SIZE_MAX;
  size_t max_frame_words_ = SIZE_MAX;
  std::string overflow_frame_;

  // Guards aggregator_, window_start_ns_, baseline_ and the notes.
  mutable std::mutex mutex_;
  SampleAggregator aggregator_;
  int64_t window_start_ns_ = 0;
  int64_t run_start_ns_ = 0;  // the latest BeginWindow (Start)
  StatsFunction stats_;     // set before the threads start
  ProfilerStats baseline_;  // counters at the previous cut
  std::string process_note_;     // mutex_
  std::string attachment_note_;  // mutex_

  std::vector<std::unique_ptr<PipelineAttachment>> attachments_;

  // Serializes exports; guards symbolizer_, sinks_ and their failure state.
  std::mutex export_mutex_;
  SinkFactory sink_factory_;
  std::unique_ptr<Symbolizer> symbolizer_;  // kept: caches across exports
  bool symbolizer_given_ = false;  // UseSymbolizer(): captures use it too
  uint32_t symbolizer_table_ = 0;  // the descriptor table its files are in
  bool sinks_built_ = false;
  std::vector<std::shared_ptr<ProfileSink>> sinks_;
  std::vector<bool> sink_failing_;  // one log line per failure streak
  bool encode_failing_ = false;
  uint64_t sequence_ = 0;
  std::atomic<uint64_t> windows_exported_{0};

  // Collector and exporter threads; on the heap so that a forked child can
  // leak them (a condition variable that a vanished thread waited on cannot
  // be destroyed).
  std::unique_ptr<Threads> threads_;
};

}  // namespace internal
}  // namespace inprof

#endif  // INPROF_INTERNAL_PIPELINE_H_
