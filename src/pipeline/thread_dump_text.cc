#include "inprof/internal/thread_dump_text.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "inprof/internal/label_table.h"

namespace inprof::internal {

namespace {

std::string BaseName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// One address's lines: each function at it (inlined callees first), over
// its file:line; without a name, module+offset.
void AppendFrame(std::string& out, uint64_t address, bool is_return, Symbolizer& symbolizer) {
  const SymbolizedAddress& at = symbolizer.Lookup(address, is_return);
  if (at.frames.empty()) {
    if (at.module >= 0 && static_cast<size_t>(at.module) < symbolizer.modules().size()) {
      const ModuleInfo& m = symbolizer.modules()[at.module];
      absl::StrAppendFormat(&out, "%s+0x%x\n\t0x%x\n", BaseName(m.path),
                            address - m.start + m.file_offset, address);
    } else {
      absl::StrAppendFormat(&out, "0x%x\n\t?\n", address);
    }
    return;
  }
  for (size_t i = 0; i < at.frames.size(); ++i) {
    const SourceFrame& f = at.frames[i];
    const std::string& name = !f.function.empty() ? f.function : f.system_name;
    absl::StrAppend(&out, name.empty() ? "??" : name,
                    i + 1 < at.frames.size() ? " (inlined)" : "", "\n\t");
    if (!f.file.empty()) {
      absl::StrAppend(&out, f.file, f.line > 0 ? absl::StrCat(":", f.line) : "");
    } else if (at.module >= 0 && static_cast<size_t>(at.module) < symbolizer.modules().size()) {
      const ModuleInfo& m = symbolizer.modules()[at.module];
      absl::StrAppendFormat(&out, "%s+0x%x", BaseName(m.path), address - m.start + m.file_offset);
    } else {
      absl::StrAppendFormat(&out, "0x%x", address);
    }
    out.push_back('\n');
  }
}

}  // namespace

std::string ThreadDumpText(const ProfileData& dump, Symbolizer& symbolizer) {
  std::string out;
  for (const std::string& line : dump.comments) absl::StrAppend(&out, "# ", line, "\n");
  if (!dump.comments.empty()) out.push_back('\n');
  std::vector<size_t> order(dump.samples.size());
  std::iota(order.begin(), order.end(), size_t{0});
  auto tid = [&](size_t i) {
    const uint32_t t = dump.samples[i].thread;
    return t < dump.threads.size() ? dump.threads[t].tid : int64_t{0};
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return tid(a) < tid(b); });
  for (size_t i : order) {
    const ProfileSample& s = dump.samples[i];
    std::string name;
    if (s.thread < dump.threads.size()) name = dump.threads[s.thread].name;
    std::string state = "unknown";
    std::string syscall;
    int64_t waited_ns = -1;
    std::string labels;
    for (const SampleLabel& l : s.labels) {
      if (l.key == kThreadState) {
        state = l.str;
      } else if (l.key == "syscall") {
        syscall = l.str;
      } else if (l.key == "waited ns" && l.numeric) {
        waited_ns = l.num;
      } else {
        absl::StrAppend(&labels, labels.empty() ? "" : ", ", l.key, "=",
                        l.numeric ? absl::StrCat(l.num) : l.str);
      }
    }
    absl::StrAppend(&out, "thread ", tid(i), " \"", absl::CEscape(name), "\" [", state,
                    syscall.empty() ? "" : absl::StrCat(" in ", syscall),
                    waited_ns >= 0 ? absl::StrCat(", at least ",
                                                  absl::FormatDuration(absl::Trunc(
                                                      absl::Nanoseconds(waited_ns),
                                                      absl::Milliseconds(1))))
                                   : "",
                    "]:\n");
    if (!labels.empty()) absl::StrAppend(&out, "labels: {", labels, "}\n");
    if (!s.synthetic_frame.empty()) absl::StrAppend(&out, s.synthetic_frame, "\n");
    for (size_t k = 0; k < s.frames.size(); ++k) {
      AppendFrame(out, s.frames[k], /*is_return=*/k > 0, symbolizer);
    }
    out.push_back('\n');
  }
  return out;
}

}  // namespace inprof::internal
