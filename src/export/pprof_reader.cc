// pprof decoding with inprof's own wire reader (no protobuf runtime),
// gunzip with zlib. Everything read and decoded is bounded by
// PprofReadLimits (pprof_reader.h): the bytes read and inflated are checked
// as they come, the counts of entries in a first pass that allocates
// nothing, and the frames and names copied before they are.

#include "inprof/pprof_reader.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "inprof/internal/legacy_heap.h"
#include "inprof/internal/proto_wire.h"
#include "src/export/pprof_raw.h"

namespace inprof {
namespace {

// "256 MiB" for whole mebibytes, else "N bytes".
std::string Bytes(uint64_t n) {
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  if (n >= kMiB && n % kMiB == 0) return absl::StrCat(n / kMiB, " MiB");
  return absl::StrCat(n, " bytes");
}

absl::Status OverLimit(absl::string_view what) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "DecodePprof: ", what, " (the reader's limit for one profile)"));
}

std::string BaseName(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

// What the rewrites share (pprof_raw.h).
namespace internal {

bool IsGzip(std::string_view bytes) {
  return bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x1f &&
         static_cast<unsigned char>(bytes[1]) == 0x8b;
}

absl::StatusOr<std::string> Gunzip(std::string_view bytes, uint64_t max_out) {
  z_stream zs;
  std::memset(&zs, 0, sizeof zs);
  if (inflateInit2(&zs, 15 + 16) != Z_OK) {
    return absl::InternalError("DecodePprof: inflateInit2 failed");
  }
  std::string out;
  char buf[64 * 1024];
  size_t in_pos = 0;
  int rc = Z_OK;
  while (rc != Z_STREAM_END) {
    const size_t in_now = std::min<size_t>(bytes.size() - in_pos,
                                           std::numeric_limits<uInt>::max());
    zs.next_in =
        reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data() + in_pos));
    zs.avail_in = static_cast<uInt>(in_now);
    zs.next_out = reinterpret_cast<Bytef*>(buf);
    zs.avail_out = sizeof buf;
    rc = inflate(&zs, Z_NO_FLUSH);
    if (rc != Z_OK && rc != Z_STREAM_END) {
      std::string msg = zs.msg != nullptr ? zs.msg : "truncated input";
      inflateEnd(&zs);
      return absl::InvalidArgumentError(absl::StrCat(
          "DecodePprof: bad gzip data (", msg, "); expected a gzip stream"));
    }
    in_pos += in_now - zs.avail_in;
    const size_t produced = sizeof buf - zs.avail_out;
    if (out.size() + produced > max_out) {
      inflateEnd(&zs);
      return OverLimit(absl::StrCat("decompresses to more than ", Bytes(max_out)));
    }
    out.append(buf, produced);
    if (rc == Z_OK && zs.avail_in == 0 && in_pos == bytes.size() &&
        zs.avail_out != 0) {
      inflateEnd(&zs);
      return absl::InvalidArgumentError(
          "DecodePprof: gzip stream ends early; expected a complete profile");
    }
  }
  inflateEnd(&zs);
  return out;
}

// `bytes` gzip-compressed (the rewrites' results; here rather than
// pprof_writer's GzipCompress so that the reader stands alone).
absl::StatusOr<std::string> Gzip(std::string_view bytes) {
  z_stream zs;
  std::memset(&zs, 0, sizeof zs);
  if (deflateInit2(&zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8,
                   Z_DEFAULT_STRATEGY) != Z_OK) {
    return absl::InternalError("pprof rewrite: deflateInit2 failed");
  }
  std::string out(deflateBound(&zs, static_cast<uLong>(bytes.size())), '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  zs.avail_in = static_cast<uInt>(bytes.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  const int rc = deflate(&zs, Z_FINISH);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  if (rc != Z_STREAM_END) return absl::InternalError("pprof rewrite: deflate failed");
  return out;
}

// The protobuf bytes of `pprof`: `pprof` itself, or its gunzipped copy kept
// in `inflated`. `who` names the caller in errors.
absl::StatusOr<std::string_view> RawProfileBytes(std::string_view pprof,
                                                 std::string& inflated,
                                                 absl::string_view who) {
  const PprofReadLimits limits;
  if (pprof.size() > limits.max_input_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat(who, ": profile larger than 256 MiB"));
  }
  if (!IsGzip(pprof)) return pprof;
  absl::StatusOr<std::string> out = Gunzip(pprof, limits.max_decoded_bytes);
  if (!out.ok()) return out.status();
  inflated = std::move(*out);
  return std::string_view(inflated);
}

