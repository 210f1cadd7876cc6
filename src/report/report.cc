#include "src/report/report.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <cinttypes>
#include <cstdio>
#include <map>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"

namespace inprof::report {

// src/report/flamegraph.html, embedded at build time (embed_html.py).
extern const char kFlamegraphHtml[];

namespace {

constexpr absl::string_view kThreadName = "thread name";
constexpr absl::string_view kThreadId = "thread id";

std::string Percent(int64_t part, int64_t whole) {
  if (whole == 0) return "0.00%";
  return absl::StrFormat("%.2f%%", 100.0 * static_cast<double>(part) /
                                       static_cast<double>(whole));
}

// Interns strings into dense indices, in first-seen order.
class Interner {
 public:
  int Index(const std::string& s) {
    auto [it, inserted] = index_.try_emplace(s, static_cast<int>(names_.size()));
    if (inserted) names_.push_back(s);
    return it->second;
  }
  const std::vector<std::string>& names() const { return names_; }

 private:
  absl::flat_hash_map<std::string, int> index_;
  std::vector<std::string> names_;
};

}  // namespace

absl::StatusOr<DecodedProfile> Load(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(
        absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  if (S_ISREG(st.st_mode) && st.st_size == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": empty file, not a pprof profile"));
  }
  absl::StatusOr<DecodedProfile> p = ReadPprofFile(path);
  if (!p.ok()) {
    // The reader's message names its own function; the user needs the file.
    std::string why(p.status().message());
    for (const char* prefix : {"ReadPprofFile: ", "DecodePprof: "}) {
      if (const size_t at = why.find(prefix); at != std::string::npos) {
        why = why.substr(at + std::strlen(prefix));
      }
    }
    if (absl::IsResourceExhausted(p.status())) {
      // A limit of the reader (PprofReadLimits): what was too much, not
      // "not a profile".
      if (const std::string quoted = absl::StrCat("'", path, "': ");
          absl::StartsWith(why, quoted)) {
        why = why.substr(quoted.size());
      }
      return absl::ResourceExhaustedError(absl::StrCat(path, ": ", why));
    }
    if (absl::StrContains(why, path)) {
      return absl::InvalidArgumentError(why);
    }
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a pprof profile: ", why));
  }
  if (p->sample_types.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a pprof profile (it declares no sample types)"));
  }
  for (const DecodedProfile::Sample& s : p->samples) {
    if (s.values.size() != p->sample_types.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": corrupt pprof profile (a sample has ", s.values.size(),
          " values for ", p->sample_types.size(), " sample types)"));
    }
  }
  // A view sums and scales the values of a sample type (totals, flat and
  // cumulative rows, a diff's differences): a value below zero or a column
  // whose sum leaves int64 would show a wrapped or meaningless figure (and
  // is undefined behaviour to compute), so such a file is refused. Once
  // every value is >= 0 and each column's sum fits, every partial sum of
  // it fits, and so does a difference of two such sums.
  for (size_t t = 0; t < p->sample_types.size(); ++t) {
    const std::string& type = p->sample_types[t].type;
    int64_t sum = 0;
    for (size_t i = 0; i < p->samples.size(); ++i) {
      const int64_t v = p->samples[i].values[t];
      if (v < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": sample ", i + 1, " has a negative ", type, " value (", v,
            "); the views show amounts, which are never below zero"));
      }
      if (__builtin_add_overflow(sum, v, &sum)) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": the ", type, " values add up to more than ",
            std::numeric_limits<int64_t>::max(),
            ", which no view can show; refused rather than wrapped"));
      }
    }
  }
  return p;
}

absl::StatusOr<int> SampleTypeIndex(const DecodedProfile& p,
                                    absl::string_view requested) {
  if (p.sample_types.empty()) {
    return absl::InvalidArgumentError("the profile has no sample types");
  }
  if (requested.empty()) {
    if (!p.default_sample_type.empty()) {
      const int i = p.ValueIndex(p.default_sample_type);
      if (i >= 0) return i;
    }
    return static_cast<int>(p.sample_types.size()) - 1;
  }
  const int i = p.ValueIndex(std::string_view(requested.data(), requested.size()));
  if (i >= 0) return i;
  std::vector<std::string> names;
  for (const ValueType& t : p.sample_types) names.push_back(t.type);
  return absl::InvalidArgumentError(
      absl::StrCat("no sample type '", requested, "' in the profile (it has: ",
                   absl::StrJoin(names, ", "), ")"));
}

