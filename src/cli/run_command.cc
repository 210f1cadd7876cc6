// `inprof run [OPTIONS] [--] CMD [ARGS...]`: runs CMD with the preload
// library (src/run/preload_linux.cc) in LD_PRELOAD and the options turned into
// INPROF_* variables, waits for it, and prints one line per profile that CMD
// and its children wrote. Exits with CMD's status (127: not found, 126: not
// executable, like env(1) and timeout(1)).
//
// Options are parsed with getopt_long (glibc): Abseil's flags have no short
// options, cannot stop at the first argument that is not an option (CMD's own
// flags would be taken for ours) and exit 1 on a usage error.
#include <elf.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "inprof/internal/debug_endpoint.h"
#include "inprof/options.h"
#include "src/agent/agent_server.h"
#include "src/cli/command.h"
#include "src/run/auto_profiler.h"

#ifndef INPROF_PRELOAD_NAME
#define INPROF_PRELOAD_NAME "libinprof_preload.so"
#endif
// Where the preload library lies relative to the directory of the `inprof`
// executable: installed (bindir -> libdir/inprof) and in the build tree.
#ifndef INPROF_PRELOAD_FROM_BINDIR
#define INPROF_PRELOAD_FROM_BINDIR "../lib/inprof"
#endif

namespace inprof::cli {

const char kRunHelp[] =
    "usage: inprof run [OPTIONS] [--] CMD [ARGS...]\n"
    "\n"
    "Profiles CMD, an unmodified dynamically linked program, and every program\n"
    "it starts: each process writes its own pprof profile when it ends (return\n"
    "from main, exit(), quick_exit(), _exit(), SIGINT, SIGTERM or SIGHUP; a\n"
    "process killed by another signal writes none, except with --agent).\n"
    "Every thread is registered automatically, under the name the program\n"
    "gives it. Options override the INPROF_* variables of the environment\n"
    "(README, Configuration), which pass through to CMD.\n"
    "\n"
    "Options:\n"
    "  -o, --output=PATTERN    profile path; %p: process id, %t: window start\n"
    "                          (default inprof-%p.pb.gz, inprof-%p-%t.pb.gz\n"
    "                          with --export-period)           INPROF_OUTPUT\n"
    "                          without %p, only CMD writes PATTERN; the\n"
    "                          processes it starts write PATTERN_<pid>\n"
    "      --period=DURATION   CPU time between samples, 1ms to 1h (10ms)\n"
    "                                                          INPROF_CPU_PERIOD\n"
    "      --wall-period=DURATION  wall-time sampling period (10ms)\n"
    "                                                          INPROF_WALL_PERIOD\n"
    "      --no-wall           no wall-time sampling           INPROF_WALL_PERIOD=0\n"
    "      --engine=ENGINE     auto, perf, timer or itimer     INPROF_CPU_ENGINE\n"
    "      --alloc[=SIZE]      profile allocations and the live heap too: one\n"
    "                          sample per SIZE bytes allocated on average\n"
    "                          (512KiB; 0: off); the profile opens on the\n"
    "                          heap at its peak (peak_inuse_space)\n"
    "                                                          INPROF_ALLOC_PERIOD\n"
    "      --locks[=DURATION]  profile lock waits too (contentions, delay):\n"
    "                          every wait of DURATION or more, a shorter one\n"
    "                          with probability delay/DURATION (1ms; 0: off)\n"
    "                                                          INPROF_LOCK_PERIOD\n"
    "      --export-period=DURATION  one profile per window, 100ms to 24h\n"
    "                          (default here: 0, one profile per process)\n"
    "                                                          INPROF_EXPORT_PERIOD\n"
    "      --no-symbolize      addresses and build-ids only    INPROF_SYMBOLIZE=0\n"
    "      --http=ADDR         serve /debug/pprof/ while CMD runs: PORT (on\n"
    "                          127.0.0.1), HOST:PORT; port 0: any free one,\n"
    "                          logged; with --agent the agent serves it for\n"
    "                          the whole tree (a capture names pid=N)\n"
    "                                                          INPROF_HTTP_ADDR\n"
    "      --no-children       profile CMD only, not the programs it starts\n"
    "      --agent             one agent (inprof agent) for the whole tree: it\n"
    "                          starts first, every process forwards its samples\n"
    "                          to it, and it aggregates, symbolizes and writes\n"
    "                          each process's profile; processes still running\n"
    "                          when CMD ends get their profile up to then\n"
    "                                                          INPROF_AGENT_SOCKET\n"
    "  -q, --quiet             do not list the profiles written\n"
    "  -h, --help              this text\n"
    "\n"
    "Exit status: CMD's; 127 when CMD is not found, 126 when it cannot be\n"
    "executed, 2 for a usage error, 1 when inprof cannot run it at all.\n"
    "\n"
    "Example:\n"
    "  inprof run -o /tmp/build-%p.pb.gz -- make -j8\n";

namespace {

constexpr const char* kCmd = "run";

int Usage(const std::string& message) {
  PrintError(kCmd, message + " (inprof run --help)");
  return 2;
}

std::string Dirname(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string CurrentDir() {
  char buf[PATH_MAX];
  if (getcwd(buf, sizeof(buf)) == nullptr) return ".";
  return buf;
}

// The preload library: $INPROF_PRELOAD_LIBRARY, else next to this
// executable as installed, else as built.
absl::StatusOr<std::string> FindPreload() {
  if (const char* p = getenv("INPROF_PRELOAD_LIBRARY"); p != nullptr && *p) {
    if (access(p, R_OK) != 0) {
      return absl::NotFoundError(absl::StrCat(
          "INPROF_PRELOAD_LIBRARY='", p, "': ", strerror(errno)));
    }
    return std::string(p);
  }
  char exe[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) {
    return absl::NotFoundError("cannot read /proc/self/exe to find " INPROF_PRELOAD_NAME);
  }
  exe[n] = '\0';
  const std::string dir = Dirname(exe);
  const std::string candidates[] = {
      absl::StrCat(dir, "/", INPROF_PRELOAD_FROM_BINDIR, "/", INPROF_PRELOAD_NAME),
      absl::StrCat(dir, "/../run/", INPROF_PRELOAD_NAME),  // the build tree
  };
  for (const std::string& c : candidates) {
    char real[PATH_MAX];
    if (realpath(c.c_str(), real) != nullptr && access(real, R_OK) == 0) {
      return std::string(real);
    }
  }
  return absl::NotFoundError(absl::StrCat(
      "cannot find " INPROF_PRELOAD_NAME " (looked in ", candidates[0], " and ",
      candidates[1], "); set INPROF_PRELOAD_LIBRARY to its path"));
}

// CMD as execvp(3) would find it. Sets *exit_code to 127 or 126 on failure.
absl::StatusOr<std::string> ResolveCommand(const std::string& cmd,
                                           int* exit_code) {
  auto check = [&](const std::string& path) -> absl::StatusOr<std::string> {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) {
      *exit_code = 127;
      return absl::NotFoundError(absl::StrCat("'", cmd, "': ", strerror(errno)));
    }
    if (S_ISDIR(st.st_mode) || access(path.c_str(), X_OK) != 0) {
      *exit_code = 126;
      return absl::PermissionDeniedError(absl::StrCat(
          "'", cmd, "': ", S_ISDIR(st.st_mode) ? "is a directory"
                                               : "permission denied"));
    }
    return path;
  };
  if (cmd.find('/') != std::string::npos) return check(cmd);
  const char* path_env = getenv("PATH");
  const std::string path = path_env != nullptr ? path_env : "/usr/local/bin:/usr/bin:/bin";
  for (absl::string_view dir : absl::StrSplit(path, ':')) {
    const std::string candidate =
        absl::StrCat(dir.empty() ? "." : dir, "/", cmd);
    if (access(candidate.c_str(), X_OK) == 0) {
      struct stat st;
      if (stat(candidate.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
        return candidate;
      }
    }
  }
  *exit_code = 127;
  return absl::NotFoundError(absl::StrCat("'", cmd, "': command not found"));
}

// Why a preload library cannot work in `path` (empty when it can): a
// statically linked program has no dynamic loader to load it, and the loader
// ignores LD_PRELOAD for a program that changes its user or group.
std::string WhyPreloadCannotWork(const std::string& cmd, const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return "";
  if (((st.st_mode & S_ISUID) != 0 && st.st_uid != geteuid()) ||
      ((st.st_mode & S_ISGID) != 0 && st.st_gid != getegid())) {
    return absl::StrCat("'", cmd, "' is set-user-ID or set-group-ID: the "
                        "dynamic loader ignores LD_PRELOAD for it, so it "
                        "cannot be profiled this way");
  }
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  unsigned char ident[EI_NIDENT] = {};
  std::string why;
  if (pread(fd, ident, sizeof(ident), 0) == EI_NIDENT &&
      std::memcmp(ident, ELFMAG, SELFMAG) == 0) {
    if (ident[EI_CLASS] != ELFCLASS64) {
      why = absl::StrCat("'", cmd, "' is a 32-bit program: inprof's preload "
                         "library is 64-bit");
    } else {
      Elf64_Ehdr eh;
      bool dynamic = false;
      if (pread(fd, &eh, sizeof(eh), 0) == sizeof(eh)) {
        for (int i = 0; i < eh.e_phnum; ++i) {
          Elf64_Phdr ph;
          if (pread(fd, &ph, sizeof(ph), eh.e_phoff + i * sizeof(ph)) !=
              sizeof(ph)) {
            break;
          }
          if (ph.p_type == PT_INTERP) dynamic = true;
        }
      }
      if (!dynamic) {
        why = absl::StrCat("'", cmd, "' is statically linked: there is no "
                           "dynamic loader to load the preload library; link "
                           "inprof into the program instead (README, Using it)");
      }
    }
  }
  close(fd);
  return why;
}

// "SIGSEGV (Segmentation fault)".
std::string SignalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  const char* text = strsignal(sig);
  return absl::StrCat(abbrev != nullptr ? absl::StrCat("SIG", abbrev)
                                        : absl::StrCat("signal ", sig),
                      text != nullptr ? absl::StrCat(" (", text, ")") : "");
}

// A process that began sampling (its report's "started" line).
struct ReportedProcess {
  std::string pid;
  std::string command;
  bool wrote = false;
  bool failed = false;  // writing failed (the process logged why)
  std::string failure;  // why, as its report line said
};

// Why `p` wrote no profile, as far as is known: `status` is its wait
// status when it is CMD itself (inprof run's child), null for another
// process of the tree.
std::string WhyNoProfile(const ReportedProcess& p, const int* status) {
  const std::string who = absl::StrCat("'", p.command, "' (pid ", p.pid, ")");
  if (p.failed) {
    return p.failure.empty()
               ? absl::StrCat(who, " could not write its profile (its error is above)")
               : absl::StrCat(who, " could not write its profile: ", p.failure);
  }
  if (status != nullptr && WIFSIGNALED(*status)) {
    const int sig = WTERMSIG(*status);
    return absl::StrCat(
        who, " was killed by ", SignalName(sig),
        " before inprof could write its profile",
        sig == SIGKILL ? ""
                       : "; with --agent its samples are kept outside the "
                         "program and its profile is written even so");
  }
  if (status != nullptr && WIFEXITED(*status)) {
    return absl::StrCat(
        who, " exited with status ", WEXITSTATUS(*status),
        " without writing its profile: writing it did not finish in time, "
        "or it exec'd a program that inprof cannot be loaded into "
        "(statically linked)");
  }
  return absl::StrCat(
      who, " sampled but wrote no profile: it was killed by a signal or "
      "aborted before inprof could write it, or exec'd a program that "
      "inprof cannot be loaded into; with --agent the samples of a process "
      "that dies are kept outside it and its profile is written even so");
}

volatile sig_atomic_t g_child = 0;

void Forward(int sig) {
  if (g_child > 0) kill(g_child, sig);
}

struct Settings {
  std::map<std::string, std::string> env;  // INPROF_* set by options
  std::vector<std::string> unset;          // removed from CMD's environment
  bool quiet = false;
  bool children = true;
  bool agent = false;
};

void LogAgentLine(const std::string& line) {
  fputs(absl::StrCat("inprof run: ", line, "\n").c_str(), stderr);
}

absl::Status CheckDuration(const char* option, const char* value,
                           absl::Duration min, absl::Duration max,
                           bool allow_zero) {
  return ParseDurationFlag(option, value, min, max, allow_zero).status();
}

}  // namespace

int RunMain(int argc, char** argv) {
  static const option kLong[] = {
      {"output", required_argument, nullptr, 'o'},
      {"period", required_argument, nullptr, 'P'},
      {"wall-period", required_argument, nullptr, 'W'},
      {"no-wall", no_argument, nullptr, 'w'},
      {"engine", required_argument, nullptr, 'E'},
      {"alloc", optional_argument, nullptr, 'M'},
      {"locks", optional_argument, nullptr, 'L'},
      {"export-period", required_argument, nullptr, 'X'},
      {"no-symbolize", no_argument, nullptr, 'S'},
      {"http", required_argument, nullptr, 'H'},
      {"no-children", no_argument, nullptr, 'C'},
      {"agent", no_argument, nullptr, 'A'},
      {"quiet", no_argument, nullptr, 'q'},
      {"help", no_argument, nullptr, 'h'},
      {nullptr, 0, nullptr, 0},
  };
  Settings s;
  opterr = 0;
  optind = 1;
  int c;
  // '+': options end at CMD, whose own options are its own.
  while ((c = getopt_long(argc, argv, "+:o:qh", kLong, nullptr)) != -1) {
    absl::Status st;
    switch (c) {
      case 'o':
        if (*optarg == '\0') return Usage("--output: expected a file path");
        if (std::strcmp(optarg, "-") == 0) {
          return Usage("--output '-': each process writes a profile file of its "
                       "own; standard output cannot hold them");
        }
        s.env["INPROF_OUTPUT"] = optarg;
        break;
      case 'P':
        st = CheckDuration("--period", optarg, Options::kMinCpuPeriod,
                           Options::kMaxCpuPeriod, false);
        s.env["INPROF_CPU_PERIOD"] = optarg;
        break;
      case 'W':
        st = CheckDuration("--wall-period", optarg, absl::Milliseconds(1),
                           absl::Hours(1), true);
        s.env["INPROF_WALL_PERIOD"] = optarg;
        break;
      case 'w':
        // std::string(1, '0'), not "0": GCC 12 at -O3 warns (-Wrestrict, a
        // false positive, GCC PR 105329) on assigning a one-char literal.
        s.env["INPROF_WALL_PERIOD"] = std::string(1, '0');
        break;
      case 'E':
        if (std::strcmp(optarg, "auto") != 0 && std::strcmp(optarg, "perf") != 0 &&
            std::strcmp(optarg, "timer") != 0 && std::strcmp(optarg, "itimer") != 0) {
          return Usage(absl::StrCat("--engine='", optarg,
                                    "': expected auto, perf, timer or itimer"));
        }
        s.env["INPROF_CPU_ENGINE"] = optarg;
        break;
      case 'M': {
        const char* value = optarg != nullptr ? optarg : "512KiB";
        const absl::StatusOr<uint64_t> bytes = ParseAllocPeriodFlag("--alloc", value);
        st = bytes.status();
        s.env["INPROF_ALLOC_PERIOD"] = value;
        // A program's heap at exit is mostly freed: its profile opens on
        // the heap at its highest (unless the caller chose a type).
        if (bytes.ok() && *bytes > 0 && std::getenv("INPROF_DEFAULT_SAMPLE_TYPE") == nullptr) {
          s.env["INPROF_DEFAULT_SAMPLE_TYPE"] = "peak_inuse_space";
        }
        break;
      }
      case 'L': {
        const char* value = optarg != nullptr ? optarg : "1ms";
        st = CheckDuration("--locks", value, absl::Microseconds(1), absl::Hours(1), true);
        s.env["INPROF_LOCK_PERIOD"] = value;
        break;
      }
      case 'X':
        st = CheckDuration("--export-period", optarg, Options::kMinExportPeriod,
                           Options::kMaxExportPeriod, true);
        s.env["INPROF_EXPORT_PERIOD"] = optarg;
        break;
      case 'S':
        s.env["INPROF_SYMBOLIZE"] = std::string(1, '0');
        break;
      case 'H':
        if (auto a = internal::ParseListenAddress(optarg); !a.ok()) {
          std::string why(a.status().message());
          absl::StrReplaceAll({{"INPROF_HTTP_ADDR=", "--http="}}, &why);
          return Usage(why);
        }
        s.env["INPROF_HTTP_ADDR"] = optarg;
        break;
      case 'C':
        s.children = false;
        break;
      case 'A':
        s.agent = true;
        break;
      case 'q':
        s.quiet = true;
        break;
      case 'h':
        fputs(kRunHelp, stdout);
        return 0;
      case ':':
        return Usage(absl::StrCat("option '", argv[optind - 1],
                                  "' needs a value"));
      default:
        return Usage(absl::StrCat("unknown option '", argv[optind - 1], "'"));
    }
    if (!st.ok()) return Usage(std::string(st.message()));
  }
  if (optind >= argc) return Usage("no command to run");
  const std::string cmd = argv[optind];

  int exit_code = 1;
  absl::StatusOr<std::string> path = ResolveCommand(cmd, &exit_code);
  if (!path.ok()) {
    PrintError(kCmd, std::string(path.status().message()));
    return exit_code;
  }
  if (std::string why = WhyPreloadCannotWork(cmd, *path); !why.empty()) {
    PrintError(kCmd, why);
    return 1;
  }
  absl::StatusOr<std::string> preload = FindPreload();
  if (!preload.ok()) {
    PrintError(kCmd, std::string(preload.status().message()));
    return 1;
  }

  // The output pattern, absolute: children that change directory write
  // where the user asked.
  const char* env_export = getenv("INPROF_EXPORT_PERIOD");
  if (!s.env.count("INPROF_EXPORT_PERIOD") && env_export == nullptr) {
    s.env["INPROF_EXPORT_PERIOD"] = "0";
  }
  std::string output;
  if (auto it = s.env.find("INPROF_OUTPUT"); it != s.env.end()) {
    output = it->second;
  } else if (const char* o = getenv("INPROF_OUTPUT"); o != nullptr && *o) {
    if (std::strcmp(o, "-") == 0) {
      return Usage("INPROF_OUTPUT='-': each process writes a profile file of "
                   "its own; standard output cannot hold them");
    }
    output = o;
  } else {
    const std::string& period = s.env.count("INPROF_EXPORT_PERIOD")
                                    ? s.env["INPROF_EXPORT_PERIOD"]
                                    : std::string(env_export);
    output = period == "0" ? "inprof-%p.pb.gz" : "inprof-%p-%t.pb.gz";
  }
  if (output[0] != '/') output = absl::StrCat(CurrentDir(), "/", output);
  s.env["INPROF_OUTPUT"] = output;
  const std::string out_dir = Dirname(output);
  // A FIFO or character device (/dev/null) is written into, not replaced:
  // its directory need not be writable.
  struct stat out_st;
  const bool exists = lstat(output.c_str(), &out_st) == 0;
  if (exists && !S_ISREG(out_st.st_mode) && !S_ISCHR(out_st.st_mode) &&
      !S_ISFIFO(out_st.st_mode)) {
    PrintError(kCmd, absl::StrCat("cannot write profiles to '", output, "': it is ",
                                  S_ISLNK(out_st.st_mode)  ? "a symbolic link"
                                  : S_ISDIR(out_st.st_mode) ? "a directory"
                                                            : "not a regular file",
                                  ", which inprof neither writes through nor replaces"));
    return 1;
  }
  const bool special_output = exists &&
                              (S_ISCHR(out_st.st_mode) || S_ISFIFO(out_st.st_mode)) &&
                              access(output.c_str(), W_OK) == 0;
  // access() passes root (and says EACCES, not ENOTDIR, to others) for a
  // file, and passes root for /proc and /sys, where no
  // profile can be created: caught now, not after the run.
  if (!special_output) {
    struct stat dir_st;
    struct statfs fs;
    if (stat(out_dir.c_str(), &dir_st) == 0 && !S_ISDIR(dir_st.st_mode)) {
      PrintError(kCmd, absl::StrCat("cannot write profiles to '", output, "': '",
                                    out_dir, "' is not a directory"));
      return 1;
    }
    if (statfs(out_dir.c_str(), &fs) == 0 &&
        (fs.f_type == PROC_SUPER_MAGIC || fs.f_type == SYSFS_MAGIC)) {
      PrintError(kCmd, absl::StrCat("cannot write profiles to '", output, "': '",
                                    out_dir, "' is in ",
                                    fs.f_type == PROC_SUPER_MAGIC ? "/proc" : "/sys",
                                    ", where no file can be created"));
      return 1;
    }
  }
  if (!special_output && access(out_dir.c_str(), W_OK) != 0) {
    PrintError(kCmd, absl::StrCat("cannot write profiles to '", out_dir,
                                  "': ", strerror(errno)));
    return 1;
  }

  // Each process appends "PATH\tPID\tCOMM" per profile written.
  const char* tmp = getenv("TMPDIR");
  std::string report = absl::StrCat(tmp != nullptr && *tmp ? tmp : "/tmp",
                                    "/inprof-run-XXXXXX");
  const int report_fd = mkstemp(report.data());
  if (report_fd < 0) {
    PrintError(kCmd, absl::StrCat("cannot create '", report, "': ",
                                  strerror(errno)));
    return 1;
  }
  close(report_fd);
  s.env["INPROF_RUN_REPORT"] = report;
  if (!s.children) s.env["INPROF_RUN_CHILDREN"] = "0";
  std::string ld_preload = *preload;
  if (const char* old = getenv("LD_PRELOAD"); old != nullptr && *old) {
    absl::StrAppend(&ld_preload, ":", old);
  }
  s.env["LD_PRELOAD"] = ld_preload;

  // Wrapper mode with an agent: it listens before CMD starts (so the first
  // process's Start() finds it), and the profiles are its to write.
  std::unique_ptr<agent::AgentServer> agent_server;
  if (s.agent) {
    agent::AgentServerOptions ao;
    ao.address = internal::NewAgentSocketAddress();
    ao.log = &LogAgentLine;
    ao.log_connections = false;
    ao.profile = true;
    std::vector<std::string> errors;
    ao.profile_options = Options::FromLookup(
        [&s](const char* name) -> const char* {
          if (auto it = s.env.find(name); it != s.env.end()) return it->second.c_str();
          return getenv(name);
        },
        &errors);
    ao.profile_options.agent_socket.clear();
    if (!ao.profile_options.http_addr.empty()) {
      // The agent serves the endpoint, for every process of the tree; the
      // processes do not (the first would find the port taken).
      s.env.erase("INPROF_HTTP_ADDR");
      s.unset.push_back("INPROF_HTTP_ADDR");
    }
    agent_server = std::make_unique<agent::AgentServer>(ao);
    if (absl::Status st = agent_server->Start(); !st.ok()) {
      PrintError(kCmd, absl::StrCat("cannot start the agent: ", st.message()));
      unlink(report.c_str());
      return 1;
    }
    s.env["INPROF_AGENT_SOCKET"] = ao.address.ToString();
  }

  // The terminal's SIGINT/SIGQUIT reach CMD directly (same process group);
  // SIGTERM and SIGHUP sent to inprof are passed on.
  signal(SIGINT, SIG_IGN);
  signal(SIGQUIT, SIG_IGN);
  struct sigaction fwd;
  std::memset(&fwd, 0, sizeof(fwd));
  fwd.sa_handler = &Forward;
  fwd.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &fwd, nullptr);
  sigaction(SIGHUP, &fwd, nullptr);

