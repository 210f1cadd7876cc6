// pprof encoding with inprof's own wire writer (no protobuf runtime in the
// host), gzip with zlib.

#include "inprof/pprof_writer.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <limits>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "inprof/base/growth_safe_table.h"
#include "inprof/internal/proto_wire.h"
#include "inprof/sink.h"

namespace inprof {
namespace {

using internal::ProtoWriter;

// Field numbers of proto/profile.proto.
namespace field {
// Profile
constexpr uint32_t kSampleType = 1, kSample = 2, kMapping = 3, kLocation = 4,
                   kFunction = 5, kStringTable = 6, kTimeNanos = 9,
                   kDurationNanos = 10, kPeriodType = 11, kPeriod = 12,
                   kComment = 13, kDefaultSampleType = 14;
// ValueType
constexpr uint32_t kVtType = 1, kVtUnit = 2;
// Sample
constexpr uint32_t kSampleLocationId = 1, kSampleValue = 2, kSampleLabel = 3;
// Label
constexpr uint32_t kLabelKey = 1, kLabelStr = 2, kLabelNum = 3;
// Mapping
constexpr uint32_t kMapId = 1, kMapStart = 2, kMapLimit = 3, kMapOffset = 4,
                   kMapFilename = 5, kMapBuildId = 6, kMapHasFunctions = 7,
                   kMapHasFilenames = 8, kMapHasLineNumbers = 9,
                   kMapHasInlineFrames = 10;
// Location
constexpr uint32_t kLocId = 1, kLocMappingId = 2, kLocAddress = 3,
                   kLocLine = 4;
// Line
constexpr uint32_t kLineFunctionId = 1, kLineLine = 2;
// Function
constexpr uint32_t kFnId = 1, kFnName = 2, kFnSystemName = 3,
                   kFnFilename = 4;
}  // namespace field

// Length of the well-formed UTF-8 sequence at s[i], 0 if there is none.
size_t Utf8SequenceLength(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t c = b(i);
  if (c < 0x80) return 1;
  size_t n = 0;
  uint8_t lo = 0x80, hi = 0xbf;  // the allowed range of the second byte
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    if (c == 0xe0) lo = 0xa0;  // no overlong forms
    if (c == 0xed) hi = 0x9f;  // no surrogates
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    if (c == 0xf0) lo = 0x90;
    if (c == 0xf4) hi = 0x8f;  // nothing above U+10FFFF
  } else {
    return 0;
  }
  if (s.size() - i < n) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if (b(i + k) < 0x80 || b(i + k) > 0xbf) return 0;
  }
  return n;
}

// profile.proto's strings are proto3 `string`s, which must be UTF-8 (protobuf
// parsers reject the whole profile otherwise). Thread names, labels and file
// names can hold any bytes: each byte that does not start a well-formed
// sequence becomes U+FFFD, as decoders do.
const std::string& ValidUtf8(const std::string& s, std::string& scratch) {
  size_t i = 0;
  while (i < s.size()) {
    const size_t n = Utf8SequenceLength(s, i);
    if (n == 0) break;
    i += n;
  }
  if (i == s.size()) return s;
  scratch.assign(s, 0, i);
  while (i < s.size()) {
    const size_t n = Utf8SequenceLength(s, i);
    if (n == 0) {
      scratch.append("\xef\xbf\xbd");
      ++i;
    } else {
      scratch.append(s, i, n);
      i += n;
    }
  }
  return scratch;
}

// pprof's string table: index 0 is "", each string stored once, as UTF-8.
class StringTable {
 public:
  StringTable() { Index(""); }

  int64_t Index(const std::string& raw) {
    const std::string& s = ValidUtf8(raw, scratch_);
    auto it = index_.find(absl::string_view(s));
    if (it != index_.end()) return it->second;
    // Each allocation before the tables change (growth_safe_table.h).
    const auto id = static_cast<int64_t>(strings_.size());
    strings_.push_back(s);
    try {
      internal::GrowthReserve reserve(index_);
      index_.emplace(absl::string_view(strings_.back()), id);
    } catch (...) {
      strings_.pop_back();
      throw;
    }
    return id;
  }

  void WriteTo(ProtoWriter& profile) const {
    for (const std::string& s : strings_) profile.Bytes(field::kStringTable, s);
  }

