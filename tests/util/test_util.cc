#include "util/test_util.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <linux/perf_event.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace inprof::testing {
namespace {

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

void MakeDirs(const std::string& path) {
  for (size_t pos = 1; pos <= path.size(); ++pos) {
    if (pos == path.size() || path[pos] == '/') {
      mkdir(path.substr(0, pos).c_str(), 0755);
    }
  }
}


absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot open '", path, "': ", std::strerror(errno)));
  }
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

absl::StatusOr<std::string> TempFile(const std::string& stem) {
  std::string pattern = absl::StrCat(TestTmpDir(), "/", stem, ".XXXXXX");
  int fd = mkstemp(pattern.data());
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("mkstemp '", pattern, "': ", std::strerror(errno)));
  }
  close(fd);
  return pattern;
}

// Reads all of a popen'ed stream; returns the exit code.
absl::StatusOr<int> PopenRead(const std::string& cmd, std::string* out) {
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) {
    return absl::InternalError(
        absl::StrCat("cannot run '", cmd, "': ", std::strerror(errno)));
  }
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) out->append(buf, n);
  int status = pclose(pipe);
  if (status == -1) {
    return absl::InternalError(
        absl::StrCat("pclose for '", cmd, "': ", std::strerror(errno)));
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

std::string GoCommand(const std::string& args) {
  // pprof keeps state under $HOME/pprof; the directory must exist.
  if (std::string home = Env("HOME"); !home.empty()) MakeDirs(home);
  return absl::StrCat(ShellQuote(Env("INPROF_GO")), " tool pprof ", args);
}

bool ParseInts(absl::string_view text, std::vector<int64_t>* out) {
  for (absl::string_view token :
       absl::StrSplit(text, ' ', absl::SkipWhitespace())) {
    int64_t v;
    if (!absl::SimpleAtoi(token, &v)) return false;
    out->push_back(v);
  }
  return true;
}

// Parses a label line: `key:[value] other key:[value]`.
bool ParseLabels(absl::string_view line,
                 std::map<std::string, std::string>* labels) {
  line = absl::StripAsciiWhitespace(line);
  while (!line.empty()) {
    size_t open = line.find(":[");
    if (open == absl::string_view::npos) return false;
    // A value may hold brackets itself (thread name:[[events]]): it ends at
    // the last "] " before the next key's ":[", or at the line's last ']'.
    const size_t next = line.find(":[", open + 2);
    size_t close = next == absl::string_view::npos ? line.rfind(']') : line.rfind("] ", next);
    if (close == absl::string_view::npos || close < open + 2) return false;
    std::string key(absl::StripAsciiWhitespace(line.substr(0, open)));
    std::string value(line.substr(open + 2, close - open - 2));
    (*labels)[key] = value;
    line = absl::StripLeadingAsciiWhitespace(line.substr(close + 1));
  }
  return true;
}

struct RawLocation {
  std::string address;
  std::vector<std::string> functions;
  std::vector<std::string> file_lines;
  std::vector<std::string> system_names;
};

}  // namespace

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::string EnvOrEmpty(const char* name) {
  const char* v = getenv(name);
  return v != nullptr ? v : "";
}

std::string TestTmpDir() {
  std::string dir = Env("INPROF_TEST_TMPDIR");
  if (dir.empty()) return "/tmp";
  MakeDirs(dir);
  return dir;
}

std::string FreshTestDir(const std::string& name) {
  const std::string dir = absl::StrCat(TestTmpDir(), "/", name, "_", getpid());
  (void)RunCommandSeparately(absl::StrCat("rm -rf ", ShellQuote(dir)));
  mkdir(dir.c_str(), 0755);
  return dir;
}

