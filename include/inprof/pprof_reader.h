// inprof/pprof_reader.h: reads pprof profiles back into plain C++ values.
//
// Defines DecodedProfile (sample types, period, times, comments, and each
// sample's symbolized stack with its values and labels) and the functions
// that parse a pprof file (gzip-compressed or raw protobuf) into it, plus a
// few aggregations (totals, flat and cumulative per function, per label)
// that demos and tests use to check what a profile says. It reads any pprof
// profile, not only inprof's.
//
// Thread-safety: the functions are reentrant; a DecodedProfile is a plain
// value type (const methods may be called concurrently).
//
// Example:
//   absl::StatusOr<inprof::DecodedProfile> p =
//       inprof::ReadPprofFile("cpu.pb.gz");
//   if (!p.ok()) return p.status();
//   int cpu = p->ValueIndex("cpu-time");
//   for (const auto& [fn, ns] : p->FlatByFunction(cpu))
//     std::printf("%s %lld\n", fn.c_str(), static_cast<long long>(ns));
#ifndef INPROF_PPROF_READER_H_
#define INPROF_PPROF_READER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "inprof/profile_data.h"

namespace inprof {

// A profile as its readers see it: names, not ids.
struct DecodedProfile {
  struct Sample {
    // Function names, leaf first; inline frames expanded innermost first. A
    // location without a function reads "module+0xoffset" (module: the
    // mapping's base name, offset into its file) or "0xaddress" unmapped.
    std::vector<std::string> stack;
    std::vector<int64_t> values;  // one per sample_types
    absl::flat_hash_map<std::string, std::string> str_labels;
    absl::flat_hash_map<std::string, int64_t> num_labels;
  };

  std::vector<ValueType> sample_types;
  ValueType period_type;
  int64_t period = 0;
  int64_t time_nanos = 0;
  int64_t duration_nanos = 0;
  std::vector<std::string> comments;
  std::string default_sample_type;  // type name; empty when unset
  std::vector<Sample> samples;

  // Index of the sample type named `type` in sample_types; -1 if absent.
  int ValueIndex(std::string_view type) const;

  // Sum of values[value_index] over all samples (0 for a bad index).
  int64_t Total(int value_index) const;

  // values[value_index] summed by leaf function (stack[0]).
  absl::flat_hash_map<std::string, int64_t> FlatByFunction(
      int value_index) const;

  // values[value_index] summed by every function on the stack, each function
  // counted once per sample (recursion does not double count).
  absl::flat_hash_map<std::string, int64_t> CumulativeByFunction(
      int value_index) const;

  // values[value_index] summed by the value of label `key` (string labels,
  // or numeric ones printed in decimal); samples without it are left out.
  absl::flat_hash_map<std::string, int64_t> ByLabel(std::string_view key,
                                                    int value_index) const;
};

// What the reader reads and decodes of one profile at most, so that an
// input that is no profile (/dev/zero), a gzip bomb or millions of empty
// samples is refused with one error (ResourceExhausted, naming the limit)
// instead of exhausting memory. The defaults are far above real profiles
// (inprof's own windows hold thousands of samples, large Go or C++
// profiles a few hundred thousand); at the defaults a profile may still
// take a few GiB once decoded.
struct PprofReadLimits {
  // Bytes read from the file, gzip-compressed or not.
  uint64_t max_input_bytes = uint64_t{256} << 20;
  // Bytes of protobuf once gunzipped.
  uint64_t max_decoded_bytes = uint64_t{256} << 20;
  // Samples.
  uint64_t max_samples = 2'000'000;
  // Every other entry, together: sample types, mappings, locations,
  // functions, strings, comments, and the location ids, values, labels and
  // lines inside samples and locations.
  uint64_t max_entries = 16'000'000;
  // Stack frames over all samples, inline frames expanded.
  uint64_t max_frames = 16'000'000;
  // Bytes of names and label values copied into the DecodedProfile.
  uint64_t max_text_bytes = uint64_t{1} << 30;
};

// Parses serialized pprof bytes, gzip-compressed or not.
absl::StatusOr<DecodedProfile> DecodePprof(std::string_view bytes,
                                           const PprofReadLimits& limits = {});

// Reads and parses the pprof file at `path` (a regular file, a pipe or a
// device). Errors name the path.
absl::StatusOr<DecodedProfile> ReadPprofFile(const std::string& path,
                                             const PprofReadLimits& limits = {});

// `pprof` (gzip-compressed or not) with each sample type whose name equals
// a `renames` key named by the value instead (for a service that names them
// its own way: Datadog's "alloc-space" for Go's "alloc_space"), through a
// string appended to the table: a function or label that shares the old
// name keeps it. The default sample type follows. Every other field is
// kept as it was. nullopt when no sample type matched (use `pprof` as it
// is); otherwise gzip-compressed.
absl::StatusOr<std::optional<std::string>> RenamePprofStrings(
    std::string_view pprof,
    const std::vector<std::pair<std::string_view, std::string_view>>& renames);

// `pprof` (gzip-compressed or not) with only the sample types whose names
// `keep` is true for, for a service that files each kind of profile apart (Pyroscope
// puts allocation types under "memory", CPU types under "process_cpu"): the
// other types' columns are cut from every sample, and a sample left with
// only zeros is left out. With `period_type.type` non-empty, the period
// type and period are replaced by these. A default_sample_type that is cut
// becomes the first type kept. Every other field is kept as it was (the
// locations and functions, even those no sample uses any more). The result
// is gzip-compressed; NotFound when `keep` takes none.
absl::StatusOr<std::string> SelectPprofSampleTypes(
    std::string_view pprof, absl::FunctionRef<bool(std::string_view)> keep,
    const ValueType& period_type = {}, int64_t period = 0);

}  // namespace inprof

#endif  // INPROF_PPROF_READER_H_