 private:
  // The strings in a deque (they stay put), the index of views into them.
  std::deque<std::string> strings_;
  internal::GrowthSafeMap<absl::string_view, int64_t> index_;
  std::string scratch_;
};

void WriteValueType(ProtoWriter& out, uint32_t field_number, int64_t type,
                    int64_t unit) {
  ProtoWriter vt;
  vt.Int64(field::kVtType, type);
  vt.Int64(field::kVtUnit, unit);
  out.Message(field_number, vt);
}

class Encoder {
 public:
  Encoder(const ProfileData& data, Symbolizer& symbolizer)
      : data_(data), symbolizer_(symbolizer) {}

  absl::StatusOr<std::string> Encode() {
    absl::Status valid = Validate();
    if (!valid.ok()) return valid;

    symbolizer_.Refresh();
    const std::vector<ModuleInfo>& modules = symbolizer_.modules();
    module_has_location_.assign(modules.size(), false);

    ProtoWriter head;  // sample types, then the samples
    for (const ValueType& vt : data_.sample_types) {
      WriteValueType(head, field::kSampleType, strings_.Index(vt.type),
                     strings_.Index(vt.unit));
    }
    ProtoWriter tail;  // the scalar fields after the string table
    tail.Int64(field::kTimeNanos, data_.time_nanos);
    tail.Int64(field::kDurationNanos, data_.duration_nanos);
    if (!data_.period_type.type.empty() || !data_.period_type.unit.empty()) {
      WriteValueType(tail, field::kPeriodType,
                     strings_.Index(data_.period_type.type),
                     strings_.Index(data_.period_type.unit));
    }
    tail.Int64(field::kPeriod, data_.period);
    ProtoWriter comments;
    for (const std::string& c : data_.comments) {
      comments.RawVarint(static_cast<uint64_t>(strings_.Index(c)));
    }
    tail.Packed(field::kComment, comments);
    // pprof stores the preferred type's name, not its position.
    if (data_.default_sample_type > 0 &&
        static_cast<size_t>(data_.default_sample_type) <
            data_.sample_types.size()) {
      tail.Int64(field::kDefaultSampleType,
                 strings_.Index(
                     data_.sample_types[data_.default_sample_type].type));
    }

    const int64_t thread_id_key = strings_.Index("thread id");
    const int64_t thread_name_key = strings_.Index("thread name");
    ProtoWriter sample;
    ProtoWriter packed;
    ProtoWriter label;
    for (const ProfileSample& s : data_.samples) {
      bool all_zero = true;
      for (int64_t v : s.values) all_zero = all_zero && v == 0;
      if (all_zero) continue;
      sample.Clear();
      packed.Clear();
      if (!s.synthetic_frame.empty() && s.frames.empty()) {
        packed.RawVarint(SyntheticLocation(s.synthetic_frame));
      }
      for (size_t i = 0; i < s.frames.size(); ++i) {
        packed.RawVarint(AddressLocation(s.frames[i], i > 0));
      }
      sample.Packed(field::kSampleLocationId, packed);
      packed.Clear();
      for (int64_t v : s.values) packed.RawVarint(static_cast<uint64_t>(v));
      sample.Packed(field::kSampleValue, packed);
      const ThreadIdentity& thread = data_.threads[s.thread];
      WriteLabel(sample, label, thread_id_key, nullptr, thread.tid);
      if (!thread.name.empty()) {
        WriteLabel(sample, label, thread_name_key, &thread.name, 0);
      }
      for (const SampleLabel& l : s.labels) {
        WriteLabel(sample, label, strings_.Index(l.key),
                   l.numeric ? nullptr : &l.str, l.num);
      }
      head.Message(field::kSample, sample);
    }

    // Mapping ids are module index + 1; the has_* flags say what the
    // symbolizer knew about the modules that have locations.
    ProtoWriter mappings;
    ProtoWriter m;
    for (size_t i = 0; i < modules.size(); ++i) {
      m.Clear();
      m.Varint(field::kMapId, i + 1);
      m.Varint(field::kMapStart, modules[i].start);
      m.Varint(field::kMapLimit, modules[i].limit);
      m.Varint(field::kMapOffset, modules[i].file_offset);
      m.Int64(field::kMapFilename, strings_.Index(modules[i].path));
      m.Int64(field::kMapBuildId, strings_.Index(modules[i].build_id));
      if (module_has_location_[i]) {
        const Symbolizer::ModuleCapabilities caps =
            symbolizer_.Capabilities(static_cast<int>(i));
        m.Bool(field::kMapHasFunctions, caps.has_functions);
        m.Bool(field::kMapHasFilenames, caps.has_filenames);
        m.Bool(field::kMapHasLineNumbers, caps.has_line_numbers);
        m.Bool(field::kMapHasInlineFrames, caps.has_inline_frames);
      }
      mappings.Message(field::kMapping, m);
    }

    std::string out = std::move(head.mutable_bytes());
    out.reserve(out.size() + mappings.bytes().size() +
                locations_out_.bytes().size() +
                functions_out_.bytes().size() + tail.bytes().size());
    out.append(mappings.bytes());
    out.append(locations_out_.bytes());
    out.append(functions_out_.bytes());
    ProtoWriter strings;
    strings_.WriteTo(strings);
    out.append(strings.bytes());
    out.append(tail.bytes());
    return out;
  }

