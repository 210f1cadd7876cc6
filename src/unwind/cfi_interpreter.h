// src/unwind/cfi_interpreter.h: the CFI table builder's own interpreter of
// .eh_frame, shared by the builder (cfi_table_libdw.cc, which runs it FDE by
// FDE and leaves to libdw what it does not model) and by the lookups of
// pending tables (cfi_table_direct_linux.cc, which run it in a signal
// handler). It reads its bytes through a ByteCursor
// (base/byte_cursor.h).
//
// Defines: the bounds and rule-field checks both users apply; CfiLeb,
// CfiUleb, CfiSleb and ReadFixed (CFI's numbers); CieInfo, ReadEncoded and
// ReadAugmentation (CIE and FDE fields); RegRule, FrameState, Execute and
// ConvertState (the interpreter). cfi_interpreter.cc also defines
// EvaluateCfaOffset (internal/cfi_table.h), for CFA expressions.
//
// Thread-safety: functions of their arguments only; none allocates, and all
// are async-signal-safe.
#ifndef INPROF_SRC_UNWIND_CFI_INTERPRETER_H_
#define INPROF_SRC_UNWIND_CFI_INTERPRETER_H_

#include <dwarf.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>

#include "inprof/base/byte_cursor.h"
#include "inprof/internal/cfi_table.h"
#include "inprof/internal/dwarf_registers.h"

