// Library mode end to end: programs that link inprof
// (tests/agent/agent_workload.cc) forward their samples to an agent, which
// writes one profile per process; read back with go tool pprof. And the
// faults: a process that dies, an agent that is killed and restarted, no
// agent at all, a ring with garbage in it, and `inprof run --agent`.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inprof/internal/agent_protocol.h"
#include "inprof/internal/agent_stream.h"
#include "inprof/base/sanitizers.h"
#include "inprof/pprof_reader.h"
#include "src/agent/agent_server.h"
#include "tests/util/test_util.h"

namespace inprof::agent {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

std::mutex g_log_mu;
std::string g_log;
void CaptureLog(const std::string& line) {
  std::lock_guard<std::mutex> lock(g_log_mu);
  g_log += line + "\n";
}
std::string Log() {
  std::lock_guard<std::mutex> lock(g_log_mu);
  return g_log;
}

template <typename Pred>
bool Eventually(Pred pred, int seconds = 20) {
  for (int i = 0; i < seconds * 100; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

// The sum of `type` over the samples of `p` whose stack names `function`
// (-1: `p` has no such type).
int64_t SumAt(const DecodedProfile& p, const char* type, const char* function) {
  const int index = p.ValueIndex(type);
  if (index < 0) return -1;
  int64_t sum = 0;
  for (const DecodedProfile::Sample& s : p.samples) {
    if (std::any_of(s.stack.begin(), s.stack.end(),
                    [&](const std::string& f) { return absl::StrContains(f, function); })) {
      sum += s.values[index];
    }
  }
  return sum;
}

// Asks the agent's endpoint `http` for `path` until `done` says its page is
// whole (20 s at most, 50 ms apart); a 503 (the process has not described
// its profile yet) is asked again. The last page read, or why there is
// none (another status, or no pprof).
absl::StatusOr<DecodedProfile> PollPage(const std::string& http, const std::string& path,
                                        const std::function<bool(const DecodedProfile&)>& done) {
  const auto give_up = absl::Now() + absl::Seconds(20);
  absl::StatusOr<DecodedProfile> last = absl::UnavailableError(path + ": 503 for 20 s");
  while (absl::Now() < give_up) {
    testing::HttpReply page = testing::HttpFetch(http, "GET", path);
    if (page.status == 200) {
      last = DecodePprof(page.body);
      if (!last.ok() || done(*last)) return last;
    } else if (page.status != 503) {
      return absl::InternalError(absl::StrCat(path, ": ", page.status, " ", page.error, page.body));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return last;
}

// A file's content ("" when it cannot be read).
std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// "name value" lines.
std::map<std::string, int64_t> ReadNumbers(const std::string& path) {
  std::map<std::string, int64_t> out;
  std::ifstream in(path);
  std::string name;
  int64_t value;
  while (in >> name >> value) out[name] = value;
  return out;
}

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

// Under ThreadSanitizer, where a thread's CPU lands by function is TSan's:
// it delivers asynchronous signals only at its next interceptor call, so one
// late sample carries the time of several and its stack is TSan's own (the
// reason scripts/sanitizers.sh leaves ProfilerE2eTest out there). The
// threads' totals are still right and are checked; the per-function shares
// are checked in every other build.
#if defined(INPROF_TSAN)
constexpr bool kFunctionSharesMeasurable = false;
#else
constexpr bool kFunctionSharesMeasurable = true;
#endif

// A sanitizer's runtime linked statically (clang's) defines malloc in the
// workload itself, whose calls to it are direct (no GOT slot): its
// allocations are not intercepted there (allocation_provider.h).
#if defined(INPROF_ASAN) || defined(INPROF_TSAN)
constexpr bool kAllocationsIntercepted = false;
#else
constexpr bool kAllocationsIntercepted = true;
#endif

struct Profile {
  std::map<std::string, int64_t> cpu_by_thread;  // "thread name" -> cpu-time
  std::map<std::string, int64_t> cpu_by_function;  // anywhere on the stack
  // "thread name" -> each of its stacks (leaf first, joined by " < ") -> cpu
  std::map<std::string, std::map<std::string, int64_t>> stacks_by_thread;
  std::set<std::string> pids, programs;  // the samples' labels pid and program
  std::string comments;
  // Samples the profile says were walked by frame pointers through a
  // module whose CFI table was not loaded yet (its comments): such a walk
  // may skip the caller of a function built without frame pointers (the
  // spin's clock read in libc), so the spin's frame may be missing there.
  int64_t walks_without_tables = 0;
};

Profile ReadProfile(const std::string& path) {
  Profile p;
  auto samples = testing::ReadWithGoPprofRaw(path);
  EXPECT_TRUE(samples.ok()) << samples.status();
  if (!samples.ok()) return p;
  for (const auto& s : *samples) {
    if (auto it = s.labels.find("pid"); it != s.labels.end()) p.pids.insert(it->second);
    if (auto it = s.labels.find("program"); it != s.labels.end()) p.programs.insert(it->second);
    if (s.values.size() < 2) continue;
    const int64_t cpu = s.values[1];
    if (auto it = s.labels.find("thread name"); it != s.labels.end()) {
      p.cpu_by_thread[it->second] += cpu;
      p.stacks_by_thread[it->second][absl::StrJoin(s.stack, " < ")] += cpu;
    }
    std::set<std::string> seen(s.stack.begin(), s.stack.end());
    for (const std::string& f : seen) p.cpu_by_function[f] += cpu;
  }
  auto comments = testing::GoPprof("-comments " + testing::ShellQuote(path));
  if (comments.ok()) p.comments = *comments;
  constexpr std::string_view kWalks = "without its CFI table yet=";
  if (const size_t at = p.comments.find(kWalks); at != std::string::npos) {
    const size_t from = at + kWalks.size();
    size_t to = from;
    while (to < p.comments.size() && std::isdigit(static_cast<unsigned char>(p.comments[to]))) ++to;
    EXPECT_TRUE(absl::SimpleAtoi(p.comments.substr(from, to - from), &p.walks_without_tables))
        << p.comments;
  }
  return p;
}

class AgentLibraryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    workload_ = testing::EnvOrEmpty("INPROF_AGENT_WORKLOAD");
    if (workload_.empty()) GTEST_SKIP() << "INPROF_AGENT_WORKLOAD not set (run under meson test)";
    INPROF_REQUIRE_TOOL("go");
    static std::atomic<int> n{0};
    dir_ = absl::StrCat(testing::TestTmpDir(), "/agent_library_", getpid(), "_", n++);
    mkdir(dir_.c_str(), 0755);
    std::lock_guard<std::mutex> lock(g_log_mu);
    g_log.clear();
  }

  AgentServerOptions ServerOptions() {
    AgentServerOptions o;
    o.address = internal::NewAgentSocketAddress();
    o.log = &CaptureLog;
    o.profile = true;
    o.profile_options.output = dir_ + "/agent-%p.pb.gz";
    o.profile_options.export_period = absl::ZeroDuration();
    return o;
  }

  // The workload's command line with the agent's address in its environment.
  std::string Workload(const std::string& socket, const std::string& args) {
    return absl::StrCat("INPROF_AGENT_SOCKET=", socket, " INPROF_OUTPUT=",
                        testing::ShellQuote(dir_ + "/local-%p.pb.gz"), " ",
                        testing::ShellQuote(workload_), " ", args);
  }

  // Every process served so far finished (its last window exported).
  static bool AllFinished(const AgentServer& server, size_t count) {
    auto processes = server.Processes();
    if (processes.size() < count) return false;
    for (const auto& p : processes) {
      if (!p.finished) return false;
    }
    return true;
  }

  // Runs the workload in `die` mode (it SIGKILLs itself) against an agent
  // of the test's, `env` before its command line; returns what the agent
  // kept of it once its last window was exported, and in `measured` the
  // CPU it printed ("die": its spin, "die_outer": the main thread's since
  // it registered).
  AgentProcess RunDyingWorkload(const std::string& env, const std::string& args,
                                std::map<std::string, int64_t>* measured = nullptr) {
    AgentServerOptions options = ServerOptions();
    AgentServer server(options);
    EXPECT_TRUE(server.Start().ok());
    auto run = testing::RunCommandSeparately(
        env + Workload(options.address.ToString(), "die" + args));
    EXPECT_TRUE(run.ok()) << run.status();
    if (run.ok()) {
      EXPECT_EQ(run->exit_code, 128 + SIGKILL) << run->err;
      if (measured != nullptr) {
        std::istringstream in(run->err.substr(std::min(run->err.rfind("die "), run->err.size())));
        std::string name;
        int64_t value;
        while (in >> name >> value) (*measured)[name] = value;
      }
    }
    EXPECT_TRUE(Eventually([&] { return AllFinished(server, 1); })) << Log();
    server.Stop();
    const std::vector<AgentProcess> processes = server.Processes();
    EXPECT_EQ(processes.size(), 1u) << Log();
    return processes.empty() ? AgentProcess() : processes[0];
  }

  std::string workload_;
  std::string dir_;
};

// The workloads' CPU period (INPROF_CPU_PERIOD unset: the default).
constexpr int64_t kPeriod = 10'000'000;

// What a function's contiguous `cpu` puts on its frame at least: the
// sample points it crossed, less the last (ExpectThreadsMatch).
int64_t SpinFloor(int64_t cpu) { return (cpu / kPeriod - 1) * kPeriod; }

// What the function's frame carries at least in `p`: SpinFloor, less a
// period for each sample the profile says was walked by frame pointers
// before a module's tables were loaded (Profile::walks_without_tables:
// counted and shown by the profiler; one in a CI run under load put a
// sample of AgentSpinHeavy's clock read on its caller).
int64_t FunctionFloor(int64_t cpu, const Profile& p) {
  return SpinFloor(cpu) - p.walks_without_tables * kPeriod;
}

// The CPU `long` mode printed on stderr ("spun NS"); -1 when it did not.
int64_t Spun(const std::string& err) {
  const size_t at = err.rfind("spun ");
  int64_t ns = -1;
  if (at == std::string::npos ||
      !absl::SimpleAtoi(err.substr(at + 5, err.find('\n', at) - at - 5), &ns)) {
    return -1;
  }
  return ns;
}

// Each measured thread's CPU against its profiled CPU, as in the process
// (tests/profiler/profiler_e2e_test.cc, PerThreadCpuMatches...): the
// period times the sample points its CPU crossed from arming to its tail,
// so above its spin's CPU less a period and below its CPU around its
// registration plus one, deterministically (it was +-10%, picked by
// hand). Each spin is one function's contiguous CPU: it crossed at least
// floor(CPU / period) sample points, each signalled on the thread and
// handled inside the function but the last, which may be handled just
// after it returned (it was, under load, for AgentSpinLong's 590 ms
// below): at least that many less one carry its frame where stacks are
// walked whole (SpinFloor), less those walked before the tables were
// ready, which the profile counts (FunctionFloor).
void ExpectThreadsMatch(const Profile& p, const std::map<std::string, int64_t>& measured,
                        const std::string& what) {
  for (const char* name : {"light", "heavy"}) {
    const int64_t m = measured.at(name);
    const int64_t outer = measured.at(absl::StrCat(name, "_outer"));
    const int64_t got = p.cpu_by_thread.count(name) ? p.cpu_by_thread.at(name) : 0;
    std::printf("%s %-6s measured %.3fs (%.3fs around its registration) profiled %.3fs\n",
                what.c_str(), name, m / 1e9, outer / 1e9, got / 1e9);
    EXPECT_GT(got, m - kPeriod) << what << " " << name;
    EXPECT_LT(got, outer + kPeriod) << what << " " << name;
  }
  if (!kFunctionSharesMeasurable) return;
  for (const auto& [fn, name] : {std::pair<const char*, const char*>{"AgentSpinLight", "light"},
                                 {"AgentSpinHeavy", "heavy"}}) {
    // The thread's stacks without the function, to say where its CPU went.
    std::string elsewhere;
    if (auto t = p.stacks_by_thread.find(name); t != p.stacks_by_thread.end()) {
      for (const auto& [stack, cpu] : t->second) {
        if (!absl::StrContains(stack, fn)) {
          absl::StrAppend(&elsewhere, "\n  ", cpu / 1'000'000, " ms: ", stack);
        }
      }
    }
    EXPECT_GE(p.cpu_by_function.count(fn) ? p.cpu_by_function.at(fn) : 0,
              FunctionFloor(measured.at(name), p))
        << what << " " << fn << "; the thread's other stacks:" << elsewhere << "\n"
        << p.comments;
  }
}

TEST_F(AgentLibraryTest, TwoProcessesAndAnExecdChildReportToOneAgent) {
  AgentServerOptions options = ServerOptions();
  AgentServer server(options);
  ASSERT_TRUE(server.Start().ok());
  const std::string socket = options.address.ToString();
  const std::string a_out = dir_ + "/a.txt", b_out = dir_ + "/b.txt";
  // A alone; B, which spins and then fork+exec's C with the environment it
  // inherited (so C finds the agent through INPROF_AGENT_SOCKET too).
  auto run = testing::RunCommandSeparately(absl::StrCat(
      Workload(socket, "threads " + testing::ShellQuote(a_out)), " & ",
      Workload(socket, "spawn " + testing::ShellQuote(b_out)), "; wait"));
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 0) << run->err;
  EXPECT_THAT(run->err, Not(HasSubstr("profiling in this process"))) << run->err;
  ASSERT_TRUE(Eventually([&] { return AllFinished(server, 3); })) << Log();
  server.Stop();

  const auto a = ReadNumbers(a_out), b = ReadNumbers(b_out), c = ReadNumbers(b_out + ".child");
  ASSERT_TRUE(a.count("pid") && c.count("pid")) << "the workloads wrote no pid";
  std::map<pid_t, AgentProcess> by_pid;
  for (const AgentProcess& p : server.Processes()) by_pid[p.hello.pid] = p;
  ASSERT_EQ(by_pid.size(), 3u) << Log();
  pid_t b_pid = 0;
  for (const auto& [pid, p] : by_pid) {
    EXPECT_TRUE(p.ended_cleanly) << pid;
    EXPECT_EQ(p.profiles, 1u) << pid;
    EXPECT_EQ(p.error, "") << pid;
    EXPECT_EQ(p.output, absl::StrCat(dir_, "/agent-", pid, ".pb.gz"));
    EXPECT_EQ(p.hello.program, "agent_workload");
    if (pid != a.at("pid") && pid != c.at("pid")) b_pid = pid;
  }
  ASSERT_NE(b_pid, 0);
  // Nothing was written by the processes themselves.
  for (pid_t pid : {static_cast<pid_t>(a.at("pid")), b_pid, static_cast<pid_t>(c.at("pid"))}) {
    EXPECT_FALSE(Exists(absl::StrCat(dir_, "/local-", pid, ".pb.gz"))) << pid;
  }

  Profile pa = ReadProfile(by_pid[a.at("pid")].output);
  Profile pb = ReadProfile(by_pid[b_pid].output);
  Profile pc = ReadProfile(by_pid[c.at("pid")].output);
  ExpectThreadsMatch(pa, a, "A");
  ExpectThreadsMatch(pc, c, "C (exec'd by B)");
  // B's own work (SpinFloor of its spin's CPU, as above), and none of its
  // child's.
  ASSERT_TRUE(b.count("parent")) << "B wrote no CPU";
  if (kFunctionSharesMeasurable) {
    EXPECT_GE(pb.cpu_by_function["AgentSpinParent"], FunctionFloor(b.at("parent"), pb));
  }
  EXPECT_EQ(pb.cpu_by_function.count("AgentSpinLight"), 0u);
  EXPECT_EQ(pa.cpu_by_function.count("AgentSpinParent"), 0u);
  // Each profile says whose it is: in every sample's labels,
  EXPECT_THAT(pa.pids, ElementsAre(absl::StrCat(a.at("pid"))));
  EXPECT_THAT(pc.pids, ElementsAre(absl::StrCat(c.at("pid"))));
  EXPECT_THAT(pb.pids, ElementsAre(absl::StrCat(b_pid)));
  EXPECT_THAT(pa.programs, ElementsAre("agent_workload"));
  // and in the comments.
  EXPECT_THAT(pa.comments, HasSubstr(absl::StrCat("process pid=", a.at("pid"),
                                                  " program=agent_workload")));
  EXPECT_THAT(pb.comments, HasSubstr(absl::StrCat("process pid=", b_pid)));
  EXPECT_THAT(pc.comments, HasSubstr("profiled through inprof agent"));
  // And protoc reads them as profile.proto says.
  EXPECT_TRUE(testing::ProtocDecodeOk(by_pid[a.at("pid")].output).ok());
  // With allocations not sampled (no INPROF_ALLOC_PERIOD), the agent's
  // profile has no heap columns, as the process's own would not.
  auto types = ReadPprofFile(by_pid[a.at("pid")].output);
  ASSERT_TRUE(types.ok()) << types.status();
  EXPECT_GE(types->ValueIndex("cpu-time"), 0);
  EXPECT_EQ(types->ValueIndex("alloc_space"), -1);
  EXPECT_EQ(types->ValueIndex("inuse_objects"), -1);
}

TEST_F(AgentLibraryTest, AProcessThatDiesKeepsWhatItForwarded) {
  std::map<std::string, int64_t> measured;
  const AgentProcess p = RunDyingWorkload("", "", &measured);
  ASSERT_FALSE(HasFailure());
  EXPECT_FALSE(p.ended_cleanly);
  EXPECT_THAT(Log(), HasSubstr("it ended without stopping its profiler"));
  // 300 ms of CPU: what its collector forwarded, and what it had not yet
  // drained from its threads' rings, which the agent read after its death.
  // Every sample point its CPU crossed made a sample, and none is lost but
  // the last, whose signal may still be pending when the process kills
  // itself: the main thread's total is at least SpinFloor of its spin and
  // below its CPU since it registered plus a period, deterministically (it
  // has no tail: it never unregistered).
  EXPECT_GT(p.samples, 0u);
  ASSERT_TRUE(measured.count("die") && measured.count("die_outer")) << "no CPU printed";
  Profile profile = ReadProfile(p.output);
  EXPECT_GE(profile.cpu_by_thread["main"], SpinFloor(measured.at("die")));
  EXPECT_LT(profile.cpu_by_thread["main"], measured.at("die_outer") + kPeriod);
  if (kFunctionSharesMeasurable) {
    EXPECT_GE(profile.cpu_by_function["AgentSpinDie"], FunctionFloor(measured.at("die"), profile));
  }
}

// Its collector never drains (a 10 s period) and wall sampling is off, so
// every sample of the 300 ms is still in the main thread's ring when the
// process kills itself: all of them reach the profile through the agent's
// reading of the threads' rings, on their stacks, to within the
// in-process bound.
TEST_F(AgentLibraryTest, WhatADeadProcessLeftInItsThreadsRingsIsProfiled) {
  const std::string out = dir_ + "/die.txt";
  const AgentProcess p =
      RunDyingWorkload("INPROF_WALL_PERIOD=0 ", " " + testing::ShellQuote(out));
  ASSERT_FALSE(HasFailure());
  EXPECT_FALSE(p.ended_cleanly);
  EXPECT_EQ(p.error, "");
  const auto measured = ReadNumbers(out);
  ASSERT_TRUE(measured.count("die")) << "the workload wrote no CPU";
  // From the ring: the collector's first pass, right after Start(), ended
  // before the workload spun (it waits for the tables, then 1 s). 300 ms
  // of CPU at 10 ms crosses >= 29 sample points: one signal each with the
  // perf engine or at HZ >= 200, >= 1 per 2 points at HZ=100 (a tick per
  // 10 ms): >= 14 samples, deterministically.
  EXPECT_GE(p.samples_from_thread_rings, 14u) << Log();
  EXPECT_THAT(Log(), HasSubstr(absl::StrCat("(", p.samples_from_thread_rings,
                                            " samples read from its threads' rings)")));
  Profile profile = ReadProfile(p.output);
  const int64_t m = measured.at("die");
  const int64_t main_cpu = profile.cpu_by_thread["main"];
  std::printf("died: measured %.3fs, profiled on main %.3fs from %llu ring samples\n",
              m / 1e9, main_cpu / 1e9,
              static_cast<unsigned long long>(p.samples_from_thread_rings));
  // The lattice bound of AProcessThatDiesKeepsWhatItForwarded.
  ASSERT_TRUE(measured.count("die_outer"));
  EXPECT_GE(main_cpu, SpinFloor(m));
  EXPECT_LT(main_cpu, measured.at("die_outer") + kPeriod);
  if (kFunctionSharesMeasurable) {
    EXPECT_GE(profile.cpu_by_function["AgentSpinDie"], FunctionFloor(m, profile));
  }
  EXPECT_THAT(profile.comments, HasSubstr("samples read from its threads' rings afterwards"));
  EXPECT_TRUE(testing::ProtocDecodeOk(p.output).ok());
}

TEST_F(AgentLibraryTest, WithoutAnAgentTheProcessProfilesItselfOrNotAtAll) {
  const std::string nobody = absl::StrCat("@inprof-test-nobody-", getpid());
  auto local = testing::RunCommandSeparately(Workload(nobody, "long 100"));
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(local->exit_code, 0) << local->err;
  EXPECT_THAT(local->err, HasSubstr(absl::StrCat("INPROF_AGENT_SOCKET=", nobody, ": ")));
  EXPECT_THAT(local->err, HasSubstr("; profiling in this process (INPROF_AGENT_FALLBACK=local)"));
  std::string pid_line = local->out;
  EXPECT_THAT(pid_line, HasSubstr("started"));

  auto off = testing::RunCommandSeparately(absl::StrCat(
      "INPROF_AGENT_FALLBACK=off ", Workload(nobody, "long 100")));
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->exit_code, 0) << off->err;
  EXPECT_THAT(off->err, HasSubstr("not profiling (INPROF_AGENT_FALLBACK=off)"));
  // The local run wrote its own profile; the one with fallback off did not.
  std::vector<std::string> files;
  auto ls = testing::RunCommand("ls " + testing::ShellQuote(dir_));
  ASSERT_TRUE(ls.ok());
  for (absl::string_view f : absl::StrSplit(*ls, '\n', absl::SkipEmpty())) {
    files.emplace_back(f);
  }
  ASSERT_EQ(files.size(), 1u) << *ls;
  Profile profile = ReadProfile(dir_ + "/" + files[0]);
  EXPECT_THAT(profile.comments, HasSubstr("library mode: INPROF_AGENT_SOCKET="));
  // Its spin, all in its own profile (ExpectThreadsMatch's bound).
  ASSERT_GE(Spun(local->err), 0) << local->err;
  if (kFunctionSharesMeasurable) {
    EXPECT_GE(profile.cpu_by_function["AgentSpinLong"],
              FunctionFloor(Spun(local->err), profile));
  }
}

// The agent as users run it (`inprof agent`), killed with SIGKILL while a
// process forwards to it, then started again at the same address.
class AgentProcessHandle {
 public:
  AgentProcessHandle(const std::string& cli, const std::string& socket,
                     const std::string& output) {
    int out[2];
    EXPECT_EQ(pipe(out), 0);
    err_path_ = output + ".agent-log";
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], 1);
      const int err = open(err_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      dup2(err, 2);
      close(out[0]);
      execl(cli.c_str(), cli.c_str(), "agent", "--socket", socket.c_str(), "--output",
            output.c_str(), nullptr);
      _exit(127);
    }
    close(out[1]);
    std::string first;
    char ch;
    while (read(out[0], &ch, 1) == 1 && ch != '\n') first += ch;
    close(out[0]);
    ready_ = first == "INPROF_AGENT_SOCKET=" + socket;
  }
  bool ready() const { return ready_; }
  int Kill(int sig) {
    kill(pid_, sig);
    int status = 0;
    waitpid(pid_, &status, 0);
    return status;
  }
  std::string log() const {
    std::ifstream in(err_path_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  pid_t pid_ = -1;
  bool ready_ = false;
  std::string err_path_;
};

// A workload started through /bin/sh with its stderr in a file, returned
// once it printed "started" (its profiler runs).
class RunningWorkload {
 public:
  RunningWorkload(const std::string& command, const std::string& err_path)
      : err_path_(err_path) {
    int out[2];
    EXPECT_EQ(pipe(out), 0);
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], 1);
      const int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(err, 2);
      close(out[0]);
      execl("/bin/sh", "sh", "-c", command.c_str(), nullptr);
      _exit(127);
    }
    close(out[1]);
    char ch;
    while (read(out[0], &ch, 1) == 1 && ch != '\n') started_ += ch;
    close(out[0]);
  }
  bool started() const { return started_ == "started"; }
  // Waits for it; its wait status, and what it wrote on stderr.
  int Wait(std::string* err) {
    int status = 0;
    EXPECT_EQ(waitpid(pid_, &status, 0), pid_);
    std::ifstream in(err_path_);
    std::stringstream ss;
    ss << in.rdbuf();
    *err = ss.str();
    return status;
  }

 private:
  pid_t pid_ = -1;
  std::string err_path_;
  std::string started_;
};