bool ParseValueType(std::string_view bytes, RawValueType& out) {
  ProtoReader r(bytes);
  while (r.Next()) {
    if (!r.is_varint()) continue;
    if (r.field() == 1) out.type = static_cast<int64_t>(r.varint());
    if (r.field() == 2) out.unit = static_cast<int64_t>(r.varint());
  }
  return r.ok();
}

}  // namespace internal

namespace {

using internal::ParseValueType;
using internal::ProtoReader;
using internal::RawValueType;

// Profile's messages as they are on the wire: ids and string indexes.
struct RawMapping {
  uint64_t id = 0, start = 0, limit = 0, offset = 0;
  int64_t filename = 0;
};
struct RawLocation {
  uint64_t id = 0, mapping_id = 0, address = 0;
  std::vector<uint64_t> function_ids;  // one per Line, innermost first
};
struct RawFunction {
  uint64_t id = 0;
  int64_t name = 0, system_name = 0;
};
struct RawLabel {
  int64_t key = 0, str = 0, num = 0;
};
struct RawSample {
  std::vector<uint64_t> location_ids;
  std::vector<int64_t> values;
  std::vector<RawLabel> labels;
};
struct RawProfile {
  std::vector<RawValueType> sample_types;
  std::vector<RawSample> samples;
  std::vector<RawMapping> mappings;
  std::vector<RawLocation> locations;
  std::vector<RawFunction> functions;
  std::vector<std::string_view> strings;
  int64_t time_nanos = 0, duration_nanos = 0, period = 0;
  RawValueType period_type;
  std::vector<int64_t> comments;
  int64_t default_sample_type = 0;
};

// Each Parse* reads one message; false (with the reader's error) when the
// bytes are not well-formed protobuf or a field has the wrong wire type.
bool ParseLabel(std::string_view bytes, RawLabel& out) {
  ProtoReader r(bytes);
  while (r.Next()) {
    if (!r.is_varint()) continue;
    const int64_t v = static_cast<int64_t>(r.varint());
    if (r.field() == 1) out.key = v;
    if (r.field() == 2) out.str = v;
    if (r.field() == 3) out.num = v;
  }
  return r.ok();
}

bool ParseSample(std::string_view bytes, RawSample& out) {
  ProtoReader r(bytes);
  while (r.Next()) {
    switch (r.field()) {
      case 1:
        if (!r.RepeatedVarint(
                [&](uint64_t v) { out.location_ids.push_back(v); }))
          return false;
        break;
      case 2:
        if (!r.RepeatedVarint([&](uint64_t v) {
              out.values.push_back(static_cast<int64_t>(v));
            }))
          return false;
        break;
      case 3:
        if (!r.is_length_delimited() ||
            !ParseLabel(r.bytes(), out.labels.emplace_back()))
          return false;
        break;
      default:
        break;
    }
  }
  return r.ok();
}

bool ParseMapping(std::string_view bytes, RawMapping& out) {
  ProtoReader r(bytes);
  while (r.Next()) {
    if (!r.is_varint()) continue;
    const uint64_t v = r.varint();
    switch (r.field()) {
      case 1: out.id = v; break;
      case 2: out.start = v; break;
      case 3: out.limit = v; break;
      case 4: out.offset = v; break;
      case 5: out.filename = static_cast<int64_t>(v); break;
      default: break;
    }
  }
  return r.ok();
}

bool ParseLine(std::string_view bytes, uint64_t& function_id) {
  ProtoReader r(bytes);
  while (r.Next()) {
    if (r.field() == 1 && r.is_varint()) function_id = r.varint();
  }
  return r.ok();
}

bool ParseLocation(std::string_view bytes, RawLocation& out) {
  ProtoReader r(bytes);
  while (r.Next()) {
    if (r.field() == 4) {
      uint64_t function_id = 0;
      if (!r.is_length_delimited() || !ParseLine(r.bytes(), function_id))
        return false;
      out.function_ids.push_back(function_id);
      continue;
    }
    if (!r.is_varint()) continue;
    if (r.field() == 1) out.id = r.varint();
    if (r.field() == 2) out.mapping_id = r.varint();
    if (r.field() == 3) out.address = r.varint();
  }
  return r.ok();
}

bool ParseFunction(std::string_view bytes, RawFunction& out) {
  ProtoReader r(bytes);
  while (r.Next()) {
    if (!r.is_varint()) continue;
    if (r.field() == 1) out.id = r.varint();
    if (r.field() == 2) out.name = static_cast<int64_t>(r.varint());
    if (r.field() == 3) out.system_name = static_cast<int64_t>(r.varint());
  }
  return r.ok();
}

bool ParseProfile(std::string_view bytes, RawProfile& out) {
  ProtoReader r(bytes);
  while (r.Next()) {
    const bool message = r.is_length_delimited();
    bool ok = true;
    switch (r.field()) {
      case 1:
        ok = message && ParseValueType(r.bytes(), out.sample_types.emplace_back());
        break;
      case 2:
        ok = message && ParseSample(r.bytes(), out.samples.emplace_back());
        break;
      case 3:
        ok = message && ParseMapping(r.bytes(), out.mappings.emplace_back());
        break;
      case 4:
        ok = message && ParseLocation(r.bytes(), out.locations.emplace_back());
        break;
      case 5:
        ok = message && ParseFunction(r.bytes(), out.functions.emplace_back());
        break;
      case 6:
        ok = message;
        out.strings.push_back(r.bytes());
        break;
      case 9: out.time_nanos = static_cast<int64_t>(r.varint()); break;
      case 10: out.duration_nanos = static_cast<int64_t>(r.varint()); break;
      case 11:
        ok = message && ParseValueType(r.bytes(), out.period_type);
        break;
      case 12: out.period = static_cast<int64_t>(r.varint()); break;
      case 13:
        ok = r.RepeatedVarint([&](uint64_t v) {
          out.comments.push_back(static_cast<int64_t>(v));
        });
        break;
      case 14:
        out.default_sample_type = static_cast<int64_t>(r.varint());
        break;
      default:  // drop_frames, keep_frames, unknown fields
        break;
    }
    if (!ok) return false;
  }
  return r.ok();
}

// Counts the profile's entries without allocating, before they are parsed:
// refuses a profile over `limits`. Malformed bytes are left to
// ParseProfile, which says what is wrong with them.
absl::Status CheckCounts(std::string_view bytes, const PprofReadLimits& limits) {
  uint64_t samples = 0;
  uint64_t entries = 0;
  auto count = [&entries](uint64_t) { ++entries; };
  ProtoReader r(bytes);
  while (r.Next()) {
    switch (r.field()) {
      case 2: {
        if (++samples > limits.max_samples) {
          return OverLimit(absl::StrCat("more than ", limits.max_samples, " samples"));
        }
        ProtoReader sample(r.bytes());
        while (sample.Next()) {
          if (sample.field() == 1 || sample.field() == 2) {
            if (!sample.RepeatedVarint(count)) break;
          } else if (sample.field() == 3) {
            ++entries;
          }
        }
        break;
      }
      case 4: {
        ++entries;
        ProtoReader location(r.bytes());
        while (location.Next()) {
          if (location.field() == 4) ++entries;
        }
        break;
      }
      case 13:
        if (!r.RepeatedVarint(count)) return absl::OkStatus();
        break;
      case 1:
      case 3:
      case 5:
      case 6:
        ++entries;
        break;
      default:
        break;
    }
    if (entries > limits.max_entries) {
      return OverLimit(absl::StrCat(
          "more than ", limits.max_entries,
          " entries (locations, functions, strings, values, labels, ...)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DecodedProfile> DecodePprof(std::string_view bytes,
                                           const PprofReadLimits& limits) {
  std::string inflated;
  const bool gzipped = internal::IsGzip(bytes);
  if (gzipped) {
    absl::StatusOr<std::string> raw = internal::Gunzip(bytes, limits.max_decoded_bytes);
    if (!raw.ok()) return raw.status();
    inflated = *std::move(raw);
    bytes = inflated;
  } else if (bytes.size() > limits.max_decoded_bytes) {
    return OverLimit(absl::StrCat("more than ", Bytes(limits.max_decoded_bytes),
                                  " of protobuf"));
  }
  // Empty bytes parse as a profile with nothing in it, not even the string
  // table's "" that every name refers to: said as what it is, not as the
  // first name found missing.
  if (bytes.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DecodePprof: empty input", gzipped ? " (once gunzipped)" : "",
        ", not a pprof profile"));
  }
  if (absl::Status counted = CheckCounts(bytes, limits); !counted.ok()) {
    return counted;
  }
  RawProfile profile;
  if (!ParseProfile(bytes, profile)) {
    return absl::InvalidArgumentError(
        absl::StrCat("DecodePprof: ", bytes.size(),
                     " bytes do not parse as perftools.profiles.Profile"));
  }
  if (profile.strings.empty() || !profile.strings[0].empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DecodePprof: ", bytes.size(), " bytes have ",
        profile.strings.empty() ? "no string table" : "a string table that does not start with \"\"",
        ", so they are not a pprof profile"));
  }

  const int64_t nstrings = static_cast<int64_t>(profile.strings.size());
  absl::Status bad;
  // Bytes of names copied so far: one string may be named by every function,
  // label and frame, so the copies are bounded, not only the input.
  uint64_t text_bytes = 0;
  auto take_text = [&](uint64_t n) {
    text_bytes += n;
    if (text_bytes > limits.max_text_bytes && bad.ok()) {
      bad = OverLimit(absl::StrCat("more than ", Bytes(limits.max_text_bytes),
                                   " of names and label values"));
    }
    return bad.ok();
  };
  auto str = [&](int64_t index) -> std::string {
    if (index < 0 || index >= nstrings) {
      if (bad.ok()) {
        bad = absl::InvalidArgumentError(
            absl::StrCat("DecodePprof: string index ", index,
                         " out of range; expected below ", nstrings));
      }
      return "";
    }
    const std::string_view s = profile.strings[static_cast<size_t>(index)];
    if (!take_text(s.size())) return "";
    return std::string(s);
  };

  DecodedProfile out;
  for (const RawValueType& vt : profile.sample_types) {
    out.sample_types.push_back({str(vt.type), str(vt.unit)});
  }
  out.period_type = {str(profile.period_type.type),
                     str(profile.period_type.unit)};
  out.period = profile.period;
  out.time_nanos = profile.time_nanos;
  out.duration_nanos = profile.duration_nanos;
  for (int64_t c : profile.comments) out.comments.push_back(str(c));
  out.default_sample_type = str(profile.default_sample_type);

  absl::flat_hash_map<uint64_t, const RawMapping*> mappings;
  for (const RawMapping& m : profile.mappings) mappings[m.id] = &m;
  absl::flat_hash_map<uint64_t, std::string> function_names;
  for (const RawFunction& f : profile.functions) {
    std::string name = str(f.name);
    if (name.empty()) name = str(f.system_name);
    function_names[f.id] = std::move(name);
  }
  absl::flat_hash_map<uint64_t, std::vector<std::string>> location_frames;
  for (const RawLocation& loc : profile.locations) {
    std::vector<std::string>& frames = location_frames[loc.id];
    for (uint64_t function_id : loc.function_ids) {
      auto it = function_names.find(function_id);
      if (it == function_names.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "DecodePprof: location ", loc.id, " names function ",
            function_id, "; expected one of the profile's functions"));
      }
      if (!take_text(it->second.size())) return bad;
      frames.push_back(it->second);
    }
    if (!bad.ok()) return bad;
    if (!frames.empty()) continue;
    auto m = mappings.find(loc.mapping_id);
    if (loc.mapping_id != 0 && m != mappings.end()) {
      const RawMapping& mapping = *m->second;
      frames.push_back(absl::StrFormat(
          "%s+0x%x", BaseName(str(mapping.filename)),
          loc.address - mapping.start + mapping.offset));
    } else {
      frames.push_back(absl::StrFormat("0x%x", loc.address));
    }
  }

  // The frames and names the samples' stacks will copy, before they do.
  uint64_t frames = 0;
  for (const RawSample& s : profile.samples) {
    for (uint64_t id : s.location_ids) {
      auto it = location_frames.find(id);
      if (it == location_frames.end()) continue;  // refused below
      frames += it->second.size();
      for (const std::string& name : it->second) take_text(name.size());
    }
    if (frames > limits.max_frames) {
      return OverLimit(absl::StrCat("more than ", limits.max_frames,
                                    " stack frames over its samples"));
    }
    if (!bad.ok()) return bad;
  }

  out.samples.reserve(profile.samples.size());
  for (const RawSample& s : profile.samples) {
    if (!bad.ok()) return bad;
    DecodedProfile::Sample sample;
    for (uint64_t id : s.location_ids) {
      auto it = location_frames.find(id);
      if (it == location_frames.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("DecodePprof: sample names location ", id,
                         "; expected one of the profile's locations"));
      }
      sample.stack.insert(sample.stack.end(), it->second.begin(),
                          it->second.end());
    }
    sample.values = s.values;
    for (const RawLabel& label : s.labels) {
      if (label.str != 0) {
        sample.str_labels[str(label.key)] = str(label.str);
      } else {
        sample.num_labels[str(label.key)] = label.num;
      }
    }
    out.samples.push_back(std::move(sample));
  }
  if (!bad.ok()) return bad;
  return out;
}

