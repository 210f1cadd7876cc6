// inprof/labels.h: labels application code attaches to its thread's samples.
//
// ScopedLabels attaches string or numeric labels to everything the calling
// thread does until the scope ends; scopes nest, and an inner label with the
// same key overrides the outer one. Labels appear as pprof Labels on the
// samples taken inside the scope (CPU and wall), so a profile can be sliced
// by endpoint, request type or trace span. Datadog's correlation labels use
// the names below.
//
// Thread-safety: a ScopedLabels belongs to the thread that created it and
// must be destroyed on it (RAII does this). The signal handler (on Windows:
// the sampler, while the thread is suspended) reads the thread's current
// labels without locks or allocation. Keys and string
// values are interned (a mutex and a hash lookup on scope entry, no
// allocation once a string has been seen); there is room for 16 active
// labels per thread, more are counted and ignored. Without a registration
// on the calling thread (or with the profiler disabled) it does nothing.
//
// Example:
//   void Handle(const Request& r) {
//     inprof::ScopedLabels labels(profiler, {{"endpoint", r.path},
//                                            {inprof::kSpanIdLabel, r.span}});
//     Serve(r);
//   }
#ifndef INPROF_LABELS_H_
#define INPROF_LABELS_H_

#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "absl/strings/string_view.h"
#if defined(_WIN32)
#include "inprof/internal/thread_slot_windows.h"
#else
#include "inprof/internal/signal_dispatch.h"
#endif

namespace inprof {

// Datadog's correlation labels (numeric, numeric, string).
inline constexpr char kSpanIdLabel[] = "span id";
inline constexpr char kLocalRootSpanIdLabel[] = "local root span id";
inline constexpr char kTraceEndpointLabel[] = "trace endpoint";

// One label: a key and a string or a numeric value.
struct Label {
  Label(absl::string_view k, absl::string_view v) : key(k), str(v) {}
  Label(absl::string_view k, const char* v) : key(k), str(v) {}
  template <typename N>
    requires std::is_integral_v<N>
  Label(absl::string_view k, N v)
      : key(k), num(static_cast<int64_t>(v)), numeric(true) {}

  absl::string_view key;
  absl::string_view str;
  int64_t num = 0;
  bool numeric = false;
};

class ScopedLabels {
 public:
  // Attaches `labels` to the calling thread's samples until destruction.
  explicit ScopedLabels(std::initializer_list<Label> labels);
  // Same; `profiler` documents which profiler the labels are for.
  template <typename ProfilerT>
  ScopedLabels(ProfilerT& /*profiler*/, std::initializer_list<Label> labels)
      : ScopedLabels(labels) {}
  ~ScopedLabels();
  ScopedLabels(const ScopedLabels&) = delete;
  ScopedLabels& operator=(const ScopedLabels&) = delete;

  // Labels this scope attached (0 without a registration, or when full).
  uint32_t attached() const { return end_ - begin_; }

 private:
  internal::ThreadSlotHeader* slot_ = nullptr;
  uint64_t generation_ = 0;
  uint32_t begin_ = 0;
  uint32_t end_ = 0;
};

}  // namespace inprof

#endif  // INPROF_LABELS_H_