std::vector<std::string> FilesEndingIn(const std::string& dir, const std::string& suffix) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      if (absl::EndsWith(e->d_name, suffix)) out.push_back(absl::StrCat(dir, "/", e->d_name));
    }
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<CommandOutput> RunCommandSeparately(const std::string& cmd) {
  absl::StatusOr<std::string> err_path = TempFile("stderr");
  if (!err_path.ok()) return err_path.status();
  CommandOutput result;
  absl::StatusOr<int> code = PopenRead(
      absl::StrCat("( ", cmd, " ) 2>", ShellQuote(*err_path)), &result.out);
  absl::StatusOr<std::string> err = ReadFile(*err_path);
  unlink(err_path->c_str());
  if (!code.ok()) return code.status();
  if (!err.ok()) return err.status();
  result.exit_code = *code;
  result.err = *std::move(err);
  return result;
}

absl::StatusOr<std::string> RunCommand(const std::string& cmd) {
  std::string out;
  absl::StatusOr<int> code =
      PopenRead(absl::StrCat("( ", cmd, " ) 2>&1"), &out);
  if (!code.ok()) return code.status();
  if (*code != 0) {
    return absl::InternalError(
        absl::StrCat("'", cmd, "' exited with ", *code, "; output:\n", out));
  }
  return out;
}

bool GoPprofAvailable() { return !Env("INPROF_GO").empty(); }

bool InCi() {
  const std::string ci = absl::AsciiStrToLower(Env("CI"));
  return !ci.empty() && ci != "0" && ci != "false";
}

namespace {

struct Tool {
  const char* name;
  const char* env;      // set by tests/meson.build where found; or
  const char* soname;   // a library inprof loads with dlopen()
  const char* package;  // Debian 12's
};
constexpr Tool kTools[] = {
    {"go", "INPROF_GO", nullptr, "golang-go"},
    {"dwz", "INPROF_DWZ", nullptr, "dwz"},
    {"google-pprof", "INPROF_GOOGLE_PPROF", nullptr, "google-perftools"},
    {"chromium", "INPROF_CHROMIUM", nullptr, "chromium"},
    // Loaded here with dlopen() directly, never through inprof's loaders
    // (the code under test), which name the same sonames.
    {"libcurl", nullptr, "libcurl.so.4", "libcurl4"},
    {"libmicrohttpd", nullptr, "libmicrohttpd.so.12", "libmicrohttpd12"},
};

const Tool* FindTool(const std::string& name) {
  for (const Tool& t : kTools) {
    if (name == t.name) return &t;
  }
  return nullptr;
}

}  // namespace

