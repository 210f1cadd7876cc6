// pprof encoding with the generated protobuf code, gzip with zlib.

#include "inprof/pprof_writer.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "profile.pb.h"

namespace inprof {
namespace {

namespace pb = ::perftools::profiles;

// pprof's string table: index 0 is "", each string stored once.
class StringTable {
 public:
  explicit StringTable(pb::Profile* profile) : profile_(profile) { Index(""); }

  int64_t Index(const std::string& s) {
    auto [it, inserted] = index_.try_emplace(s, profile_->string_table_size());
    if (inserted) profile_->add_string_table(s);
    return it->second;
  }

 private:
  pb::Profile* profile_;
  absl::flat_hash_map<std::string, int64_t> index_;
};

class Encoder {
 public:
  Encoder(const ProfileData& data, Symbolizer& symbolizer)
      : data_(data), symbolizer_(symbolizer), strings_(&profile_) {}

  absl::StatusOr<std::string> Encode() {
    absl::Status valid = Validate();
    if (!valid.ok()) return valid;

    symbolizer_.Refresh();
    const std::vector<ModuleInfo>& modules = symbolizer_.modules();
    module_has_location_.assign(modules.size(), false);

    for (const ValueType& vt : data_.sample_types) {
      pb::ValueType* t = profile_.add_sample_type();
      t->set_type(strings_.Index(vt.type));
      t->set_unit(strings_.Index(vt.unit));
    }
    if (!data_.period_type.type.empty() || !data_.period_type.unit.empty()) {
      profile_.mutable_period_type()->set_type(
          strings_.Index(data_.period_type.type));
      profile_.mutable_period_type()->set_unit(
          strings_.Index(data_.period_type.unit));
    }
    profile_.set_period(data_.period);
    profile_.set_time_nanos(data_.time_nanos);
    profile_.set_duration_nanos(data_.duration_nanos);
    for (const std::string& c : data_.comments) {
      profile_.add_comment(strings_.Index(c));
    }
    // pprof stores the preferred type's name, not its position.
    if (data_.default_sample_type > 0 &&
        static_cast<size_t>(data_.default_sample_type) <
            data_.sample_types.size()) {
      profile_.set_default_sample_type(
          strings_.Index(data_.sample_types[data_.default_sample_type].type));
    }

    // Mappings first so that mapping ids equal module index + 1; the has_*
    // flags are filled in once the locations are known.
    for (size_t i = 0; i < modules.size(); ++i) {
      pb::Mapping* m = profile_.add_mapping();
      m->set_id(i + 1);
      m->set_memory_start(modules[i].start);
      m->set_memory_limit(modules[i].limit);
      m->set_file_offset(modules[i].file_offset);
      m->set_filename(strings_.Index(modules[i].path));
      m->set_build_id(strings_.Index(modules[i].build_id));
    }

    const int64_t thread_id_key = strings_.Index("thread id");
    const int64_t thread_name_key = strings_.Index("thread name");
    for (const ProfileSample& s : data_.samples) {
      bool all_zero = true;
      for (int64_t v : s.values) all_zero = all_zero && v == 0;
      if (all_zero) continue;
      pb::Sample* sample = profile_.add_sample();
      if (!s.synthetic_frame.empty() && s.frames.empty()) {
        sample->add_location_id(SyntheticLocation(s.synthetic_frame));
      }
      for (size_t i = 0; i < s.frames.size(); ++i) {
        sample->add_location_id(AddressLocation(s.frames[i], i > 0));
      }
      for (int64_t v : s.values) sample->add_value(v);
      const ThreadIdentity& thread = data_.threads[s.thread];
      pb::Label* tid = sample->add_label();
      tid->set_key(thread_id_key);
      tid->set_num(thread.tid);
      if (!thread.name.empty()) {
        pb::Label* name = sample->add_label();
        name->set_key(thread_name_key);
        name->set_str(strings_.Index(thread.name));
      }
      for (const SampleLabel& label : s.labels) {
        pb::Label* l = sample->add_label();
        l->set_key(strings_.Index(label.key));
        if (label.numeric) {
          l->set_num(label.num);
        } else {
          l->set_str(strings_.Index(label.str));
        }
      }
    }

    for (size_t i = 0; i < modules.size(); ++i) {
      if (!module_has_location_[i]) continue;
      const Symbolizer::ModuleCapabilities caps =
          symbolizer_.Capabilities(static_cast<int>(i));
      pb::Mapping* m = profile_.mutable_mapping(static_cast<int>(i));
      m->set_has_functions(caps.has_functions);
      m->set_has_filenames(caps.has_filenames);
      m->set_has_line_numbers(caps.has_line_numbers);
      m->set_has_inline_frames(caps.has_inline_frames);
    }

    std::string out;
    if (!profile_.SerializeToString(&out)) {
      return absl::InternalError("EncodePprof: protobuf serialization failed");
    }
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

  uint64_t FunctionId(const SourceFrame& frame) {
    const std::string& name =
        frame.function.empty() ? frame.system_name : frame.function;
    auto key = std::make_tuple(name, frame.system_name, frame.file);
    auto [it, inserted] =
        functions_.try_emplace(std::move(key), profile_.function_size() + 1);
    if (inserted) {
      pb::Function* f = profile_.add_function();
      f->set_id(it->second);
      f->set_name(strings_.Index(name));
      f->set_system_name(strings_.Index(frame.system_name));
      f->set_filename(strings_.Index(frame.file));
    }
    return it->second;
  }

  // The leaf pc is exact; callers' addresses are return addresses. The same
  // address can occur in both roles, with different source lines.
  uint64_t AddressLocation(uint64_t address, bool is_return_address) {
    auto [it, inserted] =
        locations_.try_emplace(std::make_pair(address, is_return_address), 0);
    if (!inserted) return it->second;
    const SymbolizedAddress& sym =
        symbolizer_.Lookup(address, is_return_address);
    pb::Location* loc = NewLocation();
    it->second = loc->id();
    loc->set_address(address);
    if (sym.module >= 0 &&
        static_cast<size_t>(sym.module) < module_has_location_.size()) {
      loc->set_mapping_id(static_cast<uint64_t>(sym.module) + 1);
      module_has_location_[sym.module] = true;
    }
    // A frame without a name gets no Line: pprof then shows module+offset
    // (or symbolizes it itself from the mapping's file).
    for (const SourceFrame& frame : sym.frames) {
      if (frame.function.empty() && frame.system_name.empty()) continue;
      pb::Line* line = loc->add_line();
      line->set_function_id(FunctionId(frame));
      line->set_line(frame.line);
    }
    return it->second;
  }

  uint64_t SyntheticLocation(const std::string& name) {
    auto [it, inserted] = synthetic_.try_emplace(name, 0);
    if (!inserted) return it->second;
    pb::Location* loc = NewLocation();
    it->second = loc->id();
    SourceFrame frame;
    frame.function = name;
    frame.system_name = name;
    loc->add_line()->set_function_id(FunctionId(frame));
    return it->second;
  }

  pb::Location* NewLocation() {
    pb::Location* loc = profile_.add_location();
    loc->set_id(static_cast<uint64_t>(profile_.location_size()));
    return loc;
  }

  const ProfileData& data_;
  Symbolizer& symbolizer_;
  pb::Profile profile_;
  StringTable strings_;
  std::vector<bool> module_has_location_;
  absl::flat_hash_map<std::pair<uint64_t, bool>, uint64_t> locations_;
  absl::flat_hash_map<std::string, uint64_t> synthetic_;
  absl::flat_hash_map<std::tuple<std::string, std::string, std::string>,
                      uint64_t>
      functions_;
};

absl::Status ErrnoError(int err, absl::string_view what) {
  return absl::ErrnoToStatus(err, what);
}

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

  // Same directory as `path`, so that rename() is atomic.
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return ErrnoError(errno, absl::StrCat("WritePprofFile: cannot create '",
                                          tmp, "' to write '", path, "'"));
  }
  size_t done = 0;
  while (done < compressed->size()) {
    ssize_t n = write(fd, compressed->data() + done, compressed->size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      close(fd);
      unlink(tmp.c_str());
      return ErrnoError(err, absl::StrCat("WritePprofFile: cannot write '", tmp,
                                          "' for '", path, "'"));
    }
    done += static_cast<size_t>(n);
  }
  if (close(fd) != 0) {
    const int err = errno;
    unlink(tmp.c_str());
    return ErrnoError(err, absl::StrCat("WritePprofFile: cannot write '", tmp,
                                        "' for '", path, "'"));
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    unlink(tmp.c_str());
    return ErrnoError(err, absl::StrCat("WritePprofFile: cannot rename '", tmp,
                                        "' to '", path, "'"));
  }
  return absl::OkStatus();
}

}  // namespace inprof
