// DWARF's numbers for the x86-64 registers the unwinders read rules for
// (System V AMD64 psABI, figure 3.36), shared by the CFI table builder and
// the leaf-frame resolver.
#pragma once

namespace inprof::internal {

inline constexpr int kDwarfFp = 6;   // rbp
inline constexpr int kDwarfSp = 7;   // rsp
inline constexpr int kDwarfRa = 16;  // the return address column

}  // namespace inprof::internal
