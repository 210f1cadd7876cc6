// A small shared module that symbolizer_test dlopen()s after constructing a
// Symbolizer, copies and corrupts for the fuzz test, and splits into a
// stripped library plus a separate debug file.

#include <cstdint>

namespace {

// File-local: named only through .symtab (or a separate debug file's).
constexpr int kLibStaticHelperLine = __LINE__ + 1;
__attribute__((noinline)) int LibStaticHelper(int x) {
  asm volatile("" : "+r"(x));
  return x * 7 + 3;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"), noinline)) int InprofTestLibFunction(
    int x) {
  asm volatile("" : "+r"(x));
  return LibStaticHelper(x) + 1;
}

__attribute__((visibility("default"))) uintptr_t InprofTestLibStaticAddress() {
  return reinterpret_cast<uintptr_t>(&LibStaticHelper);
}

// The line on which LibStaticHelper's definition starts.
__attribute__((visibility("default"))) int InprofTestLibStaticLine() {
  return kLibStaticHelperLine;
}

}  // extern "C"
