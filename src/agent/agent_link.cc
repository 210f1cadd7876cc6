#include "inprof/internal/agent_link.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <new>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "inprof/internal/label_table.h"

namespace inprof::internal {
namespace {

// The connected socket, closed in a forked child: the agent learns that a
// process is gone when its connection ends, which a child that inherited the
// descriptor (and may live on) would otherwise prevent. One profiler runs
// in a process at a time, so one link at a time.
std::atomic<int> g_link_socket{-1};
FdIdentity g_link_socket_identity;  // written before g_link_socket
std::atomic<uint64_t> g_fork_generation{0};
// The process the globals above describe. A forked child's atfork handlers
// run in the order they were registered, and `inprof run`'s preload (whose
// handler starts the child's own profiler, which connects) registers first:
// a handler that closed "the link" unconditionally closed the child's new
// one. So the inherited link is dropped by whichever comes first -- this
// handler or the child's Connect() -- and only once, when the pid changed.
std::atomic<pid_t> g_link_process{0};

// In a process whose links so far were made by another (its parent):
// closes the inherited socket and makes the parent's AgentLink objects
// unusable here. Once per process; a no-op in the process that made them.
void DropInheritedLink() {
  const pid_t self = getpid();
  if (g_link_process.load() == self) return;
  const int fd = g_link_socket.exchange(-1);
  if (fd >= 0) CloseIfOurs(fd, g_link_socket_identity);
  g_fork_generation.fetch_add(1);
  g_link_process.store(self);
}

void CloseLinkInChild() { DropInheritedLink(); }

void InstallForkHandler() {
  static const bool installed = [] {
    pthread_atfork(nullptr, nullptr, &CloseLinkInChild);
    return true;
  }();
  (void)installed;
}

// Chunks are mapped 16 at a time (~0.6 MiB of address space for
// 32 KiB rings; pages are only touched as the rings are written).
constexpr uint32_t kChunksPerBatch = 16;

}  // namespace

#ifndef INPROF_INSTALLED_CLI
#define INPROF_INSTALLED_CLI "/usr/local/bin/inprof"
#endif

absl::StatusOr<std::string> SpawnAgent(const Options& options, int timeout_ms) {
  std::string binary = options.agent_binary;
  if (binary.empty() && access(INPROF_INSTALLED_CLI, X_OK) == 0) {
    binary = INPROF_INSTALLED_CLI;
  }
  if (binary.empty()) binary = "inprof";  // on PATH
  const AgentSocketAddress address = NewAgentSocketAddress();
  const std::string socket = address.ToString();
  // Everything the children need, prepared before fork(): between fork()
  // and exec() only async-signal-safe calls (this process has threads).
  const char* argv[] = {binary.c_str(), "agent",  "--socket", socket.c_str(),
                        "--idle-exit",  "2",      "--quiet",  "--daemonize",
                        nullptr};
  int ready[2];
  if (pipe2(ready, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("INPROF_AGENT=spawn: pipe: ", std::strerror(errno)));
  }
  // posix_spawn, not fork(): Start() holds locks that inprof's fork
  // handlers take (base/fork_guard.h), and posix_spawn runs no fork
  // handlers. The tool daemonizes itself (--daemonize): the child here
  // exits at once, and the agent is never this process's child to reap.
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, ready[1], 1);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  // The process's environment but its live endpoint: the process serves
  // INPROF_HTTP_ADDR itself, and an agent on the same port would fail.
  std::vector<char*> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "INPROF_HTTP_ADDR=", 17) != 0) env.push_back(*e);
  }
  env.push_back(nullptr);
  pid_t middle = 0;
  const int spawned =
      binary.find('/') == std::string::npos
          ? posix_spawnp(&middle, binary.c_str(), &actions, nullptr,
                         const_cast<char* const*>(argv), env.data())
          : posix_spawn(&middle, binary.c_str(), &actions, nullptr,
                        const_cast<char* const*>(argv), env.data());
  posix_spawn_file_actions_destroy(&actions);
  close(ready[1]);
  if (spawned != 0) {
    close(ready[0]);
    return absl::UnavailableError(absl::StrCat(
        "INPROF_AGENT=spawn: cannot run '", binary, "': ", std::strerror(spawned),
        " (INPROF_AGENT_BINARY names the inprof tool to run)"));
  }
  // The agent's first line is the address it listens on.
  std::string line;
  const auto deadline = absl::Now() + absl::Milliseconds(timeout_ms);
  char c = 0;
  while (line.size() < 256) {
    const int left = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
    pollfd p{ready[0], POLLIN, 0};
    if (left <= 0 || poll(&p, 1, left) <= 0) break;
    const ssize_t n = read(ready[0], &c, 1);
    if (n <= 0 || c == '\n') break;
    line.push_back(c);
  }
  close(ready[0]);
  // The child detaches (--daemonize) and exits before the agent listens;
  // one that is still there by the deadline (a binary that is not inprof,
  // a hung one) is killed rather than waited for.
  int status = 0;
  for (;;) {
    const pid_t reaped = waitpid(middle, &status, WNOHANG);
    if (reaped == middle || (reaped < 0 && errno != EINTR)) break;
    if (reaped == 0 && absl::Now() >= deadline) {
      kill(middle, SIGKILL);
      while (waitpid(middle, &status, 0) < 0 && errno == EINTR) {
      }
      break;
    }
    if (reaped == 0) absl::SleepFor(absl::Milliseconds(2));
  }
  if (line != "INPROF_AGENT_SOCKET=" + socket) {
    return absl::UnavailableError(absl::StrCat(
        "INPROF_AGENT=spawn: '", binary, "' did not start an agent within ",
        timeout_ms, " ms (", c == '\n' || !line.empty() ? "it said '" + line + "'"
                                                         : "it exited or could not be run",
        "; INPROF_AGENT_BINARY names the inprof tool to run)"));
  }
  return socket;
}