// `inprof agent --http`: a live capture of one process the agent serves,
// symbolized with that process's files, over HTTP as go tool pprof asks.
TEST_F(AgentLibraryTest, TheAgentServesALiveCaptureOfAProcess) {
  AgentServerOptions options = ServerOptions();
  options.profile_options.http_addr = "127.0.0.1:0";
  AgentServer server(options);
  ASSERT_TRUE(server.Start().ok());
  const std::string http = server.http_address();
  ASSERT_FALSE(http.empty()) << Log();
  EXPECT_THAT(Log(), HasSubstr(absl::StrCat("agent: serving http://", http, "/debug/pprof/")));
  // The low numbers free now are taken by files of the test's own: the
  // agent opens the process's symbol files above them and keeps them open,
  // and a capture reads them again; each of the test's files is checked
  // after the session ends.
  struct stat null_stat{};
  ASSERT_EQ(stat("/dev/null", &null_stat), 0);
  std::vector<int> sentinels;
  while (sentinels.size() < 4096) {
    const int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0) break;
    sentinels.push_back(fd);
    if (fd >= 256) break;
  }
  RunningWorkload workload(Workload(options.address.ToString(), "long 3000"),
                           dir_ + "/workload.err");
  ASSERT_TRUE(workload.started());
  pid_t pid = 0;
  ASSERT_TRUE(Eventually([&] {
    for (const AgentProcess& p : server.Processes()) {
      if (p.connected && p.samples > 0) pid = p.hello.pid;
    }
    return pid != 0;
  })) << Log();

  testing::HttpReply index = testing::HttpFetch(http, "GET", "/debug/pprof/");
  EXPECT_EQ(index.status, 200) << index.error;
  EXPECT_THAT(index.body, HasSubstr(absl::StrCat("<td>", pid, "</td><td>agent_workload</td>")));
  testing::HttpReply missing =
      testing::HttpFetch(http, "GET", "/debug/pprof/profile?seconds=1&pid=1");
  EXPECT_EQ(missing.status, 404);
  EXPECT_THAT(missing.body, HasSubstr("no process 1 is connected"));
  // Its allocations are not profiled: no heap page of it.
  testing::HttpReply no_heap =
      testing::HttpFetch(http, "GET", absl::StrCat("/debug/pprof/heap?pid=", pid));
  EXPECT_EQ(no_heap.status, 404);
  EXPECT_THAT(no_heap.body, HasSubstr("allocation profiling is off in this process"));
  // Nor its lock waits.
  testing::HttpReply no_locks =
      testing::HttpFetch(http, "GET", absl::StrCat("/debug/pprof/mutex?pid=", pid));
  EXPECT_EQ(no_locks.status, 404);
  EXPECT_THAT(no_locks.body, HasSubstr("lock-wait profiling is off in this process"));

  // The workload's CPU around the capture: the capture lies within it.
  clockid_t workload_clock;
  ASSERT_EQ(clock_getcpuclockid(pid, &workload_clock), 0);
  auto workload_cpu = [&] {
    timespec ts{};
    clock_gettime(workload_clock, &ts);
    return ts.tv_sec * 1'000'000'000LL + ts.tv_nsec;
  };
  const int64_t cpu_before = workload_cpu();
  testing::HttpReply live = testing::HttpFetch(
      http, "GET", absl::StrCat("/debug/pprof/profile?seconds=1&pid=", pid));
  const int64_t cpu_during = workload_cpu() - cpu_before;
  ASSERT_EQ(live.status, 200) << live.error << live.body;
  const std::string path = dir_ + "/live.pb.gz";
  std::ofstream(path, std::ios::binary) << live.body;
  Profile p = ReadProfile(path);
  EXPECT_THAT(p.pids, ElementsAre(absl::StrCat(pid)));
  EXPECT_THAT(p.comments, HasSubstr("live capture of 1s"));
  EXPECT_THAT(p.comments, HasSubstr(absl::StrCat("process pid=", pid)));
  // A second of a spinning thread, on its stack. At most what the whole
  // process used meanwhile, plus the points a late first sample may carry
  // from before (a period, 10 ms, and a tick, <= 10 ms): deterministic.
  // At least one sample: not computed, it needs 10 ms of the spinner's CPU
  // in that second, which the scheduler gives it unless ~200 runnable
  // threads share the two cores. How much it gets is the machine's.
  std::printf("live capture: main %.3f s of %.3f s the process used\n",
              p.cpu_by_thread["main"] / 1e9, cpu_during / 1e9);
  EXPECT_GT(p.cpu_by_thread["main"], 0);
  EXPECT_LE(p.cpu_by_thread["main"], cpu_during + 20'000'000);
  if (kFunctionSharesMeasurable) {
    EXPECT_GT(p.cpu_by_function["AgentSpinLong"], 0);
  }

  std::string err;
  const int status = workload.Wait(&err);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << err;
  ASSERT_TRUE(Eventually([&] { return AllFinished(server, 1); })) << Log();
  // The periodic export is whole: the capture took nothing from it.
  const AgentProcess done = server.Processes().at(0);
  Profile whole = ReadProfile(done.output);
  // Its whole spin (ExpectThreadsMatch's bound on a spin).
  ASSERT_GE(Spun(err), 0) << err;
  if (kFunctionSharesMeasurable) {
    EXPECT_GE(whole.cpu_by_function["AgentSpinLong"], FunctionFloor(Spun(err), whole));
  }
  server.Stop();
  EXPECT_EQ(server.http_address(), "");
  // Every one of the test's files is still open, at its number: neither the
  // capture nor the session's end (its files closed by Stop at the
  // latest) closed a number that was not its own.
  int closed = 0;
  for (int fd : sentinels) {
    struct stat st{};
    if (fstat(fd, &st) != 0 || st.st_ino != null_stat.st_ino ||
        st.st_rdev != null_stat.st_rdev) {
      ++closed;
      continue;
    }
    close(fd);
  }
  EXPECT_EQ(closed, 0) << "of " << sentinels.size() << " files of the test's own";
}

