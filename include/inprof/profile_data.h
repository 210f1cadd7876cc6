// inprof/profile_data.h: an aggregated, not yet symbolized profile.
//
// This is what the collector hands to the exporter: samples keyed by thread
// and raw stack, with one value per sample type. Symbolization and pprof
// encoding (pprof_writer.h) happen later, off the sampled threads.
//
// Thread-safety: a plain value type.
//
// Example:
//   inprof::ProfileData data;
//   data.sample_types = {{"cpu-samples", "count"}, {"cpu-time", "nanoseconds"}};
//   data.threads.push_back({.tid = 42, .name = "main"});
//   data.samples.push_back({.thread = 0, .frames = {pc, ret1, ret2},
//                           .values = {3, 30'000'000}});
#ifndef INPROF_PROFILE_DATA_H_
#define INPROF_PROFILE_DATA_H_

#include <cstdint>
#include <string>
#include <vector>

namespace inprof {

// A pprof ValueType: what a value measures and in which unit.
struct ValueType {
  std::string type;  // e.g. "cpu-time"
  std::string unit;  // e.g. "nanoseconds"
  bool operator==(const ValueType&) const = default;
};

// A thread as the profile names it (pprof labels "thread id", "thread name").
struct ThreadIdentity {
  int64_t tid = 0;
  std::string name;
};

// A pprof Label on a sample: a string or a numeric value.
struct SampleLabel {
  std::string key;
  std::string str;
  int64_t num = 0;
  bool numeric = false;
  bool operator==(const SampleLabel&) const = default;
};

// One aggregated stack.
struct ProfileSample {
  uint32_t thread = 0;           // index into ProfileData::threads
  std::vector<uint64_t> frames;  // frames[0]: the sampled pc (exact); the
                                 // rest: return addresses, callers last
  std::vector<int64_t> values;   // one per ProfileData::sample_types
  // A frame that names itself rather than an address (for example
  // "[dropped: ring full]"); when set, `frames` is empty.
  std::string synthetic_frame;
  // Labels besides "thread id"/"thread name" (ScopedLabels, thread state).
  std::vector<SampleLabel> labels;
};

struct ProfileData {
  std::vector<ValueType> sample_types;
  ValueType period_type;
  int64_t period = 0;
  int64_t time_nanos = 0;      // window start, Unix epoch nanoseconds
  int64_t duration_nanos = 0;  // window length
  std::vector<ThreadIdentity> threads;
  std::vector<ProfileSample> samples;
  // Free-form notes: engine, drop and truncation counts (pprof -comments).
  std::vector<std::string> comments;
  // Index into sample_types that viewers show first.
  int64_t default_sample_type = 0;
};

}  // namespace inprof

#endif  // INPROF_PROFILE_DATA_H_