absl::StatusOr<DecodedProfile> ReadPprofFile(const std::string& path,
                                             const PprofReadLimits& limits) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat("ReadPprofFile: cannot open '", path, "'"));
  }
  // In chunks, up to the limit: /dev/zero or a pipe that never ends is
  // refused after max_input_bytes.
  std::string data;
  std::vector<char> chunk(1 << 20);
  while (in) {
    in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    const size_t got = static_cast<size_t>(in.gcount());
    if (data.size() + got > limits.max_input_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "ReadPprofFile: '", path, "': more than ", Bytes(limits.max_input_bytes),
          " to read (the reader's limit for one profile)"));
    }
    data.append(chunk.data(), got);
  }
  if (in.bad()) {
    return absl::DataLossError(
        absl::StrCat("ReadPprofFile: cannot read '", path, "'"));
  }
  absl::StatusOr<DecodedProfile> profile = DecodePprof(data, limits);
  if (!profile.ok()) {
    return absl::Status(
        profile.status().code(),
        absl::StrCat("'", path, "': ", profile.status().message()));
  }
  return profile;
}

namespace {

// a + b, held at the int64 limits: a profile read from outside may hold
// values whose sum leaves int64 (undefined behaviour to compute).
int64_t SaturatingAdd(int64_t a, int64_t b) {
  int64_t sum;
  if (!__builtin_add_overflow(a, b, &sum)) return sum;
  return b > 0 ? std::numeric_limits<int64_t>::max() : std::numeric_limits<int64_t>::min();
}

}  // namespace