// The agent cuts the windows (every second here), not the process: each of
// them still has the allocations made in it (alloc_*) and the live heap at
// its end (inuse_*), as a window the process cut itself would. At
// INPROF_ALLOC_PERIOD=1 every allocation is sampled with weight exactly 1,
// so the sums are exact. The process sends its live heap every second
// (AgentForwarding::kLiveStateInterval) and the workload waits for 4 of the
// agent's windows after its first allocations: the state arrives in time
// unless its collector (every 50 ms) did not run for 2 s of those.
TEST_F(AgentLibraryTest, TheAgentsWindowsCarryTheHeapAsOfTheirEnd) {
  if (!kAllocationsIntercepted) {
    GTEST_SKIP() << "the sanitizer's allocator is called without a GOT slot here";
  }
  AgentServerOptions options = ServerOptions();
  options.profile_options.output = dir_ + "/agent-%p-%t.pb.gz";
  options.profile_options.export_period = absl::Seconds(1);
  options.profile_options.http_addr = "127.0.0.1:0";
  AgentServer server(options);
  ASSERT_TRUE(server.Start().ok());
  RunningWorkload workload(
      "INPROF_ALLOC_PERIOD=1 " +
          Workload(options.address.ToString(), "heap " + testing::ShellQuote(dir_)),
      dir_ + "/workload.err");
  ASSERT_TRUE(workload.started());
  // Meanwhile, the agent's heap page of the process (its first allocations
  // made, the kept ones live; the workload waits for 4 windows): once its
  // state arrived, the sums are exact, as in the windows below.
  pid_t pid = 0;
  ASSERT_TRUE(Eventually([&] {
    for (const AgentProcess& p : server.Processes()) pid = p.hello.pid;
    return pid != 0;
  })) << Log();
  // Until both sites are in: the freed blocks are allocated after the kept
  // ones and may reach the agent a collector pass later (seen once beside
  // the whole suite: 41 of the 50 in the page read).
  constexpr int64_t kKeptBytes = 64 * 1024 * 100, kFreedBytes = 32 * 1024 * 50;
  absl::StatusOr<DecodedProfile> heap = PollPage(
      server.http_address(), absl::StrCat("/debug/pprof/heap?pid=", pid),
      [](const DecodedProfile& p) {
        return SumAt(p, "inuse_space", "AgentHeapKept") == kKeptBytes &&
               SumAt(p, "alloc_space", "AgentHeapFreed") == kFreedBytes;
      });
  ASSERT_TRUE(heap.ok()) << heap.status();
  EXPECT_EQ(heap->period, 1);  // the process's INPROF_ALLOC_PERIOD
  EXPECT_EQ(heap->default_sample_type, "inuse_space");
  EXPECT_EQ(SumAt(*heap, "inuse_space", "AgentHeapKept"), kKeptBytes);
  EXPECT_EQ(SumAt(*heap, "alloc_space", "AgentHeapKept"), kKeptBytes);
  EXPECT_EQ(SumAt(*heap, "alloc_space", "AgentHeapFreed"), kFreedBytes);
  EXPECT_EQ(SumAt(*heap, "inuse_space", "AgentHeapFreed"), 0);
  std::string err;
  const int status = workload.Wait(&err);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << err;
  ASSERT_TRUE(Eventually([&] { return AllFinished(server, 1); })) << Log();
  server.Stop();
  const std::vector<AgentProcess> processes = server.Processes();
  ASSERT_EQ(processes.size(), 1u) << Log();
  const std::string prefix = absl::StrCat(dir_, "/agent-", processes[0].hello.pid, "-");
  std::vector<std::string> windows;
  for (const std::string& f : testing::FilesEndingIn(dir_, ".pb.gz")) {
    if (absl::StartsWith(f, prefix)) windows.push_back(f);
  }
  ASSERT_GE(windows.size(), 5u) << Log();
  struct Site {
    int64_t alloc = 0, inuse = 0, peak = 0;
  };
  constexpr int64_t kKept = 100 * 64 * 1024, kFreed = 50 * 32 * 1024, kLate = 10 * 16 * 1024;
  std::vector<std::map<std::string, Site>> sites;  // per window, by function
  std::string comments;
  for (const std::string& w : windows) {
    auto p = ReadPprofFile(w);
    ASSERT_TRUE(p.ok()) << w << ": " << p.status();
    const int alloc = p->ValueIndex("alloc_space"), inuse = p->ValueIndex("inuse_space");
    const int peak = p->ValueIndex("peak_inuse_space");
    ASSERT_GE(alloc, 0) << w;
    ASSERT_GE(inuse, 0) << w;
    ASSERT_GE(peak, 0) << w;
    std::map<std::string, Site>& by = sites.emplace_back();
    for (const DecodedProfile::Sample& s : p->samples) {
      for (const char* fn : {"AgentHeapKept", "AgentHeapFreed", "AgentHeapLate"}) {
        if (std::none_of(s.stack.begin(), s.stack.end(),
                         [&](const std::string& f) { return absl::StrContains(f, fn); })) {
          continue;
        }
        by[fn].alloc += s.values[alloc];
        by[fn].inuse += s.values[inuse];
        by[fn].peak += s.values[peak];
      }
    }
    if (&w == &windows.back()) {
      for (const std::string& c : p->comments) comments += c + "\n";
    }
  }
  int64_t kept_alloc = 0, freed_alloc = 0, late_alloc = 0;
  bool kept_live_before_the_last = false;
  for (size_t i = 0; i < sites.size(); ++i) {
    kept_alloc += sites[i]["AgentHeapKept"].alloc;
    freed_alloc += sites[i]["AgentHeapFreed"].alloc;
    late_alloc += sites[i]["AgentHeapLate"].alloc;
    // What was freed at once is never live at a window's end, and at its
    // peak at most one of those blocks was (each is freed before the next).
    EXPECT_EQ(sites[i]["AgentHeapFreed"].inuse, 0) << windows[i];
    EXPECT_LE(sites[i]["AgentHeapFreed"].peak, 32 * 1024) << windows[i];
    // Blocks live at a window's end, allocated before it or in it (never
    // freed in between), were all live at its peak: every sample is
    // sampled at INPROF_ALLOC_PERIOD=1, so exactly.
    if (sites[i]["AgentHeapKept"].inuse == kKept) {
      EXPECT_EQ(sites[i]["AgentHeapKept"].peak, kKept) << windows[i];
    }
    if (i + 1 < sites.size() && sites[i]["AgentHeapKept"].inuse == kKept) {
      kept_live_before_the_last = true;
    }
  }
  // Every allocation in exactly one window, the first ones before the last.
  EXPECT_EQ(kept_alloc, kKept);
  EXPECT_EQ(freed_alloc, kFreed);
  EXPECT_EQ(late_alloc, kLate);
  EXPECT_EQ(sites.back()["AgentHeapKept"].alloc, 0);
  EXPECT_TRUE(kept_live_before_the_last) << "no window before the last had the kept blocks live";
  // At the end: the kept blocks freed, the late ones live.
  EXPECT_EQ(sites.back()["AgentHeapKept"].inuse, 0);
  EXPECT_EQ(sites.back()["AgentHeapLate"].inuse, kLate);
  // And the allocation counters' line, as the process's own windows have it.
  EXPECT_THAT(comments, HasSubstr("allocations sampled="));
}

