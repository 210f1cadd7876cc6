#include "inprof/internal/thread_dump_text.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
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

// What a thread's block heads: its state, the system call it waits in,
// how long it waited; the rest of its labels as "k=v, ...".
struct ThreadHead {
  std::string state = "unknown";
  std::string syscall;
  int64_t waited_ns = -1;
  std::string labels;
};

ThreadHead HeadOf(const ProfileSample& s) {
  ThreadHead h;
  for (const SampleLabel& l : s.labels) {
    if (l.key == kThreadState) {
      h.state = l.str;
    } else if (l.key == "syscall") {
      h.syscall = l.str;
    } else if (l.key == "waited ns" && l.numeric) {
      h.waited_ns = l.num;
    } else {
      absl::StrAppend(&h.labels, h.labels.empty() ? "" : ", ", l.key, "=",
                      l.numeric ? absl::StrCat(l.num) : l.str);
    }
  }
  return h;
}

// Go's debug=1 form: the threads grouped by stack and labels, the largest
// group first, each headed by its count and addresses, its frames as
// "#\taddress\tfunction\tfile:line".
std::string GroupedText(const ProfileData& dump, Symbolizer& symbolizer,
                        const std::vector<size_t>& order, absl::string_view type,
                        const std::function<int64_t(size_t)>& tid) {
  struct Group {
    std::vector<size_t> members;  // ordered by thread id
    std::map<std::string, int> states;
  };
  std::map<std::tuple<std::vector<uint64_t>, std::string, std::string>, Group> groups;
  for (size_t i : order) {
    const ProfileSample& s = dump.samples[i];
    const ThreadHead h = HeadOf(s);
    Group& g = groups[{s.frames, s.synthetic_frame, h.labels}];
    g.members.push_back(i);
    ++g.states[h.syscall.empty() ? h.state : absl::StrCat(h.state, " in ", h.syscall)];
  }
  std::vector<const std::pair<const std::tuple<std::vector<uint64_t>, std::string, std::string>,
                              Group>*>
      sorted;
  for (const auto& g : groups) sorted.push_back(&g);
  std::stable_sort(sorted.begin(), sorted.end(), [&](const auto* a, const auto* b) {
    if (a->second.members.size() != b->second.members.size()) {
      return a->second.members.size() > b->second.members.size();
    }
    return tid(a->second.members[0]) < tid(b->second.members[0]);
  });
  std::string out = absl::StrCat(type, " profile: total ", dump.samples.size(), "\n");
  for (const auto* entry : sorted) {
    const auto& [frames, synthetic, labels] = entry->first;
    const Group& g = entry->second;
    absl::StrAppend(&out, g.members.size(), " @");
    for (uint64_t a : frames) absl::StrAppendFormat(&out, " 0x%x", a);
    out.push_back('\n');
    if (!labels.empty()) absl::StrAppend(&out, "# labels: {", labels, "}\n");
    absl::StrAppend(&out, "# threads:");
    for (size_t i : g.members) absl::StrAppend(&out, " ", tid(i));
    absl::StrAppend(&out, "\n# state:");
    for (const auto& [state, n] : g.states) absl::StrAppend(&out, " ", state, " (", n, ")");
    out.push_back('\n');
    if (!synthetic.empty()) absl::StrAppend(&out, "#\t", synthetic, "\n");
    for (size_t k = 0; k < frames.size(); ++k) {
      const SymbolizedAddress& at = symbolizer.Lookup(frames[k], /*is_return=*/k > 0);
      if (at.frames.empty()) {
        absl::StrAppendFormat(&out, "#\t0x%x\t??\n", frames[k]);
        continue;
      }
      for (const SourceFrame& f : at.frames) {
        const std::string& name = !f.function.empty() ? f.function : f.system_name;
        absl::StrAppendFormat(&out, "#\t0x%x\t%s", frames[k], name.empty() ? "??" : name);
        if (!f.file.empty()) {
          absl::StrAppend(&out, "\t", f.file, f.line > 0 ? absl::StrCat(":", f.line) : "");
        }
        out.push_back('\n');
      }
    }
    out.push_back('\n');
  }
  return out;
}

}  // namespace

std::string ThreadDumpText(const ProfileData& dump, Symbolizer& symbolizer, bool grouped) {
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
  if (grouped) {
    const std::string type = dump.sample_types.empty() ? "threads" : dump.sample_types[0].type;
    return out + GroupedText(dump, symbolizer, order, type, tid);
  }
  for (size_t i : order) {
    const ProfileSample& s = dump.samples[i];
    std::string name;
    if (s.thread < dump.threads.size()) name = dump.threads[s.thread].name;
    const ThreadHead h = HeadOf(s);
    absl::StrAppend(&out, "thread ", tid(i), " \"", absl::CEscape(name), "\" [", h.state,
                    h.syscall.empty() ? "" : absl::StrCat(" in ", h.syscall),
                    h.waited_ns >= 0 ? absl::StrCat(", at least ",
                                                    absl::FormatDuration(absl::Trunc(
                                                        absl::Nanoseconds(h.waited_ns),
                                                        absl::Milliseconds(1))))
                                     : "",
                    "]:\n");
    if (!h.labels.empty()) absl::StrAppend(&out, "labels: {", h.labels, "}\n");
    if (!s.synthetic_frame.empty()) absl::StrAppend(&out, s.synthetic_frame, "\n");
    for (size_t k = 0; k < s.frames.size(); ++k) {
      AppendFrame(out, s.frames[k], /*is_return=*/k > 0, symbolizer);
    }
    out.push_back('\n');
  }
  return out;
}

}  // namespace inprof::internal
