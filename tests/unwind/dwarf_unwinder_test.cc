#include "inprof/dwarf_unwinder.h"

#include <dlfcn.h>
#include <dwarf.h>
#include <elf.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <link.h>
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
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inprof/frame_pointer_unwinder.h"
#include "inprof/pprof_reader.h"
#include "inprof/inprof.h"
#include "inprof/internal/cfi_table.h"
#include "inprof/internal/cfi_walk.h"
#include "inprof/internal/thread_info.h"
#include "inprof/unwinder.h"
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

using internal::CfiModuleTable;
using internal::CfiOp;
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

uintptr_t Addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }

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

std::string Joined(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) absl::StrAppend(&s, n, " <- ");
  return s;
}

std::string EnvPath(const char* name) {
  const char* path = std::getenv(name);
  return path != nullptr ? path : "";
}
std::string TestLibPath() { return EnvPath("INPROF_DWARF_UNWINDER_TEST_LIB"); }

// A private copy of the test library, so that each test loads it afresh
// (after the profiler started, where that matters). Removed at scope exit.
class LibraryCopy {
 public:
  // `without_eh_frame_hdr`: the copy's .eh_frame_hdr loses its search
  // table (its encoding set to "omitted", which readers of .eh_frame take
  // as "scan the FDEs"), so that walks cannot answer from .eh_frame before
  // its table is built.
  explicit LibraryCopy(const std::string& tag, bool without_eh_frame_hdr = false) {
    static int counter = 0;
    path_ = absl::StrCat(testing::TestTmpDir(), "/dwarf_unwinder_", tag, "_",
                         getpid(), "_", counter++, ".so");
    {
      std::ifstream in(TestLibPath(), std::ios::binary);
      std::ofstream out(path_, std::ios::binary | std::ios::trunc);
      out << in.rdbuf();
      ok_ = in.good() && out.good();
    }
    if (ok_ && without_eh_frame_hdr) ok_ = BreakEhFrameHdr();
  }
  ~LibraryCopy() {
    Close();
    std::remove(path_.c_str());
  }
  LibraryCopy(const LibraryCopy&) = delete;
  LibraryCopy& operator=(const LibraryCopy&) = delete;

  bool Open() {
    handle_ = ok_ ? dlopen(path_.c_str(), RTLD_NOW | RTLD_LOCAL) : nullptr;
    return handle_ != nullptr;
  }
  void Close() {
    if (handle_ != nullptr) dlclose(handle_);
    handle_ = nullptr;
  }
  template <typename Fn>
  Fn Symbol(const char* name) const {
    return reinterpret_cast<Fn>(dlsym(handle_, name));
  }
  const std::string& path() const { return path_; }

 private:
  bool BreakEhFrameHdr() {
    std::fstream f(path_, std::ios::binary | std::ios::in | std::ios::out);
    ElfW(Ehdr) ehdr;
    if (!f.read(reinterpret_cast<char*>(&ehdr), sizeof(ehdr))) return false;
    for (int i = 0; i < ehdr.e_phnum; ++i) {
      ElfW(Phdr) ph;
      f.seekg(static_cast<std::streamoff>(ehdr.e_phoff + i * sizeof(ph)));
      if (!f.read(reinterpret_cast<char*>(&ph), sizeof(ph))) return false;
      if (ph.p_type != PT_GNU_EH_FRAME) continue;
      f.seekp(static_cast<std::streamoff>(ph.p_offset + 3));
      f.put(static_cast<char>(0xff));  // table encoding: DW_EH_PE_omit
      return f.good();
    }
    return false;
  }

  std::string path_;
  void* handle_ = nullptr;
  bool ok_ = false;
};

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

CfiRule SpRule(int32_t offset, uint8_t flags = 0, int16_t fp_offset = 0) {
  CfiRule r;
  r.kind = CfiRule::kCfaSp;
  r.cfa_offset = offset;
  r.flags = flags;
  r.fp_offset = fp_offset;
  return r;
}
CfiRule FpRule(int32_t offset = 16) {
  CfiRule r;
  r.kind = CfiRule::kCfaFp;
  r.cfa_offset = offset;
  r.flags = CfiRule::kFpSaved;
  r.fp_offset = -16;
  return r;
}
CfiRule KindRule(CfiRule::Kind kind) {
  CfiRule r;
  r.kind = kind;
  return r;
}

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

