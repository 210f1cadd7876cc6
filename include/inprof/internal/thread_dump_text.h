// internal: not part of the public API.
//
// A thread dump (ProfilerBase::DumpThreads: one sample per thread) as text,
// as Go prints its goroutines (/debug/pprof/goroutine?debug=2): a block per
// thread, ordered by thread id, headed by its id, name, state, the system
// call it waits in and for how long, then its labels and its frames, each
// function (inlined ones marked) over its file:line. Used by the live
// endpoint's /debug/pprof/threads?debug=2.
//
// Example output:
//   thread 4242 "worker" [blocked in futex, at least 1.5s]:
//   labels: {request=17}
//   WaitForWork(Queue&)
//           /src/worker.cc:42
//   Worker::Run() (inlined)
//           /src/worker.cc:80
//
// `grouped`: Go's debug=1 form instead, the threads grouped by stack and
// labels, the largest group first:
//   threads profile: total 9
//   3 @ 0x401a2c 0x401b10
//   # labels: {role=sleeper}
//   # threads: 4243 4244 4245
//   # state: blocked in read (3)
//   #	0x401a2c	BlockedInRead(int)	/src/worker.cc:42
//   #	0x401b10	main	/src/worker.cc:90
//
// Thread-safety: reentrant; the symbolizer is the caller's.
#ifndef INPROF_INTERNAL_THREAD_DUMP_TEXT_H_
#define INPROF_INTERNAL_THREAD_DUMP_TEXT_H_

#include <string>

#include "inprof/profile_data.h"
#include "inprof/symbolizer.h"

namespace inprof::internal {

std::string ThreadDumpText(const ProfileData& dump, Symbolizer& symbolizer,
                           bool grouped = false);

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_THREAD_DUMP_TEXT_H_
