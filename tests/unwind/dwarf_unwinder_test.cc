// The DWARF unwinder: the walk on synthetic stacks (internal/cfi_walk.h), on
// real stacks and on copies of them, and how it tracks loaded modules. The
// executable's other sources: tests/unwind/cfi_table_test.cc (the tables) and
// tests/profiler/dwarf_profiler_test.cc (DwarfProfiler end to end).
#include "inprof/dwarf_unwinder.h"

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inprof/frame_pointer_unwinder.h"
#include "inprof/inprof.h"
#include "inprof/internal/cfi_table.h"
#include "inprof/internal/cfi_walk.h"
#include "inprof/base/sanitizers.h"
#include "inprof/internal/thread_info.h"
#include "inprof/unwinder.h"
#include "unwind/dwarf_unwinder_test_util.h"
#include "util/test_util.h"

// --- Frames of the test binary (built with frame pointers) -------------------
// At global scope and exported (the executable is linked with
// -export-dynamic) so that dladdr() and pprof name them plainly.

extern "C" __attribute__((noinline)) uint64_t DwarfTestFpCaller(
    uint64_t (*outer)(uint64_t), uint64_t n) {
  uint64_t x = outer(n);
  asm volatile("" : "+r"(x));  // work after the call: not a tail call
  return x + 1;
}

extern "C" __attribute__((noinline)) uint64_t DwarfTestCallThrough(
    uint64_t (*outer)(void (*)(void*), void*), void (*fn)(void*), void* arg) {
  uint64_t x = outer(fn, arg);
  asm volatile("" : "+r"(x));
  return x + 1;
}

extern "C" __attribute__((noinline)) int DwarfTestRaiseThrough(
    int (*raise_fn)(int), int sig) {
  int x = raise_fn(sig);
  asm volatile("" : "+r"(x));
  return x + 1;
}