int DecodedProfile::ValueIndex(std::string_view type) const {
  for (size_t i = 0; i < sample_types.size(); ++i) {
    if (sample_types[i].type == type) return static_cast<int>(i);
  }
  return -1;
}

int64_t DecodedProfile::Total(int value_index) const {
  int64_t total = 0;
  for (const Sample& s : samples) {
    if (value_index >= 0 && static_cast<size_t>(value_index) < s.values.size())
      total = SaturatingAdd(total, s.values[value_index]);
  }
  return total;
}

absl::flat_hash_map<std::string, int64_t> DecodedProfile::FlatByFunction(
    int value_index) const {
  absl::flat_hash_map<std::string, int64_t> out;
  for (const Sample& s : samples) {
    if (s.stack.empty() || value_index < 0 ||
        static_cast<size_t>(value_index) >= s.values.size())
      continue;
    int64_t& flat = out[s.stack.front()];
    flat = SaturatingAdd(flat, s.values[value_index]);
  }
  return out;
}

absl::flat_hash_map<std::string, int64_t> DecodedProfile::CumulativeByFunction(
    int value_index) const {
  absl::flat_hash_map<std::string, int64_t> out;
  absl::flat_hash_set<absl::string_view> seen;
  for (const Sample& s : samples) {
    if (value_index < 0 || static_cast<size_t>(value_index) >= s.values.size())
      continue;
    seen.clear();
    for (const std::string& fn : s.stack) {
      if (seen.insert(fn).second) out[fn] = SaturatingAdd(out[fn], s.values[value_index]);
    }
  }
  return out;
}

