// internal: not part of the public API.
//
// The sinks Options asks for, in the order they get each window: the
// output file (write_output), Datadog (datadog.enabled), Pyroscope
// (pyroscope.url), then Options::sinks. Without libcurl no uploader is made
// (one would retry each window and hold Stop() for INPROF_STOP_TIMEOUT):
// one line says so, naming what was configured.
#ifndef INPROF_INTERNAL_SINKS_FROM_OPTIONS_H_
#define INPROF_INTERNAL_SINKS_FROM_OPTIONS_H_

#include <memory>
#include <vector>

#include "inprof/options.h"
#include "inprof/sink.h"

namespace inprof::internal {

std::vector<std::shared_ptr<ProfileSink>> MakeSinks(const Options& options);

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_SINKS_FROM_OPTIONS_H_
