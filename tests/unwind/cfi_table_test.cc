// The CFI tables dwarf_unwinder_test walks with (internal/cfi_table.h): CFA
// expressions, the tables and their lookups, and the builder on real files.
// Linked into dwarf_unwinder_test (tests/meson.build).
#include "inprof/internal/cfi_table.h"

#include <dlfcn.h>
#include <dwarf.h>
#include <elf.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <link.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "unwind/dwarf_unwinder_test_util.h"
#include "util/test_util.h"

namespace inprof {
namespace {

using dwarf_unwinder_test::Addr;
using dwarf_unwinder_test::EnvPath;
using dwarf_unwinder_test::FpRule;
using dwarf_unwinder_test::KindRule;
using dwarf_unwinder_test::SpRule;
using dwarf_unwinder_test::TestLibPath;
using internal::CfiModuleTable;
using internal::CfiOp;
using internal::CfiRow;
using internal::CfiRule;
using internal::CfiSnapshot;

// The link-time range of a shared object's executable segments, and its
// load bias, from the program headers the loader keeps.
struct TextRange {
  uintptr_t bias = 0;
  uint64_t lo = UINT64_MAX;
  uint64_t hi = 0;
};
TextRange TextRangeOf(const void* address_inside) {
  struct Query {
    uintptr_t address;
    TextRange range;
    bool found = false;
  } q{Addr(address_inside), {}, false};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* q = static_cast<Query*>(data);
        TextRange r;
        r.bias = info->dlpi_addr;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const auto& ph = info->dlpi_phdr[i];
          if (ph.p_type == PT_LOAD && (ph.p_flags & PF_X)) {
            r.lo = std::min<uint64_t>(r.lo, ph.p_vaddr);
            r.hi = std::max<uint64_t>(r.hi, ph.p_vaddr + ph.p_memsz);
          }
        }
        if (r.hi > r.lo && q->address >= r.bias + r.lo &&
            q->address < r.bias + r.hi) {
          q->range = r;
          q->found = true;
          return 1;
        }
        return 0;
      },
      &q);
  return q.range;
}

// [start, start + size) of the function `fn` from its ELF symbol.
std::pair<uintptr_t, size_t> FunctionExtent(const void* fn) {
  Dl_info info;
  void* extra = nullptr;
  if (dladdr1(fn, &info, &extra, RTLD_DL_SYMENT) == 0 || extra == nullptr) {
    return {Addr(fn), 0};
  }
  return {Addr(fn), static_cast<const ElfW(Sym)*>(extra)->st_size};
}

// --- CFA expressions ------------------------------------------------------------

// The linker's rule for lazy-binding .plt entries: rsp + 8, plus 8 once the
// entry's push (bytes 11..15 of each 16) has run.
std::vector<CfiOp> PltExpression() {
  return {{DW_OP_breg7, 8, 0}, {DW_OP_breg16, 0, 0}, {DW_OP_lit15, 0, 0},
          {DW_OP_and, 0, 0},   {DW_OP_lit11, 0, 0},  {DW_OP_ge, 0, 0},
          {DW_OP_lit3, 0, 0},  {DW_OP_shl, 0, 0},    {DW_OP_plus, 0, 0}};
}

TEST(CfiExpressionTest, EvaluatesThePltRulePerPc) {
  const auto ops = PltExpression();
  int64_t offset = 0;
  for (uint64_t pc = 0x13030; pc < 0x13050; ++pc) {
    ASSERT_TRUE(internal::EvaluateCfaOffset(ops, pc, &offset)) << pc;
    EXPECT_EQ(offset, (pc & 15) >= 11 ? 16 : 8) << std::hex << pc;
  }
}