absl::flat_hash_map<std::string, int64_t> DecodedProfile::ByLabel(
    std::string_view key, int value_index) const {
  absl::flat_hash_map<std::string, int64_t> out;
  for (const Sample& s : samples) {
    if (value_index < 0 || static_cast<size_t>(value_index) >= s.values.size())
      continue;
    const absl::string_view k(key.data(), key.size());
    if (auto it = s.str_labels.find(k); it != s.str_labels.end()) {
      out[it->second] = SaturatingAdd(out[it->second], s.values[value_index]);
    } else if (auto n = s.num_labels.find(k); n != s.num_labels.end()) {
      int64_t& sum = out[absl::StrCat(n->second)];
      sum = SaturatingAdd(sum, s.values[value_index]);
    }
  }
  return out;
}

namespace internal {

namespace {

// A profile's samples merged by stack, as addresses (leaf first, the leaf
// one past its exact pc: readers take every address for a return
// address), with the `n` columns named `types` (negative values as 0).
// Frames without an address are left out; their values stay.
template <size_t N>
using LegacyStacks =
    absl::flat_hash_map<std::vector<uint64_t>, std::array<int64_t, N>,
                        absl::Hash<std::vector<uint64_t>>>;

template <size_t N>
absl::Status LegacyStacksOf(std::string_view pprof, const std::string_view (&types)[N],
                            absl::string_view who, LegacyStacks<N>* stacks,
                            std::array<int64_t, N>* total) {
  std::string inflated;
  absl::StatusOr<std::string_view> bytes = RawProfileBytes(pprof, inflated, who);
  if (!bytes.ok()) return bytes.status();
  if (absl::Status s = CheckCounts(*bytes, PprofReadLimits()); !s.ok()) return s;
  RawProfile p;
  if (!ParseProfile(*bytes, p)) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": malformed profile"));
  }
  auto text = [&](int64_t index) -> std::string_view {
    return index >= 0 && static_cast<size_t>(index) < p.strings.size() ? p.strings[index]
                                                                        : std::string_view();
  };
  size_t column[N];
  for (size_t t = 0; t < N; ++t) {
    size_t i = 0;
    while (i < p.sample_types.size() && text(p.sample_types[i].type) != types[t]) ++i;
    if (i == p.sample_types.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": the profile has no ", std::string(types[t]), " sample type"));
    }
    column[t] = i;
  }
  absl::flat_hash_map<uint64_t, uint64_t> address_of;
  for (const RawLocation& l : p.locations) address_of[l.id] = l.address;
  total->fill(0);
  for (const RawSample& s : p.samples) {
    std::array<int64_t, N> v;
    bool any = false;
    for (size_t t = 0; t < N; ++t) {
      v[t] = column[t] < s.values.size() ? std::max<int64_t>(s.values[column[t]], 0) : 0;
      any |= v[t] != 0;
    }
    if (!any) continue;
    std::vector<uint64_t> addresses;
    for (size_t k = 0; k < s.location_ids.size(); ++k) {
      auto it = address_of.find(s.location_ids[k]);
      if (it == address_of.end() || it->second == 0) continue;
      addresses.push_back(k == 0 ? it->second + 1 : it->second);
    }
    auto [it, fresh] = stacks->try_emplace(std::move(addresses));
    if (fresh) it->second.fill(0);
    for (size_t t = 0; t < N; ++t) {
      it->second[t] = SaturatingAdd(it->second[t], v[t]);
      (*total)[t] = SaturatingAdd((*total)[t], v[t]);
    }
  }
  return absl::OkStatus();
}

