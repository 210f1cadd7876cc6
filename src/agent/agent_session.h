// internal: not part of the public API.
//
// What `inprof agent` keeps for one profiled process (one connection): the
// process's shared region, read as an AgentRingReader, and -- from the
// process's Describe record on -- a pipeline (internal/pipeline.h) of the agent's own, with
// the agent's sinks (INPROF_OUTPUT with %p naming the profiled process,
// Datadog, Pyroscope), a symbolizer of the process made while it was alive
// (Symbolizer::ForProcess: its maps and mapped files, kept open so that it
// symbolizes on after the process exited), and the windows cut on the
// agent's schedule (INPROF_EXPORT_PERIOD).
//
// The records are translated as they are read: the process's thread indices
// and label-string ids into the agent's own. Nothing the process wrote is
// trusted: a record that does not decode stops the reading of that
// process's ring (logged once); what was read stays and is exported.
//
// One process cannot make the agent hold more than its quotas, whoever it
// is (another user admitted with --allow-uid included): its label strings
// go into a table of its own (at most LabelTable::kMaxEntries strings of
// kMaxLabelBytes in all), at most kMaxThreads of its threads are known at
// once, each window holds at most kMaxStacks stacks of kMaxFrameWords
// frames. What is over a quota is refused -- a label reads
// "[inprof: over the agent's label quota for this process]", a thread's
// samples go to one "[inprof: threads over the agent's quota ...]" thread,
// a stack's to its thread's "[inprof: stacks over ...]" frame -- counted in
// the process's profiles' comments, and said in one line per quota naming
// the process. All of it is freed with the session, when the process's
// last window is out; no other process's labels depend on it.
//
// Thread-safety: Drain() from any thread (the server's loop, the pipeline's
// collector and exporter); Finish() once, after the connection ended.
#ifndef INPROF_SRC_AGENT_AGENT_SESSION_H_
#define INPROF_SRC_AGENT_AGENT_SESSION_H_

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "inprof/internal/agent_protocol.h"
#include "inprof/internal/agent_stream.h"
#include "inprof/internal/label_table.h"
#include "inprof/internal/pipeline.h"
#include "inprof/options.h"

namespace inprof {
class Symbolizer;
}

namespace inprof::agent {

class AgentSession {
 public:
  using LogFunction = std::function<void(const std::string&)>;
  // Maps the region (`region_fd` is not taken over: the session keeps a
  // copy, to read the threads' rings of a process that dies). `log`: errors (its
  // ring unreadable); `log_summary`: one line when it is finished. The options are the
  // agent's; the session derives the process's from them. `symbolizer`:
  // the process's (Symbolizer::ForProcess, made while it waited for its
  // Welcome, so it was alive), or null when that failed: its profiles then
  // carry addresses only.
  AgentSession(const Options& options, const internal::AgentHello& hello,
               pid_t pid, int region_fd, uint64_t region_bytes,
               std::unique_ptr<Symbolizer> symbolizer, LogFunction log,
               LogFunction log_summary = nullptr);
  ~AgentSession();
  AgentSession(const AgentSession&) = delete;
  AgentSession& operator=(const AgentSession&) = delete;

  // Reads what the process wrote since the last call.
  void Drain();
  // The connection ended: reads the rest -- and, when the process did not
  // stop its profiler (it died), what its threads' rings still hold
  // (agent_stream.h: the threads' own rings) -- then exports the last
  // window and waits for its delivery (the options' stop_timeout).
  // Idempotent.
  absl::Status Finish();

  pid_t pid() const { return pid_; }
  // Counts, for the agent's log and tests.
  uint64_t samples_read() const;
  // Of those, read from the threads' rings after the process ended.
  uint64_t samples_from_thread_rings() const;
  uint64_t windows_exported() const;
  bool ended_cleanly() const;  // the process sent its end record
  // The live endpoint's capture of the process (`inprof agent --http`): a
  // window of its own over the next `duration`, symbolized with the
  // process's symbolizer. Unavailable before it described its profile or
  // once it is finished.
  absl::StatusOr<std::string> Capture(absl::Duration duration);
  // The options the process's windows go out with (its output path etc.).
  const Options& process_options() const { return options_; }
  // Why its ring stopped being read (empty while it is fine).
  std::string error() const;

  // `inprof agent --http`'s /debug/pprof/heap and /allocs of the process:
  // per stack, alloc_* since it connected and inuse_* as of its newest
  // state (sent every second), in a gzip pprof opening on `default_type`.
  // NotFound when it profiles no allocations; Unavailable before it
  // described its profile or once it is finished.
  // `delta` > 0 (?seconds=N): the difference of two snapshots that far apart.
  absl::StatusOr<std::string> HeapSnapshot(absl::string_view default_type,
                                           absl::Duration delta = absl::ZeroDuration());
  // The pipeline's lock held (Pipeline::Snapshot): the rows of HeapSnapshot.
  internal::PipelineAttachment::SnapshotShape HeapSnapshotLocked(SampleAggregator& aggregator);
  // Likewise for HeapSnapshot("delay"): the lock waits it forwarded since
  // it connected (contentions, delay), empty when it profiles none.
  internal::PipelineAttachment::SnapshotShape LockSnapshotLocked(SampleAggregator& aggregator);

