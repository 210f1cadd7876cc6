#include "src/agent/agent_session.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "inprof/internal/label_table.h"
#include "inprof/internal/sinks_from_options.h"
#include "inprof/symbolizer.h"
#include "inprof/wall_time_provider.h"

namespace inprof::agent {
namespace {

constexpr uint32_t kUnknownString = UINT32_MAX;
constexpr const char* kOverLabelQuota = "[inprof: over the agent's label quota for this process]";
constexpr const char* kOverThreadQuota = "[inprof: threads over the agent's quota for this process]";
constexpr const char* kOverStackQuota = "[inprof: stacks over the agent's quota for this process]";

// The process's state rows (its live heap) at the end of each window the
// agent cuts, and its event providers' line in the window's comments.
class StateAttachment final : public internal::PipelineAttachment {
 public:
  explicit StateAttachment(AgentSession& session) : session_(session) {}
  std::string BeforeCutLocked(SampleAggregator& aggregator, bool window_end) override {
    return session_.AddStateLocked(aggregator, window_end);
  }
  SnapshotShape SnapshotLocked(SampleAggregator& aggregator, absl::string_view type) override {
    // The process's lock waits (/debug/pprof/mutex, /block) or its heap.
    if (type == "contentions" || type == "delay") return session_.LockSnapshotLocked(aggregator);
    return session_.HeapSnapshotLocked(aggregator);
  }

 private:
  AgentSession& session_;
};

void AppendWords(std::string& key, std::span<const uint64_t> words) {
  key.append(reinterpret_cast<const char*>(words.data()), words.size() * sizeof(uint64_t));
}

}  // namespace

std::string ExpandProcessPattern(const std::string& pattern, pid_t pid) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size()) {
      if (pattern[i + 1] == 'p') {
        absl::StrAppend(&out, pid);
      } else {
        out.append(pattern, i, 2);  // %t, %%: the file sink's
      }
      ++i;
      continue;
    }
    out.push_back(pattern[i]);
  }
  return out;
}

AgentSession::AgentSession(const Options& options,
                           const internal::AgentHello& hello, pid_t pid,
                           int region_fd, uint64_t region_bytes,
                           std::unique_ptr<Symbolizer> symbolizer,
                           LogFunction log, LogFunction log_summary)
    : options_(options),
      hello_(hello),
      pid_(pid),
      log_(std::move(log)),
      log_summary_(std::move(log_summary)),
      symbolizer_(std::move(symbolizer)),
      labels_table_(std::make_unique<internal::LabelTable>(
          internal::LabelTable::kMaxEntries, kMaxLabelBytes, kOverLabelQuota)) {
  // The process's own windows: its pid in the file name, its name as the
  // service, its tags on every upload.
  options_.output = ExpandProcessPattern(options.output, pid);
  options_.http_addr.clear();
  options_.agent_socket.clear();
  std::string service = hello.program;
  for (const auto& [key, value] : hello.tags) {
    if (key == "service") {
      service = value;
    } else {
      options_.datadog.tags.push_back(absl::StrCat(key, ":", value));
    }
  }
  if (options_.datadog.service.empty()) options_.datadog.service = service;
  options_.datadog.tags.push_back(absl::StrCat("process_id:", pid));
  if (options_.pyroscope.application_name.empty()) {
    options_.pyroscope.application_name = service;
  }
  void* region = mmap(nullptr, region_bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                      region_fd, 0);
  if (region == MAP_FAILED) {
    error_ = absl::StrCat("cannot map its region: ", std::strerror(errno));
    return;
  }
  region_ = region;
  region_bytes_ = region_bytes;
  region_fd_ = fcntl(region_fd, F_DUPFD_CLOEXEC, 0);
  reader_ = std::make_unique<internal::AgentRingReader>(region, region_bytes);
  if (!reader_->error().empty()) error_ = reader_->error();
}

