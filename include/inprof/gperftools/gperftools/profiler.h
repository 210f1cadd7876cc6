/* <gperftools/profiler.h> on inprof: the CPU profiler API of gperftools,
   implemented by inprof's per-thread profiler so that a program written
   against gperftools builds and runs unchanged. Link it with
   `pkg-config --cflags --libs --static inprof-gperftools` instead of
   -lprofiler (the include path puts this header in <gperftools/...>), or
   preload libinprof_preload.so over a program already linked with
   -lprofiler.

   Differences a caller may notice:
   - every thread the program creates is registered and sampled on its own
     CPU clock (ProfilerRegisterThread only matters for threads created
     without pthread_create);
   - the file written is a pprof profile (gzip-compressed protobuf): `go tool
     pprof` reads it, as does gperftools' pprof from 2.11 on;
   - ProfilerFlush, ProfilerEnable and ProfilerDisable do nothing (the last
     two do nothing in gperftools 2.x either); a filter_in_thread callback
     is not called: every registered thread is profiled (said once on stderr).

   Thread-safety: every function may be called from any thread; none from a
   signal handler.

   Example:
     #include <gperftools/profiler.h>
     int main() {
       ProfilerStart("/tmp/app.prof");
       Work();
       ProfilerStop();   // /tmp/app.prof written
     }
*/
#ifndef INPROF_GPERFTOOLS_PROFILER_H_
#define INPROF_GPERFTOOLS_PROFILER_H_

#include <time.h>

#ifndef PERFTOOLS_DLL_DECL
#define PERFTOOLS_DLL_DECL
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Options of ProfilerStartWithOptions (zero-initialise it). */
struct ProfilerOptions {
  /* Not called by inprof: every registered thread is profiled. */
  int (*filter_in_thread)(void* arg);
  void* filter_in_thread_arg;
};

/* Starts profiling into `fname` (overwritten at ProfilerStop or exit).
   Returns nonzero on success; zero when profiling is on already, fname is
   null or empty, or the profiler cannot start (a line on stderr says why). */
PERFTOOLS_DLL_DECL int ProfilerStart(const char* fname);
PERFTOOLS_DLL_DECL int ProfilerStartWithOptions(
    const char* fname, const struct ProfilerOptions* options);

/* Stops profiling and writes the file. No-op when off. */
PERFTOOLS_DLL_DECL void ProfilerStop(void);

/* No-op: the file is written whole at ProfilerStop or exit. */
PERFTOOLS_DLL_DECL void ProfilerFlush(void);

/* No-ops, as in gperftools 2.x. */
PERFTOOLS_DLL_DECL void ProfilerEnable(void);
PERFTOOLS_DLL_DECL void ProfilerDisable(void);

/* Nonzero while profiling is on (for every registered thread). */
PERFTOOLS_DLL_DECL int ProfilingIsEnabledForAllThreads(void);

/* Registers the calling thread (threads made by pthread_create are
   registered already). */
PERFTOOLS_DLL_DECL void ProfilerRegisterThread(void);

struct ProfilerState {
  int enabled;              /* profiling is on */
  time_t start_time;        /* when it was started, if on */
  char profile_name[1024];  /* the file being written, or "" */
  int samples_gathered;     /* samples taken in this process so far */
};
PERFTOOLS_DLL_DECL void ProfilerGetCurrentState(struct ProfilerState* state);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* INPROF_GPERFTOOLS_PROFILER_H_ */
