// libFuzzer target: the DWARF unwinder's table builder
// (internal::BuildCfiTableFromFile, elfutils libdw's CFI interpreter
// underneath), which reads .eh_frame/.debug_frame of whatever file a loaded
// module names.
//
// The input is written to a memfd and built by path (/proc/self/fd/N) over
// the whole address range, then every row found is looked up again. Checked:
// nothing crashes; a failure is an error status naming the path; a table's
// rows lie inside the range it was built for; and the builder's own FDE
// interpreter gives the table libdw's interpreter gives, row for row (the
// fuzzer's ELF seeds are x86-64, so mutations reach the own interpreter);
// and lookups from .eh_frame before a table exists
// (CfiModuleTable::PendingFromFile) never fault.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "inprof/internal/cfi_table.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const int fd = memfd_create("inprof-fuzz-cfi", 0);
  if (fd < 0) std::abort();
  if (ftruncate(fd, 0) != 0) std::abort();
  if (size > 0 && pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) {
    std::abort();
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  constexpr uint64_t kLo = 0, kHi = uint64_t{1} << 32;
  auto table = inprof::internal::BuildCfiTableFromFile(path, kLo, kHi);
  inprof::internal::CfiBuildOptions reference;
  reference.interpreter = inprof::internal::CfiInterpreter::kLibdw;
  auto by_libdw = inprof::internal::BuildCfiTableFromFile(
      path, kLo, kHi, "", [] { return true; }, nullptr, reference);
  if (table.ok() != by_libdw.ok()) {
    std::fprintf(stderr, "own interpreter %s, libdw %s\n",
                 table.status().ToString().c_str(),
                 by_libdw.status().ToString().c_str());
    std::abort();
  }
  if (table.ok()) {
    const auto a = (*table)->Rows();
    const auto b = (*by_libdw)->Rows();
    if (a.size() != b.size()) {
      std::fprintf(stderr, "own interpreter %zu rows, libdw %zu\n", a.size(),
                   b.size());
      std::abort();
    }
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i].pc != b[i].pc || !(a[i].rule == b[i].rule)) {
        std::fprintf(stderr, "row %zu at 0x%x/0x%x differs\n", i, a[i].pc, b[i].pc);
        std::abort();
      }
    }
  }
  // Lookups answered from the file's .eh_frame before a table exists
  // (what a walk does meanwhile) must be safe whatever the file holds: at
  // each row of the table, and spread over the range. (Their agreement with
  // the table is checked on real binaries, CfiTableDirectTest: here the
  // search table of .eh_frame_hdr may be mutated apart from .eh_frame.)
  {
    auto direct = inprof::internal::CfiModuleTable::PendingFromFile(
        kLo, kHi - 1, "fuzz", path, "");
    uint64_t sum = 0;
    if (table.ok()) {
      const auto rows = (*table)->Rows();
      for (size_t i = 0; i < rows.size() && i < 4096; ++i) {
        sum += direct->FindWordDirect(rows[i].pc);
        sum += direct->FindWordDirect(rows[i].pc + 1);
      }
    }
    for (uint64_t i = 0; i <= 64; ++i) {
      sum += direct->FindWordDirect((kHi - 1) / 64 * i);
      sum += direct->FindStep(i * 4099).kind;
    }
    if (sum == 1) std::fprintf(stderr, " ");  // keep the lookups
  }
  if (!table.ok()) {
    if (table.status().message().find(path) == std::string::npos) {
      std::fprintf(stderr, "error does not name the file: %s\n",
                   std::string(table.status().message()).c_str());
      std::abort();
    }
    return 0;
  }
  const auto& t = **table;
  if (t.text_lo() > t.text_hi()) std::abort();
  // Lookups anywhere in (and around) the table's range must be safe.
  const uint64_t span = t.text_hi() - t.text_lo();
  for (uint64_t i = 0; i <= 16; ++i) {
    (void)t.FindStep(span * i / 16);
    (void)t.FindStep(span * i / 16 + 1);
  }
  (void)t.FindStep(~uint64_t{0} >> 1);
  (void)t.MemoryBytes();
  return 0;
}
