// The base utilities: the one random generator and the one backoff.
#include <cstdint>
#include <vector>

#include "absl/time/time.h"
#include "core/backoff.h"
#include "core/random.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::core {
namespace {

using ::testing::ElementsAre;

// Vigna's reference splitmix64.c from seed 0 and seed 1234567.
TEST(SplitMix64Test, MatchesTheReferenceOutputs) {
  uint64_t state = 0;
  EXPECT_EQ(SplitMix64(state), 0xE220A8397B1DCDAFULL);
  EXPECT_EQ(SplitMix64(state), 0x6E789E6AA1B965F4ULL);
  SplitMix64Rng rng(1234567);
  EXPECT_EQ(rng.Next(), 6457827717110365317ULL);
  EXPECT_EQ(rng.Next(), 3203168211198807973ULL);
}

TEST(SplitMix64Test, UniformIsTheTop53BitsInZeroOne) {
  SplitMix64Rng a(7), b(7);
  for (int i = 0; i < 1000; ++i) {
    const double u = a.Uniform();
    EXPECT_EQ(u, static_cast<double>(b.Next() >> 11) * 0x1.0p-53);
    EXPECT_GE(u, 0.0);
    EXPECT_LT(u, 1.0);
  }
}

TEST(BackoffTest, GrowsGeometricallyUpToTheCap) {
  const BackoffPolicy policy{absl::Milliseconds(50), absl::Milliseconds(300), 2.0};
  EXPECT_EQ(BackoffDelay(policy, 1), absl::Milliseconds(50));
  EXPECT_EQ(BackoffDelay(policy, 2), absl::Milliseconds(100));
  EXPECT_EQ(BackoffDelay(policy, 3), absl::Milliseconds(200));
  EXPECT_EQ(BackoffDelay(policy, 4), absl::Milliseconds(300));
  EXPECT_EQ(BackoffDelay(policy, 40), absl::Milliseconds(300));
  // A multiplier below 1 counts as 1: the delay never shrinks.
  EXPECT_EQ(BackoffDelay({absl::Milliseconds(50), absl::Seconds(1), 0.5}, 3),
            absl::Milliseconds(50));
}

TEST(BackoffTest, DefaultIsTheWorkersHundredMillisecondsDoublingToOneSecond) {
  Backoff backoff;
  std::vector<absl::Duration> waits;
  for (int i = 0; i < 6; ++i) waits.push_back(backoff.Next());
  EXPECT_THAT(waits, ElementsAre(absl::Milliseconds(100), absl::Milliseconds(200),
                                 absl::Milliseconds(400), absl::Milliseconds(800), absl::Seconds(1),
                                 absl::Seconds(1)));
}

}  // namespace
}  // namespace flashcp::core
