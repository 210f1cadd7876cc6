// The tests' shared precompiled header: every test source that uses
// test_util_dep (tests/meson.build) is compiled with `-include` of this
// header, precompiled once per build by scripts/build_pch.py with the
// flags meson gives those sources. Parsing it is 1.5-2 s of a test
// source's 5-10 s (docs/test_command.md); meson's own cpp_pch would build
// it once per test executable, that is once per source.
#ifndef INPROF_TESTS_PCH_INPROF_TEST_PCH_H_
#define INPROF_TESTS_PCH_INPROF_TEST_PCH_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inprof/inprof.h"
#include "inprof/pprof_reader.h"
#include "util/test_util.h"

#endif  // INPROF_TESTS_PCH_INPROF_TEST_PCH_H_
