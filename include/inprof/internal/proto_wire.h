// inprof/internal/proto_wire.h: the protobuf wire format, as much of it as
// pprof's profile.proto needs.
//
// pprof is a protobuf message, but encoding and decoding it takes a handful
// of field writers and a bounds-checked reader, not a protobuf runtime: the
// host that links inprof carries no libprotobuf (whose version would clash
// with the host's own). Varints, length-delimited fields and packed repeated
// varints are written; the reader also accepts unpacked repeated fields and
// skips fixed32/fixed64 and unknown fields, as any protobuf parser does.
// The encoding is checked against libprotobuf and `protoc --decode` in
// tests/export/pprof_writer_test.cc, and the reader is fuzzed
// (fuzz/pprof_reader_fuzzer.cc).
//
// Thread-safety: plain values; not shared.
#ifndef INPROF_INTERNAL_PROTO_WIRE_H_
#define INPROF_INTERNAL_PROTO_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace inprof::internal {

enum class WireType : uint32_t {
  kVarint = 0,
  kFixed64 = 1,
  kLengthDelimited = 2,
  kFixed32 = 5,
};

// Appends fields to a byte string. Nested messages are written into their
// own ProtoWriter and added with Message(); packed repeated fields are
// collected with a PackedVarints and added with Packed().
class ProtoWriter {
 public:
  // Varint field; proto3 leaves zero out, so does this.
  void Varint(uint32_t field, uint64_t value) {
    if (value == 0) return;
    Tag(field, WireType::kVarint);
    RawVarint(value);
  }
  // Varint field written even when 0 (a copy of one read, which may be an
  // element of an unpacked repeated field).
  void VarintAlways(uint32_t field, uint64_t value) {
    Tag(field, WireType::kVarint);
    RawVarint(value);
  }
  // int64 (two's complement, ten bytes when negative), as protobuf does.
  void Int64(uint32_t field, int64_t value) {
    Varint(field, static_cast<uint64_t>(value));
  }
  void Bool(uint32_t field, bool value) { Varint(field, value ? 1 : 0); }
  // Length-delimited field written even when empty (pprof's string table
  // starts with "").
  void Bytes(uint32_t field, std::string_view bytes) {
    Tag(field, WireType::kLengthDelimited);
    RawVarint(bytes.size());
    out_.append(bytes);
  }
  void Message(uint32_t field, const ProtoWriter& message) {
    Bytes(field, message.out_);
  }
  void Packed(uint32_t field, const ProtoWriter& varints) {
    if (!varints.out_.empty()) Bytes(field, varints.out_);
  }
  // Without a tag: the elements of a packed field.
  void RawVarint(uint64_t value) {
    while (value >= 0x80) {
      out_.push_back(static_cast<char>((value & 0x7f) | 0x80));
      value >>= 7;
    }
    out_.push_back(static_cast<char>(value));
  }

  void Clear() { out_.clear(); }
  const std::string& bytes() const { return out_; }
  std::string& mutable_bytes() { return out_; }

 private:
  void Tag(uint32_t field, WireType type) {
    RawVarint((static_cast<uint64_t>(field) << 3) |
              static_cast<uint32_t>(type));
  }

  std::string out_;
};

// Reads fields from a byte string without copying. Every read is bounds
// checked; the first malformed byte makes ok() false and Next() return false,
// and error_offset() says where.
class ProtoReader {
 public:
  explicit ProtoReader(std::string_view bytes) : bytes_(bytes) {}

  // Moves to the next field; false at the end or on malformed input.
  bool Next() {
    if (!ok_ || pos_ == bytes_.size()) return false;
    uint64_t tag = 0;
    if (!ReadRawVarint(tag)) return false;
    field_ = static_cast<uint32_t>(tag >> 3);
    type_ = static_cast<uint32_t>(tag & 7);
    if (field_ == 0 || tag >> 32 != 0) return Fail();
    switch (type_) {
      case 0:
        return ReadRawVarint(varint_);
      case 1:
        return Take(8, payload_);
      case 2: {
        uint64_t n = 0;
        if (!ReadRawVarint(n)) return false;
        if (n > bytes_.size() - pos_) return Fail();
        return Take(static_cast<size_t>(n), payload_);
      }
      case 5:
        return Take(4, payload_);
      default:  // groups (3, 4) and reserved types: not in profile.proto
        return Fail();
    }
  }

  uint32_t field() const { return field_; }
  bool is_varint() const { return type_ == 0; }
  bool is_length_delimited() const { return type_ == 2; }
  // The current varint field's value (0 for other wire types).
  uint64_t varint() const { return type_ == 0 ? varint_ : 0; }
  // The current length-delimited field's bytes (empty for other types).
  std::string_view bytes() const {
    return type_ == 2 ? payload_ : std::string_view();
  }

  // A repeated varint field, packed or not: calls fn(value) for each
  // element; false (and !ok()) on a malformed packed run or a wire type that
  // is neither.
  template <typename Fn>
  bool RepeatedVarint(Fn&& fn) {
    if (type_ == 0) {
      fn(varint_);
      return true;
    }
    if (type_ != 2) return Fail();
    ProtoReader packed(payload_);
    while (packed.pos_ < packed.bytes_.size()) {
      uint64_t v = 0;
      if (!packed.ReadRawVarint(v)) {
        error_offset_ = pos_ - payload_.size() + packed.pos_;
        ok_ = false;
        return false;
      }
      fn(v);
    }
    return true;
  }

  bool ok() const { return ok_; }
  size_t error_offset() const { return error_offset_; }

 private:
  bool ReadRawVarint(uint64_t& value) {
    value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ == bytes_.size()) return Fail();
      const uint8_t b = static_cast<uint8_t>(bytes_[pos_++]);
      value |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return true;
    }
    return Fail();  // more than ten bytes
  }
  bool Take(size_t n, std::string_view& out) {
    if (n > bytes_.size() - pos_) return Fail();
    out = bytes_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  bool Fail() {
    if (ok_) error_offset_ = pos_;
    ok_ = false;
    return false;
  }

  std::string_view bytes_;
  size_t pos_ = 0;
  bool ok_ = true;
  size_t error_offset_ = 0;
  uint32_t field_ = 0;
  uint32_t type_ = 0;
  uint64_t varint_ = 0;
  std::string_view payload_;
};

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_PROTO_WIRE_H_
