// The report commands: `inprof top`, `inprof collapsed`, `inprof speedscope`,
// `inprof flamegraph` and `inprof diff`. They read any pprof file (gzip or
// not) and share their options (sample type, thread, label, output); the
// computations are in src/report/report.h.
#include <getopt.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "inprof/sink.h"
#include "src/cli/command.h"
#include "src/report/report.h"

#ifndef INPROF_VERSION
#define INPROF_VERSION "unknown"
#endif

namespace inprof::cli {

#define INPROF_SELECTION_HELP                                                 \
  "  -t, --sample-type TYPE  cpu-time, wall-time, cpu-samples, ... (default:\n" \
  "                          the profile's default type, else its last)\n"    \
  "      --thread NAME       only that thread's samples (its name or id)\n"   \
  "      --label KEY=VALUE   only samples with that label\n"

const char kTopHelp[] =
    "usage: inprof top [OPTIONS] PROFILE\n"
    "\n"
    "Prints the functions of PROFILE (a pprof file, gzip or not) by their own\n"
    "value (flat: as the leaf) with their cumulative value (anywhere on the\n"
    "stack), like `go tool pprof -top`; or one row per thread or label value.\n"
    "\n"
    "Options:\n" INPROF_SELECTION_HELP
    "      --by WHAT           thread, or label:KEY (e.g. label:endpoint)\n"
    "  -n, --limit N           rows shown (default 30; 0: all)\n"
    "  -h, --help              this text\n";

const char kCollapsedHelp[] =
    "usage: inprof collapsed [OPTIONS] PROFILE\n"
    "\n"
    "Prints PROFILE's stacks folded, root first, one line per distinct stack:\n"
    "`main;Compute;Multiply 600000000` (the value in the sample type's unit),\n"
    "the input of flamegraph.pl and of most flame graph tools.\n"
    "\n"
    "Options:\n" INPROF_SELECTION_HELP
    "  -o, --output FILE       write FILE instead of standard output\n"
    "  -h, --help              this text\n";

const char kSpeedscopeHelp[] =
    "usage: inprof speedscope [OPTIONS] PROFILE\n"
    "\n"
    "Writes PROFILE in speedscope's file format (https://www.speedscope.app):\n"
    "one profile per thread, the largest first.\n"
    "\n"
    "Options:\n" INPROF_SELECTION_HELP
    "  -o, --output FILE       default: PROFILE's name with .speedscope.json;\n"
    "                          - for standard output\n"
    "  -h, --help              this text\n";

const char kFlamegraphHelp[] =
    "usage: inprof flamegraph [OPTIONS] PROFILE\n"
    "\n"
    "Writes an interactive flame graph of PROFILE: one self-contained HTML\n"
    "file (no network) to open in a browser. Click a frame to zoom, search\n"
    "(a substring, or /regex/) to highlight, switch the sample type (CPU,\n"
    "wall), filter by thread and by label, flip to an icicle graph.\n"
    "\n"
    "Options:\n"
    "  -o, --output FILE       default: PROFILE's name with .html; - for\n"
    "                          standard output\n"
    "  -h, --help              this text\n";

const char kDiffHelp[] =
    "usage: inprof diff [OPTIONS] BASE NEW\n"
    "\n"
    "Writes a differential flame graph: NEW's flame graph, each frame colored\n"
    "by the change of its share from BASE to NEW (red: grew, blue: shrank).\n"
    "\n"
    "Options:\n"
    "  -o, --output FILE       default: NEW's name with .diff.html; - for\n"
    "                          standard output\n"
    "  -h, --help              this text\n";

namespace {

struct Args {
  report::Selection sel;
  std::string output;
  std::string by;
  int limit = 30;
  std::vector<std::string> inputs;
};

int Usage(const char* command, const std::string& message) {
  PrintError(command, absl::StrCat(message, " (see inprof ", command, " --help)"));
  return 2;
}

// Parses the options `allowed` (a getopt short-option subset of "t:o:n:h"
// plus the long ones), then the positional inputs (exactly `inputs` of them).
// Returns -1 to go on, else the exit code.
int Parse(const char* command, const char* help, int argc, char** argv,
          bool selection, bool top, size_t inputs, Args& a) {
  static const option kLong[] = {
      {"sample-type", required_argument, nullptr, 't'},
      {"thread", required_argument, nullptr, 'T'},
      {"label", required_argument, nullptr, 'L'},
      {"output", required_argument, nullptr, 'o'},
      {"by", required_argument, nullptr, 'B'},
      {"limit", required_argument, nullptr, 'n'},
      {"help", no_argument, nullptr, 'h'},
      {nullptr, 0, nullptr, 0},
  };
  opterr = 0;
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, ":t:o:n:h", kLong, nullptr)) != -1) {
    const bool selection_option = c == 't' || c == 'T' || c == 'L';
    const bool top_option = c == 'B' || c == 'n';
    if ((selection_option && !selection) || (top_option && !top) ||
        (c == 'o' && top)) {
      return Usage(command, absl::StrCat("unknown option '", argv[optind - 1], "'"));
    }
    switch (c) {
      case 't':
        a.sel.sample_type = optarg;
        break;
      case 'T':
        a.sel.thread = optarg;
        break;
      case 'L': {
        const char* eq = std::strchr(optarg, '=');
        if (eq == nullptr || eq == optarg) {
          return Usage(command, absl::StrCat("--label '", optarg,
                                             "': expected KEY=VALUE"));
        }
        a.sel.label_key.assign(optarg, eq - optarg);
        a.sel.label_value = eq + 1;
        break;
      }
      case 'o':
        if (*optarg == '\0') return Usage(command, "--output: expected a file path");
        a.output = optarg;
        break;
      case 'B':
        if (std::strcmp(optarg, "thread") != 0 &&
            !(absl::StartsWith(optarg, "label:") && std::strlen(optarg) > 6)) {
          return Usage(command, absl::StrCat("--by '", optarg,
                                             "': expected thread or label:KEY"));
        }
        a.by = optarg;
        break;
      case 'n':
        if (!absl::SimpleAtoi(optarg, &a.limit) || a.limit < 0) {
          return Usage(command, absl::StrCat("--limit '", optarg,
                                             "': expected a number of rows, 0 for all"));
        }
        break;
      case 'h':
        fputs(help, stdout);
        return 0;
      case ':':
        return Usage(command, absl::StrCat("option '", argv[optind - 1], "' needs a value"));
      default:
        return Usage(command, absl::StrCat("unknown option '", argv[optind - 1], "'"));
    }
  }
  for (int i = optind; i < argc; ++i) a.inputs.push_back(argv[i]);
  if (a.inputs.size() != inputs) {
    return Usage(command, inputs == 1 ? "expected one PROFILE"
                                      : "expected two profiles, BASE and NEW");
  }
  return -1;
}

