// libFuzzer target: the GOT scan of the allocation hooks
// (internal::ScanGotSlots), which reads a loaded object's dynamic section,
// relocation tables, symbols and names from memory. A loaded object is
// trusted less than it seems (a packer's or a JIT's hand-made image, a
// library mapped by a custom loader), and every read is promised to be
// bounds-checked against the object's PT_LOAD segments.
//
// The input: 16 bytes of header, then the object's memory. The header
// places PT_DYNAMIC (offset, entry count), an optional PT_GNU_RELRO and an
// optional second PT_LOAD inside it; the memory is one PT_LOAD segment at
// vaddr 0, copied to an aligned buffer that the scan may read (the rest of
// the process's memory is out of bounds).
//
// Checked: nothing crashes or reads out of bounds (ASan), whatever the
// bytes; an error names the object; every slot found is an aligned 8-byte
// word inside the object's memory.
#include <elf.h>
#include <link.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "inprof/alloc/got_scan.h"

namespace {

uint16_t Read16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr size_t kHeader = 16;
  if (size < kHeader + sizeof(ElfW(Dyn))) return 0;
  const uint8_t* h = data;
  const size_t memory_size = size - kHeader;
  // The object's memory, 16-byte aligned as a loader maps it.
  std::vector<uint64_t> words((memory_size + 7) / 8 + 1, 0);
  auto* memory = reinterpret_cast<unsigned char*>(words.data());
  std::memcpy(memory, data + kHeader, memory_size);

  ElfW(Phdr) phdrs[4] = {};
  size_t phnum = 0;
  phdrs[phnum].p_type = PT_LOAD;
  phdrs[phnum].p_flags = PF_R | PF_W;
  phdrs[phnum].p_vaddr = 0;
  phdrs[phnum].p_memsz = memory_size;
  ++phnum;
  phdrs[phnum].p_type = PT_DYNAMIC;
  phdrs[phnum].p_vaddr = Read16(h) % memory_size;
  phdrs[phnum].p_memsz = static_cast<size_t>(Read16(h + 2)) * sizeof(ElfW(Dyn));
  ++phnum;
  if (h[4] & 1) {
    phdrs[phnum].p_type = PT_GNU_RELRO;
    phdrs[phnum].p_vaddr = Read16(h + 5) % memory_size;
    phdrs[phnum].p_memsz = Read16(h + 7);
    ++phnum;
  }
  if (h[4] & 2) {
    // A second segment that may overlap the first or reach past the
    // memory: the scan must keep to the mapped bytes it was told of.
    phdrs[phnum].p_type = PT_LOAD;
    phdrs[phnum].p_flags = h[9] & 7;
    phdrs[phnum].p_vaddr = Read16(h + 10) % memory_size;
    phdrs[phnum].p_memsz = std::min<size_t>(Read16(h + 12), memory_size - phdrs[phnum].p_vaddr);
    ++phnum;
  }
  inprof::internal::ObjectImage image{reinterpret_cast<uintptr_t>(memory), phdrs, phnum,
                                      "fuzz.so"};
  std::vector<inprof::internal::GotSlot> slots;
  const absl::Status s = inprof::internal::ScanGotSlots(image, &slots);
  if (!s.ok() && s.message().find("fuzz.so") == absl::string_view::npos) std::abort();
  const uintptr_t lo = reinterpret_cast<uintptr_t>(memory);
  for (const inprof::internal::GotSlot& slot : slots) {
    if (slot.address < lo || slot.address + 8 > lo + memory_size || slot.address % 8 != 0) {
      std::abort();
    }
    if (slot.symbol < 0 || slot.symbol >= inprof::internal::kAllocSymbolCount) std::abort();
  }
  return 0;
}