// The agent's /debug/pprof/mutex and /block of a process: the lock waits it
// forwarded since it connected, as the process's own endpoint serves its
// waits since Start. Each of the workload's 8 waits found the lock busy and
// lasted at least its 5 ms hold, so at INPROF_LOCK_PERIOD=1us each is
// sampled with weight 1 and its delay: exactly 8 contentions at
// AgentLockWait, a delay between the holds' sum and the waiter's own
// timing of its calls. Deterministic.
TEST_F(AgentLibraryTest, TheAgentServesTheLockWaitsOfAProcess) {
  if (!kAllocationsIntercepted) {
    GTEST_SKIP() << "the sanitizer's runtime defines pthread_mutex_lock in the workload "
                    "itself, whose calls to it are direct (no GOT slot to patch)";
  }
  AgentServerOptions options = ServerOptions();
  options.profile_options.http_addr = "127.0.0.1:0";
  AgentServer server(options);
  ASSERT_TRUE(server.Start().ok());
  RunningWorkload workload(
      "INPROF_LOCK_PERIOD=1us " +
          Workload(options.address.ToString(), "locks " + testing::ShellQuote(dir_)),
      dir_ + "/workload.err");
  ASSERT_TRUE(workload.started());
  int64_t waited = -1;
  {
    std::ifstream in(dir_ + "/waited");
    std::string word;
    in >> word >> waited;
  }
  ASSERT_GT(waited, 0);
  pid_t pid = 0;
  ASSERT_TRUE(Eventually([&] {
    for (const AgentProcess& p : server.Processes()) pid = p.hello.pid;
    return pid != 0;
  })) << Log();
  // Until the waits are in (the process forwards its events after each
  // collector pass, every 50 ms).
  absl::StatusOr<DecodedProfile> mutex = PollPage(
      server.http_address(), absl::StrCat("/debug/pprof/mutex?pid=", pid),
      [](const DecodedProfile& p) { return SumAt(p, "contentions", "AgentLockWait") == 8; });
  ASSERT_TRUE(mutex.ok()) << mutex.status();
  EXPECT_EQ(SumAt(*mutex, "contentions", "AgentLockWait"), 8);
  const int64_t delay = SumAt(*mutex, "delay", "AgentLockWait");
  EXPECT_GE(delay, 8 * 5'000'000);
  EXPECT_LE(delay, waited);
  EXPECT_EQ(mutex->period, 1000);  // the process's INPROF_LOCK_PERIOD, in nanoseconds
  EXPECT_EQ(mutex->default_sample_type, "delay");
  // /block is the same profile; the legacy text names the waits too.
  testing::HttpReply block = testing::HttpFetch(server.http_address(), "GET",
                                                absl::StrCat("/debug/pprof/block?pid=", pid));
  EXPECT_EQ(block.status, 200) << block.body;
  testing::HttpReply text = testing::HttpFetch(
      server.http_address(), "GET", absl::StrCat("/debug/pprof/mutex?debug=1&pid=", pid));
  EXPECT_EQ(text.status, 200) << text.body;
  EXPECT_THAT(text.body, HasSubstr("--- mutex:"));
  // seconds=1: the difference of two snapshots a second apart, in which
  // the workload waits for nothing (its 8 waits came before "started"):
  // no contention at its site.
  testing::HttpReply delta = testing::HttpFetch(
      server.http_address(), "GET", absl::StrCat("/debug/pprof/mutex?seconds=1&pid=", pid));
  ASSERT_EQ(delta.status, 200) << delta.body;
  auto later = DecodePprof(delta.body);
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_EQ(SumAt(*later, "contentions", "AgentLockWait"), 0);
  std::ofstream(dir_ + "/done") << "";
  std::string err;
  const int status = workload.Wait(&err);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << err;
  ASSERT_TRUE(Eventually([&] { return AllFinished(server, 1); })) << Log();
  server.Stop();
}

