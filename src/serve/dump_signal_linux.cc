#include "inprof/internal/dump_signal.h"

#include <semaphore.h>
#include <string.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "absl/strings/str_cat.h"
#include "inprof/base/log.h"
#include "inprof/base/owned_fd.h"

namespace inprof::internal {

namespace {

// One handler for the process (one profiler runs at a time): it wakes the
// dump thread, and nothing else.
sem_t g_wake;
std::atomic<bool> g_stop{false};
bool g_made = false;  // g_wake initialized (Started, under the pipeline's start)

void OnDumpSignal(int) {
  const int saved_errno = errno;
  sem_post(&g_wake);
  errno = saved_errno;
}

}  // namespace

void DumpSignalAttachment::Started(Pipeline& pipeline) {
  const std::string name = absl::StrCat(strsignal(signal_), " (", signal_, ")");
  struct sigaction current {};
  if (sigaction(signal_, nullptr, &current) != 0) return;
  const bool handled = (current.sa_flags & SA_SIGINFO) != 0
                           ? current.sa_sigaction != nullptr
                           : current.sa_handler != SIG_DFL && current.sa_handler != SIG_IGN;
  if (handled) {
    Log(absl::StrCat("INPROF_DUMP_SIGNAL: the program handles ", name,
                     " itself; no thread dump on it"));
    return;
  }
  if (!g_made) {
    sem_init(&g_wake, 0, 0);
    g_made = true;
  }
  while (sem_trywait(&g_wake) == 0) {
  }
  g_stop.store(false);
  thread_ = ProfilerThread([this, &pipeline, name] {
    for (;;) {
      while (sem_wait(&g_wake) != 0 && errno == EINTR) {
      }
      if (g_stop.load()) return;
      absl::StatusOr<std::string> text;
      // The dump opens /proc files: in a descriptor table of inprof's.
      RunWithOwnDescriptors([&] { text = pipeline.ThreadDump("threads", /*debug=*/2); });
      // As inprof's log lines go: one write to the program's stderr.
      WriteLineToStderr(
          text.ok() ? absl::StrCat("inprof: thread dump on ", name, " (INPROF_DUMP_SIGNAL)\n",
                                   *text)
                    : absl::StrCat("inprof: thread dump on ", name, ": ",
                                   text.status().message(), "\n"));
      dumps_.fetch_add(1);
    }
  });
  struct sigaction action {};
  action.sa_handler = &OnDumpSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  if (sigaction(signal_, &action, &previous_) != 0) {
    Log(absl::StrCat("INPROF_DUMP_SIGNAL: cannot handle ", name, ": ", strerror(errno)));
    Stopping();
    return;
  }
  installed_ = true;
  Log(absl::StrCat("thread dumps on ", name, " to stderr (INPROF_DUMP_SIGNAL)"));
}

void DumpSignalAttachment::Stopping() {
  // The program's disposition back first: a later signal is the program's.
  if (installed_) {
    sigaction(signal_, &previous_, nullptr);
    installed_ = false;
  }
  if (thread_.joinable()) {
    g_stop.store(true);
    sem_post(&g_wake);
    thread_.join();
  }
}

void DumpSignalAttachment::Abandon() {
  // A forked child: the thread is the parent's; the signal is the child's.
  if (installed_) {
    sigaction(signal_, &previous_, nullptr);
    installed_ = false;
  }
  (void)new ProfilerThread(std::move(thread_));  // never joined nor destroyed
}

}  // namespace inprof::internal