absl::StatusOr<std::unique_ptr<AgentLink>> AgentLink::Connect(
    const Options& options, const AgentDescribe& describe, int timeout_ms) {
  absl::StatusOr<AgentSocketAddress> address =
      ParseAgentSocketAddress(options.agent_socket);
  if (!address.ok()) return address.status();
  AgentHello hello;
  hello.pid = getpid();
  hello.program = program_invocation_short_name;
  const DatadogOptions& dd = options.datadog;
  hello.tags.emplace_back("service", dd.service.empty() ? hello.program : dd.service);
  if (!dd.env.empty()) hello.tags.emplace_back("env", dd.env);
  if (!dd.version.empty()) hello.tags.emplace_back("version", dd.version);
  for (const std::string& tag : dd.tags) {
    if (hello.tags.size() >= kAgentMaxTags) break;
    std::pair<std::string, std::string> kv =
        absl::StrSplit(tag, absl::MaxSplits(':', 1));
    if (!kv.first.empty()) hello.tags.push_back(std::move(kv));
  }
  hello.max_threads = 1;  // one forwarding ring (agent_stream.h)
  hello.ring_bytes = kAgentLinkRingBytes;
  // Before anything of this link exists: a forked child whose atfork
  // handler for the parent's link has not run yet (it runs after the
  // preload's, which got here) drops the inherited one now, and the handler
  // then finds nothing of the parent's left to close.
  DropInheritedLink();
  absl::StatusOr<AgentConnection> connection =
      ConnectToAgent(*address, hello, timeout_ms);
  if (!connection.ok()) return connection.status();

  std::unique_ptr<AgentLink> link(new AgentLink());
  // Above the numbers the program's open() takes first (owned_fd.h).
  connection->socket = MoveAboveProgramRange(connection->socket);
  connection->region_fd = MoveAboveProgramRange(connection->region_fd);
  link->socket_ = connection->socket;
  link->socket_identity_ = IdentifyFd(link->socket_);
  link->address_ = address->ToString();
  link->agent_pid_ = connection->welcome.agent_pid;
  link->pid_ = getpid();
  auto fail = [&](const std::string& why) -> absl::Status {
    close(connection->region_fd);
    return absl::UnavailableError(
        absl::StrCat("agent at ", link->address_, ": ", why));
  };
  struct stat st;
  const uint64_t bytes = connection->welcome.region_bytes;
  if (fstat(connection->region_fd, &st) != 0 ||
      static_cast<uint64_t>(st.st_size) < bytes || AgentRingWords(bytes) == 0) {
    return fail(absl::StrCat("its shared region of ", bytes,
                             " bytes is not usable"));
  }
  void* region = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                      connection->region_fd, 0);
  if (region == MAP_FAILED) {
    return fail(absl::StrCat("cannot map its shared region: ", std::strerror(errno)));
  }
  link->region_fd_ = connection->region_fd;
  link->region_identity_ = IdentifyFd(link->region_fd_);
  link->region_ = region;
  link->region_bytes_ = bytes;
  link->ring_ = std::make_unique<AgentRingWriter>(region, bytes);
  link->num_values_ = describe.sample_types.size();
  InstallForkHandler();
  g_link_socket_identity = link->socket_identity_;
  g_link_socket.store(link->socket_);
  link->generation_ = g_fork_generation.load();
  if (!link->Push(EncodeAgentOp(describe))) {
    return absl::UnavailableError(absl::StrCat(
        "agent at ", link->address_, ": its ring refused the first record"));
  }
  return link;
}