AgentSession::~AgentSession() {
  Finish().IgnoreError();
  pipeline_.reset();
  if (region_ != nullptr) munmap(region_, region_bytes_);
  if (region_fd_ >= 0) close(region_fd_);
}

std::string AgentSession::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

uint64_t AgentSession::samples_read() const {
  std::lock_guard<std::mutex> lock(mu_);
  return samples_read_;
}

absl::StatusOr<internal::Pipeline*> AgentSession::LivePipeline() const {
  internal::Pipeline* pipeline = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!finished_) pipeline = pipeline_.get();
  }
  // The pipeline lives as long as the session; Finish() stops its collector,
  // which ends a capture in progress (Unavailable) and waits for it.
  if (pipeline == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "process ", pid_, " has not described its profile yet, or has ended"));
  }
  return pipeline;
}

absl::StatusOr<std::string> AgentSession::Capture(absl::Duration duration) {
  absl::StatusOr<internal::Pipeline*> pipeline = LivePipeline();
  if (!pipeline.ok()) return pipeline.status();
  return (*pipeline)->Capture(duration);
}

uint64_t AgentSession::samples_from_thread_rings() const {
  std::lock_guard<std::mutex> lock(mu_);
  return samples_from_rings_;
}

uint64_t AgentSession::windows_exported() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pipeline_ == nullptr ? 0 : pipeline_->windows_exported();
}

bool AgentSession::ended_cleanly() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ended_;
}

void AgentSession::Drain() {
  std::lock_guard<std::mutex> lock(mu_);
  if (reader_ == nullptr || !error_.empty() || finished_) return;
  uint64_t samples = 0;
  for (;;) {
    const internal::AgentRingReader::Result r = reader_->Pop(record_);
    if (r == internal::AgentRingReader::kEmpty) break;
    if (r == internal::AgentRingReader::kCorrupt) {
      error_ = reader_->error();
      break;
    }
    absl::StatusOr<internal::AgentOp> op = internal::DecodeAgentOp(record_);
    if (!op.ok()) {
      error_ = std::string(op.status().message());
      break;
    }
    if (pipeline_ == nullptr && !std::holds_alternative<internal::AgentDescribe>(*op)) {
      error_ = "the first record must describe the profile";
      break;
    }
    if (const auto* sample = std::get_if<internal::AgentSample>(&*op);
        sample != nullptr && !sample->state) {
      ++samples;  // the process counts the samples it forwards, not state rows
    }
    Apply(*op);
    if (!error_.empty()) break;
  }
  reader_->AddSamplesConsumed(samples);
  samples_read_ += samples;
  SayRefusals();
  if (!error_.empty() && log_) {
    log_(absl::StrCat("agent: pid ", pid_, " (", hello_.program,
                      "): its ring is not read any more: ", error_,
                      "; what was read is exported"));
  }
}

