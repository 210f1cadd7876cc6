// inprof/options.h: the profiler's configuration and its INPROF_* variables.
//
// Options is a plain value: construct it in code, or read it from the
// environment with Options::FromEnv(). Reading never fails the host: an
// invalid value prints one line to stderr naming the variable, the value and
// the accepted form, and the default is kept.
//
// | variable          | default       | accepted                              |
// |-------------------|---------------|---------------------------------------|
// | INPROF_ENABLED    | 1             | 1/0, true/false, yes/no, on/off       |
// | INPROF_OUTPUT     | inprof.pb.gz  | a file path (non-empty)               |
// | INPROF_CPU_PERIOD | 10ms          | a duration from 1ms to 1h, e.g. 10ms  |
// | INPROF_SYMBOLIZE  | 1             | 1/0, ...: 0 writes addresses, mappings |
// |                   |               | and build-ids only                    |
// | INPROF_WALL_PERIOD | 10ms         | 0 (off) or a duration from 1ms to 1h  |
// | INPROF_WALL_THREADS_PER_TICK | 5  | 1 to 10000                            |
// | INPROF_WALL_CPU_BUDGET | 1%     | 0 (none) or 0.1% to 100% of one core  |
// | INPROF_ALLOC_PERIOD | 0 (off) | 0 or a byte size from 1 to 1GiB, e.g. |
// |                     |         | 512KiB (a Profiler with AllocationProvider) |
// | INPROF_LOCK_PERIOD | 0 (off) | 0 or a duration from 1us to 1h, e.g.  |
// |                   |         | 1ms (a Profiler with LockWaitProvider)    |
// | INPROF_LOCK_ABSL  | 0       | 1/0, ...: absl::Mutex waits too (tracer)  |
// | INPROF_EXPORT_PERIOD | 60s | 0 (one profile at Stop) or 100ms to 24h   |
// | INPROF_STOP_TIMEOUT  | 5s  | 0 to 10m: how long Stop() waits for uploads |
// | INPROF_DATADOG       | off | 1/0, ...; on when DD_TRACE_AGENT_URL or     |
// |                      |     | DD_AGENT_HOST is set                        |
// | DD_TRACE_AGENT_URL   | http://localhost:8126 | http(s)://host:port,      |
// |                      |     | unix:///path                                |
// | DD_AGENT_HOST, DD_TRACE_AGENT_PORT | localhost, 8126 | host; 1 to 65535  |
// | DD_SERVICE, DD_ENV, DD_VERSION, DD_HOSTNAME | | any text                  |
// | DD_TAGS              |     | key:value pairs, comma or space separated   |
// | INPROF_PYROSCOPE_URL |     | http(s)://host:port[/prefix]                |
// | INPROF_APPLICATION_NAME | program name | name or name{key=value,...}    |
// | INPROF_PYROSCOPE_BASIC_AUTH_USER, _PASSWORD, _AUTH_TOKEN, _TENANT_ID     |
// | INPROF_UPLOAD_TIMEOUT | 10s | 100ms to 10m                               |
// | INPROF_UPLOAD_RETRIES | 3   | 0 to 10                                    |
// | INPROF_UPLOAD_BACKOFF | 1s  | 10ms to 10m                                |
// | INPROF_UPLOAD_QUEUE   | 4   | 1 to 64 profiles waiting per endpoint      |
// | INPROF_AGENT_SOCKET   |     | @NAME or a path: profile through the agent |
// | INPROF_AGENT_FALLBACK | local | local or off: when the agent is gone     |
// | INPROF_AGENT          |     | spawn: start an agent when no socket is set |
// | INPROF_AGENT_BINARY   | installed inprof | the `inprof` a spawn runs       |
//
// When an upload is enabled and INPROF_OUTPUT is not set, no file is written
// (write_output = false).
//
// Thread-safety: FromEnv reads the environment; call it before starting
// threads that call setenv.
//
// Example:
//   inprof::Options options = inprof::Options::FromEnv();
//   options.output = "/tmp/service.pb.gz";
//   inprof::DefaultProfiler profiler(options);
#ifndef INPROF_OPTIONS_H_
#define INPROF_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace inprof {

