// internal: not part of the public API.
//
// Library mode's process side: a profiled process connected to
// `inprof agent`. Start() connects (agent_protocol.h: Hello, Welcome with a
// memfd), maps the region and from then on the collector's aggregate
// forwards every sample, thread and label string into the region's ring
// (agent_stream.h) instead of summing it: no aggregation, symbolization,
// encoding or upload in the process.
//
// Faults: nothing here blocks or raises SIGPIPE. A full ring drops the
// record; a dropped sample's values reach the agent later as a synthetic
// "[inprof: samples lost, agent ring full]" frame. The agent's end is seen
// at the next Flush() (the socket reads end-of-file, or anything at all:
// the agent never speaks after its Welcome), and the samples the process
// forwarded that the agent never read are counted (samples_unconsumed()).
//
// Thread-safety: the forwarding calls and Flush() run under the owner's
// aggregate lock; the rest from the thread that owns the link.
#ifndef INPROF_INTERNAL_AGENT_LINK_H_
#define INPROF_INTERNAL_AGENT_LINK_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "inprof/base/growth_safe_table.h"
#include "inprof/base/owned_fd.h"
#include "inprof/internal/agent_protocol.h"
#include "inprof/internal/agent_stream.h"
#include "inprof/options.h"
#include "inprof/profile_data.h"
#include "inprof/sample_aggregator.h"

namespace inprof::internal {

// The ring a process asks for: 1 MiB holds ~2,600 samples of 40 frames,
// 1.3 s of 20 busy threads at 100 Hz; the agent reads it every 20 ms.
inline constexpr uint32_t kAgentLinkRingBytes = 1u << 20;

// INPROF_AGENT=spawn: starts `inprof agent --socket @fresh --idle-exit 2
// --quiet --daemonize` with posix_spawn (no fork handlers run: Start()
// holds locks they take); the tool detaches itself (its own session, a
// grandchild that is never this process's child to reap), waits until it listens (its
// first line, over a pipe; at most `timeout_ms`) and returns the address.
// The binary: options.agent_binary, else $INPROF_AGENT_BINARY (read by
// Options), else the installed tool, else `inprof` on PATH. The error names
// the binary and why.
absl::StatusOr<std::string> SpawnAgent(const Options& options, int timeout_ms);

class AgentLink final : public SampleForwarder {
 public:
  // Connects to options.agent_socket within `timeout_ms`. The error is one
  // line naming the socket (no agent listens, another user's agent,
  // rejected, another protocol version).
  static absl::StatusOr<std::unique_ptr<AgentLink>> Connect(
      const Options& options, const AgentDescribe& describe, int timeout_ms);
  ~AgentLink();
  AgentLink(const AgentLink&) = delete;
  AgentLink& operator=(const AgentLink&) = delete;

  // SampleForwarder.
  void ForwardThread(uint32_t index, int64_t tid, absl::string_view name) override;
  void ForwardThreadName(uint32_t index, absl::string_view name) override;
  void ForwardThreadRemoved(uint32_t index) override;
  void ForwardSample(uint32_t thread, std::span<const uint64_t> frames,
                     std::span<const uint64_t> label_words, size_t value_offset,
                     std::span<const int64_t> values) override;
  void ForwardSynthetic(uint32_t thread, absl::string_view frame,
                        size_t value_offset,
                        std::span<const int64_t> values) override;

  // After each collector pass: the counters (when they changed) and the
  // engine's detail (when it changed), then whether the agent is still
  // there. Returns false once it is gone (and from then on).
  bool Flush(const std::vector<uint64_t>& counters, const std::string& engine_detail);
  // While on, what the aggregate forwards goes as state rows (agent_stream.h:
  // the live heap, Pipeline::Locked::LiveStateAtAttachments), not samples.
  void SetStateRows(bool on) { state_rows_ = on; }
  // State rows the full ring refused (the rows are sent again in full).
  uint64_t state_rows_dropped() const { return state_rows_dropped_; }
  // The event providers' comment line and sampling periods (allocations,
  // bytes; lock waits, nanoseconds), when they changed since the last ones
  // the ring took.
  void EventsNote(const std::string& line, int64_t period, int64_t lock_period);
  // The agent's newest thread-dump request (an AgentDumpRequest Flush()
  // read from the socket), taken once; 0: none.
  uint32_t TakeDumpRequest() { return std::exchange(dump_request_, 0); }
  // The answer to request `id`: a record per thread of `dump`, then the
  // end (with the dump's comments, or `dump`'s error); a thread the full
  // ring refused is counted in the end's comments.
  void SendDump(uint32_t id, const absl::StatusOr<ProfileData>& dump);
  // The process stops profiling: the last counters and an end record, then
  // the connection is closed (the agent exports the process's last window).
  void End(const std::vector<uint64_t>& counters);