AgentLink::~AgentLink() {
  if (!Usable()) return;  // a forked child: the parent's, not ours to touch
  if (socket_ >= 0) {
    int expected = socket_;
    g_link_socket.compare_exchange_strong(expected, -1);
    CloseIfOurs(socket_, socket_identity_);
  }
  if (region_ != nullptr) munmap(region_, region_bytes_);
  if (area_header_ != nullptr) munmap(area_header_, kAgentThreadAreaHeaderBytes);
  for (char* batch : batches_) {
    munmap(batch, size_t{kChunksPerBatch} * chunk_bytes_);
  }
  if (region_fd_ >= 0) CloseIfOurs(region_fd_, region_identity_);
}

void AgentLink::EnableThreadRings(const AgentThreadRingLayout& layout) {
  if (area_header_ != nullptr || region_fd_ < 0 || layout.value_counts.empty() ||
      layout.value_counts.size() > kAgentMaxProviders ||
      layout.value_offsets.size() != layout.value_counts.size()) {
    return;
  }
  if (!IsStillOurs(region_fd_, region_identity_)) {
    NoteDescriptorTaken(region_fd_, "the agent's shared memory");
    region_fd_ = -1;
    return;
  }
  area_offset_ = AgentThreadAreaOffset(region_bytes_);
  chunk_bytes_ = AgentThreadChunkBytes(layout);
  ring_bytes_ = layout.ring_bytes;
  if (ftruncate(region_fd_, static_cast<off_t>(area_offset_ + kAgentThreadAreaHeaderBytes)) != 0) {
    return;
  }
  void* page = mmap(nullptr, kAgentThreadAreaHeaderBytes, PROT_READ | PROT_WRITE,
                    MAP_SHARED, region_fd_, static_cast<off_t>(area_offset_));
  if (page == MAP_FAILED) return;
  auto* header = new (page) AgentThreadAreaHeader{};
  AgentThreadAreaShape& shape = header->shape;
  shape.magic = kAgentThreadAreaMagic;
  shape.chunk_bytes = chunk_bytes_;
  shape.ring_offset = kAgentThreadRingOffset;
  shape.ring_words = layout.ring_words;
  shape.leaf_words = layout.leaf_words;
  shape.num_providers = static_cast<uint32_t>(layout.value_counts.size());
  shape.state_label_providers = layout.state_label_providers;
  for (size_t i = 0; i < layout.value_counts.size(); ++i) {
    shape.value_counts[i] = layout.value_counts[i];
    shape.value_offsets[i] = layout.value_offsets[i];
  }
  header->chunks.store(0, std::memory_order_release);
  area_header_ = header;
}