  // `inprof agent --http`'s /debug/pprof/threads and /goroutine of the
  // process (Pipeline::ThreadDump's answer: `debug` 0, gzip pprof of type
  // `type`; 1, 2: text), symbolized with the process's symbolizer. `ask`
  // sends the process an AgentDumpRequest with the id it is given; the
  // process answers through its ring (Drain), within kDumpWait. One at a
  // time; Unavailable when the process is not live, DeadlineExceeded when
  // it did not answer.
  absl::StatusOr<std::string> ThreadDump(absl::string_view type, int debug,
                                         const std::function<absl::Status(uint32_t)>& ask);
  static constexpr absl::Duration kDumpWait = absl::Seconds(10);

  // The pipeline's lock held (its StateAttachment, before each cut): the
  // process's newest state rows (its live heap) into `aggregator` at a
  // window's end; returns the process's event-providers line for the
  // window's comments.
  std::string AddStateLocked(SampleAggregator& aggregator, bool window_end);
  // The most state rows kept per process (its allocation stacks are at
  // most 65,536; a row per stack and labels).
  static constexpr size_t kMaxStateRows = size_t{1} << 17;
  // One process's quotas (see above). 16 MiB of label text is 65,536
  // strings of 256 bytes; 16,384 threads alive at once is 4x what one
  // process may give the agent rings for (kAgentMaxThreads); 131,072
  // stacks and 4 Mi frames (32 MiB) a window are more than a busy server's
  // 60 s window holds (~10,000 stacks of ~40 frames).
  static constexpr size_t kMaxLabelBytes = size_t{16} << 20;
  static constexpr size_t kMaxThreads = 16'384;
  static constexpr size_t kMaxStacks = size_t{1} << 17;
  static constexpr size_t kMaxFrameWords = size_t{4} << 20;

 private:
  // The pipeline, for a request (Capture, HeapSnapshot); Unavailable
  // before the process described its profile or once it is finished.
  absl::StatusOr<internal::Pipeline*> LivePipeline() const;
  void Apply(const internal::AgentOp& op);  // mu_ held
  // mu_ and the pipeline's lock held (Pipeline::Ingest: `agg`).
  uint32_t Thread(SampleAggregator& agg, uint32_t index);
  uint64_t LabelId(uint64_t host_id);        // mu_ held
  void StartCore(const internal::AgentDescribe& describe);  // mu_ held
  // The process's label words as ours, one per key (the innermost wins),
  // plus the wall state label when `state_label`, sorted by key (mu_ held).
  void TranslateLabels(std::span<const uint64_t> words, bool state_label,
                       bool blocked);
  void ReadThreadRings();  // mu_ held; the process is gone
  // mu_ held: an op of a dump's answer (AgentDumpThread, AgentDumpEnd).
  void ApplyDumpOp(const internal::AgentOp& op);
  // The pipeline's thread dumper: asks the process (ask_dump_) and waits.
  absl::StatusOr<ProfileData> DumpOfProcess();
  // mu_ held: one line for each quota the process went over, once.
  void SayRefusals();
  // What the process had refused, for its windows' comments (empty: none).
  std::string RefusalNote(const SampleAggregator& aggregator) const;
  uint32_t ThreadByTid(SampleAggregator& agg, int64_t tid, std::string_view name);
  // Rows kept between windows, by identity (thread, value offset, labels,
  // frames or synthetic frame).
  struct StateRow {
    uint32_t thread = 0;  // ours, in the windows' aggregate
    int64_t tid = 0;      // and who it is (a snapshot's fresh aggregate)
    std::string thread_name;
    uint32_t value_offset = 0;
    std::vector<uint64_t> labels;
    std::vector<uint64_t> frames;
    std::string synthetic;  // a synthetic row's frame (frames empty)
    std::vector<int64_t> values;
  };
  using Rows = absl::flat_hash_map<std::string, StateRow>;
  // mu_ and the pipeline's lock held: a row of `rows` (labels_ as its
  // labels) gets `values`: as its newest (all zeros removes it), or added
  // to its sums when `add`. At most kMaxStateRows each; more are counted.
  void KeepStateLocked(Rows& rows, uint32_t process_thread, uint32_t thread,
                       uint32_t value_offset, std::span<const uint64_t> frames,
                       const std::string& synthetic, std::span<const int64_t> values,
                       bool add);
  // Adds `rows` to `aggregator`: the windows' own (their thread indices), or
  // a fresh one (`fresh`: its threads, added by identity as they come).
  using ThreadsByName = absl::flat_hash_map<std::pair<int64_t, std::string>, uint32_t>;
  // At most `max_values` of each row's values (kStateValues: the state's
  // inuse_*, not the peak columns it carries).
  static void AddRowsLocked(const Rows& rows, SampleAggregator& aggregator,
                            ThreadsByName* fresh, size_t max_values = SIZE_MAX);
  static constexpr size_t kStateValues = 4;
  // The pipeline's lock held: when the newest state's peak total (its
  // rows' peak_inuse_space) is above the window's, its peak columns become
  // the window's (peak_rows_).
  void TakePeakLocked();
  // The rows that sum what the process forwards at `value_offset` (its
  // allocations' or its lock waits'), or nullptr.
  Rows* TotalsAt(uint32_t value_offset);