std::string LabelOf(const DecodedProfile::Sample& s, absl::string_view key) {
  if (auto it = s.str_labels.find(key); it != s.str_labels.end()) {
    return it->second;
  }
  if (auto it = s.num_labels.find(key); it != s.num_labels.end()) {
    return absl::StrCat(it->second);
  }
  return "";
}

std::string ThreadOf(const DecodedProfile::Sample& s) {
  std::string name = LabelOf(s, kThreadName);
  if (!name.empty()) return name;
  std::string id = LabelOf(s, kThreadId);
  return id.empty() ? "" : absl::StrCat("thread ", id);
}

bool Selected(const DecodedProfile::Sample& s, const Selection& sel) {
  if (!sel.thread.empty() && ThreadOf(s) != sel.thread &&
      LabelOf(s, kThreadId) != sel.thread) {
    return false;
  }
  if (!sel.label_key.empty() && LabelOf(s, sel.label_key) != sel.label_value) {
    return false;
  }
  return true;
}

std::string FormatValue(int64_t value, absl::string_view unit) {
  if (value == 0) return "0";
  const double v = static_cast<double>(value);
  const double a = v < 0 ? -v : v;
  auto three = [](double x, const char* suffix) {
    const double ax = x < 0 ? -x : x;
    if (ax >= 100) return absl::StrFormat("%.0f %s", x, suffix);
    if (ax >= 10) return absl::StrFormat("%.1f %s", x, suffix);
    return absl::StrFormat("%.2f %s", x, suffix);
  };
  if (unit == "nanoseconds") {
    if (a >= 1e9) return three(v / 1e9, "s");
    if (a >= 1e6) return three(v / 1e6, "ms");
    if (a >= 1e3) return three(v / 1e3, "us");
    return absl::StrCat(value, " ns");
  }
  if (unit == "bytes") {
    if (a >= 1024.0 * 1024 * 1024) return three(v / (1024.0 * 1024 * 1024), "GiB");
    if (a >= 1024.0 * 1024) return three(v / (1024.0 * 1024), "MiB");
    if (a >= 1024.0) return three(v / 1024.0, "KiB");
    return absl::StrCat(value, " B");
  }
  return absl::StrCat(value);
}

absl::StatusOr<std::vector<TopRow>> Top(const DecodedProfile& p, int type,
                                        const Selection& sel,
                                        absl::string_view by) {
  absl::flat_hash_map<std::string, TopRow> rows;
  std::string label_key;
  if (by == "thread") {
  } else if (absl::StartsWith(by, "label:") && by.size() > 6) {
    label_key = std::string(by.substr(6));
  } else if (!by.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--by '", by, "': expected thread or label:KEY"));
  }
  for (const DecodedProfile::Sample& s : p.samples) {
    if (!Selected(s, sel)) continue;
    const int64_t v = s.values[type];
    if (v == 0) continue;
    if (!by.empty()) {
      std::string key = by == "thread" ? ThreadOf(s) : LabelOf(s, label_key);
      if (key.empty()) key = by == "thread" ? "(no thread)" : "(no label)";
      TopRow& r = rows[key];
      r.name = key;
      r.flat += v;
      r.cum += v;
      continue;
    }
    if (s.stack.empty()) {
      TopRow& r = rows["(no stack)"];
      r.name = "(no stack)";
      r.flat += v;
      r.cum += v;
      continue;
    }
    TopRow& leaf = rows[s.stack[0]];
    leaf.name = s.stack[0];
    leaf.flat += v;
    absl::flat_hash_set<absl::string_view> seen;
    for (const std::string& f : s.stack) {
      if (!seen.insert(f).second) continue;
      TopRow& r = rows[f];
      r.name = f;
      r.cum += v;
    }
  }
  std::vector<TopRow> out;
  out.reserve(rows.size());
  for (auto& [name, r] : rows) out.push_back(std::move(r));
  std::sort(out.begin(), out.end(), [](const TopRow& a, const TopRow& b) {
    return std::tie(b.flat, b.cum, a.name) < std::tie(a.flat, a.cum, b.name);
  });
  return out;
}

