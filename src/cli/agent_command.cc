// `inprof agent [--socket ADDR] [--allow-uid UID]...`: the out-of-process
// agent of ddprof's design (src/agent/agent_server.h). It listens until
// SIGINT, SIGTERM or SIGHUP (then removes a path's socket file), printing the address profiled processes connect to
// (INPROF_AGENT_SOCKET) and one line per process that connects, leaves or
// is refused; each process's samples are aggregated, symbolized and
// exported here (src/agent/agent_session.h), configured by the agent's own
// INPROF_* / DD_* variables.
#include <getopt.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "inprof/internal/agent_protocol.h"
#include "inprof/base/log.h"
#include "inprof/options.h"
#include "src/agent/agent_server.h"
#include "src/cli/command.h"

namespace inprof::cli {

const char kAgentHelp[] =
    "usage: inprof agent [OPTIONS]\n"
    "\n"
    "Runs the profiling agent: processes started with INPROF_AGENT_SOCKET set\n"
    "to its address forward their samples to it through shared memory, and\n"
    "the agent aggregates, symbolizes and exports one profile per process\n"
    "and window -- to INPROF_OUTPUT (default here inprof-%p.pb.gz, %p: the\n"
    "profiled process), Datadog or Pyroscope, as the agent's own INPROF_* and\n"
    "DD_* variables say. Runs until SIGINT, SIGTERM or SIGHUP, then exports\n"
    "the last window of each process still connected and removes its socket\n"
    "file (a stale one, left by an agent that was killed, is replaced at\n"
    "start). Raises its own descriptor limit to the hard limit; a process it\n"
    "cannot serve (near that limit, too many connections waiting, another\n"
    "user) is told why and profiles itself.\n"
    "\n"
    "Options:\n"
    "  -s, --socket=ADDR    where to listen: @NAME (abstract, no file) or a\n"
    "                       path (default: INPROF_AGENT_SOCKET, else a fresh\n"
    "                       @inprof-agent-UID-PID-RANDOM)\n"
    "      --allow-uid=UID  also serve this user's processes (repeatable; the\n"
    "                       agent's own user and root always are)\n"
    "      --idle-exit=SECONDS  exit once no process has been connected for\n"
    "                       SECONDS (after serving at least one, or from the\n"
    "                       start); INPROF_AGENT=spawn starts agents this way\n"
    "      --daemonize      detach (fork, new session) before listening\n"
    "  -q, --quiet          log errors only (not each process's arrival,\n"
    "                       departure and summary)\n"
    "  -o, --output=PATTERN profile path per process and window; %p: its\n"
    "                       process id, %t: window start   INPROF_OUTPUT\n"
    "      --http=ADDR      serve /debug/pprof/ for the processes: a capture\n"
    "                       of the next N seconds of one (pid=N; not needed\n"
    "                       while only one is connected), its heap, lock\n"
    "                       waits and threads (inprof stacks PID asks here)\n"
    "                                                     INPROF_HTTP_ADDR\n"
    "  -h, --help           this text\n";

namespace {
// One line each: what users and peers named (addresses, program names) is
// escaped.
void LogLine(const std::string& line) {
  const std::string out = internal::EscapeForLog(line) + "\n";
  fputs(out.c_str(), stderr);
}
void Error(const std::string& message) {
  PrintError("agent", internal::EscapeForLog(message));
}
// The server's lines begin "agent: ".
void LogServerLine(const std::string& line) { LogLine("inprof " + line); }

// An agent serves many processes, each holding descriptors (its connection,
// its region, the files its symbolizer keeps open): the soft limit (often
// 1,024) is raised to the hard one, as servers do. The agent uses poll(),
// never select(), so descriptors past 1,024 are fine.
void RaiseDescriptorLimit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= rl.rlim_max) return;
  rl.rlim_cur = rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
}
}  // namespace

