#include "core/global_batch.h"

#include <random>
#include <vector>

#include "core/analysis.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::core {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(GlobalBatchTest, CutsOnlyDocumentsLongerThanTheContext) {
  const Pieces p = CutToContext({25, 10, 3}, 10);
  EXPECT_THAT(p.lens, ElementsAre(10, 10, 5, 10, 3));
  EXPECT_THAT(p.doc, ElementsAre(0, 0, 0, 1, 2));
}

// Hand-worked: C = 10, two replicas. First fit: [9, 1] (45 + 1 pairs) and
// [3, 3, 3] (18): imbalance 46 / 32. Balanced: the 1 joins the threes:
// [9] (45) and [1, 3, 3, 3] (19): 45 / 32, the best with the 9 whole.
TEST(GlobalBatchTest, HandWorkedTwoReplicas) {
  GlobalBatchOptions o;
  o.dp_size = 2;
  o.cp_size = 2;
  o.context = 10;
  o.strategy = Strategy::kPerDoc;
  absl::StatusOr<GlobalBatchPlan> g = PlanGlobalBatch({9, 1, 3, 3, 3}, o);
  ASSERT_THAT(g, IsOk());
  EXPECT_DOUBLE_EQ(g->first_fit_imbalance, 46.0 / 32.0);
  EXPECT_DOUBLE_EQ(g->imbalance, 45.0 / 32.0);
  ASSERT_EQ(g->replicas.size(), 2u);
  EXPECT_THAT(g->replicas[0].doc_lens, ElementsAre(9));
  EXPECT_THAT(g->replicas[1].doc_lens, ElementsAre(1, 3, 3, 3));
  EXPECT_DOUBLE_EQ(g->replicas[0].workload, 45.0);
  EXPECT_DOUBLE_EQ(g->replicas[1].workload, 19.0);
  EXPECT_EQ(g->replicas[1].plan.cp_size, 2);
  EXPECT_THAT(ValidatePlan(g->replicas[1].plan), IsOk());
  EXPECT_THAT(g->replicas[1].plan.doc_lens, ElementsAre(1, 3, 3, 3));
}

TEST(GlobalBatchTest, ErrorsNameTheField) {
  GlobalBatchOptions o;
  o.dp_size = 2;
  o.context = 10;
  EXPECT_THAT(PlanGlobalBatch({6, 6, 6}, o),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("doc_lens: piece 2 (6 tokens) fits in none of the 2 replicas")));
  EXPECT_THAT(PlanGlobalBatch({11, 10}, o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("doc_lens: 21 tokens; more than dp_size x context = 2 x 10")));
  EXPECT_THAT(PlanGlobalBatch({1, 0}, o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("doc_lens[1]: 0")));
  o.dp_size = 0;
  EXPECT_THAT(PlanGlobalBatch({1}, o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dp_size: must be >= 1")));
  o.dp_size = 3;
  o.cp_size = 2;
  // Two pieces for three replicas: one replica is empty and has no CP plan.
  EXPECT_THAT(PlanGlobalBatch({5, 5}, o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("replica 2: ")));
}

// Invariants on 2,000 random global batches: every piece in exactly one
// replica, each within the context, documents cut only where longer than it,
// workloads and imbalance as stated, never above first fit's, and each
// replica's plan a valid plan of its pieces.
TEST(GlobalBatchTest, PropertiesOnRandomGlobalBatches) {
  std::mt19937_64 rng(27);
  int planned = 0, improved = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    GlobalBatchOptions o;
    o.dp_size = 1 + static_cast<int32_t>(rng() % 8);
    o.context = 16 + static_cast<int64_t>(rng() % 200);
    o.strategy = Strategy::kPerDoc;
    std::vector<int64_t> lens;
    int64_t total = 0;
    const int64_t cap = o.dp_size * o.context * (70 + static_cast<int64_t>(rng() % 31)) / 100;
    while (true) {
      const int64_t len = 1 + static_cast<int64_t>(rng() % (rng() % 4 == 0 ? 2 * o.context : 40));
      if (total + len > cap) break;
      lens.push_back(len);
      total += len;
    }
    if (lens.empty()) continue;
    const Pieces pieces = CutToContext(lens, o.context);
    if (!FirstFitReplicas(pieces.lens, o.dp_size, o.context).ok()) continue;
    absl::StatusOr<GlobalBatchPlan> g = PlanGlobalBatch(lens, o);
    if (!g.ok()) {  // only a replica left empty may fail (no plan of 0 tokens)
      ASSERT_THAT(g, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("replica ")));
      continue;
    }
    ++planned;
    EXPECT_EQ(g->pieces.lens, pieces.lens);
    std::vector<int> seen(pieces.lens.size(), 0);
    std::vector<std::vector<int32_t>> assignment;
    for (const ReplicaBatch& r : g->replicas) {
      int64_t tokens = 0;
      double work = 0;
      for (int32_t i : r.pieces) {
        ++seen[i];
        tokens += pieces.lens[i];
        work += ShardWorkload(0, pieces.lens[i]);
      }
      EXPECT_LE(tokens, o.context);
      EXPECT_DOUBLE_EQ(r.workload, work);
      ASSERT_THAT(ValidatePlan(r.plan), IsOk());
      EXPECT_EQ(TotalTokens(r.plan.doc_lens), tokens);
      assignment.push_back(r.pieces);
    }
    for (int s : seen) ASSERT_EQ(s, 1);
    EXPECT_DOUBLE_EQ(g->imbalance, ReplicaImbalance(pieces.lens, assignment));
    EXPECT_LE(g->imbalance, g->first_fit_imbalance + 1e-12);
    if (g->imbalance < g->first_fit_imbalance - 1e-9) ++improved;
  }
  EXPECT_GT(planned, 1000);
  // Many batches cannot improve (dp = 1, or one piece outweighs the rest);
  // with this seed 247 of about 1,100 do. The search must find them.
  EXPECT_GT(improved, 200);
}

}  // namespace
}  // namespace flashcp::core
