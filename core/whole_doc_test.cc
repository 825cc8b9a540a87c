// Whole-Doc sharding and the paper's Algorithm 1 (flashcp_paper), on batches
// small enough to work by hand. Workload of [p, p+s) is (2p + s + 1) * s / 2.
#include <vector>

#include "core/analysis.h"
#include "core/strategies.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::core {
namespace {

using ::flashcp::core::testing::IsOk;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;

struct Expected {
  const char* name;
  std::vector<int64_t> docs;
  int32_t cp_size;
  std::vector<Shard> shards;
  std::vector<double> workload;
};

class WholeDocTest : public ::testing::TestWithParam<Expected> {};

TEST_P(WholeDocTest, HandWorked) {
  const Expected& e = GetParam();
  absl::StatusOr<Plan> plan = MakePlan(Strategy::kWholeDoc, Batch{e.docs, e.cp_size});
  ASSERT_THAT(plan, IsOk());
  EXPECT_THAT(plan->shards, ElementsAreArray(e.shards));
  absl::StatusOr<PlanMetrics> m = AnalyzePlan(*plan, ModelShape{});
  ASSERT_THAT(m, IsOk());
  EXPECT_THAT(m->rank_workload, ElementsAreArray(e.workload));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, WholeDocTest,
    ::testing::Values(
        // [4, 4] on 2 ranks: LPT puts one whole document on each; tokens are
        // already equal (4, 4), so nothing is cut. Workload 10 each.
        Expected{"EqualDocsStayWhole", {4, 4}, 2, {{0, 0, 4, 0}, {1, 0, 4, 1}}, {10, 10}},
        // [6, 2] on 2 ranks, target 4 tokens each. LPT: doc 0 (W 21) -> r0,
        // doc 1 (W 3) -> r1. r0 has 2 excess tokens: it cuts doc 0's head
        // [0, 2) (W 3) for r1 and keeps the tail [2, 6): W (4+4+1)*4/2 = 18.
        // r1: 3 + 3 = 6.
        Expected{"HeadOfLongDocToUnderfullRank",
                 {6, 2},
                 2,
                 {{0, 2, 4, 0}, {0, 0, 2, 1}, {1, 0, 2, 1}},
                 {18, 6}},
        // [3] on 2 ranks: 3 tokens, targets 2 and 1 (one padding token on
        // r1). r0 holds the whole doc, 1 excess: head [0, 1) (W 1) to r1;
        // r0 keeps [1, 3): (2+2+1)*2/2 = 5.
        Expected{"PaddingTarget", {3}, 2, {{0, 1, 2, 0}, {0, 0, 1, 1}}, {5, 1}},
        // [9, 1, 1, 1] on 3 ranks, 4 tokens each. LPT: doc 0 -> r0 (W 45),
        // doc 1 -> r1, doc 2 -> r2, doc 3 -> r1 (tie at W 1, lowest index).
        // r0 has 5 excess; deficits r1 2, r2 3. The least-loaded receiver
        // first: r2 (W 1) takes head [0, 3) (W 6 -> r2 at 7); then r1 (W 2)
        // takes [3, 5) (W (6+2+1)*2/2 = 9 -> r1 at 11). r0 keeps [5, 9):
        // (10+4+1)*4/2 = 30. Total 30 + 11 + 7 = 48 = 45 + 3.
        Expected{"HeadSplitAcrossTwoReceivers",
                 {9, 1, 1, 1},
                 3,
                 {{0, 5, 4, 0}, {0, 3, 2, 1}, {1, 0, 1, 1}, {3, 0, 1, 1}, {0, 0, 3, 2},
                  {2, 0, 1, 2}},
                 {30, 11, 7}}),
    [](const ::testing::TestParamInfo<Expected>& info) { return std::string(info.param.name); });

// flashcp_paper's plan of `batch` at R = `r` has exactly `other`'s shards.
void ExpectPaperPlanIs(Strategy other, const Batch& batch, double r) {
  PlanOptions options;
  options.target_imbalance = r;
  absl::StatusOr<Plan> paper = MakePlan(Strategy::kFlashCpPaper, batch, options);
  absl::StatusOr<Plan> want = MakePlan(other, batch);
  ASSERT_THAT(paper, IsOk());
  ASSERT_THAT(want, IsOk());
  EXPECT_EQ(paper->shards, want->shards);
}

TEST(FlashCpPaperTest, StopsAtWholeDocWhenTargetMet) {
  // [6, 2] on 2 ranks: Whole-Doc's imbalance is 18 / 12 = 1.5 <= R = 2, so
  // Algorithm 1 returns the Whole-Doc plan with no Per-Doc documents.
  ExpectPaperPlanIs(Strategy::kWholeDoc, Batch{{6, 2}, 2}, 2.0);
}

TEST(FlashCpPaperTest, RemovesLongestDocumentsUntilDEmpty) {
  // [6, 2] on 2 ranks, R = 1.0 (unreachable).
  // k = 0: Whole-Doc, imbalance 1.5 > 1.
  // k = 1: doc 0 Per-Doc: 4 chunks of 1, leftovers to r0 and r1 front chunks:
  //   sizes [2, 2, 1, 1], owners [0, 1, 1, 0]: r0 [0,2) + [5,6) (W 3 + 6 = 9),
  //   r1 [2,5) (W (4+3+1)*3/2 = 12). Each needs 1 more token. Doc 1 by LPT to
  //   r0 (9 < 12), 1 excess: head [0,1) (W 1) to r1 -> r1 13, r0 keeps [1,2)
  //   (W 2) -> 11. Imbalance 13 / 12 > 1.
  // k = 2: D is empty; everything Per-Doc and the loop stops: the plan is
  //   exactly PlanPerDoc's.
  ExpectPaperPlanIs(Strategy::kPerDoc, Batch{{6, 2}, 2}, 1.0);
}

TEST(FlashCpPaperTest, OneLongDocumentPerDocRestWhole) {
  // [8, 2, 2] on 2 ranks (6 tokens each), R = 1.1.
  // k = 0: LPT doc 0 (W 36) -> r0, docs 1, 2 (W 3 each) -> r1. r0 has 2
  //   excess: head [0,2) (W 3) to r1: r0 keeps [2,8) = (4+6+1)*6/2 = 33, r1 9.
  //   Mean 21, imbalance 33/21 = 1.57 > 1.1.
  // k = 1: doc 0 Per-Doc: chunks of 2: r0 [0,2) + [6,8) (W 3 + 15 = 18),
  //   r1 [2,6) (W (4+4+1)*4/2 = 18). Each needs 2 more; LPT doc 1 -> r0
  //   (tie, lowest index), doc 2 -> r1: 21 and 21. Imbalance 1.0 <= 1.1.
  PlanOptions options;
  options.target_imbalance = 1.1;
  absl::StatusOr<Plan> plan = MakePlan(Strategy::kFlashCpPaper, Batch{{8, 2, 2}, 2}, options);
  ASSERT_THAT(plan, IsOk());
  EXPECT_THAT(plan->shards, ElementsAre(Shard{0, 0, 2, 0}, Shard{0, 6, 2, 0}, Shard{1, 0, 2, 0},
                                        Shard{0, 2, 4, 1}, Shard{2, 0, 2, 1}));
  absl::StatusOr<PlanMetrics> m = AnalyzePlan(*plan, ModelShape{});
  ASSERT_THAT(m, IsOk());
  EXPECT_THAT(m->rank_workload, ElementsAre(21.0, 21.0));
}

}  // namespace
}  // namespace flashcp::core
