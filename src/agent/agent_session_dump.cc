// AgentSession's thread dump of its process (agent_session.h: ThreadDump):
// the request goes over the process's socket, the answer comes through its
// ring with the samples, and the pipeline symbolizes and encodes it as a
// process's own endpoint does.
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "src/agent/agent_session.h"

namespace inprof::agent {

using internal::AgentDumpEnd;
using internal::AgentDumpThread;

absl::StatusOr<std::string> AgentSession::ThreadDump(
    absl::string_view type, int debug, const std::function<absl::Status(uint32_t)>& ask) {
  absl::StatusOr<internal::Pipeline*> pipeline = LivePipeline();
  if (!pipeline.ok()) return pipeline.status();
  std::lock_guard<std::mutex> one(dump_one_);
  ask_dump_ = &ask;
  absl::StatusOr<std::string> answer = (*pipeline)->ThreadDump(type, debug);
  ask_dump_ = nullptr;
  return answer;
}

absl::StatusOr<ProfileData> AgentSession::DumpOfProcess() {
  if (ask_dump_ == nullptr) {
    return absl::UnavailableError("a thread dump of the process is asked for by a request");
  }
  uint32_t id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ended_ || finished_) return absl::UnavailableError("the process stopped profiling");
    id = ++dump_ids_;
    if (id == 0) id = ++dump_ids_;  // 0 means none
    dump_id_ = id;
    dump_done_ = false;
    dump_ = ProfileData();
    dump_error_.clear();
  }
  if (absl::Status sent = (*ask_dump_)(id); !sent.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    dump_id_ = 0;
    return absl::UnavailableError(absl::StrCat("the process could not be asked for its "
                                               "threads: ", sent.message()));
  }
  std::unique_lock<std::mutex> lock(mu_);
  const bool answered = dump_cv_.wait_for(lock, absl::ToChronoNanoseconds(kDumpWait), [&] {
    return dump_done_ || ended_ || finished_;
  });
  dump_id_ = 0;
  if (!dump_done_) {
    if (!answered) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the process did not answer the thread dump within ",
          absl::FormatDuration(kDumpWait), " (its collector passes may be stalled)"));
    }
    return absl::UnavailableError("the process stopped profiling before it answered");
  }
  if (!dump_error_.empty()) {
    return absl::UnavailableError(absl::StrCat("the process's dump: ", dump_error_));
  }
  ProfileData data = std::move(dump_);
  dump_ = ProfileData();
  data.comments.push_back(absl::StrCat("thread dump of pid ", pid_, " (", hello_.program,
                                       "), taken in the process, symbolized by the agent"));
  return data;
}

void AgentSession::ApplyDumpOp(const internal::AgentOp& op) {
  if (const auto* t = std::get_if<AgentDumpThread>(&op)) {
    // A request given up on, or more threads than a process may have.
    if (t->request != dump_id_ || dump_done_ || dump_.samples.size() >= kMaxThreads) return;
    dump_.threads.push_back(ThreadIdentity{t->tid, t->name});
    ProfileSample& s = dump_.samples.emplace_back();
    s.thread = static_cast<uint32_t>(dump_.threads.size() - 1);
    s.values = {1};
    s.frames = t->frames;
    s.synthetic_frame = t->synthetic;
    for (const internal::AgentDumpLabel& l : t->labels) {
      s.labels.push_back(SampleLabel{l.key, l.str, l.num, l.numeric});
    }
    return;
  }
  const auto& e = std::get<AgentDumpEnd>(op);
  if (e.request != dump_id_ || dump_done_) return;
  dump_.comments = e.comments;
  dump_error_ = e.error;
  dump_done_ = true;
  dump_cv_.notify_all();
}

}  // namespace inprof::agent
