// pprof decoding with the generated protobuf code, gunzip with zlib.

#include "inprof/pprof_reader.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "profile.pb.h"

namespace inprof {
namespace {

namespace pb = ::perftools::profiles;

bool IsGzip(std::string_view bytes) {
  return bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x1f &&
         static_cast<unsigned char>(bytes[1]) == 0x8b;
}

absl::StatusOr<std::string> Gunzip(std::string_view bytes) {
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
    out.append(buf, sizeof buf - zs.avail_out);
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

std::string BaseName(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

absl::StatusOr<DecodedProfile> DecodePprof(std::string_view bytes) {
  std::string inflated;
  if (IsGzip(bytes)) {
    absl::StatusOr<std::string> raw = Gunzip(bytes);
    if (!raw.ok()) return raw.status();
    inflated = *std::move(raw);
    bytes = inflated;
  }
  pb::Profile profile;
  if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max()) ||
      !profile.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::InvalidArgumentError(
        absl::StrCat("DecodePprof: ", bytes.size(),
                     " bytes do not parse as perftools.profiles.Profile"));
  }

  const int nstrings = profile.string_table_size();
  absl::Status bad;
  auto str = [&](int64_t index) -> std::string {
    if (index < 0 || index >= nstrings) {
      if (bad.ok()) {
        bad = absl::InvalidArgumentError(
            absl::StrCat("DecodePprof: string index ", index,
                         " out of range; expected below ", nstrings));
      }
      return "";
    }
    return profile.string_table(static_cast<int>(index));
  };

  DecodedProfile out;
  for (const pb::ValueType& vt : profile.sample_type()) {
    out.sample_types.push_back({str(vt.type()), str(vt.unit())});
  }
  out.period_type = {str(profile.period_type().type()),
                     str(profile.period_type().unit())};
  out.period = profile.period();
  out.time_nanos = profile.time_nanos();
  out.duration_nanos = profile.duration_nanos();
  for (int64_t c : profile.comment()) out.comments.push_back(str(c));
  out.default_sample_type = str(profile.default_sample_type());

  absl::flat_hash_map<uint64_t, const pb::Mapping*> mappings;
  for (const pb::Mapping& m : profile.mapping()) mappings[m.id()] = &m;
  absl::flat_hash_map<uint64_t, std::string> function_names;
  for (const pb::Function& f : profile.function()) {
    std::string name = str(f.name());
    if (name.empty()) name = str(f.system_name());
    function_names[f.id()] = std::move(name);
  }
  absl::flat_hash_map<uint64_t, std::vector<std::string>> location_frames;
  for (const pb::Location& loc : profile.location()) {
    std::vector<std::string>& frames = location_frames[loc.id()];
    for (const pb::Line& line : loc.line()) {
      auto it = function_names.find(line.function_id());
      if (it == function_names.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "DecodePprof: location ", loc.id(), " names function ",
            line.function_id(), "; expected one of the profile's functions"));
      }
      frames.push_back(it->second);
    }
    if (!frames.empty()) continue;
    auto m = mappings.find(loc.mapping_id());
    if (loc.mapping_id() != 0 && m != mappings.end()) {
      const pb::Mapping& mapping = *m->second;
      frames.push_back(absl::StrFormat(
          "%s+0x%x", BaseName(str(mapping.filename())),
          loc.address() - mapping.memory_start() + mapping.file_offset()));
    } else {
      frames.push_back(absl::StrFormat("0x%x", loc.address()));
    }
  }

  out.samples.reserve(profile.sample_size());
  for (const pb::Sample& s : profile.sample()) {
    DecodedProfile::Sample sample;
    for (uint64_t id : s.location_id()) {
      auto it = location_frames.find(id);
      if (it == location_frames.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("DecodePprof: sample names location ", id,
                         "; expected one of the profile's locations"));
      }
      sample.stack.insert(sample.stack.end(), it->second.begin(),
                          it->second.end());
    }
    sample.values.assign(s.value().begin(), s.value().end());
    for (const pb::Label& label : s.label()) {
      if (label.str() != 0) {
        sample.str_labels[str(label.key())] = str(label.str());
      } else {
        sample.num_labels[str(label.key())] = label.num();
      }
    }
    out.samples.push_back(std::move(sample));
  }
  if (!bad.ok()) return bad;
  return out;
}

absl::StatusOr<DecodedProfile> ReadPprofFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat("ReadPprofFile: cannot open '", path, "'"));
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) {
    return absl::DataLossError(
        absl::StrCat("ReadPprofFile: cannot read '", path, "'"));
  }
  absl::StatusOr<DecodedProfile> profile = DecodePprof(buffer.str());
  if (!profile.ok()) {
    return absl::Status(
        profile.status().code(),
        absl::StrCat("'", path, "': ", profile.status().message()));
  }
  return profile;
}

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
      total += s.values[value_index];
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
    out[s.stack.front()] += s.values[value_index];
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
      if (seen.insert(fn).second) out[fn] += s.values[value_index];
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
      out[it->second] += s.values[value_index];
    } else if (auto n = s.num_labels.find(k); n != s.num_labels.end()) {
      out[absl::StrCat(n->second)] += s.values[value_index];
    }
  }
  return out;
}

}  // namespace inprof
