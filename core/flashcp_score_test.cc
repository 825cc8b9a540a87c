// flashcp's score stage (flashcp_score.h): what candidates are compared by.
#include <cstdint>
#include <limits>
#include <vector>

#include "core/analysis.h"
#include "core/internal/flashcp_score.h"
#include "core/internal/flashcp_util.h"
#include "core/internal/strategies_internal.h"
#include "core/testing/status_matchers.h"
#include "core/types.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::core {
namespace {


// Docs {4, 4}, N = 2: workloads 13 and 7 (one cut document's pieces and a
// whole one), imbalance 13 / 10 = 1.3. Over a limit below it by more than the
// relative margin of 1e-9 only; a near tie is left to the plan's check.
TEST(ImbalanceCertainlyOverTest, DecidesOnlyBeyondTheMargin) {
  const Batch batch{{4, 4}, 2};
  const std::vector<double> workload =
      internal::PieceWorkloads(2, {{0, 0, 2, 0}, {0, 2, 2, 1}, {1, 0, 4, 0}});
  ASSERT_EQ(workload, (std::vector<double>{13, 7}));
  EXPECT_TRUE(internal::ImbalanceCertainlyOver(batch, workload, 1.3 * (1 - 1e-8)));
  EXPECT_FALSE(internal::ImbalanceCertainlyOver(batch, workload, 1.3 * (1 - 1e-12)));
  EXPECT_FALSE(internal::ImbalanceCertainlyOver(batch, workload, 1.3));
  EXPECT_FALSE(internal::ImbalanceCertainlyOver(batch, workload, 1.4));
  EXPECT_EQ(internal::WorkloadImbalance(workload), 1.3);
  EXPECT_EQ(internal::WorkloadImbalance({0, 0}), 1.0);
}

// Past 2^53 pairs the sums need not be exact: never known.
TEST(ImbalanceCertainlyOverTest, UnknownPastExactSums) {
  const Batch batch{{int64_t{1} << 27}, 2};  // W = 2^53 + 2^26
  EXPECT_FALSE(internal::ImbalanceCertainlyOver(batch, {0x1p53, 0}, 1.0));
  const Batch smaller{{(int64_t{1} << 26) + 1}, 2};  // below 2^53
  EXPECT_TRUE(internal::ImbalanceCertainlyOver(smaller, {0x1p51, 0}, 1.0));
}

TEST(ScorePiecesTest, CountsNonLastAndCuts) {
  // docs [6, 2] on 2 ranks: r0 [2,6) of doc 0 (W 18), r1 [0,2) of doc 0 (W 3,
  // non-last) and doc 1 (W 3). Mean 12: imbalance 1.5.
  const Batch batch{{6, 2}, 2};
  const internal::PlanScore s =
      internal::ScorePieces(batch, {{0, 2, 4, 0}, {0, 0, 2, 1}, {1, 0, 2, 1}});
  EXPECT_DOUBLE_EQ(s.imbalance, 1.5);
  EXPECT_EQ(s.max_nonlast, 2);
  EXPECT_EQ(s.cut_docs, 1);
  EXPECT_EQ(s.min_cut_len, 2);
}

internal::PlanScore Score(double imbalance, int64_t max_nonlast, int64_t cut_docs,
                          int64_t slivers) {
  internal::PlanScore s;
  s.imbalance = imbalance;
  s.max_nonlast = max_nonlast;
  s.cut_docs = cut_docs;
  s.slivers = slivers;
  return s;
}

TEST(BetterTest, TargetThenChargedCommunicationThenCuts) {
  constexpr double kTarget = 1.02;
  // Meeting the target beats any communication.
  EXPECT_TRUE(internal::Better(Score(1.02, 900, 9, 0), Score(1.03, 10, 1, 0), kTarget, 8));
  EXPECT_FALSE(internal::Better(Score(1.03, 10, 1, 0), Score(1.02, 900, 9, 0), kTarget, 8));
  // Both over it: less imbalance wins, whatever else.
  EXPECT_TRUE(internal::Better(Score(1.05, 900, 9, 3), Score(1.06, 10, 1, 0), kTarget, 8));
  // Both within: non-last tokens plus 8 per sliver: 100 + 2 x 8 =
  // 116 loses to 110, beats 117.
  EXPECT_FALSE(internal::Better(Score(1.0, 100, 1, 2), Score(1.01, 110, 1, 0), kTarget, 8));
  EXPECT_TRUE(internal::Better(Score(1.0, 100, 1, 2), Score(1.01, 117, 1, 0), kTarget, 8));
  // Equal charged cost: fewer cut documents; equal in all: neither.
  EXPECT_TRUE(internal::Better(Score(1.01, 116, 1, 0), Score(1.0, 100, 2, 2), kTarget, 8));
  EXPECT_FALSE(internal::Better(Score(1.0, 100, 2, 2), Score(1.0, 100, 2, 2), kTarget, 8));
}

TEST(SaturatingCostTest, SaturatesInsteadOfOverflowing) {
  EXPECT_EQ(internal::SaturatingCost(100, 2, 8), 116);
  EXPECT_EQ(internal::SaturatingCost(100, 0, int64_t{1} << 62), 100);
  EXPECT_EQ(internal::SaturatingCost(1, int64_t{1} << 40, int64_t{1} << 40),
            std::numeric_limits<int64_t>::max());
}

TEST(SameScoreTest, IgnoresOnlyTheShortestCut) {
  internal::PlanScore a = Score(1.0, 10, 1, 1), b = a;
  b.min_cut_len = 7;
  EXPECT_TRUE(internal::SameScore(a, b));
  b.slivers = 2;
  EXPECT_FALSE(internal::SameScore(a, b));
}

// Doc 0 (10 tokens) cut [0,2) r0, [2,10) r1, doc 1 (3) whole on r1. Short
// cuts below 3 tokens: the 2-token head only (doc 1 is not cut). Exchange:
// all-gather 2 non-last x (N - 1 = 1) = 2; targeted: r0 sends its 2-token
// head to r1, so 2.
TEST(CountSliversTest, CountsOnlyCutDocumentsAndMeasureBoth) {
  const Batch batch{{10, 3}, 2};
  const Plan plan = internal::FinishPlan(batch, {{0, 0, 2, 0}, {0, 2, 8, 1}, {1, 0, 3, 1}});
  EXPECT_EQ(internal::CountSlivers(plan, 3), 1);
  EXPECT_EQ(internal::CountSlivers(plan, 2), 0);
  EXPECT_EQ(internal::CountSlivers(plan, 9), 2);
  const internal::Exchange e = internal::Measure(plan, internal::ScorePlan(plan));
  EXPECT_EQ(e.allgather, 2);
  EXPECT_EQ(e.targeted, 2);
  EXPECT_EQ(e.cheaper(), 2);
}

}  // namespace
}  // namespace flashcp::core
