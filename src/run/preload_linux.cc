// libinprof_preload.so's start: what `inprof run` (or LD_PRELOAD by hand)
// loads into an unmodified program. Before main() it reads the environment
// and starts the automatic profiler (auto_profiler.h): every thread
// registered, names followed, the profile written however the program ends,
// each forked or exec'd child profiled too.
//
// A program that uses gperftools' profiler API (linked with -lprofiler) gets
// inprof's implementation of it (src/gperftools/profiler_api.cc, exported
// from this library): it profiles when it calls ProfilerStart or when
// CPUPROFILE is set, as with gperftools, unless `inprof run` started it.
//
// Variables read here besides Options::FromEnv()'s (set by `inprof run`):
//   INPROF_RUN_REPORT  a file each process appends one line to per profile
//                      written ("PATH\tPID\tCOMM"), and one when it starts
//                      ("started\tPID\tCOMM") or cannot ("off\tPID\tCOMM\t
//                      WHY"); unset: nothing reported.
//   INPROF_RUN_CHILDREN=0  children are not profiled: LD_PRELOAD loses this
//                      library for exec'd programs, forks get no profiler.
#include <dlfcn.h>
#include <signal.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "inprof/base/log.h"
#include "inprof/options.h"
#include "src/run/gperftools_env.h"
#include "src/run/auto_profiler.h"

namespace inprof {
namespace {

// inprof's lines on stderr, less the engine line every process would print
// at start (the profile's comments carry it).
void FilterLog(absl::string_view line) {
  if (absl::StartsWith(line, "inprof: cpu engine=")) return;
  internal::WriteLineToStderr(line);
}

// Drops this library from LD_PRELOAD so exec'd programs are not profiled.
void RemoveSelfFromPreload() {
  const char* preload = getenv("LD_PRELOAD");
  if (preload == nullptr) return;
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&RemoveSelfFromPreload), &info) == 0 ||
      info.dli_fname == nullptr) {
    return;
  }
  std::string kept;
  for (absl::string_view part :
       absl::StrSplit(preload, absl::ByAnyChar(": "), absl::SkipEmpty())) {
    if (part == info.dli_fname) continue;
    if (!kept.empty()) kept.push_back(':');
    kept.append(part.data(), part.size());
  }
  if (kept.empty()) {
    unsetenv("LD_PRELOAD");
  } else {
    setenv("LD_PRELOAD", kept.c_str(), 1);
  }
}

// gperftools' libprofiler.so, when the program links it: its own
// constructor has started its profiler already if CPUPROFILE is set, and
// must stop (which leaves SIGPROF ignored, free for inprof's handler).
void StopGperftoolsOwnProfiler() {
  using Fn = void (*)();
  auto real_stop = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "ProfilerStop"));
  if (real_stop != nullptr) real_stop();
}

// libprofiler installs its SIGPROF handler when it loads and keeps it
// (stopped, it ignores the signals): inprof takes SIGPROF over, since the
// program's calls to the API now reach inprof's implementation.
void TakeSigprofFromGperftools() {
  using Fn = int (*)(int, const struct sigaction*, struct sigaction*);
  auto real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "sigaction"));
  if (real == nullptr) return;
  struct sigaction current;
  if (real(SIGPROF, nullptr, &current) != 0) return;
  void* handler = (current.sa_flags & SA_SIGINFO) != 0
                      ? reinterpret_cast<void*>(current.sa_sigaction)
                      : reinterpret_cast<void*>(current.sa_handler);
  if (handler == reinterpret_cast<void*>(SIG_DFL) ||
      handler == reinterpret_cast<void*>(SIG_IGN)) {
    return;
  }
  Dl_info info;
  if (dladdr(handler, &info) == 0 || info.dli_fname == nullptr ||
      std::strstr(info.dli_fname, "libprofiler") == nullptr) {
    return;  // someone else's: Start() says so
  }
  struct sigaction ignore;
  std::memset(&ignore, 0, sizeof(ignore));
  ignore.sa_handler = SIG_IGN;
  real(SIGPROF, &ignore, nullptr);
}

bool ProgramLinksGperftools() {
  return dlsym(RTLD_NEXT, "ProfilerStart") != nullptr;
}

__attribute__((constructor)) void PreloadInit() {
  run::UnblockSigprofAfterExec();
  internal::SetLogSink(&FilterLog);
  const char* children_env = getenv("INPROF_RUN_CHILDREN");
  const bool children =
      !(children_env != nullptr && std::strcmp(children_env, "0") == 0);
  if (!children) RemoveSelfFromPreload();
  Options options = Options::FromEnv();
  if (!options.enabled) return;  // a no-op: the interposed calls pass through
  const char* report_env = getenv("INPROF_RUN_REPORT");
  const std::string report = report_env != nullptr ? report_env : "";
  const bool gperftools_linked = ProgramLinksGperftools();
  if (gperftools_linked) {
    if (getenv("CPUPROFILE") != nullptr) StopGperftoolsOwnProfiler();
    TakeSigprofFromGperftools();
  }
  if (report.empty() && gperftools::StartFromEnvironment(options, report, children)) {
    return;
  }
  if (gperftools_linked && report.empty()) {
    gperftools::ApplyGperftoolsDefaults(options);
  }
  run::Init(options, report, children);
  // A program written against gperftools' API starts and stops profiling
  // itself, unless `inprof run` asked for the whole run.
  if (gperftools_linked && report.empty()) return;
  if (absl::Status s = run::Start(run::OutputPatternForThisProcess(options.output));
      !s.ok()) {
    internal::Log(absl::StrCat("profiling stays off: ", s.message()));
    run::ReportStartFailure(s);
  }
}

}  // namespace
}  // namespace inprof