namespace inprof::internal {

// Expression CFAs are evaluated byte by byte (.plt: 16 bytes per entry);
// larger ranges are left unsupported.
inline constexpr uint64_t kMaxPerByteRange = 1 << 16;

// Where ra and rbp may be saved relative to their base (rule words hold
// 12 bits; the largest seen is 168, in signal trampolines).
inline bool FitsRegisterOffset(int64_t v) {
  return v >= -kRuleWordMaxOffset - 1 && v <= kRuleWordMaxOffset;
}
inline bool FitsInt32(int64_t v) {
  return v >= std::numeric_limits<int32_t>::min() &&
         v <= std::numeric_limits<int32_t>::max();
}

// --- CFI's numbers -----------------------------------------------------------

// LEB128 at the cursor (ByteCursor's reading), sign-extended if
// `is_signed`, of at most `max_bytes` bytes: a longer one is refused like
// one cut short by the end, and no byte past the limit is read.
inline bool CfiLeb(ByteCursor* c, size_t max_bytes, bool is_signed,
                   uint64_t* out) {
  ByteCursor head{c->p, c->p + std::min(c->left(), max_bytes)};
  if (is_signed) {
    int64_t v = 0;
    if (!head.Sleb(&v)) return false;
    *out = static_cast<uint64_t>(v);
  } else if (!head.Uleb(out)) {
    return false;
  }
  c->p = head.p;
  return true;
}

// The interpreter's LEB128: values that need a tenth byte are refused (real
// CFI never has them; libdw's reading of them differs, and ReadEncoded, for
// the FDE headers, accepts them).
inline constexpr size_t kCfiLebMaxBytes = 9;
inline bool CfiUleb(ByteCursor* c, uint64_t* out) {
  return CfiLeb(c, kCfiLebMaxBytes, false, out);
}
inline bool CfiSleb(ByteCursor* c, uint64_t* out) {
  return CfiLeb(c, kCfiLebMaxBytes, true, out);
}

// An integer of `size` bytes (at most 8) at the cursor, sign-extended if
// `is_signed`.
inline bool ReadFixed(ByteCursor* c, size_t size, bool is_signed, uint64_t* out) {
  uint64_t v = 0;
  if (!c->Fixed(size, &v)) return false;
  if (is_signed && size < 8 && (v >> (8 * size - 1)) != 0) {
    v |= ~uint64_t{0} << (8 * size);
  }
  *out = v;
  return true;
}

// --- CIE and FDE fields ------------------------------------------------------

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

// Reads a DW_EH_PE-encoded pointer at *p; `field_address` is the address
// the field is loaded at (for pc-relative encodings).
bool ReadEncoded(uint8_t encoding, const uint8_t** p, const uint8_t* end,
                 uint64_t field_address, bool apply_relative, uint64_t* out);

// The letters of a 'z' augmentation after the 'z', over its data: the FDE
// pointer encoding ('R') and whether frames are signal frames ('S'); false
// when the augmentation is not understood. Unknown letters after what we
// need are harmless; before 'R' they hide its position.
bool ReadAugmentation(const char* letters, const uint8_t* p,
                      const uint8_t* end, uint8_t* fde_encoding,
                      bool* signal_frame) noexcept;

// --- The own interpreter -----------------------------------------------------
//
// One pass over an FDE's program gives every row: the state in force is
// tracked for the CFA and the two registers a rule needs (rbp and the
// return address), and each advance ends a row. It reproduces what libdw
// (0.188's execute_cfi, dwarf_frame_register, dwarf_frame_cfa) answers for
// each pc, and returns false, leaving the FDE to libdw, for whatever it
// does not model or where libdw would report an error.

// libdw keeps a register's rule value in a 61-bit signed field.
inline int64_t RuleValue(uint64_t v) { return static_cast<int64_t>(v << 3) >> 3; }

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
inline constexpr uint64_t kMaxDwarfRegister = INT32_MAX / 8;

// Runs the program [p, end) on *fs. For a CIE's initial instructions
// `cie_state` is null (an advance or a restore there is an error, as in
// libdw). `row(lo, hi, state)` receives each row an advance ends.
// With `cfa_expressions`, DW_CFA_def_cfa_expression is kept in the state
// (kCfaExpression) instead of leaving the FDE to libdw.
template <typename RowFn>
bool Execute(const uint8_t* p, const uint8_t* end, const CieInfo& cie,
             const FrameState* cie_state, FrameState* fs, uint64_t* loc,
             RowFn&& row, bool cfa_expressions = false) {
  ByteCursor c{p, end};
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
  while (c.p < c.end) {
    const uint8_t op = *c.p++;
    uint64_t delta = 0, reg = 0, value = 0;
    switch (op & 0xc0) {
      case DW_CFA_advance_loc:
        delta = op & 0x3f;
        break;
      case DW_CFA_offset:
        if (!CfiUleb(&c, &value) || !set(op & 0x3f, RegRule::kOffset, value * daf)) {
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
            if (!c.Fixed(size, &delta)) return false;
            break;
          }
          case DW_CFA_def_cfa:
            if (!CfiUleb(&c, &reg) || !CfiUleb(&c, &value)) return false;
            fs->cfa = FrameState::kCfaRegOffset;
            fs->cfa_register = reg;
            fs->cfa_offset = value;
            continue;
          case DW_CFA_def_cfa_sf:
            if (!CfiUleb(&c, &reg) || !CfiSleb(&c, &value)) return false;
            fs->cfa = FrameState::kCfaRegOffset;
            fs->cfa_register = reg;
            fs->cfa_offset = value * daf;
            continue;
          case DW_CFA_def_cfa_register:
            if (!CfiUleb(&c, &reg)) return false;
            require_reg_offset();
            fs->cfa_register = reg;
            continue;
          case DW_CFA_def_cfa_offset:
            if (!CfiUleb(&c, &value)) return false;
            require_reg_offset();
            fs->cfa_offset = value;
            continue;
          case DW_CFA_def_cfa_offset_sf:
            if (!CfiSleb(&c, &value)) return false;
            require_reg_offset();
            fs->cfa_offset = value * daf;
            continue;
          case DW_CFA_undefined:
            if (!CfiUleb(&c, &reg) || !set(reg, RegRule::kUndefined, 0)) return false;
            continue;
          case DW_CFA_same_value:
            if (!CfiUleb(&c, &reg) || !set(reg, RegRule::kSameValue, 0)) return false;
            continue;
          case DW_CFA_offset_extended:
          case DW_CFA_val_offset:
          case DW_CFA_offset_extended_sf:
          case DW_CFA_val_offset_sf: {
            // Factored offsets: unsigned, or signed in the _sf forms.
            const bool sf = op == DW_CFA_offset_extended_sf || op == DW_CFA_val_offset_sf;
            const bool val = op == DW_CFA_val_offset || op == DW_CFA_val_offset_sf;
            if (!CfiUleb(&c, &reg) || !CfiLeb(&c, kCfiLebMaxBytes, sf, &value) ||
                !set(reg, val ? RegRule::kValOffset : RegRule::kOffset, value * daf)) {
              return false;
            }
            continue;
          }
          case DW_CFA_GNU_negative_offset_extended:
            if (!CfiUleb(&c, &reg) || !CfiUleb(&c, &value) ||
                !set(reg, RegRule::kOffset, (0 - value) * daf)) {
              return false;
            }
            continue;
          case DW_CFA_register:
            if (!CfiUleb(&c, &reg) || !CfiUleb(&c, &value) ||
                !set(reg, RegRule::kRegister, value)) {
              return false;
            }
            continue;
          case DW_CFA_expression:
          case DW_CFA_val_expression:
            // Skipped for the registers a rule ignores; for rbp and the
            // return address, libdw decides.
            if (!CfiUleb(&c, &reg) || !CfiUleb(&c, &value) ||
                value > c.left() || reg >= kMaxDwarfRegister ||
                reg == kDwarfFp || reg == kDwarfRa) {
              return false;
            }
            c.p += value;
            continue;
          case DW_CFA_restore_extended:
            if (!CfiUleb(&c, &reg) || !restore(reg)) return false;
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
            if (!CfiUleb(&c, &value)) return false;
            continue;
          case DW_CFA_def_cfa_expression:
            if (!cfa_expressions || !CfiUleb(&c, &value) || value > c.left()) {
              return false;
            }
            fs->cfa = FrameState::kCfaExpression;
            fs->cfa_expression = c.p;
            fs->cfa_expression_size = value;
            c.p += value;
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

// ConvertFrame's answer (cfi_table_libdw.cc) for a state of the own
// interpreter: the same rule, built in the same order (a rule found
// unsupported keeps what was set before). Expressions never get here: the
// interpreter leaves them to libdw.
CfiRule ConvertState(const FrameState& fs, const CieInfo& cie);

}  // namespace inprof::internal

#endif  // INPROF_SRC_UNWIND_CFI_INTERPRETER_H_