std::string FormatTop(const DecodedProfile& p, int type,
                      const std::vector<TopRow>& rows, int limit,
                      absl::string_view by, absl::string_view source) {
  const ValueType& t = p.sample_types[type];
  int64_t total = 0;
  for (const TopRow& r : rows) total += r.flat;
  const size_t shown =
      limit > 0 ? std::min(rows.size(), static_cast<size_t>(limit)) : rows.size();
  const char* what = by.empty() ? "functions" : (by == "thread" ? "threads" : "values");
  std::string out = absl::StrCat(
      source, ": ", t.type, " (", t.unit, "), total ", FormatValue(total, t.unit),
      "; ", shown, " of ", rows.size(), " ", what,
      by.empty() ? "" : absl::StrCat(" by ", by), "\n");
  for (const std::string& c : p.comments) absl::StrAppend(&out, "# ", c, "\n");
  if (by.empty()) {
    absl::StrAppend(&out, absl::StrFormat("%12s %7s %7s %12s %7s  %s\n", "flat",
                                          "flat%", "sum%", "cum", "cum%", "function"));
  } else {
    absl::StrAppend(&out, absl::StrFormat("%12s %7s %7s  %s\n", "value", "share",
                                          "sum%", by == "thread" ? "thread" : by));
  }
  int64_t sum = 0;
  for (size_t i = 0; i < shown; ++i) {
    const TopRow& r = rows[i];
    sum += r.flat;
    if (by.empty()) {
      absl::StrAppend(&out, absl::StrFormat(
          "%12s %7s %7s %12s %7s  %s\n", FormatValue(r.flat, t.unit),
          Percent(r.flat, total), Percent(sum, total), FormatValue(r.cum, t.unit),
          Percent(r.cum, total), r.name));
    } else {
      absl::StrAppend(&out, absl::StrFormat(
          "%12s %7s %7s  %s\n", FormatValue(r.flat, t.unit),
          Percent(r.flat, total), Percent(sum, total), r.name));
    }
  }
  return out;
}

std::string Collapsed(const DecodedProfile& p, int type, const Selection& sel) {
  std::map<std::string, int64_t> stacks;  // sorted output
  for (const DecodedProfile::Sample& s : p.samples) {
    if (!Selected(s, sel) || s.values[type] == 0) continue;
    std::string line;
    if (s.stack.empty()) line = "(no stack)";
    for (auto it = s.stack.rbegin(); it != s.stack.rend(); ++it) {
      if (!line.empty()) line += ';';
      line += absl::StrReplaceAll(*it, {{";", ":"}, {"\n", " "}});
    }
    stacks[line] += s.values[type];
  }
  std::string out;
  for (const auto& [stack, v] : stacks) {
    if (v != 0) absl::StrAppend(&out, stack, " ", v, "\n");
  }
  return out;
}

std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  out.reserve(s.size() + 2);
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\t': out += "\\t"; break;
        case '\r': out += "\\r"; break;
        case '<': out += "\\u003c"; break;
        case '>': out += "\\u003e"; break;
        case '&': out += "\\u0026"; break;
        default:
          if (c < 0x20) {
            out += absl::StrFormat("\\u%04x", c);
          } else {
            out += static_cast<char>(c);
          }
      }
      ++i;
      continue;
    }
    // A UTF-8 sequence: copied when well formed, U+FFFD otherwise.
    int len = c >= 0xf0 && c <= 0xf4 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 0;
    bool ok = len > 0 && i + len <= s.size();
    uint32_t cp = ok ? (c & (0x7f >> len)) : 0;
    for (int k = 1; ok && k < len; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      ok = (cc & 0xc0) == 0x80;
      cp = (cp << 6) | (cc & 0x3f);
    }
    if (ok) {
      ok = (len == 3 && cp >= 0x800 && (cp < 0xd800 || cp > 0xdfff)) ||
           (len == 4 && cp >= 0x10000 && cp <= 0x10ffff) || len == 2;
    }
    if (!ok) {
      out += "\\ufffd";
      ++i;
      continue;
    }
    if (cp == 0x2028 || cp == 0x2029) {
      out += absl::StrFormat("\\u%04x", cp);
    } else {
      out.append(s.data() + i, len);
    }
    i += len;
  }
  out += '"';
  return out;
}

