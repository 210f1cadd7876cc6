// inprof demo: profiles a small multi-threaded program and prints where its
// CPU time went, read back from the pprof file it wrote.
//
//   INPROF_OUTPUT=/tmp/demo.pb.gz ./demo
//   go tool pprof -top /tmp/demo.pb.gz
#include <inprof/inprof.h>
#include <inprof/pprof_reader.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace {

// The program being profiled: three kinds of work on three threads, plus
// one thread that mostly sleeps.
__attribute__((noinline)) double MultiplyMatrices(int n, int rounds) {
  std::vector<double> a(n * n, 1.5), b(n * n, 0.5), c(n * n);
  for (int r = 0; r < rounds; ++r) {
    for (int i = 0; i < n; ++i)
      for (int k = 0; k < n; ++k)
        for (int j = 0; j < n; ++j) c[i * n + j] += a[i * n + k] * b[k * n + j];
  }
  return c[n + 1];
}

__attribute__((noinline)) size_t ParseNumbers(int lines) {
  size_t total = 0;
  for (int i = 0; i < lines; ++i) {
    std::string line = std::to_string(i) + "," + std::to_string(i * 7) + "," +
                       std::to_string(i * 13);
    size_t at = 0;
    while (at < line.size()) {
      size_t comma = line.find(',', at);
      if (comma == std::string::npos) comma = line.size();
      total += std::strtoull(line.c_str() + at, nullptr, 10);
      at = comma + 1;
    }
  }
  return total;
}

__attribute__((noinline)) uint64_t HashBlocks(int blocks) {
  uint64_t h = 1469598103934665603ULL;
  for (int b = 0; b < blocks; ++b)
    for (int i = 0; i < 4096; ++i) h = (h ^ static_cast<uint64_t>(i + b)) * 1099511628211ULL;
  return h;
}

__attribute__((noinline)) void WaitForInput() {
  std::this_thread::sleep_for(std::chrono::milliseconds(900));
}

}  // namespace

int main() {
  inprof::Options options = inprof::Options::FromEnv();
  std::string output = options.output;
  {
    inprof::DefaultProfiler profiler(options);
    inprof::ScopedProfiler running(profiler);  // Stop() + profile at scope exit
    auto self = profiler.RegisterThread("main");

    volatile double sink = 0;
    std::thread parser([&] {
      auto registration = profiler.RegisterThread("parser");
      sink = sink + static_cast<double>(ParseNumbers(1'500'000));
    });
    std::thread hasher([&] {
      auto registration = profiler.RegisterThread("hasher");
      sink = sink + static_cast<double>(HashBlocks(60'000));
    });
    std::thread sleeper([&] {
      auto registration = profiler.RegisterThread("sleeper");
      WaitForInput();
    });
    sink = sink + MultiplyMatrices(160, 25);
    parser.join();
    hasher.join();
    sleeper.join();
    if (!running.start_status().ok()) return 1;
  }

  if (!options.enabled) {
    std::printf("INPROF_ENABLED=0: profiling was off, no profile written.\n");
    return 0;
  }
  auto profile = inprof::ReadPprofFile(output);
  if (!profile.ok()) {
    std::fprintf(stderr, "cannot read the profile: %s\n",
                 std::string(profile.status().message()).c_str());
    return 1;
  }
  const int cpu = profile->ValueIndex("cpu-time");
  const int64_t total = profile->Total(cpu);
  auto print_table = [&](const char* title, const auto& map, size_t limit) {
    std::vector<std::pair<std::string, int64_t>> rows(map.begin(), map.end());
    std::sort(rows.begin(), rows.end(),
              [](const auto& a, const auto& b) { return a.second > b.second; });
    std::printf("\n%s\n", title);
    for (size_t i = 0; i < rows.size() && i < limit; ++i) {
      std::printf("  %5.1f%%  %7.3fs  %s\n",
                  total ? 100.0 * rows[i].second / total : 0.0,
                  rows[i].second / 1e9, rows[i].first.c_str());
    }
  };
  std::printf("inprof demo: %.3f s of CPU in %zu samples\n", total / 1e9,
              static_cast<size_t>(profile->Total(profile->ValueIndex("cpu-samples"))));
  print_table("CPU time by function (self):", profile->FlatByFunction(cpu), 8);
  print_table("CPU time by thread:", profile->ByLabel("thread name", cpu), 8);
  std::error_code error;
  const std::filesystem::path absolute = std::filesystem::absolute(output, error);
  const std::string path = error ? output : absolute.string();
  std::printf("\nProfile written to %s\nExplore it with: go tool pprof -top %s\n",
              path.c_str(), path.c_str());
  return 0;
}
