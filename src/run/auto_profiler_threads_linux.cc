// The automatic profiler's threads (auto_profiler_state.h): pthread_create
// is interposed so that each thread the program creates is registered for
// exactly as long as its start routine runs (the automatic counterpart of
// RegisterThread, as DllMain's thread attach is on Windows), and
// pthread_setname_np and prctl so that thread names follow the program's.
#include <pthread.h>
#include <stdarg.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <new>
#include <string>

#include "inprof/inprof.h"
#include "src/run/auto_profiler_state.h"

namespace inprof::run::detail {
namespace {

struct StartArgs {
  void* (*fn)(void*);
  void* arg;
  bool internal;
};

// The program's thread, registered for as long as its start routine runs:
// the registration is undone when the routine returns, and by the unwinding
// pthread_exit() and cancellation do.
void* Trampoline(void* p) {
  StartArgs args = *static_cast<StartArgs*>(p);
  delete static_cast<StartArgs*>(p);
  if (args.internal) {
    t_inprof = true;
    return args.fn(args.arg);
  }
  PreloadProfiler* profiler = g_profiler.load(std::memory_order_acquire);
  if (profiler == nullptr) return args.fn(args.arg);
  ThreadRegistration registration;
  std::string name;
  {
    InprofScope scope;
    name = CurrentThreadName();
    registration = profiler->RegisterThread(name);
  }
  const pthread_t self = pthread_self();
  RememberTid(self, Gettid());
  {
    // The creator may have named this thread (pthread_setname_np(other))
    // after its name was read above and before RememberTid let the
    // interposer below find it: that rename found no thread, so it is
    // taken from the kernel now (the rename's lookup, under the same lock,
    // came before RememberTid; its write to the kernel before that). Lost
    // before: a CI run of RunTest.ThreadsOfAnUnmodifiedProgram... found
    // worker-b's 0.5 s of CPU under its creator's name.
    InprofScope scope;
    std::string now = CurrentThreadName();
    if (now != name) profiler->SetThreadName(Gettid(), now);
  }
  struct Undo {
    pthread_t self;
    ~Undo() { ForgetTid(self); }
  } undo{self};
  return args.fn(args.arg);
}

void Rename(pid_t tid, const char* name) {
  PreloadProfiler* profiler = g_profiler.load(std::memory_order_acquire);
  if (profiler == nullptr || tid <= 0 || name == nullptr) return;
  InprofScope scope;
  profiler->SetThreadName(tid, name);
}

}  // namespace
}  // namespace inprof::run::detail

using inprof::run::detail::InprofScope;
using inprof::run::detail::Next;
using inprof::run::detail::t_inprof;

extern "C" {

__attribute__((visibility("default"))) int pthread_create(
    pthread_t* thread, const pthread_attr_t* attr, void* (*fn)(void*),
    void* arg) {
  using Fn = int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*),
                     void*);
  static Fn real = Next<Fn>("pthread_create");
  if (real == nullptr) return EAGAIN;
  const bool internal = t_inprof;
  if (!internal && inprof::run::detail::g_profiler.load(std::memory_order_acquire) == nullptr) {
    return real(thread, attr, fn, arg);
  }
  auto* args = new (std::nothrow) inprof::run::detail::StartArgs{fn, arg, internal};
  if (args == nullptr) return real(thread, attr, fn, arg);
  const int rc = real(thread, attr, &inprof::run::detail::Trampoline, args);
  if (rc != 0) delete args;
  return rc;
}

__attribute__((visibility("default"))) int pthread_setname_np(
    pthread_t thread, const char* name) {
  using Fn = int (*)(pthread_t, const char*);
  static Fn real = Next<Fn>("pthread_setname_np");
  if (real == nullptr) return ENOSYS;
  const int rc = real(thread, name);
  if (rc != 0 || t_inprof) return rc;
  pid_t tid = 0;
  if (pthread_equal(thread, pthread_self())) {
    tid = inprof::run::detail::Gettid();
  } else {
    inprof::run::detail::State& s = inprof::run::detail::state();
    std::lock_guard<std::mutex> lock(s.tids_mu);
    auto it = s.tids.find(thread);
    if (it != s.tids.end()) tid = it->second;
  }
  inprof::run::detail::Rename(tid, name);
  return rc;
}

__attribute__((visibility("default"))) int prctl(int option, ...) {
  va_list ap;
  va_start(ap, option);
  unsigned long a2 = va_arg(ap, unsigned long);
  unsigned long a3 = va_arg(ap, unsigned long);
  unsigned long a4 = va_arg(ap, unsigned long);
  unsigned long a5 = va_arg(ap, unsigned long);
  va_end(ap);
  using Fn = int (*)(int, ...);
  static Fn real = Next<Fn>("prctl");
  if (real == nullptr) {
    errno = ENOSYS;
    return -1;
  }
  const int rc = real(option, a2, a3, a4, a5);
  if (rc == 0 && option == PR_SET_NAME && !t_inprof) {
    char name[17] = {};
    std::strncpy(name, reinterpret_cast<const char*>(a2), 16);
    inprof::run::detail::Rename(inprof::run::detail::Gettid(), name);
  }
  return rc;
}

}  // extern "C"