void AgentSession::StartCore(const internal::AgentDescribe& d) {
  if (d.sample_types.empty() || d.period_type.type.empty()) {
    error_ = "its profile has no sample types";
    return;
  }
  if (symbolizer_ == nullptr) {
    error_ = "its /proc/PID/maps could not be read when it connected, so "
             "its samples cannot be symbolized";
    return;
  }
  internal::LabelTable& table = *labels_table_;
  pid_key_ = table.Intern("pid") | internal::kNumericLabel;
  program_key_ = table.Intern("program");
  program_value_ = table.Intern(hello_.program);
  // The allocation provider's four columns, when the process profiles
  // allocations (its heap snapshots: HeapSnapshot).
  static constexpr const char* kHeapTypes[] = {"alloc_objects", "alloc_space", "inuse_objects",
                                               "inuse_space"};
  for (size_t i = 0; i + 4 <= d.sample_types.size() && i + 4 <= 64; ++i) {
    bool match = true;
    for (size_t k = 0; k < 4; ++k) {
      match = match && d.sample_types[i + k].type == kHeapTypes[k] &&
              (d.omitted_types >> (i + k) & 1) == 0;
    }
    if (match) {
      alloc_offset_ = static_cast<int>(i);
      // Its peak columns follow (a process of an older inprof has none).
      peak_columns_ = i + 6 <= d.sample_types.size() && i + 6 <= 64 &&
                      d.sample_types[i + 4].type == "peak_inuse_objects" &&
                      d.sample_types[i + 5].type == "peak_inuse_space" &&
                      (d.omitted_types >> (i + 4) & 3) == 0;
      break;
    }
  }
  // The lock-wait provider's two (its snapshots: LockSnapshot).
  for (size_t i = 0; i + 2 <= d.sample_types.size() && i + 2 <= 64; ++i) {
    if (d.sample_types[i].type == "contentions" && d.sample_types[i + 1].type == "delay" &&
        (d.omitted_types >> i & 3) == 0) {
      lock_offset_ = static_cast<int>(i);
      break;
    }
  }
  pipeline_ = std::make_unique<internal::Pipeline>(
      options_, d.sample_types, d.period_type, d.period, d.engine);
  pipeline_->SetOmittedTypes(d.omitted_types);
  pipeline_->SetThreadDumper([this] { return DumpOfProcess(); });
  pipeline_->SetLabelTable(labels_table_.get());
  pipeline_->SetStackLimits(kMaxStacks, kMaxFrameWords, kOverStackQuota);
  pipeline_->SetSinkFactory([options = options_] { return internal::MakeSinks(options); });
  pipeline_->UseSymbolizer(std::move(symbolizer_));
  std::vector<std::string> tags;
  for (const auto& [key, value] : hello_.tags) tags.push_back(absl::StrCat(key, "=", value));
  note_ = absl::StrCat("process pid=", pid_, " program=", hello_.program,
                       tags.empty() ? "" : " tags ", absl::StrJoin(tags, ","),
                       "; profiled through inprof agent (pid ", getpid(), ")");
  pipeline_->SetProcessNote(note_);
  pipeline_->Attach(std::make_unique<StateAttachment>(*this));
  pipeline_->BeginWindow();
  pipeline_->StartCollector([this] { Drain(); }, [this] { return stats_; });
}

uint32_t AgentSession::Thread(SampleAggregator& agg, uint32_t index) {
  auto it = threads_.find(index);
  if (it != threads_.end()) return it->second;
  if (threads_.size() >= kMaxThreads) {
    // Over the quota: one thread for all the rest, never removed.
    threads_refused_.fetch_add(1, std::memory_order_relaxed);
    if (overflow_thread_ == UINT32_MAX) overflow_thread_ = agg.AddThread(0, kOverThreadQuota);
    return overflow_thread_;
  }
  // A record about a thread whose announcement was lost (a full ring).
  const uint32_t ours = agg.AddThread(0, "[thread not announced]");
  threads_.emplace(index, ours);
  return ours;
}

uint64_t AgentSession::LabelId(uint64_t host_id) {
  if (host_id < strings_.size() && strings_[host_id] != kUnknownString) {
    return strings_[host_id];
  }
  return labels_table_->Intern(absl::StrCat("[inprof: label ", host_id, " not sent]"));
}

