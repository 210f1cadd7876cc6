#include "inprof/frame_pointer_unwinder.h"

#include <pthread.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "gtest/gtest.h"
#include "inprof/unwinder.h"

namespace inprof {
namespace {

uintptr_t Addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// A fake stack: 64 words whose frame records the tests link by hand. Record
// i occupies words [i] (the caller's fp) and [i + 1] (the return address).
class FakeStack {
 public:
  static constexpr size_t kWords = 64;

  uintptr_t fp(size_t i) const { return Addr(&words_[i]); }
  uintptr_t sp() const { return Addr(&words_[0]); }
  StackBounds bounds() const {
    return {Addr(&words_[0]), Addr(&words_[0] + kWords)};
  }

  // Writes record i: next fp (0 ends the chain) and return address.
  void Record(size_t i, uintptr_t next_fp, uintptr_t return_address) {
    words_[i] = next_fp;
    words_[i + 1] = return_address;
  }

  // Links records at the given indices, innermost first, each returning to
  // 0x1000 * (position + 1); the outermost record's next fp is 0.
  std::vector<uintptr_t> Chain(const std::vector<size_t>& at) {
    std::vector<uintptr_t> returns;
    for (size_t k = 0; k < at.size(); ++k) {
      const uintptr_t next = k + 1 < at.size() ? fp(at[k + 1]) : 0;
      returns.push_back(0x1000 * (k + 1));
      Record(at[k], next, returns.back());
    }
    return returns;
  }