bool AgentLink::GrowThreadArea() {
  if (chunks_made_ + kChunksPerBatch > kAgentMaxThreads) return false;
  const uint64_t at = area_offset_ + kAgentThreadAreaHeaderBytes +
                      uint64_t{chunks_made_} * chunk_bytes_;
  const uint64_t bytes = uint64_t{kChunksPerBatch} * chunk_bytes_;
  // Grown only through the memory the agent handed over, never a file of
  // the program's that took its number.
  if (region_fd_ < 0) return false;
  if (!IsStillOurs(region_fd_, region_identity_)) {
    NoteDescriptorTaken(region_fd_, "the agent's shared memory");
    region_fd_ = -1;
    return false;
  }
  if (ftruncate(region_fd_, static_cast<off_t>(at + bytes)) != 0) return false;
  void* batch = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                     region_fd_, static_cast<off_t>(at));
  if (batch == MAP_FAILED) return false;
  batches_.push_back(static_cast<char*>(batch));
  for (uint32_t i = 0; i < kChunksPerBatch; ++i) {
    // Highest first: chunks are handed out in order.
    free_chunks_.push_back(chunks_made_ + kChunksPerBatch - 1 - i);
  }
  chunks_made_ += kChunksPerBatch;
  area_header_->chunks.store(chunks_made_, std::memory_order_release);
  return true;
}

void* AgentLink::AcquireThreadRing(pid_t tid, absl::string_view name) {
  if (area_header_ == nullptr || gone_ || !Usable()) return nullptr;
  if (free_chunks_.empty() && !GrowThreadArea()) {
    ++thread_rings_refused_;
    return nullptr;
  }
  const uint32_t chunk = free_chunks_.back();
  free_chunks_.pop_back();
  char* base = batches_[chunk / kChunksPerBatch] +
               size_t{chunk % kChunksPerBatch} * chunk_bytes_;
  auto* header = reinterpret_cast<AgentThreadChunkHeader*>(base);
  header->tid = tid;
  std::memset(header->name, 0, sizeof(header->name));
  std::memcpy(header->name, name.data(), std::min(name.size(), sizeof(header->name)));
  char* ring = base + kAgentThreadRingOffset;
  // Empty indices before the agent may look (the ring's words are read only
  // between them).
  std::memset(ring, 0, std::min<size_t>(ring_bytes_, kAgentThreadRingIndexBytes));
  header->in_use.store(1, std::memory_order_release);
  ring_chunks_[ring] = chunk;
  return ring;
}

void AgentLink::ReleaseThreadRing(void* ring) {
  auto it = ring_chunks_.find(ring);
  if (it == ring_chunks_.end()) return;
  const uint32_t chunk = it->second;
  ring_chunks_.erase(it);
  char* base = batches_[chunk / kChunksPerBatch] +
               size_t{chunk % kChunksPerBatch} * chunk_bytes_;
  reinterpret_cast<AgentThreadChunkHeader*>(base)->in_use.store(0, std::memory_order_release);
  free_chunks_.push_back(chunk);
}

bool AgentLink::Usable() const {
  return g_fork_generation.load(std::memory_order_relaxed) == generation_;
}

bool AgentLink::Push(std::span<const uint64_t> record) {
  if (gone_ || !Usable()) return false;
  if (ring_->Push(record)) return true;
  ++records_dropped_;
  return false;
}

