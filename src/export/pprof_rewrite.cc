// Rewrites of a pprof profile without a protobuf runtime: strings renamed
// (RenamePprofStrings) and sample types selected (SelectPprofSampleTypes),
// field by field with inprof's own wire reader and writer, bounded as
// DecodePprof is (pprof_raw.h).

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "inprof/internal/proto_wire.h"
#include "inprof/pprof_reader.h"
#include "src/export/pprof_raw.h"

namespace inprof {

using internal::Gzip;
using internal::ParseValueType;
using internal::RawProfileBytes;
using internal::RawValueType;

absl::StatusOr<std::optional<std::string>> RenamePprofStrings(
    std::string_view pprof,
    const std::vector<std::pair<std::string_view, std::string_view>>& renames) {
  constexpr absl::string_view kWho = "RenamePprofStrings";
  std::string inflated;
  absl::StatusOr<std::string_view> bytes_or = RawProfileBytes(pprof, inflated, kWho);
  if (!bytes_or.ok()) return bytes_or.status();
  const std::string_view raw = *bytes_or;
  // profile.proto's top-level fields that this reads or rewrites.
  constexpr uint32_t kSampleType = 1, kStringTable = 6, kDefaultSampleType = 14;
  auto malformed = [&](const internal::ProtoReader& r) {
    return absl::InvalidArgumentError(
        absl::StrCat(kWho, ": malformed profile at byte ", r.error_offset()));
  };
  // First pass: the string table. A sample type renamed points at a new
  // string appended to it, so that a function or label that shares the old
  // string (a function named "delay") keeps it.
  std::vector<std::string_view> strings;
  {
    internal::ProtoReader reader(raw);
    while (reader.Next()) {
      if (reader.field() == kStringTable && reader.is_length_delimited()) {
        strings.push_back(reader.bytes());
      }
    }
    if (!reader.ok()) return malformed(reader);
  }
  // The new index of each string a sample type renames (-1: kept).
  std::vector<int64_t> renamed_to(strings.size(), -1);
  std::vector<std::string_view> appended;
  auto rename = [&](int64_t index) -> int64_t {
    if (index < 0 || static_cast<size_t>(index) >= strings.size()) return index;
    if (renamed_to[index] >= 0) return renamed_to[index];
    for (const auto& [from, to] : renames) {
      if (strings[index] != from) continue;
      renamed_to[index] = static_cast<int64_t>(strings.size() + appended.size());
      appended.push_back(to);
      return renamed_to[index];
    }
    return index;
  };
  internal::ProtoReader reader(raw);
  internal::ProtoWriter writer;
  while (reader.Next()) {
    if (reader.is_length_delimited()) {
      std::string_view bytes = reader.bytes();
      if (reader.field() == kSampleType) {
        RawValueType v;
        if (!ParseValueType(bytes, v)) return malformed(reader);
        internal::ProtoWriter type;
        type.Varint(1, static_cast<uint64_t>(rename(v.type)));
        type.Varint(2, static_cast<uint64_t>(v.unit));
        writer.Message(kSampleType, type);
        continue;
      }
      writer.Bytes(reader.field(), bytes);
    } else if (reader.is_varint()) {
      uint64_t value = reader.varint();
      if (reader.field() == kDefaultSampleType) {
        const auto index = static_cast<int64_t>(value);
        if (index >= 0 && static_cast<size_t>(index) < renamed_to.size() &&
            renamed_to[index] >= 0) {
          value = static_cast<uint64_t>(renamed_to[index]);
        }
      }
      // Written even when 0: an unpacked repeated field keeps its zeros.
      writer.VarintAlways(reader.field(), value);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          kWho, ": field ", reader.field(), " has a wire type profile.proto does not use"));
    }
  }
  if (!reader.ok()) return malformed(reader);
  if (appended.empty()) return std::optional<std::string>();
  for (std::string_view name : appended) writer.Bytes(kStringTable, name);
  absl::StatusOr<std::string> zipped = Gzip(writer.bytes());
  if (!zipped.ok()) return zipped.status();
  return std::optional<std::string>(std::move(*zipped));
}

