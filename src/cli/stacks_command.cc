// `inprof stacks PID|HOST:PORT`: every registered thread's stack of a
// running process, now, without stopping it -- what its live endpoint
// serves at /debug/pprof/threads (a process started with INPROF_HTTP_ADDR,
// or under `inprof run --http`). Given a pid, the endpoint is found among
// the TCP sockets the process listens on (/proc/PID/fd and
// /proc/PID/net/tcp{,6}: the same user, or root), each asked in turn; a
// process in library mode listens on none, and its agent's endpoint is
// asked for it (?pid=PID), the agent found as the process that holds the
// process's ring memory (a memfd "inprof-rings-PID").
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "inprof/internal/http_client.h"
#include "src/cli/command.h"

namespace inprof::cli {

extern const char kStacksHelp[] =
    "usage: inprof stacks [-o FILE] PID|HOST:PORT\n"
    "       inprof stacks [-o FILE] --pid PID HOST:PORT\n"
    "\n"
    "Prints the stack of every thread registered with the profiler of a running\n"
    "process, read while the process runs on (blocked threads are read without\n"
    "a signal): its live endpoint's /debug/pprof/threads?debug=2. The process\n"
    "serves one when started with INPROF_HTTP_ADDR (e.g. 127.0.0.1:0) or under\n"
    "`inprof run --http=ADDR`. Given a PID, the endpoint is found among the TCP\n"
    "ports the process listens on (needs the right to read /proc/PID/fd: the\n"
    "same user, or root).\n"
    "\n"
    "A process that profiles through `inprof agent` (library mode) is dumped by\n"
    "way of the agent's endpoint (`inprof agent --http=ADDR`), found from the\n"
    "PID (the agent holds the process's shared memory), or given as HOST:PORT\n"
    "with --pid PID; the agent asks the process for its threads and\n"
    "symbolizes them.\n"
    "\n"
    "  --pid PID the process, at an agent's endpoint\n"
    "  -o FILE   write the dump as pprof (one sample per thread) to FILE instead\n"
    "            (`go tool pprof -traces FILE` reads it)\n";

namespace {

constexpr size_t kMaxDumpBytes = size_t{256} << 20;

// The socket inodes in descriptor table `dir` ("socket:[N]" links).
void SocketInodesIn(const std::string& dir, absl::flat_hash_set<uint64_t>& inodes) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return;
  while (dirent* e = readdir(d)) {
    char target[64];
    const std::string link = absl::StrCat(dir, "/", e->d_name);
    const ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
    if (n <= 0) continue;
    uint64_t inode = 0;
    absl::string_view t(target, static_cast<size_t>(n));
    if (absl::ConsumePrefix(&t, "socket:[") && absl::ConsumeSuffix(&t, "]") &&
        absl::SimpleAtoi(t, &inode)) {
      inodes.insert(inode);
    }
  }
  closedir(d);
}

// The socket inodes process `pid` holds: in its own descriptor table, and
// in those of its threads named inprof-* (the endpoint's thread listens
// from a table of inprof's own, which /proc/PID/fd does not show).
absl::flat_hash_set<uint64_t> SocketInodes(int pid, std::string* error) {
  absl::flat_hash_set<uint64_t> inodes;
  const std::string fd_dir = absl::StrCat("/proc/", pid, "/fd");
  if (access(fd_dir.c_str(), R_OK | X_OK) != 0) {
    *error = absl::StrCat(fd_dir, ": ", strerror(errno),
                          errno == EACCES ? " (another user's process: run as that user or "
                                            "root, or name its endpoint as HOST:PORT)"
                                          : "");
    return inodes;
  }
  SocketInodesIn(fd_dir, inodes);
  const std::string tasks = absl::StrCat("/proc/", pid, "/task");
  DIR* d = opendir(tasks.c_str());
  if (d == nullptr) return inodes;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream comm(absl::StrCat(tasks, "/", e->d_name, "/comm"));
    std::string name;
    std::getline(comm, name);
    if (absl::StartsWith(name, "inprof-")) {
      SocketInodesIn(absl::StrCat(tasks, "/", e->d_name, "/fd"), inodes);
    }
  }
  closedir(d);
  return inodes;
}

