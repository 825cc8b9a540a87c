// The device check's error measure (cp_check.h Compare), host only: exact
// values on hand-made vectors, including the all-zero references that one-token
// documents' dq and dk are.
#include "worker/cuda/cp_check.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "worker/attention_reference.h"

namespace flashcp::worker::cuda {
namespace {

TEST(CompareTest, RelativeToTheLargestReferenceMagnitude) {
  // max |diff| = 0.25 (third element), max |want| = 2; l2: sqrt(0.1^2 + 0.25^2) / sqrt(1 + 4 + 1).
  const ErrorStats e = Compare({1.1f, -2.0f, 0.75f}, {1.0f, -2.0f, 1.0f});
  EXPECT_NEAR(e.max_rel, 0.25 / 2.0, 1e-7);
  EXPECT_NEAR(e.l2_rel, std::sqrt(0.01 + 0.0625) / std::sqrt(6.0), 1e-7);
  EXPECT_EQ(e.nonfinite, 0);
  EXPECT_EQ(e.count, 3);
}

TEST(CompareTest, AllZeroReferenceIsJudgedAgainstTheFloor) {
  // dq of one-token documents: exactly 0; the GPU leaves fp32 rounding (1e-7).
  // Denominators: kRelErrFloor = 1e-2, and kRelErrFloor * sqrt(4) = 2e-2.
  ASSERT_EQ(worker::kRelErrFloor, 1e-2);
  const ErrorStats small = Compare({1e-7f, -1e-7f, 0.0f, 0.0f}, {0, 0, 0, 0});
  EXPECT_NEAR(small.max_rel, 1e-5, 1e-11);
  EXPECT_NEAR(small.l2_rel, std::sqrt(2e-14) / 2e-2, 1e-11);
  EXPECT_TRUE(Within(small, kBf16Tolerance));
  // A real error over a zero reference still fails: 1e-3 / 1e-2 = 0.1 > 2e-2.
  const ErrorStats big = Compare({1e-3f, 0, 0, 0}, {0, 0, 0, 0});
  EXPECT_NEAR(big.max_rel, 0.1, 1e-7);
  EXPECT_FALSE(Within(big, kBf16Tolerance));
}

TEST(CompareTest, NonFiniteAndSizeMismatchNeverPass) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const ErrorStats e = Compare({1.0f, nan}, {1.0f, 1.0f});
  EXPECT_EQ(e.nonfinite, 1);
  EXPECT_FALSE(Within(e, kBf16Tolerance));
  const ErrorStats m = Compare({1.0f}, {1.0f, 1.0f});
  EXPECT_EQ(m.nonfinite, -1);
  EXPECT_TRUE(std::isinf(m.max_rel));
  EXPECT_FALSE(Within(m, kBf16Tolerance));
}

}  // namespace
}  // namespace flashcp::worker::cuda
