// Builds CfiModuleTables (internal/cfi_table.h) from ELF call-frame
// information: the FDEs are enumerated with elfutils libdw's dwarf_next_cfi;
// each .eh_frame FDE's program is run once by the builder's own interpreter
// (cfi_interpreter.h), which yields every row in one pass. What
// it does not model goes to libdw: the row in force at each pc is asked of
// dwarf_cfi_addrframe, starting at the FDE's first pc and moving to the end
// of the row libdw reports (dwarf_frame_info). Each such call re-runs the
// FDE's program from its start, which made libdw alone cost 25 ms of CPU
// for a 600 KB executable. Runs off the hot path (the collector thread).
#include "inprof/base/growth_safe_table.h"
#include "inprof/internal/cfi_table.h"
#include "inprof/internal/dwarf_registers.h"
#include "src/unwind/cfi_interpreter.h"

#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwelf.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <span>
#include <utility>

#include "inprof/base/owned_fd.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace inprof::internal {

namespace {

// Bounds on the work one module may cause: a corrupt FDE claiming
// gigabytes must not turn into billions of probes.
constexpr size_t kMaxRowsPerModule = size_t{1} << 23;

// --- Rules from libdw's frame state -------------------------------------------

std::vector<CfiOp> ToCfiOps(const Dwarf_Op* ops, size_t nops) {
  std::vector<CfiOp> out(nops);
  for (size_t i = 0; i < nops; ++i) {
    out[i] = {ops[i].atom, ops[i].number, ops[i].number2};
  }
  return out;
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

// Appends the [lo, hi) ranges of the FDEs of one CFI section. `progress`
// gets a turn every 256 entries (a large library's section has tens of
// thousands, a pass over them takes 100 ms under a sanitizer, and the
// profiler drains its rings in that turn); the pass always completes, and
// false (stop) is remembered in *stop for the caller to act on.
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
  internal::ThrowSafeMap<Dwarf_Off, int> encodings;
  // CIE offset -> its index in *cies.
  internal::ThrowSafeMap<Dwarf_Off, uint32_t> cie_index;
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

// --- The own interpreter, FDE by FDE -----------------------------------------

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

absl::StatusOr<std::shared_ptr<const CfiModuleTable>> BuildCfiTableFromFile(
    const std::string& path, uint64_t text_lo, uint64_t text_hi,
    const std::string& expected_build_id, absl::FunctionRef<bool()> progress,
    CfiPartialBuild* partial, const CfiBuildOptions& options) {
  elf_version(EV_CURRENT);
  // Opened, mapped and closed in a descriptor table of inprof's own
  // (RunWithOwnDescriptors): libelf keeps the mapping, not the descriptor,
  // and the build below reads only memory.
  int open_errno = 0;
  Elf* elf = nullptr;
  RunWithOwnDescriptors([&] {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      open_errno = errno;
      return;
    }
    elf = elf_begin(fd, ELF_C_READ_MMAP, nullptr);
    if (elf != nullptr && elf_cntl(elf, ELF_C_FDREAD) != 0) {
      elf_end(elf);
      elf = nullptr;
    }
    close(fd);
  });
  if (open_errno != 0) {
    return absl::NotFoundError(
        absl::StrCat(path, ": cannot open: ", std::strerror(open_errno)));
  }
  if (elf == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", elf_errmsg(-1)));
  }
  auto table =
      BuildFromElf(elf, path, text_lo, text_hi, expected_build_id, progress,
                   partial, options);
  elf_end(elf);
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