 private:
  absl::Status Validate() const {
    for (size_t i = 0; i < data_.samples.size(); ++i) {
      const ProfileSample& s = data_.samples[i];
      if (s.values.size() != data_.sample_types.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("EncodePprof: sample ", i, " has ", s.values.size(),
                         " values; expected ", data_.sample_types.size(),
                         " (one per sample type)"));
      }
      if (s.thread >= data_.threads.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "EncodePprof: sample ", i, " names thread index ", s.thread,
            "; expected an index below ", data_.threads.size()));
      }
    }
    return absl::OkStatus();
  }

  // A string label when `str` is given, a numeric one otherwise.
  void WriteLabel(ProtoWriter& sample, ProtoWriter& label, int64_t key,
                  const std::string* str, int64_t num) {
    label.Clear();
    label.Int64(field::kLabelKey, key);
    if (str != nullptr) {
      label.Int64(field::kLabelStr, strings_.Index(*str));
    } else {
      label.Int64(field::kLabelNum, num);
    }
    sample.Message(field::kSampleLabel, label);
  }

  uint64_t FunctionId(const SourceFrame& frame) {
    const std::string& name =
        frame.function.empty() ? frame.system_name : frame.function;
    auto key = std::make_tuple(name, frame.system_name, frame.file);
    internal::GrowthReserve reserve(functions_);
    auto [it, inserted] = functions_.try_emplace(std::move(key), 0);
    if (inserted) {
      it->second = ++function_count_;
      ProtoWriter f;
      f.Varint(field::kFnId, it->second);
      f.Int64(field::kFnName, strings_.Index(name));
      f.Int64(field::kFnSystemName, strings_.Index(frame.system_name));
      f.Int64(field::kFnFilename, strings_.Index(frame.file));
      functions_out_.Message(field::kFunction, f);
    }
    return it->second;
  }

  // The leaf pc is exact; callers' addresses are return addresses. The same
  // address can occur in both roles, with different source lines.
  uint64_t AddressLocation(uint64_t address, bool is_return_address) {
    auto it = locations_.find(std::make_pair(address, is_return_address));
    if (it != locations_.end()) return it->second;
    {
      internal::GrowthReserve reserve(locations_);
      it = locations_.try_emplace(std::make_pair(address, is_return_address), 0).first;
    }
    const SymbolizedAddress& sym =
        symbolizer_.Lookup(address, is_return_address);
    it->second = ++location_count_;
    location_.Clear();
    location_.Varint(field::kLocId, it->second);
    if (sym.module >= 0 &&
        static_cast<size_t>(sym.module) < module_has_location_.size()) {
      location_.Varint(field::kLocMappingId,
                       static_cast<uint64_t>(sym.module) + 1);
      module_has_location_[sym.module] = true;
    }
    location_.Varint(field::kLocAddress, address);
    // A frame without a name gets no Line: pprof then shows module+offset
    // (or symbolizes it itself from the mapping's file).
    for (const SourceFrame& frame : sym.frames) {
      if (frame.function.empty() && frame.system_name.empty()) continue;
      WriteLine(FunctionId(frame), frame.line);
    }
    locations_out_.Message(field::kLocation, location_);
    return it->second;
  }

  uint64_t SyntheticLocation(const std::string& name) {
    auto it = synthetic_.find(name);
    if (it != synthetic_.end()) return it->second;
    {
      std::string key = name;
      internal::GrowthReserve reserve(synthetic_);
      it = synthetic_.try_emplace(std::move(key), 0).first;
    }
    it->second = ++location_count_;
    SourceFrame frame;
    frame.function = name;
    frame.system_name = name;
    location_.Clear();
    location_.Varint(field::kLocId, it->second);
    WriteLine(FunctionId(frame), 0);
    locations_out_.Message(field::kLocation, location_);
    return it->second;
  }

  void WriteLine(uint64_t function_id, int64_t line_number) {
    ProtoWriter line;
    line.Varint(field::kLineFunctionId, function_id);
    line.Int64(field::kLineLine, line_number);
    location_.Message(field::kLocLine, line);
  }

  const ProfileData& data_;
  Symbolizer& symbolizer_;
  StringTable strings_;
  ProtoWriter location_;        // the location being written
  ProtoWriter locations_out_;   // Profile.location, in id order
  ProtoWriter functions_out_;   // Profile.function, in id order
  uint64_t location_count_ = 0;
  uint64_t function_count_ = 0;
  std::vector<bool> module_has_location_;
  // Tables that grow with the heap exhausted too (growth_safe_table.h):
  // an export that meets it is abandoned, and its tables destroyed.
  internal::GrowthSafeMap<std::pair<uint64_t, bool>, uint64_t> locations_;
  internal::GrowthSafeMap<std::string, uint64_t> synthetic_;
  internal::GrowthSafeMap<std::tuple<std::string, std::string, std::string>, uint64_t>
      functions_;
};

}  // namespace

