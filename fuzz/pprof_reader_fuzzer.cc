// libFuzzer target: the pprof reader (inprof::DecodePprof), which parses
// profiles from disk or the network: gzip-compressed or raw protobuf.
//
// Also RenamePprofStrings, which rewrites a profile's string table for the
// Datadog upload, and SelectPprofSampleTypes, which cuts a profile's
// columns for the Pyroscope upload, and PprofToLegacyHeapProfile, the
// gperftools drop-in's GetHeapProfile text.
//
// Checked: nothing crashes or reads out of bounds, whatever the bytes; a
// profile that decodes can be queried (totals, flat, cumulative, by label)
// with any value index, valid or not.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "inprof/internal/legacy_heap.h"
#include "inprof/pprof_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  // The Datadog upload's rename (RenamePprofStrings): whatever the bytes,
  // an error or a result; a renamed profile decodes as the original did,
  // with the one type renamed.
  auto renamed = inprof::RenamePprofStrings(bytes, {{"alloc_space", "alloc-space"}});
  auto profile = inprof::DecodePprof(bytes);
  if (renamed.ok() && renamed->has_value()) {
    auto again = inprof::DecodePprof(**renamed);
    if (profile.ok() != again.ok()) std::abort();
    if (profile.ok() && (again->samples.size() != profile->samples.size() ||
                         again->sample_types.size() != profile->sample_types.size())) {
      std::abort();
    }
  }
  // The Pyroscope upload's cut: whatever the bytes, an error or a result;
  // what is left of a readable profile has only the type asked for.
  auto cut = inprof::SelectPprofSampleTypes(
      bytes, [](std::string_view t) { return t == "alloc_space"; },
      inprof::ValueType{"space", "bytes"}, 524288);
  if (cut.ok() && profile.ok()) {
    auto left = inprof::DecodePprof(*cut);
    if (left.ok()) {
      for (const auto& t : left->sample_types) {
        if (t.type != "alloc_space") std::abort();
      }
    }
  }
  // The legacy text: an error or a text that starts as gperftools' does.
  auto legacy = inprof::internal::PprofToLegacyHeapProfile(bytes, "maps\n");
  if (legacy.ok() && legacy->rfind("heap profile: ", 0) != 0) std::abort();
  // And the contention text (/debug/pprof/mutex?debug=1): Go's header.
  auto contention = inprof::internal::PprofToLegacyContention(bytes, "maps\n", "mutex");
  if (contention.ok() && contention->rfind("--- mutex:\n", 0) != 0) std::abort();
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