std::string ToolPath(const std::string& tool) {
  const Tool* t = FindTool(tool);
  if (t == nullptr) return "";
  if (t->soname != nullptr) {
    void* lib = dlopen(t->soname, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return "";
    dlclose(lib);
    return t->soname;
  }
  const std::string path = Env(t->env);
  return !path.empty() && access(path.c_str(), X_OK) == 0 ? path : "";
}

std::string MissingTool(const std::string& tool) {
  const Tool* t = FindTool(tool);
  if (t == nullptr) return absl::StrCat("no such test tool: ", tool);
  if (!ToolPath(tool).empty()) return "";
  if (t->soname != nullptr) {
    return absl::StrCat(tool, " is not installed (dlopen(\"", t->soname,
                        "\") failed; Debian: apt-get install ", t->package, ")");
  }
  return absl::StrCat(tool, " is not installed ($", t->env,
                      " unset or not executable; Debian: apt-get install ",
                      t->package, ", then meson setup --reconfigure)");
}

const PerfProbe& ProbePerfEvents() {
  static const PerfProbe probe = [] {
    PerfProbe p;
    for (const bool kernel : {true, false}) {
      perf_event_attr attr{};
      attr.size = sizeof(attr);
      attr.type = PERF_TYPE_SOFTWARE;
      attr.config = PERF_COUNT_SW_TASK_CLOCK;
      attr.sample_period = 10'000'000;
      attr.disabled = 1;
      attr.exclude_kernel = kernel ? 0 : 1;
      attr.exclude_hv = 1;
      const int fd = static_cast<int>(
          syscall(SYS_perf_event_open, &attr, 0, -1, -1, PERF_FLAG_FD_CLOEXEC));
      if (fd >= 0) {
        close(fd);
        p.user = true;
        p.kernel = p.kernel || kernel;
        break;
      }
      if (kernel) {
        p.reason = absl::StrCat("perf_event_open(task-clock, kernel mode): ",
                                std::strerror(errno));
      } else {
        absl::StrAppend(&p.reason, "; user mode only: ", std::strerror(errno));
      }
    }
    return p;
  }();
  return probe;
}

absl::StatusOr<std::string> GoPprof(const std::string& args_and_path) {
  if (!GoPprofAvailable()) {
    return absl::FailedPreconditionError("INPROF_GO is not set");
  }
  const std::string cmd = GoCommand(args_and_path);
  absl::StatusOr<CommandOutput> result = RunCommandSeparately(cmd);
  if (!result.ok()) return result.status();
  if (result->exit_code != 0) {
    return absl::InternalError(absl::StrCat("'", cmd, "' exited with ",
                                            result->exit_code, "; stderr:\n",
                                            result->err));
  }
  return result->out + result->err;
}

absl::StatusOr<std::string> GoPprofStderr(const std::string& args_and_path) {
  if (!GoPprofAvailable()) {
    return absl::FailedPreconditionError("INPROF_GO is not set");
  }
  const std::string cmd = GoCommand(args_and_path);
  absl::StatusOr<CommandOutput> result = RunCommandSeparately(cmd);
  if (!result.ok()) return result.status();
  if (result->exit_code != 0) {
    return absl::InternalError(absl::StrCat("'", cmd, "' exited with ",
                                            result->exit_code, "; stderr:\n",
                                            result->err));
  }
  return result->err;
}

absl::StatusOr<std::vector<RawSample>> ParseGoPprofRaw(const std::string& raw) {
  // Locations: "     3: 0x55d0c4a1 M=1 name file:line s=0(sysname)", inline
  // callers on following lines indented by 13 spaces. Function names may
  // contain spaces; file names are taken not to.
  static const std::regex kLocation(
      R"(^\s*(\d+): (0x[0-9a-f]+) (M=\d+ )?(\[F\] )?(.*)$)");
  static const std::regex kLine(R"(^(.*) (\S*):(-?\d+) s=(-?\d+)(\(.*\))?$)");

  enum class Section { kHeader, kSampleTypes, kSamples, kLocations, kMappings };
  Section section = Section::kHeader;
  struct PendingSample {
    RawSample sample;
    std::vector<uint64_t> location_ids;
  };
  std::vector<PendingSample> pending;
  std::map<uint64_t, RawLocation> locations;
  RawLocation* current_location = nullptr;

  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(raw, '\n')) {
    ++line_number;
    auto error = [&](absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat("go tool pprof -raw output line ", line_number, " '",
                       line, "': expected ", what));
    };
    if (line == "Samples:") {
      section = Section::kSampleTypes;
      continue;
    }
    if (line == "Locations") {
      section = Section::kLocations;
      continue;
    }
    if (line == "Mappings") {
      section = Section::kMappings;
      continue;
    }
    switch (section) {
      case Section::kHeader:
      case Section::kMappings:
        break;
      case Section::kSampleTypes:
        section = Section::kSamples;  // "type/unit type/unit[dflt]"
        break;
      case Section::kSamples: {
        if (absl::StripAsciiWhitespace(line).empty()) break;
        size_t colon = line.find(": ");
        std::vector<int64_t> values;
        std::vector<int64_t> ids;
        if (colon == absl::string_view::npos) colon = line.size();
        if (colon < line.size() && ParseInts(line.substr(0, colon), &values) &&
            !values.empty() && ParseInts(line.substr(colon + 1), &ids)) {
          PendingSample p;
          p.sample.values = std::move(values);
          for (int64_t id : ids) p.location_ids.push_back(id);
          pending.push_back(std::move(p));
        } else if (!pending.empty() &&
                   ParseLabels(line, &pending.back().sample.labels)) {
        } else {
          return error("values, ':' and location ids, or key:[value] labels");
        }
        break;
      }
      case Section::kLocations: {
        if (absl::StripAsciiWhitespace(line).empty()) break;
        std::string text(line);
        std::smatch m;
        std::string rest;
        if (std::regex_match(text, m, kLocation)) {
          uint64_t id = std::stoull(m[1].str());
          current_location = &locations[id];
          current_location->address = m[2].str();
          rest = m[5].str();
        } else if (current_location != nullptr && line.size() > 13 &&
                   line.substr(0, 13) == std::string(13, ' ')) {
          rest = std::string(line.substr(13));
        } else {
          return error(
              "'<id>: 0x<address> M=<mapping> <function> "
              "<file>:<line> s=<n>' or an indented inline frame");
        }
        if (rest.empty()) break;
        std::smatch lm;
        if (rest == "??") {
          current_location->functions.push_back("??");
          current_location->file_lines.push_back("");
          current_location->system_names.push_back("");
        } else if (std::regex_match(rest, lm, kLine)) {
          current_location->functions.push_back(lm[1].str());
          current_location->file_lines.push_back(
              absl::StrCat(lm[2].str(), ":", lm[3].str()));
          // "(sysname)" only when it differs from the name.
          const std::string sys = lm[5].str();
          current_location->system_names.push_back(
              sys.size() >= 2 ? sys.substr(1, sys.size() - 2) : lm[1].str());
        } else {
          return error("'<function> <file>:<line> s=<n>'");
        }
        break;
      }
    }
  }

  std::vector<RawSample> samples;
  for (PendingSample& p : pending) {
    for (uint64_t id : p.location_ids) {
      auto it = locations.find(id);
      if (it == locations.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("go tool pprof -raw output: a sample names location ",
                         id, "; expected one listed under Locations"));
      }
      const RawLocation& loc = it->second;
      if (loc.functions.empty()) {
        p.sample.stack.push_back(loc.address);
        p.sample.file_lines.push_back("");
        p.sample.system_names.push_back("");
        p.sample.location_ids.push_back(id);
      } else {
        p.sample.stack.insert(p.sample.stack.end(), loc.functions.begin(),
                              loc.functions.end());
        p.sample.file_lines.insert(p.sample.file_lines.end(),
                                   loc.file_lines.begin(),
                                   loc.file_lines.end());
        p.sample.system_names.insert(p.sample.system_names.end(),
                                     loc.system_names.begin(),
                                     loc.system_names.end());
        p.sample.location_ids.insert(p.sample.location_ids.end(),
                                     loc.functions.size(), id);
      }
    }
    samples.push_back(std::move(p.sample));
  }
  return samples;
}