absl::StatusOr<std::string> SelectPprofSampleTypes(
    std::string_view pprof, absl::FunctionRef<bool(std::string_view)> keep,
    const ValueType& period_type, int64_t period) {
  constexpr absl::string_view kWho = "SelectPprofSampleTypes";
  std::string inflated;
  absl::StatusOr<std::string_view> bytes_or = RawProfileBytes(pprof, inflated, kWho);
  if (!bytes_or.ok()) return bytes_or.status();
  const std::string_view raw = *bytes_or;
  // profile.proto's top-level fields that this rewrites.
  constexpr uint32_t kSampleType = 1, kSample = 2, kStringTable = 6,
                     kPeriodType = 11, kPeriod = 12, kDefaultSampleType = 14;
  auto malformed = [&](const internal::ProtoReader& r) {
    return absl::InvalidArgumentError(absl::StrCat(
        kWho, ": malformed profile at byte ", r.error_offset()));
  };

  // First pass: the string table and the sample types' names.
  std::vector<std::string_view> strings;
  std::vector<int64_t> type_names;  // string index of each sample type
  int64_t default_type = 0;
  {
    internal::ProtoReader r(raw);
    while (r.Next()) {
      if (r.field() == kStringTable && r.is_length_delimited()) {
        strings.push_back(r.bytes());
      } else if (r.field() == kSampleType && r.is_length_delimited()) {
        RawValueType t;
        if (!ParseValueType(r.bytes(), t)) return malformed(r);
        type_names.push_back(t.type);
      } else if (r.field() == kDefaultSampleType && r.is_varint()) {
        default_type = static_cast<int64_t>(r.varint());
      }
    }
    if (!r.ok()) return malformed(r);
  }
  auto name_of = [&](int64_t index) -> std::string_view {
    return index >= 0 && static_cast<size_t>(index) < strings.size()
               ? strings[static_cast<size_t>(index)]
               : std::string_view();
  };
  std::vector<bool> kept(type_names.size(), false);
  int64_t first_kept_name = -1;
  bool default_kept = false;
  for (size_t i = 0; i < type_names.size(); ++i) {
    kept[i] = keep(name_of(type_names[i]));
    if (!kept[i]) continue;
    if (first_kept_name < 0) first_kept_name = type_names[i];
    if (type_names[i] == default_type) default_kept = true;
  }
  if (first_kept_name < 0) {
    return absl::NotFoundError(
        absl::StrCat(kWho, ": the profile has none of the sample types asked for"));
  }
  // The new period type's names: found in the table, or appended to it.
  std::vector<std::string> appended;
  auto index_of = [&](const std::string& name) -> int64_t {
    for (size_t i = 0; i < strings.size(); ++i) {
      if (strings[i] == name) return static_cast<int64_t>(i);
    }
    for (size_t i = 0; i < appended.size(); ++i) {
      if (appended[i] == name) return static_cast<int64_t>(strings.size() + i);
    }
    appended.push_back(name);
    return static_cast<int64_t>(strings.size() + appended.size() - 1);
  };
  const bool new_period = !period_type.type.empty();
  const int64_t period_type_name = new_period ? index_of(period_type.type) : 0;
  const int64_t period_unit_name = new_period ? index_of(period_type.unit) : 0;

  // Second pass: every field copied but those.
  internal::ProtoReader r(raw);
  internal::ProtoWriter out;
  size_t type_index = 0;
  std::vector<uint64_t> locations;
  std::vector<int64_t> values;
  std::vector<std::string_view> labels;
  while (r.Next()) {
    const uint32_t field = r.field();
    if (field == kSampleType && r.is_length_delimited()) {
      if (type_index < kept.size() && kept[type_index]) out.Bytes(field, r.bytes());
      ++type_index;
      continue;
    }
    if (field == kSample && r.is_length_delimited()) {
      locations.clear();
      values.clear();
      labels.clear();
      internal::ProtoReader sr(r.bytes());
      while (sr.Next()) {
        if (sr.field() == 1) {
          if (!sr.RepeatedVarint([&](uint64_t v) { locations.push_back(v); })) break;
        } else if (sr.field() == 2) {
          if (!sr.RepeatedVarint([&](uint64_t v) {
                values.push_back(static_cast<int64_t>(v));
              })) {
            break;
          }
        } else if (sr.field() == 3 && sr.is_length_delimited()) {
          labels.push_back(sr.bytes());
        }
      }
      if (!sr.ok()) return malformed(sr);
      internal::ProtoWriter ids, vals, sample;
      bool any = false;
      for (size_t i = 0; i < values.size() && i < kept.size(); ++i) {
        if (!kept[i]) continue;
        vals.RawVarint(static_cast<uint64_t>(values[i]));
        any = any || values[i] != 0;
      }
      if (!any) continue;  // nothing left of this sample
      for (uint64_t id : locations) ids.RawVarint(id);
      sample.Packed(1, ids);
      sample.Packed(2, vals);
      for (std::string_view label : labels) sample.Bytes(3, label);
      out.Message(kSample, sample);
      continue;
    }
    if (new_period && field == kPeriodType) continue;  // written at the end
    if (new_period && field == kPeriod) continue;
    if (field == kDefaultSampleType && r.is_varint()) {
      out.VarintAlways(field, static_cast<uint64_t>(
                                  default_kept ? default_type : first_kept_name));
      continue;
    }
    if (r.is_length_delimited()) {
      out.Bytes(field, r.bytes());
    } else if (r.is_varint()) {
      out.VarintAlways(field, r.varint());
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          kWho, ": field ", field, " has a wire type profile.proto does not use"));
    }
  }
  if (!r.ok()) return malformed(r);
  for (const std::string& s : appended) out.Bytes(kStringTable, s);
  if (new_period) {
    internal::ProtoWriter vt;
    vt.Varint(1, static_cast<uint64_t>(period_type_name));
    vt.Varint(2, static_cast<uint64_t>(period_unit_name));
    out.Message(kPeriodType, vt);
    out.Int64(kPeriod, period);
  }
  return Gzip(out.bytes());
}

}  // namespace inprof