void AgentSession::Apply(const internal::AgentOp& op) {
  using namespace internal;  // NOLINT: the record types
  if (const auto* d = std::get_if<AgentDescribe>(&op)) {
    if (pipeline_ != nullptr) {
      error_ = "a second describe record";
      return;
    }
    StartCore(*d);
    return;
  }
  if (const auto* s = std::get_if<AgentString>(&op)) {
    if (s->id >= LabelTable::kMaxEntries) return;
    if (strings_.size() <= s->id) strings_.resize(s->id + 1, kUnknownString);
    strings_[s->id] = labels_table_->Intern(s->text);
    return;
  }
  if (const auto* e = std::get_if<AgentEngine>(&op)) {
    pipeline_->SetEngineDetail(e->detail);
    return;
  }
  if (std::holds_alternative<AgentEnd>(op)) {
    ended_ = true;
    dump_cv_.notify_all();
    return;
  }
  if (std::holds_alternative<AgentDumpThread>(op) || std::holds_alternative<AgentDumpEnd>(op)) {
    ApplyDumpOp(op);
    return;
  }
  internal::Pipeline::Ingesting ingest = pipeline_->Ingest();
  SampleAggregator& agg = ingest.aggregator();
  if (const auto* s = std::get_if<AgentSample>(&op)) {
    // Canonical there already (one per key, the state label included); the
    // process's own labels are added.
    TranslateLabels(s->labels, /*state_label=*/false, /*blocked=*/false);
    if (s->state) {
      KeepStateLocked(state_, s->thread, Thread(agg, s->thread), s->value_offset, s->frames,
                      "", s->values, /*add=*/false);
    } else {
      agg.Add(Thread(agg, s->thread), s->frames, labels_, s->value_offset, s->values);
      if (agg.stacks_refused() != 0) stacks_over_.store(true, std::memory_order_relaxed);
      if (Rows* totals = TotalsAt(s->value_offset)) {
        KeepStateLocked(*totals, s->thread, Thread(agg, s->thread), s->value_offset, s->frames,
                        "", s->values, /*add=*/true);
      }
    }
  } else if (const auto* y = std::get_if<AgentSynthetic>(&op)) {
    labels_.clear();
    if (y->state) {
      KeepStateLocked(state_, y->thread, Thread(agg, y->thread), y->value_offset, {}, y->frame,
                      y->values, /*add=*/false);
    } else {
      agg.AddSynthetic(Thread(agg, y->thread), y->frame, y->value_offset, y->values);
      if (Rows* totals = TotalsAt(y->value_offset)) {
        KeepStateLocked(*totals, y->thread, Thread(agg, y->thread), y->value_offset, {},
                        y->frame, y->values, /*add=*/true);
      }
    }
  } else if (const auto* n = std::get_if<AgentEventsNote>(&op)) {
    // A state begins: the previous one is whole.
    TakePeakLocked();
    events_note_ = n->line;
    events_period_ = n->period;
    lock_period_ = n->lock_period;
  } else if (const auto* t = std::get_if<AgentThreadAdd>(&op)) {
    if (auto it = threads_.find(t->index); it != threads_.end()) {
      agg.RemoveThread(it->second);
      threads_.erase(it);
    }
    if (threads_.size() >= kMaxThreads) {
      threads_refused_.fetch_add(1, std::memory_order_relaxed);
      return;  // its samples go to the quota's thread (Thread())
    }
    const uint32_t ours = agg.AddThread(t->tid, t->name);
    threads_.emplace(t->index, ours);
    tids_[t->tid] = ours;
    thread_ids_[t->index] = {t->tid, t->name};
  } else if (const auto* n = std::get_if<AgentThreadName>(&op)) {
    agg.SetThreadName(Thread(agg, n->index), n->name);
    if (auto it = thread_ids_.find(n->index); it != thread_ids_.end()) it->second.second = n->name;
  } else if (const auto* r = std::get_if<AgentThreadRemove>(&op)) {
    if (auto it = threads_.find(r->index); it != threads_.end()) {
      agg.RemoveThread(it->second);
      for (auto t = tids_.begin(); t != tids_.end(); ++t) {
        if (t->second == it->second) {
          tids_.erase(t);
          break;
        }
      }
      threads_.erase(it);
    }
    // Kept after removal (state rows name their thread by it), but only as
    // many as a process may have alive: indices that never come back do
    // not pile up.
    if (thread_ids_.size() > kMaxThreads) thread_ids_.erase(r->index);
  } else if (const auto* st = std::get_if<AgentStats>(&op)) {
    stats_ = internal::StatsFromCounters(st->counters);
  }
}

