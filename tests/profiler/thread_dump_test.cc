// Tests of the live thread dump (ProfilerBase::DumpThreads, served as
// /debug/pprof/threads and /goroutine): each thread once, where the test
// put it -- blocked in read() or on a condition variable, or running --
// with its name, state, system call and labels; waiting threads read
// without a signal, one that never registered too; a thread that cannot
// answer does not hold the dump up; the signal handed over and `inprof
// stacks`. Every assertion is on where the test itself put its threads:
// deterministic.
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inprof/inprof.h"
#include "inprof/internal/label_table.h"
#include "inprof/pprof_reader.h"
#include "util/test_util.h"

namespace inprof {
namespace {

using DumpProfiler = Profiler<DefaultUnwinder, DefaultSampleRing, CpuTimeProvider,
                              WallTimeProvider>;

// Where the threads are. noinline, and each keeps a frame of its own.
__attribute__((noinline)) ssize_t BlockedInRead(int fd) {
  char c;
  const ssize_t n = read(fd, &c, 1);
  asm volatile("" ::: "memory");
  return n;
}
__attribute__((noinline)) void WaitOnCondition(std::mutex& m, std::condition_variable& cv,
                                               const bool& go) {
  std::unique_lock<std::mutex> lock(m);
  cv.wait(lock, [&] { return go; });
  asm volatile("" ::: "memory");
}
__attribute__((noinline)) void SpinUntilStopped(const std::atomic<bool>& stop) {
  while (!stop.load(std::memory_order_relaxed)) {
#if defined(INPROF_TSAN)
    // TSan delivers a signal at the thread's next call it intercepts.
    usleep(1);
#endif
    asm volatile("" ::: "memory");
  }
  asm volatile("" ::: "memory");
}

Options TestOptions(const std::string& name) {
  Options options;
  options.output = testing::FreshTestDir(name) + "/profile.pb.gz";
  options.http_addr = "127.0.0.1:0";
  options.export_period = absl::ZeroDuration();
  return options;
}

// A registered thread blocked in read() on a pipe of its own while the
// object lives.
class Sleeper {
 public:
  Sleeper(DumpProfiler& profiler, const std::string& name) {
    EXPECT_EQ(pipe(fds_), 0);
    std::atomic<bool> ready{false};
    thread_ = std::thread([&] {
      auto registration = profiler.RegisterThread(name);
      tid_.store(static_cast<pid_t>(syscall(SYS_gettid)));
      ready.store(true);
      EXPECT_EQ(BlockedInRead(fds_[0]), 1);
    });
    while (!ready.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // Whether it is in read() now (/proc's syscall file starts with the
  // call's number while the thread waits in it).
  bool InRead() const {
    std::ifstream in(absl::StrCat("/proc/self/task/", tid_.load(), "/syscall"));
    long number = -1;
    return static_cast<bool>(in >> number) && number == SYS_read;
  }
  // Waits until it is (5 s at most); whether it is.
  bool WaitInRead() const {
    for (int i = 0; i < 5000 && !InRead(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return InRead();
  }
  pid_t tid() const { return tid_.load(); }
  ~Sleeper() {
    EXPECT_EQ(write(fds_[1], "x", 1), 1);
    thread_.join();
    close(fds_[0]);
    close(fds_[1]);
  }

 private:
  int fds_[2] = {-1, -1};
  std::atomic<pid_t> tid_{0};
  std::thread thread_;
};

bool StackHas(const DecodedProfile::Sample& s, const std::string& function) {
  for (const std::string& f : s.stack) {
    if (absl::StrContains(f, function)) return true;
  }
  return false;
}

std::string Label(const DecodedProfile::Sample& s, const std::string& key) {
  auto it = s.str_labels.find(key);
  return it == s.str_labels.end() ? "" : it->second;
}

// Three threads blocked in read() on a pipe, one on a condition variable,
// two running, the calling thread, and one blocked in read() that never
// registered: each once, at its function, in its state; the blocked ones
// read from a copy of their stack (not signalled) and, once the wall
// sampler looked at them, with how long they waited.
TEST(ThreadDumpTest, EveryThreadOnceWhereItIs) {
  DumpProfiler profiler(TestOptions("thread_dump"));
  ASSERT_TRUE(profiler.Start().ok());
  auto self = profiler.RegisterThread("dumper");
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  std::atomic<bool> stop{false};
  std::atomic<int> ready{0};
  std::mutex m;
  std::condition_variable cv;
  bool go = false;
  std::vector<std::thread> threads;
  const int64_t blocked_from_ns = absl::GetCurrentTimeNanos();
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      auto registration = profiler.RegisterThread(absl::StrCat("sleeper-", i));
      ScopedLabels labels({{"role", "sleeper"}});
      ready.fetch_add(1);
      EXPECT_EQ(BlockedInRead(pipe_fds[0]), 1);
    });
  }
  // One that never registers: read from a copy of its stack all the same.
  threads.emplace_back([&] {
    pthread_setname_np(pthread_self(), "unregistered");
    ready.fetch_add(1);
    EXPECT_EQ(BlockedInRead(pipe_fds[0]), 1);
  });
  threads.emplace_back([&] {
    auto registration = profiler.RegisterThread("waiter");
    ready.fetch_add(1);
    WaitOnCondition(m, cv, go);
  });
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      auto registration = profiler.RegisterThread(absl::StrCat("spinner-", i));
      ready.fetch_add(1);
      SpinUntilStopped(stop);
    });
  }
  while (ready.load() < 7) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const std::string address = profiler.http_address();
  ASSERT_FALSE(address.empty());
  // The unwinder's tables first (built after Start(), slower at -O0 under a
  // sanitizer): before them a walk from a copy takes frame-pointer steps
  // only, and stops at the first frame without one (a sanitizer's read()
  // interceptor), so the dump signals the thread instead.
  if constexpr (requires { DefaultUnwinder::TablesReady(); }) {
    for (int i = 0; i < 6000 && !DefaultUnwinder::TablesReady(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_TRUE(DefaultUnwinder::TablesReady()) << "the unwind tables within 60 s";
  }
  // Dumped until the wall sampler has looked at every blocked thread (its
  // "waited ns"), 20 s at most: the ticker visits each thread every round.
  DecodedProfile dump;
  std::string text;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    testing::HttpReply reply = testing::HttpFetch(address, "GET", "/debug/pprof/threads");
    ASSERT_EQ(reply.status, 200) << reply.body;
    absl::StatusOr<DecodedProfile> p = DecodePprof(reply.body);
    ASSERT_TRUE(p.ok()) << p.status();
    int waited = 0;
    for (const auto& s : p->samples) waited += s.num_labels.contains("waited ns");
    dump = *std::move(p);
    if (waited >= 4 || std::chrono::steady_clock::now() > deadline) break;
  }
  const int64_t dumped_by_ns = absl::GetCurrentTimeNanos();
  testing::HttpReply text_reply =
      testing::HttpFetch(address, "GET", "/debug/pprof/threads?debug=2");
  testing::HttpReply goroutine = testing::HttpFetch(address, "GET", "/debug/pprof/goroutine");
  testing::HttpReply grouped =
      testing::HttpFetch(address, "GET", "/debug/pprof/goroutine?debug=1");
  stop.store(true);
  {
    std::lock_guard<std::mutex> lock(m);
    go = true;
  }
  cv.notify_all();
  ASSERT_EQ(write(pipe_fds[1], "wxyz", 4), 4);
  for (std::thread& t : threads) t.join();
  close(pipe_fds[0]);
  close(pipe_fds[1]);
  self = ThreadRegistration();
  ASSERT_TRUE(profiler.Stop().ok());

  ASSERT_EQ(dump.sample_types.size(), 1u);
  EXPECT_EQ(dump.sample_types[0].type, "threads");
  // Threads of the runtime's (a sanitizer's, one starting or ending) may
  // be there too, never registered: only this test's are looked at.
  auto ours = [](const DecodedProfile::Sample& s) {
    return Label(s, "registered") != "no" || Label(s, "thread name") == "unregistered";
  };
  std::vector<std::string> names;
  for (const auto& s : dump.samples) {
    if (!ours(s)) continue;
    SCOPED_TRACE(Label(s, "thread name"));
    names.push_back(Label(s, "thread name"));
    EXPECT_EQ(s.values, std::vector<int64_t>{1});
    EXPECT_GT(s.num_labels.at("thread id"), 0);
    const std::string name = Label(s, "thread name");
    if (absl::StartsWith(name, "sleeper-")) {
      EXPECT_TRUE(StackHas(s, "BlockedInRead")) << absl::StrJoin(s.stack, " <- ");
      EXPECT_EQ(Label(s, "thread state"), "blocked");
      EXPECT_EQ(Label(s, "syscall"), "read");
      EXPECT_EQ(Label(s, "role"), "sleeper");
    } else if (name == "unregistered") {
#if defined(INPROF_ASAN)
      // A walk from a copy stops in ASan's read() interceptor (the wall
      // sampler then signals a registered thread; this one has no slot).
      EXPECT_TRUE(StackHas(s, "read")) << absl::StrJoin(s.stack, " <- ");
#else
      EXPECT_TRUE(StackHas(s, "BlockedInRead")) << absl::StrJoin(s.stack, " <- ");
#endif
      EXPECT_EQ(Label(s, "thread state"), "blocked");
      EXPECT_EQ(Label(s, "syscall"), "read");
      EXPECT_EQ(Label(s, "registered"), "no");
    } else if (name == "waiter") {
      EXPECT_TRUE(StackHas(s, "WaitOnCondition")) << absl::StrJoin(s.stack, " <- ");
      EXPECT_EQ(Label(s, "thread state"), "blocked");
      EXPECT_EQ(Label(s, "syscall"), "futex");
    } else if (absl::StartsWith(name, "spinner-")) {
      EXPECT_TRUE(StackHas(s, "SpinUntilStopped")) << absl::StrJoin(s.stack, " <- ");
#if !defined(INPROF_TSAN)  // there it sleeps a microsecond a round
      EXPECT_EQ(Label(s, "thread state"), "running");
      EXPECT_FALSE(s.num_labels.contains("waited ns"));
#endif
    } else {
      // The endpoint's thread dumps; this one waits for its answer.
      EXPECT_EQ(name, "dumper");
      EXPECT_TRUE(StackHas(s, "HttpFetch")) << absl::StrJoin(s.stack, " <- ");
      EXPECT_TRUE(StackHas(s, "EveryThreadOnceWhereItIs")) << absl::StrJoin(s.stack, " <- ");
      // It sends the request, then waits for the answer: the dump may be
      // taken before it reaches that wait, or while it waits for a core
      // after sending (a clean-clone ASan run, its builds beside it:
      // "running"). Where it is, the stack above, is what is certain.
      EXPECT_THAT(Label(s, "thread state"), ::testing::AnyOf("blocked", "running"));
    }
    if (auto it = s.num_labels.find("waited ns"); it != s.num_labels.end()) {
      // Since the first look that found it still: after it blocked.
      EXPECT_GE(it->second, 0);
      EXPECT_LE(it->second, dumped_by_ns - blocked_from_ns);
    }
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"dumper", "sleeper-0", "sleeper-1", "sleeper-2",
                                             "spinner-0", "spinner-1", "unregistered",
                                             "waiter"}));
  int waited = 0;
  for (const auto& s : dump.samples) waited += s.num_labels.contains("waited ns");
  EXPECT_GE(waited, 4) << "the wall sampler looked at each blocked thread within 20 s";
  std::string comments = absl::StrJoin(dump.comments, "\n");