absl::StatusOr<std::vector<RawSample>> ReadWithGoPprofRaw(
    const std::string& profile_path, std::string* pprof_stderr) {
  if (!GoPprofAvailable()) {
    return absl::FailedPreconditionError("INPROF_GO is not set");
  }
  const std::string cmd =
      GoCommand(absl::StrCat("-raw ", ShellQuote(profile_path)));
  absl::StatusOr<CommandOutput> result = RunCommandSeparately(cmd);
  if (!result.ok()) return result.status();
  if (result->exit_code != 0) {
    return absl::InternalError(absl::StrCat("'", cmd, "' exited with ",
                                            result->exit_code, "; stderr:\n",
                                            result->err));
  }
  if (pprof_stderr != nullptr) *pprof_stderr = result->err;
  return ParseGoPprofRaw(result->out);
}

absl::StatusOr<std::string> ProtocDecode(const std::string& profile_path) {
  const std::string protoc = Env("INPROF_PROTOC");
  const std::string proto = Env("INPROF_PROTO");
  if (protoc.empty() || proto.empty()) {
    return absl::FailedPreconditionError(
        "INPROF_PROTOC and INPROF_PROTO must name protoc and profile.proto");
  }
  // gzread passes uncompressed input through unchanged.
  gzFile in = gzopen(profile_path.c_str(), "rb");
  if (in == nullptr) {
    return absl::NotFoundError(absl::StrCat("cannot open '", profile_path,
                                            "': ", std::strerror(errno)));
  }
  std::string raw;
  char buf[1 << 16];
  int n;
  while ((n = gzread(in, buf, sizeof buf)) > 0) raw.append(buf, n);
  int errnum = 0;
  const char* gz_error = gzerror(in, &errnum);
  gzclose(in);
  if (n < 0 || (errnum != Z_OK && errnum != Z_BUF_ERROR)) {
    return absl::DataLossError(
        absl::StrCat("'", profile_path, "': bad gzip data: ", gz_error));
  }
  absl::StatusOr<std::string> raw_path = TempFile("profile.pb");
  if (!raw_path.ok()) return raw_path.status();
  {
    std::ofstream out(*raw_path, std::ios::binary);
    out << raw;
  }
  const size_t slash = proto.rfind('/');
  const std::string proto_dir =
      slash == std::string::npos ? "." : proto.substr(0, slash);
  const std::string proto_file =
      slash == std::string::npos ? proto : proto.substr(slash + 1);
  absl::StatusOr<CommandOutput> result = RunCommandSeparately(absl::StrCat(
      ShellQuote(protoc), " --decode=perftools.profiles.Profile --proto_path=",
      ShellQuote(proto_dir), " ", ShellQuote(proto_file), " < ",
      ShellQuote(*raw_path)));
  unlink(raw_path->c_str());
  if (!result.ok()) return result.status();
  if (result->exit_code != 0 || !result->err.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("protoc --decode of '", profile_path, "' failed (exit ",
                     result->exit_code, "): ", result->err));
  }
  return result->out;
}