void AgentSession::KeepStateLocked(Rows& rows, uint32_t process_thread, uint32_t thread,
                                   uint32_t value_offset,
                                   std::span<const uint64_t> frames,
                                   const std::string& synthetic,
                                   std::span<const int64_t> values, bool add) {
  // The row's identity: thread (its tid: the process reuses the index of a
  // thread that ended), value offset, labels (labels_) and frames, or the
  // synthetic frame.
  const auto id = thread_ids_.find(process_thread);
  const int64_t tid = id != thread_ids_.end() ? id->second.first : 0;
  std::string key;
  const uint64_t head[] = {static_cast<uint64_t>(tid), value_offset, labels_.size(),
                           frames.size(), synthetic.size()};
  AppendWords(key, head);
  AppendWords(key, labels_);
  AppendWords(key, frames);
  key += synthetic;
  const bool zero = std::all_of(values.begin(), values.end(), [](int64_t v) { return v == 0; });
  auto it = rows.find(key);
  if (zero) {
    if (it != rows.end() && !add) {
      state_frame_words_ -= std::min(state_frame_words_, it->second.frames.size());
      rows.erase(it);
    }
    return;
  }
  if (it == rows.end()) {
    if (rows.size() >= kMaxStateRows ||
        frames.size() > kMaxFrameWords - std::min(state_frame_words_, kMaxFrameWords)) {
      ++state_rows_refused_;
      return;
    }
    state_frame_words_ += frames.size();
    StateRow row;
    row.thread = thread;
    row.tid = tid;
    row.thread_name = id != thread_ids_.end() ? id->second.second : "[thread not announced]";
    row.value_offset = value_offset;
    row.labels = labels_;
    row.frames.assign(frames.begin(), frames.end());
    row.synthetic = synthetic;
    it = rows.emplace(std::move(key), std::move(row)).first;
  }
  if (!add) {
    it->second.values.assign(values.begin(), values.end());
    return;
  }
  std::vector<int64_t>& sums = it->second.values;
  if (sums.size() < values.size()) sums.resize(values.size(), 0);
  for (size_t i = 0; i < values.size(); ++i) sums[i] += values[i];
}

void AgentSession::TakePeakLocked() {
  if (!peak_columns_) return;
  // The state rows' peak columns: the process's interval since its
  // previous state (allocation_provider.h: AddLiveState).
  constexpr size_t kPeakObjects = 4, kPeakSpace = 5;
  int64_t total = 0;
  for (const auto& [key, row] : state_) {
    if (row.value_offset == static_cast<uint32_t>(alloc_offset_) &&
        row.values.size() > kPeakSpace) {
      total += row.values[kPeakSpace];
    }
  }
  if (total <= peak_total_) return;
  peak_total_ = total;
  peak_rows_.clear();
  for (const auto& [key, row] : state_) {
    if (row.value_offset != static_cast<uint32_t>(alloc_offset_) ||
        row.values.size() <= kPeakSpace ||
        (row.values[kPeakObjects] == 0 && row.values[kPeakSpace] == 0)) {
      continue;
    }
    StateRow& peak = peak_rows_[key];
    peak = row;
    peak.values.assign(row.values.size(), 0);
    peak.values[kPeakObjects] = row.values[kPeakObjects];
    peak.values[kPeakSpace] = row.values[kPeakSpace];
  }
}

void AgentSession::AddRowsLocked(const Rows& rows, SampleAggregator& aggregator,
                                 ThreadsByName* fresh, size_t max_values) {
  for (const auto& [key, row] : rows) {
    const std::span<const int64_t> values =
        std::span<const int64_t>(row.values).first(std::min(max_values, row.values.size()));
    uint32_t thread = row.thread;
    if (fresh != nullptr) {
      // A fresh aggregate (a snapshot): the row's thread by its identity.
      auto [it, added] = fresh->try_emplace(std::make_pair(row.tid, row.thread_name), 0);
      if (added) it->second = aggregator.AddThread(row.tid, row.thread_name);
      thread = it->second;
    }
    if (row.synthetic.empty()) {
      aggregator.Add(thread, row.frames, row.labels, row.value_offset, values);
    } else {
      aggregator.AddSynthetic(thread, row.synthetic, row.value_offset, values);
    }
  }
}