// PROFILE's path without .gz and .pb/.pprof/.prof, plus `suffix`.
std::string DefaultOutput(const std::string& input, const char* suffix) {
  std::string stem = input;
  for (const char* ext : {".gz", ".pb", ".pprof", ".prof"}) {
    if (absl::EndsWith(stem, ext) && stem.size() > std::strlen(ext)) {
      stem.resize(stem.size() - std::strlen(ext));
    }
  }
  return stem + suffix;
}

// Writes `text` to `path` ("-": standard output) with inprof's one file
// writer (a reader never sees half a page; a device or FIFO is written into,
// a link is refused: see sink.h).
absl::Status Write(const std::string& path, const std::string& text) {
  if (path == "-") {
    if (fwrite(text.data(), 1, text.size(), stdout) != text.size() ||
        fflush(stdout) != 0) {
      return absl::InternalError(absl::StrCat("cannot write to standard output: ",
                                              std::strerror(errno)));
    }
    return absl::OkStatus();
  }
  return WriteFileAtomically(path, text);
}

// Loads the input and resolves the sample type; prints the error.
bool LoadSelected(const char* command, const Args& a, DecodedProfile& p,
                  int& type) {
  absl::StatusOr<DecodedProfile> loaded = report::Load(a.inputs[0]);
  if (!loaded.ok()) {
    PrintError(command, std::string(loaded.status().message()));
    return false;
  }
  absl::StatusOr<int> t = report::SampleTypeIndex(*loaded, a.sel.sample_type);
  if (!t.ok()) {
    PrintError(command, absl::StrCat(a.inputs[0], ": ", t.status().message()));
    return false;
  }
  p = std::move(*loaded);
  type = *t;
  return true;
}