// "HOST:PORT" of each TCP socket of `inodes` listening in /proc/PID/net/
// `file` (tcp or tcp6), as a client on this machine reaches it.
void ListeningAddresses(int pid, const char* file, const absl::flat_hash_set<uint64_t>& inodes,
                        std::vector<std::string>& out) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/net/", file));
  std::string line;
  std::getline(in, line);  // the header
  const bool v6 = std::strcmp(file, "tcp6") == 0;
  while (std::getline(in, line)) {
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
    if (f.size() < 10 || f[3] != "0A") continue;  // 0A: LISTEN
    uint64_t inode = 0;
    if (!absl::SimpleAtoi(f[9], &inode) || !inodes.contains(inode)) continue;
    const size_t colon = f[1].find(':');
    if (colon == absl::string_view::npos) continue;
    uint32_t port = 0;
    if (!absl::SimpleHexAtoi(f[1].substr(colon + 1), &port)) continue;
    const absl::string_view host = f[1].substr(0, colon);
    // Any address or the loopback: asked on the loopback; another: as is
    // (the kernel writes IPv4 addresses as one little-endian word).
    std::string address;
    if (!v6) {
      uint32_t ip = 0;
      if (!absl::SimpleHexAtoi(host, &ip)) continue;
      address = (ip == 0) ? "127.0.0.1"
                          : absl::StrCat(ip & 0xff, ".", (ip >> 8) & 0xff, ".",
                                         (ip >> 16) & 0xff, ".", ip >> 24);
    } else {
      address = "[::1]";  // [::] or [::1]: the loopback answers for both
    }
    out.push_back(absl::StrCat(address, ":", port));
  }
}

// The agent that serves process `pid` in library mode, or 0: the process
// maps the shared memory the agent made for it (a memfd named
// "inprof-rings-PID"), and the agent holds that same memfd open.
int AgentOf(int pid) {
  const std::string name = absl::StrCat("/memfd:inprof-rings-", pid, " (deleted)");
  std::ifstream maps(absl::StrCat("/proc/", pid, "/maps"));
  std::string line;
  uint64_t inode = 0;
  while (inode == 0 && std::getline(maps, line)) {
    if (!absl::EndsWith(line, name)) continue;
    // address perms offset dev inode path
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() < 6 || !absl::SimpleAtoi(f[4], &inode)) inode = 0;
  }
  if (inode == 0) return 0;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return 0;
  int agent = 0;
  while (agent == 0) {
    dirent* e = readdir(proc);
    if (e == nullptr) break;
    int other = 0;
    if (!absl::SimpleAtoi(e->d_name, &other) || other == pid) continue;
    const std::string fd_dir = absl::StrCat("/proc/", other, "/fd");
    DIR* fds = opendir(fd_dir.c_str());
    if (fds == nullptr) continue;  // another user's
    while (dirent* fd = readdir(fds)) {
      char target[128];
      const std::string link = absl::StrCat(fd_dir, "/", fd->d_name);
      const ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
      struct stat st {};
      if (n > 0 && absl::string_view(target, static_cast<size_t>(n)) == name &&
          stat(link.c_str(), &st) == 0 && st.st_ino == inode) {
        agent = other;
        break;
      }
    }
    closedir(fds);
  }
  closedir(proc);
  return agent;
}

bool LooksLikePid(const std::string& s) {
  int pid = 0;
  return !s.empty() && s.find(':') == std::string::npos && absl::SimpleAtoi(s, &pid) && pid > 0;
}

}  // namespace