class ProfileSink;  // sink.h

// Upload to a Datadog agent (datadog_uploader.h).
struct DatadogOptions {
  // INPROF_DATADOG, or implied by DD_TRACE_AGENT_URL / DD_AGENT_HOST.
  bool enabled = false;
  // http://host:port, https://host:port or unix:///path/to/socket.
  std::string agent_url = "http://localhost:8126";
  std::string service;  // DD_SERVICE; empty: the program's name
  std::string env;      // DD_ENV
  std::string version;  // DD_VERSION
  // DD_TAGS, one "key:value" per element.
  std::vector<std::string> tags;
  std::string hostname;  // DD_HOSTNAME; empty: gethostname()
};

// Upload to Grafana Pyroscope's /ingest (pyroscope_uploader.h).
struct PyroscopeOptions {
  // http(s)://host:port[/prefix]; empty: no upload.
  std::string url;
  // "name" or "name{key=value,...}"; empty: the program's name.
  std::string application_name;
  std::string basic_auth_user;
  std::string basic_auth_password;
  std::string auth_token;  // sent as "Authorization: Bearer <token>"
  std::string tenant_id;   // sent as X-Scope-OrgID
};

// How uploads behave when the endpoint is slow or failing.
struct UploadOptions {
  // Whole-request limit (connect, send, response).
  absl::Duration timeout = absl::Seconds(10);
  // Further attempts after a failed one (network error, timeout, 5xx, 408,
  // 429); other 4xx are never retried.
  int max_retries = 3;
  // Wait before the first retry; doubles each retry, at most 60s.
  absl::Duration backoff = absl::Seconds(1);
  // Profiles waiting per endpoint; when full the oldest is dropped.
  int max_queued = 4;
};

// How a thread's CPU time turns into profiling signals (cpu_time_provider.h).
enum class CpuEngine {
  kAuto,    // perf, else timer, else itimer: the first that works at Start()
  kPerf,    // a perf-event task clock per thread: hrtimer precision
  kTimer,   // a POSIX CPU timer per thread: checked at scheduler ticks
  kItimer,  // one process-wide ITIMER_PROF: the last resort
};

// "auto", "perf", "timer", "itimer".
const char* CpuEngineName(CpuEngine engine);

// What a process in library mode does when its agent is not there or goes
// away (INPROF_AGENT_FALLBACK).
enum class AgentFallback {
  kLocal,  // profile in the process from then on (the default: no profile
           // is lost because an agent restarted)
  kOff,    // stop profiling: Start() fails, and samples after a loss are
           // counted as lost, not kept
};

