// inprof/base/sanitizers.h: which sanitizer this translation unit is
// built with, the same under GCC and clang. GCC spells it
// __SANITIZE_ADDRESS__ / __SANITIZE_THREAD__; clang 14 defines neither and
// answers __has_feature instead (the sanitizer suites build with clang,
// the plain one with GCC).
//
//   INPROF_ASAN  defined (as 1) under AddressSanitizer
//   INPROF_TSAN  defined (as 1) under ThreadSanitizer
#ifndef INPROF_BASE_SANITIZERS_H_
#define INPROF_BASE_SANITIZERS_H_

#if defined(__SANITIZE_ADDRESS__)
#define INPROF_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#define INPROF_TSAN 1
#endif
#if defined(__has_feature)
#if __has_feature(address_sanitizer) && !defined(INPROF_ASAN)
#define INPROF_ASAN 1
#endif
#if __has_feature(thread_sanitizer) && !defined(INPROF_TSAN)
#define INPROF_TSAN 1
#endif
#endif

#endif  // INPROF_BASE_SANITIZERS_H_
