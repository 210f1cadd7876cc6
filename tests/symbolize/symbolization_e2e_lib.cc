// A shared module that symbolization_e2e_test dlopen()s after the profiler
// has started, and burns CPU in.

#include <cstdint>

namespace {
constexpr int kSpinFirstLine = __LINE__;
}  // namespace

extern "C" {

// A leaf loop (no calls, so all its samples have it as the leaf).
__attribute__((visibility("default"), noinline)) uint64_t InprofE2eLibSpin(
    uint64_t n) {
  uint64_t x = n;
  for (uint64_t i = 0; i < n; ++i) {
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL + i;
  }
  return x;
}

}  // extern "C"

namespace {
constexpr int kSpinLastLine = __LINE__;
}  // namespace

extern "C" {

// The lines that enclose InprofE2eLibSpin's definition.
__attribute__((visibility("default"))) int InprofE2eLibSpinFirstLine() {
  return kSpinFirstLine;
}
__attribute__((visibility("default"))) int InprofE2eLibSpinLastLine() {
  return kSpinLastLine;
}

}  // extern "C"
