// The run report (run_report.h): the lines `inprof run` reads to say which
// processes wrote a profile, and which ended without one.
#include "src/run/run_report.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "inprof/base/owned_fd.h"

namespace inprof::run {
namespace {

std::string CurrentProcessName() {
  char buf[64] = {};
  int fd = open("/proc/self/comm", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "?";
  ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  std::string s(buf, n > 0 ? static_cast<size_t>(n) : 0);
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

// The report, kept open from the first line on (above the program's range,
// checked before each use): a process that ends with every descriptor its
// RLIMIT_NOFILE allows taken can still say why it wrote no profile ("Too
// many open files"), instead of `inprof run` guessing. Set once, never
// closed (a forked child shares it); no lock, so that a fork never inherits
// one held.
std::atomic<int> g_kept_fd{-1};
internal::FdIdentity g_kept_identity;
std::atomic<bool> g_keeping{false};

void KeepOpen(int fd) {
  // Only a number of the program's table is kept: one opened by a thread
  // with a table of its own (the wall sampler's) means nothing elsewhere.
  if (internal::CurrentDescriptorTable() != 0) return;
  if (g_keeping.exchange(true)) return;
  const int kept = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (kept < 0) return;
  const int moved = internal::MoveAboveProgramRange(kept);
  g_kept_identity = internal::IdentifyFd(moved);
  g_kept_fd.store(moved, std::memory_order_release);
}

}  // namespace

void AppendToReport(const std::string& report, absl::string_view first,
                    absl::string_view detail) {
  if (report.empty()) return;
  std::string line = absl::StrCat(first, "\t", getpid(), "\t", CurrentProcessName());
  if (!detail.empty()) {
    std::string flat(detail);
    for (char& c : flat) {
      if (c == '\n' || c == '\t') c = ' ';
    }
    absl::StrAppend(&line, "\t", flat);
  }
  line.push_back('\n');
  // O_NOFOLLOW: a link put in the report's place is not appended through.
  int fd = open(report.c_str(), O_WRONLY | O_APPEND | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0) {
    // One write(2) with O_APPEND: lines of concurrent processes never mix.
    ssize_t n = write(fd, line.data(), line.size());
    (void)n;
    KeepOpen(fd);
    close(fd);
    return;
  }
  // No descriptor to open it with (EMFILE, ENFILE): the kept one, if the
  // program has not closed it.
  if (const int kept = g_kept_fd.load(std::memory_order_acquire);
      kept >= 0 && internal::IsStillOurs(kept, g_kept_identity)) {
    ssize_t n = write(kept, line.data(), line.size());
    (void)n;
  }
}

}  // namespace inprof::run
