#include "src/agent/agent_session.h"

#include <errno.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "inprof/internal/label_table.h"
#include "inprof/symbolizer.h"

namespace inprof::agent {
namespace {

constexpr uint32_t kUnknownString = UINT32_MAX;

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
      symbolizer_(std::move(symbolizer)) {
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
  reader_ = std::make_unique<internal::AgentRingReader>(region, region_bytes);
  if (!reader_->error().empty()) error_ = reader_->error();
}

AgentSession::~AgentSession() {
  Finish().IgnoreError();
  core_.reset();
  if (region_ != nullptr) munmap(region_, region_bytes_);
}

std::string AgentSession::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

uint64_t AgentSession::samples_read() const {
  std::lock_guard<std::mutex> lock(mu_);
  return samples_read_;
}

uint64_t AgentSession::windows_exported() const {
  std::lock_guard<std::mutex> lock(mu_);
  return core_ == nullptr ? 0 : core_->windows_exported();
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
    if (core_ == nullptr && !std::holds_alternative<internal::AgentDescribe>(*op)) {
      error_ = "the first record must describe the profile";
      break;
    }
    if (std::holds_alternative<internal::AgentSample>(*op)) ++samples;
    Apply(*op);
    if (!error_.empty()) break;
  }
  reader_->AddSamplesConsumed(samples);
  samples_read_ += samples;
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
  core_ = std::make_unique<internal::ProfilerCore>(
      options_, d.sample_types, d.period_type, d.period, d.engine);
  core_->UseSymbolizer(std::move(symbolizer_));
  std::vector<std::string> tags;
  for (const auto& [key, value] : hello_.tags) tags.push_back(absl::StrCat(key, "=", value));
  core_->SetProcessNote(absl::StrCat(
      "process pid=", pid_, " program=", hello_.program,
      tags.empty() ? "" : " tags ", absl::StrJoin(tags, ","),
      "; profiled through inprof agent (pid ", getpid(), ")"));
  core_->BeginWindow();
  core_->StartCollector([this] { Drain(); }, [this] { return stats_; });
}

uint32_t AgentSession::Thread(uint32_t index) {
  auto it = threads_.find(index);
  if (it != threads_.end()) return it->second;
  // A record about a thread whose announcement was lost (a full ring).
  const uint32_t ours = core_->aggregator().AddThread(0, "[thread not announced]");
  threads_.emplace(index, ours);
  return ours;
}

uint64_t AgentSession::LabelId(uint64_t host_id) {
  if (host_id < strings_.size() && strings_[host_id] != kUnknownString) {
    return strings_[host_id];
  }
  return internal::LabelTable::Global().Intern(
      absl::StrCat("[inprof: label ", host_id, " not sent]"));
}

void AgentSession::Apply(const internal::AgentOp& op) {
  using namespace internal;  // NOLINT: the record types
  if (const auto* d = std::get_if<AgentDescribe>(&op)) {
    if (core_ != nullptr) {
      error_ = "a second describe record";
      return;
    }
    StartCore(*d);
    return;
  }
  if (const auto* s = std::get_if<AgentString>(&op)) {
    if (s->id >= LabelTable::kMaxEntries) return;
    if (strings_.size() <= s->id) strings_.resize(s->id + 1, kUnknownString);
    strings_[s->id] = LabelTable::Global().Intern(s->text);
    return;
  }
  if (const auto* e = std::get_if<AgentEngine>(&op)) {
    core_->SetEngineDetail(e->detail);
    return;
  }
  if (std::holds_alternative<AgentEnd>(op)) {
    ended_ = true;
    return;
  }
  std::lock_guard<std::mutex> lock(core_->mutex());
  SampleAggregator& agg = core_->aggregator();
  if (const auto* s = std::get_if<AgentSample>(&op)) {
    // The process's label ids become ours, in our canonical (key) order.
    labels_.clear();
    for (size_t i = 0; i + 1 < s->labels.size(); i += 2) {
      const uint64_t key = s->labels[i];
      const uint64_t numeric = key & kNumericLabel;
      labels_.push_back(numeric | LabelId(key & ~kNumericLabel & 0xffffffffu));
      labels_.push_back(numeric != 0 ? s->labels[i + 1] : LabelId(s->labels[i + 1]));
    }
    for (size_t i = 2; i < labels_.size(); i += 2) {
      for (size_t j = i; j >= 2 && labels_[j - 2] > labels_[j]; j -= 2) {
        std::swap(labels_[j - 2], labels_[j]);
        std::swap(labels_[j - 1], labels_[j + 1]);
      }
    }
    agg.Add(Thread(s->thread), s->frames, labels_, s->value_offset, s->values);
  } else if (const auto* y = std::get_if<AgentSynthetic>(&op)) {
    agg.AddSynthetic(Thread(y->thread), y->frame, y->value_offset, y->values);
  } else if (const auto* t = std::get_if<AgentThreadAdd>(&op)) {
    if (auto it = threads_.find(t->index); it != threads_.end()) {
      agg.RemoveThread(it->second);
      threads_.erase(it);
    }
    threads_.emplace(t->index, agg.AddThread(t->tid, t->name));
  } else if (const auto* n = std::get_if<AgentThreadName>(&op)) {
    agg.SetThreadName(Thread(n->index), n->name);
  } else if (const auto* r = std::get_if<AgentThreadRemove>(&op)) {
    if (auto it = threads_.find(r->index); it != threads_.end()) {
      agg.RemoveThread(it->second);
      threads_.erase(it);
    }
  } else if (const auto* st = std::get_if<AgentStats>(&op)) {
    stats_ = internal::StatsFromCounters(st->counters);
  }
}

absl::Status AgentSession::Finish() {
  Drain();  // what the process wrote before its end
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return absl::OkStatus();
    finished_ = true;  // Drain() does nothing from now on
  }
  if (core_ == nullptr) return absl::OkStatus();
  core_->StopCollector();  // its drain calls return at once now
  ProfilerStats last;
  {
    std::lock_guard<std::mutex> lock(core_->mutex());
    last = stats_;
  }
  absl::Status status = core_->Export(last);
  const LogFunction& log = status.ok() ? log_summary_ : log_;
  if (log) {
    std::lock_guard<std::mutex> lock(mu_);
    log(absl::StrCat("agent: pid ", pid_, " (", hello_.program, "): ",
                      samples_read_, " samples, ", core_->windows_exported(),
                      " profiles", options_.write_output
                                       ? absl::StrCat(" (", options_.output, ")")
                                       : std::string(),
                      ended_ ? "" : "; it ended without stopping its profiler",
                      status.ok() ? "" : "; ",
                      status.ok() ? "" : status.message()));
  }
  return status;
}

}  // namespace inprof::agent