  Options options_;
  internal::AgentHello hello_;
  pid_t pid_;
  LogFunction log_;          // errors
  LogFunction log_summary_;  // the line at its end
  int region_fd_ = -1;
  void* region_ = nullptr;
  uint64_t region_bytes_ = 0;
  std::unique_ptr<Symbolizer> symbolizer_;  // until the core takes it

  mutable std::mutex mu_;  // the reader, the translations, the counts
  std::unique_ptr<internal::AgentRingReader> reader_;
  std::string error_;
  bool ended_ = false;
  bool finished_ = false;
  uint64_t samples_read_ = 0;
  uint64_t samples_from_rings_ = 0;
  std::string note_;  // the process note in its windows' comments
  absl::flat_hash_map<int64_t, uint32_t> tids_;  // tid -> our thread
  std::vector<uint64_t> record_;
  absl::flat_hash_map<uint32_t, uint32_t> threads_;  // process index -> ours
  // process index -> its tid and name, kept after it is removed (mu_)
  absl::flat_hash_map<uint32_t, std::pair<int64_t, std::string>> thread_ids_;
  // The process's own label table (its quota); outlives the pipeline.
  std::unique_ptr<internal::LabelTable> labels_table_;
  std::vector<uint32_t> strings_;  // process label id -> ours (0: unknown)
  // Over a quota (atomic: read at the cuts, under the pipeline's lock).
  std::atomic<uint64_t> threads_refused_{0};
  std::atomic<bool> stacks_over_{false};
  uint32_t overflow_thread_ = UINT32_MAX;  // ours, made at the first refusal
  size_t state_frame_words_ = 0;  // in state_, alloc_totals_ and lock_totals_
  bool said_strings_ = false, said_threads_ = false, said_stacks_ = false;  // mu_
  std::vector<uint64_t> labels_;   // scratch
  // Every sample's labels pid (numeric) and program (label-table ids).
  uint64_t pid_key_ = 0, program_key_ = 0, program_value_ = 0;
  ProfilerStats stats_;  // the process's newest counters (the pipeline's lock)
  // The pipeline's lock: the process's state rows (its live heap), the sums
  // of what it forwarded at the allocation columns since it connected, its
  // event providers' newest line and period.
  Rows state_;
  Rows alloc_totals_;
  Rows lock_totals_;  // likewise at the lock-wait columns
  uint64_t state_rows_refused_ = 0;
  std::string events_note_;
  int64_t events_period_ = 0;
  int64_t lock_period_ = 0;  // nanoseconds (0: none)
  int alloc_offset_ = -1;  // of alloc_objects in its sample types (-1: none; mu_)
  int lock_offset_ = -1;   // of contentions (-1: none; mu_)
  // Whether peak_inuse_objects and peak_inuse_space follow its four (mu_).
  bool peak_columns_ = false;
  // The pipeline's lock: the window's peak (the state rows' peak columns
  // when their total was highest) and that total (-1: none yet).
  Rows peak_rows_;
  int64_t peak_total_ = -1;
  std::unique_ptr<internal::Pipeline> pipeline_;
  // A thread dump's request (one at a time: dump_one_) and answer (mu_).
  std::mutex dump_one_;
  const std::function<absl::Status(uint32_t)>* ask_dump_ = nullptr;  // dump_one_
  std::condition_variable dump_cv_;
  uint32_t dump_ids_ = 0;
  uint32_t dump_id_ = 0;  // the request waited for (0: none)
  bool dump_done_ = false;
  ProfileData dump_;
  std::string dump_error_;
};

// `pattern` with each %p replaced by `pid` (other % sequences are kept for
// the file sink: %t, %%).
std::string ExpandProcessPattern(const std::string& pattern, pid_t pid);

}  // namespace inprof::agent

#endif  // INPROF_SRC_AGENT_AGENT_SESSION_H_
