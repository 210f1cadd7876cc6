// The live thread dump (ProfilerBase::DumpThreads): every registered
// thread's stack now, one sample each, while the program runs on.
//
// How each thread is read, under the registry lock (no visit of the wall
// ticker, no registration meanwhile; a thread that unregisters itself
// waits for its slot's `visiting` to clear, as for a wall visit):
//   - a thread that waits in the kernel: its stack copied from where it
//     waits (/proc/self/task/TID/syscall: its sp and pc; process_vm_readv)
//     and walked from the copy, kept when its CPU clock did not move
//     meanwhile -- no signal, so its wait is not interrupted. Where the
//     unwinder walks no copies (frame pointers with leaf repair), or
//     the copy does not walk to the stack's end, it is signalled as a
//     running one (as the wall sampler signals it then);
//   - a running thread: the profiling signal, whose handler walks its stack
//     into room this call gave it (ThreadSlotHeader::dump_state). All of
//     them are signalled first and waited for together, `wait` at most; a
//     thread that does not answer in time (SIGPROF blocked, stopped by a
//     debugger) is dumped without a stack, on a frame that says so.
// The calling thread, when registered, walks its own stack. Threads that
// never registered are listed too (labelled registered=no): a waiting one
// with its stack read from a copy up to the end of the mapping that holds
// its sp; a running one without a stack. inprof's own (named inprof-*,
// and libmicrohttpd's MHD-* of the endpoint) are left out.
//
// Each sample carries the thread's id and name, its labels, "thread
// state" (running or blocked), and for a blocked thread "syscall" (the
// call it waits in) and "waited ns": how long its CPU clock has not moved,
// as the wall ticker's looks saw it (at least that long, to a round of
// visits; absent before a look found it still).
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "inprof/base/alloc_guard.h"
#include "inprof/internal/label_table.h"
#include "inprof/internal/process_maps.h"
#include "inprof/internal/profiler_base.h"
#include "inprof/internal/thread_info.h"

namespace inprof::internal {

namespace {

// The frames one thread's dump holds at most, and the most of a waiting
// thread's stack copied (from its sp up: a thread's stack is mostly much
// less; a deeper one, whose walk stops at the copy's end, is signalled).
constexpr size_t kDumpFrames = 256;
constexpr size_t kStackReadBytes = 256 * 1024;
// Threads that never registered listed at most (a process of 100,000
// threads dumps the first ones /proc lists).
constexpr size_t kMaxUnregisteredThreads = 100'000;

int64_t MonotonicNanos() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return now.tv_sec * 1'000'000'000LL + now.tv_nsec;
}

// One thread of the dump: its slot (visiting set), its sample, the room
// its frames go to, and whether its handler was asked for them.
struct Dumped {
  SlotBase* slot;
  size_t sample;
  uint64_t* room;
  bool signalled = false;
  bool answered = false;
  bool ended = false;  // its request withdrawn or answered, its mark cleared
};

// A signalled thread's request ended: withdrawn while its handler has not
// taken it, else waited for until the handler has written the room
// (`answered`).
void SettleRequest(Dumped& d) {
  uint32_t asked = ThreadSlotHeader::kDumpAsked;
  if (d.answered || d.slot->dump_state.compare_exchange_strong(asked, ThreadSlotHeader::kDumpIdle,
                                                               std::memory_order_acq_rel)) {
    return;
  }
  while (d.slot->dump_state.load(std::memory_order_acquire) == ThreadSlotHeader::kDumpWriting) {
    sched_yield();
  }
  d.answered = true;
}

// The thread as the dump found it: no request, no room, no mark.
void ReleaseThread(Dumped& d) {
  if (d.signalled) {
    d.slot->dump_state.store(ThreadSlotHeader::kDumpIdle, std::memory_order_relaxed);
    d.slot->dump_frames = nullptr;
    d.slot->dump_capacity = 0;
  }
  d.slot->visiting.store(false, std::memory_order_release);
  d.ended = true;
}

void AddLabel(ProfileSample& sample, std::string key, std::string value) {
  SampleLabel label;
  label.key = std::move(key);
  label.str = std::move(value);
  sample.labels.push_back(std::move(label));
}

// A signalled thread whose handler returns into system call `nr` (the
// kernel restarts it there) waits in it, whatever the look before the
// signal saw: a thread out of its wait for a moment, in the handler of
// another of inprof's signals (the wall sampler's), reads as running.
void LabelWaiting(ProfileSample& sample, int64_t nr) {
  bool has_syscall = false;
  for (SampleLabel& label : sample.labels) {
    if (label.key == kThreadState) label.str = kThreadBlocked;
    has_syscall = has_syscall || label.key == "syscall";
  }
  if (!has_syscall) AddLabel(sample, "syscall", SyscallName(nr));
}

// The thread's own labels (ScopedLabels), read as the wall ticker reads a
// waiting thread's (relaxed loads: a running thread may change them).
void AddThreadLabels(const SlotBase& slot, ProfileSample& sample) {
  uint32_t n = __atomic_load_n(&slot.label_count, __ATOMIC_RELAXED);
  if (n > ThreadSlotHeader::kMaxLabels) n = 0;
  const LabelTable& table = LabelTable::Global();
  for (uint32_t i = 0; i < n; ++i) {
    const uint64_t key = __atomic_load_n(&slot.label_words[2 * i], __ATOMIC_RELAXED);
    const uint64_t value = __atomic_load_n(&slot.label_words[2 * i + 1], __ATOMIC_RELAXED);
    SampleLabel label;
    label.key = table.Lookup(static_cast<uint32_t>(key));
    label.numeric = (key & kNumericLabel) != 0;
    if (label.numeric) {
      label.num = static_cast<int64_t>(value);
    } else {
      label.str = table.Lookup(static_cast<uint32_t>(value));
    }
    sample.labels.push_back(std::move(label));
  }
}

// The name of thread `tid` of this process (its comm), "" when gone.
std::string TaskName(pid_t tid) {
  char buf[64];
  const std::string path = absl::StrCat("/proc/self/task/", tid, "/comm");
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  const ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return "";
  std::string name(buf, static_cast<size_t>(n));
  while (!name.empty() && name.back() == '\n') name.pop_back();
  return name;
}

// This process's thread ids ("/proc/self/task"), at most `limit`.
std::vector<pid_t> TaskIds(size_t limit) {
  std::vector<pid_t> tids;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return tids;
  while (dirent* e = readdir(dir)) {
    pid_t tid = 0;
    if (tids.size() < limit && absl::SimpleAtoi(e->d_name, &tid) && tid > 0) {
      tids.push_back(tid);
    }
  }
  closedir(dir);
  return tids;
}

}  // namespace

