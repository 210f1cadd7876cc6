// libFuzzer target: the live endpoint's request handling (DebugEndpoint::
// Respond) and INPROF_HTTP_ADDR (ParseListenAddress).
//
// Input: "METHOD TARGET" (the first space splits; no space: GET); the whole
// input is also parsed as an address. Captures answer at once with fixed
// bytes. Checked: nothing crashes; every answer has a known status; a
// plain-text answer is one line; a capture runs only for a valid request,
// for 1 to 600 s; an accepted address re-parses to itself. The same request
// also goes to an endpoint for several processes (pid=N), whose captures
// are only of the processes it lists.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "inprof/internal/debug_endpoint.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

// Every answer: a known status, a plain-text one is one line (but a thread
// dump's text, `dump`), and a capture ran (at most once) only for a 200.
void CheckResponse(const inprof::internal::DebugResponse& r, int captures, bool dump = false) {
  switch (r.status) {
    case 200: case 400: case 404: case 405: case 414: case 429: case 500:
    case 503: case 504:
      break;
    default:
      std::abort();
  }
  if (absl::StartsWith(r.content_type, "text/plain") && !dump) {
    Check(!r.body.empty() && r.body.back() == '\n' &&
          r.body.find('\n') == r.body.size() - 1);
  }
  Check(captures <= 1);
  if (captures == 1) Check(r.status == 200);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);

  absl::StatusOr<inprof::internal::ListenAddress> address =
      inprof::internal::ParseListenAddress(input);
  if (address.ok()) {
    Check(address->port >= 0 && address->port <= 65535);
    auto again = inprof::internal::ParseListenAddress(
        inprof::internal::FormatListenAddress(*address));
    Check(again.ok() && again->host == address->host &&
          again->port == address->port && again->ipv6 == address->ipv6);
  } else {
    Check(absl::StartsWith(address.status().message(), "INPROF_HTTP_ADDR='"));
    Check(address.status().message().find('\n') == absl::string_view::npos);
  }

  int captures = 0;
  inprof::internal::DebugEndpoint endpoint(
      [&](absl::Duration d) -> absl::StatusOr<std::string> {
        Check(d >= absl::Seconds(1) && d <= absl::Seconds(600));
        ++captures;
        return std::string("\x1f\x8b", 2);
      },
      [](const std::string& pprof,
         absl::string_view) -> absl::StatusOr<std::string> { return pprof; },
      "fuzz");
  int snapshots = 0;
  endpoint.SetSnapshot([&](absl::string_view type,
                           absl::Duration delta) -> absl::StatusOr<std::string> {
    // /heap, /allocs, and /mutex and /block (the lock waits, opening on delay).
    Check(type == "inuse_space" || type == "alloc_space" || type == "delay");
    // seconds=N: a delta of 1 to kMaxSeconds seconds, or the heap now.
    Check(delta == absl::ZeroDuration() ||
          (delta >= absl::Seconds(1) && delta <= absl::Seconds(inprof::internal::DebugEndpoint::kMaxSeconds)));
    ++snapshots;
    if (snapshots > 1) std::abort();
    return std::string("\x1f\x8b", 2);
  });
  // /threads and /goroutine: a dump of one sample type, pprof or text.
  int dumps = 0;
  bool dump_text = false;
  endpoint.SetThreadDump([&](absl::string_view type,
                             int debug) -> absl::StatusOr<std::string> {
    Check(type == "threads" || type == "goroutine");
    ++dumps;
    if (dumps > 1) std::abort();
    Check(debug >= 0 && debug <= 2);
    dump_text = debug != 0;
    return dump_text ? std::string("thread 1 \"a\" [running]:\nf\n\t?\n\n")
                : std::string("\x1f\x8b", 2);
  });
  const size_t space = input.find(' ');
  const absl::string_view method =
      space == std::string::npos ? absl::string_view("GET")
                                 : absl::string_view(input).substr(0, space);
  const absl::string_view target =
      space == std::string::npos ? absl::string_view(input)
                                 : absl::string_view(input).substr(space + 1);
  const inprof::internal::DebugResponse answer = endpoint.Respond(method, target);
  CheckResponse(answer, captures + snapshots + dumps, dump_text);

  // The same request to an endpoint for several processes (`inprof agent
  // --http`: pid=N picks one of two): a capture only of a listed pid.
  int process_captures = 0;
  inprof::internal::DebugEndpoint agent(
      [&](absl::Duration d, int64_t pid) -> absl::StatusOr<std::string> {
        Check(d >= absl::Seconds(1) && d <= absl::Seconds(600));
        Check(pid == 11 || pid == 4242);
        ++process_captures;
        return std::string("\x1f\x8b", 2);
      },
      [] {
        return std::vector<inprof::internal::DebugEndpoint::Process>{{11, "a"}, {4242, "b<"}};
      },
      [](const std::string& pprof,
         absl::string_view) -> absl::StatusOr<std::string> { return pprof; },
      "fuzz agent");
  CheckResponse(agent.Respond(method, target), process_captures);
  return 0;
}
