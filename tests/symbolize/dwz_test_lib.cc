// Built twice (dwz_test_one, dwz_test_two, INPROF_DWZ_ENTRY naming the
// entry point): the DWARF both copies share, this struct and the inlined
// function, is what `dwz -m` moves into a common alt file that each
// copy's .gnu_debugaltlink names.
#include <cstdint>

namespace {

struct DwzShared {
  int a;
  long b;
};

inline __attribute__((always_inline)) int DwzSharedInline(DwzShared* s, int n) {
  int sum = 0;
  for (int i = 0; i < n; ++i) {
    asm volatile("" : "+r"(sum));
    sum += s->a * i + static_cast<int>(s->b);
  }
  return sum;
}

}  // namespace

extern "C" __attribute__((visibility("default"), noinline)) int INPROF_DWZ_ENTRY(
    int a, int n) {
  DwzShared s{a, 3};
  return DwzSharedInline(&s, n) + 1;
}