TEST(CfiExpressionTest, RefusesWhatIsNotSpPlusAConstant) {
  int64_t offset = 0;
  // A memory read.
  const std::vector<CfiOp> deref = {{DW_OP_breg7, 8, 0}, {DW_OP_deref, 0, 0}};
  EXPECT_FALSE(internal::EvaluateCfaOffset(deref, 0x1000, &offset));
  // Another register.
  const std::vector<CfiOp> rbx = {{DW_OP_breg3, 8, 0}};
  EXPECT_FALSE(internal::EvaluateCfaOffset(rbx, 0x1000, &offset));
  // Twice sp.
  const std::vector<CfiOp> twice = {{DW_OP_breg7, 0, 0}, {DW_OP_lit1, 0, 0},
                                    {DW_OP_shl, 0, 0}};
  EXPECT_FALSE(internal::EvaluateCfaOffset(twice, 0x1000, &offset));
  // Stack underflow.
  const std::vector<CfiOp> underflow = {{DW_OP_plus, 0, 0}};
  EXPECT_FALSE(internal::EvaluateCfaOffset(underflow, 0x1000, &offset));
  EXPECT_FALSE(internal::EvaluateCfaOffset({}, 0x1000, &offset));
  // sp + 24 through constants is fine.
  const std::vector<CfiOp> plain = {{DW_OP_breg7, 0, 0}, {DW_OP_const1u, 24, 0},
                                    {DW_OP_plus, 0, 0}};
  ASSERT_TRUE(internal::EvaluateCfaOffset(plain, 0x1000, &offset));
  EXPECT_EQ(offset, 24);
}

// --- The table ---------------------------------------------------------------------

std::optional<CfiRule> Lookup(const CfiModuleTable& table, uint64_t offset) {
  CfiRule rule;
  if (!table.Find(offset, &rule)) return std::nullopt;
  return rule;
}
std::optional<CfiRule> LookupUncached(const CfiModuleTable& table,
                                      uint64_t offset) {
  CfiRule rule;
  if (!table.FindUncached(offset, &rule)) return std::nullopt;
  return rule;
}
std::optional<CfiRule> LookupIn(const CfiSnapshot& snapshot, uintptr_t pc,
                                const CfiSnapshot::Module** hint) {
  CfiRule rule;
  if (!snapshot.Find(pc, hint, &rule)) return std::nullopt;
  return rule;
}

TEST(CfiModuleTableTest, FindsTheRowInForceAndMergesEqualRows) {
  const std::vector<CfiRow> rows = {
      {0x10, SpRule(8)},  {0x14, SpRule(16)}, {0x18, SpRule(16)},  // merged
      {0x20, SpRule(8)},  {0x30, CfiRule()},  {0x40, FpRule()},
      {0x40, SpRule(24)},  // equal pc: the last wins
      {0x50, CfiRule()}};
  const CfiModuleTable table(0x1000, 0x1100, rows);
  EXPECT_EQ(table.rows(), 7u);  // with the leading kNone row at 0
  EXPECT_FALSE(Lookup(table, 0x0).has_value());   // before the first row
  EXPECT_FALSE(Lookup(table, 0xf).has_value());
  ASSERT_TRUE(Lookup(table, 0x10).has_value());
  EXPECT_EQ(*Lookup(table, 0x10), SpRule(8));
  EXPECT_EQ(*Lookup(table, 0x13), SpRule(8));
  EXPECT_EQ(*Lookup(table, 0x14), SpRule(16));
  EXPECT_EQ(*Lookup(table, 0x1f), SpRule(16));
  EXPECT_EQ(*Lookup(table, 0x20), SpRule(8));
  EXPECT_FALSE(Lookup(table, 0x30).has_value());  // a gap between FDEs
  EXPECT_FALSE(Lookup(table, 0x3f).has_value());
  EXPECT_EQ(*Lookup(table, 0x40), SpRule(24));
  EXPECT_FALSE(Lookup(table, 0x50).has_value());
  EXPECT_FALSE(Lookup(table, 0xff).has_value());
  EXPECT_FALSE(Lookup(table, 0x100).has_value());  // past the text
  EXPECT_FALSE(Lookup(table, ~uint64_t{0}).has_value());
  EXPECT_GT(table.MemoryBytes(), 0u);
}

TEST(CfiModuleTableTest, RulesBeyondTheWordFormatBecomeUnsupported) {
  const CfiRule far = SpRule(64, CfiRule::kFpSaved, 4096);
  EXPECT_EQ(internal::DecodeRule(internal::EncodeRule(far)).kind,
            CfiRule::kUnsupported);
  const CfiModuleTable table(0, 0x100, {{0, far}, {0x10, CfiRule()}});
  const std::optional<CfiRule> got = Lookup(table, 4);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->kind, CfiRule::kUnsupported);
}

