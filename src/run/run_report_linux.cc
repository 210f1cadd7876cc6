// The run report (run_report.h): the lines `inprof run` reads to say which
// processes wrote a profile, and which ended without one.
#include "src/run/run_report.h"

#include <fcntl.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

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
    close(fd);
  }
}

}  // namespace inprof::run
