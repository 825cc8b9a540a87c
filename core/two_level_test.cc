// The two-level scheme's bytes (core/two_level.h) on hand-worked plans, its
// refusals, and flashcp's choice taking it where it moves the least.
#include "core/two_level.h"

#include <vector>

#include "core/analysis.h"
#include "core/group_schemes.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::core {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// MHA, H = Hq = Hkv = 2, D = 1, 1 byte: a byte is a (token, head) row.
const ModelShape kShape{2, 1, 1, 0};

Plan MakeManual(std::vector<int64_t> doc_lens, int32_t n, std::vector<Shard> shards) {
  Plan p;
  p.cp_size = n;
  p.doc_lens = std::move(doc_lens);
  p.shards = std::move(shards);
  return p;
}

// One document of 8 tokens in order over 4 ranks, 2 nodes of 2: node 0 holds
// positions 0-3, node 1 positions 4-7. Node part size P = 2: position j
// computes query head j and KV head j (kv_j = 1). Within a node (t = 2,
// S = 4, K = 2): sent = t (K-1) Hq/K + 2 t (Hkv - kv_j) + (S - t) Hq/K
// = 2 + 4 + 2 = 8, received 8. Across: node 1's queries need all 4 tokens
// of node 0 (need[0][1] = 4), node 0's none of node 1's: each node-0 rank
// sends 2 kv_j x 4 = 8 rows to its same-position rank on node 1.
TEST(TwoLevelTest, OneDocumentInOrderOverTwoNodes) {
  const Plan plan = MakeManual({8}, 4, {{0, 0, 2, 0}, {0, 2, 2, 1}, {0, 4, 2, 2}, {0, 6, 2, 3}});
  ASSERT_THAT(ValidatePlan(plan), IsOk());
  absl::StatusOr<TwoLevelParts> parts = TwoLevelNeeds(plan, {0, 1, 2, 3}, 2);
  ASSERT_THAT(parts, IsOk());
  EXPECT_THAT(parts->parts, ElementsAre(ElementsAre(0, 1), ElementsAre(2, 3)));
  EXPECT_THAT(parts->need, ElementsAre(ElementsAre(0, 4), ElementsAre(0, 0)));
  absl::StatusOr<PlanMetrics> m = AnalyzePlan(plan, kShape, 2);
  ASSERT_THAT(m, IsOk());
  absl::StatusOr<GroupPhaseBytes> b = TwoLevelGroupPhase(plan, *m, {0, 1, 2, 3}, kShape, 2);
  ASSERT_THAT(b, IsOk());
  EXPECT_THAT(b->sent, ElementsAre(16, 16, 8, 8));
  EXPECT_THAT(b->received, ElementsAre(8, 8, 16, 16));
  EXPECT_THAT(b->inter_sent, ElementsAre(8, 8, 0, 0));
  EXPECT_THAT(b->inter_received, ElementsAre(0, 0, 8, 8));
}

// Zigzag-like: one document of 16 over 4 ranks, rank 0 [0,2) + [14,16),
// rank 1 [2,4) + [12,14), rank 2 [4,6) + [10,12), rank 3 [6,10). Node 0
// holds positions 0-3 and 12-15, node 1 4-11. Node 1's last position is
// 11: it needs node 0's tokens before 12, 0-3 (4); node 0's last is 15: it
// needs all 8 of node 1's. Within a node t = 4, S = 8: 4 + 8 + 4 = 16 each
// way. Node 0 ranks: inter sent 2 x 4 = 8, received 2 x 8 = 16.
TEST(TwoLevelTest, ZigzaggedDocumentNeedsBothWays) {
  const Plan plan = MakeManual({16}, 4,
                               {{0, 0, 2, 0}, {0, 14, 2, 0}, {0, 2, 2, 1}, {0, 12, 2, 1},
                                {0, 4, 2, 2}, {0, 10, 2, 2}, {0, 6, 4, 3}});
  ASSERT_THAT(ValidatePlan(plan), IsOk());
  absl::StatusOr<TwoLevelParts> parts = TwoLevelNeeds(plan, {0, 1, 2, 3}, 2);
  ASSERT_THAT(parts, IsOk());
  EXPECT_THAT(parts->need, ElementsAre(ElementsAre(0, 4), ElementsAre(8, 0)));
  // The runs the exchange carries, documents ascending, each's by start:
  // node 0's [0, 2) and [2, 4) (before 12); node 1's [4, 6), [6, 10), [10, 12).
  EXPECT_TRUE(parts->runs[0][0].empty());
  EXPECT_EQ(parts->runs[0][1], (std::vector<DocRun>{{0, 0, 2}, {0, 2, 2}}));
  EXPECT_EQ(parts->runs[1][0], (std::vector<DocRun>{{0, 4, 2}, {0, 6, 4}, {0, 10, 2}}));
  absl::StatusOr<PlanMetrics> m = AnalyzePlan(plan, kShape, 2);
  ASSERT_THAT(m, IsOk());
  absl::StatusOr<GroupPhaseBytes> b = TwoLevelGroupPhase(plan, *m, {0, 1, 2, 3}, kShape, 2);
  ASSERT_THAT(b, IsOk());
  EXPECT_THAT(b->inter_sent, ElementsAre(8, 8, 16, 16));
  EXPECT_THAT(b->inter_received, ElementsAre(16, 16, 8, 8));
  EXPECT_THAT(b->sent, ElementsAre(24, 24, 32, 32));
  EXPECT_THAT(b->received, ElementsAre(32, 32, 24, 24));
}