 private:
  alignas(16) uint64_t words_[kWords] = {};
};

constexpr uintptr_t kPc = 0x400123;

std::vector<uintptr_t> Frames(std::span<const uintptr_t> out,
                              const UnwindResult& r) {
  return {out.begin(), out.begin() + static_cast<ptrdiff_t>(r.depth)};
}

TEST(FramePointerUnwinderTest, CleanChainGivesEveryReturnAddress) {
  FakeStack stack;
  const std::vector<uintptr_t> returns = stack.Chain({4, 10, 20, 30});
  uintptr_t out[16] = {};
  const UnwindResult r = FramePointerUnwinder().UnwindFrom(
      {kPc, stack.sp(), stack.fp(4)}, stack.bounds(), out);
  EXPECT_FALSE(r.truncated);
  std::vector<uintptr_t> expected = {kPc};
  expected.insert(expected.end(), returns.begin(), returns.end());
  EXPECT_EQ(Frames(out, r), expected);
}

TEST(FramePointerUnwinderTest, NullFramePointerGivesOnlyThePc) {
  FakeStack stack;
  uintptr_t out[4] = {};
  const UnwindResult r = FramePointerUnwinder().UnwindFrom(
      {kPc, stack.sp(), 0}, stack.bounds(), out);
  EXPECT_FALSE(r.truncated);
  EXPECT_EQ(Frames(out, r), std::vector<uintptr_t>({kPc}));
}

TEST(FramePointerUnwinderTest, ZeroReturnAddressEndsWalkComplete) {
  FakeStack stack;
  // The thread-entry convention: the outermost record holds a zero return
  // address (and possibly a stale fp that must not be followed).
  stack.Record(4, stack.fp(10), 0x1000);
  stack.Record(10, stack.fp(20), 0);
  stack.Record(20, 0, 0x3000);
  uintptr_t out[8] = {};
  const UnwindResult r = FramePointerUnwinder().UnwindFrom(
      {kPc, stack.sp(), stack.fp(4)}, stack.bounds(), out);
  EXPECT_FALSE(r.truncated);
  EXPECT_EQ(Frames(out, r), std::vector<uintptr_t>({kPc, 0x1000}));
}

TEST(FramePointerUnwinderTest, DepthLimitTruncatesAtSpanSize) {
  FakeStack stack;
  const std::vector<uintptr_t> returns = stack.Chain({4, 10, 20, 30});
  // Sentinels after the span show the walk never writes past it.
  std::array<uintptr_t, 8> buffer;
  buffer.fill(0xdead);
  const UnwindResult r = FramePointerUnwinder().UnwindFrom(
      {kPc, stack.sp(), stack.fp(4)}, stack.bounds(),
      std::span<uintptr_t>(buffer.data(), 3));
  EXPECT_TRUE(r.truncated);
  ASSERT_EQ(r.depth, 3u);
  EXPECT_EQ(Frames(buffer, r),
            std::vector<uintptr_t>({kPc, returns[0], returns[1]}));
  for (size_t i = 3; i < buffer.size(); ++i) EXPECT_EQ(buffer[i], 0xdeadu);
}

TEST(FramePointerUnwinderTest, SpanExactlyAsDeepAsChainIsNotTruncated) {
  FakeStack stack;
  stack.Chain({4, 10, 20, 30});
  uintptr_t out[5] = {};  // the pc and four return addresses
  const UnwindResult r = FramePointerUnwinder().UnwindFrom(
      {kPc, stack.sp(), stack.fp(4)}, stack.bounds(), out);
  EXPECT_FALSE(r.truncated);
  EXPECT_EQ(r.depth, 5u);
}

TEST(FramePointerUnwinderTest, EmptySpanWritesNothing) {
  FakeStack stack;
  stack.Chain({4, 10});
  const UnwindResult r = FramePointerUnwinder().UnwindFrom(
      {kPc, stack.sp(), stack.fp(4)}, stack.bounds(), {});
  EXPECT_EQ(r.depth, 0u);
}

TEST(FramePointerUnwinderTest, FramePointerOutsideBoundsStopsTruncated) {
  FakeStack stack;
  FakeStack elsewhere;  // readable memory, but not this thread's stack
  elsewhere.Record(4, 0, 0xbad);
  stack.Record(4, stack.fp(10), 0x1000);
  stack.Record(10, elsewhere.fp(4), 0x2000);
  uintptr_t out[8] = {};
  const UnwindResult r = FramePointerUnwinder().UnwindFrom(
      {kPc, stack.sp(), stack.fp(4)}, stack.bounds(), out);
  EXPECT_TRUE(r.truncated);
  EXPECT_EQ(Frames(out, r), std::vector<uintptr_t>({kPc, 0x1000, 0x2000}));

  // The first fp itself outside the bounds: only the pc.
  const UnwindResult first = FramePointerUnwinder().UnwindFrom(
      {kPc, stack.sp(), elsewhere.fp(4)}, stack.bounds(), out);
  EXPECT_TRUE(first.truncated);
  EXPECT_EQ(first.depth, 1u);
}

TEST(FramePointerUnwinderTest, RecordStraddlingTopOfStackStopsTruncated) {
  FakeStack stack;
  // A record at the last word would read one word past hi.
  const size_t last = FakeStack::kWords - 1;
  stack.Record(4, stack.fp(last), 0x1000);
  uintptr_t out[8] = {};
  const UnwindResult r = FramePointerUnwinder().UnwindFrom(
      {kPc, stack.sp(), stack.fp(4)}, stack.bounds(), out);
  EXPECT_TRUE(r.truncated);
  EXPECT_EQ(Frames(out, r), std::vector<uintptr_t>({kPc, 0x1000}));
}

TEST(FramePointerUnwinderTest, MisalignedFramePointerStopsTruncated) {
  FakeStack stack;
  stack.Record(4, stack.fp(10) + 4, 0x1000);
  stack.Record(10, 0, 0x2000);
  uintptr_t out[8] = {};
  const UnwindResult r = FramePointerUnwinder().UnwindFrom(
      {kPc, stack.sp(), stack.fp(4)}, stack.bounds(), out);
  EXPECT_TRUE(r.truncated);
  EXPECT_EQ(Frames(out, r), std::vector<uintptr_t>({kPc, 0x1000}));

  const UnwindResult first = FramePointerUnwinder().UnwindFrom(
      {kPc, stack.sp(), stack.fp(4) + 1}, stack.bounds(), out);
  EXPECT_TRUE(first.truncated);
  EXPECT_EQ(first.depth, 1u);
}

TEST(FramePointerUnwinderTest, CycleStopsTruncated) {
  FakeStack stack;
  stack.Record(4, stack.fp(10), 0x1000);
  stack.Record(10, stack.fp(10), 0x2000);  // points to itself
  uintptr_t out[16] = {};
  const UnwindResult r = FramePointerUnwinder().UnwindFrom(
      {kPc, stack.sp(), stack.fp(4)}, stack.bounds(), out);
  EXPECT_TRUE(r.truncated);
  EXPECT_EQ(Frames(out, r), std::vector<uintptr_t>({kPc, 0x1000, 0x2000}));
}

TEST(FramePointerUnwinderTest, DownwardPointerStopsTruncated) {
  FakeStack stack;
  stack.Record(4, stack.fp(20), 0x1000);
  stack.Record(20, stack.fp(10), 0x2000);  // back down the stack
  stack.Record(10, stack.fp(20), 0x3000);  // which would loop forever
  uintptr_t out[16] = {};
  const UnwindResult r = FramePointerUnwinder().UnwindFrom(
      {kPc, stack.sp(), stack.fp(4)}, stack.bounds(), out);
  EXPECT_TRUE(r.truncated);
  EXPECT_EQ(Frames(out, r), std::vector<uintptr_t>({kPc, 0x1000, 0x2000}));
}

TEST(FramePointerUnwinderTest, OverlappingNextRecordStopsTruncated) {
  FakeStack stack;
  // One word up overlaps the current record: not strictly above it.
  stack.Record(4, stack.fp(5), 0x1000);
  uintptr_t out[16] = {};
  const UnwindResult r = FramePointerUnwinder().UnwindFrom(
      {kPc, stack.sp(), stack.fp(4)}, stack.bounds(), out);
  EXPECT_TRUE(r.truncated);
  EXPECT_EQ(Frames(out, r), std::vector<uintptr_t>({kPc, 0x1000}));
}

TEST(FramePointerUnwinderTest, FramePointerBelowStackPointerStopsTruncated) {
  FakeStack stack;
  stack.Chain({4, 10});
  uintptr_t out[8] = {};
  // A record below the interrupted sp is dead stack, however it looks.
  const UnwindResult r = FramePointerUnwinder().UnwindFrom(
      {kPc, stack.fp(8), stack.fp(4)}, stack.bounds(), out);
  EXPECT_TRUE(r.truncated);
  EXPECT_EQ(Frames(out, r), std::vector<uintptr_t>({kPc}));
}

TEST(FramePointerUnwinderTest, UnmappedPageOutsideBoundsIsNeverRead) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* guard = mmap(nullptr, page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS,
                     -1, 0);
  ASSERT_NE(guard, MAP_FAILED);
  FakeStack stack;
  stack.Record(4, stack.fp(10), 0x1000);
  stack.Record(10, Addr(guard) + 64, 0x2000);  // reading it would fault
  uintptr_t out[8] = {};
  const UnwindResult r = FramePointerUnwinder().UnwindFrom(
      {kPc, stack.sp(), stack.fp(4)}, stack.bounds(), out);
  EXPECT_TRUE(r.truncated);
  EXPECT_EQ(Frames(out, r), std::vector<uintptr_t>({kPc, 0x1000, 0x2000}));