namespace inprof {
namespace {

using dwarf_unwinder_test::Addr;
using dwarf_unwinder_test::FpRule;
using dwarf_unwinder_test::HasModule;
using dwarf_unwinder_test::Joined;
using dwarf_unwinder_test::KindRule;
using dwarf_unwinder_test::LibraryCopy;
using dwarf_unwinder_test::SpRule;
using internal::CfiModuleTable;
using internal::CfiRow;
using internal::CfiRule;
using internal::CfiSnapshot;
using internal::CfiWalk;
using ::testing::Contains;
using ::testing::HasSubstr;

static_assert(Unwinder<DwarfUnwinder>);
static_assert(!CopiesLeafStack<DwarfUnwinder>);
struct NotAnUnwinder {
  static constexpr const char* kName = "no";
};
static_assert(!Unwinder<NotAnUnwinder>);

bool CurrentStackBounds(StackBounds& bounds) {
  pthread_attr_t attr;
  if (pthread_getattr_np(pthread_self(), &attr) != 0) return false;
  void* addr = nullptr;
  size_t size = 0;
  const bool ok = pthread_attr_getstack(&attr, &addr, &size) == 0;
  pthread_attr_destroy(&attr);
  bounds.lo = Addr(addr);
  bounds.hi = bounds.lo + size;
  return ok;
}

// The name dladdr() gives `pc` (a return address: looked up at pc - 1).
std::string NameOf(uintptr_t pc, bool return_address = true) {
  Dl_info info;
  const void* at = reinterpret_cast<const void*>(return_address ? pc - 1 : pc);
  if (dladdr(at, &info) == 0 || info.dli_sname == nullptr) return "?";
  return info.dli_sname;
}

std::vector<std::string> Names(std::span<const uintptr_t> pcs) {
  std::vector<std::string> names;
  for (size_t i = 0; i < pcs.size(); ++i) names.push_back(NameOf(pcs[i], i > 0));
  return names;
}

// --- The walk on synthetic stacks ------------------------------------------------------

// A fake module at kBase with one rule per 0x1000 bytes, and a one-page fake
// stack between two inaccessible pages: a read outside the bounds faults.
constexpr uintptr_t kBase = 0x7100000;
constexpr uintptr_t kLeafFn = kBase + 0x0000;         // CFA = sp + 8
constexpr uintptr_t kPushFn = kBase + 0x1000;         // CFA = sp + 32, rbp at CFA - 16
constexpr uintptr_t kFpFn = kBase + 0x2000;           // CFA = rbp + 16, rbp at CFA - 16
constexpr uintptr_t kEntryFn = kBase + 0x3000;        // return address undefined
constexpr uintptr_t kNoCfiFn = kBase + 0x4000;        // no row (gap)
constexpr uintptr_t kSigreturn = kBase + 0x5000;      // CFA = *(sp + 160)
constexpr uintptr_t kUnsupportedFn = kBase + 0x6000;  // CFI we do not model
constexpr uintptr_t kFlatFn = kBase + 0x7000;         // CFA = sp + 0: not above sp
constexpr uintptr_t kHugeFn = kBase + 0x8000;         // CFA = sp + 1 MiB
constexpr uintptr_t kLostFpFn = kBase + 0x9000;       // rbp not recoverable
constexpr uintptr_t kEpilogueFn = kBase + 0xa000;     // after pop %rbp: CFA = sp + 8, rbp "at CFA - 16"

std::shared_ptr<const CfiModuleTable> FakeModule() {
  CfiRule sig;
  sig.kind = CfiRule::kCfaDerefSp;
  sig.cfa_offset = 160;
  sig.ra_offset = 168;
  sig.fp_offset = 120;
  sig.flags = CfiRule::kRaFromSp | CfiRule::kFpSaved | CfiRule::kFpFromSp |
              CfiRule::kSignalFrame;
  CfiRule lost = SpRule(16);
  lost.flags = CfiRule::kFpLost;
  const std::vector<CfiRow> rows = {
      {0x0000, SpRule(8)},
      {0x1000, SpRule(32, CfiRule::kFpSaved, -16)},
      {0x2000, FpRule()},
      {0x3000, KindRule(CfiRule::kOutermost)},
      {0x4000, CfiRule()},
      {0x5000, sig},
      {0x6000, KindRule(CfiRule::kUnsupported)},
      {0x7000, SpRule(0)},
      {0x8000, SpRule(1 << 20)},
      {0x9000, lost},
      {0xa000, SpRule(8, CfiRule::kFpSaved, -16)},
      {0xb000, CfiRule()},
  };
  return std::make_shared<const CfiModuleTable>(0, 0xc000, rows, "fake");
}

class SyntheticStack {
 public:
  static constexpr size_t kPage = 4096;
  static constexpr size_t kWords = kPage / 8;
  SyntheticStack() {
    void* p = mmap(nullptr, 3 * kPage, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    region_ = static_cast<uint8_t*>(p);
    mprotect(region_, kPage, PROT_NONE);
    mprotect(region_ + 2 * kPage, kPage, PROT_NONE);
    words_ = reinterpret_cast<uintptr_t*>(region_ + kPage);
    std::memset(words_, 0, kPage);
  }
  ~SyntheticStack() { munmap(region_, 3 * kPage); }
  SyntheticStack(const SyntheticStack&) = delete;
  SyntheticStack& operator=(const SyntheticStack&) = delete;

  uintptr_t at(size_t word) const { return Addr(&words_[word]); }
  void set(size_t word, uintptr_t value) { words_[word] = value; }
  StackBounds bounds() const { return {at(0), at(0) + kPage}; }
  uintptr_t* words() { return words_; }

 private:
  uint8_t* region_ = nullptr;
  uintptr_t* words_ = nullptr;
};

class CfiWalkTest : public ::testing::Test {
 protected:
  CfiWalkTest() : snapshot_({{kBase, FakeModule()}}) {}

  UnwindResult Walk(uintptr_t pc, size_t sp_word, uintptr_t fp,
                    std::span<uintptr_t> out) {
    return CfiWalk(&snapshot_, {pc, stack_.at(sp_word), fp}, stack_.bounds(),
                   out);
  }
  std::vector<uintptr_t> Frames(std::span<const uintptr_t> out,
                                const UnwindResult& r) {
    return {out.begin(), out.begin() + static_cast<ptrdiff_t>(r.depth)};
  }

  // leaf (sp = word 10) -> push fn (CFA = word 15) -> fp fn (record at
  // word 30) -> entry: every kind of ordinary frame.
  void BuildOrdinaryStack() {
    stack_.set(10, kPushFn + 0x10);     // leaf's return address
    stack_.set(13, stack_.at(30));      // push fn saved rbp at CFA - 16
    stack_.set(14, kFpFn + 0x20);       // push fn's return address (CFA - 8)
    stack_.set(30, 0);                  // fp fn's saved rbp
    stack_.set(31, kEntryFn + 0x8);     // fp fn's return address
  }

