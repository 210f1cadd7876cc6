// internal: not part of the public API.
//
// A bounds-checked little-endian reader over [p, end), for the DWARF the
// symbolizers read themselves (line_table.cc; on Windows also the units'
// headers and PE files, symbolizer_dbghelp_windows.cc) and the call-frame
// information the CFI table builder interprets itself
// (src/unwind/cfi_interpreter.h). Every read checks the bounds and returns
// false instead of reading past them.
//
// Thread-safety: a plain value.
//
// Example:
//   internal::ByteCursor c{data.data(), data.data() + data.size()};
//   uint64_t length;
//   if (!c.Fixed(4, &length) || !c.Skip(length)) return Invalid("truncated");
#ifndef INPROF_BASE_BYTE_CURSOR_H_
#define INPROF_BASE_BYTE_CURSOR_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

namespace inprof::internal {

struct ByteCursor {
  const uint8_t* p;
  const uint8_t* end;

  // 0 for a cursor whose start is past its end (a length field that lied):
  // every read then fails instead of taking end - p as a huge count.
  size_t left() const { return p < end ? static_cast<size_t>(end - p) : 0; }

  bool Skip(uint64_t n) {
    if (n > left()) return false;
    p += n;
    return true;
  }

  // An unsigned integer of `n` bytes (at most 8).
  bool Fixed(size_t n, uint64_t* out) {
    if (n > 8 || left() < n) return false;
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= uint64_t{p[i]} << (8 * i);
    p += n;
    *out = v;
    return true;
  }

  // LEB128 as libdw reads it: at most 10 bytes give bits, more are skipped.
  bool Uleb(uint64_t* out) {
    uint64_t v = 0;
    unsigned shift = 0;
    while (true) {
      if (p >= end) return false;
      const uint8_t b = *p++;
      if (shift < 64) v |= uint64_t{b & 0x7fu} << shift;
      shift += 7;
      if ((b & 0x80) == 0) break;
    }
    *out = v;
    return true;
  }
  bool SkipLeb() {
    uint64_t ignored;
    return Uleb(&ignored);
  }
  bool Sleb(int64_t* out) {
    uint64_t v = 0;
    unsigned shift = 0;
    uint8_t b = 0;
    while (true) {
      if (p >= end) return false;
      b = *p++;
      if (shift < 64) v |= uint64_t{b & 0x7fu} << shift;
      shift += 7;
      if ((b & 0x80) == 0) break;
    }
    if (shift < 64 && (b & 0x40) != 0) v |= ~uint64_t{0} << shift;
    *out = static_cast<int64_t>(v);
    return true;
  }

  // A NUL-terminated string in place, the cursor moved past its NUL.
  bool CString(const char** out) {
    const void* nul = std::memchr(p, '\0', left());
    if (nul == nullptr) return false;
    *out = reinterpret_cast<const char*>(p);
    p = static_cast<const uint8_t*>(nul) + 1;
    return true;
  }
};

// The NUL-terminated string at `offset` in `section`, or null.
inline const char* StringAt(std::span<const uint8_t> section, uint64_t offset) {
  if (offset >= section.size()) return nullptr;
  const void* nul = std::memchr(section.data() + offset, '\0', section.size() - offset);
  return nul != nullptr ? reinterpret_cast<const char*>(section.data() + offset) : nullptr;
}

}  // namespace inprof::internal

#endif  // INPROF_BASE_BYTE_CURSOR_H_
