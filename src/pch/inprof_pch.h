// The library's precompiled header (meson.build: cpp_pch; -Db_pch=false
// turns it off). Headers most of src/ includes, parsed once per build
// instead of once per source: 1.2-2 s of a source's 2.5-10 s under
// ASan+UBSan at -O0 (docs/test_command.md). Only the standard library
// and Abseil: inprof's own headers change too often to be worth it.
#ifndef INPROF_SRC_PCH_INPROF_PCH_H_
#define INPROF_SRC_PCH_INPROF_PCH_H_

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

#endif  // INPROF_SRC_PCH_INPROF_PCH_H_