// The agent's /debug/pprof/threads of a process: asked of the process over
// its socket, taken there, answered through its ring, symbolized by the
// agent. Its thread blocked in read() is there, at its function, in its
// state, in each form (pprof, debug=2 text, goroutine debug=1 grouped);
// deterministic: the thread blocks before "started" and stays until done.
// inprof stacks reaches it too, by the agent's HOST:PORT and --pid, and by
// its pid alone.
TEST_F(AgentLibraryTest, TheAgentServesAThreadDumpOfAProcess) {
  AgentServerOptions options = ServerOptions();
  options.profile_options.http_addr = "127.0.0.1:0";
  AgentServer server(options);
  ASSERT_TRUE(server.Start().ok());
  RunningWorkload workload(
      Workload(options.address.ToString(), "sleeper " + testing::ShellQuote(dir_)),
      dir_ + "/workload.err");
  ASSERT_TRUE(workload.started());
  pid_t pid = 0;
  ASSERT_TRUE(Eventually([&] {
    for (const AgentProcess& p : server.Processes()) pid = p.hello.pid;
    return pid != 0;
  })) << Log();
  const std::string http = server.http_address();
  testing::HttpReply dump;
  const auto give_up = absl::Now() + absl::Seconds(20);
  do {  // 503 until the process described its profile
    dump = testing::HttpFetch(http, "GET", absl::StrCat("/debug/pprof/threads?pid=", pid));
    if (dump.status == 503) absl::SleepFor(absl::Milliseconds(20));
  } while (dump.status == 503 && absl::Now() < give_up);
  testing::HttpReply text =
      testing::HttpFetch(http, "GET", absl::StrCat("/debug/pprof/threads?debug=2&pid=", pid));
  testing::HttpReply grouped =
      testing::HttpFetch(http, "GET", absl::StrCat("/debug/pprof/goroutine?pid=", pid,
                                                   "&debug=1"));
  testing::HttpReply missing =
      testing::HttpFetch(http, "GET", "/debug/pprof/threads?pid=1&debug=2");
  // inprof stacks --pid P HOST:PORT: the same text, by way of the agent.
  const char* cli = std::getenv("INPROF_CLI");
  ASSERT_TRUE(cli != nullptr && *cli != '\0') << "INPROF_CLI: set by meson test";
  auto stacks = testing::RunCommandSeparately(
      absl::StrCat(testing::ShellQuote(cli), " stacks --pid ", pid, " ", http));
  // inprof stacks PID: the process listens on nothing; its agent (this
  // test's process, which holds its ring memory) is found and asked.
  auto stacks_by_pid =
      testing::RunCommandSeparately(absl::StrCat(testing::ShellQuote(cli), " stacks ", pid));
  std::ofstream(dir_ + "/done") << "";
  std::string err;
  const int status = workload.Wait(&err);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << err;
  ASSERT_TRUE(Eventually([&] { return AllFinished(server, 1); })) << Log();
  server.Stop();

  ASSERT_EQ(dump.status, 200) << dump.error << dump.body;
  absl::StatusOr<DecodedProfile> p = DecodePprof(dump.body);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->sample_types.size(), 1u);
  EXPECT_EQ(p->sample_types[0].type, "threads");
  int sleepers = 0;
  for (const DecodedProfile::Sample& s : p->samples) {
    auto name = s.str_labels.find("thread name");
    if (name == s.str_labels.end() || name->second != "sleeper") continue;
    ++sleepers;
    EXPECT_TRUE(std::any_of(s.stack.begin(), s.stack.end(), [](const std::string& f) {
      return absl::StrContains(f, "AgentBlockedInRead");
    })) << absl::StrJoin(s.stack, " <- ");
    auto label = [&](const char* key) {
      auto it = s.str_labels.find(key);
      return it == s.str_labels.end() ? std::string("(none)") : it->second;
    };
    EXPECT_EQ(label("thread state"), "blocked");
    EXPECT_EQ(label("syscall"), "read");
  }
  EXPECT_EQ(sleepers, 1);
  EXPECT_THAT(absl::StrJoin(p->comments, "\n"), HasSubstr("symbolized by the agent"));
  ASSERT_EQ(text.status, 200) << text.body;
  EXPECT_THAT(text.body, HasSubstr("\"sleeper\" [blocked in read"));
  EXPECT_THAT(text.body, HasSubstr("AgentBlockedInRead"));
  ASSERT_EQ(grouped.status, 200) << grouped.body;
  EXPECT_THAT(grouped.body, HasSubstr("goroutine profile: total "));
  EXPECT_THAT(grouped.body, HasSubstr("# state: blocked in read (1)"));
  EXPECT_EQ(missing.status, 404);
  EXPECT_THAT(missing.body, HasSubstr("no process 1 is connected"));
  ASSERT_TRUE(stacks.ok()) << stacks.status();
  EXPECT_EQ(stacks->exit_code, 0) << stacks->err;
  EXPECT_THAT(stacks->out, HasSubstr("\"sleeper\" [blocked in read"));
  ASSERT_TRUE(stacks_by_pid.ok()) << stacks_by_pid.status();
  EXPECT_EQ(stacks_by_pid->exit_code, 0) << stacks_by_pid->err;
  EXPECT_THAT(stacks_by_pid->out, HasSubstr("\"sleeper\" [blocked in read"));
  EXPECT_THAT(stacks_by_pid->out, HasSubstr(absl::StrCat("thread dump of pid ", pid)));
}