// The stacks by column `by`, largest first (then by addresses).
template <size_t N>
std::vector<const typename LegacyStacks<N>::value_type*> LegacyOrder(
    const LegacyStacks<N>& stacks, size_t by) {
  std::vector<const typename LegacyStacks<N>::value_type*> order;
  order.reserve(stacks.size());
  for (const auto& entry : stacks) order.push_back(&entry);
  std::sort(order.begin(), order.end(), [by](const auto* a, const auto* b) {
    if (a->second[by] != b->second[by]) return a->second[by] > b->second[by];
    return a->first < b->first;
  });
  return order;
}

}  // namespace

absl::StatusOr<std::string> PprofToLegacyHeapProfile(std::string_view pprof,
                                                     std::string_view maps) {
  // The columns in gperftools' order: in use, then allocated.
  constexpr std::string_view kTypes[4] = {"inuse_objects", "inuse_space", "alloc_objects",
                                          "alloc_space"};
  LegacyStacks<4> stacks;
  std::array<int64_t, 4> total;
  if (absl::Status s = LegacyStacksOf(pprof, kTypes, "legacy heap profile", &stacks, &total);
      !s.ok()) {
    return s;
  }
  auto bucket = [](const std::array<int64_t, 4>& v) {
    return absl::StrFormat("%6d: %8d [%6d: %8d] @", v[0], v[1], v[2], v[3]);
  };
  std::string out = absl::StrCat("heap profile: ", bucket(total), " heapprofile\n");
  for (const auto* entry : LegacyOrder<4>(stacks, 1)) {
    absl::StrAppend(&out, bucket(entry->second));
    for (uint64_t a : entry->first) absl::StrAppend(&out, absl::StrFormat(" 0x%016x", a));
    out.push_back('\n');
  }
  absl::StrAppend(&out, "\nMAPPED_LIBRARIES:\n");
  out.append(maps);
  return out;
}

absl::StatusOr<std::string> PprofToLegacyContention(std::string_view pprof,
                                                    std::string_view maps,
                                                    std::string_view header) {
  constexpr std::string_view kTypes[2] = {"delay", "contentions"};
  LegacyStacks<2> stacks;
  std::array<int64_t, 2> total;
  if (absl::Status s = LegacyStacksOf(pprof, kTypes, "legacy contention profile", &stacks,
                                      &total);
      !s.ok()) {
    return s;
  }
  // Delays in nanoseconds: cycles at 1 GHz, period 1 (already weighted).
  std::string out = absl::StrCat("--- ", absl::string_view(header.data(), header.size()),
                                 ":\ncycles/second=1000000000\n"
                                 "sampling period=1\n");
  for (const auto* entry : LegacyOrder<2>(stacks, 0)) {
    absl::StrAppend(&out, entry->second[0], " ", entry->second[1], " @");
    for (uint64_t a : entry->first) absl::StrAppend(&out, absl::StrFormat(" 0x%x", a));
    out.push_back('\n');
  }
  // The map after a "---" line: a contention profile's samples end there.
  absl::StrAppend(&out, "--- Memory map: ---\n");
  out.append(maps);
  return out;
}

}  // namespace internal
}  // namespace inprof