  // The threads' own rings in the shared region (agent_stream.h), so that
  // the agent reads what a process that died had not drained. Called once,
  // after Connect(), by a profiler whose rings are SpscRecordRings. The
  // rest of these run under the owner's registry lock.
  void EnableThreadRings(const AgentThreadRingLayout& layout);
  // Zeroed indices for one ring of the layout's ring_bytes, 64-byte aligned,
  // marked as `tid`'s; null when thread rings are off, the agent is gone or
  // the region cannot grow (the thread keeps its own ring; counted).
  void* AcquireThreadRing(pid_t tid, absl::string_view name);
  // The ring is drained and its thread's handler can no longer write it.
  void ReleaseThreadRing(void* ring);
  uint64_t thread_rings_refused() const { return thread_rings_refused_; }

  // The agent went away while the process was profiling (not after End()).
  bool lost() const { return gone_ && !ended_; }
  const std::string& address() const { return address_; }
  pid_t agent_pid() const { return agent_pid_; }
  uint64_t samples_forwarded() const { return samples_forwarded_; }
  // Samples forwarded that the agent had not read when it went.
  uint64_t samples_unconsumed() const { return unconsumed_at_loss_; }
  // Records refused because the ring was full (samples among them are
  // also in samples_ring_full()).
  uint64_t records_dropped() const { return records_dropped_; }
  uint64_t samples_ring_full() const { return samples_ring_full_; }
  // Samples handed to the link after the agent was lost (kept by nobody:
  // INPROF_AGENT_FALLBACK=off).
  uint64_t samples_after_loss() const { return samples_after_loss_; }

 private:
  AgentLink() = default;
  bool Push(std::span<const uint64_t> record);
  void SendNewStrings(std::span<const uint64_t> label_words);
  void MarkGone();
  bool Usable() const;

  bool GrowThreadArea();

  // Used and closed only while they still are what the agent handed over
  // (the program may close them and reuse the numbers: owned_fd.h).
  int socket_ = -1;
  int region_fd_ = -1;  // kept to grow the threads' area
  FdIdentity socket_identity_;
  FdIdentity region_identity_;
  void* region_ = nullptr;
  uint64_t region_bytes_ = 0;
  std::unique_ptr<AgentRingWriter> ring_;
  std::string address_;
  pid_t agent_pid_ = 0;
  pid_t pid_ = 0;  // a forked child never writes into its parent's ring
  uint64_t generation_ = 0;  // the fork generation it was made in
  bool gone_ = false;
  bool ended_ = false;
  uint32_t strings_sent_ = 0;  // label ids [0, strings_sent_) are known there
  uint64_t samples_forwarded_ = 0;
  uint64_t unconsumed_at_loss_ = 0;
  uint64_t records_dropped_ = 0;
  uint64_t samples_ring_full_ = 0;
  uint64_t samples_after_loss_ = 0;
  // Values of samples the full ring refused, per thread, sent when it has room.
  ThrowSafeMap<uint32_t, std::vector<int64_t>> lost_values_;
  size_t num_values_ = 0;
  std::vector<uint64_t> last_counters_;
  std::string last_engine_detail_;
  std::string last_events_note_;
  int64_t last_events_period_ = -1;
  int64_t last_lock_period_ = -1;
  uint32_t dump_request_ = 0;
  bool state_rows_ = false;
  uint64_t state_rows_dropped_ = 0;
  std::vector<uint64_t> scratch_;

  // The threads' area: its header page, chunk size, the mapped batches of
  // chunks (kept until the link goes), the free chunks and which chunk a
  // ring is.
  AgentThreadAreaHeader* area_header_ = nullptr;
  uint64_t area_offset_ = 0;
  uint32_t chunk_bytes_ = 0;
  uint32_t ring_bytes_ = 0;
  uint32_t chunks_made_ = 0;
  std::vector<char*> batches_;
  std::vector<uint32_t> free_chunks_;
  ThrowSafeMap<void*, uint32_t> ring_chunks_;
  uint64_t thread_rings_refused_ = 0;
};

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_AGENT_LINK_H_
