// OsUnwinder and ThreadSnapshotter under Wine: a suspended thread's stack
// copied and walked after it runs on, through code without frame pointers;
// bad input (a gone thread, a stack pointer outside the stack, a corrupt
// copy) gives an outcome or a truncated walk, never a crash.
#include "inprof/windows/os_unwinder_windows.h"

#include <windows.h>

#include <atomic>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "inprof/internal/thread_snapshot_windows.h"
#include "inprof/internal/unwind_snapshot_windows.h"
#include "windows_workload.h"

namespace inprof {
namespace {

std::string ModuleOf(uintptr_t pc) {
  HMODULE module = nullptr;
  if (!GetModuleHandleExA(GET_MODULE_HANDLE_EX_FLAG_FROM_ADDRESS |
                              GET_MODULE_HANDLE_EX_FLAG_UNCHANGED_REFCOUNT,
                          reinterpret_cast<LPCSTR>(pc), &module)) {
    return "";
  }
  char name[MAX_PATH] = {};
  GetModuleFileNameA(module, name, sizeof(name));
  std::string s = name;
  const size_t slash = s.find_last_of("\\/");
  if (slash != std::string::npos) s.erase(0, slash + 1);
  for (char& c : s) c = static_cast<char>(tolower(static_cast<unsigned char>(c)));
  return s;
}

// A thread spinning 40 frames deep in code without frame pointers, with its
// handle and stack bounds, until destroyed.
class DeepThread {
 public:
  DeepThread() {
    thread_ = std::thread([this] {
      ULONG_PTR lo = 0, hi = 0;
      GetCurrentThreadStackLimits(&lo, &hi);
      bounds_ = StackBounds{lo, hi};
      DuplicateHandle(GetCurrentProcess(), GetCurrentThread(), GetCurrentProcess(), &handle_,
                      THREAD_SUSPEND_RESUME | THREAD_GET_CONTEXT | THREAD_QUERY_INFORMATION,
                      FALSE, 0);
      ready_ = true;
      while (!stop_) testing::BurnDeep(40, 5'000'000);
    });
    while (!ready_) Sleep(1);
    Sleep(50);  // well inside the recursion
  }
  ~DeepThread() {
    stop_ = true;
    thread_.join();
    CloseHandle(handle_);
  }
  HANDLE handle() const { return handle_; }
  const StackBounds& bounds() const { return bounds_; }

 private:
  std::atomic<bool> ready_{false}, stop_{false};
  HANDLE handle_ = nullptr;
  StackBounds bounds_;
  std::thread thread_;
};

TEST(OsUnwinderTest, WalksACopiedStackThroughCodeWithoutFramePointers) {
  DeepThread deep;
  internal::ThreadSnapshotter snapshotter;
  OsUnwinder unwinder;
  int complete = 0;
  for (int round = 0; round < 20; ++round) {
    ASSERT_EQ(snapshotter.Capture(deep.handle(), deep.bounds()), internal::SnapshotOutcome::kOk);
    Sleep(2);  // the thread runs on and rewrites its stack; the copy stays
    uintptr_t frames[512];
    const UnwindResult first = unwinder.Unwind(snapshotter.snapshot(), deep.bounds(), frames);
    uintptr_t again[512];
    const UnwindResult second = unwinder.Unwind(snapshotter.snapshot(), deep.bounds(), again);
    ASSERT_EQ(first.depth, second.depth);
    EXPECT_EQ(std::memcmp(frames, again, first.depth * sizeof(uintptr_t)), 0);
    EXPECT_EQ(frames[0], snapshotter.pc());
    // 41 recursion frames + the chain + the thread's start; the outermost
    // frames are the system's thread start (kernel32, ntdll).
    if (first.depth >= 45 && !first.truncated &&
        ModuleOf(frames[first.depth - 1]) == "ntdll.dll") {
      ++complete;
    }
  }
  // A snapshot taken while the thread is in the clock read (a system call)
  // walks out of ntdll too; every one must be complete.
  EXPECT_EQ(complete, 20);
}

TEST(OsUnwinderTest, AStackPointerOutsideTheStackGivesThePcOnly) {
  DeepThread deep;
  internal::ThreadSnapshotter snapshotter;
  const StackBounds elsewhere{0x1000, 0x2000};
  ASSERT_EQ(snapshotter.Capture(deep.handle(), elsewhere), internal::SnapshotOutcome::kNoStack);
  uintptr_t frames[16];
  const UnwindResult r = OsUnwinder().Unwind(snapshotter.snapshot(), elsewhere, frames);
  EXPECT_EQ(r.depth, 1u);
  EXPECT_TRUE(r.truncated);
  EXPECT_NE(frames[0], 0u);
}

TEST(OsUnwinderTest, AThreadThatExitedCannotBeSuspended) {
  HANDLE handle = nullptr;
  std::thread t([&] {
    DuplicateHandle(GetCurrentProcess(), GetCurrentThread(), GetCurrentProcess(), &handle,
                    THREAD_SUSPEND_RESUME | THREAD_GET_CONTEXT | THREAD_QUERY_INFORMATION,
                    FALSE, 0);
  });
  t.join();
  ASSERT_NE(handle, nullptr);
  internal::ThreadSnapshotter snapshotter;
  const internal::SnapshotOutcome outcome =
      snapshotter.Capture(handle, StackBounds{0, ~uintptr_t{0}});
  EXPECT_TRUE(outcome == internal::SnapshotOutcome::kCannotSuspend ||
              outcome == internal::SnapshotOutcome::kNoContext)
      << internal::SnapshotOutcomeName(outcome);
  CloseHandle(handle);
}

TEST(OsUnwinderTest, CorruptStacksEndTheWalkWithoutAFault) {
  // Snapshots whose stack words are garbage: small numbers, addresses in
  // the copy, in code, anywhere. Each walk ends, truncated or not, and
  // never reads outside the copy (a fault would end the test program).
  std::vector<uint8_t> buffer(64 * 1024 + internal::UnwindSnapshot::kGuardBytes);
  internal::UnwindSnapshot s;
  s.copy = buffer.data();
  s.capacity = 64 * 1024;
  std::mt19937_64 random(42);
  const uint64_t code = reinterpret_cast<uint64_t>(&testing::BurnA);
  for (int round = 0; round < 2000; ++round) {
    std::memset(&s.context, 0, sizeof(s.context));
    RtlCaptureContext(&s.context);
    s.has_context = true;
    s.size = 1024 + random() % (60 * 1024);
    s.size &= ~size_t{7};
    s.original_sp = 0x7fff0000 + (random() % 4096) * 8;
    auto* words = reinterpret_cast<uint64_t*>(s.copy);
    for (size_t i = 0; i < s.size / 8; ++i) {
      switch (random() % 5) {
        case 0: words[i] = random(); break;
        case 1: words[i] = s.original_sp + (random() % s.size); break;
        case 2: words[i] = code + random() % 4096; break;
        case 3: words[i] = 0; break;
        default: words[i] = random() % 65536; break;
      }
    }
    s.context.Rsp = s.original_sp + (random() % 64) * 8;
    s.context.Rbp = random() % 2 ? s.original_sp + random() % s.size : random();
    s.context.Rip = random() % 2 ? code + random() % 256 : random();
    internal::RelocateStackPointers(s);
    uintptr_t frames[512];
    const UnwindResult r =
        OsUnwinder().Unwind(&s, StackBounds{s.original_sp, s.original_sp + s.size}, frames);
    ASSERT_GE(r.depth, 1u);
    ASSERT_LE(r.depth, 512u);
  }
}

}  // namespace
}  // namespace inprof
