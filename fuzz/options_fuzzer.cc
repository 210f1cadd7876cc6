// libFuzzer target: the INPROF_* environment parsing (Options::FromLookup)
// and the flag parsers it is built from.
//
// Input: lines "NAME=VALUE"; the lookup answers each name with the value of
// its last line. The whole input is also given to each parser as one value.
// Checked: nothing crashes; options read from any environment validate
// (an invalid value keeps the default, it never reaches the profiler); every
// complaint is one line naming a variable; a duration accepted is in range.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "inprof/options.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::map<std::string, std::string> env;
  size_t start = 0;
  while (start <= input.size()) {
    size_t end = input.find('\n', start);
    if (end == std::string::npos) end = input.size();
    const std::string line = input.substr(start, end - start);
    const size_t eq = line.find('=');
    if (eq != std::string::npos) {
      env[line.substr(0, eq)] = line.substr(eq + 1);
    }
    start = end + 1;
  }
  std::vector<std::string> errors;
  const inprof::Options options = inprof::Options::FromLookup(
      [&](const char* name) -> const char* {
        auto it = env.find(name);
        return it == env.end() ? nullptr : it->second.c_str();
      },
      &errors);
  const absl::Status valid = options.Validate();
  if (!valid.ok()) {
    std::fprintf(stderr, "FromLookup produced invalid options: %s\n",
                 std::string(valid.message()).c_str());
    std::abort();
  }
  for (const std::string& e : errors) {
    if (e.empty() || e.find('\n') != std::string::npos ||
        !(absl::StrContains(e, "INPROF_") || absl::StrContains(e, "DD_"))) {
      std::fprintf(stderr, "bad complaint: '%s'\n", e.c_str());
      std::abort();
    }
  }

  (void)inprof::ParseBoolFlag("INPROF_FUZZ", input);
  const absl::Duration min = absl::Milliseconds(1), max = absl::Hours(1);
  for (const bool allow_zero : {false, true}) {
    auto d = inprof::ParseDurationFlag("INPROF_FUZZ", input, min, max,
                                       allow_zero);
    if (d.ok() && !(allow_zero && *d == absl::ZeroDuration()) &&
        (*d < min || *d > max)) {
      std::fprintf(stderr, "duration out of range accepted\n");
      std::abort();
    }
    if (!d.ok() && (d.status().message().find('\n') != absl::string_view::npos)) {
      std::abort();
    }
  }
  return 0;
}
