#include "planner_service/calibration.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "core/clock.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner_service/rate_limiter.h"

namespace flashcp::planner_service {
namespace {

using core::testing::IsOk;

// `n` samples whose times are exactly `truth`'s, features over a CPU-sized
// range (a fixed LCG seeded by `seed`).
std::vector<core::CostSample> Samples(const core::CostCoefficients& truth, int n,
                                      uint64_t seed = 12345) {
  uint64_t x = seed;
  const auto next = [&x] {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<double>(x >> 11) * 0x1.0p-53;
  };
  std::vector<core::CostSample> v;
  for (int i = 0; i < n; ++i) {
    core::RankFeatures f{1e5 + 4e5 * next(), 1e5 + 6e5 * next(), std::floor(1 + 12 * next()),
                         1000 + std::floor(24 * next())};
    v.push_back({f, core::PredictRankCost(truth, f)});
  }
  return v;
}

// A device 2x slower than cpu-fp32 with sequences 1.5x as dear: within the rule.
constexpr core::CostCoefficients kNear{2 * 5.44e-8, 2 * 5.69e-8, 3 * 9.58e-5, 2 * 1.86e-6};

// Reports synchronously: the state the refit left.
absl::StatusOr<core::CostCalibrator::State> Report(Calibration& c, const std::string& tenant,
                                                   const std::string& reporter,
                                                   std::vector<core::CostSample> samples,
                                                   const std::string& profile = "cpu-fp32") {
  absl::StatusOr<core::CostCalibrator::State> out;
  absl::Notification done;
  c.Report({tenant, reporter}, proto::StepTimesReport{profile, std::move(samples)},
           [&](absl::StatusOr<core::CostCalibrator::State> s) {
             out = std::move(s);
             done.Notify();
           });
  done.WaitForNotification();
  return out;
}

TEST(CalibrationTest, AReportMovesOnlyItsOwnTenantsPlans) {
  NullObserver observer;
  Calibration c(&observer);
  absl::StatusOr<core::CostCalibrator::State> s = Report(c, "conn:a", "a", Samples(kNear, 40));
  ASSERT_THAT(s, IsOk());
  ASSERT_TRUE(s->calibrated) << s->status;
  const auto a = c.Resolve("conn:a", "cpu-fp32");
  ASSERT_THAT(a, IsOk());
  EXPECT_TRUE(a->second);
  EXPECT_NEAR(a->first.sequence, kNear.sequence, 1e-6 * kNear.sequence);
  const auto b = c.Resolve("conn:b", "cpu-fp32");
  ASSERT_THAT(b, IsOk());
  EXPECT_FALSE(b->second);
  EXPECT_EQ(b->first, *core::CostProfile("cpu-fp32"));
  // Another profile of the same tenant is not calibrated either.
  EXPECT_FALSE(c.Resolve("conn:a", "h200-cudnn")->second);
  EXPECT_EQ(c.Resolve("conn:a", "tpu").status().code(), absl::StatusCode::kNotFound);
}

TEST(CalibrationTest, FitsFarFromTheShippedProfileOrEqualToPairsAreRefusedWithTheReason) {
  NullObserver observer;
  Calibration c(&observer);
  // The probe's takeover: times that make sequences 20x as dear as shipped.
  const core::CostCoefficients far{5.44e-8, 5.69e-8, 20 * 9.58e-5, 1.86e-6};
  absl::StatusOr<core::CostCalibrator::State> s = Report(c, "t", "r", Samples(far, 40));
  ASSERT_THAT(s, IsOk());
  EXPECT_FALSE(s->calibrated);
  EXPECT_THAT(s->status, ::testing::StartsWith(
                             "refused: far from the shipped profile: sequence / whole_pair is "));
  EXPECT_FALSE(c.Resolve("t", "cpu-fp32")->second);
  // Times equal to the pairs count: the fit is the pairs model.
  s = Report(c, "u", "r", Samples({1, 1, 0, 0}, 40));
  ASSERT_THAT(s, IsOk());
  EXPECT_FALSE(s->calibrated);
  // The exact message depends on round-off in sequence and token (0 or not):
  // the pairs shape (core's test pins it) or 1.8e7 times the shipped scale.
  EXPECT_THAT(s->status, ::testing::StartsWith("refused: "));
  EXPECT_FALSE(c.Resolve("u", "cpu-fp32")->second);
  // An accepted fit stays through a later refused refit (its status says why).
  ASSERT_TRUE(Report(c, "v", "r", Samples(kNear, 40))->calibrated);
  s = Report(c, "v", "r", Samples(far, 1000, 7));
  EXPECT_TRUE(s->calibrated);
  EXPECT_EQ(s->fits, 1);
  EXPECT_THAT(s->status, ::testing::StartsWith("refused: far from the shipped profile"));
  EXPECT_NEAR(c.Resolve("v", "cpu-fp32")->first.sequence, kNear.sequence, 1e-6 * kNear.sequence);
}

TEST(CalibrationTest, NoReporterHoldsMoreThanItsShareOfAWindow) {
  NullObserver observer;
  CalibrationOptions o;
  o.window = 256;
  o.max_reporter_share = 0.25;  // 64 samples per reporter
  Calibration c(&observer, o);
  absl::StatusOr<core::CostCalibrator::State> s = Report(c, "t", "r1", Samples(kNear, 200));
  EXPECT_EQ(s->samples, 64);
  EXPECT_EQ(s->total, 200);
  s = Report(c, "t", "r2", Samples(kNear, 200, 2));
  EXPECT_EQ(s->samples, 128);
  s = Report(c, "t", "r3", Samples(kNear, 64, 3));
  s = Report(c, "t", "r4", Samples(kNear, 64, 4));
  EXPECT_EQ(s->samples, 256);
  // A fifth reporter takes room from the largest holders' oldest, never
  // more than its share.
  s = Report(c, "t", "r5", Samples(kNear, 200, 5));
  EXPECT_EQ(s->samples, 256);

  // A window that is full of one reporter's samples: a newcomer's samples
  // replace the holder's oldest.
  CalibrationOptions small;
  small.window = 64;
  small.max_reporter_share = 1.0;
  Calibration d(&observer, small);
  ASSERT_THAT(Report(d, "t", "big", Samples(kNear, 64)), IsOk());
  s = Report(d, "t", "new", Samples(kNear, 40, 9));
  EXPECT_EQ(s->samples, 64);
}

TEST(CalibrationTest, AFullQueueIsRefusedAtOnce) {
  NullObserver observer;
  CalibrationOptions o;
  o.max_pending = 0;
  Calibration c(&observer, o);
  EXPECT_EQ(Report(c, "t", "r", Samples(kNear, 40)).status(),
            absl::ResourceExhaustedError("ReportStepTimes: 0 reports already wait for the "
                                         "planner's refit; retry later"));
}

TEST(KeyedRateLimiterTest, BucketsPerKeyRefillWithTheClockAndForgetTheOldest) {
  core::ManualClock clock;
  KeyedRateLimiter limiter({.per_second = 2, .burst = 3, .max_keys = 2}, &clock);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(limiter.Allow("a")) << i;
  EXPECT_FALSE(limiter.Allow("a"));
  EXPECT_TRUE(limiter.Allow("b"));  // another key has its own bucket
  clock.Advance(absl::Milliseconds(499));
  EXPECT_FALSE(limiter.Allow("a"));
  clock.Advance(absl::Milliseconds(1));
  EXPECT_TRUE(limiter.Allow("a"));  // 0.5 s: one token
  EXPECT_FALSE(limiter.Allow("a"));
  // A third key forgets the least recently seen ("b"), never more than 2 kept.
  EXPECT_TRUE(limiter.Allow("c"));
  EXPECT_FALSE(limiter.Allow("a"));
}

}  // namespace
}  // namespace flashcp::planner_service