#if !defined(INPROF_TSAN) && !defined(INPROF_ASAN)
  // The four threads that wait for the whole test read from copies of
  // their stacks, the two running ones signalled. This one is read too when
  // the dump finds it waiting in recv and it does not run during the read;
  // it may not have reached its wait, or be woken meanwhile (a clean-clone
  // run beside the sanitizer builds: 4 read, 3 signalled), and is
  // signalled then -- always when the dump labels it running.
  bool dumper_ran = false;
  for (const auto& s : dump.samples) {
    if (Label(s, "thread name") == "dumper") dumper_ran = Label(s, "thread state") == "running";
  }
  const bool dumper_read = absl::StrContains(comments, "(not signalled)=5, threads signalled=2,");
  EXPECT_TRUE(dumper_read ||
              absl::StrContains(comments, "(not signalled)=4, threads signalled=3,"))
      << comments;
  EXPECT_FALSE(dumper_read && dumper_ran) << comments;
#endif
  EXPECT_TRUE(absl::StrContains(comments, "within 1s=0,")) << comments;
  EXPECT_TRUE(absl::StrContains(comments, "threads that never registered=")) << comments;

  ASSERT_EQ(text_reply.status, 200) << text_reply.body;
  text = text_reply.body;
  EXPECT_TRUE(absl::StrContains(text, "\"sleeper-1\" [blocked in read")) << text;
  EXPECT_TRUE(absl::StrContains(text, "\"waiter\" [blocked in futex")) << text;
