// tests/windows/symbolizer_windows_test_util.h: what the two sources of
// symbolizer_windows_test share: symbolizer_windows_test.cc (names,
// modules, system DLLs, the cache, SymbolizeFile) and
// symbolizer_windows_lines_test.cc (file and line from the symbolizer's own
// .debug_line reader). One program, so that CI links it once.
//
// Defines: the code whose symbols the tests look up (declared here, defined
// in symbolizer_windows_test.cc: the tests expect that file name and those
// lines), addresses of this program and of its file, a temporary directory,
// and readers of this program's file.
//
// Thread-safety: the tests run on one thread; nothing here locks.
#ifndef INPROF_TESTS_WINDOWS_SYMBOLIZER_WINDOWS_TEST_UTIL_H_
#define INPROF_TESTS_WINDOWS_SYMBOLIZER_WINDOWS_TEST_UTIL_H_

#include <windows.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace inprof::symbolizer_test {

// --- Code whose symbols the tests look up (symbolizer_windows_test.cc) ------

extern volatile int g_sink;
// KnownFunction's line, set when it runs.
extern int g_known_function_line;
int KnownFunction(int x);
// Returns its own return address: a pc inside whichever function called it.
uintptr_t CapturePc();

struct CallSite {
  uintptr_t pc;
  int line;
};

// The pc of a call of CapturePc() and that call's line.
CallSite CallerOfCapturePc();
// As CallerOfCapturePc, with a line-table row without code at the call's
// address.
CallSite CallerAfterARowWithoutCode();

// --- Helpers -------------------------------------------------------------------

inline std::string Narrow(const std::wstring& w) {
  if (w.empty()) return "";
  const int n = WideCharToMultiByte(CP_UTF8, 0, w.data(), static_cast<int>(w.size()),
                                    nullptr, 0, nullptr, nullptr);
  std::string s(static_cast<size_t>(n), '\0');
  WideCharToMultiByte(CP_UTF8, 0, w.data(), static_cast<int>(w.size()), s.data(), n,
                      nullptr, nullptr);
  return s;
}

inline std::wstring Widen(const std::string& s) {
  if (s.empty()) return L"";
  const int n = MultiByteToWideChar(CP_UTF8, 0, s.data(), static_cast<int>(s.size()),
                                    nullptr, 0);
  std::wstring w(static_cast<size_t>(n), L'\0');
  MultiByteToWideChar(CP_UTF8, 0, s.data(), static_cast<int>(s.size()), w.data(), n);
  return w;
}

inline std::string ExePath() {
  wchar_t buf[4096];
  const DWORD n = GetModuleFileNameW(nullptr, buf, 4096);
  return Narrow(std::wstring(buf, n));
}

inline uint64_t Addr(const void* p) { return reinterpret_cast<uint64_t>(p); }

template <typename F>
uint64_t FunctionAddr(F* f) {
  return reinterpret_cast<uint64_t>(reinterpret_cast<void*>(f));
}

// The address of a non-virtual member function (where a pointer to it
// starts in the Itanium C++ ABI, GCC's on Windows too).
template <typename M>
uint64_t MemberAddr(M member) {
  uint64_t address = 0;
  static_assert(sizeof member >= sizeof address);
  std::memcpy(&address, &member, sizeof address);
  return address;
}

// This program's base address, and `address` of it as its file lays it out
// (at its ImageBase: ASLR may have put it elsewhere).
inline uint64_t ExeBase() { return Addr(GetModuleHandleW(nullptr)); }
inline uint64_t FileAddress(uint64_t address) {
  const auto* base = reinterpret_cast<const unsigned char*>(GetModuleHandleW(nullptr));
  const auto* nt = reinterpret_cast<const IMAGE_NT_HEADERS64*>(
      base + reinterpret_cast<const IMAGE_DOS_HEADER*>(base)->e_lfanew);
  return nt->OptionalHeader.ImageBase + (address - Addr(base));
}

// A directory of its own under the temporary directory, removed with its
// files at the end.
class TempDir {
 public:
  TempDir() {
    wchar_t buf[MAX_PATH + 1];
    const DWORD n = GetTempPathW(MAX_PATH + 1, buf);
    // One of its own per instance: a file that DbgHelp faulted on stays
    // mapped (see SymbolizeFileSurvivesCorruptDebugInfo), so it can be
    // neither deleted nor rewritten.
    static int instances = 0;
    path_ = absl::StrCat(Narrow(std::wstring(buf, n)), "inprof_symbolizer_test_",
                         GetCurrentProcessId(), "_", ++instances);
    CreateDirectoryW(Widen(path_).c_str(), nullptr);
  }
  ~TempDir() {
    for (const std::string& f : files_) DeleteFileW(Widen(f).c_str());
    RemoveDirectoryW(Widen(path_).c_str());
  }
  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string file = absl::StrCat(path_, "\\", name);
    HANDLE h = CreateFileW(Widen(file).c_str(), GENERIC_WRITE, 0, nullptr, CREATE_ALWAYS,
                           FILE_ATTRIBUTE_NORMAL, nullptr);
    EXPECT_NE(h, INVALID_HANDLE_VALUE) << file;
    DWORD written = 0;
    WriteFile(h, bytes.data(), static_cast<DWORD>(bytes.size()), &written, nullptr);
    CloseHandle(h);
    EXPECT_EQ(written, bytes.size());
    files_.push_back(file);
    return file;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::vector<std::string> files_;
};

inline std::string ReadFileBytes(const std::string& path) {
  HANDLE h = CreateFileW(Widen(path).c_str(), GENERIC_READ, FILE_SHARE_READ, nullptr,
                         OPEN_EXISTING, FILE_ATTRIBUTE_NORMAL, nullptr);
  if (h == INVALID_HANDLE_VALUE) return "";
  std::string bytes;
  char buf[1 << 16];
  DWORD n = 0;
  while (ReadFile(h, buf, sizeof buf, &n, nullptr) && n > 0) bytes.append(buf, n);
  CloseHandle(h);
  return bytes;
}

// The offset in a PE file of the header of its section named `name` (long
// names, "/N", through the COFF string table); 0 when there is none.
inline size_t SectionHeaderOffset(const std::string& file, const std::string& name) {
  const auto* dos = reinterpret_cast<const IMAGE_DOS_HEADER*>(file.data());
  const size_t file_header = dos->e_lfanew + 4;
  const auto* header = reinterpret_cast<const IMAGE_FILE_HEADER*>(file.data() + file_header);
  const size_t table = file_header + sizeof(IMAGE_FILE_HEADER) + header->SizeOfOptionalHeader;
  const char* strings =
      file.data() + header->PointerToSymbolTable + 18 * size_t{header->NumberOfSymbols};
  for (int i = 0; i < header->NumberOfSections; ++i) {
    const size_t offset = table + i * sizeof(IMAGE_SECTION_HEADER);
    const char* raw = file.data() + offset;  // Name comes first
    std::string n(raw, strnlen(raw, IMAGE_SIZEOF_SHORT_NAME));
    if (!n.empty() && n[0] == '/') n = strings + std::stoul(n.substr(1));
    if (n == name) return offset;
  }
  return 0;
}

}  // namespace inprof::symbolizer_test

#endif  // INPROF_TESTS_WINDOWS_SYMBOLIZER_WINDOWS_TEST_UTIL_H_
