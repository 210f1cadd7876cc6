// tests/symbolize/symbolizer_test_util.h: helpers shared by the sources of
// symbolizer_test (symbolizer_test.cc, line_table_test.cc,
// symbolizer_debug_info_test.cc): where the test library is, a dlopen()ed
// library closed at scope exit, and a module's index in a Symbolizer.
//
// Thread-safety: LoadedLib is for one thread; the functions are reentrant.
#ifndef INPROF_TESTS_SYMBOLIZE_SYMBOLIZER_TEST_UTIL_H_
#define INPROF_TESTS_SYMBOLIZE_SYMBOLIZER_TEST_UTIL_H_

#include <dlfcn.h>
#include <link.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "inprof/symbolizer.h"

namespace inprof::symbolizer_test {

inline std::string TestLibPath() {
  const char* path = std::getenv("INPROF_SYMBOLIZER_TEST_LIB");
  return path != nullptr ? path : "";
}

// A dlopen'ed library, closed at scope exit.
class LoadedLib {
 public:
  explicit LoadedLib(const std::string& path)
      : handle_(dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) {}
  ~LoadedLib() { Close(); }
  LoadedLib(const LoadedLib&) = delete;
  LoadedLib& operator=(const LoadedLib&) = delete;

  bool ok() const { return handle_ != nullptr; }
  void Close() {
    if (handle_ != nullptr) dlclose(handle_);
    handle_ = nullptr;
  }
  uintptr_t Symbol(const char* name) const {
    return reinterpret_cast<uintptr_t>(dlsym(handle_, name));
  }
  // The load bias: runtime address minus file virtual address.
  uintptr_t Bias() const {
    link_map* map = nullptr;
    if (dlinfo(handle_, RTLD_DI_LINKMAP, &map) != 0 || map == nullptr) {
      return 0;
    }
    return map->l_addr;
  }

 private:
  void* handle_;
};

inline int ModuleIndexOf(const Symbolizer& symbolizer, const std::string& path) {
  const std::vector<ModuleInfo>& modules = symbolizer.modules();
  for (size_t i = 0; i < modules.size(); ++i) {
    if (modules[i].path == path) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace inprof::symbolizer_test

#endif  // INPROF_TESTS_SYMBOLIZE_SYMBOLIZER_TEST_UTIL_H_