absl::Status ProtocDecodeOk(const std::string& profile_path) {
  return ProtocDecode(profile_path).status();
}

std::string HttpReply::header(const std::string& name) const {
  for (const auto& [n, v] : headers) {
    if (absl::EqualsIgnoreCase(n, name)) return v;
  }
  return "";
}

HttpReply HttpFetch(const std::string& address, const std::string& method,
                    const std::string& target, const char* host) {
  HttpReply reply;
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port)) {
    reply.error = "bad address " + address;
    return reply;
  }
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval tv{120, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, address.substr(0, colon).c_str(), &sa.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    reply.error = absl::StrCat("connect: ", std::strerror(errno));
    close(fd);
    return reply;
  }
  const std::string request = absl::StrCat(method, " ", target,
                                           " HTTP/1.1\r\nHost: ",
                                           host != nullptr ? host : address.c_str(),
                                           "\r\nConnection: close\r\n\r\n");
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    reply.error = absl::StrCat("send: ", std::strerror(errno));
    close(fd);
    return reply;
  }
  std::string raw;
  char buf[65536];
  while (true) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      reply.error = absl::StrCat("recv: ", std::strerror(errno));
      break;
    }
    if (n == 0) break;
    raw.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  const size_t end = raw.find("\r\n\r\n");
  if (end == std::string::npos) {
    if (reply.error.empty()) reply.error = "no response head: " + raw;
    return reply;
  }
  std::vector<std::string> lines = absl::StrSplit(raw.substr(0, end), "\r\n");
  std::vector<std::string> status_line = absl::StrSplit(lines[0], ' ');
  if (status_line.size() < 2 || !absl::SimpleAtoi(status_line[1], &reply.status)) {
    reply.error = "bad status line: " + lines[0];
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t c = lines[i].find(':');
    if (c == std::string::npos) continue;
    reply.headers.emplace_back(
        lines[i].substr(0, c),
        std::string(absl::StripAsciiWhitespace(lines[i].substr(c + 1))));
  }
  reply.body = raw.substr(end + 4);
  return reply;
}


int64_t LeafSum(const DecodedProfile& profile, int index, const std::string& site) {
  int64_t sum = 0;
  for (const auto& s : profile.samples) {
    if (!s.stack.empty() && s.stack[0].find(site) != std::string::npos) sum += s.values[index];
  }
  return sum;
}

}  // namespace inprof::testing