std::string Speedscope(const DecodedProfile& p, int type, const Selection& sel,
                       absl::string_view name, absl::string_view exporter) {
  const ValueType& t = p.sample_types[type];
  const char* unit = t.unit == "nanoseconds" ? "nanoseconds"
                     : t.unit == "bytes"     ? "bytes"
                                             : "none";
  Interner frames;
  struct Group {
    std::string name;
    int64_t total = 0;
    std::map<std::vector<int>, int64_t> stacks;  // root first
  };
  std::map<std::string, Group> groups;
  for (const DecodedProfile::Sample& s : p.samples) {
    if (!Selected(s, sel) || s.values[type] == 0) continue;
    std::string thread = ThreadOf(s);
    Group& g = groups[thread];
    g.name = thread.empty() ? "all threads" : thread;
    std::vector<int> stack;
    if (s.stack.empty()) stack.push_back(frames.Index("(no stack)"));
    for (auto it = s.stack.rbegin(); it != s.stack.rend(); ++it) {
      stack.push_back(frames.Index(*it));
    }
    g.stacks[stack] += s.values[type];
    g.total += s.values[type];
  }
  std::vector<const Group*> order;
  for (const auto& [k, g] : groups) order.push_back(&g);
  std::stable_sort(order.begin(), order.end(), [](const Group* a, const Group* b) {
    return a->total > b->total;
  });
  std::string out = absl::StrCat(
      "{\"$schema\":\"https://www.speedscope.app/file-format-schema.json\","
      "\"name\":", JsonString(name), ",\"exporter\":", JsonString(exporter),
      ",\"activeProfileIndex\":0,\"shared\":{\"frames\":[");
  for (size_t i = 0; i < frames.names().size(); ++i) {
    absl::StrAppend(&out, i ? "," : "", "{\"name\":", JsonString(frames.names()[i]), "}");
  }
  out += "]},\"profiles\":[";
  for (size_t gi = 0; gi < order.size(); ++gi) {
    const Group& g = *order[gi];
    absl::StrAppend(&out, gi ? "," : "", "{\"type\":\"sampled\",\"name\":",
                    JsonString(absl::StrCat(g.name, " (", t.type, ")")),
                    ",\"unit\":\"", unit, "\",\"startValue\":0,\"endValue\":",
                    g.total, ",\"samples\":[");
    bool first = true;
    for (const auto& [stack, v] : g.stacks) {
      absl::StrAppend(&out, first ? "" : ",", "[", absl::StrJoin(stack, ","), "]");
      first = false;
    }
    out += "],\"weights\":[";
    first = true;
    for (const auto& [stack, v] : g.stacks) {
      absl::StrAppend(&out, first ? "" : ",", v);
      first = false;
    }
    out += "]}";
  }
  out += "]}\n";
  return out;
}

namespace {

// The flame graph page's data (the format is described in flamegraph.html):
// a node table shared by the profile and its base, so that the page can
// compare them frame by frame.
class FlameData {
 public:
  // Appends `p`'s samples as JSON rows "[node,thread,[labels],[values]]",
  // values in the order of `types` (0 for a type `p` lacks); identical rows
  // are merged.
  std::string Samples(const DecodedProfile& p, const std::vector<ValueType>& types) {
    std::vector<int> value_of(types.size());
    for (size_t i = 0; i < types.size(); ++i) value_of[i] = p.ValueIndex(types[i].type);
    std::map<std::tuple<int, int, std::vector<int>>, std::vector<int64_t>> rows;
    for (const DecodedProfile::Sample& s : p.samples) {
      int node = -1;
      if (s.stack.empty()) node = Node(-1, frames_.Index("(no stack)"));
      for (auto it = s.stack.rbegin(); it != s.stack.rend(); ++it) {
        node = Node(node, frames_.Index(*it));
      }
      const std::string thread = ThreadOf(s);
      const int t = thread.empty() ? -1 : threads_.Index(thread);
      std::vector<int> labels(label_keys_.size(), -1);
      for (size_t k = 0; k < label_keys_.size(); ++k) {
        std::string v = LabelOf(s, label_keys_[k]);
        if (!v.empty()) labels[k] = label_values_[k].Index(v);
      }
      std::vector<int64_t>& values = rows[{node, t, labels}];
      values.resize(types.size());
      for (size_t i = 0; i < types.size(); ++i) {
        if (value_of[i] >= 0) values[i] += s.values[value_of[i]];
      }
    }
    std::string out = "[";
    bool first = true;
    for (const auto& [key, values] : rows) {
      const auto& [node, t, labels] = key;
      absl::StrAppend(&out, first ? "" : ",\n", "[", node, ",", t, ",[",
                      absl::StrJoin(labels, ","), "],[", absl::StrJoin(values, ","),
                      "]]");
      first = false;
    }
    out += "]";
    return out;
  }

