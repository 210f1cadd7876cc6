// internal: not part of the public API.
//
// One call-frame rule of the DWARF unwinder's tables (cfi_table.h): how to
// find the caller's registers at one pc, packed into one word for the
// tables and unpacked by the walk (cfi_walk.h), and the CFA expressions the
// table builder evaluates.
//
// Thread-safety: constants and pure functions only; the rule's encoding
// and decoding are async-signal-safe.
#ifndef INPROF_INTERNAL_CFI_RULE_H_
#define INPROF_INTERNAL_CFI_RULE_H_

#include <cstddef>
#include <cstdint>
#include <span>

namespace inprof::internal {

#if defined(__x86_64__)
inline constexpr bool kCfiWalkSupported = true;
#else
// The rules below model x86-64 (return address at CFA - 8, rbp as the frame
// pointer). AArch64 keeps the return address in x30 at a leaf: not done yet.
inline constexpr bool kCfiWalkSupported = false;
#endif

// How to find the caller's registers at one pc.
struct CfiRule {
  enum Kind : uint8_t {
    kNone = 0,     // no CFI covers the pc (the walk may try a frame-pointer step)
    kCfaSp,        // CFA = sp + cfa_offset
    kCfaFp,        // CFA = fp + cfa_offset
    kCfaDerefSp,   // CFA = *(sp + cfa_offset): a signal trampoline's saved rsp
    kOutermost,    // the return address is undefined: the thread's first frame
    kUnsupported,  // CFI exists in a form the walk does not model
  };
  enum Flags : uint8_t {
    kRaFromSp = 1,     // ra at sp + ra_offset (else CFA + ra_offset)
    kFpSaved = 2,      // caller's rbp at (kFpFromSp ? sp : CFA) + fp_offset
    kFpFromSp = 4,
    kFpLost = 8,       // caller's rbp cannot be recovered
    kSignalFrame = 16, // the caller's pc is the interrupted one, not a return
  };

  int32_t cfa_offset = 0;
  int16_t ra_offset = -8;
  int16_t fp_offset = 0;
  uint8_t kind = kNone;
  uint8_t flags = 0;

  friend bool operator==(const CfiRule&, const CfiRule&) = default;
};

// One row as the builders produce it: `rule` holds from `pc` (an offset
// from the table's text start) up to the next row.
struct CfiRow {
  uint32_t pc = 0;
  CfiRule rule;
};

// A rule in one 64-bit word, the form the tables store and the walk decodes
// in registers: kind in bits 0-2, flags 3-7, cfa_offset 8-39, ra_offset
// 40-51 and fp_offset 52-63 (signed 12-bit). Every kNone rule is 0.
inline constexpr int64_t kRuleWordMaxOffset = 2047;
inline constexpr bool RuleWordFits(const CfiRule& r) {
  return r.ra_offset >= -kRuleWordMaxOffset - 1 &&
         r.ra_offset <= kRuleWordMaxOffset &&
         r.fp_offset >= -kRuleWordMaxOffset - 1 &&
         r.fp_offset <= kRuleWordMaxOffset && r.kind <= CfiRule::kUnsupported &&
         r.flags < 32;
}
// A rule that does not fit becomes kUnsupported.
inline constexpr uint64_t EncodeRule(const CfiRule& r) {
  if (r.kind == CfiRule::kNone) return 0;
  if (!RuleWordFits(r)) return CfiRule::kUnsupported;
  return uint64_t{r.kind} | (uint64_t{r.flags} << 3) |
         (uint64_t{static_cast<uint32_t>(r.cfa_offset)} << 8) |
         ((static_cast<uint64_t>(r.ra_offset) & 0xfff) << 40) |
         ((static_cast<uint64_t>(r.fp_offset) & 0xfff) << 52);
}
inline constexpr unsigned RuleKind(uint64_t w) { return w & 7; }
inline constexpr unsigned RuleFlags(uint64_t w) { return (w >> 3) & 31; }
inline constexpr int64_t RuleCfaOffset(uint64_t w) {
  return static_cast<int32_t>(static_cast<uint32_t>(w >> 8));
}
inline constexpr int64_t RuleRaOffset(uint64_t w) {
  return static_cast<int64_t>(w << 12) >> 52;
}
inline constexpr int64_t RuleFpOffset(uint64_t w) {
  return static_cast<int64_t>(w) >> 52;
}
inline constexpr CfiRule DecodeRule(uint64_t w) {
  CfiRule r;
  if (w == 0) return r;
  r.kind = static_cast<uint8_t>(RuleKind(w));
  r.flags = static_cast<uint8_t>(RuleFlags(w));
  r.cfa_offset = static_cast<int32_t>(RuleCfaOffset(w));
  r.ra_offset = static_cast<int16_t>(RuleRaOffset(w));
  r.fp_offset = static_cast<int16_t>(RuleFpOffset(w));
  return r;
}

// A rule as the walk uses it, decoded into registers.
struct CfiStep {
  int64_t cfa_offset = 0;
  int64_t ra_offset = 0;
  int64_t fp_offset = 0;
  unsigned kind = CfiRule::kNone;
  unsigned flags = 0;
};
[[gnu::always_inline]] inline CfiStep StepFromWord(uint64_t w) {
  return {RuleCfaOffset(w), RuleRaOffset(w), RuleFpOffset(w), RuleKind(w),
          RuleFlags(w)};
}
inline CfiRule RuleFromStep(const CfiStep& step) {
  CfiRule r;
  if (step.kind == CfiRule::kNone) return r;
  r.kind = static_cast<uint8_t>(step.kind);
  r.flags = static_cast<uint8_t>(step.flags);
  r.cfa_offset = static_cast<int32_t>(step.cfa_offset);
  r.ra_offset = static_cast<int16_t>(step.ra_offset);
  r.fp_offset = static_cast<int16_t>(step.fp_offset);
  return r;
}

// A DWARF expression operation as libdw decodes it (atom: DW_OP_*).
struct CfiOp {
  uint8_t atom = 0;
  uint64_t number = 0;
  uint64_t number2 = 0;
};

// Evaluates a CFA expression at `pc` (a link-time address) as
// sp + *offset: true only when the expression reads no memory, no register
// but rsp and rip, and is sp plus a constant for this pc (the linker's
// .plt rule, "rsp + 8 + ((rip & 15) >= 11 ? 8 : 0)", is the case seen).
bool EvaluateCfaOffset(std::span<const CfiOp> ops, uint64_t pc,
                       int64_t* offset);

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_CFI_RULE_H_
