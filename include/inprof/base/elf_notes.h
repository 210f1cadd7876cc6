// internal: not part of the public API.
//
// The GNU build-id in a block of ELF notes (a PT_NOTE segment or a note
// section): one bounds-checked parser for the CFI tables (which check a
// file against the module loaded) and the symbolizer (which names the
// module in the profile), for both alignments the gABI allows.
//
// Thread-safety: a pure function.
//
// Example:
//   std::string id = internal::GnuBuildIdFromNotes(notes, ph.p_filesz, ph.p_align);
#ifndef INPROF_BASE_ELF_NOTES_H_
#define INPROF_BASE_ELF_NOTES_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace inprof::internal {

// The raw bytes of the NT_GNU_BUILD_ID note in [notes, notes + size), laid
// out with `align` (the segment's p_align: 8, else 4), or "" when there is
// none or the block is malformed. Never reads outside the block.
inline std::string GnuBuildIdFromNotes(const uint8_t* notes, size_t size,
                                       uint64_t align = 4) {
  constexpr uint32_t kNtGnuBuildId = 3;
  constexpr size_t kHeaderBytes = 12;  // n_namesz, n_descsz, n_type
  // The descriptor and the next note start at offsets aligned within the
  // block (which starts aligned): 16 bytes in for an 8-aligned note named
  // "GNU", not 12 + 8.
  const size_t a = align == 8 ? 8 : 4;
  auto aligned = [a](size_t offset) { return (offset + a - 1) & ~(a - 1); };
  size_t at = 0;
  // `at` may pass `size` by the last note's padding: checked first.
  while (at <= size && size - at >= kHeaderBytes) {
    uint32_t namesz, descsz, type;
    std::memcpy(&namesz, notes + at, 4);
    std::memcpy(&descsz, notes + at + 4, 4);
    std::memcpy(&type, notes + at + 8, 4);
    const size_t name_at = at + kHeaderBytes;
    if (namesz > size - name_at) break;
    const size_t desc_at = aligned(name_at + namesz);
    if (desc_at > size || descsz > size - desc_at) break;
    if (type == kNtGnuBuildId && namesz == 4 &&
        std::memcmp(notes + name_at, "GNU", 4) == 0 && descsz > 0) {
      return std::string(reinterpret_cast<const char*>(notes + desc_at), descsz);
    }
    at = aligned(desc_at + descsz);
  }
  return "";
}

}  // namespace inprof::internal

#endif  // INPROF_BASE_ELF_NOTES_H_
