// A shared module built with -O2 -fomit-frame-pointer (tests/meson.build)
// that dwarf_unwinder_test dlopen()s: its functions keep no frame records,
// and the two intermediate ones also put a value into rbp that looks like a
// frame record but is not, so only call-frame information unwinds them.

#include <csignal>
#include <cstdint>

namespace {

// Points rbp at a fake record on this frame's stack: a misaligned "next fp"
// and a bogus return address. rbp is callee-saved, so the compiler saves and
// restores the caller's value around this (the CFI says where).
#define INPROF_SCRAMBLE_RBP(fake)                                   \
  asm volatile("lea %0, %%rbp" : : "m"(fake) : "rbp", "memory")

}  // namespace

extern "C" {

// The hot leaf: no calls, so its CFA is rsp + 8 throughout.
__attribute__((visibility("default"), noinline)) uint64_t DwarfLibLeaf(
    uint64_t n) {
  uint64_t x = n;
  for (uint64_t i = 0; i < n; ++i) {
    x = (x ^ (x >> 31)) * 0xd6e8feb86659fd93ULL + i;
  }
  return x;
}

__attribute__((visibility("default"), noinline)) uint64_t DwarfLibMiddle(
    uint64_t n) {
  volatile uint64_t fake[2] = {0x1235, 0xbad0bad0};
  INPROF_SCRAMBLE_RBP(fake);
  uint64_t x = DwarfLibLeaf(n);
  return x ^ fake[0];  // work after the call: not a tail call
}

__attribute__((visibility("default"), noinline)) uint64_t DwarfLibOuter(
    uint64_t n) {
  volatile uint64_t fake[2] = {0x4321, 0xbad1bad1};
  INPROF_SCRAMBLE_RBP(fake);
  uint64_t x = DwarfLibMiddle(n);
  return x + fake[1];
}

// The same shape around a callback, for walks taken synchronously.
__attribute__((visibility("default"), noinline)) uint64_t DwarfLibCallMiddle(
    void (*fn)(void*), void* arg) {
  volatile uint64_t fake[2] = {0x5555, 0xbad2bad2};
  INPROF_SCRAMBLE_RBP(fake);
  fn(arg);
  return fake[0];
}

__attribute__((visibility("default"), noinline)) uint64_t DwarfLibCallOuter(
    void (*fn)(void*), void* arg) {
  volatile uint64_t fake[2] = {0x7777, 0xbad3bad3};
  INPROF_SCRAMBLE_RBP(fake);
  uint64_t x = DwarfLibCallMiddle(fn, arg);
  return x + fake[1];
}

// Raises `sig` from a frame without a frame record: the handler's stack
// holds the kernel's signal frame (__restore_rt) above this one.
__attribute__((visibility("default"), noinline)) int DwarfLibRaise(int sig) {
  volatile uint64_t fake[2] = {0x9999, 0xbad4bad4};
  INPROF_SCRAMBLE_RBP(fake);
  const int rc = std::raise(sig);
  return rc + static_cast<int>(fake[0] & 1);
}

}  // extern "C"
