// internal: not part of the public API.
//
// The type-independent half of Profiler: the aggregate, the collector thread
// that drains rings into it, the exporter thread that cuts the aggregate
// into consecutive profile windows, and the sinks the windows go to (file,
// Datadog, Pyroscope, Options::sinks). The Profiler template supplies the
// drain step (it knows its ring and provider types).
//
// Windows: a window is cut by taking the aggregate under mutex(), the same
// lock the drain step holds while it adds samples, and the cut's time is both
// this window's end and the next one's start. So every sample lands in
// exactly one window, and consecutive windows tile time.
//
// Threads: "inprof-collect" (drain every collect_period), "inprof-export"
// (every export_period: drain, cut, symbolize, encode, hand to sinks;
// only when export_period > 0) and one "inprof-upload" per HTTP sink. None
// of them is ever waited for by a sampled thread.
//
// The live endpoint (options().http_addr, internal/debug_endpoint.h) runs
// from StartCollector to StopCollector. Its captures are windows of their
// own: a mirror of the aggregate from the request on (SampleAggregator::
// SetMirror, under mutex()), drained and cut after the requested seconds,
// symbolized by a symbolizer of the request's (freed after it), so the
// exporter's windows and its symbolizer are not touched.
#ifndef INPROF_INTERNAL_PROFILER_CORE_H_
#define INPROF_INTERNAL_PROFILER_CORE_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "inprof/options.h"
#include "inprof/profile_data.h"
#include "inprof/sample_aggregator.h"
#include "inprof/sink.h"

namespace inprof {
class Symbolizer;
namespace internal {
class AgentLink;
struct AgentThreadRingLayout;
class DebugEndpoint;
class DebugServer;
}  // namespace internal

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
  /* Signals the wall sampler sent (running threads, and blocked ones at the  \
     start of an episode), and its samples of threads that ran throughout     \
     credited to a CPU sample's stack or carried by their CPU samples         \
     (followed threads, wall_time_provider.h) instead of a signal. */         \
  X(wall_signals, true, "signals the wall sampler sent")                      \
  X(wall_running_credits, true, "wall samples credited to a CPU sample")      \
  X(threads_registered, false, "registrations since construction")            \
  X(profiles_written, false, "profiles written")                              \
  /* Windows: samples not taken because the thread could not be suspended    \
     or its registers read (it had exited); their values are kept on a frame  \
     of their own. */                                                         \
  X(samples_unsuspended, true, "threads that could not be suspended")         \
  /* Wake-ups of the wall sampler (fewer while every thread is steady). */    \
  X(wall_wakeups, true, "wake-ups of the wall sampler")                       \
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
  X(samples_small_stack, true, "samples on a small or foreign stack")

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

class ProfilerCore {
 public:
  using StatsFunction = std::function<ProfilerStats()>;

  ProfilerCore(const Options& options, std::vector<ValueType> sample_types,
               ValueType period_type, int64_t period, std::string engine);
  ~ProfilerCore();
  ProfilerCore(const ProfilerCore&) = delete;
  ProfilerCore& operator=(const ProfilerCore&) = delete;

  const Options& options() const { return options_; }

  // Runs `drain` every collect_period on the collector thread
  // ("inprof-collect") until StopCollector; with options().export_period >
  // 0 also starts the exporter thread ("inprof-export"), which calls `drain`
  // and then exports a window every export_period. `stats`, when given, is
  // called with mutex() held at each cut, so that each window's comments
  // count exactly the samples it holds; it must not take locks.
  void StartCollector(std::function<void()> drain,
                      StatsFunction stats = nullptr);
  // Wakes and joins the collector and the exporter (an export in progress
  // finishes first). Safe to call when not started.
  void StopCollector();
  // In a forked child the threads do not exist: forget them (their state is
  // leaked, never destroyed) and the sinks' threads too.
  void AbandonCollector();

  // Library mode (options().agent_socket set): connects to the agent, and
  // from then on the aggregate forwards to it (internal/agent_link.h); the
  // exporter, the sinks and the symbolizer are then never made here. When
  // the agent cannot be reached: an error with INPROF_AGENT_FALLBACK=off,
  // else one line logged and profiling stays in the process. Call before
  // StartCollector; OK and nothing done without a socket.
  // `thread_rings`: the profiler's rings can live in the agent's shared
  // region (AcquireAgentThreadRing); null when they cannot.
  absl::Status ConnectAgent(const AgentThreadRingLayout* thread_rings = nullptr);
  // Library mode: shared memory for a thread's ring (AgentLink's
  // AcquireThreadRing), or null (no agent, or none to spare). The owner's
  // registry lock serializes these and ConnectAgent().
  void* AcquireAgentThreadRing(pid_t tid, absl::string_view name);
  void ReleaseAgentThreadRing(void* ring);