  const pid_t child = fork();
  if (child < 0) {
    PrintError(kCmd, absl::StrCat("fork: ", strerror(errno)));
    unlink(report.c_str());
    return 1;
  }
  if (child == 0) {
    signal(SIGINT, SIG_DFL);
    signal(SIGQUIT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    for (const auto& [k, v] : s.env) setenv(k.c_str(), v.c_str(), 1);
    for (const std::string& k : s.unset) unsetenv(k.c_str());
    // CMD is the tree's first process: the one that writes an output
    // pattern without %p as given (run::OutputPatternForThisProcess).
    setenv(run::kFirstPidVariable, absl::StrCat(getpid()).c_str(), 1);
    execv(path->c_str(), argv + optind);
    const int err = errno;
    PrintError(kCmd, absl::StrCat("cannot execute '", cmd, "': ", strerror(err)));
    _exit(err == ENOENT ? 127 : 126);
  }
  g_child = child;
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  g_child = 0;

  int written = 0;
  if (agent_server != nullptr) {
    // Processes of the tree that are still connected get a moment to end
    // (a pipeline's last stage), then their profile up to now.
    for (int i = 0; i < 50; ++i) {
      bool connected = false;
      for (const agent::AgentProcess& p : agent_server->Processes()) {
        connected |= p.connected;
      }
      if (!connected) break;
      usleep(20'000);
    }
    agent_server->Stop();
    // A process that exec'd, or whose program started a profiler of its
    // own after the preload's stepped aside, connected more than once; the
    // file holds what its last connection exported (as without an agent).
    // Without %p in the pattern, the agent writes every process to the
    // same path: the line says whose profiles the last one replaced.
    std::vector<std::string> order;
    std::map<std::string, agent::AgentProcess> by_path;
    std::map<std::string, std::vector<std::string>> replaced;
    for (const agent::AgentProcess& p : agent_server->Processes()) {
      if (p.profiles == 0) continue;
      if (!by_path.count(p.output)) {
        order.push_back(p.output);
      } else if (by_path[p.output].hello.pid != p.hello.pid) {
        replaced[p.output].push_back(absl::StrCat(by_path[p.output].hello.pid));
      }
      by_path[p.output] = p;
    }
    for (const std::string& path : order) {
      const agent::AgentProcess& p = by_path[path];
      ++written;
      if (!s.quiet) {
        std::string note;
        if (p.profiles > 1) absl::StrAppend(&note, "; ", p.profiles, " windows");
        // An empty profile is not a profile of the process's work: said, so
        // that nobody reads its emptiness as an idle process.
        if (p.samples == 0) {
          absl::StrAppend(&note, "; it holds no samples: the process ran too briefly "
                                 "to be sampled, or forwarded nothing to the agent",
                          p.error.empty() ? "" : absl::StrCat(" (", p.error, ")"));
        }
        if (auto it = replaced.find(path); it != replaced.end()) {
          absl::StrAppend(&note, "; it replaced the profile of pid ",
                          absl::StrJoin(it->second, ", pid "));
        }
        fprintf(stderr, "inprof run: wrote %s (pid %d, %s%s)\n", path.c_str(),
                static_cast<int>(p.hello.pid), p.hello.program.c_str(), note.c_str());
      }
    }
  }

  // The report: one line per profile written, in order, and the processes
  // that started profiling (or could not, or failed to write). A file
  // written more than once (each window without %t in the pattern, or a
  // process that replaced another's) holds the last: it is listed once,
  // saying so. A FIFO or device (/dev/null) took every write: each is
  // listed.
  std::vector<ReportedProcess> unwritten;  // started, no profile
  std::map<std::string, std::string> off;  // pid -> why
  bool child_started = false;
  if (FILE* f = fopen(report.c_str(), "re"); f != nullptr) {
    struct Write {
      std::string pid, comm;
    };
    std::vector<std::string> order;
    std::map<std::string, std::vector<Write>> files;
    std::map<std::string, ReportedProcess> started;
    std::vector<std::string> started_order;
    char line[PATH_MAX + 1024];
    while (fgets(line, sizeof(line), f) != nullptr) {
      std::vector<std::string> parts =
          absl::StrSplit(absl::StripSuffix(line, "\n"), '\t');
      if (parts.size() < 3) continue;
      if (parts[1] == absl::StrCat(child)) child_started = true;
      if (parts[0] == "started") {
        if (!started.count(parts[1])) started_order.push_back(parts[1]);
        started[parts[1]] = ReportedProcess{parts[1], parts[2], false, false, {}};
        continue;
      }
      if (parts[0] == "off") {
        off[parts[1]] = parts.size() > 3 ? parts[3] : "";
        continue;
      }
      if (parts[0] == "failed") {
        if (!started.count(parts[1])) started_order.push_back(parts[1]);
        ReportedProcess& p = started[parts[1]];
        p.pid = parts[1];
        p.command = parts[2];
        p.failed = true;
        if (parts.size() > 3) p.failure = parts[3];
        continue;
      }
      started[parts[1]].wrote = true;
      std::vector<Write>& writes = files[parts[0]];
      if (writes.empty()) order.push_back(parts[0]);
      writes.push_back({parts[1], parts[2]});
    }
    fclose(f);
    for (const std::string& path : order) {
      const std::vector<Write>& writes = files[path];
      struct stat st;
      const bool special = lstat(path.c_str(), &st) == 0 &&
                           (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode));
      ++written;
      if (s.quiet) continue;
      if (special) {
        for (const Write& w : writes) {
          fprintf(stderr, "inprof run: wrote %s (pid %s, %s)\n", path.c_str(),
                  w.pid.c_str(), w.comm.c_str());
        }
        continue;
      }
      const Write& last = writes.back();
      std::vector<std::string> replaced;  // other processes' profiles
      for (const Write& w : writes) {
        if (w.pid != last.pid &&
            std::find(replaced.begin(), replaced.end(), w.pid) == replaced.end()) {
          replaced.push_back(w.pid);
        }
      }
      std::string note;
      if (!replaced.empty()) {
        note = absl::StrCat("; it replaced the profile of pid ",
                            absl::StrJoin(replaced, ", pid "));
      } else if (writes.size() > 1) {
        note = absl::StrCat("; the last of ", writes.size(),
                            " windows, each replacing the one before");
      }
      fprintf(stderr, "inprof run: wrote %s (pid %s, %s%s)\n", path.c_str(),
              last.pid.c_str(), last.comm.c_str(), note.c_str());
    }
    for (const std::string& pid : started_order) {
      if (!started[pid].wrote) unwritten.push_back(started[pid]);
    }
  }
  unlink(report.c_str());
  const char* enabled = getenv("INPROF_ENABLED");
  const bool disabled = enabled != nullptr &&
                        !ParseBoolFlag("INPROF_ENABLED", enabled).value_or(true);
  if (!s.quiet && !disabled && agent_server == nullptr) {
    // Each process that sampled and wrote nothing, with what is known of
    // how it ended.
    for (const ReportedProcess& p : unwritten) {
      PrintError(kCmd, WhyNoProfile(p, p.pid == absl::StrCat(child) ? &status : nullptr));
    }
    if (written == 0 && unwritten.empty()) {
      if (auto it = off.find(absl::StrCat(child)); it != off.end()) {
        PrintError(kCmd, absl::StrCat("no profile was written: profiling could not start in '",
                                      cmd, "': ", it->second));
      } else if (!child_started) {
        PrintError(kCmd, absl::StrCat(
            "no profile was written: profiling never started in '", cmd,
            "' (its preload library did not run: a program that clears "
            "LD_PRELOAD or is run through a setuid wrapper is not profiled)"));
      }
    }
  } else if (!s.quiet && !disabled && written == 0) {
    PrintError(kCmd, absl::StrCat("no profile was written by '", cmd, "'",
                                  WIFSIGNALED(status)
                                      ? absl::StrCat(": it was killed by ",
                                                     SignalName(WTERMSIG(status)))
                                      : std::string()));
  }

  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    // Die of the same signal, so a shell sees what CMD did; no core dump
    // of our own.
    if (sig != SIGQUIT && sig != SIGABRT && sig != SIGSEGV && sig != SIGBUS &&
        sig != SIGILL && sig != SIGFPE && sig != SIGSYS && sig != SIGTRAP) {
      signal(sig, SIG_DFL);
      kill(getpid(), sig);
    }
    return 128 + sig;
  }
  return 1;
}

}  // namespace inprof::cli
