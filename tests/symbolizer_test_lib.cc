// A small shared module that symbolizer_test dlopen()s after constructing a
// Symbolizer, and copies and corrupts for the fuzz test.

#include <cstdint>

namespace {

// File-local: named only through .symtab.
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

}  // extern "C"