  // The label keys the page filters by: every key but the thread's, sorted.
  void AddLabelKeys(const DecodedProfile& p) {
    std::vector<std::string> keys(label_keys_);
    for (const DecodedProfile::Sample& s : p.samples) {
      for (const auto& [k, v] : s.str_labels) keys.push_back(k);
      for (const auto& [k, v] : s.num_labels) keys.push_back(k);
    }
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    keys.erase(std::remove_if(keys.begin(), keys.end(),
                              [](const std::string& k) {
                                return k == kThreadName || k == kThreadId;
                              }),
               keys.end());
    label_keys_ = keys;
    label_values_.resize(label_keys_.size());
  }

  std::string Tables() const {
    std::string out = "\"frames\":[";
    for (size_t i = 0; i < frames_.names().size(); ++i) {
      absl::StrAppend(&out, i ? "," : "", JsonString(frames_.names()[i]));
    }
    absl::StrAppend(&out, "],\n\"nodes\":[", absl::StrJoin(nodes_, ","),
                    "],\n\"threads\":[");
    for (size_t i = 0; i < threads_.names().size(); ++i) {
      absl::StrAppend(&out, i ? "," : "", JsonString(threads_.names()[i]));
    }
    out += "],\n\"labels\":[";
    for (size_t k = 0; k < label_keys_.size(); ++k) {
      absl::StrAppend(&out, k ? "," : "", "{\"key\":", JsonString(label_keys_[k]),
                      ",\"values\":[");
      const auto& values = label_values_[k].names();
      for (size_t i = 0; i < values.size(); ++i) {
        absl::StrAppend(&out, i ? "," : "", JsonString(values[i]));
      }
      out += "]}";
    }
    out += "]";
    return out;
  }

 private:
  int Node(int parent, int frame) {
    auto [it, inserted] =
        node_index_.try_emplace(std::make_pair(parent, frame),
                                static_cast<int>(nodes_.size() / 2));
    if (inserted) {
      nodes_.push_back(parent);
      nodes_.push_back(frame);
    }
    return it->second;
  }

  Interner frames_;
  Interner threads_;
  std::vector<std::string> label_keys_;
  std::vector<Interner> label_values_;
  absl::flat_hash_map<std::pair<int, int>, int> node_index_;
  std::vector<int> nodes_;  // parent, frame pairs
};

std::string HtmlEscape(absl::string_view s) {
  return absl::StrReplaceAll(s, {{"&", "&amp;"}, {"<", "&lt;"}, {">", "&gt;"},
                                 {"\"", "&quot;"}});
}

}  // namespace

std::string FlamegraphHtml(const DecodedProfile& p, absl::string_view title,
                           const DecodedProfile* base,
                           absl::string_view base_title) {
  FlameData data;
  data.AddLabelKeys(p);
  if (base != nullptr) data.AddLabelKeys(*base);
  const std::string samples = data.Samples(p, p.sample_types);
  const std::string base_samples =
      base != nullptr ? data.Samples(*base, p.sample_types) : "";
  std::string json = absl::StrCat("{\"version\":1,\n\"title\":", JsonString(title),
                                  ",\n\"sampleTypes\":[");
  for (size_t i = 0; i < p.sample_types.size(); ++i) {
    absl::StrAppend(&json, i ? "," : "", "{\"type\":", JsonString(p.sample_types[i].type),
                    ",\"unit\":", JsonString(p.sample_types[i].unit), "}");
  }
  const absl::StatusOr<int> default_type = SampleTypeIndex(p, "");
  absl::StrAppend(&json, "],\n\"defaultType\":", default_type.ok() ? *default_type : 0,
                  ",\n", data.Tables(), ",\n\"samples\":", samples, ",\n\"base\":");
  if (base != nullptr) {
    absl::StrAppend(&json, "{\"title\":", JsonString(base_title),
                    ",\"samples\":", base_samples, "}");
  } else {
    json += "null";
  }
  json += ",\n\"comments\":[";
  for (size_t i = 0; i < p.comments.size(); ++i) {
    absl::StrAppend(&json, i ? "," : "", JsonString(p.comments[i]));
  }
  json += "]}";
  const std::string page_title =
      base != nullptr ? absl::StrCat("inprof diff: ", base_title, " -> ", title)
                      : absl::StrCat("inprof: ", title);
  return absl::StrReplaceAll(kFlamegraphHtml, {{"/*INPROF_DATA*/null", json},
                                               {"INPROF_TITLE", HtmlEscape(page_title)}});
}

}  // namespace inprof::report
