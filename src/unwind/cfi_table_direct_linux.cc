// Pending tables that answer from .eh_frame (CfiModuleTable::
// PendingFromFile, internal/cfi_table.h): the file's segment holding
// .eh_frame_hdr is mapped, and a lookup finds the pc's FDE by the header's
// search table and runs its program up to the pc with the builder's own
// interpreter (cfi_interpreter.h), in a signal handler: no allocation, no
// locks, no syscalls.
#include "inprof/internal/cfi_table.h"

#include <dwarf.h>
#include <elf.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "inprof/base/byte_cursor.h"
#include "inprof/base/owned_fd.h"
#include "inprof/internal/cfi_walk.h"
#include "inprof/internal/dwarf_registers.h"
#include "inprof/base/elf_notes.h"
#include "src/unwind/cfi_interpreter.h"

namespace inprof::internal {

// --- Direct lookups in .eh_frame (pending tables) ----------------------------

struct CfiModuleTable::DirectIndex {
  void* mapping = nullptr;  // the whole file
  size_t mapping_size = 0;
  // The PT_LOAD segment holding .eh_frame_hdr, in the mapping, and where
  // it is linked: every FDE and CIE read must lie inside it.
  const uint8_t* segment = nullptr;
  uint64_t segment_vaddr = 0;
  uint64_t segment_size = 0;
  uint64_t hdr_vaddr = 0;
  // .eh_frame_hdr's search table: `count` (initial location, FDE) pairs of
  // sdata4 offsets from hdr_vaddr, sorted by initial location.
  const uint8_t* search_table = nullptr;
  uint64_t count = 0;