#if !defined(INPROF_TSAN)  // there it sleeps a microsecond a round
  EXPECT_TRUE(absl::StrContains(text, "\"spinner-0\" [running]:")) << text;
#endif
  EXPECT_TRUE(absl::StrContains(text, "labels: {role=sleeper}")) << text;
  EXPECT_TRUE(absl::StrContains(text, "BlockedInRead(int)\n\t")) << text;
  EXPECT_TRUE(absl::StrContains(text, "thread_dump_test.cc:")) << text;

  // debug=1, as Go groups its goroutines: the three sleepers, one stack
  // and one label set, are one group of 3, the largest, named by their ids.
  ASSERT_EQ(grouped.status, 200) << grouped.body;
  const size_t head = grouped.body.find("goroutine profile: total ");
  ASSERT_NE(head, std::string::npos) << grouped.body;
  const size_t first_group = grouped.body.find('\n', head) + 1;
  EXPECT_EQ(grouped.body.substr(first_group, 6), "3 @ 0x") << grouped.body;
  EXPECT_TRUE(absl::StrContains(grouped.body, "# labels: {role=sleeper}\n# threads: "))
      << grouped.body;
  EXPECT_TRUE(absl::StrContains(grouped.body, "# state: blocked in read (3)\n")) << grouped.body;
  EXPECT_TRUE(absl::StrContains(grouped.body, "BlockedInRead(int)\t")) << grouped.body;
  EXPECT_FALSE(absl::StrContains(grouped.body, "\n4 @ ")) << grouped.body;

  ASSERT_EQ(goroutine.status, 200) << goroutine.body;
  absl::StatusOr<DecodedProfile> g = DecodePprof(goroutine.body);
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_EQ(g->sample_types.size(), 1u);
  EXPECT_EQ(g->sample_types[0].type, "goroutine");
  EXPECT_EQ(absl::c_count_if(g->samples, ours), 8);
}

