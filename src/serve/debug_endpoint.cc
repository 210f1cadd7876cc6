// The request half of the live endpoint: parsing and validating a request
// line, the one-capture-at-a-time rule, and the responses. No sockets here
// (debug_server_mhd.cc serves it), so it is unit-tested and fuzzed alone.
#include "inprof/internal/debug_endpoint.h"

#if defined(_WIN32)
#include <ws2tcpip.h>  // inet_pton
#else
#include <arpa/inet.h>
#include <unistd.h>

#include "inprof/internal/process_maps.h"
#endif

#include <algorithm>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "inprof/internal/legacy_heap.h"

namespace inprof::internal {
namespace {

constexpr absl::string_view kIndexPath = "/debug/pprof/";
constexpr absl::string_view kProfilePath = "/debug/pprof/profile";
constexpr absl::string_view kFlamegraphPath = "/debug/pprof/flamegraph";
constexpr absl::string_view kSymbolPath = "/debug/pprof/symbol";
constexpr absl::string_view kHeapPath = "/debug/pprof/heap";
constexpr absl::string_view kAllocsPath = "/debug/pprof/allocs";
constexpr absl::string_view kMutexPath = "/debug/pprof/mutex";
constexpr absl::string_view kBlockPath = "/debug/pprof/block";
constexpr absl::string_view kThreadsPath = "/debug/pprof/threads";
constexpr absl::string_view kGoroutinePath = "/debug/pprof/goroutine";

DebugResponse Text(int status, std::string body) {
  DebugResponse r;
  r.status = status;
  r.body = std::move(body);
  r.body.push_back('\n');
  return r;
}

// A request's failure as its answer: NotFound 404 (that profiling is
// off), Unavailable 503 (the profiler stopped or is not running),
// DeadlineExceeded 504 (an agent's process did not answer), else 500.
DebugResponse FailureAnswer(const absl::Status& status) {
  const absl::StatusCode code = status.code();
  return Text(code == absl::StatusCode::kNotFound           ? 404
              : code == absl::StatusCode::kUnavailable      ? 503
              : code == absl::StatusCode::kDeadlineExceeded ? 504
                                                            : 500,
              std::string(status.message()));
}

// A gzip pprof as a download named `name`.pb.gz.
DebugResponse PprofAnswer(std::string pprof, absl::string_view name) {
  DebugResponse r;
  r.content_type = "application/octet-stream";
  r.headers.emplace_back("Content-Disposition",
                         absl::StrCat("attachment; filename=\"", name, ".pb.gz\""));
  r.headers.emplace_back("X-Content-Type-Options", "nosniff");
  r.body = std::move(pprof);
  return r;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// application/x-www-form-urlencoded: %XX and '+'. False on a bad escape.
bool FormDecode(absl::string_view in, std::string* out) {
  out->clear();
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '+') {
      out->push_back(' ');
    } else if (in[i] == '%') {
      if (i + 2 >= in.size()) return false;
      const int hi = HexDigit(in[i + 1]);
      const int lo = HexDigit(in[i + 2]);
      if (hi < 0 || lo < 0) return false;
      out->push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else {
      out->push_back(in[i]);
    }
  }
  return true;
}

std::string HtmlEscape(absl::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

// What is shown of a client's input in an error: printable, bounded.
std::string Quote(absl::string_view s) {
  constexpr size_t kShown = 64;
  std::string out = absl::CHexEscape(s.substr(0, kShown));
  if (s.size() > kShown) out += "...";
  return absl::StrCat("'", out, "'");
}

}  // namespace

bool HostHeaderAllowed(absl::string_view host, const ListenAddress& listening) {
  absl::string_view name = absl::StripAsciiWhitespace(host);
  if (!name.empty() && name.front() == '[') {
    const size_t close = name.find(']');
    if (close == absl::string_view::npos) return false;
    const absl::string_view rest = name.substr(close + 1);
    if (!rest.empty() && rest.front() != ':') return false;
    name = name.substr(1, close - 1);
    unsigned char buffer[16];
    return inet_pton(AF_INET6, std::string(name).c_str(), buffer) == 1;
  }
  // "NAME:PORT"; more than one ':' is no name a browser sends.
  const size_t colon = name.find(':');
  if (colon != absl::string_view::npos) {
    if (name.find(':', colon + 1) != absl::string_view::npos) return false;
    name = name.substr(0, colon);
  }
  const std::string lower = absl::AsciiStrToLower(absl::StripSuffix(name, "."));
  if (lower == "localhost" || lower == absl::AsciiStrToLower(listening.host)) {
    return true;
  }
  unsigned char buffer[16];
  return inet_pton(AF_INET, lower.c_str(), buffer) == 1;
}

DebugEndpoint::DebugEndpoint(Capture capture, Render render,
                             std::string program)
    : capture_(std::move(capture)),
      render_(std::move(render)),
      program_(std::move(program)) {}

DebugEndpoint::DebugEndpoint(ProcessCapture capture, ProcessList processes,
                             Render render, std::string program)
    : process_capture_(std::move(capture)),
      processes_(std::move(processes)),
      render_(std::move(render)),
      program_(std::move(program)) {}

DebugResponse DebugEndpoint::Index() const {
  DebugResponse r;
  r.content_type = "text/html; charset=utf-8";
  const std::string program = HtmlEscape(program_);
  r.body = absl::StrCat(
      "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
      "<title>/debug/pprof/ ", program, "</title></head><body>\n"
      "<h1>/debug/pprof/</h1>\n<p>inprof, profiling ", program, "</p>\n"
      "<table>\n"
      "<tr><td><a href=\"profile?seconds=", kDefaultSeconds,
      "\">profile</a></td><td>CPU and wall time of the next <i>seconds</i> "
      "(default ", kDefaultSeconds, ", at most ", kMaxSeconds,
      "), a gzip pprof file: <code>go tool pprof http://HOST:PORT/debug/"
      "pprof/profile?seconds=30</code></td></tr>\n"
      "<tr><td><a href=\"flamegraph?seconds=", kDefaultSeconds,
      "\">flamegraph</a></td><td>the same, as an interactive flame graph "
      "page</td></tr>\n"
      "<tr><td><a href=\"heap\">heap</a></td><td>the live heap now and what "
      "was allocated since the profiler started (sampled, with "
      "<code>INPROF_ALLOC_PERIOD</code>): <code>go tool pprof "
      "http://HOST:PORT/debug/pprof/heap</code></td></tr>\n"
      "<tr><td><a href=\"allocs\">allocs</a></td><td>the same, opening on "
      "the bytes allocated (<code>alloc_space</code>)</td></tr>\n"
      "<tr><td><a href=\"mutex\">mutex</a></td><td>where threads waited for "
      "locks since the profiler started (<code>contentions</code>, "
      "<code>delay</code>; sampled, with <code>INPROF_LOCK_PERIOD</code>)"
      "</td></tr>\n"
      "<tr><td><a href=\"block\">block</a></td><td>the same (the waiting "
      "threads' stacks)</td></tr>\n"
      "<tr><td><a href=\"threads?debug=2\">threads</a></td><td>every registered "
      "thread's stack now, read without stopping the program: text "
      "(<code>debug=2</code>) or pprof (<code>debug=0</code>; also as "
      "<a href=\"goroutine\">goroutine</a>)</td></tr>\n"
      "</table>\n<form action=\"flamegraph\">seconds: <input name=\"seconds\" "
      "type=\"number\" min=\"1\" max=\"", kMaxSeconds, "\" value=\"10\"> "
      "<button>flame graph</button></form>\n"
      "<p>One capture at a time; another request gets 429.</p>\n",
      Running(), ProcessTable(), "</body></html>\n");
  return r;
}

std::string DebugEndpoint::ProcessTable() const {
  if (!processes_) return "";
  const std::vector<Process> list = processes_();
  std::string out = absl::StrCat(
      "<h2>Processes</h2>\n<p>", list.size(),
      " connected; a capture names one with <code>pid=N</code> (not needed "
      "while only one is connected)</p>\n<table id=\"processes\">\n");
  for (const Process& p : list) {
    absl::StrAppend(&out, "<tr><td>", p.pid, "</td><td>", HtmlEscape(p.program),
                    "</td><td><a href=\"profile?seconds=", kDefaultSeconds,
                    "&amp;pid=", p.pid, "\">profile</a></td><td><a href=\"",
                    "flamegraph?seconds=", kDefaultSeconds, "&amp;pid=", p.pid,
                    "\">flamegraph</a></td>",
                    process_snapshot_ ? absl::StrCat("<td><a href=\"heap?pid=", p.pid,
                                                     "\">heap</a></td>")
                                      : std::string(),
                    "</tr>\n");
  }
  absl::StrAppend(&out, "</table>\n");
  return out;
}

std::string DebugEndpoint::Running() const {
  if (!busy_.load()) return "<p id=\"idle\">No capture is running.</p>\n";
  const int64_t left_ns = busy_until_ns_.load() - absl::GetCurrentTimeNanos();
  return absl::StrCat("<p id=\"running\">A capture is running: ",
                      std::max<int64_t>(0, left_ns / 1'000'000'000),
                      " s left.</p>\n");
}

std::optional<DebugResponse> DebugEndpoint::ParsePid(const std::string& value,
                                                    int64_t* pid) const {
  if (value.empty() || value.size() > 10 ||
      !absl::c_all_of(value, [](char c) { return absl::ascii_isdigit(c); }) ||
      !absl::SimpleAtoi(value, pid) || *pid < 1 || *pid > INT32_MAX) {
    return Text(400, absl::StrCat("pid=", Quote(value),
                                  ": expected a process id (see ", kIndexPath, ")"));
  }
  return std::nullopt;
}

std::optional<DebugResponse> DebugEndpoint::ChooseProcess(int64_t* pid,
                                                         std::string* title) const {
  const std::vector<Process> list = processes_();
  const Process* chosen = nullptr;
  for (const Process& p : list) {
    if (*pid == 0 ? list.size() == 1 : p.pid == *pid) chosen = &p;
  }
  if (chosen == nullptr) {
    if (*pid != 0) {
      return Text(404, absl::StrCat("no process ", *pid, " is connected (see ",
                                    kIndexPath, ")"));
    }
    if (list.empty()) return Text(503, "no process is connected");
    return Text(400, absl::StrCat(list.size(), " processes are connected: add pid=N (see ",
                                  kIndexPath, ")"));
  }
  *pid = chosen->pid;
  *title = absl::StrCat(chosen->program, " (pid ", *pid, ")");
  return std::nullopt;
}

DebugResponse DebugEndpoint::HeapSnapshot(absl::string_view default_type,
                                          absl::string_view query, absl::string_view name) {
  const bool locks = default_type == "delay";
  int64_t pid = 0;  // several processes: 0 until pid= names one
  bool pid_seen = false;
  bool text = false;  // debug=1: the legacy text form, as Go serves it
  int seconds = 0;    // seconds=N: a delta of N seconds (0: the heap now)
  for (absl::string_view pair : absl::StrSplit(query, '&', absl::SkipEmpty())) {
    const absl::string_view key = pair.substr(0, pair.find('='));
    if (key == "pid" && !pid_seen && processes_) {
      pid_seen = true;
      std::string value;
      if (pair.find('=') == absl::string_view::npos ||
          !FormDecode(pair.substr(pair.find('=') + 1), &value)) {
        return Text(400, absl::StrCat("pid: expected pid=N (see ", kIndexPath, ")"));
      }
      if (std::optional<DebugResponse> bad = ParsePid(value, &pid)) return *bad;
      continue;
    }
    if (key == "seconds") {
      // Go answers with the difference of two snapshots N seconds apart.
      if (seconds != 0) continue;  // the first one counts
      const absl::string_view value =
          pair.find('=') == absl::string_view::npos ? "" : pair.substr(pair.find('=') + 1);
      if (value.empty() || value.size() > 4 ||
          !absl::c_all_of(value, [](char c) { return absl::ascii_isdigit(c); }) ||
          !absl::SimpleAtoi(value, &seconds) || seconds < 1 || seconds > kMaxSeconds) {
        return Text(400, absl::StrCat("seconds=", Quote(value),
                                      ": expected a whole number of seconds from 1 to ",
                                      kMaxSeconds));
      }
      continue;
    }
    if (key == "debug") {
      const absl::string_view value =
          pair.find('=') == absl::string_view::npos ? "" : pair.substr(pair.find('=') + 1);
      if (value == "0") continue;
      if (value != "1") {
        return Text(400, absl::StrCat("debug=", Quote(value),
                                      ": expected 0 (pprof) or 1 (the legacy text form)"));
      }
      text = true;
      continue;
    }
  }
  if (processes_ ? !process_snapshot_ : !snapshot_) {
    return Text(404, locks ? "no lock-wait profile here: lock waits are profiled by a "
                             "profiler that composes LockWaitProvider, in its own process"
                           : "no heap profile here: allocations are profiled by a profiler "
                             "that composes AllocationProvider, in its own process");
  }
  if (processes_) {
    std::string title;
    if (std::optional<DebugResponse> none = ChooseProcess(&pid, &title)) return *none;
  }
  // A delta waits N seconds: one at a time, as captures are.
  bool expected = false;
  if (seconds > 0 && !busy_.compare_exchange_strong(expected, true)) {
    refused_.fetch_add(1);
    return Text(429, "a capture is already running: one at a time; retry after it");
  }
  if (seconds > 0) {
    busy_until_ns_.store(absl::GetCurrentTimeNanos() + int64_t{seconds} * 1'000'000'000);
  }
  absl::StatusOr<std::string> pprof =
      processes_ ? process_snapshot_(default_type, pid, absl::Seconds(seconds))
                 : snapshot_(default_type, absl::Seconds(seconds));
  if (seconds > 0) busy_.store(false);
  if (!pprof.ok()) return FailureAnswer(pprof.status());
  captures_.fetch_add(1);
  if (text) {
    // The legacy heap profile text (gperftools' and Go's debug=1 form:
    // "heap profile: ..." then a line per stack and the mappings), which
    // go tool pprof and google-pprof read.
#if defined(_WIN32)
    return Text(400, "debug=1: the legacy text form names the process's mappings, which "
                     "the Windows backend does not read; the pprof form (debug=0) has them");
#else
    std::string maps;
    if (auto read = internal::ReadProcessMaps(
            processes_ ? static_cast<pid_t>(pid) : getpid(), &maps);
        !read.ok()) {
      return Text(500, absl::StrCat("debug=1: ", read.status().message()));
    }
    absl::StatusOr<std::string> legacy =
        locks ? internal::PprofToLegacyContention(*pprof, maps,
                                                  name == "mutex" ? "mutex" : "contention")
              : internal::PprofToLegacyHeapProfile(*pprof, maps);
    if (!legacy.ok()) return Text(500, absl::StrCat("debug=1: ", legacy.status().message()));
    DebugResponse r = Text(200, "");
    r.body = std::move(*legacy);
    return r;
#endif
  }
  return PprofAnswer(*std::move(pprof), name);
}

DebugResponse DebugEndpoint::Threads(absl::string_view query, absl::string_view name) {
  int debug = 0;  // 1: text grouped by stack, 2: a block per thread, as Go's goroutines
  int64_t pid = 0;
  bool pid_seen = false;
  for (absl::string_view pair : absl::StrSplit(query, '&', absl::SkipEmpty())) {
    const size_t eq = pair.find('=');
    if (pair.substr(0, eq) == "pid" && !pid_seen && processes_) {
      pid_seen = true;
      std::string value;
      if (eq == absl::string_view::npos || !FormDecode(pair.substr(eq + 1), &value)) {
        return Text(400, absl::StrCat("pid: expected pid=N (see ", kIndexPath, ")"));
      }
      if (std::optional<DebugResponse> bad = ParsePid(value, &pid)) return *bad;
      continue;
    }
    if (pair.substr(0, eq) != "debug") continue;
    const absl::string_view value = eq == absl::string_view::npos ? "" : pair.substr(eq + 1);
    if (value != "0" && value != "1" && value != "2") {
      return Text(400, absl::StrCat("debug=", Quote(value),
                                    ": expected 0 (pprof), 1 (text, threads grouped by "
                                    "stack) or 2 (text, a block per thread)"));
    }
    debug = value[0] - '0';
  }
  if (processes_ ? !process_thread_dump_ : !thread_dump_) {
    return Text(404, absl::StrCat("/debug/pprof/", name, " is served by the endpoint of the "
                                  "profiled process itself (INPROF_HTTP_ADDR): it reads the "
                                  "threads registered with its profiler"));
  }
  if (processes_) {
    std::string title;
    if (std::optional<DebugResponse> none = ChooseProcess(&pid, &title)) return *none;
  }
  absl::StatusOr<std::string> dump =
      processes_ ? process_thread_dump_(name, debug, pid) : thread_dump_(name, debug);
  if (!dump.ok()) return FailureAnswer(dump.status());
  captures_.fetch_add(1);
  if (debug != 0) {
    DebugResponse r = Text(200, "");
    r.body = std::move(*dump);
    return r;
  }
  return PprofAnswer(*std::move(dump), name);
}

DebugResponse DebugEndpoint::Respond(absl::string_view method,
                                     absl::string_view target) {
  if (target.size() > kMaxTargetLength) {
    return Text(414, absl::StrCat("request target longer than ",
                                  kMaxTargetLength, " bytes"));
  }
  const bool head = method == "HEAD";
  const size_t q = target.find('?');
  const absl::string_view path = target.substr(0, q);
  if (path == kSymbolPath) {
    // go tool pprof posts the addresses of unnamed locations here (symbolz)
    // and gives up on the whole profile unless it gets a 200. Captures are
    // symbolized in the process already, with everything it has: what is
    // unnamed there stays unnamed, so the answer names no address.
    if (method == "POST") return Text(200, "");
    if (method == "GET" || head) return Text(200, "num_symbols: 1");
  }
  if (method != "GET" && !head) {
    DebugResponse r = Text(405, absl::StrCat("method ", Quote(method),
                                             " not allowed: use GET"));
    r.headers.emplace_back("Allow", "GET, HEAD");
    return r;
  }
  const absl::string_view query =
      q == absl::string_view::npos ? absl::string_view() : target.substr(q + 1);
  if (path == kIndexPath || path == "/debug/pprof") return Index();
  if (path == kHeapPath || path == kAllocsPath) {
    if (head) return Text(200, "");
    return HeapSnapshot(path == kHeapPath ? "inuse_space" : "alloc_space", query,
                        path == kHeapPath ? "heap" : "allocs");
  }
  if (path == kMutexPath || path == kBlockPath) {
    if (head) return Text(200, "");
    return HeapSnapshot("delay", query, path == kMutexPath ? "mutex" : "block");
  }
  if (path == kThreadsPath || path == kGoroutinePath) {
    if (head) return Text(200, "");
    return Threads(query, path == kThreadsPath ? "threads" : "goroutine");
  }
  const bool profile = path == kProfilePath;
  const bool flamegraph = path == kFlamegraphPath;
  if (!profile && !flamegraph) {
    return Text(404, absl::StrCat("no page ", Quote(path), ": see ",
                                  kIndexPath));
  }
  if (head) {
    DebugResponse r = Text(405, "a capture needs GET");
    r.headers.emplace_back("Allow", "GET");
    return r;
  }

  int seconds = kDefaultSeconds;
  bool seen = false;
  int64_t pid = 0;  // 0: not given
  bool pid_seen = false;
  for (absl::string_view pair : absl::StrSplit(query, '&', absl::SkipEmpty())) {
    const size_t eq = pair.find('=');
    std::string key;
    std::string value;
    if (!FormDecode(pair.substr(0, eq), &key) ||
        (eq != absl::string_view::npos &&
         !FormDecode(pair.substr(eq + 1), &value))) {
      return Text(400, absl::StrCat("bad %-escape in the query ",
                                    Quote(query)));
    }
    if (key == "pid" && !pid_seen && processes_) {
      pid_seen = true;
      if (std::optional<DebugResponse> bad = ParsePid(value, &pid)) return *bad;
      continue;
    }
    if (key != "seconds" || seen) continue;  // the first one counts
    seen = true;
    int parsed = 0;
    if (value.empty() || value.size() > 4 ||
        !absl::c_all_of(value, [](char c) { return absl::ascii_isdigit(c); }) ||
        !absl::SimpleAtoi(value, &parsed) || parsed < 1 ||
        parsed > kMaxSeconds) {
      return Text(400, absl::StrCat("seconds=", Quote(value),
                                    ": expected a whole number of seconds "
                                    "from 1 to ", kMaxSeconds));
    }
    seconds = parsed;
  }

  std::string title = program_;
  if (processes_) {
    if (std::optional<DebugResponse> none = ChooseProcess(&pid, &title)) return *none;
  }

  bool expected = false;
  if (!busy_.compare_exchange_strong(expected, true)) {
    refused_.fetch_add(1);
    const int64_t left_ns =
        busy_until_ns_.load() - absl::GetCurrentTimeNanos();
    const int64_t left = std::max<int64_t>(1, (left_ns + 999'999'999) /
                                                  1'000'000'000);
    DebugResponse r = Text(429, absl::StrCat(
        "a capture is already running (", left,
        " s left): one at a time; retry after it"));
    r.headers.emplace_back("Retry-After", absl::StrCat(left));
    return r;
  }
  busy_until_ns_.store(absl::GetCurrentTimeNanos() +
                       int64_t{seconds} * 1'000'000'000);
  absl::StatusOr<std::string> pprof =
      processes_ ? process_capture_(absl::Seconds(seconds), pid)
                 : capture_(absl::Seconds(seconds));
  busy_.store(false);
  if (!pprof.ok()) {
    const absl::StatusCode code = pprof.status().code();
    return Text(code == absl::StatusCode::kUnavailable ? 503
                : code == absl::StatusCode::kNotFound  ? 404
                                                       : 500,
                std::string(pprof.status().message()));
  }
  captures_.fetch_add(1);
  if (profile) {
    DebugResponse r;
    r.content_type = "application/octet-stream";
    r.headers.emplace_back("Content-Disposition",
                           "attachment; filename=\"profile.pb.gz\"");
    r.headers.emplace_back("X-Content-Type-Options", "nosniff");
    r.body = std::move(*pprof);
    return r;
  }
  absl::StatusOr<std::string> page =
      render_(*pprof, absl::StrCat(title, " (live, ", seconds, " s)"));
  if (!page.ok()) return Text(500, std::string(page.status().message()));
  DebugResponse r;
  r.content_type = "text/html; charset=utf-8";
  r.body = std::move(*page);
  return r;
}

}  // namespace inprof::internal