// Rules are packed into the lookup cache's words when they fit: each must
// come back from a hit exactly as it went in.
TEST(CfiModuleTableTest, CacheHitsReturnEveryRuleIntact) {
  CfiRule sig;
  sig.kind = CfiRule::kCfaDerefSp;
  sig.cfa_offset = 160;
  sig.ra_offset = 168;
  sig.fp_offset = 120;
  sig.flags = CfiRule::kRaFromSp | CfiRule::kFpSaved | CfiRule::kFpFromSp |
              CfiRule::kSignalFrame;
  CfiRule lost = SpRule(-40);
  lost.flags = CfiRule::kFpLost;
  const std::vector<CfiRule> rules = {
      SpRule(8), SpRule(32767), SpRule(32768), SpRule(-32768), SpRule(1 << 20),
      SpRule(64, CfiRule::kFpSaved, -256), SpRule(64, CfiRule::kFpSaved, 248),
      SpRule(64, CfiRule::kFpSaved, 256), SpRule(64, CfiRule::kFpSaved, -12),
      FpRule(), sig, lost, KindRule(CfiRule::kOutermost),
      KindRule(CfiRule::kUnsupported)};
  std::vector<CfiRow> rows;
  for (size_t i = 0; i < rules.size(); ++i) {
    rows.push_back({static_cast<uint32_t>(16 * i), rules[i]});
  }
  const CfiModuleTable table(0, 16 * rules.size(), rows);
  for (const CfiRule& r : rules) {
    EXPECT_EQ(internal::DecodeRule(internal::EncodeRule(r)), r);
  }
  for (int pass = 0; pass < 3; ++pass) {
    for (size_t i = 0; i < rules.size(); ++i) {
      const std::optional<CfiRule> got = Lookup(table, 16 * i + 3);
      ASSERT_TRUE(got.has_value()) << i;
      EXPECT_EQ(*got, rules[i]) << "rule " << i << " pass " << pass;
    }
  }
}

TEST(CfiModuleTableTest, IndexedLookupAgreesWithLinearSearch) {
  std::mt19937_64 rng(42);
  for (int round = 0; round < 20; ++round) {
    const uint64_t size = 1 + rng() % 20000;
    std::vector<CfiRow> rows;
    uint64_t pc = rng() % 64;
    while (pc < size) {
      rows.push_back({static_cast<uint32_t>(pc),
                      rng() % 5 == 0 ? CfiRule()
                                     : SpRule(8 * static_cast<int32_t>(1 + rng() % 6))});
      pc += 1 + (rng() % 4 == 0 ? rng() % 2000 : rng() % 12);
    }
    const CfiModuleTable table(0, size, rows);
    const std::vector<CfiRow> kept = table.Rows();
    for (uint64_t at = 0; at < size + 8; ++at) {
      std::optional<CfiRule> expected;
      for (const CfiRow& row : kept) {
        if (row.pc <= at) expected = row.rule;
      }
      if (at >= size || (expected && expected->kind == CfiRule::kNone)) {
        expected.reset();
      }
      // Twice through the cache (a miss, then a hit), and uncached.
      for (const std::optional<CfiRule>& got :
           {Lookup(table, at), Lookup(table, at), LookupUncached(table, at)}) {
        ASSERT_EQ(got.has_value(), expected.has_value())
            << "round " << round << " at " << at;
        if (got) {
          ASSERT_EQ(*got, *expected) << "at " << at;
        }
      }
    }
  }
}

TEST(CfiSnapshotTest, FindsModulesByAddressAndSkipsOverlaps) {
  auto a = std::make_shared<const CfiModuleTable>(
      0x0, 0x100, std::vector<CfiRow>{{0, SpRule(8)}, {0x80, CfiRule()}});
  auto b = std::make_shared<const CfiModuleTable>(
      0x1000, 0x1100, std::vector<CfiRow>{{0, SpRule(16)}});
  const CfiSnapshot snapshot({{0x50000, b}, {0x40000, a}, {0x40050, b}});
  ASSERT_EQ(snapshot.modules().size(), 2u);  // the overlapping one dropped
  const CfiSnapshot::Module* hint = nullptr;
  EXPECT_FALSE(LookupIn(snapshot, 0x3ffff, &hint).has_value());
  ASSERT_TRUE(LookupIn(snapshot, 0x40000, &hint).has_value());
  EXPECT_EQ(*LookupIn(snapshot, 0x4007f, &hint), SpRule(8));
  EXPECT_FALSE(LookupIn(snapshot, 0x40080, &hint).has_value());
  EXPECT_FALSE(LookupIn(snapshot, 0x40100, &hint).has_value());
  EXPECT_EQ(*LookupIn(snapshot, 0x50000, &hint), SpRule(16));
  EXPECT_EQ(*LookupIn(snapshot, 0x500ff, &hint), SpRule(16));
  EXPECT_FALSE(LookupIn(snapshot, 0x50100, &hint).has_value());
  // A stale hint does not misdirect the lookup.
  EXPECT_EQ(*LookupIn(snapshot, 0x40010, &hint), SpRule(8));
}

