// inprof/dwarf_unwinder.h: unwinds code built without frame pointers, from
// the modules' call-frame information (CFI).
//
// Off the hot path, RefreshModules() interprets each loaded module's
// .eh_frame (and .debug_frame where .eh_frame has no entry) once with
// elfutils libdw, flattens it into a sorted table of rows (CFA = sp or fp +
// offset, return address at CFA - 8, where the caller's rbp was saved), and
// publishes an immutable snapshot of all modules' tables through an atomic
// pointer. In the signal handler, Unwind() binary-searches the row of each
// pc and steps to the caller, every read checked against the thread's stack
// bounds; a pc without CFI gets one frame-pointer step if rbp looks like a
// frame record, otherwise the walk ends truncated. Rows whose CFI marks the
// return address undefined (_start, the thread entry) end it complete, and
// rt_sigreturn trampolines (the 'S' augmentation) are stepped through by
// reading the interrupted registers from the saved ucontext.
//
// Thread-safety: Unwind/UnwindFrom are async-signal-safe: no allocation, no
// locks, no dl_iterate_phdr, no libunwind/libgcc, and never a fault.
// RefreshModules and Stats may be called from any thread (they take a
// mutex; never from a signal handler). A Profiler calls RefreshModules on
// its collector thread, first right after Start() (which so returns without
// building any table: walks before the first snapshot follow frame pointers
// and are counted, WalksWithoutTables; the rings are drained between two
// tables) and then on every pass, so modules dlopen()ed later are unwound
// from the pass after they were loaded.
//
// Example:
//   inprof::DwarfProfiler profiler(inprof::Options::FromEnv());
//   inprof::ScopedProfiler running(profiler);
//   auto self = profiler.RegisterThread("main");
//   // or directly:
//   inprof::DwarfUnwinder::RefreshModules();
//   uintptr_t pcs[64];
//   auto r = inprof::DwarfUnwinder().UnwindFrom({pc, sp, fp}, bounds, pcs);
#ifndef INPROF_DWARF_UNWINDER_H_
#define INPROF_DWARF_UNWINDER_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "inprof/internal/cfi_table.h"
#include "inprof/internal/cfi_walk.h"
#include "inprof/internal/machine_context.h"
#include "inprof/unwinder.h"

namespace inprof {

// What the DWARF unwinder holds (DwarfUnwinder::Stats()).
struct DwarfUnwinderStats {
  struct Module {
    std::string path;         // file the table was built from
    uintptr_t load_address;   // runtime address of its first executable byte
    size_t text_bytes = 0;    // size of its executable range
    size_t rows = 0;          // table rows (one per CFI row change)
    size_t rules = 0;         // distinct rules the rows point to
    size_t table_bytes = 0;   // memory of its table
  };
  std::vector<Module> modules;    // in the current snapshot, by address
  size_t modules_without_cfi = 0; // loaded, but no usable table
  size_t modules_pending = 0;     // loaded, table not built yet (on demand)
  // Of those, the ones walks meanwhile answer from their .eh_frame (see
  // CfiModuleTable::PendingFromFile), and the frames so answered (cache
  // misses, since the process started).
  std::vector<std::string> pending_from_eh_frame;
  uint64_t eh_frame_lookups = 0;
  size_t rows = 0;                // sums over `modules`
  size_t table_bytes = 0;
  size_t cached_tables = 0;       // built tables kept (current + recently unloaded)
  size_t cached_bytes = 0;
  size_t retired_snapshots = 0;   // replaced, waiting for readers to leave
  uint64_t refreshes = 0;         // RefreshModules calls
  uint64_t rebuilds = 0;          // calls that found the module list changed
  uint64_t tables_built = 0;      // module tables built (cache misses)
  double last_rebuild_seconds = 0;  // time of the latest rebuild
};

class DwarfUnwinder {
 public:
  static constexpr const char* kName = "dwarf";

  // True on x86-64 Linux, the architecture whose CFI rules the walk models.
  static constexpr bool Supported() noexcept {
    return internal::kMachineContextSupported && internal::kCfiWalkSupported;
  }

  // The most stack a walk uses (DeclaresStackUse). Its deepest path is a
  // lookup in a module answered from its .eh_frame (PendingFromFile),
  // which runs the FDE's program; GCC 12 -fstack-usage at -O2: CfiWalk 192
  // + FindSlow 24 + FindDirectSlow 32 + FindWordDirect 1600 + Execute 1280
  // + DirectRule 608 + EvaluateCfaOffset 152 = 3,888 bytes. The margin is
  // for other compilers and flags (tests/safety/safety_small_stack_test.cc
  // measures the handler).
  static constexpr size_t kMaxStackBytes = 5 * 1024;

