// internal: not part of the public API.
//
// gperftools' legacy text heap profile, for the drop-in's GetHeapProfile
// (<gperftools/heap-profiler.h>), made from inprof's pprof heap profile:
//
//   heap profile: INUSE_OBJS: INUSE_BYTES [ALLOC_OBJS: ALLOC_BYTES] @ heapprofile
//   INUSE_OBJS: INUSE_BYTES [ALLOC_OBJS: ALLOC_BYTES] @ 0xADDR 0xADDR ...
//   ...
//   MAPPED_LIBRARIES:
//   (the process's /proc/self/maps)
//
// One line per distinct stack (leaf first), by in-use bytes, largest first,
// as gperftools orders them. Readers subtract one from every address (they
// take them all for return addresses), so the leaf, an exact pc in inprof's
// profile, is written one past it. Frames without an address (inprof's own
// frames, "[inprof: ...]") are left out of the stacks; their values stay.
// gperftools' pprof (`google-pprof --text BINARY FILE`) reads it, alloc_*
// and inuse_*, symbolized from the binaries the maps name; `go tool pprof`
// (Go's own cmd/pprof, which symbolizes with Go's DWARF reader, not
// binutils) reads its values and source lines (-lines) but no C++
// function names.
//
// Thread-safety: reentrant.
#ifndef INPROF_INTERNAL_LEGACY_HEAP_H_
#define INPROF_INTERNAL_LEGACY_HEAP_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace inprof::internal {

// `pprof` (gzip-compressed or not) must have the sample types
// alloc_objects, alloc_space, inuse_objects and inuse_space; `maps` is
// copied after the MAPPED_LIBRARIES: line. InvalidArgument for a malformed
// profile or a missing type (the message names it).
absl::StatusOr<std::string> PprofToLegacyHeapProfile(std::string_view pprof,
                                                     std::string_view maps);

// The legacy contention profile, as Go's /debug/pprof/mutex?debug=1 and
// /block?debug=1 write it and `go tool pprof` reads it:
//
//   --- HEADER:                    ("mutex" or "contention")
//   cycles/second=1000000000
//   sampling period=1
//   DELAY_NS CONTENTIONS @ 0xADDR 0xADDR ...
//   --- Memory map: ---
//   (the process's /proc/self/maps)
//
// from a pprof profile with the sample types delay and contentions (their
// weighted values: the period is 1), one line per stack by delay, largest
// first, addresses written as for the heap form.
absl::StatusOr<std::string> PprofToLegacyContention(std::string_view pprof,
                                                    std::string_view maps,
                                                    std::string_view header);

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_LEGACY_HEAP_H_
