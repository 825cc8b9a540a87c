#include "tests/testing/expected_plans.h"

#include <cstdint>

#include "core/plan_hash.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::tests::testing {

using ::testing::ElementsAre;

void ExpectRingPlanFor53(const v1::PlanResponse& r) {
  EXPECT_FALSE(r.has_error());
  EXPECT_EQ(r.strategy(), "ring");
  EXPECT_EQ(r.cp_size(), 2);
  EXPECT_THAT(r.doc_lens(), ElementsAre(5, 3));
  EXPECT_EQ(r.padding(), 0);
  ASSERT_EQ(r.shards_size(), 3);
  const int64_t want[3][4] = {{0, 0, 4, 0}, {0, 4, 1, 1}, {1, 0, 3, 1}};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(r.shards(i).doc(), want[i][0]) << i;
    EXPECT_EQ(r.shards(i).start(), want[i][1]) << i;
    EXPECT_EQ(r.shards(i).len(), want[i][2]) << i;
    EXPECT_EQ(r.shards(i).rank(), want[i][3]) << i;
  }
  EXPECT_EQ(r.plan_hash(), "acb8cc4eb63dfe48");  // core/plan_hash_test.cc's pinned value
  EXPECT_EQ(r.planner_version(), core::PlannerVersion());
  // Workloads (2p+s+1)s/2: rank 0 doc 0 [0,4) = 10; rank 1 [4,5) = 5 plus doc 1 = 6.
  EXPECT_THAT(r.metrics().rank_workload(), ElementsAre(10.0, 11.0));
  EXPECT_DOUBLE_EQ(r.metrics().imbalance_ratio(), 11.0 / 10.5);
  EXPECT_EQ(r.metrics().tokens_per_rank(), 4);
  EXPECT_THAT(r.metrics().rank_nonlast_tokens(), ElementsAre(4, 0));
  EXPECT_EQ(r.metrics().comm_saving_ratio(), 0.0);
  // Targeted, one phase: rank 0 sends 4 tokens, rank 1 receives 4, as full KV.
  EXPECT_EQ(r.metrics().targeted_saving_ratio(), 0.0);
  EXPECT_EQ(r.metrics().cut_docs(), 1);
  EXPECT_GE(r.metrics().planning_seconds(), 0.0);
}

v1::PlanRequest PlanRequestOf(uint64_t id, const std::vector<int64_t>& docs, int32_t cp,
                              const std::string& strategy) {
  v1::PlanRequest r;
  r.set_batch_id(id);
  for (int64_t d : docs) r.add_doc_lens(d);
  r.set_cp_size(cp);
  r.set_strategy(strategy);
  return r;
}

std::vector<int64_t> SlowIlpBatch() {
  std::vector<int64_t> docs;
  uint64_t x = 5;
  for (int i = 0; i < 100; ++i) {
    x = x * 6364136223846793005u + 1442695040888963407u;
    docs.push_back(static_cast<int64_t>(1 + (x >> 33) % 2000));
  }
  return docs;
}

}  // namespace flashcp::tests::testing