bool AnsweredFromEhFrame(const DwarfUnwinderStats& stats, const std::string& path) {
  return std::find(stats.pending_from_eh_frame.begin(), stats.pending_from_eh_frame.end(),
                   path) != stats.pending_from_eh_frame.end();
}
bool HasModule(const DwarfUnwinderStats& stats, const std::string& path) {
  for (const auto& m : stats.modules) {
    if (m.path == path) return true;
  }
  return false;
}

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

// --- End to end ---------------------------------------------------------------------

using ::inprof::testing::ThreadCpuNow;

struct LeafStacks {
  int64_t leaf_samples = 0;     // CPU samples whose leaf is DwarfLibLeaf
  int64_t complete = 0;         // ... whose stack goes on to main
  std::vector<std::string> example_incomplete;
};

// Profiles DwarfLibLeaf called through the library's two frameless frames
// from DwarfTestFpCaller, with the library dlopen()ed after Start().
template <typename P>
LeafStacks ProfileFramelessLeaf(const std::string& tag) {
  LeafStacks result;
  Options options;
  options.output = absl::StrCat(testing::TestTmpDir(), "/dwarf_unwinder_", tag,
                                ".pb.gz");
  // 1 ms: a sample at every scheduler tick (see profiler_e2e_test.cc).
  options.cpu_period = absl::Milliseconds(1);
  LibraryCopy lib(tag);
  {
    P profiler(options);
    EXPECT_TRUE(profiler.Start().ok());
    {
      auto self = profiler.RegisterThread("main");
      EXPECT_TRUE(lib.Open()) << dlerror();
      auto outer = lib.template Symbol<uint64_t (*)(uint64_t)>("DwarfLibOuter");
      EXPECT_NE(outer, nullptr);
      if (outer == nullptr) return result;
      volatile uint64_t sink = 0;
      if constexpr (std::is_same_v<typename P::unwinder_type, DwarfUnwinder>) {
        // The collector's next pass (every 50 ms) sees the library and
        // gives walks its CFI: from its .eh_frame until a table is built.
        // Run it until then (without refreshing ourselves), outside the
        // measured phase, so that the samples below measure the CFI walk.
        const auto start = std::chrono::steady_clock::now();
        auto has_cfi = [&] {
          const DwarfUnwinderStats stats = DwarfUnwinder::Stats();
          return HasModule(stats, lib.path()) || AnsweredFromEhFrame(stats, lib.path());
        };
        while (!has_cfi() &&
               std::chrono::steady_clock::now() - start < std::chrono::seconds(30)) {
          sink = sink + DwarfTestFpCaller(outer, 200'000);
        }
        std::printf("the collector gave the library its CFI after %.0f ms\n",
                    std::chrono::duration<double, std::milli>(
                        std::chrono::steady_clock::now() - start)
                        .count());
        EXPECT_TRUE(has_cfi());
      }
      ScopedLabels measured(profiler, {{"phase", "measured"}});
      const int64_t start = ThreadCpuNow();
      while (ThreadCpuNow() - start < 800'000'000) {
        sink = sink + DwarfTestFpCaller(outer, 200'000);
      }
    }
    EXPECT_TRUE(profiler.Stop().ok());
  }
  auto samples = testing::ReadWithGoPprofRaw(options.output);
  EXPECT_TRUE(samples.ok()) << samples.status();
  if (!samples.ok()) return result;
  for (const auto& s : *samples) {
    if (s.stack.empty() || s.stack[0] != "DwarfLibLeaf" || s.values.empty()) {
      continue;
    }
    auto phase = s.labels.find("phase");
    if (phase == s.labels.end() || phase->second != "measured") continue;
    result.leaf_samples += s.values[0];
    const bool complete =
        s.stack.size() > 4 && s.stack[1] == "DwarfLibMiddle" &&
        s.stack[2] == "DwarfLibOuter" && s.stack[3] == "DwarfTestFpCaller" &&
        std::find(s.stack.begin(), s.stack.end(), "main") != s.stack.end();
    if (complete) {
      result.complete += s.values[0];
    } else if (s.values[0] > 0 && result.example_incomplete.size() < 3) {
      result.example_incomplete.push_back(Joined(s.stack));
    }
  }
  return result;
}

// Start() builds no CFI table on the calling thread: the collector builds
// them right after, and the walks taken before (frame pointers only) are
// counted, in stats() and in the profile's comments, which agree.
// (LoadedLibraryGetsItsTableOnlyOnceAWalkMeetsIt: the same count for a
// module built on demand.)
TEST(DwarfProfilerTest, WalksBeforeTheTablesAreCountedAndReported) {
  Options options;
  options.output = absl::StrCat(testing::TestTmpDir(), "/dwarf_before_tables.pb.gz");
  options.cpu_period = absl::Milliseconds(1);
  options.wall_period = absl::ZeroDuration();
  DwarfProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  {
    auto self = profiler.RegisterThread("main");
    const int64_t start = ThreadCpuNow();
    volatile uint64_t sink = 0;
    while (ThreadCpuNow() - start < 200'000'000) sink = sink + 1;
  }
  ASSERT_TRUE(profiler.Stop().ok());
  const ProfilerStats stats = profiler.stats();
  EXPECT_LE(stats.stacks_before_tables, stats.samples_taken);
  // The tables exist once the collector has run.
  EXPECT_GT(DwarfUnwinder::Stats().modules.size(), 0u);
  auto profile = ReadPprofFile(options.output);
  ASSERT_TRUE(profile.ok()) << profile.status();
  const std::string expected =
      absl::StrCat("walked by frame pointers through a module without its CFI table yet=",
                   stats.stacks_before_tables);
  bool found = false;
  for (const auto& c : profile->comments) {
    found |= c.find(expected) != std::string::npos;
  }
  EXPECT_TRUE(found) << "no comment '" << expected << "'";
  std::printf("%llu of %llu samples walked before the tables were built\n",
              static_cast<unsigned long long>(stats.stacks_before_tables),
              static_cast<unsigned long long>(stats.samples_taken));
}

// A library loaded while a profiler runs gets no table: walks through it
// are answered from its .eh_frame (no frame-pointer step, so none counted
// as before the tables), and a library run a little never pays for a table.
TEST(DwarfProfilerTest, LoadedLibraryIsWalkedFromItsEhFrameWithoutATable) {
  Options options;
  options.output = absl::StrCat(testing::TestTmpDir(), "/dwarf_eh_frame.pb.gz");
  options.cpu_period = absl::Milliseconds(1);
  options.wall_period = absl::ZeroDuration();
  LibraryCopy lib("eh_frame");
  DwarfProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  uint64_t lookups_before = 0;
  {
    auto self = profiler.RegisterThread("main");
    ASSERT_TRUE(lib.Open()) << dlerror();
    auto outer = lib.Symbol<uint64_t (*)(uint64_t)>("DwarfLibOuter");
    ASSERT_NE(outer, nullptr);
    // The collector's next pass (every 50 ms) sees the library.
    const auto start = std::chrono::steady_clock::now();
    while (!AnsweredFromEhFrame(DwarfUnwinder::Stats(), lib.path()) &&
           std::chrono::steady_clock::now() - start < std::chrono::seconds(30)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_TRUE(AnsweredFromEhFrame(DwarfUnwinder::Stats(), lib.path()));
    const ProfilerStats before = profiler.stats();
    lookups_before = DwarfUnwinder::Stats().eh_frame_lookups;
    // In the library until 100 walks went through it: ~100 ms of CPU with
    // the perf engine (a sample per 1 ms point), ~400 ms with the timer
    // engine at HZ=250 (a sample per tick). 60 s of wall time is a hang
    // check.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    volatile uint64_t sink = 0;
    while (profiler.stats().samples_taken < before.samples_taken + 100 &&
           std::chrono::steady_clock::now() < deadline) {
      sink = sink + DwarfTestFpCaller(outer, 200'000);
    }
    EXPECT_EQ(profiler.stats().stacks_before_tables, before.stacks_before_tables);
    EXPECT_GE(profiler.stats().samples_taken, before.samples_taken + 100);
  }
  const DwarfUnwinderStats stats = DwarfUnwinder::Stats();
  EXPECT_GT(stats.eh_frame_lookups, lookups_before);
  EXPECT_FALSE(HasModule(stats, lib.path()));
  EXPECT_TRUE(AnsweredFromEhFrame(stats, lib.path()));
  ASSERT_TRUE(profiler.Stop().ok());
}

// A library whose .eh_frame cannot be searched gets its table on demand:
// a library loaded but never run gets none, and the first walks through
// it, by frame pointers, ask for its table, which the collector then builds.
TEST(DwarfProfilerTest, LoadedLibraryGetsItsTableOnlyOnceAWalkMeetsIt) {
  Options options;
  options.output = absl::StrCat(testing::TestTmpDir(), "/dwarf_on_demand.pb.gz");
  options.cpu_period = absl::Milliseconds(1);
  options.wall_period = absl::ZeroDuration();
  LibraryCopy lib("on_demand", /*without_eh_frame_hdr=*/true);
  DwarfProfiler profiler(options);
  ASSERT_TRUE(profiler.Start().ok());
  ProfilerStats before_use;
  {
    auto self = profiler.RegisterThread("main");
    ASSERT_TRUE(lib.Open()) << dlerror();
    auto outer = lib.Symbol<uint64_t (*)(uint64_t)>("DwarfLibOuter");
    ASSERT_NE(outer, nullptr);
    // Sampled for 300 ms of CPU outside the library, the collector passing
    // every 50 ms meanwhile: the library stays without a table.
    const int64_t t0 = ThreadCpuNow();
    volatile uint64_t sink = 0;
    while (ThreadCpuNow() - t0 < 300'000'000) sink = sink + 1;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_FALSE(HasModule(DwarfUnwinder::Stats(), lib.path()));
    EXPECT_GE(DwarfUnwinder::Stats().modules_pending, 1u);
    before_use = profiler.stats();
    // Now run it until its table exists.
    const auto start = std::chrono::steady_clock::now();
    while (!HasModule(DwarfUnwinder::Stats(), lib.path()) &&
           std::chrono::steady_clock::now() - start < std::chrono::seconds(30)) {
      sink = sink + DwarfTestFpCaller(outer, 200'000);
    }
    EXPECT_TRUE(HasModule(DwarfUnwinder::Stats(), lib.path()));
  }
  ASSERT_TRUE(profiler.Stop().ok());
  // The walks through it before its table existed were counted.
  EXPECT_GT(profiler.stats().stacks_before_tables, before_use.stacks_before_tables);
}

TEST(DwarfProfilerTest, LeafSamplesInFramelessCodeCarryTheStackUpToMain) {
  if (!testing::GoPprofAvailable()) GTEST_SKIP() << "go tool pprof not found";
  const LeafStacks r = ProfileFramelessLeaf<DwarfProfiler>("dwarf_e2e");
  std::printf("DwarfProfiler: %lld of %lld leaf CPU samples complete (%.1f%%)\n",
              static_cast<long long>(r.complete),
              static_cast<long long>(r.leaf_samples),
              r.leaf_samples > 0 ? 100.0 * r.complete / r.leaf_samples : 0.0);
  for (const auto& e : r.example_incomplete) std::printf("  incomplete: %s\n", e.c_str());
  ASSERT_GE(r.leaf_samples, 50);
  EXPECT_GE(r.complete * 10, r.leaf_samples * 9)
      << "e.g. " << (r.example_incomplete.empty() ? "" : r.example_incomplete[0]);
}

// Frame pointers alone lose the callers above the -fomit-frame-pointer
// frames, and the program still runs to the end.
TEST(DwarfProfilerTest, FramePointerProfilerSurvivesTheSameProgram) {
  if (!testing::GoPprofAvailable()) GTEST_SKIP() << "go tool pprof not found";
  const LeafStacks r = ProfileFramelessLeaf<FramePointerProfiler>("fp_e2e");
  std::printf("FramePointerProfiler: %lld of %lld leaf CPU samples complete (%.1f%%)\n",
              static_cast<long long>(r.complete),
              static_cast<long long>(r.leaf_samples),
              r.leaf_samples > 0 ? 100.0 * r.complete / r.leaf_samples : 0.0);
  EXPECT_GE(r.leaf_samples, 50);
  EXPECT_LT(r.complete * 10, r.leaf_samples)
      << "frame pointers alone should not recover these stacks";
}

// DefaultProfiler is the CFI composition where CFI unwinding works.
TEST(DwarfProfilerTest, DefaultProfilerUnwindsWithCfiWhereSupported) {
  if constexpr (DwarfUnwinder::Supported()) {
    EXPECT_TRUE((std::is_same_v<DefaultProfiler, DwarfProfiler>));
    EXPECT_EQ(DefaultProfiler::Engine(), "unwinder=dwarf providers=cpu,wall");
  } else {
    EXPECT_TRUE((std::is_same_v<DefaultProfiler, FramePointerProfiler>));
    EXPECT_EQ(DefaultProfiler::Engine(),
              "unwinder=frame-pointer providers=cpu,wall");
  }
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
#if defined(__SANITIZE_ADDRESS__)
  // read() goes through AddressSanitizer's interceptor, which keeps its
  // caller's (frame, pc) below its own frame record: two candidates for the
  // record, so the walk stops rather than guess (the wall sampler signals).
  EXPECT_TRUE(r.truncated) << Joined(names);
#else
  EXPECT_FALSE(r.truncated) << Joined(names);
  EXPECT_FALSE(copied.empty()) << Joined(names);
#endif
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
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
