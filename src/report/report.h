// internal: not part of the public API.
//
// What the `inprof` tool's report commands compute from a pprof profile
// (inprof's, a Go program's, gperftools' converted; gzip or not): the top
// functions, folded stacks, speedscope's JSON and the flame graph page.
// Each takes a profile read by Load() and a Selection (sample type, thread,
// label); none of it runs inside a profiled program.
#ifndef INPROF_REPORT_REPORT_H_
#define INPROF_REPORT_REPORT_H_

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"
#include "inprof/pprof_reader.h"

namespace inprof::report {

// Reads a pprof file, gzip-compressed or not. The error is one line that
// names the file and says what is wrong with it.
absl::StatusOr<DecodedProfile> Load(const std::string& path);

// Which samples and which of their values a report shows.
struct Selection {
  std::string sample_type;  // "" = the profile's default
  std::string thread;       // "" = every thread; else a thread's name (or id)
  std::string label_key;    // "" = no label filter
  std::string label_value;
};

// The index of `requested` among the profile's sample types; "" picks the
// profile's default_sample_type, else the last type (pprof's rule). An
// unknown name is an error listing the types the profile has.
absl::StatusOr<int> SampleTypeIndex(const DecodedProfile& p,
                                    absl::string_view requested);

// A sample's thread as the reports name it: its "thread name" label, else
// "thread <id>" from "thread id", else "".
std::string ThreadOf(const DecodedProfile::Sample& s);

// A sample's label `key` as text ("" when absent).
std::string LabelOf(const DecodedProfile::Sample& s, absl::string_view key);

// Whether the sample passes the selection's thread and label filters.
bool Selected(const DecodedProfile::Sample& s, const Selection& sel);

// `value` in `unit`: nanoseconds as "600 ms", "1.20 s", "45.0 us"; bytes
// as "12.0 MiB"; anything else as a plain number.
std::string FormatValue(int64_t value, absl::string_view unit);

struct TopRow {
  std::string name;
  int64_t flat = 0;  // as the leaf (or, by thread/label, everything)
  int64_t cum = 0;   // anywhere on the stack, once per sample
};

// Functions by flat value (then cumulative, then name), the selection's
// samples only. `by` = "" (functions), "thread", or "label:KEY" (one row per
// value of the label; flat == cum).
absl::StatusOr<std::vector<TopRow>> Top(const DecodedProfile& p, int type,
                                        const Selection& sel,
                                        absl::string_view by);

// The `inprof top` text: a header line with the sample type and total,
// then `limit` rows (0: all) in pprof -top's columns.
std::string FormatTop(const DecodedProfile& p, int type,
                      const std::vector<TopRow>& rows, int limit,
                      absl::string_view by, absl::string_view source);

// Folded stacks, root first: "main;Compute;Multiply 600000000\n", one line
// per distinct stack with a nonzero value, sorted; ';' inside a name becomes
// ':' (flamegraph.pl splits on ';').
std::string Collapsed(const DecodedProfile& p, int type, const Selection& sel);

// speedscope's file format (https://www.speedscope.app/file-format-schema.json):
// one sampled profile per thread (all samples in one when the profile has
// no thread labels), largest first.
std::string Speedscope(const DecodedProfile& p, int type, const Selection& sel,
                       absl::string_view name, absl::string_view exporter);

// The self-contained flame graph page (src/report/flamegraph.html with the
// profile's data in it). With `base`, a differential flame graph: widths
// from `p`, colors from the change of each frame's share from `base`.
std::string FlamegraphHtml(const DecodedProfile& p, absl::string_view title,
                           const DecodedProfile* base,
                           absl::string_view base_title);

// `s` as a JSON string literal (quotes included) that is also safe inside
// an HTML <script> element: '<', '>', '&' and U+2028/9 are escaped, and
// invalid UTF-8 bytes become U+FFFD.
std::string JsonString(absl::string_view s);

}  // namespace inprof::report

#endif  // INPROF_REPORT_REPORT_H_