int AgentMain(int argc, char** argv) {
  static const option kOptions[] = {
      {"socket", required_argument, nullptr, 's'},
      {"allow-uid", required_argument, nullptr, 'u'},
      {"output", required_argument, nullptr, 'o'},
      {"http", required_argument, nullptr, 'H'},
      {"idle-exit", required_argument, nullptr, 'i'},
      {"quiet", no_argument, nullptr, 'q'},
      {"daemonize", no_argument, nullptr, 'd'},
      {"help", no_argument, nullptr, 'h'},
      {nullptr, 0, nullptr, 0},
  };
  agent::AgentServerOptions options;
  std::string socket;
  std::string output;
  std::string http;
  bool http_given = false;
  absl::Duration idle_exit = absl::InfiniteDuration();
  bool daemonize = false;
  if (const char* env = getenv("INPROF_AGENT_SOCKET"); env != nullptr && *env != 0) {
    socket = env;
  }
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, "+s:o:qh", kOptions, nullptr)) != -1) {
    switch (c) {
      case 's':
        socket = optarg;
        break;
      case 'o':
        if (std::strcmp(optarg, "-") == 0) {
          PrintError("agent", "--output '-': each process gets a profile file of "
                              "its own; standard output cannot hold them");
          return 2;
        }
        output = optarg;
        break;
      case 'H':
        http = optarg;
        http_given = true;
        if (auto parsed = internal::ParseListenAddress(http); !parsed.ok()) {
          Error(absl::StrCat("--http: ", parsed.status().message()));
          return 2;
        }
        break;
      case 'q':
        options.log_connections = false;
        break;
      case 'd':
        daemonize = true;
        break;
      case 'i': {
        double seconds = 0;
        if (!absl::SimpleAtod(optarg, &seconds) || seconds < 0.1 || seconds > 86400) {
          Error(absl::StrCat("--idle-exit \"", optarg,
                                           "\": expected seconds from 0.1 to 86400"));
          return 2;
        }
        idle_exit = absl::Seconds(seconds);
        break;
      }
      case 'u': {
        uint32_t uid = 0;
        if (!absl::SimpleAtoi(optarg, &uid)) {
          Error(absl::StrCat("--allow-uid \"", optarg,
                                           "\": expected a numeric user id"));
          return 2;
        }
        options.allowed_uids.push_back(static_cast<uid_t>(uid));
        break;
      }
      case 'h':
        fputs(kAgentHelp, stdout);
        return 0;
      default:
        Error(absl::StrCat("unknown option \"", argv[optind - 1],
                                         "\" (inprof agent --help)"));
        return 2;
    }
  }
  if (optind < argc) {
    Error(absl::StrCat("unexpected argument \"", argv[optind],
                                     "\" (inprof agent --help)"));
    return 2;
  }
  if (socket.empty()) {
    options.address = internal::NewAgentSocketAddress();
  } else {
    auto address = internal::ParseAgentSocketAddress(socket);
    if (!address.ok()) {
      Error(std::string(address.status().message()));
      return 2;
    }
    options.address = *address;
  }
  if (daemonize) {
    // Detached from whoever started it (INPROF_AGENT=spawn): the parent
    // returns at once, the agent runs on in a session of its own.
    const pid_t child = fork();
    if (child < 0) {
      Error(absl::StrCat("fork: ", std::strerror(errno)));
      return 1;
    }
    if (child > 0) _exit(0);
    setsid();
  }
  options.log = &LogServerLine;
  // A long-running agent forgets the oldest of the processes it served
  // (their counts stay in `served`).
  options.max_finished_kept = 1024;
  // The processes' profiles: the agent's own configuration. Each process
  // writes its own file unless told otherwise.
  options.profile = true;
  options.profile_options = Options::FromEnv();
  if (!output.empty()) {
    options.profile_options.output = output;
    options.profile_options.write_output = true;
  } else if (getenv("INPROF_OUTPUT") == nullptr) {
    options.profile_options.output = "inprof-%p.pb.gz";
  }
  if (http_given) options.profile_options.http_addr = http;
  RaiseDescriptorLimit();
#ifdef __GLIBC__
  // The agent's memory follows its processes: a session's is freed (and
  // malloc_trim'd) when its process ends. glibc, left to itself, raises its
  // trim threshold to twice the largest mmap'd block freed (up to 64 MiB)
  // and then keeps that much at the top of an arena: a greedy process that
  // left once kept the agent 64 MiB larger. Fixed thresholds (this is
  // inprof's own process, not a host) keep it returning what it frees.
  mallopt(M_MMAP_THRESHOLD, 256 * 1024);
  mallopt(M_TRIM_THRESHOLD, 256 * 1024);
  // One arena. malloc_trim() never shrinks the top of a thread's arena
  // (glibc trims only the main arena's top; a thread arena's shrinks only
  // in free() and only when that free merges into it), so memory freed in
  // one that a later consolidation merged into its top stayed resident: in
  // ~1 run of 10 of safety_agent_abuse's greedy process, the agent kept
  // 20-62 MiB for good, malloc_info showing it all as one thread arena's
  // top chunk (24.6 MB, after an explicit malloc_trim too). The agent's
  // threads (serving loop, finishers, endpoint) do little at once: that
  // test's greedy run took 2.52 s with one arena, 2.56 s with many
  // (medians of 6 interleaved runs).
  mallopt(M_ARENA_MAX, 1);
#endif
  // Wait for SIGINT/SIGTERM/SIGHUP synchronously (each ends the agent the
  // same clean way: last windows, socket file removed); the serving thread
  // (created after this) inherits the mask.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  agent::AgentServer server(options);
  if (absl::Status st = server.Start(); !st.ok()) {
    Error(std::string(st.message()));
    return 1;
  }
  if (server.replaced_stale_socket()) {
    LogLine(absl::StrCat("inprof agent: replaced the stale socket at ",
                         options.address.ToString(),
                         " (nothing listened there: an agent that was killed?)"));
  }
  if (options.log_connections) {
    LogLine(absl::StrCat("inprof agent: listening on ", options.address.ToString(),
                         " (pid ", getpid(), ")"));
  }
  printf("INPROF_AGENT_SOCKET=%s\n", options.address.ToString().c_str());
  fflush(stdout);
  int sig = 0;
  if (idle_exit == absl::InfiniteDuration()) {
    while (sigwait(&stop, &sig) != 0) {
    }
  } else {
    // Also stops once no process has been connected for `idle_exit`.
    absl::Time idle_since = absl::Now();
    const timespec tick{0, 100'000'000};
    for (;;) {
      const int got = sigtimedwait(&stop, nullptr, &tick);
      if (got > 0) {
        sig = got;
        break;
      }
      bool busy = false;
      for (const agent::AgentProcess& p : server.Processes()) {
        busy |= p.connected || !p.finished;
      }
      if (busy) idle_since = absl::Now();
      if (absl::Now() - idle_since >= idle_exit) break;
    }
  }
  server.Stop();
  if (sig != 0 || options.log_connections) {
    LogLine(absl::StrCat("inprof agent: stopped ",
                         sig != 0 ? absl::StrCat("by signal ", sig)
                                  : absl::StrCat("after ", absl::FormatDuration(idle_exit),
                                                 " without a process"),
                         "; served ", server.served(), " processes, refused ",
                         server.refused()));
  }
  return 0;
}

}  // namespace inprof::cli
