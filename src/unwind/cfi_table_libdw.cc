// Builds CfiModuleTables (internal/cfi_table.h) from ELF call-frame
// information: the FDEs are enumerated with elfutils libdw's dwarf_next_cfi;
// each .eh_frame FDE's program is run once by the builder's own interpreter
// (below: "The own interpreter"), which yields every row in one pass. What
// it does not model goes to libdw: the row in force at each pc is asked of
// dwarf_cfi_addrframe, starting at the FDE's first pc and moving to the end
// of the row libdw reports (dwarf_frame_info). Each such call re-runs the
// FDE's program from its start, which made libdw alone cost 25 ms of CPU
// for a 600 KB executable. Runs off the hot path (the collector thread).
#include "inprof/internal/cfi_table.h"
#include "inprof/internal/dwarf_registers.h"
#include "inprof/internal/elf_notes.h"

#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwelf.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <gelf.h>
#include <libelf.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <span>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace inprof::internal {

CfiGlobalState g_cfi_state;

namespace {

// Bounds on the work one module may cause: a corrupt FDE claiming
// gigabytes must not turn into billions of probes.
constexpr size_t kMaxRowsPerModule = size_t{1} << 23;
// Expression CFAs are evaluated byte by byte (.plt: 16 bytes per entry);
// larger ranges are left unsupported.
constexpr uint64_t kMaxPerByteRange = 1 << 16;

// --- CFA expressions ---------------------------------------------------------

bool Evaluate(std::span<const CfiOp> ops, uint64_t sp, uint64_t pc,
              uint64_t* result) {
  uint64_t stack[16];
  size_t n = 0;
  auto push = [&](uint64_t v) {
    if (n == std::size(stack)) return false;
    stack[n++] = v;
    return true;
  };
  auto reg = [&](uint64_t r, uint64_t* v) {
    if (r == kDwarfSp) {
      *v = sp;
      return true;
    }
    if (r == kDwarfRa) {
      *v = pc;
      return true;
    }
    return false;
  };
  for (const CfiOp& op : ops) {
    const uint8_t a = op.atom;
    if (a >= DW_OP_lit0 && a <= DW_OP_lit31) {
      if (!push(a - DW_OP_lit0)) return false;
      continue;
    }
    if ((a >= DW_OP_breg0 && a <= DW_OP_breg31) || a == DW_OP_bregx) {
      const uint64_t r = a == DW_OP_bregx ? op.number : uint64_t{a} - DW_OP_breg0;
      const uint64_t offset = a == DW_OP_bregx ? op.number2 : op.number;
      uint64_t v = 0;
      if (!reg(r, &v) || !push(v + offset)) return false;
      continue;
    }
    switch (a) {
      case DW_OP_const1u:
      case DW_OP_const1s:
      case DW_OP_const2u:
      case DW_OP_const2s:
      case DW_OP_const4u:
      case DW_OP_const4s:
      case DW_OP_const8u:
      case DW_OP_const8s:
      case DW_OP_constu:
      case DW_OP_consts:
        if (!push(op.number)) return false;
        continue;
      case DW_OP_dup:
        if (n < 1 || !push(stack[n - 1])) return false;
        continue;
      case DW_OP_drop:
        if (n < 1) return false;
        --n;
        continue;
      case DW_OP_over:
        if (n < 2 || !push(stack[n - 2])) return false;
        continue;
      case DW_OP_swap:
        if (n < 2) return false;
        std::swap(stack[n - 1], stack[n - 2]);
        continue;
      case DW_OP_neg:
        if (n < 1) return false;
        stack[n - 1] = 0 - stack[n - 1];
        continue;
      case DW_OP_not:
        if (n < 1) return false;
        stack[n - 1] = ~stack[n - 1];
        continue;
      case DW_OP_plus_uconst:
        if (n < 1) return false;
        stack[n - 1] += op.number;
        continue;
      default:
        break;
    }
    // Binary operators: b is the top, a the one below.
    if (n < 2) return false;
    const uint64_t b = stack[n - 1];
    const uint64_t x = stack[n - 2];
    const auto sx = static_cast<int64_t>(x);
    const auto sb = static_cast<int64_t>(b);
    uint64_t r = 0;
    switch (a) {
      case DW_OP_and: r = x & b; break;
      case DW_OP_or: r = x | b; break;
      case DW_OP_xor: r = x ^ b; break;
      case DW_OP_plus: r = x + b; break;
      case DW_OP_minus: r = x - b; break;
      case DW_OP_mul: r = x * b; break;
      case DW_OP_shl: r = b >= 64 ? 0 : x << b; break;
      case DW_OP_shr: r = b >= 64 ? 0 : x >> b; break;
      case DW_OP_shra:
        r = static_cast<uint64_t>(sx >> (b >= 63 ? 63 : b));
        break;
      case DW_OP_eq: r = sx == sb; break;
      case DW_OP_ne: r = sx != sb; break;
      case DW_OP_ge: r = sx >= sb; break;
      case DW_OP_gt: r = sx > sb; break;
      case DW_OP_le: r = sx <= sb; break;
      case DW_OP_lt: r = sx < sb; break;
      default:
        return false;  // memory reads, branches, other registers
    }
    --n;
    stack[n - 1] = r;
  }
  if (n == 0) return false;
  *result = stack[n - 1];
  return true;
}

// --- Rules from libdw's frame state -------------------------------------------

std::vector<CfiOp> ToCfiOps(const Dwarf_Op* ops, size_t nops) {
  std::vector<CfiOp> out(nops);
  for (size_t i = 0; i < nops; ++i) {
    out[i] = {ops[i].atom, ops[i].number, ops[i].number2};
  }
  return out;
}

// Where ra and rbp may be saved relative to their base (rule words hold
// 12 bits; the largest seen is 168, in signal trampolines).
bool FitsRegisterOffset(int64_t v) {
  return v >= -kRuleWordMaxOffset - 1 && v <= kRuleWordMaxOffset;
}
bool FitsInt32(int64_t v) {
  return v >= std::numeric_limits<int32_t>::min() &&
         v <= std::numeric_limits<int32_t>::max();
}

// A register's saved location as libdw describes it: "CFA + N"
// ([call_frame_cfa] or [call_frame_cfa, plus_uconst N]) or, for a
// DW_CFA_expression evaluated on top of the CFA, "sp + N"
// ([call_frame_cfa, breg7 N]).
bool SavedAt(const Dwarf_Op* ops, size_t nops, int64_t* offset, bool* from_sp) {
  if (nops == 0 || ops[0].atom != DW_OP_call_frame_cfa) return false;
  if (nops == 1) {
    *offset = 0;
    *from_sp = false;
    return true;
  }
  if (nops != 2) return false;
  if (ops[1].atom == DW_OP_plus_uconst) {
    *offset = static_cast<int64_t>(ops[1].number);
    *from_sp = false;
    return true;
  }
  if (ops[1].atom == DW_OP_breg0 + kDwarfSp) {
    *offset = static_cast<int64_t>(ops[1].number);
    *from_sp = true;
    return true;
  }
  if (ops[1].atom == DW_OP_bregx && ops[1].number == kDwarfSp) {
    *offset = static_cast<int64_t>(ops[1].number2);
    *from_sp = true;
    return true;
  }
  return false;
}

// "breg N + offset" in either encoding.
bool RegisterPlusOffset(const Dwarf_Op& op, uint64_t* reg, int64_t* offset) {
  if (op.atom >= DW_OP_breg0 && op.atom <= DW_OP_breg31) {
    *reg = op.atom - DW_OP_breg0;
    *offset = static_cast<int64_t>(op.number);
    return true;
  }
  if (op.atom == DW_OP_bregx) {
    *reg = op.number;
    *offset = static_cast<int64_t>(op.number2);
    return true;
  }
  return false;
}

// The rule of one frame state. When the CFA is an expression that must be
// evaluated per pc, returns it in `cfa_expression` (rule.kind kCfaSp, offset
// to be filled in per pc).
CfiRule ConvertFrame(Dwarf_Frame* frame, std::vector<CfiOp>* cfa_expression) {
  cfa_expression->clear();
  CfiRule rule;
  bool signal = false;
  const int ra_column = dwarf_frame_info(frame, nullptr, nullptr, &signal);
  if (ra_column != static_cast<int>(kDwarfRa)) {
    rule.kind = CfiRule::kUnsupported;
    return rule;
  }
  if (signal) rule.flags |= CfiRule::kSignalFrame;

  // The return address.
  Dwarf_Op mem[3];
  Dwarf_Op* ops = nullptr;
  size_t nops = 0;
  if (dwarf_frame_register(frame, static_cast<int>(kDwarfRa), mem, &ops,
                           &nops) != 0) {
    rule.kind = CfiRule::kUnsupported;
    return rule;
  }
  if (nops == 0) {
    // Undefined (ops == mem): the outermost frame. Same-value makes no
    // sense for a return address.
    rule.kind = ops != nullptr ? CfiRule::kOutermost : CfiRule::kUnsupported;
    return rule;
  }
  int64_t offset = 0;
  bool from_sp = false;
  if (!SavedAt(ops, nops, &offset, &from_sp) || !FitsRegisterOffset(offset)) {
    rule.kind = CfiRule::kUnsupported;
    return rule;
  }
  rule.ra_offset = static_cast<int16_t>(offset);
  if (from_sp) rule.flags |= CfiRule::kRaFromSp;

  // The caller's rbp.
  if (dwarf_frame_register(frame, static_cast<int>(kDwarfFp), mem, &ops,
                           &nops) != 0) {
    rule.flags |= CfiRule::kFpLost;
  } else if (nops == 0) {
    if (ops != nullptr) rule.flags |= CfiRule::kFpLost;  // undefined
    // else same value: unchanged.
  } else if (SavedAt(ops, nops, &offset, &from_sp) && FitsRegisterOffset(offset)) {
    rule.flags |= CfiRule::kFpSaved;
    rule.fp_offset = static_cast<int16_t>(offset);
    if (from_sp) rule.flags |= CfiRule::kFpFromSp;
  } else {
    rule.flags |= CfiRule::kFpLost;  // in a register, or a value rule
  }

  // The CFA.
  if (dwarf_frame_cfa(frame, &ops, &nops) != 0 || nops == 0) {
    rule.kind = CfiRule::kUnsupported;
    return rule;
  }
  uint64_t reg = 0;
  if (nops == 1 && RegisterPlusOffset(ops[0], &reg, &offset) &&
      (reg == kDwarfSp || reg == kDwarfFp) && FitsInt32(offset)) {
    rule.kind = reg == kDwarfSp ? CfiRule::kCfaSp : CfiRule::kCfaFp;
    rule.cfa_offset = static_cast<int32_t>(offset);
    return rule;
  }
  if (nops == 2 && RegisterPlusOffset(ops[0], &reg, &offset) &&
      reg == kDwarfSp && ops[1].atom == DW_OP_deref && FitsInt32(offset)) {
    rule.kind = CfiRule::kCfaDerefSp;  // rt_sigreturn trampolines
    rule.cfa_offset = static_cast<int32_t>(offset);
    return rule;
  }
  *cfa_expression = ToCfiOps(ops, nops);
  rule.kind = CfiRule::kCfaSp;
  return rule;
}

// --- FDE enumeration -----------------------------------------------------------

struct Fde {
  uint64_t lo = 0;
  uint64_t hi = 0;
  bool debug_frame = false;
  // .eh_frame FDEs whose program the own interpreter may run: its CIE (an
  // index into State::cies) and its instructions, as offsets into the
  // section (stable across the re-opened files of a resumed build).
  bool own = false;
  uint32_t cie = 0;
  uint64_t insn_lo = 0;
  uint64_t insn_hi = 0;
};

// What the own interpreter needs of a CIE.
struct CieInfo {
  uint64_t insn_lo = 0;  // initial instructions, offsets into the section
  uint64_t insn_hi = 0;
  uint64_t code_alignment = 1;
  int64_t data_alignment = 1;
  uint64_t ra_register = 0;
  bool signal_frame = false;  // 'S'
  bool sized_augmentation = false;  // 'z': FDEs carry a sized block
};

}  // namespace

