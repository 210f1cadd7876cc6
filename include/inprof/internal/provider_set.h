// internal: not part of the public API.
//
// What a Profiler<U, R, Ps...> derives from its providers on every
// platform (profiler.h, windows/profiler_windows.h): where each provider's
// values sit in a sample's value vector, the pprof sample types, the
// "unwinder=... providers=..." line, configuring and describing them; and
// the canonical label words the collector keys the aggregate by.
//
// Thread-safety: constants and pure functions; Configure/Describe touch
// only the providers passed in.
//
// Example:
//   using Set = internal::ProviderSet<CpuTimeProvider, WallTimeProvider>;
//   static_assert(Set::kNumValues == 4);
//   std::vector<ValueType> types = Set::SampleTypes();
#ifndef INPROF_INTERNAL_PROVIDER_SET_H_
#define INPROF_INTERNAL_PROVIDER_SET_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "inprof/internal/label_table.h"
#include "inprof/options.h"
#include "inprof/profile_data.h"

namespace inprof::internal {

template <typename... Ps>
struct ProviderSet {
  static constexpr size_t kNumProviders = sizeof...(Ps);
  // Values per provider (its sample types), and where they start.
  static constexpr std::array<size_t, kNumProviders> kValueCounts{Ps::kSampleTypes.size()...};
  static constexpr std::array<size_t, kNumProviders> kValueOffsets = [] {
    std::array<size_t, kNumProviders> offsets{};
    size_t at = 0;
    for (size_t i = 0; i < kNumProviders; ++i) {
      offsets[i] = at;
      at += kValueCounts[i];
    }
    return offsets;
  }();
  static constexpr size_t kNumValues =
      kValueOffsets[kNumProviders - 1] + kValueCounts[kNumProviders - 1];
  static constexpr size_t kMaxValuesPerProvider = [] {
    size_t m = 0;
    for (size_t c : kValueCounts) m = c > m ? c : m;
    return m;
  }();

  // The pprof sample types, in value order.
  static std::vector<ValueType> SampleTypes() {
    std::vector<ValueType> types;
    (
        [&] {
          for (const auto& t : Ps::kSampleTypes) types.push_back({t.type, t.unit});
        }(),
        ...);
    return types;
  }

  // The first provider's period type (pprof's period_type).
  static ValueType PeriodType() {
    using First = std::tuple_element_t<0, std::tuple<Ps...>>;
    const auto& t = First::kSampleTypes[First::kPeriodTypeIndex];
    return {t.type, t.unit};
  }

  // "unwinder=frame-pointer providers=cpu,wall".
  static std::string Engine(const char* unwinder) {
    std::vector<std::string> names{Ps::kName...};
    return absl::StrCat("unwinder=", unwinder, " providers=", absl::StrJoin(names, ","));
  }

  // Configures each provider in order; the first error.
  static absl::Status Configure(std::tuple<Ps...>& providers, const Options& options) {
    absl::Status status;
    std::apply(
        [&](auto&... p) {
          ((status.ok() ? (void)status.Update(p.Configure(options)) : void()), ...);
        },
        providers);
    return status;
  }

  // What the providers that say so (Describe(): the CPU engine; the wall
  // sampler when it held descriptors back) say, "; "-joined, for the log and
  // the profile's comments.
  static std::string Describe(const std::tuple<Ps...>& providers) {
    std::vector<std::string> parts;
    std::apply(
        [&](const auto&... p) {
          (
              [&] {
                if constexpr (requires { p.Describe(); }) {
                  if (std::string part = p.Describe(); !part.empty()) {
                    parts.push_back(std::move(part));
                  }
                }
              }(),
              ...);
        },
        providers);
    return absl::StrJoin(parts, "; ");
  }
};

// A Profiler's providers, in a base constructed before the profiler's state
// (ProfilerCommon, whose pipeline needs the first provider's period).
template <typename... Ps>
struct ProviderHolder {
  std::tuple<Ps...> providers_;

  // The first provider's period as `options` configure it; 0 when they do
  // not.
  int64_t FirstPeriod(const Options& options) {
    auto& first = std::get<0>(providers_);
    if (!first.Configure(options).ok()) return 0;
    return static_cast<int64_t>(first.Period());
  }

  // Each provider's address, in order (internal/provider_table.h).
  std::vector<void*> ProviderAddresses() {
    return std::apply([](auto&... p) { return std::vector<void*>{static_cast<void*>(&p)...}; },
                      providers_);
  }
};

// CanonicalLabelWords: label_table.h.

}  // namespace inprof::internal

#endif  // INPROF_INTERNAL_PROVIDER_SET_H_