TEST_F(AgentLibraryTest, AKilledAgentLeavesTheProcessRunningAndARestartedOneServes) {
  const std::string cli = testing::EnvOrEmpty("INPROF_CLI");
  if (cli.empty()) GTEST_SKIP() << "INPROF_CLI not set";
  const std::string socket = internal::NewAgentSocketAddress().ToString();
  AgentProcessHandle agent(cli, socket, dir_ + "/first-%p.pb.gz");
  ASSERT_TRUE(agent.ready()) << agent.log();

  // The process spins; the agent is killed once it has been forwarding for
  // a while; once the process has said it profiles itself, it spins 600 ms
  // more (it waits for `go`).
  const std::string go = dir_ + "/go";
  RunningWorkload workload(Workload(socket, "until " + testing::ShellQuote(go) + " 600"),
                           dir_ + "/workload.err");
  ASSERT_TRUE(workload.started());
  ASSERT_TRUE(Eventually([&] {
    return agent.log().find("connected: 1 rings") != std::string::npos;
  })) << agent.log();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const int agent_status = agent.Kill(SIGKILL);
  EXPECT_TRUE(WIFSIGNALED(agent_status) && WTERMSIG(agent_status) == SIGKILL);
  ASSERT_TRUE(Eventually([&] {
    return ReadFile(dir_ + "/workload.err").find("profiling in this process from now on") !=
           std::string::npos;
  })) << ReadFile(dir_ + "/workload.err");
  std::ofstream(go) << "go\n";

  std::string err;
  const int status = workload.Wait(&err);
  // It ran to its end: no SIGPIPE, no hang, one line saying what happened.
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << err;
  EXPECT_THAT(err, HasSubstr(absl::StrCat("library mode: the agent at ", socket)));
  EXPECT_THAT(err,
              HasSubstr("; profiling in this process from now on (INPROF_AGENT_FALLBACK=local)"));
  // Its own profile, from the loss on, says what was lost.
  std::string local;
  auto ls = testing::RunCommand("ls " + testing::ShellQuote(dir_) + " | grep '^local-'");
  ASSERT_TRUE(ls.ok()) << "no local profile was written\n" << err;
  local = dir_ + "/" + std::string(absl::StripSuffix(*ls, "\n"));
  Profile after = ReadProfile(local);
  EXPECT_THAT(after.comments, HasSubstr("went away after"));
  EXPECT_THAT(after.comments, HasSubstr("of them it had not read are lost"));
  // The 600 ms spun after the process took over are all in the local
  // profile, to within one period (10 ms): deterministic. The period's
  // 60 sample points all fall in the spin; the last one's signal may be
  // handled just after AgentSpinLong returned, so 59 x 10 ms is the least
  // (a run under the whole suite's load measured exactly that; the bound
  // was > and failed it).
  if (kFunctionSharesMeasurable) {
    EXPECT_GE(after.cpu_by_function["AgentSpinLong"], 590'000'000) << err;
  }

  // A new agent at the same address serves the next process.
  AgentProcessHandle again(cli, socket, dir_ + "/second-%p.pb.gz");
  ASSERT_TRUE(again.ready()) << again.log();
  const std::string threads_out = dir_ + "/again.txt";
  auto run = testing::RunCommandSeparately(
      Workload(socket, "threads " + testing::ShellQuote(threads_out)));
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(run->exit_code, 0) << run->err;
  EXPECT_THAT(run->err, Not(HasSubstr("profiling in this process")));
  const auto measured = ReadNumbers(threads_out);
  const std::string second = absl::StrCat(dir_, "/second-", measured.at("pid"), ".pb.gz");
  ASSERT_TRUE(Eventually([&] { return Exists(second); })) << again.log();
  const int again_status = again.Kill(SIGTERM);
  EXPECT_TRUE(WIFEXITED(again_status) && WEXITSTATUS(again_status) == 0) << again.log();
  ExpectThreadsMatch(ReadProfile(second), measured, "after the restart");
}