// Three documents chaining four ranks into one group: [3, 2, 3], 2 tokens a
// rank: rank 0 d0[0,2), rank 1 d0[2,3) d1[0,1), rank 2 d1[1,2) d2[0,1),
// rank 3 d2[1,3). Only d1 crosses the node boundary: node 1 needs its token
// 0 (need[0][1] = 1), so each node-0 rank sends 2 rows across.
// flashcp's choice (weight 8): targeted sends that token's 2 Hkv = 4 rows
// across from rank 1 alone (32 weighted); allgather within the group sends
// blocks of 2 tokens (8 rows) to 2 ranks across (128); the all-to-all over 4
// does not split Hq = 2; the two-level scheme: max(8 intra, 8 x 2) = 16.
TEST(TwoLevelTest, FlashCpChoosesItForAChainedGroupWithAShortCrossing) {
  const Plan plan = MakeManual({3, 2, 3}, 4,
                               {{0, 0, 2, 0}, {0, 2, 1, 1}, {1, 0, 1, 1}, {1, 1, 1, 2},
                                {2, 0, 1, 2}, {2, 1, 2, 3}});
  ASSERT_THAT(ValidatePlan(plan), IsOk());
  ASSERT_EQ(PlanRankGroups(plan), (std::vector<std::vector<int32_t>>{{0, 1, 2, 3}}));
  absl::StatusOr<PlanMetrics> m = AnalyzePlan(plan, kShape, 2);
  ASSERT_THAT(m, IsOk());
  absl::StatusOr<GroupPhaseBytes> b = TwoLevelGroupPhase(plan, *m, {0, 1, 2, 3}, kShape, 2);
  ASSERT_THAT(b, IsOk());
  EXPECT_THAT(b->inter_sent, ElementsAre(2, 2, 0, 0));
  EXPECT_THAT(b->inter_received, ElementsAre(0, 0, 2, 2));
  EXPECT_THAT(b->sent, ElementsAre(10, 10, 8, 8));
  EXPECT_DOUBLE_EQ(WeightedBottleneck(*b, 8.0), 16.0);
  absl::StatusOr<GroupSchemeChoice> c = ChooseGroupSchemes(plan, *m, kShape, 2, 8.0);
  ASSERT_THAT(c, IsOk());
  ASSERT_EQ(c->groups.size(), 1u);
  EXPECT_EQ(c->groups[0].group.scheme, CommScheme::kAllToAll);
  EXPECT_TRUE(c->groups[0].group.two_level);
  EXPECT_DOUBLE_EQ(c->groups[0].weighted_bottleneck, 16.0);
  // The plan run so: forward plus backward (what came in goes back).
  EXPECT_THAT(c->bytes.sent, ElementsAre(18, 18, 18, 18));
  EXPECT_EQ(c->bytes.phase.max_inter_node_bytes, 2);
  // Targeted's inter-node link is twice as heavy (4 rows from rank 1).
  EXPECT_EQ(m->bytes[static_cast<int>(CommScheme::kTargeted)].phase.max_inter_node_bytes, 4);
  // Without nodes there is no two-level scheme: targeted wins.
  absl::StatusOr<PlanMetrics> flat = AnalyzePlan(plan, kShape, 0);
  ASSERT_THAT(flat, IsOk());
  absl::StatusOr<GroupSchemeChoice> c0 = ChooseGroupSchemes(plan, *flat, kShape, 0, 8.0);
  ASSERT_THAT(c0, IsOk());
  EXPECT_FALSE(c0->groups[0].group.two_level);
  EXPECT_EQ(c0->groups[0].group.scheme, CommScheme::kTargeted);
}

TEST(TwoLevelTest, RefusalsNameWhy) {
  const Plan plan = MakeManual({8}, 4, {{0, 0, 2, 0}, {0, 2, 2, 1}, {0, 4, 2, 2}, {0, 6, 2, 3}});
  EXPECT_THAT(TwoLevelNeeds(plan, {0, 1, 2, 3}, 0),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("ranks_per_node: the two-level scheme needs nodes")));
  EXPECT_THAT(TwoLevelNeeds(plan, {0, 1, 2, 3}, 4),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("spans one node")));
  EXPECT_THAT(TwoLevelNeeds(plan, {0, 1, 2, 3}, 3),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("3 ranks on node 0 but 1 on node 1")));
  const ModelShape odd{3, 1, 1, 0};  // P = 2 does not split 3 query heads
  absl::StatusOr<PlanMetrics> m = AnalyzePlan(plan, odd, 2);
  ASSERT_THAT(m, IsOk());
  EXPECT_THAT(TwoLevelGroupPhase(plan, *m, {0, 1, 2, 3}, odd, 2),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("query_heads")));
}

}  // namespace
}  // namespace flashcp::core
