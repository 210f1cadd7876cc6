// What pipeline.cc shares with the requests' side (pipeline_requests.cc:
// Capture, Snapshot and their encoding for a server attached).
#ifndef INPROF_SRC_PIPELINE_PIPELINE_PARTS_H_
#define INPROF_SRC_PIPELINE_PIPELINE_PARTS_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>

#include "inprof/base/profiler_thread.h"
#include "inprof/internal/pipeline.h"

namespace inprof::internal {

// The collector and exporter threads, and what requests wait on.
struct Pipeline::Threads {
  std::mutex mutex;
  std::condition_variable cv;
  bool stop = false;
  ProfilerThread collector;
  ProfilerThread exporter;
  std::function<void()> drain;  // for the captures
  std::function<void()> edge;   // StartCollector's; may be empty
  int captures = 0;  // Capture()s using this object (guarded by `mutex`)
  // The collector's passes begun and finished, and whether one is asked
  // for now (DrainNow; guarded by `mutex`).
  uint64_t passes_begun = 0;
  uint64_t passes_done = 0;
  bool pass_wanted = false;
};

// `now` less `before` for the counters that are per window (the stats
// X-list's per_window column); the others as they are now.
ProfilerStats Delta(const ProfilerStats& now, const ProfilerStats& before);

// Leaves out the sample types of `mask` (bit i: sample_types[i]), whose
// values are all 0 in `data`: a provider's that is off, or those a snapshot
// did not fill.
void OmitTypes(ProfileData& data, uint64_t mask);

}  // namespace inprof::internal

#endif  // INPROF_SRC_PIPELINE_PIPELINE_PARTS_H_
