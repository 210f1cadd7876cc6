#include "inprof/alloc/alloc_sampler.h"

#include <cmath>
#include <cstdint>
#include <thread>

#include "gtest/gtest.h"

namespace inprof::internal {
namespace {

// Runs `fn` on a fresh thread: its countdown starts from nothing, whatever
// the test thread did before.
template <typename Fn>
void OnFreshThread(Fn fn) {
  std::thread(fn).join();
}

class AllocSamplerTest : public ::testing::Test {
 protected:
  void TearDown() override { SetAllocSamplingMean(0); }
};

TEST_F(AllocSamplerTest, MeanZeroSamplesNothing) {
  SetAllocSamplingMean(0);
  OnFreshThread([] {
    int sampled = 0;
    for (int i = 0; i < 10000; ++i) sampled += ShouldSampleAlloc(1 << 20);
    EXPECT_EQ(sampled, 0);
  });
}

TEST_F(AllocSamplerTest, MeanOneByteSamplesEveryAllocation) {
  SetAllocSamplingMean(1);
  OnFreshThread([] {
    int sampled = 0;
    for (int i = 0; i < 10000; ++i) sampled += ShouldSampleAlloc(48);
    // p = 1 - exp(-48): the countdown (ceil of Exp(1)) exceeds 48 bytes
    // with probability e^-48 ~ 1e-21 per allocation.
    EXPECT_EQ(sampled, 10000);
  });
}

TEST_F(AllocSamplerTest, ANewMeanReachesAThreadWithACountdownDrawnBefore) {
  OnFreshThread([] {
    SetAllocSamplingMean(0);
    EXPECT_FALSE(ShouldSampleAlloc(100));  // parks the countdown at "off"
    SetAllocSamplingMean(1);
    EXPECT_TRUE(ShouldSampleAlloc(100));
    SetAllocSamplingMean(0);
    EXPECT_FALSE(ShouldSampleAlloc(100));
  });
}

TEST_F(AllocSamplerTest, GuardSuppressesSamplingAndRestoresTheCountdown) {
  SetAllocSamplingMean(1);
  OnFreshThread([] {
    {
      AllocGuard guard;
      EXPECT_TRUE(AllocGuard::Active());
      for (int i = 0; i < 100; ++i) EXPECT_FALSE(ShouldSampleAlloc(48));
    }
    EXPECT_FALSE(AllocGuard::Active());
    EXPECT_TRUE(ShouldSampleAlloc(48));
  });
}

TEST_F(AllocSamplerTest, WeightIsOneOverTheSamplingProbability) {
  const AllocWeight w = SampleWeight(1024, 4096);
  const double p = 1.0 - std::exp(-0.25);
  EXPECT_NEAR(w.objects, 1.0 / p, 1e-9);
  EXPECT_NEAR(w.bytes, 1024.0 / p, 1e-6);
  // Much larger than the mean: p ~ 1, the sample is itself.
  EXPECT_NEAR(SampleWeight(1 << 30, 1).objects, 1.0, 1e-12);
  EXPECT_EQ(SampleWeight(0, 4096).objects, 0.0);
  EXPECT_EQ(SampleWeight(64, 0).bytes, 0.0);
}

// N allocations of s bytes with mean m: the countdown is memoryless (and
// stays so in whole bytes), so each is sampled independently with
// p = 1 - exp(-s/m) and the number sampled X is Binomial(N, p). The
// estimate of the bytes allocated is X * s/p, so its relative error is
// (X - Np)/Np.
//
// N = 200,000, s = 64, m = 4096: p = 1 - exp(-1/64) = 0.015504, mu = Np =
// 3100.8. Chernoff: P(|X - mu| >= d*mu) <= 2 exp(-d^2 mu / 3) for d <= 1;
// with d = 0.12: 2 exp(-0.0144 * 3100.8 / 3) = 2 exp(-14.88) = 6.9e-7
// <= 1e-6. So the estimate lies within 12% of the truth but for a chance
// below 1e-6 (the normal approximation would allow 6.8 sigma = 0.085).
TEST_F(AllocSamplerTest, EstimatedBytesWithinTheChernoffBound) {
  constexpr uint64_t kMean = 4096;
  constexpr size_t kSize = 64;
  constexpr int kCount = 200000;
  constexpr double kBound = 0.12;
  const double p = -std::expm1(-static_cast<double>(kSize) / kMean);
  const double mu = kCount * p;
  ASSERT_LE(2.0 * std::exp(-kBound * kBound * mu / 3.0), 1e-6);  // the arithmetic above
  SetAllocSamplingMean(kMean);
  OnFreshThread([&] {
    double estimated_bytes = 0;
    double estimated_objects = 0;
    int sampled = 0;
    for (int i = 0; i < kCount; ++i) {
      if (ShouldSampleAlloc(kSize)) {
        ++sampled;
        const AllocWeight w = SampleWeight(kSize, ThreadSampleMean());
        estimated_bytes += w.bytes;
        estimated_objects += w.objects;
      }
    }
    const double true_bytes = static_cast<double>(kCount) * kSize;
    EXPECT_NEAR(sampled, mu, kBound * mu);
    EXPECT_NEAR(estimated_bytes, true_bytes, kBound * true_bytes);
    EXPECT_NEAR(estimated_objects, kCount, kBound * kCount);
  });
}

}  // namespace
}  // namespace inprof::internal