// With INPROF_AGENT_FALLBACK=off a lost agent is not replaced: the process
// runs on, keeps nothing more, and says how much it did not keep.
TEST_F(AgentLibraryTest, AKilledAgentWithFallbackOffCountsWhatWasNotKept) {
  const std::string cli = testing::EnvOrEmpty("INPROF_CLI");
  if (cli.empty()) GTEST_SKIP() << "INPROF_CLI not set";
  const std::string socket = internal::NewAgentSocketAddress().ToString();
  AgentProcessHandle agent(cli, socket, dir_ + "/off-%p.pb.gz");
  ASSERT_TRUE(agent.ready()) << agent.log();
  // Spins until the process has noticed the loss, then 600 ms more.
  const std::string go = dir_ + "/go-off";
  RunningWorkload workload(
      "INPROF_AGENT_FALLBACK=off " + Workload(socket, "until " + testing::ShellQuote(go) + " 600"),
      dir_ + "/off.err");
  ASSERT_TRUE(workload.started());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  agent.Kill(SIGKILL);
  ASSERT_TRUE(Eventually([&] {
    return ReadFile(dir_ + "/off.err").find("samples are no longer kept") != std::string::npos;
  })) << ReadFile(dir_ + "/off.err");
  std::ofstream(go) << "go\n";
  std::string err;
  const int status = workload.Wait(&err);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << err;
  EXPECT_THAT(err, HasSubstr("; samples are no longer kept (INPROF_AGENT_FALLBACK=off)"));
  // At Stop(): the count of samples taken after the loss, and no file of
  // its own. After the loss it spun 600 ms at 10 ms: >= 59 sample points,
  // >= 30 signals with any engine (a tick per <= 10 ms), deterministic.
  const size_t at = err.find(" samples taken after that were not kept");
  ASSERT_NE(at, std::string::npos) << err;
  const size_t begin = err.rfind(' ', at - 1) + 1;
  int64_t not_kept = 0;
  ASSERT_TRUE(absl::SimpleAtoi(err.substr(begin, at - begin), &not_kept)) << err;
  EXPECT_GT(not_kept, 10) << err;
  auto ls = testing::RunCommand("ls " + testing::ShellQuote(dir_));
  ASSERT_TRUE(ls.ok());
  EXPECT_THAT(*ls, Not(HasSubstr("local-")));
}

// A process that writes garbage into its ring: the agent stops reading that
// ring, says why, exports what it read, and serves the others.
TEST_F(AgentLibraryTest, GarbageInARingIsRefusedAndOthersStillServed) {
  AgentServerOptions options = ServerOptions();
  AgentServer server(options);
  ASSERT_TRUE(server.Start().ok());
  internal::AgentHello hello;
  hello.pid = getpid();
  hello.program = "garbage";
  hello.max_threads = 1;
  hello.ring_bytes = 64 * 1024;
  auto c = internal::ConnectToAgent(options.address, hello, 5000);
  ASSERT_TRUE(c.ok()) << c.status();
  void* region = mmap(nullptr, c->welcome.region_bytes, PROT_READ | PROT_WRITE,
                      MAP_SHARED, c->region_fd, 0);
  ASSERT_NE(region, MAP_FAILED);
  internal::AgentRingWriter writer(region, c->welcome.region_bytes);
  ASSERT_TRUE(writer.Push(internal::EncodeAgentOp(internal::AgentDescribe{
      {{"cpu-samples", "count"}}, {"cpu-samples", "count"}, 1, "test"})));
  ASSERT_TRUE(writer.Push(std::vector<uint64_t>{7, 1, 2, 3}));  // a short sample
  ASSERT_TRUE(Eventually([&] {
    return Log().find("its ring is not read any more") != std::string::npos;
  })) << Log();
  EXPECT_THAT(Log(), HasSubstr("agent stream: sample record"));

  const std::string out = dir_ + "/after-garbage.txt";
  auto run = testing::RunCommandSeparately(
      Workload(options.address.ToString(), "threads " + testing::ShellQuote(out)));
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(run->exit_code, 0) << run->err;
  close(c->socket);
  close(c->region_fd);
  munmap(region, c->welcome.region_bytes);
  ASSERT_TRUE(Eventually([&] { return AllFinished(server, 2); })) << Log();
  server.Stop();
  const auto measured = ReadNumbers(out);
  for (const AgentProcess& p : server.Processes()) {
    if (p.hello.program == "garbage") {
      EXPECT_THAT(p.error, HasSubstr("sample record"));
    } else {
      EXPECT_EQ(p.error, "");
      ExpectThreadsMatch(ReadProfile(p.output), measured, "beside the garbage");
    }
  }
}