struct Options {
  // False turns the profiler into a no-op: no thread, timer, signal handler
  // or file is created.
  bool enabled = true;
  // Where the pprof profile is written when the profiler stops.
  std::string output = "inprof.pb.gz";
  // CPU time a registered thread runs between two of its samples.
  absl::Duration cpu_period = absl::Milliseconds(10);
  // Which CPU engine samples the threads (INPROF_CPU_ENGINE).
  CpuEngine cpu_engine = CpuEngine::kAuto;
  // Most of the file descriptors still free under RLIMIT_NOFILE at Start()
  // that the perf engine may hold, in percent (one per registered thread);
  // threads beyond it are sampled by the timer engine. 0: no perf events.
  int perf_fd_share = 25;
  // The most threads the perf engine arms at once; threads beyond it are
  // sampled by the timer engine. A perf event costs its thread at every
  // context switch (its hrtimer is started and cancelled: ~1.5 us on a VM),
  // which 10,000 napping threads pay in full (process CPU x1.12 against
  // x1.04 with the timer engine); 256 busy threads cover the cores of any
  // machine. 0: no perf events.
  int perf_threads = 256;
  // How often the collector drains the threads' rings (dd-win-prof: 60 ms;
  // 50 ms keeps a 32 KiB ring from filling at the 1 ms period).
  absl::Duration collect_period = absl::Milliseconds(50);
  // Deepest stack recorded; a deeper one is truncated (and counted).
  int max_frames = 512;
  // False: the profile carries addresses and mappings with build-ids only,
  // for symbolizing later (go tool pprof with the binaries at hand).
  bool symbolize = true;
  // Also read the debug info (file:line, inline frames) of system libraries
  // (under /lib, /usr/lib, /lib64, /usr/lib64), from their separate debug
  // files when installed (Debian's -dbg/-dbgsym). Off: their functions are
  // named from their symbol tables; their debug files are compressed, and
  // reading libc's cost ~80 ms of CPU and ~20 MiB at the first export.
  bool system_debug_info = false;
  // Wall time: every `wall_period` `wall_threads_per_tick` registered
  // threads (round-robin; more with many threads, so that a round takes 2 s
  // at most; fewer, at least one, when visits cost more than
  // `wall_cpu_budget` allows: internal::WallTicker) are visited, each visit
  // a wall sample. Zero disables wall sampling.
  absl::Duration wall_period = absl::Milliseconds(10);
  int wall_threads_per_tick = 5;  // the dd-win-prof seed's default
  // The wall sampler's CPU, in percent of one core, that its visits may
  // take (each visit's cost is measured): with more threads than that
  // budget visits every 2 s, rounds grow longer. 0: no budget (a round
  // every 2 s whatever it costs). Linux.
  double wall_cpu_budget = 1.0;
  // Allocations (a Profiler composed with AllocationProvider,
  // inprof/heap/allocation_provider.h; others ignore it): the mean, in
  // bytes, of each thread's countdown between two sampled allocations (Go's
  // MemProfileRate, jemalloc's 2^lg_prof_sample). 0: off. At most 1 GiB.
  uint64_t alloc_period = 0;
  // Where alloc_period came from, for the lines that name it: the variable
  // that set it ("INPROF_ALLOC_PERIOD", "HEAPPROFILE"); empty: the program's
  // own Options.
  std::string alloc_period_source;
  // Lock waits (a Profiler composed with LockWaitProvider,
  // inprof/locks/lock_wait_provider.h; others ignore it): every wait at
  // least this long is sampled, a shorter one with probability
  // delay/lock_period (Go's SetBlockProfileRate). 0: off. 1us to 1h.
  absl::Duration lock_period = absl::ZeroDuration();
  // Where lock_period came from ("INPROF_LOCK_PERIOD"); empty: the
  // program's own Options.
  std::string lock_period_source;
  // With lock_period: absl::Mutex's contended unlocks too, through
  // absl::RegisterMutexTracer (INPROF_LOCK_ABSL). Off by default: Abseil
  // keeps one tracer for the process's life, so the program's own would
  // be refused (and inprof's stays after Stop, doing nothing).
  bool lock_absl = false;
  // The sample type viewers open a profile on (pprof's
  // default_sample_type), e.g. "peak_inuse_space"; empty: the CPU's
  // (cpu-time), or the first provider's period type. A name the
  // composition has no column for is ignored, with one line at Start.
  // `inprof run --alloc` sets peak_inuse_space unless it is set.
  std::string default_sample_type;
  // Length of each profile window: every export_period a profile covering
  // [start, end) goes to the sinks; Stop() exports the last, partial one.
  // Zero: one profile covering Start() to Stop(). (dd-win-prof: 60 s.)
  absl::Duration export_period = absl::Seconds(60);
  // How long Stop() waits for the last profiles to be delivered.
  absl::Duration stop_timeout = absl::Seconds(5);
  // False: no file is written (only uploads and `sinks` get profiles).
  // `output` may contain %p (pid) and %t (window start, UTC, sortable).
  bool write_output = true;
  DatadogOptions datadog;
  PyroscopeOptions pyroscope;
  UploadOptions upload;
  // Extra destinations, set in code.
  std::vector<std::shared_ptr<ProfileSink>> sinks;
  // The live endpoint (/debug/pprof/, after Go's net/http/pprof), served
  // from Start() to Stop(): "PORT" or ":PORT" (127.0.0.1 only),
  // "HOST:PORT", "[IPV6]:PORT"; port 0 picks a free one (logged). Empty:
  // off. Loads libmicrohttpd at Start() when set.
  std::string http_addr;
  // INPROF_DUMP_SIGNAL: the signal the program hands over for a thread
  // dump (every registered thread's stack, as /debug/pprof/threads?debug=2
  // prints it) on its stderr, from Start() to Stop(): SIGQUIT, SIGUSR1,
  // SIGUSR2, SIGHUP, SIGWINCH or a real-time signal, by name ("QUIT",
  // "SIGUSR2") or number. 0: off (the default: inprof never takes a signal
  // it was not given). A signal the program handles itself is left to it.
  int dump_signal = 0;
  // Library mode (INPROF_AGENT_SOCKET): "@NAME" (abstract) or a path where
  // `inprof agent` listens. Set: Start() connects and the process forwards
  // its samples there; aggregation, symbolization, encoding and upload
  // happen in the agent. Empty: all in this process.
  std::string agent_socket;
  AgentFallback agent_fallback = AgentFallback::kLocal;
  // INPROF_AGENT=spawn: with no agent_socket, Start() starts an agent of
  // its own (`inprof agent`, found as agent_binary, else
  // $INPROF_AGENT_BINARY, else the installed one, else `inprof` on PATH),
  // detached from the process, and exports INPROF_AGENT_SOCKET so that
  // programs it exec's join the same agent. That agent exits 2 s after its
  // last process left.
  bool agent_spawn = false;
  std::string agent_binary;