int Finish(const char* command, const std::string& path, const std::string& text,
           bool announce) {
  if (absl::Status s = Write(path, text); !s.ok()) {
    PrintError(command, std::string(s.message()));
    return 1;
  }
  if (announce && path != "-") {
    PrintError(command, absl::StrCat("wrote ", path));
  }
  return 0;
}

}  // namespace

int TopMain(int argc, char** argv) {
  Args a;
  if (int rc = Parse("top", kTopHelp, argc, argv, true, true, 1, a); rc >= 0) return rc;
  DecodedProfile p;
  int type = 0;
  if (!LoadSelected("top", a, p, type)) return 1;
  absl::StatusOr<std::vector<report::TopRow>> rows = report::Top(p, type, a.sel, a.by);
  if (!rows.ok()) return Usage("top", std::string(rows.status().message()));
  return Finish("top", "-", report::FormatTop(p, type, *rows, a.limit, a.by, a.inputs[0]),
                false);
}

int CollapsedMain(int argc, char** argv) {
  Args a;
  if (int rc = Parse("collapsed", kCollapsedHelp, argc, argv, true, false, 1, a); rc >= 0) {
    return rc;
  }
  DecodedProfile p;
  int type = 0;
  if (!LoadSelected("collapsed", a, p, type)) return 1;
  return Finish("collapsed", a.output.empty() ? "-" : a.output,
                report::Collapsed(p, type, a.sel), !a.output.empty());
}

int SpeedscopeMain(int argc, char** argv) {
  Args a;
  if (int rc = Parse("speedscope", kSpeedscopeHelp, argc, argv, true, false, 1, a);
      rc >= 0) {
    return rc;
  }
  DecodedProfile p;
  int type = 0;
  if (!LoadSelected("speedscope", a, p, type)) return 1;
  const std::string out =
      a.output.empty() ? DefaultOutput(a.inputs[0], ".speedscope.json") : a.output;
  return Finish("speedscope", out,
                report::Speedscope(p, type, a.sel, a.inputs[0],
                                   absl::StrCat("inprof ", INPROF_VERSION)),
                true);
}

int FlamegraphMain(int argc, char** argv) {
  Args a;
  if (int rc = Parse("flamegraph", kFlamegraphHelp, argc, argv, false, false, 1, a);
      rc >= 0) {
    return rc;
  }
  absl::StatusOr<DecodedProfile> p = report::Load(a.inputs[0]);
  if (!p.ok()) {
    PrintError("flamegraph", std::string(p.status().message()));
    return 1;
  }
  const std::string out = a.output.empty() ? DefaultOutput(a.inputs[0], ".html") : a.output;
  return Finish("flamegraph", out,
                report::FlamegraphHtml(*p, a.inputs[0], nullptr, ""), true);
}

int DiffMain(int argc, char** argv) {
  Args a;
  if (int rc = Parse("diff", kDiffHelp, argc, argv, false, false, 2, a); rc >= 0) {
    return rc;
  }
  absl::StatusOr<DecodedProfile> base = report::Load(a.inputs[0]);
  if (!base.ok()) {
    PrintError("diff", std::string(base.status().message()));
    return 1;
  }
  absl::StatusOr<DecodedProfile> now = report::Load(a.inputs[1]);
  if (!now.ok()) {
    PrintError("diff", std::string(now.status().message()));
    return 1;
  }
  const std::string out =
      a.output.empty() ? DefaultOutput(a.inputs[1], ".diff.html") : a.output;
  return Finish("diff", out,
                report::FlamegraphHtml(*now, a.inputs[1], &*base, a.inputs[0]), true);
}

}  // namespace inprof::cli
