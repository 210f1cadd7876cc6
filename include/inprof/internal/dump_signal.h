// internal: not part of the public API.
//
// Thread dumps on a signal the program hands over (INPROF_DUMP_SIGNAL,
// Options::dump_signal), as an attachment of the pipeline (pipeline.h):
// from StartCollector to StopCollector its handler wakes the
// "inprof-dump" thread, which writes the dump's text (Pipeline::
// ThreadDump, as /debug/pprof/threads?debug=2 serves it) to the program's
// stderr; the program runs on. Where the program handles the signal
// itself, one line says so and the signal stays the program's. Linux.
//
// Thread-safety: the pipeline calls the hooks; the handler only posts a
// semaphore (async-signal-safe).
#ifndef INPROF_INTERNAL_DUMP_SIGNAL_H_
#define INPROF_INTERNAL_DUMP_SIGNAL_H_

#include <signal.h>

#include <atomic>
#include <cstdint>

#include "inprof/base/profiler_thread.h"
#include "inprof/internal/pipeline.h"

namespace inprof::internal {

class DumpSignalAttachment final : public PipelineAttachment {
 public:
  explicit DumpSignalAttachment(int signal) : signal_(signal) {}
  ~DumpSignalAttachment() override { Stopping(); }

  // PipelineAttachment.
  void Started(Pipeline& pipeline) override;
  void Stopping() override;
  void Abandon() override;

  // Dumps written since construction (for tests).
  uint64_t dumps() const { return dumps_.load(); }

 private:
  const int signal_;
  bool installed_ = false;
  struct sigaction previous_ {};
  ProfilerThread thread_;
  std::atomic<uint64_t> dumps_{0};
};

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_DUMP_SIGNAL_H_