internal::PipelineAttachment::SnapshotShape AgentSession::HeapSnapshotLocked(
    SampleAggregator& aggregator) {
  internal::PipelineAttachment::SnapshotShape shape;
  if (alloc_offset_ < 0) return shape;  // the process profiles no allocations
  // alloc_* since the process connected (what it forwarded), inuse_* as of
  // its newest state (at most a second old).
  ThreadsByName threads;
  AddRowsLocked(alloc_totals_, aggregator, &threads);
  AddRowsLocked(state_, aggregator, &threads, kStateValues);
  const auto first = static_cast<size_t>(alloc_offset_);
  shape.types = uint64_t{0xf} << first;
  shape.period = events_period_;
  shape.period_type = first + 1;  // alloc_space, as the process's own snapshot
  return shape;
}

internal::PipelineAttachment::SnapshotShape AgentSession::LockSnapshotLocked(
    SampleAggregator& aggregator) {
  internal::PipelineAttachment::SnapshotShape shape;
  if (lock_offset_ < 0) return shape;  // the process profiles no lock waits
  // contentions and delay since the process connected (what it forwarded),
  // as the process's own snapshot holds them since its Start.
  ThreadsByName threads;
  AddRowsLocked(lock_totals_, aggregator, &threads);
  const auto first = static_cast<size_t>(lock_offset_);
  shape.types = uint64_t{0x3} << first;
  shape.period = lock_period_;
  shape.period_type = first + 1;  // delay
  return shape;
}

AgentSession::Rows* AgentSession::TotalsAt(uint32_t value_offset) {
  if (alloc_offset_ >= 0 && value_offset == static_cast<uint32_t>(alloc_offset_)) {
    return &alloc_totals_;
  }
  if (lock_offset_ >= 0 && value_offset == static_cast<uint32_t>(lock_offset_)) {
    return &lock_totals_;
  }
  return nullptr;
}

absl::StatusOr<std::string> AgentSession::HeapSnapshot(absl::string_view default_type,
                                                       absl::Duration delta) {
  absl::StatusOr<internal::Pipeline*> pipeline = LivePipeline();
  if (!pipeline.ok()) return pipeline.status();
  return (*pipeline)->Snapshot(default_type, delta);
}

std::string AgentSession::AddStateLocked(SampleAggregator& aggregator, bool window_end) {
  // Called with the pipeline's lock held, which guards the state (Apply
  // writes it under that lock too); never mu_, which Drain holds while it
  // waits for the pipeline's lock.
  if (window_end) {
    // inuse_* as of the newest state; peak_inuse_* from the state whose
    // interval peaked highest in the window (begun with the newest one
    // before it, so that a window without a state of its own still has
    // the heap's peak as last seen).
    AddRowsLocked(state_, aggregator, nullptr, kStateValues);
    TakePeakLocked();
    AddRowsLocked(peak_rows_, aggregator, nullptr);
    peak_total_ = -1;
    TakePeakLocked();
  }
  std::string note = events_note_;
  if (state_rows_refused_ != 0) {
    absl::StrAppend(&note, note.empty() ? "" : "; ",
                    "live-heap rows of the process the agent did not keep (over ",
                    kMaxStateRows, " rows or ", kMaxFrameWords, " frames): ",
                    state_rows_refused_);
  }
  if (std::string refused = RefusalNote(aggregator); !refused.empty()) {
    absl::StrAppend(&note, note.empty() ? "" : "; ", refused);
  }
  return note;
}

