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
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
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

// Parses serialized pprof bytes, gzip-compressed or not.
absl::StatusOr<DecodedProfile> DecodePprof(std::string_view bytes);

// Reads and parses the pprof file at `path`. Errors name the path.
absl::StatusOr<DecodedProfile> ReadPprofFile(const std::string& path);

}  // namespace inprof

#endif  // INPROF_PPROF_READER_H_