int StacksMain(int argc, char** argv) {
  std::string pid_at;  // --pid: the process at an agent's endpoint
  std::string output;
  std::string target;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      fputs(kStacksHelp, stdout);
      return 0;
    }
    if (arg == "-o" && i + 1 < argc) {
      output = argv[++i];
    } else if (arg == "--pid" && i + 1 < argc && LooksLikePid(argv[i + 1]) && pid_at.empty()) {
      pid_at = argv[++i];
    } else if (absl::StartsWith(arg, "-o") && arg.size() > 2) {
      output = arg.substr(2);
    } else if (target.empty() && !absl::StartsWith(arg, "-")) {
      target = arg;
    } else {
      PrintError("stacks",
                 absl::StrCat("unexpected argument '", arg, "'; see inprof stacks --help"));
      return 2;
    }
  }
  if (target.empty()) {
    PrintError("stacks", "expected a PID or HOST:PORT; see inprof stacks --help");
    return 2;
  }
  if (absl::Status s = internal::HttpClient::Available(); !s.ok()) {
    PrintError("stacks", std::string(s.message()));
    return 1;
  }
  std::vector<std::string> candidates;
  if (!pid_at.empty() && LooksLikePid(target)) {
    PrintError("stacks", "--pid names the process at an agent's HOST:PORT, not at a PID");
    return 2;
  }
  if (LooksLikePid(target)) {
    const int pid = std::stoi(target);
    std::string error;
    const absl::flat_hash_set<uint64_t> inodes = SocketInodes(pid, &error);
    if (!error.empty()) {
      PrintError("stacks", error);
      return 1;
    }
    ListeningAddresses(pid, "tcp", inodes, candidates);
    ListeningAddresses(pid, "tcp6", inodes, candidates);
    // A process in library mode: its agent's endpoint, for this pid.
    if (const int agent = candidates.empty() ? AgentOf(pid) : 0; agent != 0) {
      const absl::flat_hash_set<uint64_t> agent_inodes = SocketInodes(agent, &error);
      ListeningAddresses(agent, "tcp", agent_inodes, candidates);
      ListeningAddresses(agent, "tcp6", agent_inodes, candidates);
      if (candidates.empty()) {
        PrintError("stacks", absl::StrCat("process ", pid, " profiles through inprof agent "
                                          "(pid ", agent, "), which serves no endpoint: start "
                                          "the agent with --http=127.0.0.1:0"));
        return 1;
      }
      pid_at = absl::StrCat(pid);
    }
    if (candidates.empty()) {
      PrintError("stacks", absl::StrCat("process ", pid, " listens on no TCP port: start it "
                                        "with INPROF_HTTP_ADDR=127.0.0.1:0 (or under inprof run "
                                        "--http=127.0.0.1:0) for its live endpoint; or, if it "
                                        "profiles through an agent with --http, ask the agent: "
                                        "inprof stacks --pid ", pid, " HOST:PORT"));
      return 1;
    }
  } else {
    candidates.push_back(target);
  }
  internal::HttpClient client;
  std::string last_error;
  for (const std::string& address : candidates) {
    internal::HttpRequest request;
    request.get = true;
    request.url = absl::StrCat("http://", address, "/debug/pprof/threads",
                               output.empty() ? "?debug=2" : "?debug=0",
                               pid_at.empty() ? "" : absl::StrCat("&pid=", pid_at));
    request.timeout = absl::Seconds(30);
    request.max_response_body = kMaxDumpBytes;
    absl::StatusOr<internal::HttpResponse> reply = client.Send(request);
    if (!reply.ok()) {
      last_error = std::string(reply.status().message());
      continue;
    }
    if (reply->status != 200) {
      last_error = absl::StrCat("GET ", request.url, ": HTTP ", reply->status, ": ",
                                reply->body.substr(0, reply->body.find('\n')));
      continue;
    }
    if (output.empty()) {
      if (!absl::StartsWith(reply->body, "# thread dump")) {
        last_error = absl::StrCat(address, " is not an inprof endpoint");
        continue;
      }
      fwrite(reply->body.data(), 1, reply->body.size(), stdout);
      return 0;
    }
    std::ofstream out(output, std::ios::binary);
    out.write(reply->body.data(), static_cast<std::streamsize>(reply->body.size()));
    if (!out.good()) {
      PrintError("stacks", absl::StrCat(output, ": cannot write"));
      return 1;
    }
    fprintf(stderr, "inprof stacks: %s: a thread dump of %zu bytes from %s\n", output.c_str(),
            reply->body.size(), address.c_str());
    return 0;
  }
  PrintError("stacks", absl::StrCat("no thread dump from ", target, ": ", last_error));
  return 1;
}

}  // namespace inprof::cli
