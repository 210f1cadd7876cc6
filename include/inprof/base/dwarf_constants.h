// internal: not part of the public API.
//
// The DWARF 5 standard's constants (section 7) that inprof's own DWARF
// readers use: the line program reader (src/symbolize/line_table.cc, both
// platforms) and the Windows unit reader (dwarf_lines_windows.cc). Spelled
// out rather than taken from elfutils' <dwarf.h>, which mingw-w64 does not
// have; in a namespace of their own so that they never meet <dwarf.h>'s
// global DW_* names.
#ifndef INPROF_BASE_DWARF_CONSTANTS_H_
#define INPROF_BASE_DWARF_CONSTANTS_H_

#include <cstdint>

namespace inprof::internal::dwarf {

// Attributes (DW_AT_*).
enum : uint32_t {
  kAtStmtList = 0x10,
  kAtCompDir = 0x1b,
};

// Attribute forms (DW_FORM_*), with the GNU extensions GCC emits.
enum : uint32_t {
  kFormAddr = 0x01,
  kFormBlock2 = 0x03,
  kFormBlock4 = 0x04,
  kFormData2 = 0x05,
  kFormData4 = 0x06,
  kFormData8 = 0x07,
  kFormString = 0x08,
  kFormBlock = 0x09,
  kFormBlock1 = 0x0a,
  kFormData1 = 0x0b,
  kFormFlag = 0x0c,
  kFormSdata = 0x0d,
  kFormStrp = 0x0e,
  kFormUdata = 0x0f,
  kFormRefAddr = 0x10,
  kFormRef1 = 0x11,
  kFormRef2 = 0x12,
  kFormRef4 = 0x13,
  kFormRef8 = 0x14,
  kFormRefUdata = 0x15,
  kFormIndirect = 0x16,
  kFormSecOffset = 0x17,
  kFormExprloc = 0x18,
  kFormFlagPresent = 0x19,
  kFormStrx = 0x1a,
  kFormAddrx = 0x1b,
  kFormRefSup4 = 0x1c,
  kFormStrpSup = 0x1d,
  kFormData16 = 0x1e,
  kFormLineStrp = 0x1f,
  kFormRefSig8 = 0x20,
  kFormImplicitConst = 0x21,
  kFormLoclistx = 0x22,
  kFormRnglistx = 0x23,
  kFormRefSup8 = 0x24,
  kFormStrx1 = 0x25,
  kFormStrx4 = 0x28,
  kFormAddrx1 = 0x29,
  kFormAddrx4 = 0x2c,
  kFormGnuAddrIndex = 0x1f01,
  kFormGnuStrIndex = 0x1f02,
  kFormGnuRefAlt = 0x1f20,
  kFormGnuStrpAlt = 0x1f21,
};

// Line number header entry formats (DW_LNCT_*).
enum : uint32_t {
  kLnctPath = 0x1,
  kLnctDirectoryIndex = 0x2,
};

// Standard line number opcodes (DW_LNS_*).
enum : uint32_t {
  kLnsCopy = 1,
  kLnsAdvancePc = 2,
  kLnsAdvanceLine = 3,
  kLnsSetFile = 4,
  kLnsSetColumn = 5,
  kLnsNegateStmt = 6,
  kLnsSetBasicBlock = 7,
  kLnsConstAddPc = 8,
  kLnsFixedAdvancePc = 9,
  kLnsSetPrologueEnd = 10,
  kLnsSetEpilogueBegin = 11,
  kLnsSetIsa = 12,
};

// Extended line number opcodes (DW_LNE_*), with the vendor extensions
// libdw reads.
enum : uint32_t {
  kLneEndSequence = 1,
  kLneSetAddress = 2,
  kLneDefineFile = 3,
  kLneSetDiscriminator = 4,
  kLneNvidiaInlinedCall = 144,
  kLneNvidiaSetFunctionName = 145,
};

}  // namespace inprof::internal::dwarf

#endif  // INPROF_BASE_DWARF_CONSTANTS_H_