std::string AgentSession::RefusalNote(const SampleAggregator& aggregator) const {
  const uint64_t strings = labels_table_->overflows();
  const uint64_t threads = threads_refused_.load(std::memory_order_relaxed);
  const uint64_t stacks = aggregator.stacks_refused();
  if (strings == 0 && threads == 0 && stacks == 0) return "";
  return absl::StrCat("over the agent's quotas for this process (since it connected): ",
                      strings, " label strings refused (over ",
                      internal::LabelTable::kMaxEntries, " strings or ", kMaxLabelBytes,
                      " bytes), ", threads, " thread records refused (over ", kMaxThreads,
                      " threads), ", stacks, " samples of new stacks refused (over ",
                      kMaxStacks, " stacks or ", kMaxFrameWords, " frames a window)");
}

void AgentSession::SayRefusals() {
  if (!log_) return;
  const std::string who = absl::StrCat("agent: pid ", pid_, " (", hello_.program, "): ");
  const char* rest = "; the rest are refused and counted in its profiles' comments (said once "
                     "for this process)";
  if (!said_strings_ && labels_table_->overflows() != 0) {
    said_strings_ = true;
    log_(absl::StrCat(who, "over its quota of label strings (",
                      internal::LabelTable::kMaxEntries, " strings, ", kMaxLabelBytes,
                      " bytes): its further labels read \"", kOverLabelQuota, "\"", rest));
  }
  if (!said_threads_ && threads_refused_.load(std::memory_order_relaxed) != 0) {
    said_threads_ = true;
    log_(absl::StrCat(who, "over its quota of threads (", kMaxThreads,
                      " at once): the samples of the rest go to one thread \"",
                      kOverThreadQuota, "\"", rest));
  }
  if (!said_stacks_ && stacks_over_.load(std::memory_order_relaxed)) {
    said_stacks_ = true;
    log_(absl::StrCat(who, "over its quota of stacks (", kMaxStacks, " stacks or ",
                      kMaxFrameWords, " frames a window): the samples of new ones go to \"",
                      kOverStackQuota, "\"", rest));
  }
}

void AgentSession::TranslateLabels(std::span<const uint64_t> words,
                                   bool state_label, bool blocked) {
  using internal::kNumericLabel;
  labels_.clear();
  auto put = [&](uint64_t key, uint64_t value) {
    for (size_t i = 0; i < labels_.size(); i += 2) {
      if ((labels_[i] & ~kNumericLabel) == (key & ~kNumericLabel)) {
        labels_[i] = key;
        labels_[i + 1] = value;
        return;
      }
    }
    labels_.push_back(key);
    labels_.push_back(value);
  };
  for (size_t i = 0; i + 1 < words.size(); i += 2) {
    const uint64_t key = words[i];
    const uint64_t numeric = key & kNumericLabel;
    put(numeric | LabelId(key & ~kNumericLabel & 0xffffffffu),
        numeric != 0 ? words[i + 1] : LabelId(words[i + 1]));
  }
  // Whose sample it is: profiles of several processes merged (go tool
  // pprof a.pb.gz b.pb.gz, a backend's query) still tell them apart.
  put(pid_key_, static_cast<uint64_t>(pid_));
  put(program_key_, program_value_);
  if (state_label) {
    internal::LabelTable& table = *labels_table_;
    put(table.Intern(WallTimeProvider::kStateLabel),
        table.Intern(blocked ? WallTimeProvider::kBlocked : WallTimeProvider::kRunning));
  }
  for (size_t i = 2; i < labels_.size(); i += 2) {
    for (size_t j = i; j >= 2 && labels_[j - 2] > labels_[j]; j -= 2) {
      std::swap(labels_[j - 2], labels_[j]);
      std::swap(labels_[j - 1], labels_[j + 1]);
    }
  }
}

uint32_t AgentSession::ThreadByTid(SampleAggregator& agg, int64_t tid,
                                   std::string_view name) {
  if (auto it = tids_.find(tid); it != tids_.end()) return it->second;
  // Registered after the process's last collector pass.
  const uint32_t ours =
      agg.AddThread(tid, absl::string_view(name.data(), name.size()));
  tids_.emplace(tid, ours);
  return ours;
}

