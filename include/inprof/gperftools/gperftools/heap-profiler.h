/* <gperftools/heap-profiler.h> on inprof: gperftools' heap profiler API,
   implemented by inprof's sampled allocation profiler (AllocationProvider),
   with any allocator: glibc's malloc too, which gperftools' own heap
   profiler cannot use (it needs tcmalloc). Link it with `pkg-config
   --cflags --libs --static inprof-gperftools` instead of -ltcmalloc.
   (libinprof_preload.so does not take these calls over: a program linked
   with tcmalloc keeps tcmalloc's own heap profiler under `inprof run`.)

   Set HEAPPROFILE=PREFIX to profile from load to exit (PREFIX.0001.heap is
   written at exit), or call HeapProfilerStart(PREFIX). Allocations are
   sampled, not all recorded: one sample per INPROF_ALLOC_PERIOD bytes on
   average (512KiB when HEAPPROFILE is set and the variable is not), each
   weighted so that the estimates are unbiased.

   Differences a caller may notice:
   - allocation sampling must be on from the program's start: HEAPPROFILE
     or INPROF_ALLOC_PERIOD in its environment; HeapProfilerStart without
     either writes one line on stderr and does nothing;
   - each PREFIX.NNNN.heap file is a pprof profile (gzip-compressed
     protobuf) with alloc_objects, alloc_space (since the profiler started),
     inuse_objects and inuse_space (now): `go tool pprof
     -sample_index=inuse_space PREFIX.0001.heap` reads it;
   - besides HeapProfilerDump and exit, dumps come at gperftools'
     intervals: HEAP_PROFILE_ALLOCATION_INTERVAL bytes allocated since the
     last (1 GiB), HEAP_PROFILE_DEALLOCATION_INTERVAL freed (off),
     HEAP_PROFILE_INUSE_INTERVAL of growth of the bytes in use over their
     last high mark (100 MiB), HEAP_PROFILE_TIME_INTERVAL seconds (off);
     0 turns one off. They are checked on estimates (the samples' weights)
     every 100 ms on a thread of inprof's, not at each allocation, so a
     dump may come up to 100 ms after its interval was reached; a forked
     or exec'd child profiles its own heap, with checks of its own, into
     PREFIX_<pid>.NNNN.heap (gperftools' convention), never its parent's;
   - GetHeapProfile's text is gperftools' legacy format, made from the
     same sampled estimates: gperftools' pprof (`google-pprof --text
     BINARY FILE`) reads and symbolizes it; `go tool pprof` reads its
     values and, with -lines, its source lines, but finds no function
     names in a C++ binary for this format (its own symbolizer reads the
     DWARF line table only). The dumps
     are pprof files, which `go tool pprof` reads whole.

   Thread-safety: every function may be called from any thread; none from a
   signal handler, and none from inside an allocator.

   Example:
     #include <gperftools/heap-profiler.h>
     int main() {                    // run with INPROF_ALLOC_PERIOD=512KiB
       HeapProfilerStart("/tmp/app");
       Work();
       HeapProfilerDump("after work");   // /tmp/app.0001.heap
       HeapProfilerStop();
     }
*/
#ifndef INPROF_GPERFTOOLS_HEAP_PROFILER_H_
#define INPROF_GPERFTOOLS_HEAP_PROFILER_H_

#ifndef PERFTOOLS_DLL_DECL
#define PERFTOOLS_DLL_DECL
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Starts heap profiling; dumps go to PREFIX.NNNN.heap (NNNN from 0001).
   Starts the process's profiler if it is not running (its CPU profile then
   goes nowhere). No-op when heap profiling is on already. */
PERFTOOLS_DLL_DECL void HeapProfilerStart(const char* prefix);

/* Nonzero between HeapProfilerStart and HeapProfilerStop. */
PERFTOOLS_DLL_DECL int IsHeapProfilerRunning(void);

/* Stops heap profiling (no dump, as in gperftools). */
PERFTOOLS_DLL_DECL void HeapProfilerStop(void);

/* Writes the heap now to the next PREFIX.NNNN.heap; `reason` goes into the
   line on stderr that names the file. No-op when heap profiling is off. */
PERFTOOLS_DLL_DECL void HeapProfilerDump(const char* reason);

/* The heap now as gperftools' legacy text heap profile ("heap profile:
   ..." lines, then MAPPED_LIBRARIES: and /proc/self/maps), in a block from
   malloc() that the caller frees; "" when heap profiling is off. Write it
   to a file and read it with `google-pprof --text --inuse_space BINARY
   FILE` (gperftools' pprof). */
PERFTOOLS_DLL_DECL char* GetHeapProfile(void);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* INPROF_GPERFTOOLS_HEAP_PROFILER_H_ */