void AgentLink::SendNewStrings(std::span<const uint64_t> label_words) {
  uint64_t highest = 0;
  for (size_t i = 0; i + 1 < label_words.size(); i += 2) {
    highest = std::max(highest, label_words[i] & ~kNumericLabel);
    if ((label_words[i] & kNumericLabel) == 0) {
      highest = std::max(highest, label_words[i + 1]);
    }
  }
  if (highest < strings_sent_) return;
  LabelTable& table = LabelTable::Global();
  const size_t known = table.size();
  while (strings_sent_ < known) {
    if (!Push(EncodeAgentOp(AgentString{strings_sent_, table.Lookup(strings_sent_)}))) {
      return;  // sent again with the next sample that needs it
    }
    ++strings_sent_;
  }
}

void AgentLink::ForwardThread(uint32_t index, int64_t tid, absl::string_view name) {
  Push(EncodeAgentOp(AgentThreadAdd{index, tid, std::string(name)}));
}

void AgentLink::ForwardThreadName(uint32_t index, absl::string_view name) {
  Push(EncodeAgentOp(AgentThreadName{index, std::string(name)}));
}

void AgentLink::ForwardThreadRemoved(uint32_t index) {
  // Values still waiting for room belong to the thread's samples.
  if (auto it = lost_values_.find(index); it != lost_values_.end()) {
    if (Push(EncodeAgentOp(AgentSynthetic{index, 0, it->second,
                                          "[inprof: samples lost, agent ring full]"}))) {
      lost_values_.erase(it);
    }
  }
  Push(EncodeAgentOp(AgentThreadRemove{index}));
}

void AgentLink::ForwardSample(uint32_t thread, std::span<const uint64_t> frames,
                              std::span<const uint64_t> label_words,
                              size_t value_offset,
                              std::span<const int64_t> values) {
  if (!Usable()) return;
  if (gone_) {
    ++samples_after_loss_;  // INPROF_AGENT_FALLBACK=off: counted, not kept
    return;
  }
  if (!label_words.empty()) SendNewStrings(label_words);
  EncodeAgentSample(thread, static_cast<uint32_t>(value_offset), values,
                    label_words, frames, state_rows_, scratch_);
  if (state_rows_) {
    // Absolute values: nothing to add up later; the caller sends them all
    // again next time.
    if (!Push(scratch_)) ++state_rows_dropped_;
    return;
  }
  if (Push(scratch_)) {
    ++samples_forwarded_;
    return;
  }
  ++samples_ring_full_;
  std::vector<int64_t>& lost = lost_values_[thread];
  lost.resize(num_values_, 0);
  for (size_t i = 0; i < values.size() && value_offset + i < num_values_; ++i) {
    lost[value_offset + i] += values[i];
  }
}

void AgentLink::ForwardSynthetic(uint32_t thread, absl::string_view frame,
                                 size_t value_offset,
                                 std::span<const int64_t> values) {
  if (!Usable() || gone_) return;
  if (!Push(EncodeAgentOp(AgentSynthetic{thread, static_cast<uint32_t>(value_offset),
                                         std::vector<int64_t>(values.begin(), values.end()),
                                         std::string(frame), state_rows_})) &&
      state_rows_) {
    ++state_rows_dropped_;
  }
}

void AgentLink::EventsNote(const std::string& line, int64_t period, int64_t lock_period) {
  if (gone_ || !Usable() ||
      (line == last_events_note_ && period == last_events_period_ &&
       lock_period == last_lock_period_)) {
    return;
  }
  if (Push(EncodeAgentOp(AgentEventsNote{line, period, lock_period}))) {
    last_events_note_ = line;
    last_events_period_ = period;
    last_lock_period_ = lock_period;
  }
}

void AgentLink::MarkGone() {
  if (gone_) return;
  gone_ = true;
  const uint64_t consumed = ring_->samples_consumed();
  unconsumed_at_loss_ =
      samples_forwarded_ > consumed ? samples_forwarded_ - consumed : 0;
}