  // `size` bytes linked at `vaddr`, or null when they are not all in the
  // segment.
  const uint8_t* At(uint64_t vaddr, uint64_t size) const noexcept {
    if (vaddr < segment_vaddr) return nullptr;
    const uint64_t off = vaddr - segment_vaddr;
    if (off > segment_size || size > segment_size - off) return nullptr;
    return segment + off;
  }
};

void CfiModuleTable::DirectIndexDeleter::operator()(DirectIndex* d) const noexcept {
  if (d->mapping != nullptr) munmap(d->mapping, d->mapping_size);
  delete d;
}

namespace {

int32_t LoadI32(const uint8_t* p) noexcept {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
uint32_t LoadU32(const uint8_t* p) noexcept {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// A CIE of .eh_frame read by hand as CollectFdes (cfi_table_libdw.cc) reads
// it through libdw (dwarf_next_cfi + FdeEncoding): false where that would
// not run the own interpreter on its FDEs.
bool ParseCie(const uint8_t* cie, const uint8_t* end, CieInfo* info,
              uint8_t* fde_encoding, const uint8_t** insn,
              const uint8_t** insn_end) noexcept {
  if (end - cie < 9) return false;
  const uint32_t length = LoadU32(cie);
  // At least the CIE id and the version byte: a shorter length would put
  // the CIE's end before the augmentation string read below.
  if (length < 5 || length == 0xffffffff ||
      length > static_cast<uint64_t>(end - cie) - 4) {
    return false;
  }
  const uint8_t* const cie_end = cie + 4 + length;
  if (LoadU32(cie + 4) != 0) return false;  // not a CIE
  const uint8_t* p = cie + 8;
  const uint8_t version = *p++;
  if (version != 1 && version != 3 && version != 4) return false;
  const char* aug = reinterpret_cast<const char*>(p);
  while (p < cie_end && *p != '\0') ++p;
  if (p == cie_end) return false;
  ++p;
  if (version == 4) {
    if (cie_end - p < 2 || p[0] != 8 || p[1] != 0) return false;
    p += 2;
  }
  ByteCursor c{p, cie_end};
  uint64_t code = 0, data = 0, ra = 0;
  if (!CfiUleb(&c, &code) || !CfiSleb(&c, &data)) return false;
  if (version == 1) {
    if (!c.Fixed(1, &ra)) return false;
  } else if (!CfiUleb(&c, &ra)) {
    return false;
  }
  *fde_encoding = DW_EH_PE_absptr;
  info->signal_frame = false;
  info->sized_augmentation = aug[0] == 'z';
  if (aug[0] != '\0') {
    if (aug[0] != 'z') return false;
    uint64_t size = 0;
    if (!CfiUleb(&c, &size) || size > c.left()) return false;
    if (!ReadAugmentation(aug + 1, c.p, c.p + size, fde_encoding,
                          &info->signal_frame)) {
      return false;
    }
    c.p += size;
  }
  info->code_alignment = code;
  info->data_alignment = static_cast<int64_t>(data);
  info->ra_register = ra;
  *insn = c.p;
  *insn_end = cie_end;
  return true;
}

// A DWARF expression's operations as libdw decodes them, for the
// operations Evaluate (cfi_interpreter.cc) models (anything else: false). At
// most `max` ops.
bool DecodeExpression(const uint8_t* p, const uint8_t* end, CfiOp* ops,
                      size_t max, size_t* count) noexcept {
  ByteCursor c{p, end};
  size_t n = 0;
  while (c.p < c.end) {
    if (n == max) return false;
    CfiOp op;
    op.atom = *c.p++;
    const uint8_t a = op.atom;
    auto fixed = [&](size_t size, bool is_signed) {
      return ReadFixed(&c, size, is_signed, &op.number);
    };
    bool ok = true;
    if ((a >= DW_OP_lit0 && a <= DW_OP_lit31)) {
    } else if (a >= DW_OP_breg0 && a <= DW_OP_breg31) {
      ok = CfiSleb(&c, &op.number);
    } else {
      switch (a) {
        case DW_OP_bregx:
          ok = CfiUleb(&c, &op.number) && CfiSleb(&c, &op.number2);
          break;
        case DW_OP_const1u: ok = fixed(1, false); break;
        case DW_OP_const1s: ok = fixed(1, true); break;
        case DW_OP_const2u: ok = fixed(2, false); break;
        case DW_OP_const2s: ok = fixed(2, true); break;
        case DW_OP_const4u: ok = fixed(4, false); break;
        case DW_OP_const4s: ok = fixed(4, true); break;
        case DW_OP_const8u: ok = fixed(8, false); break;
        case DW_OP_const8s: ok = fixed(8, true); break;
        case DW_OP_constu:
        case DW_OP_plus_uconst:
          ok = CfiUleb(&c, &op.number);
          break;
        case DW_OP_consts: ok = CfiSleb(&c, &op.number); break;
        case DW_OP_dup: case DW_OP_drop: case DW_OP_over: case DW_OP_swap:
        case DW_OP_neg: case DW_OP_not: case DW_OP_and: case DW_OP_or:
        case DW_OP_xor: case DW_OP_plus: case DW_OP_minus: case DW_OP_mul:
        case DW_OP_shl: case DW_OP_shr: case DW_OP_shra: case DW_OP_eq:
        case DW_OP_ne: case DW_OP_ge: case DW_OP_gt: case DW_OP_le:
        case DW_OP_lt:
          break;
        default:
          return false;
      }
    }
    if (!ok) return false;
    ops[n++] = op;
  }
  *count = n;
  return true;
}

// The rule at `target` in the row [lo, hi) whose state is `state`, as the
// builder makes it: an expression CFA evaluated at the pc (AddPerByteRows).
CfiRule DirectRule(const FrameState& state, const CieInfo& cie, uint64_t target,
                   uint64_t lo, uint64_t hi) noexcept {
  if (state.cfa != FrameState::kCfaExpression) return ConvertState(state, cie);
  CfiRule unsupported;
  unsupported.kind = CfiRule::kUnsupported;
  if (hi - lo > kMaxPerByteRange) return unsupported;
  CfiOp ops[16];
  size_t n = 0;
  int64_t offset = 0;
  if (!DecodeExpression(state.cfa_expression,
                        state.cfa_expression + state.cfa_expression_size, ops,
                        std::size(ops), &n) ||
      !EvaluateCfaOffset(std::span<const CfiOp>(ops, n), target, &offset) ||
      !FitsInt32(offset)) {
    return unsupported;
  }
  FrameState sp_based = state;
  sp_based.cfa = FrameState::kCfaRegOffset;
  sp_based.cfa_register = kDwarfSp;
  sp_based.cfa_offset = static_cast<uint64_t>(offset);
  return ConvertState(sp_based, cie);
}

}  // namespace

uint64_t CfiModuleTable::FindWordDirect(uint64_t offset) const noexcept {
  CfiRule unsupported;
  unsupported.kind = CfiRule::kUnsupported;
  const uint64_t kUnsupportedWord = EncodeRule(unsupported);
  if (direct_ == nullptr || offset >= text_size_) return 0;
  const DirectIndex& d = *direct_;
  const uint64_t target = text_lo_ + offset;
  // The last entry whose initial location is at or below the target.
  size_t lo = 0, hi = d.count;
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    const uint64_t start =
        d.hdr_vaddr + static_cast<uint64_t>(int64_t{LoadI32(d.search_table + mid * 8)});
    if (start <= target) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  if (lo == 0) return 0;
  const uint64_t fde_vaddr =
      d.hdr_vaddr +
      static_cast<uint64_t>(int64_t{LoadI32(d.search_table + (lo - 1) * 8 + 4)});
  const uint8_t* fde = d.At(fde_vaddr, 8);
  if (fde == nullptr) return kUnsupportedWord;
  const uint32_t length = LoadU32(fde);
  if (length < 4 || length == 0xffffffff || d.At(fde_vaddr, 4 + uint64_t{length}) == nullptr) {
    return kUnsupportedWord;
  }
  const uint8_t* const fde_end = fde + 4 + length;
  const uint32_t cie_pointer = LoadU32(fde + 4);
  if (cie_pointer == 0 || cie_pointer > fde_vaddr + 4) return kUnsupportedWord;
  const uint64_t cie_vaddr = fde_vaddr + 4 - cie_pointer;
  const uint8_t* cie = d.At(cie_vaddr, 8);
  if (cie == nullptr) return kUnsupportedWord;
  CieInfo info;
  uint8_t encoding = 0;
  const uint8_t* cie_insn = nullptr;
  const uint8_t* cie_insn_end = nullptr;
  if (!ParseCie(cie, d.segment + d.segment_size, &info, &encoding, &cie_insn,
                &cie_insn_end)) {
    return kUnsupportedWord;
  }
  const uint8_t* p = fde + 8;
  uint64_t pc_begin = 0, range = 0;
  if (!ReadEncoded(encoding, &p, fde_end, fde_vaddr + 8, /*apply_relative=*/true,
                   &pc_begin) ||
      !ReadEncoded(encoding & 0x0f, &p, fde_end, 0, false, &range) ||
      range == 0 || pc_begin + range < pc_begin) {
    return kUnsupportedWord;
  }
  if (target < pc_begin || target >= pc_begin + range) return 0;  // a gap
  if (info.sized_augmentation) {
    ByteCursor c{p, fde_end};
    uint64_t size = 0;
    if (!CfiUleb(&c, &size) || !c.Skip(size)) return kUnsupportedWord;
    p = c.p;
  }
  FrameState cie_state;
  uint64_t loc = 0;
  if (!Execute(cie_insn, cie_insn_end, info, nullptr, &cie_state, &loc,
               [](uint64_t, uint64_t, const FrameState&) { return false; })) {
    return kUnsupportedWord;
  }
  FrameState fs = cie_state;
  loc = pc_begin;
  bool found = false;
  CfiRule rule;
  auto row = [&](uint64_t a, uint64_t b, const FrameState& state) {
    if (target >= a && target < b) {
      rule = DirectRule(state, info, target, a, b);
      found = true;
      return false;  // done
    }
    return target >= b;  // past the target: the program has no row for it
  };
  if (!Execute(p, fde_end, info, &cie_state, &fs, &loc, row,
               /*cfa_expressions=*/true)) {
    return found ? EncodeRule(rule) : kUnsupportedWord;
  }
  // The end of the program: the last state holds to the FDE's end.
  if (target < loc) return kUnsupportedWord;
  return EncodeRule(DirectRule(fs, info, target, loc, pc_begin + range));
}

uint64_t CfiModuleTable::FindDirectSlow(uint32_t key,
                                        std::atomic<uint64_t>* slot) const noexcept {
  g_cfi_state.direct_lookups.fetch_add(1, std::memory_order_relaxed);
  if (direct_lookups_.fetch_add(1, std::memory_order_relaxed) + 1 ==
      kDirectLookupsBeforeBuild) {
    MarkWanted();
  }
  const uint64_t w = FindWordDirect(key);
  const unsigned kind = RuleKind(w);
  if (Packable(w) && kind != CfiRule::kUnsupported) {
    slot->store(MakeSlot(key, 0, w), std::memory_order_relaxed);
  }
  return w;
}

std::shared_ptr<const CfiModuleTable> CfiModuleTable::PendingFromFile(
    uint64_t text_lo, uint64_t text_hi, std::string path,
    const std::string& open_path, const std::string& expected_build_id) {
  // The file is opened, read and closed in a descriptor table of inprof's
  // own (RunWithOwnDescriptors): never on a number of the program's.
  std::shared_ptr<const CfiModuleTable> result;
  RunWithOwnDescriptors([&] {
    result = [&]() -> std::shared_ptr<const CfiModuleTable> {
      auto table = std::make_shared<CfiModuleTable>(
          text_lo, text_hi, std::vector<CfiRow>(), std::move(path));
      table->pending_ = true;
      if (table->text_size_ == 0) return table;
      const int fd = open(open_path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) return table;
      struct FdCloser {
        int fd;
        ~FdCloser() { close(fd); }
      } closer{fd};
      // Headers and notes by pread: only the segment holding .eh_frame is
      // mapped, and only the pages lookups touch become resident.
      auto read_at = [&](void* out, uint64_t size, uint64_t offset) {
        return pread(fd, out, size, static_cast<off_t>(offset)) ==
               static_cast<ssize_t>(size);
      };
      Elf64_Ehdr ehdr;
      if (!read_at(&ehdr, sizeof(ehdr), 0) ||
          std::memcmp(ehdr.e_ident, ELFMAG, SELFMAG) != 0 ||
          ehdr.e_ident[EI_CLASS] != ELFCLASS64 || ehdr.e_ident[EI_DATA] != ELFDATA2LSB ||
          ehdr.e_machine != EM_X86_64 || ehdr.e_phentsize != sizeof(Elf64_Phdr) ||
          ehdr.e_phnum == 0 || ehdr.e_phnum > 256) {
        return table;
      }
      std::vector<Elf64_Phdr> phdrs(ehdr.e_phnum);
      if (!read_at(phdrs.data(), phdrs.size() * sizeof(Elf64_Phdr), ehdr.e_phoff)) {
        return table;
      }
      const Elf64_Phdr* eh = nullptr;
      std::string build_id;
      for (const Elf64_Phdr& ph : phdrs) {
        if (ph.p_type == PT_GNU_EH_FRAME) eh = &ph;
        if (ph.p_type == PT_NOTE && build_id.empty() && ph.p_filesz <= 4096) {
          std::vector<uint8_t> notes(ph.p_filesz);
          if (read_at(notes.data(), notes.size(), ph.p_offset)) {
            build_id = GnuBuildIdFromNotes(notes.data(), notes.size(), ph.p_align);
          }
        }
      }
      if (!expected_build_id.empty() && build_id != expected_build_id) return table;
      if (eh == nullptr) return table;
      struct stat st;
      if (fstat(fd, &st) != 0) return table;
      const auto file_size = static_cast<uint64_t>(st.st_size);
      std::unique_ptr<DirectIndex, DirectIndexDeleter> d(new DirectIndex);
      for (const Elf64_Phdr& ph : phdrs) {
        if (ph.p_type != PT_LOAD || eh->p_vaddr < ph.p_vaddr ||
            eh->p_vaddr - ph.p_vaddr >= ph.p_filesz || ph.p_offset > file_size ||
            ph.p_filesz > file_size - ph.p_offset ||
            ph.p_vaddr - ph.p_offset != eh->p_vaddr - eh->p_offset) {
          continue;
        }
        const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
        const uint64_t map_offset = ph.p_offset / page * page;
        const uint64_t map_size = ph.p_offset + ph.p_filesz - map_offset;
        void* mapping = mmap(nullptr, map_size, PROT_READ, MAP_PRIVATE, fd,
                             static_cast<off_t>(map_offset));
        if (mapping == MAP_FAILED) return table;
        // Lookups touch a few scattered pages: no fault-around or read-ahead
        // making the rest resident.
        madvise(mapping, map_size, MADV_RANDOM);
        d->mapping = mapping;
        d->mapping_size = map_size;
        d->segment = static_cast<const uint8_t*>(mapping) + (ph.p_offset - map_offset);
        d->segment_vaddr = ph.p_vaddr;
        d->segment_size = ph.p_filesz;
        break;
      }
      if (d->segment == nullptr) return table;
      // .eh_frame_hdr: version 1, the encodings of eh_frame_ptr, fde_count and
      // the table; the table must be datarel sdata4 (what GNU ld, gold, lld
      // and mold write) to be searched in place.
      // Read by pread too: a module no walk meets never has a page resident.
      d->hdr_vaddr = eh->p_vaddr;
      uint8_t hdr[32] = {};
      const uint64_t hdr_bytes = std::min<uint64_t>(sizeof(hdr), eh->p_filesz);
      if (hdr_bytes < 4 || !read_at(hdr, hdr_bytes, eh->p_offset) || hdr[0] != 1 ||
          hdr[3] != (DW_EH_PE_datarel | DW_EH_PE_sdata4)) {
        return table;
      }
      const uint8_t* p = hdr + 4;
      const uint8_t* const hdr_end = hdr + hdr_bytes;
      uint64_t eh_frame_ptr = 0, count = 0;
      if (!ReadEncoded(hdr[1], &p, hdr_end, d->hdr_vaddr + 4, true, &eh_frame_ptr) ||
          !ReadEncoded(hdr[2], &p, hdr_end, d->hdr_vaddr + static_cast<uint64_t>(p - hdr),
                       true, &count) ||
          count == 0) {
        return table;
      }
      const uint64_t table_vaddr = d->hdr_vaddr + static_cast<uint64_t>(p - hdr);
      if (count > d->segment_size / 8 || d->At(table_vaddr, count * 8) == nullptr) {
        return table;
      }
      d->search_table = d->At(table_vaddr, count * 8);
      d->count = count;
      table->direct_ = std::move(d);
      table->cache_bits_ = 8;
      table->cache_ = std::make_unique<std::atomic<uint64_t>[]>(size_t{1} << table->cache_bits_);
      table->cache_mask_ = (uint32_t{1} << table->cache_bits_) - 1;
      return table;
    }();
  });
  if (result == nullptr) {  // the read threw (no memory): an empty table
    result = std::make_shared<const CfiModuleTable>(
        text_lo, text_hi, std::vector<CfiRow>(), std::move(path));
  }
  return result;
}

}  // namespace inprof::internal