  // For `inprof agent`, which runs a core per profiled process: the
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

  // The aggregate, for the drain step; `mutex()` must be held.
  SampleAggregator& aggregator() { return aggregator_; }
  std::mutex& mutex() { return mutex_; }

  // Cuts the last window (everything aggregated since the previous cut),
  // hands it to every sink, then lets the sinks deliver until
  // options().stop_timeout has passed since the call. `stats` goes into the
  // comments unless StartCollector got a stats function. Returns the first
  // sink error, or DeadlineExceeded when a sink could not deliver in time.
  absl::Status Export(const ProfilerStats& stats);

  // How the samples are taken (the CPU engine and its thread counts), one
  // comment line in each window from the next cut on. Any thread.
  void SetEngineDetail(std::string detail);

  // Windows handed to the sinks since construction.
  uint64_t windows_exported() const {
    return windows_exported_.load(std::memory_order_relaxed);
  }

  // The live endpoint's address ("127.0.0.1:6060"), empty when it is off
  // or could not listen.
  std::string http_address() const;

  // A window of its own covering the next `duration` (the live endpoint's
  // capture): gzip pprof bytes. Unavailable when the profiler is not
  // running or stops meanwhile. Blocks the calling thread for `duration`;
  // one at a time (the endpoint sees to it).
  absl::StatusOr<std::string> Capture(absl::Duration duration);
  // The live endpoint's flame graph page of a capture (DebugEndpoint::Render).
  static absl::StatusOr<std::string> RenderFlamegraph(const std::string& pprof,
                                                      absl::string_view title);

 private:
  struct Threads;
  void EnsureSinks();
  void StartEndpoint();
  // Fills a cut window's metadata and comments.
  void Describe(ProfileData& data, int64_t start, int64_t end,
                const ProfilerStats& window_stats,
                const std::string& engine_detail, const std::string& notes) const;
  // Cuts, encodes and hands one window to the sinks. `last`: errors are
  // returned rather than logged. export_mutex_ held.
  absl::Status ExportWindow(const ProfilerStats* stats, bool last);
  void ExporterLoop(Threads* threads, const std::function<void()>& drain);
  void StartExporter(Threads* threads, const std::function<void()>& drain);
  // Library mode, on the collector thread after each drain: the counters
  // to the agent, and the fallback once it is gone.
  void AfterForwardingDrain(Threads* threads, const std::function<void()>& drain);
  // mutex_ held: the agent is gone; the fallback's state and note.
  void OnAgentLostLocked(int64_t now);
  std::string NotesLocked() const;  // mutex_ held

  Options options_;
  ValueType period_type_;
  int64_t period_;
  std::string engine_;
  std::string engine_detail_;  // mutex_
  bool describe_unwind_tables_ = true;

  // Guards aggregator_, window_start_ns_, baseline_, http_address_.
  mutable std::mutex mutex_;
  SampleAggregator aggregator_;
  int64_t window_start_ns_ = 0;
  StatsFunction stats_;     // set before the threads start
  ProfilerStats baseline_;  // counters at the previous cut

  // Serializes exports; guards symbolizer_, sinks_ and their failure state.
  std::mutex export_mutex_;
  std::unique_ptr<Symbolizer> symbolizer_;  // kept: caches across exports
  bool symbolizer_given_ = false;  // UseSymbolizer(): captures use it too
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

  // Library mode: the link while connected (and after it was lost, for
  // its counts); touched by Start/Stop and the collector thread, never at
  // once. agent_note_ (mutex_) goes into the windows' comments.
  std::unique_ptr<AgentLink> agent_;
  std::string agent_note_;
  std::string process_note_;  // mutex_

  // The live endpoint, from StartCollector to StopCollector.
  std::unique_ptr<DebugEndpoint> endpoint_;
  std::unique_ptr<DebugServer> server_;
  std::string http_address_;  // set before the server serves
};

}  // namespace internal
}  // namespace inprof

#endif  // INPROF_INTERNAL_PROFILER_CORE_H_