// A thread that blocks SIGPROF after registering cannot answer the dump's
// signal: it is dumped without a stack, on a frame that says so, after the
// dump's wait and no later; the other threads are dumped as usual.
TEST(ThreadDumpTest, AThreadThatCannotAnswerDoesNotHoldTheDumpUp) {
  DumpProfiler profiler(TestOptions("thread_dump_masked"));
  ASSERT_TRUE(profiler.Start().ok());
  std::atomic<bool> stop{false};
  std::atomic<int> ready{0};
  std::thread masked([&] {
    auto registration = profiler.RegisterThread("masked");
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPROF);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    ready.fetch_add(1);
    SpinUntilStopped(stop);
    // Its pending signals are taken as it unregisters (unblocked first).
    pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  });
  std::thread spinner([&] {
    auto registration = profiler.RegisterThread("spinner");
    ready.fetch_add(1);
    SpinUntilStopped(stop);
  });
  while (ready.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const auto before = std::chrono::steady_clock::now();
  absl::StatusOr<ProfileData> dump = profiler.DumpThreads(absl::Milliseconds(100));
  const auto took = std::chrono::steady_clock::now() - before;
  stop.store(true);
  masked.join();
  spinner.join();
  ASSERT_TRUE(profiler.Stop().ok());
  ASSERT_TRUE(dump.ok()) << dump.status();
  int registered = 0;
  for (const ProfileSample& s : dump->samples) {
    // The runtime's own threads (a sanitizer's) never registered.
    if (absl::c_any_of(s.labels, [](const SampleLabel& l) { return l.key == "registered"; })) {
      continue;
    }
    ++registered;
    const std::string& name = dump->threads[s.thread].name;
    if (name == "masked") {
      EXPECT_EQ(s.synthetic_frame, "[inprof: the thread did not answer the dump's signal]");
      EXPECT_TRUE(s.frames.empty());
    } else {
      EXPECT_EQ(name, "spinner");
      EXPECT_TRUE(s.synthetic_frame.empty()) << s.synthetic_frame;
      EXPECT_FALSE(s.frames.empty());
    }
  }
  EXPECT_EQ(registered, 2);
  // The wait (100 ms), and not much more: 10 s is the time a machine
  // stalled for seconds still passes in; a dump that waits forever fails.
  EXPECT_LT(took, std::chrono::seconds(10));
  EXPECT_TRUE(absl::StrContains(dump->comments.back(), "within 100ms=1,"))
      << dump->comments.back();
}

