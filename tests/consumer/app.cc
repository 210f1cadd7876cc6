// A program built the way a consumer builds one: against the installed
// headers and library through pkg-config (consumer_test.sh), or with inprof
// as a Meson subproject. It profiles itself for a moment and says which
// heavy libraries ended up mapped: a host that does not upload must not
// carry libcurl or libprotobuf.
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include <inprof/inprof.h>

namespace {

__attribute__((noinline)) unsigned long ConsumerWork() {
  unsigned long x = 1;
  for (unsigned long i = 0; i < 300'000'000UL; ++i) x = x * 2862933555777941757UL + i;
  return x;
}

bool Mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find(name) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

int main() {
  unsigned long result = 0;
  {
    inprof::DefaultProfiler profiler(inprof::Options::FromEnv());
    inprof::ScopedProfiler running(profiler);
    auto self = profiler.RegisterThread("main");
    result = ConsumerWork();
  }
  std::printf("result %lu\n", result & 1);
  std::printf("libcurl mapped: %s\n", Mapped("libcurl") ? "yes" : "no");
  std::printf("libprotobuf mapped: %s\n", Mapped("libprotobuf") ? "yes" : "no");
  return 0;
}