bool AgentLink::Flush(const std::vector<uint64_t>& counters,
                      const std::string& engine_detail) {
  if (gone_) return false;
  if (!Usable()) return true;  // a forked child: not its link
  for (auto it = lost_values_.begin(); it != lost_values_.end();) {
    if (!Push(EncodeAgentOp(AgentSynthetic{it->first, 0, it->second,
                                           "[inprof: samples lost, agent ring full]"}))) {
      break;
    }
    lost_values_.erase(it++);
  }
  if (engine_detail != last_engine_detail_ &&
      Push(EncodeAgentOp(AgentEngine{engine_detail}))) {
    last_engine_detail_ = engine_detail;
  }
  if (counters != last_counters_ && Push(EncodeAgentOp(AgentStats{counters}))) {
    last_counters_ = counters;
  }
  // The program closed the socket (and may have reused its number): the
  // link is gone like a link whose agent went away.
  if (!IsStillOurs(socket_, socket_identity_)) {
    NoteDescriptorTaken(socket_, "the agent's socket");
    int expected = socket_;
    g_link_socket.compare_exchange_strong(expected, -1);
    socket_ = -1;
    MarkGone();
    return false;
  }
  // After its Welcome the agent sends only thread-dump requests: anything
  // else readable is its end (end-of-file) or a peer that is not an agent
  // any more.
  for (int i = 0; i < 8; ++i) {
    pollfd p{socket_, POLLIN | POLLRDHUP, 0};
    const int ready = poll(&p, 1, 0);
    if (ready <= 0 || (p.revents & (POLLIN | POLLRDHUP | POLLHUP | POLLERR)) == 0) break;
    absl::StatusOr<AgentMessage> message = ReceiveAgentMessage(socket_, 0);
    if (absl::IsDeadlineExceeded(message.status())) break;  // nothing after all
    const auto* request = message.ok() ? std::get_if<AgentDumpRequest>(&*message) : nullptr;
    if (request == nullptr || request->id == 0) {
      MarkGone();
      return false;
    }
    dump_request_ = request->id;
  }
  return true;
}

void AgentLink::SendDump(uint32_t id, const absl::StatusOr<ProfileData>& dump) {
  if (gone_ || !Usable()) return;
  AgentDumpEnd end{id, {}, {}};
  if (!dump.ok()) {
    end.error = std::string(dump.status().message());
    Push(EncodeAgentOp(end));
    return;
  }
  size_t refused = 0;
  for (const ProfileSample& s : dump->samples) {
    AgentDumpThread t;
    t.request = id;
    if (s.thread < dump->threads.size()) {
      t.tid = dump->threads[s.thread].tid;
      t.name = dump->threads[s.thread].name.substr(0, kAgentOpMaxStringBytes);
    }
    for (const SampleLabel& l : s.labels) {
      if (t.labels.size() == kAgentOpMaxDumpLabels) break;
      t.labels.push_back({l.key.substr(0, kAgentOpMaxStringBytes),
                          l.str.substr(0, kAgentOpMaxStringBytes), l.num, l.numeric});
    }
    t.frames.assign(s.frames.begin(),
                    s.frames.begin() + static_cast<ptrdiff_t>(
                                           std::min(s.frames.size(), kAgentOpMaxFrames)));
    t.synthetic = s.synthetic_frame.substr(0, kAgentOpMaxStringBytes);
    if (!Push(EncodeAgentOp(t))) ++refused;
  }
  for (const std::string& c : dump->comments) {
    if (end.comments.size() < 63) end.comments.push_back(c.substr(0, kAgentOpMaxStringBytes));
  }
  if (refused > 0) {
    end.comments.push_back(absl::StrCat("threads not sent to the agent (its ring was full)=",
                                        refused));
  }
  Push(EncodeAgentOp(end));
}

void AgentLink::End(const std::vector<uint64_t>& counters) {
  if (!Flush(counters, last_engine_detail_)) return;
  Push(EncodeAgentOp(AgentEnd{}));
  int expected = socket_;
  g_link_socket.compare_exchange_strong(expected, -1);
  if (socket_ >= 0) CloseIfOurs(socket_, socket_identity_);
  socket_ = -1;
  gone_ = ended_ = true;  // nothing more is forwarded; nothing was lost
}

}  // namespace inprof::internal
