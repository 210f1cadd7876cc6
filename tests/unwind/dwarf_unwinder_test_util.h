// tests/unwind/dwarf_unwinder_test_util.h: helpers shared by the sources of
// dwarf_unwinder_test (tests/unwind/cfi_table_test.cc, dwarf_unwinder_test.cc
// and tests/profiler/dwarf_profiler_test.cc): private copies of the frameless
// test library, rules for synthetic tables, and what DwarfUnwinder::Stats()
// says of a module.
//
// Thread-safety: LibraryCopy is for one thread; the functions are reentrant.
#ifndef INPROF_TESTS_UNWIND_DWARF_UNWINDER_TEST_UTIL_H_
#define INPROF_TESTS_UNWIND_DWARF_UNWINDER_TEST_UTIL_H_

#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "inprof/dwarf_unwinder.h"
#include "inprof/internal/cfi_table.h"
#include "util/test_util.h"

// Defined in dwarf_unwinder_test.cc, at global scope and exported: a frame
// of the test binary (built with frame pointers) that calls `outer`.
extern "C" uint64_t DwarfTestFpCaller(uint64_t (*outer)(uint64_t), uint64_t n);

namespace inprof::dwarf_unwinder_test {

using internal::CfiRule;

inline uintptr_t Addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }

inline std::string Joined(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) absl::StrAppend(&s, n, " <- ");
  return s;
}

inline std::string EnvPath(const char* name) {
  const char* path = std::getenv(name);
  return path != nullptr ? path : "";
}
inline std::string TestLibPath() { return EnvPath("INPROF_DWARF_UNWINDER_TEST_LIB"); }

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

inline CfiRule SpRule(int32_t offset, uint8_t flags = 0, int16_t fp_offset = 0) {
  CfiRule r;
  r.kind = CfiRule::kCfaSp;
  r.cfa_offset = offset;
  r.flags = flags;
  r.fp_offset = fp_offset;
  return r;
}
inline CfiRule FpRule(int32_t offset = 16) {
  CfiRule r;
  r.kind = CfiRule::kCfaFp;
  r.cfa_offset = offset;
  r.flags = CfiRule::kFpSaved;
  r.fp_offset = -16;
  return r;
}
inline CfiRule KindRule(CfiRule::Kind kind) {
  CfiRule r;
  r.kind = kind;
  return r;
}

inline bool AnsweredFromEhFrame(const DwarfUnwinderStats& stats, const std::string& path) {
  return std::find(stats.pending_from_eh_frame.begin(), stats.pending_from_eh_frame.end(),
                   path) != stats.pending_from_eh_frame.end();
}
inline bool HasModule(const DwarfUnwinderStats& stats, const std::string& path) {
  for (const auto& m : stats.modules) {
    if (m.path == path) return true;
  }
  return false;
}

}  // namespace inprof::dwarf_unwinder_test

#endif  // INPROF_TESTS_UNWIND_DWARF_UNWINDER_TEST_UTIL_H_