// An interrupted build (see CfiPartialBuild): which file and range, its
// sorted FDEs, and the rows built from the first `next_fde` of them.
struct CfiPartialBuild::State {
  std::string name;
  std::string build_id;
  uint64_t text_lo = 0;
  uint64_t text_hi = 0;
  std::vector<Fde> fdes;
  std::vector<CieInfo> cies;
  size_t eh_fdes = 0;
  size_t next_fde = 0;
  uint64_t covered_to = 0;
  bool any = false;
  std::vector<CfiRow> rows;
};

CfiPartialBuild::CfiPartialBuild() = default;
CfiPartialBuild::~CfiPartialBuild() = default;
size_t CfiPartialBuild::fdes_done() const {
  return state_ != nullptr ? state_->next_fde : 0;
}
size_t CfiPartialBuild::fdes_total() const {
  return state_ != nullptr ? state_->fdes.size() : 0;
}

namespace {

// Reads a DW_EH_PE-encoded pointer at *p; `field_address` is the address
// the field is loaded at (for pc-relative encodings).
bool ReadEncoded(uint8_t encoding, const uint8_t** p, const uint8_t* end,
                 uint64_t field_address, bool apply_relative, uint64_t* out) {
  if (encoding == DW_EH_PE_omit) return false;
  uint64_t value = 0;
  const uint8_t* q = *p;
  auto fixed = [&](size_t size, bool is_signed) {
    if (static_cast<size_t>(end - q) < size) return false;
    uint64_t v = 0;
    std::memcpy(&v, q, size);  // little-endian host and file (x86-64)
    if (is_signed && size < 8 && (v >> (8 * size - 1)) != 0) {
      v |= ~uint64_t{0} << (8 * size);
    }
    value = v;
    q += size;
    return true;
  };
  auto leb = [&](bool is_signed) {
    uint64_t v = 0;
    int shift = 0;
    uint8_t byte = 0;
    do {
      if (q == end || shift >= 64) return false;
      byte = *q++;
      v |= uint64_t{byte & 0x7fu} << shift;
      shift += 7;
    } while (byte & 0x80);
    if (is_signed && shift < 64 && (byte & 0x40)) v |= ~uint64_t{0} << shift;
    value = v;
    return true;
  };
  bool ok = false;
  switch (encoding & 0x0f) {
    case DW_EH_PE_absptr: ok = fixed(8, false); break;
    case DW_EH_PE_uleb128: ok = leb(false); break;
    case DW_EH_PE_udata2: ok = fixed(2, false); break;
    case DW_EH_PE_udata4: ok = fixed(4, false); break;
    case DW_EH_PE_udata8: ok = fixed(8, false); break;
    case DW_EH_PE_sleb128: ok = leb(true); break;
    case DW_EH_PE_sdata2: ok = fixed(2, true); break;
    case DW_EH_PE_sdata4: ok = fixed(4, true); break;
    case DW_EH_PE_sdata8: ok = fixed(8, true); break;
    default: return false;
  }
  if (!ok) return false;
  if (apply_relative) {
    switch (encoding & 0x70) {
      case DW_EH_PE_absptr: break;
      case DW_EH_PE_pcrel: value += field_address; break;
      default: return false;  // textrel/datarel/funcrel: not used for FDEs
    }
    if (encoding & DW_EH_PE_indirect) return false;
  }
  *p = q;
  *out = value;
  return true;
}

// The letters of a 'z' augmentation after the 'z', over its data: the FDE
// pointer encoding ('R') and whether frames are signal frames ('S'); false
// when the augmentation is not understood. Unknown letters after what we
// need are harmless; before 'R' they hide its position.
bool ReadAugmentation(const char* letters, const uint8_t* p,
                      const uint8_t* end, uint8_t* fde_encoding,
                      bool* signal_frame) noexcept {
  for (const char* c = letters; *c != '\0'; ++c) {
    switch (*c) {
      case 'R':
        if (p == end) return false;
        *fde_encoding = *p++;
        break;
      case 'P': {
        if (p == end) return false;
        const uint8_t personality_encoding = *p++;
        uint64_t ignored = 0;
        if (!ReadEncoded(personality_encoding & 0x0f, &p, end, 0, false,
                         &ignored)) {
          return false;
        }
        break;
      }
      case 'L':
        if (p == end) return false;
        ++p;
        break;
      case 'S':
        *signal_frame = true;
        break;
      case 'B':
      case 'G':
        break;
      default:
        return std::strchr(c, 'R') == nullptr;
    }
  }
  return true;
}

// The FDE pointer encoding a CIE announces ('R' in a 'z' augmentation);
// false when the augmentation is not understood.
bool FdeEncoding(const Dwarf_CIE& cie, bool eh_frame, uint8_t* encoding) {
  *encoding = DW_EH_PE_absptr;
  const char* aug = cie.augmentation;
  if (aug == nullptr || aug[0] == '\0') return true;
  if (aug[0] != 'z') return false;
  bool signal_frame = false;
  (void)eh_frame;
  return ReadAugmentation(aug + 1, cie.augmentation_data,
                          cie.augmentation_data + cie.augmentation_data_size,
                          encoding, &signal_frame);
}

Elf_Scn* FindSection(Elf* elf, const char* name, GElf_Shdr* shdr) {
  size_t shstrndx = 0;
  if (elf_getshdrstrndx(elf, &shstrndx) != 0) return nullptr;
  for (Elf_Scn* scn = elf_nextscn(elf, nullptr); scn != nullptr;
       scn = elf_nextscn(elf, scn)) {
    if (gelf_getshdr(scn, shdr) == nullptr) continue;
    const char* n = elf_strptr(elf, shstrndx, shdr->sh_name);
    if (n != nullptr && std::strcmp(n, name) == 0) return scn;
  }
  return nullptr;
}

// Appends the [lo, hi) ranges of the FDEs of one CFI section. `progress`
// gets a turn every 256 entries (a large library's section has tens of
// thousands, a pass over them takes 100 ms under a sanitizer, and the
// profiler drains its rings in that turn); the pass always completes, and
// false (stop) is remembered in *stop for the caller to act on.
// A CFI section's bytes (decompressed if need be), or null.
Elf_Data* SectionData(Elf* elf, const char* section, GElf_Shdr* shdr) {
  Elf_Scn* scn = FindSection(elf, section, shdr);
  if (scn == nullptr || shdr->sh_type == SHT_NOBITS) return nullptr;
  if ((shdr->sh_flags & SHF_COMPRESSED) != 0 && elf_compress(scn, 0, 0) < 0) {
    return nullptr;
  }
  Elf_Data* data = elf_getdata(scn, nullptr);
  if (data == nullptr || data->d_buf == nullptr || data->d_size == 0) {
    return nullptr;
  }
  return data;
}

// With `cies` (.eh_frame only), also what the own interpreter needs: each
// understood CIE, and each FDE's instructions.
void CollectFdes(Elf* elf, const char* section, bool eh_frame,
                 std::vector<Fde>* fdes, std::vector<CieInfo>* cies,
                 absl::FunctionRef<bool()> progress, bool* stop) {
  GElf_Shdr shdr;
  Elf_Data* data = SectionData(elf, section, &shdr);
  if (data == nullptr) return;
  const unsigned char* ident = reinterpret_cast<const unsigned char*>(
      elf_getident(elf, nullptr));
  if (ident == nullptr) return;
  const auto* base = static_cast<const uint8_t*>(data->d_buf);
  // CIE offset -> FDE pointer encoding (or none when not understood).
  absl::flat_hash_map<Dwarf_Off, int> encodings;
  // CIE offset -> its index in *cies.
  absl::flat_hash_map<Dwarf_Off, uint32_t> cie_index;
  std::vector<std::pair<Dwarf_Off, Dwarf_FDE>> pending;
  // An FDE takes 20-40 bytes of the section.
  pending.reserve(data->d_size / 24);
  fdes->reserve(fdes->size() + data->d_size / 24);
  Dwarf_Off offset = 0;
  size_t entries = 0;
  while (offset != static_cast<Dwarf_Off>(-1)) {
    if (++entries % 256 == 0 && !progress()) *stop = true;
    Dwarf_Off next = 0;
    Dwarf_CFI_Entry entry;
    const int rc = dwarf_next_cfi(ident, data, eh_frame, offset, &next, &entry);
    if (rc > 0) break;
    if (rc == 0) {
      if (dwarf_cfi_cie_p(&entry)) {
        uint8_t enc = 0;
        const bool understood = FdeEncoding(entry.cie, eh_frame, &enc);
        encodings[offset] = understood ? enc : -1;
        if (understood && cies != nullptr &&
            cies->size() < std::numeric_limits<uint32_t>::max()) {
          const Dwarf_CIE& c = entry.cie;
          CieInfo info;
          info.insn_lo = static_cast<uint64_t>(c.initial_instructions - base);
          info.insn_hi = static_cast<uint64_t>(c.initial_instructions_end - base);
          info.code_alignment = c.code_alignment_factor;
          info.data_alignment = c.data_alignment_factor;
          info.ra_register = c.return_address_register;
          // Understood means "" or a 'z' string (FdeEncoding), where libdw
          // reads every letter.
          info.sized_augmentation = c.augmentation[0] == 'z';
          info.signal_frame = info.sized_augmentation &&
                              std::strchr(c.augmentation, 'S') != nullptr;
          cie_index[offset] = static_cast<uint32_t>(cies->size());
          cies->push_back(info);
        }
      } else {
        pending.emplace_back(offset, entry.fde);
      }
    }
    if (next <= offset) break;  // no progress: corrupt section
    offset = next;
  }
  for (const auto& [at, fde] : pending) {
    if (++entries % 256 == 0 && !progress()) *stop = true;
    auto it = encodings.find(fde.CIE_pointer);
    if (it == encodings.end() || it->second < 0) continue;
    const auto enc = static_cast<uint8_t>(it->second);
    const uint8_t* p = fde.start;
    const uint64_t field = shdr.sh_addr + static_cast<uint64_t>(p - base);
    uint64_t lo = 0, range = 0;
    if (!ReadEncoded(enc, &p, fde.end, field, /*apply_relative=*/true, &lo) ||
        !ReadEncoded(enc & 0x0f, &p, fde.end, 0, false, &range) ||
        range == 0 || lo + range < lo) {
      continue;
    }
    Fde out;
    out.lo = lo;
    out.hi = lo + range;
    out.debug_frame = !eh_frame;
    auto c = cie_index.find(fde.CIE_pointer);
    if (c != cie_index.end()) {
      // The instructions follow the augmentation data, a sized block
      // with 'z' (an unsized one is never "understood").
      uint64_t size = 0;
      if (!(*cies)[c->second].sized_augmentation ||
          (ReadEncoded(DW_EH_PE_uleb128, &p, fde.end, 0, false, &size) &&
           size <= static_cast<uint64_t>(fde.end - p))) {
        p += size;
        out.own = true;
        out.cie = c->second;
        out.insn_lo = static_cast<uint64_t>(p - base);
        out.insn_hi = static_cast<uint64_t>(fde.end - base);
      }
    }
    fdes->push_back(out);
  }
}

// Appends rows, merging a row into the previous one when the rules match.
class RowSink {
 public:
  // `expected`: the rows to reserve room for (growing by doubling costs
  // copies and, for large tables, fresh pages every time).
  RowSink(uint64_t text_lo, size_t expected) : text_lo_(text_lo) {
    rows_.reserve(std::min(expected, kMaxRowsPerModule));
  }
  void Add(uint64_t pc, const CfiRule& rule) {
    const auto offset = static_cast<uint32_t>(pc - text_lo_);
    if (!rows_.empty() && rows_.back().pc == offset) {
      rows_.back().rule = rule;
      if (rows_.size() >= 2 && rows_[rows_.size() - 2].rule == rule) {
        rows_.pop_back();
      }
      return;
    }
    if (!rows_.empty() && rows_.back().rule == rule) return;
    rows_.push_back({offset, rule});
  }
  bool full() const { return rows_.size() >= kMaxRowsPerModule; }
  std::vector<CfiRow>& rows() { return rows_; }