// --- The table builder on real files --------------------------------------------

// Checks the rules of the test library's functions, loaded from `path`.
void ExpectLibraryRules(const std::string& path) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(handle, nullptr) << dlerror();
  const void* leaf = dlsym(handle, "DwarfLibLeaf");
  const void* middle = dlsym(handle, "DwarfLibMiddle");
  ASSERT_NE(leaf, nullptr);
  ASSERT_NE(middle, nullptr);
  const TextRange text = TextRangeOf(leaf);
  ASSERT_GT(text.hi, text.lo);
  auto table = internal::BuildCfiTableFromFile(path, text.lo, text.hi);
  ASSERT_TRUE(table.ok()) << table.status();
  const auto offset = [&](uintptr_t runtime) {
    return runtime - text.bias - text.lo;
  };

  // The leaf: CFA = rsp + 8 and rbp untouched over its whole body.
  const auto [leaf_at, leaf_size] = FunctionExtent(leaf);
  ASSERT_GT(leaf_size, 0u);
  for (uintptr_t pc = leaf_at; pc < leaf_at + leaf_size; ++pc) {
    const std::optional<CfiRule> rule = Lookup(**table, offset(pc));
    ASSERT_TRUE(rule.has_value()) << "no row in DwarfLibLeaf+" << pc - leaf_at;
    EXPECT_EQ(*rule, SpRule(8)) << "DwarfLibLeaf+" << pc - leaf_at;
  }
  // The middle frame: sp-based (no frame pointer) and, somewhere in its
  // body, the caller's rbp saved on the stack.
  const auto [middle_at, middle_size] = FunctionExtent(middle);
  ASSERT_GT(middle_size, 0u);
  bool saves_rbp = false;
  int32_t deepest = 0;
  for (uintptr_t pc = middle_at; pc < middle_at + middle_size; ++pc) {
    const std::optional<CfiRule> rule = Lookup(**table, offset(pc));
    ASSERT_TRUE(rule.has_value()) << "no row in DwarfLibMiddle+" << pc - middle_at;
    EXPECT_EQ(rule->kind, CfiRule::kCfaSp);
    if (rule->flags & CfiRule::kFpSaved) saves_rbp = true;
    deepest = std::max(deepest, rule->cfa_offset);
  }
  EXPECT_TRUE(saves_rbp);
  EXPECT_GT(deepest, 16);
  dlclose(handle);
}

TEST(CfiTableBuilderTest, ReadsEhFrameOfFramelessCode) {
  ASSERT_FALSE(TestLibPath().empty()) << "INPROF_DWARF_UNWINDER_TEST_LIB unset";
  ExpectLibraryRules(TestLibPath());
}

TEST(CfiTableBuilderTest, ReadsDebugFrameWhenThereIsNoEhFrame) {
  const std::string path = EnvPath("INPROF_DWARF_UNWINDER_DEBUG_FRAME_LIB");
  ASSERT_FALSE(path.empty()) << "INPROF_DWARF_UNWINDER_DEBUG_FRAME_LIB unset";
  ExpectLibraryRules(path);
}