// ddprof's library mode: INPROF_AGENT=spawn starts an agent from Start(),
// and the program the process exec's joins it through the exported
// INPROF_AGENT_SOCKET; the agent leaves by itself once both are gone.
TEST_F(AgentLibraryTest, ASpawnedAgentServesTheProcessAndWhatItExecsThenLeaves) {
  const std::string cli = testing::EnvOrEmpty("INPROF_CLI");
  if (cli.empty()) GTEST_SKIP() << "INPROF_CLI not set";
  const std::string out = dir_ + "/spawn.txt";
  auto run = testing::RunCommandSeparately(absl::StrCat(
      "INPROF_AGENT=spawn INPROF_AGENT_BINARY=", testing::ShellQuote(cli),
      " INPROF_OUTPUT=", testing::ShellQuote(dir_ + "/spawned-%p.pb.gz"), " ",
      testing::ShellQuote(workload_), " spawn ", testing::ShellQuote(out)));
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 0) << run->err;
  EXPECT_THAT(run->err, Not(HasSubstr("profiling in this process"))) << run->err;
  const auto child = ReadNumbers(out + ".child"), parent = ReadNumbers(out);
  ASSERT_TRUE(child.count("pid"));
  ASSERT_TRUE(parent.count("parent")) << "the spawning process wrote no CPU";
  const std::string child_profile = absl::StrCat(dir_, "/spawned-", child.at("pid"), ".pb.gz");
  ASSERT_TRUE(Eventually([&] {
    auto ls = testing::RunCommand("ls " + testing::ShellQuote(dir_) + " | grep -c '^spawned-'");
    return Exists(child_profile) && ls.ok() && *ls == "2\n";
  })) << run->err;
  // Both profiles name the same agent, which is not the process itself.
  std::set<std::string> agents;
  auto ls = testing::RunCommand("ls " + testing::ShellQuote(dir_) + " | grep '^spawned-'");
  ASSERT_TRUE(ls.ok());
  pid_t agent_pid = 0;
  for (absl::string_view f : absl::StrSplit(*ls, '\n', absl::SkipEmpty())) {
    Profile p = ReadProfile(dir_ + "/" + std::string(f));
    const size_t at = p.comments.find("profiled through inprof agent (pid ");
    ASSERT_NE(at, std::string::npos) << p.comments;
    const std::string rest = p.comments.substr(at + 35);
    agents.insert(rest.substr(0, rest.find(')')));
    ASSERT_TRUE(absl::SimpleAtoi(rest.substr(0, rest.find(')')), &agent_pid));
    if (f == absl::StrCat("spawned-", child.at("pid"), ".pb.gz")) {
      ExpectThreadsMatch(p, child, "exec'd child of a spawning process");
    } else if (kFunctionSharesMeasurable) {
      // ExpectThreadsMatch's bound on a spin.
      EXPECT_GE(p.cpu_by_function["AgentSpinParent"], FunctionFloor(parent.at("parent"), p));
    }
  }
  EXPECT_EQ(agents.size(), 1u);
  // Gone 2 s after its last process (--idle-exit 2), on its own.
  EXPECT_TRUE(Eventually([&] { return kill(agent_pid, 0) != 0; }, 10))
      << "the spawned agent " << agent_pid << " is still running";

  // A binary that is no agent: one line, and the process profiles itself.
  auto bad = testing::RunCommandSeparately(absl::StrCat(
      "INPROF_AGENT=spawn INPROF_AGENT_BINARY=/bin/false INPROF_OUTPUT=",
      testing::ShellQuote(dir_ + "/fallback-%p.pb.gz"), " ",
      testing::ShellQuote(workload_), " long 50"));
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ(bad->exit_code, 0) << bad->err;
  EXPECT_THAT(bad->err, HasSubstr("INPROF_AGENT=spawn: '/bin/false' did not start an agent"));
  EXPECT_THAT(bad->err, HasSubstr("; profiling in this process (INPROF_AGENT_FALLBACK=local)"));
}

// Wrapper mode: `inprof run --agent -- CMD` starts the agent first and every
// process of the tree reports to it.
TEST_F(AgentLibraryTest, InprofRunWithAnAgentProfilesTheWholeTree) {
  // It needs the preload library: it runs with the run suite (agent_run),
  // which the sanitizer builds leave out; agent_library filters it out.
  const std::string cli = testing::EnvOrEmpty("INPROF_CLI");
  const std::string target = testing::EnvOrEmpty("INPROF_RUN_TARGET");
  if (cli.empty() || target.empty()) GTEST_SKIP() << "INPROF_CLI / INPROF_RUN_TARGET not set";
  const std::string t = testing::ShellQuote(target);
  auto run = testing::RunCommandSeparately(absl::StrCat(
      testing::ShellQuote(cli), " run --agent --http 0 -o ",
      testing::ShellQuote(dir_ + "/run-%p.pb.gz"),
      " -- sh -c ", testing::ShellQuote(absl::StrCat(t, " spin 300 & ", t, " spin 200; wait"))));
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 0) << run->err;
  // The agent serves the endpoint for the tree; the processes do not.
  EXPECT_THAT(run->err, HasSubstr("agent: serving http://127.0.0.1:"));
  EXPECT_THAT(run->err, Not(HasSubstr("inprof: serving http://")));
  // One line per run_target (and one for the shell itself).
  std::vector<std::string> targets;
  for (absl::string_view line : absl::StrSplit(run->err, '\n', absl::SkipEmpty())) {
    if (!absl::StrContains(line, ", run_target)")) continue;
    const size_t at = line.find("wrote ");
    ASSERT_NE(at, absl::string_view::npos) << line;
    targets.emplace_back(line.substr(at + 6, line.find(" (pid") - at - 6));
  }
  ASSERT_EQ(targets.size(), 2u) << run->err;
  std::vector<int64_t> spins;
  for (const std::string& path : targets) {
    Profile p = ReadProfile(path);
    EXPECT_THAT(p.comments, HasSubstr("profiled through inprof agent"));
    int64_t spin = 0;  // "(anonymous namespace)::SpinWork(long)"
    for (const auto& [function, cpu] : p.cpu_by_function) {
      if (absl::StrContains(function, "::SpinWork(")) spin += cpu;
    }
    spins.push_back(spin);
  }
  std::sort(spins.begin(), spins.end());
  // Each spun 200 and 300 ms of its main thread's CPU in one go: between
  // testing::CpuRegionFloor and CpuRegionCeiling, deterministically (it
  // was +-30 and +-40 ms, picked by hand).
  EXPECT_GE(spins[0], testing::CpuRegionFloor(200)) << run->err;
  EXPECT_LE(spins[0], testing::CpuRegionCeiling(200)) << run->err;
  EXPECT_GE(spins[1], testing::CpuRegionFloor(300)) << run->err;
  EXPECT_LE(spins[1], testing::CpuRegionCeiling(300)) << run->err;
}

}  // namespace
}  // namespace inprof::agent