// A registered thread that ended while its registration lived on (it is
// destroyed elsewhere, later): dumped once, without a stack, on the frame
// that says so and in state "ended"; a thread still there beside it as
// usual. Deterministic: the dump begins after the ended thread's entry in
// /proc is gone and the other thread is in read().
TEST(ThreadDumpTest, AThreadThatEndedWithoutUnregisteringIsSaidSo) {
  DumpProfiler profiler(TestOptions("thread_dump_ended"));
  ASSERT_TRUE(profiler.Start().ok());
  ThreadRegistration outlived;
  std::atomic<pid_t> tid{0};
  std::thread gone([&] {
    outlived = profiler.RegisterThread("gone");
    tid.store(static_cast<pid_t>(syscall(SYS_gettid)));
  });
  gone.join();
  ASSERT_TRUE(outlived.active());
  const std::string task = absl::StrCat("/proc/self/task/", tid.load());
  for (int i = 0; i < 5000 && access(task.c_str(), F_OK) == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_NE(access(task.c_str(), F_OK), 0) << task << " still there after 5 s";
  std::optional<Sleeper> sleeper;
  sleeper.emplace(profiler, "still here");
  ASSERT_TRUE(sleeper->WaitInRead()) << "the sleeper in read() within 5 s";
  absl::StatusOr<ProfileData> dump = profiler.DumpThreads();
  sleeper.reset();
  outlived = ThreadRegistration();  // unregistered here, on another thread
  ASSERT_TRUE(profiler.Stop().ok());
  ASSERT_TRUE(dump.ok()) << dump.status();
  int seen_gone = 0, seen_sleeper = 0;
  for (const ProfileSample& s : dump->samples) {
    const std::string& name = dump->threads[s.thread].name;
    std::string state;
    for (const SampleLabel& l : s.labels) {
      if (l.key == internal::kThreadState) state = l.str;
    }
    if (name == "gone") {
      ++seen_gone;
      EXPECT_EQ(dump->threads[s.thread].tid, tid.load());
      EXPECT_EQ(s.synthetic_frame, "[inprof: the thread ended without unregistering]");
      EXPECT_TRUE(s.frames.empty());
      EXPECT_EQ(state, "ended");
    } else if (name == "still here") {
      ++seen_sleeper;
      EXPECT_TRUE(s.synthetic_frame.empty()) << s.synthetic_frame;
      EXPECT_FALSE(s.frames.empty());
      EXPECT_EQ(state, internal::kThreadBlocked);
    }
  }
  EXPECT_EQ(seen_gone, 1);
  EXPECT_EQ(seen_sleeper, 1);
}

// A handler of the program's that holds a thread out of its read() (the
// kernel restarts the call after it: SA_RESTART), every signal blocked
// meanwhile, until told to return.
std::atomic<bool> g_in_handler{false};
std::atomic<bool> g_release_handler{false};
void HoldingHandler(int) {
  g_in_handler.store(true);
  while (!g_release_handler.load()) asm volatile("" ::: "memory");
}

// Signals pending for thread `tid` (/proc's SigPnd), 0 when unreadable.
uint64_t PendingSignals(pid_t tid) {
  std::ifstream in(absl::StrCat("/proc/self/task/", tid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "SigPnd:")) return std::stoull(line.substr(7), nullptr, 16);
  }
  return 0;
}

