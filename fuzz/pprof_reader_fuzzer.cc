// libFuzzer target: the pprof reader (inprof::DecodePprof), which parses
// profiles from disk or the network: gzip-compressed or raw protobuf.
//
// Checked: nothing crashes or reads out of bounds, whatever the bytes; a
// profile that decodes can be queried (totals, flat, cumulative, by label)
// with any value index, valid or not.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "inprof/pprof_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto profile = inprof::DecodePprof(
      std::string_view(reinterpret_cast<const char*>(data), size));
  if (!profile.ok()) return 0;
  const int n = static_cast<int>(profile->sample_types.size());
  for (int i = -1; i <= n; ++i) {
    (void)profile->Total(i);
    (void)profile->FlatByFunction(i);
    (void)profile->CumulativeByFunction(i);
    (void)profile->ByLabel("thread name", i);
    (void)profile->ByLabel("thread id", i);
  }
  for (const auto& t : profile->sample_types) (void)profile->ValueIndex(t.type);
  return 0;
}