  // Walks from a signal handler's ucontext. Async-signal-safe.
  UnwindResult Unwind(const void* ucontext, const StackBounds& bounds,
                      std::span<uintptr_t> out) const noexcept {
    return UnwindFrom(internal::RegistersFromContext(ucontext), bounds, out);
  }

  // Walks from explicit registers (tests, benchmarks). Before the first
  // RefreshModules() it follows frame pointers only. Async-signal-safe.
  UnwindResult UnwindFrom(const RegisterState& regs, const StackBounds& bounds,
                          std::span<uintptr_t> out) const noexcept {
    internal::CfiReadGuard guard;
    if (guard.snapshot() == nullptr) {  // the walk counts pending modules
      internal::g_cfi_state.walks_without_tables.fetch_add(
          1, std::memory_order_relaxed);
    }
    return internal::CfiWalk(guard.snapshot(), regs, bounds, out);
  }

  // Walks the stack of another thread that is stopped in a system call,
  // from a copy of it: `copy` holds the words from `sp` up (the copy of
  // [sp, sp + 8 * copy.size())), `pc` and `sp` are where the thread stopped
  // (/proc/self/task/TID/syscall). Its frame pointer is not known: a frame
  // whose CFA is based on it, before a callee's save slot gave its value,
  // ends the walk truncated. Reads only the copy. Async-signal-safe.
  static constexpr bool kWalksStackCopies = true;
  UnwindResult UnwindCopy(uintptr_t pc, uintptr_t sp,
                          std::span<const uint64_t> copy,
                          std::span<uintptr_t> out) const noexcept {
    internal::CfiReadGuard guard;
    if (guard.snapshot() == nullptr) {
      internal::g_cfi_state.walks_without_tables.fetch_add(
          1, std::memory_order_relaxed);
    }
    const StackBounds bounds{sp, sp + copy.size() * sizeof(uint64_t)};
    return internal::CfiWalk(
        guard.snapshot(), RegisterState{pc, sp, 0}, bounds, out,
        reinterpret_cast<uintptr_t>(copy.data()) - sp,
        /*fp_known_at_start=*/false);
  }

  // Walks so far that found no tables yet or met a module whose table was
  // not built yet, and took frame-pointer steps there (the profile's
  // comments report them).
  static uint64_t WalksWithoutTables() noexcept {
    return internal::g_cfi_state.walks_without_tables.load(
        std::memory_order_relaxed);
  }

  // True once the first build is complete: every module loaded then has
  // its table published. Async-signal-safe.
  static bool TablesReady() noexcept {
    internal::CfiReadGuard guard;
    return guard.snapshot() != nullptr && !guard.snapshot()->partial;
  }

  // Changes when a rebuild (modules loaded or unloaded, or tables built on
  // demand) publishes its snapshot; 0 before the first. Async-signal-safe.
  static uint64_t TablesGeneration() noexcept {
    internal::CfiReadGuard guard;
    return guard.snapshot() != nullptr ? guard.snapshot()->generation() : 0;
  }

  // Rebuilds the snapshot if modules were loaded or unloaded since the last
  // call (dl_iterate_phdr's adds/subs counters); a module's table is built
  // once and reused while it stays loaded (and for a few unloads after).
  // Cheap when nothing changed. Not async-signal-safe.
  static void RefreshModules();
  // The same, calling `between_tables` after each table it builds and every
  // 5 ms within one (a Profiler drains its sample rings there: a first build
  // takes tens of milliseconds, a second under a sanitizer). When it returns false the build
  // stops there; the next call resumes it. With `on_demand` (a Profiler's
  // collector), only the program's, the C/C++ runtimes', the vDSO's and a
  // sanitizer runtime's tables are built at once; any other module gets its
  // table on the first refresh after a walk met it (it walks by frame
  // pointers until then, counted in WalksWithoutTables): a program that
  // loads 50 libraries and runs in a few pays for the few.
  static void RefreshModules(absl::FunctionRef<bool()> between_tables,
                             bool on_demand = false);

  // The current tables and counters. Not async-signal-safe.
  static DwarfUnwinderStats Stats();
};

static_assert(Unwinder<DwarfUnwinder>);
static_assert(DeclaresStackUse<DwarfUnwinder>);
// What the Profiler uses it for: a renamed member fails here, not by
// quietly turning a capability off.
static_assert(RefreshesModulesBetweenTables<DwarfUnwinder>);
static_assert(BuildsTablesLazily<DwarfUnwinder>);
static_assert(WalksStackCopies<DwarfUnwinder>);

}  // namespace inprof

#endif  // INPROF_DWARF_UNWINDER_H_
