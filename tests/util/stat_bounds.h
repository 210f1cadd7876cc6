// tests/util/stat_bounds.h: bounds for assertions on what sampling produces.
//
// A test that asserts on a sampled count or share states the distribution
// it follows and bounds it so that a correct profiler fails at most once in
// 10^6 runs (kFalseFailure, per side of each bound). These functions turn a distribution and that
// chance into the bound, using Chernoff-style tail inequalities: each holds
// for every n and mean (no normal approximation), so the chance of a false
// failure is at most what is asked, usually much less.
//
// Example:
//   // 20,000 threads, each sampled with chance f_i: a sum of independent
//   // Bernoulli draws, mean sum(f_i) ~ 400.
//   EXPECT_GE(samples, stats::PoissonLow(400.0));
//
// Thread-safety: pure functions.
#ifndef INPROF_TESTS_UTIL_STAT_BOUNDS_H_
#define INPROF_TESTS_UTIL_STAT_BOUNDS_H_

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace inprof::stats {

// The chance of a false failure each bound is computed for: one side of one
// bound. A test checks at most 10 such sides (the class test: 4 classes x 2
// sides), so by the union bound a correct profiler fails a test at most once
// in 10^6 runs.
inline constexpr double kFalseFailure = 1e-7;

namespace internal {

// KL divergence between Bernoulli(a) and Bernoulli(b).
inline double BernoulliKl(double a, double b) {
  auto term = [](double x, double y) {
    return x <= 0 ? 0.0 : x * std::log(x / y);
  };
  return term(a, b) + term(1 - a, 1 - b);
}

// Solves f(x) = target for x in [lo, hi], f monotone, by bisection.
template <typename F>
double Bisect(F f, double lo, double hi, double target, bool increasing) {
  for (int i = 0; i < 200; ++i) {
    const double mid = (lo + hi) / 2;
    const bool above = f(mid) > target;
    if (above == increasing) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  return (lo + hi) / 2;
}

}  // namespace internal

// A binomial share: n independent trials, each a success with chance p.
// The lowest / highest share of successes that a chance of at most `chance`
// (each side) lies beyond: P(X/n <= low) <= exp(-n KL(low || p)).
inline double BinomialShareLow(int64_t n, double p, double chance = kFalseFailure) {
  if (n <= 0 || p <= 0) return 0;
  if (p >= 1) return 1;
  const double target = std::log(1 / chance) / static_cast<double>(n);
  if (internal::BernoulliKl(0, p) <= target) return 0;
  return internal::Bisect([p](double x) { return internal::BernoulliKl(x, p); },
                          0, p, target, /*increasing=*/false);
}
inline double BinomialShareHigh(int64_t n, double p, double chance = kFalseFailure) {
  if (n <= 0 || p >= 1) return 1;
  if (p <= 0) return 0;
  const double target = std::log(1 / chance) / static_cast<double>(n);
  if (internal::BernoulliKl(1, p) <= target) return 1;
  return internal::Bisect([p](double x) { return internal::BernoulliKl(x, p); },
                          p, 1, target, /*increasing=*/true);
}

// A count that is a sum of independent Bernoulli draws (a Poisson binomial:
// threads each sampled or not) or Poisson, with mean `mean`. Both tails
// obey the Poisson Chernoff bound P(X <= k) <= exp(-mean) (e mean / k)^k
// (k < mean) and P(X >= k) <= exp(-mean) (e mean / k)^k (k > mean).
inline double PoissonLogTail(double mean, double k) {
  if (k <= 0) return -mean;
  return -mean + k + k * std::log(mean / k);
}
inline double PoissonLow(double mean, double chance = kFalseFailure) {
  if (mean <= 0) return 0;
  const double target = std::log(chance);
  if (PoissonLogTail(mean, 0) >= target) return 0;
  return internal::Bisect([mean](double k) { return PoissonLogTail(mean, k); }, 0,
                          mean, target, /*increasing=*/true);
}
inline double PoissonHigh(double mean, double chance = kFalseFailure) {
  const double target = std::log(chance);
  double hi = std::max(1.0, mean);
  while (PoissonLogTail(mean, hi) > target) hi *= 2;
  return internal::Bisect([mean](double k) { return PoissonLogTail(mean, k); },
                          std::max(mean, 0.0), hi, target, /*increasing=*/false);
}

// A sum of independent terms, each within `range` of its mean, whose
// variances add up to `variance`: how far from its mean the sum may be
// with a chance of at most `chance` (each side). Bernstein's inequality:
// P(S - E >= t) <= exp(-t^2 / (2 (variance + range t / 3))).
// A thread's CPU in the profile is such a term: period x (the lattice
// points its CPU crossed), within one period of its CPU, with variance
// period^2 f (1 - f) where f is the fractional part of CPU / period.
inline double BernsteinDeviation(double variance, double range,
                                 double chance = kFalseFailure) {
  const double l = std::log(1 / chance);
  // t^2 = 2 l (variance + range t / 3), solved for t > 0.
  const double b = 2 * l * range / 3;
  return (b + std::sqrt(b * b + 8 * l * variance)) / 2;
}

// A sum of `n` independent terms, each in an interval `range` wide: how far
// from its mean the sum may be with a chance of at most `chance` (each
// side). Hoeffding's inequality: P(S - E >= t) <= exp(-2 t^2 / (n range^2)).
// For terms whose variance is not known (Bernstein needs it).
inline double HoeffdingDeviation(int64_t n, double range, double chance = kFalseFailure) {
  return range * std::sqrt(static_cast<double>(n) * std::log(1 / chance) / 2);
}

// The range of a sampled allocation estimate over its truth: `n`
// allocations of `size` bytes each at a mean sampling period of `period`
// bytes. Each is sampled with chance p = 1 - exp(-size/period),
// independently (the byte countdown is memoryless), and stands for size/p
// bytes, so estimate / truth = (samples / n) / p with samples ~
// Binomial(n, p): BinomialShare{Low,High} bound it, each side at `chance`.
// A profile's value is within one byte of its exact sum, < 0.1% for the
// sizes the tests use (>= 1,000 bytes a sample).
struct EstimateRange {
  double low;
  double high;
};
inline EstimateRange SampledAllocationRange(int64_t n, double size, double period,
                                            double chance = kFalseFailure) {
  const double p = 1 - std::exp(-size / period);
  return {BinomialShareLow(n, p, chance) / p * 0.999,
          BinomialShareHigh(n, p, chance) / p * 1.001};
}

}  // namespace inprof::stats

#endif  // INPROF_TESTS_UTIL_STAT_BOUNDS_H_