 private:
  uint64_t text_lo_;
  std::vector<CfiRow> rows_;
};

// Adds the rows of [lo, hi) under one frame state whose CFA is `expression`.
void AddPerByteRows(std::span<const CfiOp> expression, const CfiRule& base,
                    uint64_t lo, uint64_t hi, RowSink* sink) {
  if (hi - lo > kMaxPerByteRange) {
    CfiRule unsupported;
    unsupported.kind = CfiRule::kUnsupported;
    sink->Add(lo, unsupported);
    return;
  }
  // Only where the rule changes (a .plt's rule changes twice per 16-byte
  // entry): a row per byte would cost the sink a comparison per byte.
  bool have_last = false;
  bool last_ok = false;
  int64_t last_offset = 0;
  for (uint64_t pc = lo; pc < hi; ++pc) {
    int64_t offset = 0;
    const bool ok = EvaluateCfaOffset(expression, pc, &offset) && FitsInt32(offset);
    if (have_last && ok == last_ok && (!ok || offset == last_offset)) continue;
    have_last = true;
    last_ok = ok;
    last_offset = offset;
    CfiRule rule = base;
    if (ok) {
      rule.cfa_offset = static_cast<int32_t>(offset);
    } else {
      rule = CfiRule();
      rule.kind = CfiRule::kUnsupported;
    }
    sink->Add(pc, rule);
  }
}

// --- The own interpreter ------------------------------------------------------
//
// One pass over an FDE's program gives every row: the state in force is
// tracked for the CFA and the two registers a rule needs (rbp and the
// return address), and each advance ends a row. It reproduces what libdw
// (0.188's execute_cfi, dwarf_frame_register, dwarf_frame_cfa) answers for
// each pc, and returns false, leaving the FDE to libdw, for whatever it
// does not model or where libdw would report an error.

// libdw keeps a register's rule value in a 61-bit signed field.
int64_t RuleValue(uint64_t v) { return static_cast<int64_t>(v << 3) >> 3; }

struct RegRule {
  enum Kind : uint8_t {
    kUnspecified,  // libdw's default on x86-64: undefined
    kUndefined,
    kSameValue,
    kOffset,     // saved at CFA + value
    kValOffset,  // is CFA + value
    kRegister,   // in another register
  };
  Kind kind = kUnspecified;
  int64_t value = 0;
};

struct FrameState {
  enum Cfa : uint8_t { kCfaUndefined, kCfaRegOffset, kCfaInvalid, kCfaExpression };
  Cfa cfa = kCfaUndefined;
  uint64_t cfa_register = 0;
  uint64_t cfa_offset = 0;  // as libdw keeps it: a Dwarf_Word
  // kCfaExpression (only where Execute was asked to keep expressions): the
  // DW_CFA_def_cfa_expression block in the section.
  const uint8_t* cfa_expression = nullptr;
  uint64_t cfa_expression_size = 0;
  // libdw's x86-64 ABI defaults: rbp and the return address same-value.
  RegRule fp{RegRule::kSameValue, 0};
  RegRule ra{RegRule::kSameValue, 0};
};

// libdw refuses register numbers from here on (enough_registers).
constexpr uint64_t kMaxDwarfRegister = INT32_MAX / 8;

// LEB128 within [*p, end), sign-extended if `is_signed`; values that need
// a tenth byte are refused (real CFI never has them; libdw's reading of
// them differs, and ReadEncoded, for the FDE headers, accepts them).
bool Leb(const uint8_t** p, const uint8_t* end, bool is_signed, uint64_t* out) {
  uint64_t v = 0;
  for (int shift = 0; shift < 63; shift += 7) {
    if (*p == end) return false;
    const uint8_t byte = *(*p)++;
    v |= uint64_t{byte & 0x7fu} << shift;
    if ((byte & 0x80) == 0) {
      if (is_signed && (byte & 0x40) != 0) v |= ~uint64_t{0} << (shift + 7);
      *out = v;
      return true;
    }
  }
  return false;
}
bool Uleb(const uint8_t** p, const uint8_t* end, uint64_t* out) {
  return Leb(p, end, false, out);
}
bool Sleb(const uint8_t** p, const uint8_t* end, uint64_t* out) {
  return Leb(p, end, true, out);
}

// Runs the program [p, end) on *fs. For a CIE's initial instructions
// `cie_state` is null (an advance or a restore there is an error, as in
// libdw). `row(lo, hi, state)` receives each row an advance ends.
// With `cfa_expressions`, DW_CFA_def_cfa_expression is kept in the state
// (kCfaExpression) instead of leaving the FDE to libdw.
template <typename RowFn>
bool Execute(const uint8_t* p, const uint8_t* end, const CieInfo& cie,
             const FrameState* cie_state, FrameState* fs, uint64_t* loc,
             RowFn&& row, bool cfa_expressions = false) {
  FrameState stack[16];  // DW_CFA_remember_state
  size_t depth = 0;
  auto set = [&](uint64_t reg, RegRule::Kind kind, uint64_t value) {
    if (reg >= kMaxDwarfRegister) return false;
    if (reg == kDwarfFp) fs->fp = {kind, RuleValue(value)};
    if (reg == kDwarfRa) fs->ra = {kind, RuleValue(value)};
    return true;
  };
  auto restore = [&](uint64_t reg) {
    if (cie_state == nullptr || reg >= kMaxDwarfRegister) return false;
    if (reg == kDwarfFp) fs->fp = cie_state->fp;
    if (reg == kDwarfRa) fs->ra = cie_state->ra;
    return true;
  };
  auto require_reg_offset = [&] {
    if (fs->cfa != FrameState::kCfaRegOffset) fs->cfa = FrameState::kCfaInvalid;
  };
  const uint64_t daf = static_cast<uint64_t>(cie.data_alignment);
  while (p < end) {
    const uint8_t op = *p++;
    uint64_t delta = 0, reg = 0, value = 0;
    switch (op & 0xc0) {
      case DW_CFA_advance_loc:
        delta = op & 0x3f;
        break;
      case DW_CFA_offset:
        if (!Uleb(&p, end, &value) || !set(op & 0x3f, RegRule::kOffset, value * daf)) {
          return false;
        }
        continue;
      case DW_CFA_restore:
        if (!restore(op & 0x3f)) return false;
        continue;
      default:
        switch (op) {
          case DW_CFA_nop:
            continue;
          case DW_CFA_advance_loc1:
          case DW_CFA_advance_loc2:
          case DW_CFA_advance_loc4: {
            const size_t size = op == DW_CFA_advance_loc1   ? 1
                                : op == DW_CFA_advance_loc2 ? 2
                                                            : 4;
            if (static_cast<size_t>(end - p) < size) return false;
            std::memcpy(&delta, p, size);  // little-endian (x86-64 only)
            p += size;
            break;
          }
          case DW_CFA_def_cfa:
            if (!Uleb(&p, end, &reg) || !Uleb(&p, end, &value)) return false;
            fs->cfa = FrameState::kCfaRegOffset;
            fs->cfa_register = reg;
            fs->cfa_offset = value;
            continue;
          case DW_CFA_def_cfa_sf:
            if (!Uleb(&p, end, &reg) || !Sleb(&p, end, &value)) return false;
            fs->cfa = FrameState::kCfaRegOffset;
            fs->cfa_register = reg;
            fs->cfa_offset = value * daf;
            continue;
          case DW_CFA_def_cfa_register:
            if (!Uleb(&p, end, &reg)) return false;
            require_reg_offset();
            fs->cfa_register = reg;
            continue;
          case DW_CFA_def_cfa_offset:
            if (!Uleb(&p, end, &value)) return false;
            require_reg_offset();
            fs->cfa_offset = value;
            continue;
          case DW_CFA_def_cfa_offset_sf:
            if (!Sleb(&p, end, &value)) return false;
            require_reg_offset();
            fs->cfa_offset = value * daf;
            continue;
          case DW_CFA_undefined:
            if (!Uleb(&p, end, &reg) || !set(reg, RegRule::kUndefined, 0)) return false;
            continue;
          case DW_CFA_same_value:
            if (!Uleb(&p, end, &reg) || !set(reg, RegRule::kSameValue, 0)) return false;
            continue;
          case DW_CFA_offset_extended:
          case DW_CFA_val_offset:
          case DW_CFA_offset_extended_sf:
          case DW_CFA_val_offset_sf: {
            // Factored offsets: unsigned, or signed in the _sf forms.
            const bool sf = op == DW_CFA_offset_extended_sf || op == DW_CFA_val_offset_sf;
            const bool val = op == DW_CFA_val_offset || op == DW_CFA_val_offset_sf;
            if (!Uleb(&p, end, &reg) || !Leb(&p, end, sf, &value) ||
                !set(reg, val ? RegRule::kValOffset : RegRule::kOffset, value * daf)) {
              return false;
            }
            continue;
          }
          case DW_CFA_GNU_negative_offset_extended:
            if (!Uleb(&p, end, &reg) || !Uleb(&p, end, &value) ||
                !set(reg, RegRule::kOffset, (0 - value) * daf)) {
              return false;
            }
            continue;
          case DW_CFA_register:
            if (!Uleb(&p, end, &reg) || !Uleb(&p, end, &value) ||
                !set(reg, RegRule::kRegister, value)) {
              return false;
            }
            continue;
          case DW_CFA_expression:
          case DW_CFA_val_expression:
            // Skipped for the registers a rule ignores; for rbp and the
            // return address, libdw decides.
            if (!Uleb(&p, end, &reg) || !Uleb(&p, end, &value) ||
                value > static_cast<uint64_t>(end - p) || reg >= kMaxDwarfRegister ||
                reg == kDwarfFp || reg == kDwarfRa) {
              return false;
            }
            p += value;
            continue;
          case DW_CFA_restore_extended:
            if (!Uleb(&p, end, &reg) || !restore(reg)) return false;
            continue;
          case DW_CFA_remember_state:
            if (depth == std::size(stack)) return false;
            stack[depth++] = *fs;
            continue;
          case DW_CFA_restore_state:
            if (depth == 0) return false;
            *fs = stack[--depth];
            continue;
          case DW_CFA_GNU_args_size:
            if (!Uleb(&p, end, &value)) return false;
            continue;
          case DW_CFA_def_cfa_expression:
            if (!cfa_expressions || !Uleb(&p, end, &value) ||
                value > static_cast<uint64_t>(end - p)) {
              return false;
            }
            fs->cfa = FrameState::kCfaExpression;
            fs->cfa_expression = p;
            fs->cfa_expression_size = value;
            p += value;
            continue;
          default:
            // DW_CFA_set_loc, DW_CFA_def_cfa_expression, DW_CFA_MIPS_advance_loc8,
            // DW_CFA_GNU_window_save, unknown opcodes: libdw's.
            return false;
        }
    }
    // An advance: the row in force so far ends.
    if (cie_state == nullptr) return false;
    const uint64_t next = *loc + delta * cie.code_alignment;
    if (next < *loc) return false;
    if (next != *loc && !row(*loc, next, *fs)) return false;
    *loc = next;
  }
  return true;
}

// ConvertFrame's answer for a state of the own interpreter: the same rule,
// built in the same order (a rule found unsupported keeps what was set
// before). Expressions never get here: the interpreter leaves them to libdw.
CfiRule ConvertState(const FrameState& fs, const CieInfo& cie) {
  CfiRule rule;
  if (cie.ra_register != kDwarfRa) {
    rule.kind = CfiRule::kUnsupported;
    return rule;
  }
  if (cie.signal_frame) rule.flags |= CfiRule::kSignalFrame;

  // The return address.
  switch (fs.ra.kind) {
    case RegRule::kUnspecified:
    case RegRule::kUndefined:
      rule.kind = CfiRule::kOutermost;
      return rule;
    case RegRule::kOffset:
      if (!FitsRegisterOffset(fs.ra.value)) {
        rule.kind = CfiRule::kUnsupported;
        return rule;
      }
      rule.ra_offset = static_cast<int16_t>(fs.ra.value);
      break;
    default:  // same value, a value or another register
      rule.kind = CfiRule::kUnsupported;
      return rule;
  }

  // The caller's rbp.
  switch (fs.fp.kind) {
    case RegRule::kSameValue:
      break;
    case RegRule::kOffset:
      if (FitsRegisterOffset(fs.fp.value)) {
        rule.flags |= CfiRule::kFpSaved;
        rule.fp_offset = static_cast<int16_t>(fs.fp.value);
      } else {
        rule.flags |= CfiRule::kFpLost;
      }
      break;
    default:
      rule.flags |= CfiRule::kFpLost;
      break;
  }

  // The CFA.
  if (fs.cfa != FrameState::kCfaRegOffset) {
    rule.kind = CfiRule::kUnsupported;
    return rule;
  }
  const auto offset = static_cast<int64_t>(fs.cfa_offset);
  if ((fs.cfa_register == kDwarfSp || fs.cfa_register == kDwarfFp) &&
      FitsInt32(offset)) {
    rule.kind = fs.cfa_register == kDwarfSp ? CfiRule::kCfaSp : CfiRule::kCfaFp;
    rule.cfa_offset = static_cast<int32_t>(offset);
    return rule;
  }
  // Another register, or an offset beyond 32 bits: libdw's answer is a
  // one-operation expression, which the per-pc evaluation refuses.
  return CfiRule{.kind = CfiRule::kUnsupported};
}

// The rows of one FDE within [lo, hi), into *rows; false leaves the FDE to
// libdw. `cie_state`: the state after the CIE's initial instructions.
bool InterpretFde(std::span<const uint8_t> section, const Fde& fde,
                  const CieInfo& cie, const FrameState& cie_state, uint64_t lo,
                  uint64_t hi, std::vector<CfiRow>* rows, uint64_t text_lo) {
  rows->clear();
  if (fde.insn_lo > fde.insn_hi || fde.insn_hi > section.size()) return false;
  FrameState fs = cie_state;
  uint64_t loc = fde.lo;
  auto row = [&](uint64_t a, uint64_t b, const FrameState& state) {
    const uint64_t from = std::max(a, lo);
    const uint64_t to = std::min(b, hi);
    if (from < to) {
      rows->push_back({static_cast<uint32_t>(from - text_lo), ConvertState(state, cie)});
    }
    return true;
  };
  if (!Execute(section.data() + fde.insn_lo, section.data() + fde.insn_hi, cie,
               &cie_state, &fs, &loc, row)) {
    return false;
  }
  // The end of the program: the last state holds to the FDE's end.
  row(loc, std::max(loc, fde.hi), fs);
  return true;
}

// The state after a CIE's initial instructions, from libdw's x86-64 ABI
// defaults; false when libdw would refuse them.
bool CieState(std::span<const uint8_t> section, const CieInfo& cie,
              FrameState* out) {
  if (cie.insn_lo > cie.insn_hi || cie.insn_hi > section.size()) return false;
  FrameState fs;
  uint64_t loc = 0;
  if (!Execute(section.data() + cie.insn_lo, section.data() + cie.insn_hi, cie,
               nullptr, &fs, &loc,
               [](uint64_t, uint64_t, const FrameState&) { return false; })) {
    return false;
  }
  *out = fs;
  return true;
}

absl::StatusOr<std::shared_ptr<const CfiModuleTable>> BuildFromElf(
    Elf* elf, const std::string& name, uint64_t text_lo, uint64_t text_hi,
    const std::string& expected_build_id, absl::FunctionRef<bool()> progress,
    CfiPartialBuild* partial, const CfiBuildOptions& options) {
  if (elf_kind(elf) != ELF_K_ELF) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": not an ELF file"));
  }
  if (gelf_getclass(elf) != ELFCLASS64) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": not ELF64"));
  }
  std::string build_id;
  const void* id = nullptr;
  const ssize_t id_size = dwelf_elf_gnu_build_id(elf, &id);
  if (id_size > 0) build_id.assign(static_cast<const char*>(id), id_size);
  if (!expected_build_id.empty() && build_id != expected_build_id) {
    return absl::FailedPreconditionError(absl::StrCat(
        name, ": the file's build-id differs from the loaded module's"));
  }
  if (text_hi <= text_lo || text_hi - text_lo > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": executable range empty or over 4 GiB"));
  }

  // Resume an interrupted build of the same file and range, or start one.
  std::unique_ptr<CfiPartialBuild::State> st;
  bool stop_requested = false;  // asked while collecting the FDEs
  if (partial != nullptr && partial->state_ != nullptr &&
      partial->state_->name == name && partial->state_->build_id == build_id &&
      partial->state_->text_lo == text_lo && partial->state_->text_hi == text_hi) {
    st = std::move(partial->state_);
  } else {
    if (partial != nullptr) partial->state_.reset();
    st = std::make_unique<CfiPartialBuild::State>();
    st->name = name;
    st->build_id = build_id;
    st->text_lo = text_lo;
    st->text_hi = text_hi;
    st->covered_to = text_lo;
    CollectFdes(elf, ".eh_frame", /*eh_frame=*/true, &st->fdes, &st->cies,
                progress, &stop_requested);
    st->eh_fdes = st->fdes.size();
    CollectFdes(elf, ".debug_frame", /*eh_frame=*/false, &st->fdes, nullptr,
                progress, &stop_requested);
    if (st->fdes.empty()) {
      return absl::NotFoundError(absl::StrCat(name, ": no call-frame information"));
    }
    // .eh_frame first at equal starts; .debug_frame only fills gaps.
    std::stable_sort(st->fdes.begin(), st->fdes.end(), [](const Fde& a, const Fde& b) {
      return a.lo != b.lo ? a.lo < b.lo : (!a.debug_frame && b.debug_frame);
    });
  }
  const std::vector<Fde>& fdes = st->fdes;
  const size_t eh_fdes = st->eh_fdes;

  Dwarf_CFI* eh_cfi = eh_fdes > 0 ? dwarf_getcfi_elf(elf) : nullptr;
  Dwarf* dwarf = nullptr;
  Dwarf_CFI* debug_cfi = nullptr;
  if (fdes.size() > eh_fdes) {
    dwarf = dwarf_begin_elf(elf, DWARF_C_READ, nullptr);
    if (dwarf != nullptr) debug_cfi = dwarf_getcfi(dwarf);
  }

  // The own interpreter: on x86-64 files (libdw's defaults for another
  // machine differ), for .eh_frame FDEs that overlap no other .eh_frame FDE
  // (libdw answers a pc from whichever FDE its search finds).
  GElf_Ehdr ehdr_mem;
  const GElf_Ehdr* ehdr = gelf_getehdr(elf, &ehdr_mem);
  std::span<const uint8_t> eh_section;
  if (options.interpreter == CfiInterpreter::kOwn && ehdr != nullptr &&
      ehdr->e_machine == EM_X86_64 && eh_cfi != nullptr) {
    GElf_Shdr shdr;
    if (Elf_Data* data = SectionData(elf, ".eh_frame", &shdr)) {
      eh_section = {static_cast<const uint8_t*>(data->d_buf), data->d_size};
    }
  }
  std::vector<bool> overlaps;
  if (!eh_section.empty()) {
    overlaps.assign(fdes.size(), false);
    uint64_t max_hi = 0;
    for (size_t i = 0; i < fdes.size(); ++i) {
      if (fdes[i].debug_frame) continue;
      if (fdes[i].lo < max_hi) overlaps[i] = true;
      max_hi = std::max(max_hi, fdes[i].hi);
    }
    uint64_t min_lo = std::numeric_limits<uint64_t>::max();
    for (size_t i = fdes.size(); i-- > 0;) {
      if (fdes[i].debug_frame) continue;
      if (fdes[i].hi > min_lo) overlaps[i] = true;
      min_lo = std::min(min_lo, fdes[i].lo);
    }
  }
  // Each CIE's initial state, computed when first needed (0: not yet,
  // 1: usable, 2: left to libdw).
  std::vector<uint8_t> cie_status(st->cies.size(), 0);
  std::vector<FrameState> cie_states(st->cies.size());
  std::vector<CfiRow> own_rows;

  // Compilers' FDEs average 6-8 rows (libc 7.6, libstdc++ 7.5).
  RowSink sink(text_lo, fdes.size() * 8);
  if (!st->rows.empty()) sink.rows() = std::move(st->rows);
  std::vector<CfiOp> expression;
  uint64_t covered_to = st->covered_to;  // end of the last FDE processed
  bool any = st->any;
  bool cancelled = false;
  size_t fde_count = 0;
  size_t next = st->next_fde;
  for (; next < fdes.size(); ++next) {
    if (stop_requested || (++fde_count % 64 == 0 && !progress())) {
      cancelled = true;
      break;
    }
    const Fde& fde = fdes[next];
    Dwarf_CFI* cfi = fde.debug_frame ? debug_cfi : eh_cfi;
    const uint64_t lo = std::max({fde.lo, covered_to, text_lo});
    const uint64_t hi = std::min(fde.hi, text_hi);
    if (cfi == nullptr || lo >= hi) continue;
    if (sink.full()) break;
    if (any && lo > covered_to) sink.Add(covered_to, CfiRule());  // a gap
    if (fde.own && !eh_section.empty() && !overlaps[next] &&
        fde.cie < st->cies.size()) {
      const CieInfo& cie = st->cies[fde.cie];
      uint8_t& status = cie_status[fde.cie];
      if (status == 0) status = CieState(eh_section, cie, &cie_states[fde.cie]) ? 1 : 2;
      if (status == 1 && InterpretFde(eh_section, fde, cie, cie_states[fde.cie],
                                      lo, hi, &own_rows, text_lo)) {
        for (const CfiRow& row : own_rows) {
          if (sink.full()) break;
          sink.Add(row.pc + text_lo, row.rule);
        }
        if (options.fdes_own != nullptr) ++*options.fdes_own;
        covered_to = hi;
        any = true;
        continue;
      }
    }
    if (options.fdes_libdw != nullptr) ++*options.fdes_libdw;
    uint64_t pc = lo;
    while (pc < hi && !sink.full()) {
      Dwarf_Frame* frame = nullptr;
      if (dwarf_cfi_addrframe(cfi, pc, &frame) != 0) {
        CfiRule unsupported;
        unsupported.kind = CfiRule::kUnsupported;
        sink.Add(pc, unsupported);
        break;
      }
      Dwarf_Addr start = 0, end = 0;
      dwarf_frame_info(frame, &start, &end, nullptr);
      // libdw reports the row's range; after DW_CFA_restore_state its start
      // can lie before pc, so only its end is used.
      uint64_t next = end > pc ? std::min<uint64_t>(end, hi) : pc + 1;
      const CfiRule rule = ConvertFrame(frame, &expression);
      if (expression.empty()) {
        sink.Add(pc, rule);
      } else {
        AddPerByteRows(expression, rule, pc, next, &sink);
      }
      free(frame);
      pc = next;
    }
    covered_to = hi;
    any = true;
  }
  if (eh_cfi != nullptr) dwarf_cfi_end(eh_cfi);
  if (dwarf != nullptr) dwarf_end(dwarf);
  if (cancelled) {
    if (partial != nullptr) {  // kept: the next build resumes at `next`
      st->rows = std::move(sink.rows());
      st->covered_to = covered_to;
      st->any = any;
      st->next_fde = next;
      partial->state_ = std::move(st);
    }
    return absl::CancelledError(absl::StrCat(name, ": table build abandoned"));
  }
  if (any) sink.Add(covered_to, CfiRule());
  if (!any) {
    return absl::NotFoundError(
        absl::StrCat(name, ": no call-frame information for its text"));
  }
  return std::make_shared<const CfiModuleTable>(text_lo, text_hi, sink.rows(),
                                                name, std::move(build_id));
}

}  // namespace