void AgentSession::ReadThreadRings() {
  if (region_fd_ < 0 || pipeline_ == nullptr) return;
  struct stat st;
  const uint64_t offset = internal::AgentThreadAreaOffset(region_bytes_);
  if (fstat(region_fd_, &st) != 0 || static_cast<uint64_t>(st.st_size) <= offset) {
    return;  // the process made no thread rings
  }
  // At most kAgentMaxThreads rings of 32 KiB and then some; the region is
  // sealed against shrinking, so no read past its end can fault.
  constexpr uint64_t kMaxAreaBytes = uint64_t{512} << 20;
  const uint64_t bytes =
      std::min<uint64_t>(static_cast<uint64_t>(st.st_size) - offset, kMaxAreaBytes);
  void* area = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, region_fd_,
                    static_cast<off_t>(offset));
  if (area == MAP_FAILED) {
    if (log_) {
      log_(absl::StrCat("agent: pid ", pid_, " (", hello_.program,
                        "): cannot map its threads' rings: ", std::strerror(errno)));
    }
    return;
  }
  internal::AgentThreadAreaSummary summary;
  {
    internal::Pipeline::Ingesting ingest = pipeline_->Ingest();
    SampleAggregator& agg = ingest.aggregator();
    std::vector<int64_t> values;
    summary = internal::ReadAgentThreadArea(
        area, bytes, [&](const internal::AgentLeftoverSample& s) {
          TranslateLabels(s.labels, s.state_label, s.blocked);
          values.assign(s.values.begin(), s.values.end());
          agg.Add(ThreadByTid(agg, s.tid, s.thread_name), s.frames, labels_,
                  s.value_offset, values);
        });
  }
  munmap(area, bytes);
  samples_from_rings_ = summary.samples;
  samples_read_ += summary.samples;
  if (!summary.error.empty() || summary.skipped > 0) {
    if (log_) {
      log_(absl::StrCat("agent: pid ", pid_, " (", hello_.program, "): ",
                        summary.error.empty() ? "" : summary.error,
                        summary.error.empty() ? "" : "; ", summary.skipped,
                        " records or rings of its threads could not be read"));
    }
  }
  if (summary.samples > 0 || summary.skipped > 0) {
    pipeline_->SetProcessNote(absl::StrCat(
        note_, "; ended without stopping its profiler: ", summary.samples,
        " samples read from its threads' rings afterwards",
        summary.skipped > 0 ? absl::StrCat(", ", summary.skipped, " unreadable")
                            : std::string()));
  }
}

absl::Status AgentSession::Finish() {
  Drain();  // what the process wrote before its end
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return absl::OkStatus();
    finished_ = true;  // Drain() does nothing from now on
    dump_cv_.notify_all();  // a dump waited for will not come
    // A process that ended without its end record died (or exec'd): its
    // collector never drained what its handlers wrote last.
    if (!ended_ && error_.empty()) ReadThreadRings();
    SayRefusals();
  }
  if (pipeline_ == nullptr) return absl::OkStatus();
  pipeline_->StopCollector();  // its drain calls return at once now
  ProfilerStats last;
  {
    // stats_ is written and read (the stats function) under its lock.
    internal::Pipeline::Ingesting ingest = pipeline_->Ingest();
    last = stats_;
  }
  absl::Status status = pipeline_->Export(last);
  const LogFunction& log = status.ok() ? log_summary_ : log_;
  if (log) {
    std::lock_guard<std::mutex> lock(mu_);
    log(absl::StrCat("agent: pid ", pid_, " (", hello_.program, "): ",
                      samples_read_, " samples, ", pipeline_->windows_exported(),
                      " profiles", options_.write_output
                                       ? absl::StrCat(" (", options_.output, ")")
                                       : std::string(),
                      ended_ ? ""
                             : absl::StrCat("; it ended without stopping its profiler (",
                                            samples_from_rings_,
                                            " samples read from its threads' rings)"),
                      status.ok() ? "" : "; ",
                      status.ok() ? "" : status.message()));
  }
  return status;
}

}  // namespace inprof::agent