// The .plt of this executable (lazy binding): per-entry rows from the
// linker's CFA expression.
TEST(CfiTableBuilderTest, GivesPltEntriesTheirPerInstructionRule) {
  elf_version(EV_CURRENT);
  const int fd = open("/proc/self/exe", O_RDONLY);
  ASSERT_GE(fd, 0);
  Elf* elf = elf_begin(fd, ELF_C_READ_MMAP, nullptr);
  ASSERT_NE(elf, nullptr);
  size_t shstrndx = 0;
  ASSERT_EQ(elf_getshdrstrndx(elf, &shstrndx), 0);
  GElf_Shdr plt{};
  bool found = false;
  for (Elf_Scn* scn = elf_nextscn(elf, nullptr); scn != nullptr;
       scn = elf_nextscn(elf, scn)) {
    GElf_Shdr shdr;
    if (gelf_getshdr(scn, &shdr) == nullptr) continue;
    const char* name = elf_strptr(elf, shstrndx, shdr.sh_name);
    if (name != nullptr && std::strcmp(name, ".plt") == 0) {
      plt = shdr;
      found = true;
    }
  }
  elf_end(elf);
  close(fd);
  if (!found || plt.sh_size < 32 || plt.sh_entsize != 16) {
    GTEST_SKIP() << "no lazy-binding .plt in this executable";
  }
  const TextRange text = TextRangeOf(reinterpret_cast<const void*>(&DwarfTestFpCaller));
  auto table = internal::BuildCfiTableFromFile("/proc/self/exe", text.lo, text.hi);
  ASSERT_TRUE(table.ok()) << table.status();
  // PLT0 pushes once (CFA rsp + 16, then + 24 after its second push).
  const std::optional<CfiRule> first = Lookup(**table, plt.sh_addr - text.lo);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->kind, CfiRule::kCfaSp);
  EXPECT_EQ(first->cfa_offset, 16);
  for (uint64_t entry = plt.sh_addr + 16; entry < plt.sh_addr + plt.sh_size;
       entry += 16) {
    for (uint64_t b = 0; b < 16; ++b) {
      const std::optional<CfiRule> rule = Lookup(**table, entry + b - text.lo);
      ASSERT_TRUE(rule.has_value()) << std::hex << entry + b;
      EXPECT_EQ(rule->kind, CfiRule::kCfaSp);
      EXPECT_EQ(rule->cfa_offset, b >= 11 ? 16 : 8) << std::hex << entry + b;
    }
  }
}

