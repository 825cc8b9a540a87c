#include "worker/mask_reference.h"

#include <cstdint>
#include <random>
#include <vector>

#include "core/mask.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/attention_reference.h"

namespace flashcp::worker {
namespace {

using ::flashcp::core::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Documents {5, 3}, b = 2: rows 0-4 noisy doc 0, 5-7 noisy doc 1, 8-12 clean
// doc 0, 13-15 clean doc 1.
TEST(BlockDiffusionKeysTest, HandWorked) {
  const std::vector<int64_t> docs = {5, 3};
  // Noisy doc 0 position 3, block 1: noisy block 1 (rows 2, 3), clean block 0.
  EXPECT_THAT(BlockDiffusionKeys(docs, 2, 3), ElementsAre(2, 3, 8, 9));
  // Position 4, the partial block 2: itself, clean blocks 0 and 1.
  EXPECT_THAT(BlockDiffusionKeys(docs, 2, 4), ElementsAre(4, 8, 9, 10, 11));
  // Noisy doc 1 position 0: its block only, no clean prefix.
  EXPECT_THAT(BlockDiffusionKeys(docs, 2, 5), ElementsAre(5, 6));
  // Clean doc 0 position 0: block-causal, its whole block.
  EXPECT_THAT(BlockDiffusionKeys(docs, 2, 8), ElementsAre(8, 9));
  // Clean doc 1 position 2 (partial block 1 of a 3-token document).
  EXPECT_THAT(BlockDiffusionKeys(docs, 2, 15), ElementsAre(13, 14, 15));
}

// The oracle's pairs equal core's workload function (one mask, two codes).
TEST(BlockDiffusionKeysTest, PairsEqualCoreWorkload) {
  for (int64_t b : {1, 2, 3, 4, 7, 64}) {
    const std::vector<int64_t> docs = {5, 3, 1, 17, 8};
    double pairs = 0, want = 0;
    for (int64_t row = 0; row < 2 * 34; ++row) {
      pairs += static_cast<double>(BlockDiffusionKeys(docs, b, row).size());
    }
    for (int64_t len : docs) want += core::BlockDiffusionDocWorkload(len, b);
    EXPECT_EQ(pairs, want) << b;
  }
}

absl::Span<float> M(std::vector<float>& x) { return absl::MakeSpan(x); }

std::vector<float> Random(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> out(n);
  for (float& x : out) x = u(rng);
  return out;
}

// b = 1: a clean row sees the clean rows at or before it, the causal mask
// on the clean copy; with dout zero on the noisy rows, the clean rows'
// outputs and gradients equal the causal oracle's on the clean copy, and
// the noisy rows' gradients are 0.
TEST(BlockDiffusionReferenceTest, CleanCopyAtBlockOneIsCausal) {
  const AttentionShape shape{2, 8, 0.35f};
  const std::vector<int64_t> docs = {4, 1, 6};
  const int64_t c = 11, hd = 16;
  std::mt19937 rng(25);
  const std::vector<float> q = Random(2 * c * hd, rng), k = Random(2 * c * hd, rng),
                           v = Random(2 * c * hd, rng);
  std::vector<float> dout = Random(2 * c * hd, rng);
  std::fill(dout.begin(), dout.begin() + c * hd, 0.0f);
  std::vector<float> o(2 * c * hd), lse(2 * c * 2), dq(2 * c * hd), dk(2 * c * hd),
      dv(2 * c * hd);
  ASSERT_TRUE(BlockDiffusionReferenceForward(shape, docs, 1, q, k, v, M(o), M(lse)).ok());
  ASSERT_TRUE(BlockDiffusionReferenceBackward(shape, docs, 1, q, k, v, dout, M(dq), M(dk), M(dv)).ok());
  const auto clean = [&](const std::vector<float>& x, int64_t width) {
    return std::vector<float>(x.begin() + c * width, x.end());
  };
  std::vector<float> co(c * hd), clse(c * 2), cdq(c * hd), cdk(c * hd), cdv(c * hd);
  ASSERT_TRUE(ReferenceForward(shape, docs, clean(q, hd), clean(k, hd), clean(v, hd), M(co), M(clse)).ok());
  ASSERT_TRUE(ReferenceBackward(shape, docs, clean(q, hd), clean(k, hd), clean(v, hd),
                                clean(dout, hd), M(cdq), M(cdk), M(cdv))
                  .ok());
  EXPECT_EQ(clean(o, hd), co);
  EXPECT_EQ(clean(lse, 2), clse);
  EXPECT_EQ(clean(dq, hd), cdq);
  EXPECT_EQ(clean(dk, hd), cdk);
  EXPECT_EQ(clean(dv, hd), cdv);
  for (int64_t i = 0; i < c * hd; ++i) {
    ASSERT_EQ(dq[i], 0.0f);
    ASSERT_EQ(dk[i], 0.0f);
    ASSERT_EQ(dv[i], 0.0f);
  }
}

// b = 1: noisy row i sees itself and clean rows [0, i), so its output is the
// causal oracle's last row over the document [noisy i, clean 0 .. clean i-1].
TEST(BlockDiffusionReferenceTest, NoisyRowAtBlockOneIsCausalOverCleanPrefix) {
  const AttentionShape shape{1, 4, 0.5f};
  const std::vector<int64_t> docs = {6};
  const int64_t c = 6, hd = 4;
  std::mt19937 rng(7);
  const std::vector<float> q = Random(2 * c * hd, rng), k = Random(2 * c * hd, rng),
                           v = Random(2 * c * hd, rng);
  std::vector<float> o(2 * c * hd), lse(2 * c);
  ASSERT_TRUE(BlockDiffusionReferenceForward(shape, docs, 1, q, k, v, M(o), M(lse)).ok());
  for (int64_t i = 0; i < c; ++i) {
    const int64_t rows = i + 1;
    std::vector<float> sq(rows * hd), sk(rows * hd), sv(rows * hd), so(rows * hd), sl(rows);
    // Keys in the oracle's order (the noisy row's own block first, then the
    // clean prefix), so that both sum in the same order; the query last.
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t src = r == 0 ? i : c + r - 1;
      for (int64_t x = 0; x < hd; ++x) {
        sq[r * hd + x] = q[i * hd + x];
        sk[r * hd + x] = k[src * hd + x];
        sv[r * hd + x] = v[src * hd + x];
      }
    }
    ASSERT_TRUE(ReferenceForward(shape, std::vector<int64_t>{rows}, sq, sk, sv, M(so), M(sl)).ok());
    for (int64_t x = 0; x < hd; ++x) EXPECT_EQ(o[i * hd + x], so[i * hd + x]) << i;
    EXPECT_EQ(lse[i], sl[i]) << i;
  }
}

TEST(BlockDiffusionReferenceTest, BadInputsNameTheField) {
  const AttentionShape shape{1, 2, 1.0f};
  std::vector<float> x(2 * 3 * 2), l(2 * 3);
  EXPECT_THAT(BlockDiffusionReferenceForward(shape, std::vector<int64_t>{3}, 0, x, x, x, M(x), M(l)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("block_size")));
  std::vector<float> one_copy(3 * 2);  // C rows, not 2C
  EXPECT_THAT(
      BlockDiffusionReferenceForward(shape, std::vector<int64_t>{3}, 2, one_copy, x, x, M(x), M(l)),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("q: 6 floats, expected 12 (2C = 6 rows)")));
}

}  // namespace
}  // namespace flashcp::worker
