// The CFI table builder's own interpreter (cfi_interpreter.h): CIE and FDE
// fields, its states turned into rules, and the evaluation of CFA
// expressions. Execute, the interpreter itself, is a template in the
// header.
#include "src/unwind/cfi_interpreter.h"

#include <dwarf.h>

#include <cstring>
#include <span>
#include <utility>

#include "inprof/base/byte_cursor.h"
#include "inprof/internal/cfi_table.h"
#include "inprof/internal/dwarf_registers.h"

namespace inprof::internal {

// --- CFA expressions ---------------------------------------------------------

namespace {

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

// --- CIE and FDE fields ------------------------------------------------------

bool ReadEncoded(uint8_t encoding, const uint8_t** p, const uint8_t* end,
                 uint64_t field_address, bool apply_relative, uint64_t* out) {
  if (encoding == DW_EH_PE_omit) return false;
  uint64_t value = 0;
  ByteCursor c{*p, end};
  auto fixed = [&](size_t size, bool is_signed) {
    return ReadFixed(&c, size, is_signed, &value);
  };
  // LEB128 of up to ten bytes, as many as 64 bits take (the interpreter's
  // own stop at nine: kCfiLebMaxBytes).
  auto leb = [&](bool is_signed) {
    return CfiLeb(&c, 10, is_signed, &value);
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
  *p = c.p;
  *out = value;
  return true;
}

bool ReadAugmentation(const char* letters, const uint8_t* p,
                      const uint8_t* end, uint8_t* fde_encoding,
                      bool* signal_frame) noexcept {
  ByteCursor data{p, end};
  for (const char* c = letters; *c != '\0'; ++c) {
    uint64_t encoding = 0;
    switch (*c) {
      case 'R':
        if (!data.Fixed(1, &encoding)) return false;
        *fde_encoding = static_cast<uint8_t>(encoding);
        break;
      case 'P': {
        if (!data.Fixed(1, &encoding)) return false;
        uint64_t ignored = 0;
        if (!ReadEncoded(static_cast<uint8_t>(encoding & 0x0f), &data.p,
                         data.end, 0, false, &ignored)) {
          return false;
        }
        break;
      }
      case 'L':
        if (!data.Skip(1)) return false;
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

// --- The own interpreter's states as rules -----------------------------------

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

}  // namespace inprof::internal