// A thread the dump finds running, taken out of its wait for a moment by a
// handler (as the wall sampler's takes a thread whose stack it cannot copy),
// is still waiting: the dump's signal, held until that handler returns, is
// handled where the kernel restarts the call, and the dump says "blocked",
// in read, from its stack there. Deterministic: the dump looks while the
// handler holds the thread (/proc: running) and lets it go only once the
// dump's signal is pending.
TEST(ThreadDumpTest, AThreadOutOfItsWaitInAHandlerIsDumpedWaiting) {
#if defined(INPROF_TSAN)
  GTEST_SKIP() << "TSan defers a signal to a thread blocked in read() until the call returns: "
                  "no handler takes the thread out of its wait";
#else
  Options options = TestOptions("thread_dump_restart");
  options.http_addr.clear();
  // No other signal of inprof's: no wall visits, and a CPU period the
  // handler's spin (5 s at most) never reaches.
  options.wall_period = absl::ZeroDuration();
  options.cpu_period = absl::Hours(1);
  DumpProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  struct sigaction holding {}, saved {};
  holding.sa_handler = &HoldingHandler;
  holding.sa_flags = SA_RESTART;
  sigfillset(&holding.sa_mask);
  ASSERT_EQ(sigaction(SIGUSR1, &holding, &saved), 0);
  g_in_handler.store(false);
  g_release_handler.store(false);
  std::optional<Sleeper> sleeper;
  sleeper.emplace(profiler, "held");
  ASSERT_TRUE(sleeper->WaitInRead()) << "the sleeper in read() within 5 s";
  const pid_t tid = sleeper->tid();
  ASSERT_EQ(syscall(SYS_tgkill, getpid(), tid, SIGUSR1), 0);
  for (int i = 0; i < 5000 && !g_in_handler.load(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(g_in_handler.load()) << "the handler ran within 5 s";
  // The handler returns once a signal is pending for the thread: the
  // dump's, the only one inprof sends here.
  std::thread releaser([&] {
    for (int i = 0; i < 5000 && PendingSignals(tid) == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    g_release_handler.store(true);
  });
  absl::StatusOr<ProfileData> dump = profiler.DumpThreads(absl::Seconds(10));
  releaser.join();
  sleeper.reset();
  ASSERT_EQ(sigaction(SIGUSR1, &saved, nullptr), 0);
  ASSERT_TRUE(profiler.Stop().ok());
  ASSERT_TRUE(dump.ok()) << dump.status();
  const std::string comments = absl::StrJoin(dump->comments, "\n");
  int seen = 0;
  for (const ProfileSample& s : dump->samples) {
    if (dump->threads[s.thread].name != "held") continue;
    ++seen;
    std::string state, call;
    for (const SampleLabel& l : s.labels) {
      if (l.key == internal::kThreadState) state = l.str;
      if (l.key == "syscall") call = l.str;
    }
    EXPECT_EQ(state, internal::kThreadBlocked) << comments;
    EXPECT_EQ(call, "read") << comments;
    EXPECT_TRUE(s.synthetic_frame.empty()) << s.synthetic_frame;
    // Walked from where the call is restarted: through BlockedInRead.
    const auto fn = reinterpret_cast<uintptr_t>(&BlockedInRead);
    EXPECT_TRUE(absl::c_any_of(s.frames, [&](uint64_t pc) { return pc > fn && pc < fn + 256; }))
        << s.frames.size() << " frames";
  }
  EXPECT_EQ(seen, 1);
  EXPECT_TRUE(absl::StrContains(comments, "threads signalled=1,")) << comments;
  EXPECT_TRUE(absl::StrContains(comments, "(labelled blocked in it)=1")) << comments;
#endif
}

// The stderr of this process redirected to a file while it lives, and
// what was written there.
class CapturedStderr {
 public:
  explicit CapturedStderr(const std::string& path) : path_(path) {
    std::fflush(stderr);
    saved_ = dup(STDERR_FILENO);
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, STDERR_FILENO);
    close(fd);
  }
  ~CapturedStderr() {
    std::fflush(stderr);
    dup2(saved_, STDERR_FILENO);
    close(saved_);
  }
  std::string Text() const {
    std::ifstream in(path_);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

 private:
  std::string path_;
  int saved_ = -1;
};

std::atomic<int> g_program_handler_calls{0};
void ProgramsOwnHandler(int) { g_program_handler_calls.fetch_add(1); }

// INPROF_DUMP_SIGNAL: the signal handed over writes the dump's text to
// stderr, and the program runs on; after Stop() the signal's disposition
// is the program's again. A signal the program handles itself stays its
// own: one line, no dump.
TEST(ThreadDumpTest, TheSignalHandedOverDumpsToStderr) {
  const std::string dir = testing::FreshTestDir("thread_dump_signal");
  Options options = TestOptions("thread_dump_signal");
  options.http_addr.clear();
  options.dump_signal = SIGUSR2;
  // No wall sampler: this test is about the signal; EveryThreadOnceWhereItIs
  // is about the states (a visit that signals the sleeper had the dump label
  // it running, 5 runs in 250 beside three busy loops under ASan, before the
  // dump read the handler's context: AThreadOutOfItsWaitInAHandler...).
  options.wall_period = absl::ZeroDuration();
  std::string text;
  {
    CapturedStderr captured(dir + "/stderr.txt");
    DumpProfiler profiler(options);
    ASSERT_TRUE(profiler.Start().ok());
    auto sleeper = std::make_unique<Sleeper>(profiler, "sleeper");
    ASSERT_TRUE(sleeper->WaitInRead()) << "the sleeper in read() within 5 s";
    ASSERT_EQ(kill(getpid(), SIGUSR2), 0);
    // Written by inprof's thread: 20 s at most.
    for (int i = 0; i < 2000 && !absl::StrContains(captured.Text(), "\n\nthread "); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    sleeper.reset();
    ASSERT_TRUE(profiler.Stop().ok());
    text = captured.Text();
  }
  EXPECT_TRUE(absl::StrContains(text, absl::StrCat("thread dumps on ", strsignal(SIGUSR2))))
      << text;
  EXPECT_TRUE(absl::StrContains(text, "inprof: thread dump on ")) << text;
  EXPECT_TRUE(absl::StrContains(text, "\"sleeper\" [blocked in read")) << text;
  EXPECT_TRUE(absl::StrContains(text, "BlockedInRead(int)")) << text;
  // Stopped: SIGUSR2 is the program's again (default: it would end it).
  struct sigaction now {};
  ASSERT_EQ(sigaction(SIGUSR2, nullptr, &now), 0);
  EXPECT_EQ(now.sa_handler, SIG_DFL);

  // The program's own handler: left alone, and it gets the signal.
  g_program_handler_calls.store(0);  // from this run's signal only (--gtest_repeat)
  struct sigaction own {};
  own.sa_handler = &ProgramsOwnHandler;
  sigemptyset(&own.sa_mask);
  ASSERT_EQ(sigaction(SIGUSR2, &own, nullptr), 0);
  {
    CapturedStderr captured(dir + "/stderr_own.txt");
    DumpProfiler profiler(options);
    ASSERT_TRUE(profiler.Start().ok());
    ASSERT_EQ(kill(getpid(), SIGUSR2), 0);
    ASSERT_TRUE(profiler.Stop().ok());
    text = captured.Text();
  }
  EXPECT_EQ(g_program_handler_calls.load(), 1);
  EXPECT_TRUE(absl::StrContains(text, "the program handles")) << text;
  EXPECT_FALSE(absl::StrContains(text, "inprof: thread dump on ")) << text;
  signal(SIGUSR2, SIG_DFL);
}

// `inprof stacks PID`: the endpoint found among the process's listening
// sockets (this process's, served from a table of inprof's), and its text.
TEST(ThreadDumpTest, InprofStacksFindsTheEndpointOfAPid) {
  const char* cli = std::getenv("INPROF_CLI");
  if (cli == nullptr) GTEST_SKIP() << "INPROF_CLI is not set (run through meson test)";
  Options options = TestOptions("thread_dump_cli");
  // No wall sampler, for the reason TheSignalHandedOverDumpsToStderr gives.
  options.wall_period = absl::ZeroDuration();
  DumpProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  auto sleeper = std::make_unique<Sleeper>(profiler, "cli-sleeper");
  ASSERT_TRUE(sleeper->WaitInRead()) << "the sleeper in read() within 5 s";
  absl::StatusOr<testing::CommandOutput> out =
      testing::RunCommandSeparately(absl::StrCat(cli, " stacks ", getpid()));
  absl::StatusOr<testing::CommandOutput> none =
      testing::RunCommandSeparately(absl::StrCat(cli, " stacks 1"));
  sleeper.reset();
  ASSERT_TRUE(profiler.Stop().ok());
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->exit_code, 0) << out->err;
  EXPECT_TRUE(absl::StrContains(out->out, "\"cli-sleeper\" [blocked in read")) << out->out;
  EXPECT_TRUE(absl::StrContains(out->out, "BlockedInRead(int)")) << out->out;
  // Process 1 (init) serves no endpoint, or is another user's: one line.
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->exit_code, 1);
  EXPECT_TRUE(absl::StartsWith(none->err, "inprof stacks: ")) << none->err;
  EXPECT_EQ(std::count(none->err.begin(), none->err.end(), '\n'), 1) << none->err;
}

// Before Start() there is no thread to read: one clear error.
TEST(ThreadDumpTest, BeforeStartIsAnError) {
  DumpProfiler profiler(TestOptions("thread_dump_stopped"));
  absl::StatusOr<ProfileData> dump = profiler.DumpThreads();
  ASSERT_FALSE(dump.ok());
  EXPECT_EQ(dump.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(dump.status().message(), "not running"));
}

}  // namespace
}  // namespace inprof
