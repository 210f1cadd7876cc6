#include "inprof/internal/process_maps.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace inprof::internal {
namespace {

bool Hex(absl::string_view s, uint64_t& out) {
  return !s.empty() && absl::SimpleHexAtoi(s, &out);
}

// Splits off the next space-separated field.
absl::string_view Field(absl::string_view& line) {
  const size_t space = line.find(' ');
  absl::string_view field = line.substr(0, space);
  line = space == absl::string_view::npos ? absl::string_view() : line.substr(space + 1);
  return field;
}

}  // namespace

absl::StatusOr<std::vector<MapsEntry>> ParseProcessMaps(absl::string_view text) {
  std::vector<MapsEntry> entries;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    ++number;
    auto bad = [&](absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat("maps line ", number, ": ", what, ": \"",
                       line.substr(0, 120), "\""));
    };
    MapsEntry e;
    absl::string_view rest = line;
    const absl::string_view range = Field(rest);
    const size_t dash = range.find('-');
    if (dash == absl::string_view::npos || !Hex(range.substr(0, dash), e.start) ||
        !Hex(range.substr(dash + 1), e.limit) || e.limit < e.start) {
      return bad("expected START-END in hex");
    }
    const absl::string_view perms = Field(rest);
    if (perms.size() != 4) return bad("expected permissions such as r-xp");
    e.readable = perms[0] == 'r';
    e.executable = perms[2] == 'x';
    if (!Hex(Field(rest), e.offset)) return bad("expected a hex file offset");
    const absl::string_view dev = Field(rest);
    const size_t colon = dev.find(':');
    if (colon == absl::string_view::npos || !Hex(dev.substr(0, colon), e.dev_major) ||
        !Hex(dev.substr(colon + 1), e.dev_minor)) {
      return bad("expected a device MAJOR:MINOR");
    }
    if (!absl::SimpleAtoi(Field(rest), &e.inode)) return bad("expected an inode number");
    // The path follows after padding; it may contain spaces.
    rest = absl::StripLeadingAsciiWhitespace(rest);
    e.deleted = absl::ConsumeSuffix(&rest, " (deleted)");
    e.path = std::string(rest);
    entries.push_back(std::move(e));
  }
  return entries;
}

absl::StatusOr<std::vector<MapsEntry>> ReadProcessMaps(pid_t pid, std::string* text) {
  const std::string path = absl::StrCat("/proc/", pid, "/maps");
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
  }
  std::string content;
  char buf[16384];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) content.append(buf, static_cast<size_t>(n));
  const int error = n < 0 ? errno : 0;
  close(fd);
  if (error != 0) {
    return absl::NotFoundError(absl::StrCat("cannot read ", path, ": ", std::strerror(error)));
  }
  auto entries = ParseProcessMaps(content);
  if (!entries.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", entries.status().message()));
  }
  if (text != nullptr) *text = std::move(content);
  return entries;
}

}  // namespace inprof::internal