absl::StatusOr<std::string> EncodePprof(const ProfileData& data,
                                        Symbolizer& symbolizer) {
  return Encoder(data, symbolizer).Encode();
}

absl::StatusOr<std::string> GzipCompress(std::string_view bytes) {
  z_stream zs;
  std::memset(&zs, 0, sizeof zs);
  // windowBits 15 + 16: a gzip header and trailer instead of zlib's.
  if (deflateInit2(&zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8,
                   Z_DEFAULT_STRATEGY) != Z_OK) {
    return absl::InternalError(absl::StrCat(
        "GzipCompress: deflateInit2 failed: ", zs.msg ? zs.msg : "no message"));
  }
  std::string out;
  out.resize(deflateBound(&zs, bytes.size() > std::numeric_limits<uLong>::max()
                                   ? std::numeric_limits<uLong>::max()
                                   : static_cast<uLong>(bytes.size())) +
             64);
  size_t in_pos = 0;
  size_t out_pos = 0;
  int rc = Z_OK;
  // avail_in/avail_out are 32-bit: feed and drain in chunks.
  constexpr size_t kChunk = size_t{1} << 30;
  while (rc != Z_STREAM_END) {
    const size_t in_left = bytes.size() - in_pos;
    const size_t in_now = std::min(in_left, kChunk);
    if (out.size() - out_pos < 64) out.resize(out.size() * 2 + 64);
    const size_t out_now = std::min(out.size() - out_pos, kChunk);
    zs.next_in =
        reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data())) + in_pos;
    zs.avail_in = static_cast<uInt>(in_now);
    zs.next_out = reinterpret_cast<Bytef*>(out.data()) + out_pos;
    zs.avail_out = static_cast<uInt>(out_now);
    rc = deflate(&zs, in_now == in_left ? Z_FINISH : Z_NO_FLUSH);
    if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR) {
      std::string msg = zs.msg ? zs.msg : "no message";
      deflateEnd(&zs);
      return absl::InternalError(
          absl::StrCat("GzipCompress: deflate failed (", rc, "): ", msg));
    }
    in_pos += in_now - zs.avail_in;
    out_pos += out_now - zs.avail_out;
  }
  deflateEnd(&zs);
  out.resize(out_pos);
  return out;
}

absl::Status WritePprofFile(const std::string& path, const ProfileData& data,
                            Symbolizer& symbolizer) {
  absl::StatusOr<std::string> encoded = EncodePprof(data, symbolizer);
  if (!encoded.ok()) return encoded.status();
  absl::StatusOr<std::string> compressed = GzipCompress(*encoded);
  if (!compressed.ok()) return compressed.status();

  absl::Status written = WriteFileAtomically(path, *compressed);
  if (!written.ok()) {
    return absl::Status(written.code(),
                        absl::StrCat("WritePprofFile: ", written.message()));
  }
  return absl::OkStatus();
}

}  // namespace inprof