// A build interrupted every 64 FDEs resumes where it stopped (a profiler
// started and stopped every few milliseconds must still finish its tables)
// and ends with the table an uninterrupted build makes.
TEST(CfiTableTest, InterruptedBuildResumesToTheSameTable) {
  const TextRange text = TextRangeOf(reinterpret_cast<const void*>(&DwarfTestFpCaller));
  auto whole = internal::BuildCfiTableFromFile("/proc/self/exe", text.lo, text.hi);
  ASSERT_TRUE(whole.ok()) << whole.status();
  internal::CfiPartialBuild partial;
  int interruptions = 0;
  size_t done = 0;
  absl::StatusOr<std::shared_ptr<const internal::CfiModuleTable>> resumed;
  int turns = 0;
  while (true) {
    turns = 0;
    resumed = internal::BuildCfiTableFromFile("/proc/self/exe", text.lo, text.hi, "",
                                              [&turns] {
                                                ++turns;
                                                return false;
                                              },
                                              &partial);
    if (!absl::IsCancelled(resumed.status())) break;
    ++interruptions;
    ASSERT_FALSE(partial.empty());
    ASSERT_GT(partial.fdes_total(), 1000u);
    if (interruptions == 1) {
      // The first attempt collects the FDEs (its turns there ask to stop,
      // which it does once they are collected).
      ASSERT_EQ(partial.fdes_done(), 0u);
      // ... and gave the caller a turn every 256 entries meanwhile (a
      // profiler drains its rings there).
      ASSERT_GE(static_cast<size_t>(turns), partial.fdes_total() / 256);
    } else {
      // Each later attempt goes on from the last one: 63 FDEs further (the
      // 64th asks to stop before it is processed).
      ASSERT_EQ(partial.fdes_done(), done + 63) << interruptions;
    }
    done = partial.fdes_done();
    ASSERT_LT(interruptions, 100000);
  }
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_TRUE(partial.empty());
  EXPECT_GT(interruptions, 10);  // the test binary has thousands of FDEs
  EXPECT_EQ((*resumed)->rows(), (*whole)->rows());
  for (uint64_t offset = 0; offset < text.hi - text.lo; ++offset) {
    const std::optional<CfiRule> a = Lookup(**whole, offset);
    const std::optional<CfiRule> b = Lookup(**resumed, offset);
    ASSERT_EQ(a.has_value(), b.has_value()) << std::hex << offset;
    if (a.has_value()) {
      ASSERT_EQ(a->kind, b->kind) << std::hex << offset;
      ASSERT_EQ(a->cfa_offset, b->cfa_offset) << std::hex << offset;
    }
  }
  // A partial build of another file is not resumed: that file starts over.
  internal::CfiPartialBuild other;
  auto cut = internal::BuildCfiTableFromFile("/proc/self/exe", text.lo, text.hi, "",
                                             [] { return false; }, &other);
  ASSERT_TRUE(absl::IsCancelled(cut.status()));
  void* handle = dlopen(TestLibPath().c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(handle, nullptr) << dlerror();
  const TextRange lib = TextRangeOf(dlsym(handle, "DwarfLibLeaf"));
  auto lib_table = internal::BuildCfiTableFromFile(TestLibPath(), lib.lo, lib.hi, "",
                                                   [] { return true; }, &other);
  ASSERT_TRUE(lib_table.ok()) << lib_table.status();
  EXPECT_TRUE(other.empty());
}

// The link-time range of a file's executable segments, read from its
// program headers (for files this process has not loaded).
std::optional<TextRange> FileTextRange(const std::string& path) {
  elf_version(EV_CURRENT);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  Elf* elf = elf_begin(fd, ELF_C_READ_MMAP, nullptr);
  TextRange r;
  size_t count = 0;
  if (elf != nullptr && elf_getphdrnum(elf, &count) == 0) {
    for (size_t i = 0; i < count; ++i) {
      GElf_Phdr ph;
      if (gelf_getphdr(elf, static_cast<int>(i), &ph) == nullptr) continue;
      if (ph.p_type != PT_LOAD || (ph.p_flags & PF_X) == 0) continue;
      r.lo = std::min<uint64_t>(r.lo, ph.p_vaddr);
      r.hi = std::max<uint64_t>(r.hi, ph.p_vaddr + ph.p_memsz);
    }
  }
  if (elf != nullptr) elf_end(elf);
  close(fd);
  if (r.hi <= r.lo) return std::nullopt;
  return r;
}

std::string RuleText(const CfiRule& r) {
  return absl::StrCat("{kind ", r.kind, " flags ", r.flags, " cfa ", r.cfa_offset,
                      " ra ", r.ra_offset, " fp ", r.fp_offset, "}");
}

// The executable and every library this test has loaded, then libraries
// with hand-written assembly when installed (OpenSSL's and GnuTLS's CFI has
// expressions, remember/restore state and DW_CFA_register).
std::vector<std::string> LoadedModulesAndAssemblyLibraries() {
  std::vector<std::string> paths = {"/proc/self/exe"};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        const char* name = info->dlpi_name;
        if (name != nullptr && name[0] == '/') {
          static_cast<std::vector<std::string>*>(data)->push_back(name);
        }
        return 0;
      },
      &paths);
  for (const char* extra : {"/usr/lib/x86_64-linux-gnu/libcrypto.so.3",
                            "/usr/lib/x86_64-linux-gnu/libgnutls.so.30",
                            "/usr/lib/x86_64-linux-gnu/libgmp.so.10"}) {
    if (access(extra, R_OK) == 0) paths.push_back(extra);
  }
  return paths;
}