  SyntheticStack stack_;
  CfiSnapshot snapshot_;
};

TEST_F(CfiWalkTest, WalksSpAndFpBasedFramesToTheOutermostComplete) {
  BuildOrdinaryStack();
  uintptr_t out[16] = {};
  const UnwindResult r = Walk(kLeafFn + 0x4, 10, 0xbad, out);
  EXPECT_FALSE(r.truncated);
  EXPECT_EQ(Frames(out, r), (std::vector<uintptr_t>{kLeafFn + 0x4, kPushFn + 0x10,
                                                    kFpFn + 0x20, kEntryFn + 0x8}));
}

TEST_F(CfiWalkTest, SpanLimitsTruncateAndNeverOverflow) {
  BuildOrdinaryStack();
  std::array<uintptr_t, 8> buffer;
  buffer.fill(0xdead);
  UnwindResult r = Walk(kLeafFn, 10, 0, std::span<uintptr_t>(buffer.data(), 2));
  EXPECT_TRUE(r.truncated);
  EXPECT_EQ(r.depth, 2u);
  for (size_t i = 2; i < buffer.size(); ++i) EXPECT_EQ(buffer[i], 0xdeadu);
  r = Walk(kLeafFn, 10, 0, std::span<uintptr_t>(buffer.data(), 4));
  EXPECT_FALSE(r.truncated);  // exactly as deep as the stack
  EXPECT_EQ(r.depth, 4u);
  r = Walk(kLeafFn, 10, 0, {});
  EXPECT_EQ(r.depth, 0u);
}

TEST_F(CfiWalkTest, ZeroReturnAddressEndsComplete) {
  stack_.set(10, 0);
  uintptr_t out[8] = {};
  const UnwindResult r = Walk(kLeafFn, 10, 0, out);
  EXPECT_FALSE(r.truncated);
  EXPECT_EQ(r.depth, 1u);
}

TEST_F(CfiWalkTest, PcWithoutCfiTakesOneFramePointerStep) {
  // leaf -> a function without CFI whose rbp chain is valid -> fp fn -> entry.
  stack_.set(10, kNoCfiFn + 0x10);
  stack_.set(20, stack_.at(30));      // frame record: next fp, ra
  stack_.set(21, kFpFn + 0x20);
  stack_.set(30, 0);
  stack_.set(31, kEntryFn + 0x8);
  uintptr_t out[8] = {};
  UnwindResult r = Walk(kLeafFn, 10, stack_.at(20), out);
  EXPECT_FALSE(r.truncated);
  EXPECT_EQ(Frames(out, r), (std::vector<uintptr_t>{kLeafFn, kNoCfiFn + 0x10,
                                                    kFpFn + 0x20, kEntryFn + 0x8}));
  // The same with rbp not a frame record: truncated where CFI ends.
  for (uintptr_t bad : {uintptr_t{0}, uintptr_t{0x1235}, stack_.at(5),
                        stack_.bounds().hi, uintptr_t{0xffffffffffffff00}}) {
    r = Walk(kLeafFn, 10, bad, out);
    EXPECT_TRUE(r.truncated) << bad;
    EXPECT_EQ(r.depth, 2u) << bad;
  }
  // A frame record whose return address is in no module: not taken.
  stack_.set(21, 0x5000);
  r = Walk(kLeafFn, 10, stack_.at(20), out);
  EXPECT_TRUE(r.truncated);
  EXPECT_EQ(Frames(out, r), (std::vector<uintptr_t>{kLeafFn, kNoCfiFn + 0x10}));
  // A pc outside every module behaves the same.
  r = Walk(0x1234, 10, 0, out);
  EXPECT_TRUE(r.truncated);
  EXPECT_EQ(r.depth, 1u);
}

TEST_F(CfiWalkTest, UnsupportedRowFallsBackLikeAMissingOne) {
  stack_.set(10, kUnsupportedFn + 0x10);
  uintptr_t out[8] = {};
  const UnwindResult r = Walk(kLeafFn, 10, 0, out);
  EXPECT_TRUE(r.truncated);
  EXPECT_EQ(r.depth, 2u);
}

TEST_F(CfiWalkTest, FramePointerCycleIsTruncatedNotFollowed) {
  // Two fp frames whose records point at each other's, and one at itself.
  stack_.set(20, stack_.at(20));
  stack_.set(21, kFpFn + 0x20);
  uintptr_t out[64] = {};
  UnwindResult r = Walk(kFpFn, 10, stack_.at(20), out);
  EXPECT_TRUE(r.truncated);
  EXPECT_LE(r.depth, 3u);
  stack_.set(20, stack_.at(24));
  stack_.set(24, stack_.at(20));
  stack_.set(25, kFpFn + 0x30);
  r = Walk(kFpFn, 10, stack_.at(20), out);
  EXPECT_TRUE(r.truncated);
  EXPECT_LE(r.depth, 4u);
}

TEST_F(CfiWalkTest, CfaNotAboveSpOrOffTheStackIsTruncated) {
  uintptr_t out[8] = {};
  stack_.set(10, kFlatFn + 0x10);     // next frame: CFA = sp + 0
  UnwindResult r = Walk(kLeafFn, 10, 0, out);
  EXPECT_TRUE(r.truncated);
  EXPECT_EQ(r.depth, 2u);
  stack_.set(10, kHugeFn + 0x10);     // next frame: CFA = sp + 1 MiB
  r = Walk(kLeafFn, 10, 0, out);
  EXPECT_TRUE(r.truncated);
  EXPECT_EQ(r.depth, 2u);
  // An fp-based CFA with rbp below sp, or far away.
  for (uintptr_t fp : {stack_.at(2), uintptr_t{16}, ~uintptr_t{0} - 8}) {
    r = Walk(kFpFn, 10, fp, out);
    EXPECT_TRUE(r.truncated);
    EXPECT_EQ(r.depth, 1u);
  }
  // The stack pointer itself outside the bounds.
  r = Walk(kLeafFn, SyntheticStack::kWords, 0, out);
  EXPECT_TRUE(r.truncated);
  EXPECT_EQ(r.depth, 1u);
}

// Interrupted between `pop %rbp` and `ret`: GCC's CFI still says rbp is
// saved at CFA - 16, below sp now, and rbp already holds the caller's value.
// The walk must keep rbp rather than refuse the read (0.3-1% of the stacks
// bench/overhead saw were cut there).
TEST_F(CfiWalkTest, EpilogueAfterPopKeepsTheRestoredFramePointer) {
  stack_.set(10, kFpFn + 0x20);       // ret's return address
  stack_.set(9, 0xbad);               // the popped slot, below sp
  stack_.set(30, 0);                  // fp fn's saved rbp
  stack_.set(31, kEntryFn + 0x8);     // fp fn's return address
  uintptr_t out[8] = {};
  const UnwindResult r = Walk(kEpilogueFn + 0x4, 10, stack_.at(30), out);
  EXPECT_FALSE(r.truncated);
  EXPECT_EQ(Frames(out, r), (std::vector<uintptr_t>{kEpilogueFn + 0x4,
                                                    kFpFn + 0x20,
                                                    kEntryFn + 0x8}));
  // Below sp in a caller's frame (not the interrupted one) is still refused.
  stack_.set(11, kEpilogueFn + 0x10);  // the leaf's caller: CFA = word 13,
  stack_.set(12, kFpFn + 0x20);        // its rbp "at word 11", below its sp
  uintptr_t out2[8] = {};
  const UnwindResult r2 = Walk(kLeafFn, 11, stack_.at(30), out2);
  EXPECT_TRUE(r2.truncated);
}

TEST_F(CfiWalkTest, LostFramePointerStopsAnFpBasedCaller) {
  stack_.set(10, kLostFpFn + 0x10);   // CFA = sp + 16, rbp lost
  stack_.set(12, kFpFn + 0x10);       // its return address at CFA - 8
  uintptr_t out[8] = {};
  const UnwindResult r = Walk(kLeafFn, 10, stack_.at(30), out);
  EXPECT_TRUE(r.truncated);
  EXPECT_EQ(Frames(out, r),
            (std::vector<uintptr_t>{kLeafFn, kLostFpFn + 0x10, kFpFn + 0x10}));
}

TEST_F(CfiWalkTest, SignalFrameResumesAtTheInterruptedRegisters) {
  // The handler returned into the trampoline; sp (word 40) is the saved
  // ucontext: saved rsp at +160, rip at +168, rbp at +120.
  const size_t uc = 40;
  stack_.set(uc + 160 / 8, stack_.at(100));
  stack_.set(uc + 168 / 8, kPushFn + 0x4);  // exact: looked up as is
  stack_.set(uc + 120 / 8, stack_.at(120));
  // The interrupted push fn: CFA = sp + 32 = word 104.
  stack_.set(102, stack_.at(120));          // its saved rbp (CFA - 16)
  stack_.set(103, kFpFn + 0x8);
  stack_.set(120, 0);
  stack_.set(121, kEntryFn + 0x10);
  uintptr_t out[8] = {};
  UnwindResult r = Walk(kSigreturn + 1, uc, 0, out);
  EXPECT_FALSE(r.truncated);
  EXPECT_EQ(Frames(out, r), (std::vector<uintptr_t>{kSigreturn + 1, kPushFn + 0x4,
                                                    kFpFn + 0x8, kEntryFn + 0x10}));
  // A saved rsp below the trampoline's frame: truncated.
  stack_.set(uc + 160 / 8, stack_.at(4));
  r = Walk(kSigreturn + 1, uc, 0, out);
  EXPECT_TRUE(r.truncated);
  EXPECT_EQ(r.depth, 1u);
}

TEST_F(CfiWalkTest, WithoutASnapshotFollowsFramePointers) {
  stack_.set(20, stack_.at(30));
  stack_.set(21, 0x1111);
  stack_.set(30, 0);
  stack_.set(31, 0);  // thread-entry convention
  uintptr_t out[8] = {};
  const UnwindResult r = CfiWalk(nullptr, {0x42, stack_.at(10), stack_.at(20)},
                                 stack_.bounds(), out);
  EXPECT_FALSE(r.truncated);
  EXPECT_EQ(Frames(out, r), (std::vector<uintptr_t>{0x42, 0x1111}));
}

// Random stacks and random pcs into the fake module: whatever they hold,
// the walk stays inside the page (the guard pages would fault), stops, and
// never writes past its span.
TEST_F(CfiWalkTest, RandomStacksNeverFaultOrOverflow) {
  std::mt19937_64 rng(1234);
  const uintptr_t lo = stack_.bounds().lo;
  auto random_word = [&]() -> uintptr_t {
    switch (rng() % 6) {
      case 0: return 0;
      case 1: return lo + (rng() % (SyntheticStack::kPage + 64)) - 32;
      case 2: return kBase + rng() % 0xb800;
      case 3: return lo + 8 * (rng() % SyntheticStack::kWords);
      case 4: return rng();
      default: return kBase + 0x1000 * (rng() % 11) + rng() % 64;
    }
  };
  std::array<uintptr_t, 40> out;
  for (int i = 0; i < 100000; ++i) {
    for (size_t w = 0; w < SyntheticStack::kWords; ++w) {
      stack_.words()[w] = random_word();
    }
    const size_t span = 1 + rng() % 32;
    out.fill(0xfeed);
    const UnwindResult r =
        CfiWalk(&snapshot_, {random_word(), random_word(), random_word()},
                stack_.bounds(), std::span<uintptr_t>(out.data(), span));
    ASSERT_LE(r.depth, span);
    ASSERT_GE(r.depth, 1u);
    for (size_t k = span; k < out.size(); ++k) ASSERT_EQ(out[k], 0xfeedu);
  }
}

// --- Real stacks ---------------------------------------------------------------

__attribute__((noinline)) uintptr_t CallerPc() {
  return Addr(__builtin_return_address(0));
}

struct WalkCapture {
  StackBounds bounds;
  std::array<uintptr_t, 256> dwarf{};
  UnwindResult dwarf_result;
  std::array<uintptr_t, 256> fp{};
  UnwindResult fp_result;
};

// Called by the library's frameless DwarfLibCallMiddle: walks from here.
extern "C" __attribute__((noinline)) void DwarfTestCapture(void* arg) {
  auto* c = static_cast<WalkCapture*>(arg);
  uintptr_t local = 0;
  asm volatile("" : : "r"(&local) : "memory");
  const RegisterState regs{CallerPc(), Addr(&local),
                           Addr(__builtin_frame_address(0))};
  c->dwarf_result = DwarfUnwinder().UnwindFrom(regs, c->bounds, c->dwarf);
  c->fp_result = FramePointerUnwinder().UnwindFrom(regs, c->bounds, c->fp);
}

TEST(DwarfUnwinderTest, WalksThroughFramelessLibraryFramesToMain) {
  LibraryCopy lib("walk");
  ASSERT_TRUE(lib.Open()) << dlerror();
  DwarfUnwinder::RefreshModules();  // the library is new: rebuild
  auto outer =
      lib.Symbol<uint64_t (*)(void (*)(void*), void*)>("DwarfLibCallOuter");
  ASSERT_NE(outer, nullptr);
  WalkCapture capture;
  ASSERT_TRUE(CurrentStackBounds(capture.bounds));
  DwarfTestCallThrough(outer, &DwarfTestCapture, &capture);

  const std::vector<std::string> names = Names(std::span<const uintptr_t>(
      capture.dwarf.data(), capture.dwarf_result.depth));
  ASSERT_GE(names.size(), 5u) << Joined(names);
  EXPECT_EQ(names[0], "DwarfTestCapture") << Joined(names);
  EXPECT_EQ(names[1], "DwarfLibCallMiddle") << Joined(names);
  EXPECT_EQ(names[2], "DwarfLibCallOuter") << Joined(names);
  EXPECT_EQ(names[3], "DwarfTestCallThrough") << Joined(names);
  EXPECT_THAT(names, Contains("main")) << Joined(names);
  EXPECT_FALSE(capture.dwarf_result.truncated) << Joined(names);

  // Frame pointers cannot get through the library's scrambled rbp.
  const std::vector<std::string> fp_names = Names(
      std::span<const uintptr_t>(capture.fp.data(), capture.fp_result.depth));
  EXPECT_THAT(fp_names, ::testing::Not(Contains("main"))) << Joined(fp_names);
}

struct SignalCapture {
  StackBounds bounds;
  std::array<uintptr_t, 256> from_handler{};
  UnwindResult handler_result;
  std::array<uintptr_t, 256> from_context{};
  UnwindResult context_result;
};
SignalCapture g_signal_capture;

extern "C" __attribute__((noinline)) void DwarfTestSignalHandler(int, siginfo_t*,
                                                                 void* uc) {
  SignalCapture& c = g_signal_capture;
  uintptr_t local = 0;
  asm volatile("" : : "r"(&local) : "memory");
  const RegisterState regs{CallerPc(), Addr(&local),
                           Addr(__builtin_frame_address(0))};
  c.handler_result = DwarfUnwinder().UnwindFrom(regs, c.bounds, c.from_handler);
  c.context_result = DwarfUnwinder().Unwind(uc, c.bounds, c.from_context);
}

TEST(DwarfUnwinderTest, WalksThroughTheKernelSignalFrame) {
  LibraryCopy lib("signal");
  ASSERT_TRUE(lib.Open()) << dlerror();
  DwarfUnwinder::RefreshModules();
  auto raise_fn = lib.Symbol<int (*)(int)>("DwarfLibRaise");
  ASSERT_NE(raise_fn, nullptr);
  ASSERT_TRUE(CurrentStackBounds(g_signal_capture.bounds));
  struct sigaction action = {}, old = {};
  action.sa_sigaction = &DwarfTestSignalHandler;
  action.sa_flags = SA_SIGINFO;
  sigemptyset(&action.sa_mask);
  ASSERT_EQ(sigaction(SIGUSR2, &action, &old), 0);
  DwarfTestRaiseThrough(raise_fn, SIGUSR2);
  sigaction(SIGUSR2, &old, nullptr);

  const SignalCapture& c = g_signal_capture;
  const std::vector<std::string> context = Names(std::span<const uintptr_t>(
      c.from_context.data(), c.context_result.depth));
  EXPECT_FALSE(c.context_result.truncated) << Joined(context);
  EXPECT_THAT(context, Contains("DwarfLibRaise")) << Joined(context);
  EXPECT_THAT(context, Contains("DwarfTestRaiseThrough")) << Joined(context);
  EXPECT_THAT(context, Contains("main")) << Joined(context);

  // From inside the handler: the handler, the trampoline, then exactly the
  // interrupted stack (its first pc is exact, taken from the ucontext).
  const std::vector<std::string> handler = Names(std::span<const uintptr_t>(
      c.from_handler.data(), c.handler_result.depth));
  EXPECT_FALSE(c.handler_result.truncated) << Joined(handler);
  ASSERT_GE(c.handler_result.depth, c.context_result.depth + 2) << Joined(handler);
  EXPECT_EQ(handler[0], "DwarfTestSignalHandler");
  const size_t k = c.handler_result.depth - c.context_result.depth;
  EXPECT_TRUE(std::equal(c.from_context.begin(),
                         c.from_context.begin() + c.context_result.depth,
                         c.from_handler.begin() + k))
      << Joined(handler) << "\nvs\n" << Joined(context);
}

// --- Module tracking ---------------------------------------------------------------

TEST(DwarfUnwinderTest, RebuildsOnlyWhenModulesChangeAndCachesTables) {
  DwarfUnwinder::RefreshModules();
  const DwarfUnwinderStats before = DwarfUnwinder::Stats();
  EXPECT_GT(before.modules.size(), 3u);  // the program, libc, libstdc++, ...
  EXPECT_GT(before.rows, 0u);
  DwarfUnwinder::RefreshModules();
  const DwarfUnwinderStats same = DwarfUnwinder::Stats();
  EXPECT_EQ(same.rebuilds, before.rebuilds);
  EXPECT_EQ(same.tables_built, before.tables_built);
  EXPECT_EQ(same.refreshes, before.refreshes + 1);

  LibraryCopy lib("cache");
  ASSERT_TRUE(lib.Open()) << dlerror();
  DwarfUnwinder::RefreshModules();
  const DwarfUnwinderStats loaded = DwarfUnwinder::Stats();
  EXPECT_EQ(loaded.rebuilds, before.rebuilds + 1);
  EXPECT_EQ(loaded.tables_built, before.tables_built + 1);  // only the new one
  EXPECT_TRUE(HasModule(loaded, lib.path()));

  lib.Close();
  DwarfUnwinder::RefreshModules();
  EXPECT_FALSE(HasModule(DwarfUnwinder::Stats(), lib.path()));
  // Loaded again: the table comes from the cache.
  ASSERT_TRUE(lib.Open()) << dlerror();
  DwarfUnwinder::RefreshModules();
  const DwarfUnwinderStats again = DwarfUnwinder::Stats();
  EXPECT_TRUE(HasModule(again, lib.path()));
  EXPECT_EQ(again.tables_built, loaded.tables_built);
  // No handler is walking: replaced snapshots were freed.
  EXPECT_EQ(again.retired_snapshots, 0u);
  for (const auto& m : again.modules) {
    std::printf("%8zu rows %9zu bytes %9zu text  %s\n", m.rows, m.table_bytes,
                m.text_bytes, m.path.c_str());
  }
  std::printf("total: %zu modules, %zu rows, %zu bytes; cache %zu tables, "
              "%zu bytes; last rebuild %.3f s\n",
              again.modules.size(), again.rows, again.table_bytes,
              again.cached_tables, again.cached_bytes,
              again.last_rebuild_seconds);
}

// Snapshots are replaced while other threads walk: a walk never sees a
// freed table, and once the walkers stop the replaced snapshots are freed.
TEST(DwarfUnwinderTest, RefreshesWhileOtherThreadsWalk) {
  DwarfUnwinder::RefreshModules();
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> walks{0};
  auto walker = [&] {
    StackBounds bounds;
    if (!CurrentStackBounds(bounds)) return;
    uintptr_t out[128];
    while (!stop.load(std::memory_order_relaxed)) {
      uintptr_t local = 0;
      asm volatile("" : : "r"(&local) : "memory");
      const RegisterState regs{CallerPc(), Addr(&local),
                               Addr(__builtin_frame_address(0))};
      const UnwindResult r = DwarfUnwinder().UnwindFrom(regs, bounds, out);
      if (r.depth < 2) ADD_FAILURE() << "walk of depth " << r.depth;
      walks.fetch_add(1, std::memory_order_relaxed);
    }
  };
  std::thread a(walker), b(walker);
  const uint64_t rebuilds = DwarfUnwinder::Stats().rebuilds;
  for (int i = 0; i < 40; ++i) {
    LibraryCopy lib("churn");
    ASSERT_TRUE(lib.Open()) << dlerror();
    DwarfUnwinder::RefreshModules();
    lib.Close();
    DwarfUnwinder::RefreshModules();
  }
  stop = true;
  a.join();
  b.join();
  EXPECT_GT(walks.load(), 0u);
  const DwarfUnwinderStats stats = DwarfUnwinder::Stats();
  EXPECT_GE(stats.rebuilds, rebuilds + 80);
  DwarfUnwinder::RefreshModules();  // no walker left: frees what is retired
  EXPECT_EQ(DwarfUnwinder::Stats().retired_snapshots, 0u);
  // Bounded: the 40 copies' tables are not all kept.
  EXPECT_LE(DwarfUnwinder::Stats().cached_tables,
            DwarfUnwinder::Stats().modules.size() +
                DwarfUnwinder::Stats().modules_without_cfi + 16);
}

}  // namespace
}  // namespace inprof

namespace inprof {
namespace {

// Waits in read() on `fd` until a byte arrives: the frame the copy's walk
// must name.
extern "C" __attribute__((noinline)) int DwarfTestWaitInRead(int fd) {
  char c = 0;
  const ssize_t n = read(fd, &c, 1);
  asm volatile("" : : : "memory");  // not a tail call
  return static_cast<int>(n);
}

// The walk a signal's handler takes of the waiting thread, to compare with.
StackBounds g_signal_walk_bounds;
std::array<uintptr_t, 64> g_signal_walk_pcs;
UnwindResult g_signal_walk;
std::atomic<bool> g_signal_walked{false};
void WalkInHandler(int, siginfo_t*, void* ucontext) {
  g_signal_walk = DwarfUnwinder().Unwind(ucontext, g_signal_walk_bounds, g_signal_walk_pcs);
  g_signal_walked.store(true);
}

// The wall sampler's way to a waiting thread's stack without a signal: the
// thread's sp and pc from /proc/self/task/TID/syscall, a copy of its stack
// from there up, and a walk of the copy that never reads the real stack. It
// gives the stack a signal's handler walks there (this file is built with
// frame pointers at -O0: the first frame keeping its CFA in rbp gets it
// from its frame record).
TEST(DwarfUnwinderTest, WalksACopyOfAThreadWaitingInASystemCall) {
  DwarfUnwinder::RefreshModules();
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  std::atomic<pid_t> tid{0};
  StackBounds bounds;
  std::thread waiter([&] {
    StackBounds b;
    ASSERT_TRUE(CurrentStackBounds(b));
    bounds = b;
    g_signal_walk_bounds = b;
    tid.store(static_cast<pid_t>(syscall(SYS_gettid)));
    EXPECT_EQ(DwarfTestWaitInRead(fds[0]), 1);
  });
  while (tid.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  internal::SyscallSite site;
  for (int i = 0; i < 2000 && site.nr != SYS_read; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    site = internal::ThreadSyscallSite(tid.load());
  }
  ASSERT_EQ(site.nr, SYS_read);
  ASSERT_GE(site.sp, bounds.lo);
  ASSERT_LT(site.sp, bounds.hi);
  std::vector<uint64_t> copy((bounds.hi - site.sp) / 8);
  ASSERT_EQ(internal::CopyOwnMemory(getpid(), site.sp, copy.size() * 8, copy.data()), 0);
  std::array<uintptr_t, 64> pcs{};
  const UnwindResult r = DwarfUnwinder().UnwindCopy(site.pc, site.sp, copy, pcs);
  // The copy, not the stack, was walked: a copy of zeros ends at once.
  std::vector<uint64_t> zeros(copy.size(), 0);
  std::array<uintptr_t, 64> zero_pcs{};
  const UnwindResult z = DwarfUnwinder().UnwindCopy(site.pc, site.sp, zeros, zero_pcs);
  // The same thread walked by a handler (SA_RESTART: its read goes on).
  struct sigaction sa {}, old_sa{};
  sa.sa_sigaction = WalkInHandler;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  ASSERT_EQ(sigaction(SIGUSR2, &sa, &old_sa), 0);
  ASSERT_EQ(syscall(SYS_tgkill, getpid(), tid.load(), SIGUSR2), 0);
  for (int i = 0; i < 5000 && !g_signal_walked.load(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(write(fds[1], "x", 1), 1);
  waiter.join();
  close(fds[0]);
  close(fds[1]);

  const std::vector<std::string> names =
      Names(std::span<const uintptr_t>(pcs.data(), r.depth));
  sigaction(SIGUSR2, &old_sa, nullptr);
  ASSERT_TRUE(g_signal_walked.load());
  EXPECT_FALSE(g_signal_walk.truncated);
  // Whatever the build, the copy's frames from the waiting function up are
  // the handler's (a complete walk all of them, a truncated one a prefix):
  // never a complete walk of another stack. Below it a sanitizer's
  // interceptor of read() may stand, and ThreadSanitizer runs the handler
  // from the interceptor, not at the interrupted call.
  auto from_waiter = [](std::span<const uintptr_t> frames) {
    for (size_t i = 1; i < frames.size(); ++i) {
      if (NameOf(frames[i]) == "DwarfTestWaitInRead") {
        return std::vector<uintptr_t>(frames.begin() + i, frames.end());
      }
    }
    return std::vector<uintptr_t>();
  };
  const std::vector<uintptr_t> handler =
      from_waiter(std::span<const uintptr_t>(g_signal_walk_pcs.data(), g_signal_walk.depth));
  const std::vector<uintptr_t> copied =
      from_waiter(std::span<const uintptr_t>(pcs.data(), r.depth));
  ASSERT_FALSE(handler.empty());
  ASSERT_LE(copied.size(), handler.size()) << Joined(names);
  EXPECT_TRUE(std::equal(copied.begin(), copied.end(), handler.begin())) << Joined(names);
  if (!r.truncated) {
    EXPECT_EQ(copied, handler) << Joined(names);
  }
#if defined(INPROF_ASAN)
  // read() goes through AddressSanitizer's interceptor, which keeps its
  // caller's (frame, pc) below its own frame record: two candidates for the
  // record, so the walk stops rather than guess (the wall sampler signals).
  EXPECT_TRUE(r.truncated) << Joined(names);
#else
  EXPECT_FALSE(r.truncated) << Joined(names);
  EXPECT_FALSE(copied.empty()) << Joined(names);
#endif
#if !defined(INPROF_ASAN) && !defined(INPROF_TSAN)
  // Without an interceptor: the same frames from the first return address.
  // The handler's pc is the `syscall` instruction (the kernel moved it back
  // to restart the call), /proc's the one after it (2 bytes on x86-64).
  EXPECT_LE(pcs[0] - g_signal_walk_pcs[0], 2u);
  EXPECT_EQ(std::vector<uintptr_t>(pcs.begin() + 1, pcs.begin() + r.depth),
            std::vector<uintptr_t>(g_signal_walk_pcs.begin() + 1,
                                   g_signal_walk_pcs.begin() + g_signal_walk.depth))
      << Joined(names);
  ASSERT_GE(names.size(), 2u);
  EXPECT_EQ(names[1], "DwarfTestWaitInRead") << Joined(names);
#endif
  EXPECT_LE(z.depth, 2u);
}

TEST(DwarfUnwinderTest, CopyingMemoryThatIsNotMappedFailsWithEfault) {
  const long page = sysconf(_SC_PAGESIZE);
  void* p = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  ASSERT_EQ(munmap(p, page), 0);
  uint64_t out[4];
  EXPECT_EQ(internal::CopyOwnMemory(getpid(), reinterpret_cast<uintptr_t>(p), sizeof(out), out),
            EFAULT);
  uint64_t here[4] = {1, 2, 3, 4};
  EXPECT_EQ(internal::CopyOwnMemory(getpid(), reinterpret_cast<uintptr_t>(here), sizeof(out), out), 0);
  EXPECT_EQ(out[3], 4u);
}

}  // namespace
}  // namespace inprof