absl::StatusOr<ProfileData> ProfilerBase::DumpThreads(absl::Duration wait) {
  AllocGuard guard;  // inprof's allocations, not the host's
  ProfileData data;
  data.sample_types = {{"threads", "count"}};
  data.period_type = {"threads", "count"};
  data.period = 1;
  data.time_nanos = absl::GetCurrentTimeNanos();
  std::unique_lock<std::mutex> lock(registry_->mutex);
  if (!running_) {
    return absl::UnavailableError(
        "the profiler is not running: a thread dump reads the threads registered with a "
        "started profiler");
  }
  if (getpid() != start_pid_) {
    return absl::UnavailableError("a forked child has no registered threads to dump");
  }
  const size_t n = active_.size();
  // The handlers' room: never freed before each handler asked is done.
  std::unique_ptr<uint64_t[]> room = std::make_unique_for_overwrite<uint64_t[]>(
      std::max<size_t>(n, 1) * kDumpFrames);
  std::vector<Dumped> dumped;
  dumped.reserve(n);
  // However the dump ends (the heap full: an exception from any of its
  // allocations), no thread is left marked (its unregistration would wait
  // for ever) or asked to write into `room` after it is freed. Declared
  // after both, so destroyed before them.
  struct EndRequests {
    std::vector<Dumped>& dumped;
    ~EndRequests() {
      for (Dumped& d : dumped) {
        if (d.ended) continue;
        if (d.signalled) SettleRequest(d);
        ReleaseThread(d);
      }
    }
  } end_requests{dumped};
  data.threads.reserve(n);
  data.samples.reserve(n);
  const pid_t self = CurrentTid();
  const int64_t start_ns = MonotonicNanos();
  const int64_t start_cpu_ns = ThreadCpuNanos(CLOCK_THREAD_CPUTIME_ID);
  uint64_t read = 0, signalled = 0, unanswered = 0, small = 0, at_syscall = 0;
  // A waiting thread's stack from `site.sp` up to `hi` (at most
  // kStackReadBytes) copied and walked into `out`; depth 0 when it cannot be.
  std::unique_ptr<uint64_t[]> copy;
  auto walk_copy = [&](const SyscallSite& site, uintptr_t hi,
                       std::span<uintptr_t> out) -> UnwindResult {
    if (shape_.unwind_copy == nullptr || !site.known() || site.nr < 0 || (site.sp & 7) != 0 ||
        site.sp >= hi) {
      return {};
    }
    const size_t bytes = std::min<size_t>(hi - site.sp, kStackReadBytes) & ~size_t{7};
    if (copy == nullptr) copy = std::make_unique_for_overwrite<uint64_t[]>(kStackReadBytes / 8);
    if (bytes == 0 || CopyOwnMemory(start_pid_, site.sp, bytes, copy.get()) != 0) return {};
    return shape_.unwind_copy(site.pc, site.sp,
                              std::span<const uint64_t>(copy.get(), bytes / 8), out);
  };
  for (size_t i = 0; i < n; ++i) {
    SlotBase* slot = active_[i];
    slot->visiting.store(true, std::memory_order_seq_cst);
    if (slot->retiring.load(std::memory_order_seq_cst)) {
      slot->visiting.store(false, std::memory_order_release);
      continue;  // gone or going: its id may be reused
    }
    // In `dumped` at once (room reserved: no throw), so that a dump that
    // throws from here on still ends this thread's request and mark.
    Dumped& d =
        dumped.emplace_back(Dumped{slot, data.samples.size(), room.get() + i * kDumpFrames});
    data.threads.push_back(ThreadIdentity{slot->tid, slot->name});
    ProfileSample& sample = data.samples.emplace_back();
    sample.thread = static_cast<uint32_t>(data.threads.size() - 1);
    sample.values = {1};
    AddThreadLabels(*slot, sample);
    std::span<uintptr_t> out(reinterpret_cast<uintptr_t*>(d.room), kDumpFrames);
    if (slot->tid == self) {
      AddLabel(sample, kThreadState, kThreadRunning);
      const size_t depth = shape_.unwind_here(out);
      sample.frames.assign(d.room, d.room + depth);
      continue;
    }
    const int64_t clock = ThreadCpuNanos(slot->cpu_clock);
    const ThreadLook look = LookAtThread(slot->tid);
    if (look.state == 0 || clock < 0) {
      AddLabel(sample, kThreadState, "ended");
      sample.synthetic_frame = "[inprof: the thread ended without unregistering]";
      continue;
    }
    const bool blocked = look.state != 'R';
    AddLabel(sample, kThreadState, blocked ? kThreadBlocked : kThreadRunning);
    if (blocked && look.site.known() && look.site.nr >= 0) {
      AddLabel(sample, "syscall", SyscallName(look.site.nr));
    }
    if (blocked && slot->still_clock == clock && slot->still_since_ns > 0) {
      SampleLabel waited;
      waited.key = "waited ns";
      waited.num = start_ns - slot->still_since_ns;
      waited.numeric = true;
      sample.labels.push_back(std::move(waited));
    }
    if (blocked && look.site.sp >= slot->stack.lo) {
      const UnwindResult walked = walk_copy(look.site, slot->stack.hi, out);
      // Kept when the thread did not run meanwhile (the copy is its stack)
      // and the walk reached its end (else: signalled, as the wall sampler
      // does).
      if (walked.depth > 0 && (!walked.truncated || walked.depth == kDumpFrames) &&
          ThreadCpuNanos(slot->cpu_clock) == clock) {
        sample.frames.assign(d.room, d.room + walked.depth);
        ++read;
        continue;
      }
    }
    // Its handler walks it: the request first, then the signal.
    slot->dump_frames = d.room;
    slot->dump_capacity = kDumpFrames;
    slot->dump_depth = 0;
    slot->dump_pc = 0;
    slot->dump_nr = -1;
    slot->dump_state.store(ThreadSlotHeader::kDumpAsked, std::memory_order_release);
    SendProfilingSignal(*slot, MakeSignalTag(kDumpSignalProvider, session_));
    d.signalled = true;
    ++signalled;
  }
  // Threads that never registered (inprof's own left out): a waiting one
  // read from a copy of its stack up to the end of the mapping that holds
  // its sp (its bounds are not known), kept when a second look finds it
  // waiting at the same place; a running one named, without a stack (its
  // handler has no slot to serve a request from).
  // Sorted ids (a vector: absl's tables as Debian ships them are left
  // corrupt by a growth that throws, growth_safe_table.h).
  std::vector<pid_t> registered;
  registered.reserve(dumped.size());
  for (const Dumped& d : dumped) registered.push_back(d.slot->tid);
  std::sort(registered.begin(), registered.end());
  std::optional<std::vector<MapsEntry>> maps;
  std::vector<uint64_t> unregistered_room(kDumpFrames);
  uint64_t unregistered = 0, unregistered_read = 0, own = 0;
  for (const pid_t tid : TaskIds(kMaxUnregisteredThreads)) {
    if (std::binary_search(registered.begin(), registered.end(), tid) || tid == self) continue;
    std::string name = TaskName(tid);
    // inprof's own: its threads, and libmicrohttpd's (the endpoint's).
    if (absl::StartsWith(name, "inprof") || absl::StartsWith(name, "MHD-")) {
      ++own;
      continue;
    }
    const ThreadLook look = LookAtThread(tid);
    if (look.state == 0) continue;  // gone meanwhile
    ++unregistered;
    data.threads.push_back(ThreadIdentity{tid, std::move(name)});
    ProfileSample& sample = data.samples.emplace_back();
    sample.thread = static_cast<uint32_t>(data.threads.size() - 1);
    sample.values = {1};
    const bool blocked = look.state != 'R';
    AddLabel(sample, kThreadState, blocked ? kThreadBlocked : kThreadRunning);
    AddLabel(sample, "registered", "no");
    const SyscallSite site = look.site;
    if (blocked && site.known() && site.nr >= 0) AddLabel(sample, "syscall", SyscallName(site.nr));
    if (blocked && shape_.unwind_copy != nullptr && site.known()) {
      if (!maps) {
        absl::StatusOr<std::vector<MapsEntry>> read_maps = ReadProcessMaps(getpid());
        maps = read_maps.ok() ? *std::move(read_maps) : std::vector<MapsEntry>();
      }
      for (const MapsEntry& m : *maps) {
        if (site.sp < m.start || site.sp >= m.limit || !m.readable) continue;
        const UnwindResult walked = walk_copy(
            site, m.limit,
            std::span<uintptr_t>(reinterpret_cast<uintptr_t*>(unregistered_room.data()),
                                 kDumpFrames));
        const ThreadLook again = LookAtThread(tid);
        if (walked.depth > 0 && again.state != 'R' && again.site == site) {
          sample.frames.assign(unregistered_room.begin(),
                               unregistered_room.begin() + walked.depth);
          ++unregistered_read;
        }
        break;
      }
    }
    if (sample.frames.empty()) {
      sample.synthetic_frame = blocked
                                   ? "[inprof: a thread that never registered: stack not read]"
                                   : "[inprof: a thread that never registered, running: no "
                                     "stack without a registration]";
    }
  }
  // The signalled threads' answers, together.
  const int64_t deadline = start_ns + absl::ToInt64Nanoseconds(wait);
  for (bool waiting = signalled > 0; waiting;) {
    waiting = false;
    for (Dumped& d : dumped) {
      if (!d.signalled || d.answered) continue;
      const uint32_t state = d.slot->dump_state.load(std::memory_order_acquire);
      if (state == ThreadSlotHeader::kDumpDone || state == ThreadSlotHeader::kDumpNoStack) {
        d.answered = true;
      } else {
        waiting = true;
      }
    }
    if (!waiting || MonotonicNanos() >= deadline) break;
    timespec pause{0, 50'000};
    nanosleep(&pause, nullptr);
  }
  for (Dumped& d : dumped) {
    ProfileSample& sample = data.samples[d.sample];
    if (d.signalled) {
      SettleRequest(d);
      const uint32_t state = d.slot->dump_state.load(std::memory_order_acquire);
      if (!d.answered) {
        ++unanswered;
        sample.synthetic_frame = "[inprof: the thread did not answer the dump's signal]";
      } else if (state == ThreadSlotHeader::kDumpNoStack) {
        ++small;
        sample.synthetic_frame = kSmallStackFrame;
      } else {
        const size_t depth = std::min<size_t>(d.slot->dump_depth, kDumpFrames);
        sample.frames.assign(d.room, d.room + depth);
      }
      const int64_t nr =
          d.answered ? SyscallAt(start_pid_, d.slot->dump_pc, d.slot->dump_nr) : -1;
      if (nr >= 0) {
        ++at_syscall;
        LabelWaiting(sample, nr);
      }
    }
    if (sample.frames.empty() && sample.synthetic_frame.empty()) {
      sample.synthetic_frame = "[inprof: no frame could be walked]";
    }
    ReleaseThread(d);
  }
  const int64_t took_ns = MonotonicNanos() - start_ns;
  const int64_t cpu_ns = ThreadCpuNanos(CLOCK_THREAD_CPUTIME_ID) - start_cpu_ns;
  lock.unlock();
  data.duration_nanos = took_ns;
  data.comments.push_back(absl::StrCat(
      "thread dump: ", data.samples.size() - unregistered, " registered threads in ",
      absl::FormatDuration(absl::Nanoseconds(took_ns)), " (",
      absl::FormatDuration(absl::Nanoseconds(cpu_ns)),
      " of the dumping thread's CPU); waiting threads read from a copy "
      "of their stack (not signalled)=", read, ", threads signalled=", signalled,
      ", of them not answering within ", absl::FormatDuration(wait), "=", unanswered,
      ", on a small or foreign stack=", small, "; threads that never registered=",
      unregistered, " (stacks read of those waiting=", unregistered_read,
      "), inprof's own threads (left out)=", own,
      "; signalled threads whose handler returns into a system call (labelled blocked in it)=",
      at_syscall));
  return data;
}

}  // namespace inprof::internal