// The own FDE interpreter against libdw's, row for row, over every module
// this test loads (the executable, libc, libstdc++, libdw, abseil, ...) and
// a few libraries with hand-written assembly when installed (OpenSSL's and
// GnuTLS's CFI has expressions, remember/restore state and DW_CFA_register):
// the same table, and most FDEs run by the own interpreter.
TEST(CfiTableBuilderTest, OwnInterpreterBuildsLibdwsTableRowForRow) {
  std::vector<std::string> paths = LoadedModulesAndAssemblyLibraries();
  size_t total_own = 0, total_libdw = 0, compared = 0;
  bool saw_libc = false;
  for (const std::string& path : paths) {
    const std::optional<TextRange> text = FileTextRange(path);
    if (!text.has_value()) continue;
    size_t own = 0, by_libdw = 0, reference_own = 0, reference_libdw = 0;
    internal::CfiBuildOptions fast;
    fast.fdes_own = &own;
    fast.fdes_libdw = &by_libdw;
    internal::CfiBuildOptions reference;
    reference.interpreter = internal::CfiInterpreter::kLibdw;
    reference.fdes_own = &reference_own;
    reference.fdes_libdw = &reference_libdw;
    auto a = internal::BuildCfiTableFromFile(path, text->lo, text->hi, "",
                                             [] { return true; }, nullptr, fast);
    auto b = internal::BuildCfiTableFromFile(path, text->lo, text->hi, "",
                                             [] { return true; }, nullptr, reference);
    ASSERT_EQ(a.ok(), b.ok()) << path << ": " << a.status() << " / " << b.status();
    if (!a.ok()) continue;
    EXPECT_EQ(reference_own, 0u) << path;
    EXPECT_EQ(own + by_libdw, reference_libdw) << path;
    const std::vector<CfiRow> rows_a = (*a)->Rows();
    const std::vector<CfiRow> rows_b = (*b)->Rows();
    ASSERT_EQ(rows_a.size(), rows_b.size()) << path;
    for (size_t i = 0; i < rows_a.size(); ++i) {
      ASSERT_TRUE(rows_a[i].pc == rows_b[i].pc && rows_a[i].rule == rows_b[i].rule)
          << path << " row " << i << " at 0x" << std::hex << rows_a[i].pc + text->lo
          << " / 0x" << rows_b[i].pc + text->lo << ": own " << RuleText(rows_a[i].rule)
          << ", libdw " << RuleText(rows_b[i].rule);
    }
    if (path.find("/libc.so.6") != std::string::npos) {
      saw_libc = true;
      // Its signal trampoline and hand-written string functions aside,
      // libc's FDEs are compiler output: the own interpreter runs them.
      EXPECT_GT(own, 20 * by_libdw) << path;
    }
    ++compared;
    total_own += own;
    total_libdw += by_libdw;
  }
  EXPECT_TRUE(saw_libc);
  EXPECT_GE(compared, 5u);
  EXPECT_GT(total_own, 20 * total_libdw);
  std::printf("compared %zu modules: %zu FDEs by the own interpreter, %zu by libdw\n",
              compared, total_own, total_libdw);
}

// A pending table that answers from the file's .eh_frame (what walks use
// until a module's table is built) gives the built table's rule at the
// first and the last byte of every row, over every module this test loads,
// or no answer where the builder needed libdw (register expressions) or
// another section: then the walk falls back and asks for the table.
// (Also libraries with hand-written assembly, when installed, and the
// test's frameless library.)
TEST(CfiTableDirectTest, EhFrameLookupsAgreeWithTheBuiltTable) {
  std::vector<std::string> paths = LoadedModulesAndAssemblyLibraries();
  paths.push_back(TestLibPath());
  size_t compared = 0, agreed = 0, declined = 0;
  bool saw_libc = false;
  for (const std::string& path : paths) {
    const std::optional<TextRange> text = FileTextRange(path);
    if (!text.has_value()) continue;
    auto built = internal::BuildCfiTableFromFile(path, text->lo, text->hi);
    if (!built.ok()) continue;
    auto direct = internal::CfiModuleTable::PendingFromFile(text->lo, text->hi, path,
                                                            path, "");
    ASSERT_TRUE(direct->pending());
    ASSERT_TRUE(direct->direct()) << path << ": no .eh_frame_hdr to search";
    const std::vector<CfiRow> rows = (*built)->Rows();
    size_t module_declined = 0, module_checked = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      const uint64_t end = i + 1 < rows.size() ? rows[i + 1].pc : text->hi - text->lo;
      for (const uint64_t pc : {uint64_t{rows[i].pc}, end - 1}) {
        const uint64_t want = (*built)->FindWordUncached(pc);
        const uint64_t got = direct->FindWordDirect(pc);
        ++module_checked;
        if (got == want) {
          ++agreed;
        } else if (got == 0 || internal::RuleKind(got) == CfiRule::kUnsupported) {
          ++module_declined;  // the walk falls back and wants the table
        } else {
          ADD_FAILURE() << path << " at 0x" << std::hex << pc + text->lo << ": direct "
                        << RuleText(internal::DecodeRule(got)) << ", table "
                        << RuleText(internal::DecodeRule(want));
          return;
        }
      }
    }
    // What is left: FDEs the own interpreter leaves to libdw (register
    // expressions in hand-written assembly); the .plt's CFA expression is
    // evaluated per pc as the builder does.
    saw_libc |= path.find("/libc.so.6") != std::string::npos;
    EXPECT_LT(module_declined * 100, module_checked) << path;
    compared += module_checked;
    declined += module_declined;
  }
  EXPECT_TRUE(saw_libc);
  EXPECT_LT(declined * 1000, compared);
  std::printf("%zu lookups: %zu as the table, %zu left to the table\n", compared,
              agreed, declined);
}