  // Accepted range of cpu_period. Below 1 ms the kernel's CPU-timer checks
  // (at scheduler ticks) bunch samples together and the handler's cost grows.
  static constexpr absl::Duration kMinCpuPeriod = absl::Milliseconds(1);
  static constexpr absl::Duration kMaxCpuPeriod = absl::Hours(1);
  // Accepted range of export_period (besides 0). Below 100 ms the cost of
  // symbolizing and encoding each window dominates.
  static constexpr absl::Duration kMinExportPeriod = absl::Milliseconds(100);
  static constexpr absl::Duration kMaxExportPeriod = absl::Hours(24);
  static constexpr absl::Duration kMaxStopTimeout = absl::Minutes(10);
  static constexpr int kMaxUploadRetries = 10;
  static constexpr int kMaxUploadQueue = 64;
  static constexpr int kMaxPerfThreads = 1 << 20;

  // Reads INPROF_* from the process environment; logs each invalid value.
  static Options FromEnv();

  // Same, from any lookup (returns nullptr for unset variables). Each
  // invalid value is appended to `errors` as one line, e.g.
  // "INPROF_CPU_PERIOD='ten': expected a duration from 1ms to 1h such as
  // 10ms; using 10ms".
  using Lookup = std::function<const char*(const char* name)>;
  static Options FromLookup(const Lookup& lookup,
                            std::vector<std::string>* errors);

  // Checks the fields set in code; the message names the field.
  absl::Status Validate() const;
};

// Parsers shared by the variables; each returns InvalidArgument naming
// `name` and `value` and the accepted form.
absl::StatusOr<bool> ParseBoolFlag(absl::string_view name, absl::string_view value);
absl::StatusOr<absl::Duration> ParseDurationFlag(absl::string_view name,
                                                 absl::string_view value,
                                                 absl::Duration min,
                                                 absl::Duration max,
                                                 bool allow_zero = false,
                                                 absl::string_view example =
                                                     "10ms");
// Whether `name` is a Pyroscope application name: "name" or
// "name{key=value,...}" (keys like Prometheus label names).
bool IsValidApplicationName(absl::string_view name);

// An integer in [min, max].
absl::StatusOr<int64_t> ParseIntFlag(absl::string_view name,
                                     absl::string_view value, int64_t min,
                                     int64_t max);

// An allocation sampling period (INPROF_ALLOC_PERIOD): 0 (off) or a byte
// size from 1 to 1GiB ("524288", "512KiB", "1MiB").
absl::StatusOr<uint64_t> ParseAllocPeriodFlag(absl::string_view name,
                                              absl::string_view value);

}  // namespace inprof

#endif  // INPROF_OPTIONS_H_