bool EvaluateCfaOffset(std::span<const CfiOp> ops, uint64_t pc,
                       int64_t* offset) {
  // Evaluated at three stack pointers: the result must move with sp one
  // for one (sp + a constant), or the expression is not modelled.
  constexpr uint64_t kSps[] = {0, uint64_t{1} << 32, 0x7ffd12345670};
  uint64_t results[3];
  for (size_t i = 0; i < 3; ++i) {
    if (!Evaluate(ops, kSps[i], pc, &results[i])) return false;
  }
  for (size_t i = 1; i < 3; ++i) {
    if (results[i] - kSps[i] != results[0]) return false;
  }
  *offset = static_cast<int64_t>(results[0]);
  return true;
}

// --- Direct lookups in .eh_frame (pending tables) -----------------------------

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

// A CIE of .eh_frame read by hand as CollectFdes reads it through libdw
// (dwarf_next_cfi + FdeEncoding): false where that would not run the own
// interpreter on its FDEs.
bool ParseCie(const uint8_t* cie, const uint8_t* end, CieInfo* info,
              uint8_t* fde_encoding, const uint8_t** insn,
              const uint8_t** insn_end) noexcept {
  if (end - cie < 9) return false;
  const uint32_t length = LoadU32(cie);
  if (length == 0 || length == 0xffffffff ||
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
  uint64_t code = 0, data = 0, ra = 0;
  if (!Uleb(&p, cie_end, &code) || !Sleb(&p, cie_end, &data)) return false;
  if (version == 1) {
    if (p == cie_end) return false;
    ra = *p++;
  } else if (!Uleb(&p, cie_end, &ra)) {
    return false;
  }
  *fde_encoding = DW_EH_PE_absptr;
  info->signal_frame = false;
  info->sized_augmentation = aug[0] == 'z';
  if (aug[0] != '\0') {
    if (aug[0] != 'z') return false;
    uint64_t size = 0;
    if (!Uleb(&p, cie_end, &size) || size > static_cast<uint64_t>(cie_end - p)) {
      return false;
    }
    const uint8_t* const a_end = p + size;
    if (!ReadAugmentation(aug + 1, p, a_end, fde_encoding,
                          &info->signal_frame)) {
      return false;
    }
    p = a_end;
  }
  info->code_alignment = code;
  info->data_alignment = static_cast<int64_t>(data);
  info->ra_register = ra;
  *insn = p;
  *insn_end = cie_end;
  return true;
}

// A DWARF expression's operations as libdw decodes them, for the
// operations Evaluate models (anything else: false). At most `max` ops.
bool DecodeExpression(const uint8_t* p, const uint8_t* end, CfiOp* ops,
                      size_t max, size_t* count) noexcept {
  size_t n = 0;
  while (p < end) {
    if (n == max) return false;
    CfiOp op;
    op.atom = *p++;
    const uint8_t a = op.atom;
    auto fixed = [&](size_t size, bool is_signed) {
      if (static_cast<size_t>(end - p) < size) return false;
      uint64_t v = 0;
      std::memcpy(&v, p, size);
      if (is_signed && size < 8 && (v >> (8 * size - 1)) != 0) {
        v |= ~uint64_t{0} << (8 * size);
      }
      op.number = v;
      p += size;
      return true;
    };
    bool ok = true;
    if ((a >= DW_OP_lit0 && a <= DW_OP_lit31)) {
    } else if (a >= DW_OP_breg0 && a <= DW_OP_breg31) {
      ok = Sleb(&p, end, &op.number);
    } else {
      switch (a) {
        case DW_OP_bregx:
          ok = Uleb(&p, end, &op.number) && Sleb(&p, end, &op.number2);
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
          ok = Uleb(&p, end, &op.number);
          break;
        case DW_OP_consts: ok = Sleb(&p, end, &op.number); break;
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
    uint64_t size = 0;
    if (!Uleb(&p, fde_end, &size) || size > static_cast<uint64_t>(fde_end - p)) {
      return kUnsupportedWord;
    }
    p += size;
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
}

CfiModuleTable::~CfiModuleTable() = default;

std::shared_ptr<const CfiModuleTable> CfiModuleTable::Pending(
    uint64_t text_lo, uint64_t text_hi, std::string path) {
  auto table = std::make_shared<CfiModuleTable>(
      text_lo, text_hi, std::vector<CfiRow>(), std::move(path));
  table->pending_ = true;
  return table;
}

CfiModuleTable::CfiModuleTable(uint64_t text_lo, uint64_t text_hi,
                               const std::vector<CfiRow>& rows,
                               std::string path, std::string build_id)
    : text_lo_(text_lo),
      text_size_(text_hi > text_lo ? text_hi - text_lo : 0),
      path_(std::move(path)),
      build_id_(std::move(build_id)) {
  if (text_size_ > std::numeric_limits<uint32_t>::max()) text_size_ = 0;
  absl::flat_hash_map<uint64_t, uint16_t> index;
  rules_.push_back(0);  // [0]: kNone
  index[0] = 0;
  CfiRule unsupported_rule;
  unsupported_rule.kind = CfiRule::kUnsupported;
  const uint64_t unsupported = EncodeRule(unsupported_rule);
  rules_.push_back(unsupported);  // [1]: the overflow rule
  index[unsupported] = 1;
  auto rule_index = [&](const CfiRule& rule) -> uint16_t {
    const uint64_t word = EncodeRule(rule);
    auto it = index.find(word);
    if (it != index.end()) return it->second;
    if (rules_.size() > std::numeric_limits<uint16_t>::max()) return 1;
    const auto i = static_cast<uint16_t>(rules_.size());
    rules_.push_back(word);
    index[word] = i;
    return i;
  };
  // A leading kNone row at 0, so every offset has a row in force.
  row_pc_.reserve(rows.size() + 1);
  row_rule_.reserve(rows.size() + 1);
  row_pc_.push_back(0);
  row_rule_.push_back(0);
  bool any = false;
  for (const CfiRow& row : rows) {
    if (row.pc >= text_size_) continue;
    if (row.rule.kind != CfiRule::kNone) any = true;
    const uint16_t r = rule_index(row.rule);
    if (!row_pc_.empty() && row_pc_.back() > row.pc) continue;  // unsorted
    if (!row_pc_.empty() && row_pc_.back() == row.pc) {
      row_rule_.back() = r;  // the last of equal pcs wins
      if (row_rule_.size() >= 2 && row_rule_[row_rule_.size() - 2] == r) {
        row_pc_.pop_back();
        row_rule_.pop_back();
      }
      continue;
    }
    if (!row_rule_.empty() && row_rule_.back() == r) continue;
    row_pc_.push_back(row.pc);
    row_rule_.push_back(r);
  }
  if (!any) {
    row_pc_.clear();
    row_rule_.clear();
  }
  // Rows merge rarely here (the builder merged them): keep the reserved
  // room unless a quarter of it is unused.
  if (row_pc_.size() < row_pc_.capacity() / 4 * 3) {
    row_pc_.shrink_to_fit();
    row_rule_.shrink_to_fit();
  }
  rules_.shrink_to_fit();
  if (row_pc_.empty()) return;
  while (cache_bits_ < 12 && (size_t{1} << cache_bits_) * 4 < row_pc_.size()) {
    ++cache_bits_;
  }
  cache_ = std::make_unique<std::atomic<uint64_t>[]>(size_t{1} << cache_bits_);
  cache_mask_ = (uint32_t{1} << cache_bits_) - 1;
  const size_t buckets = static_cast<size_t>((text_size_ - 1) >> kBucketShift) + 1;
  bucket_row_.resize(buckets);
  size_t row = 0;
  for (size_t b = 0; b < buckets; ++b) {
    const uint64_t start = uint64_t{b} << kBucketShift;
    while (row + 1 < row_pc_.size() && row_pc_[row + 1] <= start) ++row;
    bucket_row_[b] = static_cast<uint32_t>(row);
  }
}

size_t CfiModuleTable::MemoryBytes() const {
  return sizeof(*this) + row_pc_.capacity() * sizeof(uint32_t) +
         row_rule_.capacity() * sizeof(uint16_t) +
         rules_.capacity() * sizeof(uint64_t) +
         bucket_row_.capacity() * sizeof(uint32_t) +
         (cache_ != nullptr ? (size_t{1} << cache_bits_) * sizeof(uint64_t) : 0) +
         path_.capacity() +
         build_id_.capacity();
}

std::vector<CfiRow> CfiModuleTable::Rows() const {
  std::vector<CfiRow> rows(row_pc_.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    rows[i] = {row_pc_[i], DecodeRule(rules_[row_rule_[i]])};
  }
  return rows;
}

CfiSnapshot::CfiSnapshot(
    std::vector<std::pair<uintptr_t, std::shared_ptr<const CfiModuleTable>>>
        modules,
    uint64_t generation)
    : generation_(generation) {
  std::sort(modules.begin(), modules.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [lo, table] : modules) {
    if (table == nullptr) continue;
    const uintptr_t hi = lo + (table->text_hi() - table->text_lo());
    if (!modules_.empty() && lo < modules_.back().hi) continue;  // overlap
    modules_.push_back({lo, hi, table.get()});
    owned_.push_back(std::move(table));
  }
}

absl::StatusOr<std::shared_ptr<const CfiModuleTable>> BuildCfiTableFromFile(
    const std::string& path, uint64_t text_lo, uint64_t text_hi,
    const std::string& expected_build_id, absl::FunctionRef<bool()> progress,
    CfiPartialBuild* partial, const CfiBuildOptions& options) {
  elf_version(EV_CURRENT);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  Elf* elf = elf_begin(fd, ELF_C_READ_MMAP, nullptr);
  if (elf == nullptr) {
    close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", elf_errmsg(-1)));
  }
  auto table =
      BuildFromElf(elf, path, text_lo, text_hi, expected_build_id, progress,
                   partial, options);
  elf_end(elf);
  close(fd);
  return table;
}

absl::StatusOr<std::shared_ptr<const CfiModuleTable>> BuildCfiTableFromImage(
    std::span<const uint8_t> image, const std::string& name, uint64_t text_lo,
    uint64_t text_hi, absl::FunctionRef<bool()> progress,
    CfiPartialBuild* partial, const CfiBuildOptions& options) {
  elf_version(EV_CURRENT);
  // libelf may write to the buffer it reads from: give it a copy.
  std::vector<char> copy(image.begin(), image.end());
  Elf* elf = elf_memory(copy.data(), copy.size());
  if (elf == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", elf_errmsg(-1)));
  }
  auto table =
      BuildFromElf(elf, name, text_lo, text_hi, "", progress, partial, options);
  elf_end(elf);
  return table;
}

}  // namespace inprof::internal