// Until it is built, a direct table counts its cache misses and asks for
// its table after kDirectLookupsBeforeBuild of them; a file without
// .eh_frame_hdr, or with another build-id, gets a plain pending table.
TEST(CfiTableDirectTest, ManyLookupsAskForTheTableAndBadFilesGetNone) {
  const std::optional<TextRange> text = FileTextRange("/proc/self/exe");
  ASSERT_TRUE(text.has_value());
  auto direct = internal::CfiModuleTable::PendingFromFile(
      text->lo, text->hi, "exe", "/proc/self/exe", "");
  ASSERT_TRUE(direct->direct());
  uint64_t offset = 0;
  const uint64_t size = text->hi - text->lo;
  while (!direct->wanted() && direct->direct_lookups() < 100'000) {
    offset = (offset + 4093) % size;  // distinct keys: cache misses
    (void)direct->FindStep(offset);
  }
  EXPECT_TRUE(direct->wanted());
  EXPECT_EQ(direct->direct_lookups(),
            internal::CfiModuleTable::kDirectLookupsBeforeBuild);

  auto wrong_id = internal::CfiModuleTable::PendingFromFile(
      text->lo, text->hi, "exe", "/proc/self/exe", "not this build-id");
  EXPECT_TRUE(wrong_id->pending());
  EXPECT_FALSE(wrong_id->direct());
  auto missing = internal::CfiModuleTable::PendingFromFile(0, 0x1000, "none",
                                                           "/nonexistent/lib.so", "");
  EXPECT_FALSE(missing->direct());
  const std::string text_path = absl::StrCat(testing::TestTmpDir(), "/not_elf.so");
  {
    std::ofstream f(text_path);
    f << std::string(4096, 'x');
  }
  auto not_elf = internal::CfiModuleTable::PendingFromFile(0, 0x1000, "x", text_path, "");
  EXPECT_FALSE(not_elf->direct());
  EXPECT_EQ(not_elf->FindWordDirect(0x10), 0u);
}

TEST(CfiTableBuilderTest, RefusesMissingForeignAndCorruptFilesWithoutCrashing) {
  EXPECT_FALSE(internal::BuildCfiTableFromFile("/nonexistent/lib.so", 0, 0x1000).ok());
  const std::string text_path = testing::TestTmpDir() + "/dwarf_not_elf.txt";
  {
    std::ofstream out(text_path);
    out << "not an ELF file\n";
  }
  EXPECT_FALSE(internal::BuildCfiTableFromFile(text_path, 0, 0x1000).ok());
  std::remove(text_path.c_str());

  // The right file with a wrong expected build-id is refused.
  void* handle = dlopen(TestLibPath().c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(handle, nullptr) << dlerror();
  const TextRange text = TextRangeOf(dlsym(handle, "DwarfLibLeaf"));
  dlclose(handle);
  auto wrong = internal::BuildCfiTableFromFile(TestLibPath(), text.lo, text.hi,
                                               "not-the-build-id");
  EXPECT_FALSE(wrong.ok());

  // Truncated and bit-flipped copies: any status, never a crash.
  std::ifstream in(TestLibPath(), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)),
                          std::istreambuf_iterator<char>());
  ASSERT_GT(bytes.size(), 1000u);
  std::mt19937_64 rng(7);
  const std::string corrupt_path = testing::TestTmpDir() + "/dwarf_corrupt.so";
  for (int i = 0; i < 150; ++i) {
    std::string mutated = bytes;
    if (i % 3 == 0) {
      mutated.resize(rng() % bytes.size());
    } else {
      for (int k = 0; k < 1 + i % 16; ++k) {
        mutated[rng() % mutated.size()] = static_cast<char>(rng());
      }
    }
    {
      std::ofstream out(corrupt_path, std::ios::binary | std::ios::trunc);
      out << mutated;
    }
    auto table = internal::BuildCfiTableFromFile(corrupt_path, text.lo, text.hi);
    if (table.ok()) {
      EXPECT_LE((*table)->text_hi(), text.hi);
    }
  }
  std::remove(corrupt_path.c_str());
}

}  // namespace
}  // namespace inprof