  const UnwindResult first = FramePointerUnwinder().UnwindFrom(
      {kPc, stack.sp(), Addr(guard)}, stack.bounds(), out);
  EXPECT_TRUE(first.truncated);
  EXPECT_EQ(first.depth, 1u);
  munmap(guard, page);
}

TEST(FramePointerUnwinderTest, HeapPointerStopsTruncated) {
  // A plausible record on the heap: following it would add 0xbad.
  auto heap = std::make_unique<uint64_t[]>(4);
  heap[0] = 0;
  heap[1] = 0xbad;
  FakeStack stack;
  stack.Record(4, Addr(heap.get()), 0x1000);
  uintptr_t out[8] = {};
  const UnwindResult r = FramePointerUnwinder().UnwindFrom(
      {kPc, stack.sp(), stack.fp(4)}, stack.bounds(), out);
  EXPECT_TRUE(r.truncated);
  EXPECT_EQ(Frames(out, r), std::vector<uintptr_t>({kPc, 0x1000}));
}

// ---------------------------------------------------------------------------
// A real walk through frames the compiler built (-fno-omit-frame-pointer).

StackBounds CurrentStackBounds() {
  pthread_attr_t attr;
  StackBounds bounds;
  if (pthread_getattr_np(pthread_self(), &attr) != 0) return bounds;
  void* addr = nullptr;
  size_t size = 0;
  if (pthread_attr_getstack(&attr, &addr, &size) == 0) {
    bounds = {Addr(addr), Addr(addr) + size};
  }
  pthread_attr_destroy(&attr);
  return bounds;
}

enum class Start { kRegisters, kUcontext };

struct Walk {
  uintptr_t pc = 0;
  UnwindResult result;
  uintptr_t frames[64] = {};
};

// One chain serves both starts, so identical-code folding has nothing to
// merge. The empty asm after each call keeps it from becoming a tail call
// (which would drop the caller's frame).
__attribute__((noinline, noclone)) void Inner(Start start, Walk* walk) {
  const FramePointerUnwinder unwinder;
  const StackBounds bounds = CurrentStackBounds();
  if (start == Start::kRegisters) {
    volatile char below_fp = 0;  // a local lies between sp and fp
    walk->pc = Addr(reinterpret_cast<const void*>(&Inner));
    walk->result = unwinder.UnwindFrom(
        {walk->pc, Addr(const_cast<const char*>(&below_fp)),
         Addr(__builtin_frame_address(0))},
        bounds, walk->frames);
  } else {
    ucontext_t uc;
    if (getcontext(&uc) != 0) return;
    walk->pc = internal::RegistersFromContext(&uc).pc;
    walk->result = unwinder.Unwind(&uc, bounds, walk->frames);
  }
  asm volatile("" ::: "memory");
}

__attribute__((noinline, noclone)) void Middle(Start start, Walk* walk) {
  Inner(start, walk);
  asm volatile("" ::: "memory");
}

__attribute__((noinline, noclone)) void Outer(Start start, Walk* walk) {
  Middle(start, walk);
  asm volatile("" ::: "memory");
}

// True when `address` is inside `fn`: among the chain's functions, `fn`
// starts closest below it, and within a generous 4 KiB of its start.
bool InFunction(uintptr_t address, const void* fn) {
  const uintptr_t starts[] = {Addr(reinterpret_cast<const void*>(&Inner)),
                              Addr(reinterpret_cast<const void*>(&Middle)),
                              Addr(reinterpret_cast<const void*>(&Outer))};
  uintptr_t best = 0;
  for (uintptr_t s : starts) {
    if (s < address && s > best) best = s;
  }
  return best == Addr(fn) && address - best < 4096;
}

const void* Fn(void (*f)(Start, Walk*)) { return reinterpret_cast<const void*>(f); }

TEST(FramePointerUnwinderTest, WalksRealFramesFromRegisters) {
  Walk walk;
  Outer(Start::kRegisters, &walk);
  ASSERT_GE(walk.result.depth, 4u);
  EXPECT_EQ(walk.frames[0], walk.pc);
  EXPECT_TRUE(InFunction(walk.frames[1], Fn(&Middle)))
      << std::hex << walk.frames[1];
  EXPECT_TRUE(InFunction(walk.frames[2], Fn(&Outer)))
      << std::hex << walk.frames[2];
  EXPECT_NE(walk.frames[3], 0u);  // the test body called Outer
}

TEST(FramePointerUnwinderTest, WalksRealFramesFromUcontext) {
  if (!FramePointerUnwinder::Supported()) GTEST_SKIP() << "no ucontext map";
  Walk walk;
  Outer(Start::kUcontext, &walk);
  ASSERT_GE(walk.result.depth, 4u);
  // getcontext records the registers at its call site inside Inner.
  EXPECT_EQ(walk.frames[0], walk.pc);
  EXPECT_TRUE(InFunction(walk.frames[0], Fn(&Inner)))
      << std::hex << walk.frames[0];
  EXPECT_TRUE(InFunction(walk.frames[1], Fn(&Middle)))
      << std::hex << walk.frames[1];
  EXPECT_TRUE(InFunction(walk.frames[2], Fn(&Outer)))
      << std::hex << walk.frames[2];
}

// ---------------------------------------------------------------------------
// The Unwinder concept.

struct NoUnwind {
  static constexpr const char* kName = "none";
  static bool Supported() noexcept { return true; }
};

struct ThrowingUnwind : NoUnwind {
  UnwindResult Unwind(const void*, const StackBounds&,
                      std::span<uintptr_t>) const {
    return {};
  }
};

struct NoName {
  static bool Supported() noexcept { return true; }
  UnwindResult Unwind(const void*, const StackBounds&,
                      std::span<uintptr_t>) const noexcept {
    return {};
  }
};

TEST(FramePointerUnwinderTest, ModelsUnwinderConcept) {
  static_assert(Unwinder<FramePointerUnwinder>);
  static_assert(!Unwinder<NoUnwind>);
  static_assert(!Unwinder<ThrowingUnwind>);  // not usable in a handler
  static_assert(!Unwinder<NoName>);
  EXPECT_STREQ(FramePointerUnwinder::kName, "frame-pointer");
}

}  // namespace
}  // namespace inprof
