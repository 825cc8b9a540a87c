#include "core/analysis.h"

#include "core/testing/plans.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::core {
namespace {

using ::flashcp::core::testing::HeadTailPlan;
using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ShardWorkloadTest, MatchesEquationThree) {
  EXPECT_EQ(ShardWorkload(0, 1), 1.0);   // (0 + 1 + 1) * 1 / 2
  EXPECT_EQ(ShardWorkload(0, 4), 10.0);  // (0 + 4 + 1) * 4 / 2: 1+2+3+4
  EXPECT_EQ(ShardWorkload(2, 4), 18.0);  // (4 + 4 + 1) * 4 / 2: 3+4+5+6
  EXPECT_EQ(ShardWorkload(3, 3), 15.0);  // (6 + 3 + 1) * 3 / 2: 4+5+6
  EXPECT_EQ(ShardWorkload(1'000'000, 1'000'000), 1'500'000'500'000.0);
}

TEST(AnalyzePlanTest, HandWorkedHeadTail) {
  absl::StatusOr<PlanMetrics> m = AnalyzePlan(HeadTailPlan(), ModelShape{1, 1, 2});
  ASSERT_THAT(m, IsOk());
  EXPECT_EQ(m->tokens_per_rank, 4);
  EXPECT_EQ(m->padding, 0);
  EXPECT_THAT(m->rank_tokens, ElementsAre(4, 4));
  // rank 0: (2*2 + 4 + 1) * 4 / 2 = 18; rank 1: 3 + 3 = 6; mean 12.
  EXPECT_THAT(m->rank_workload, ElementsAre(18.0, 6.0));
  EXPECT_DOUBLE_EQ(m->imbalance, 1.5);
  // Only doc 0's head is a non-last shard: 2 tokens on rank 1.
  EXPECT_THAT(m->rank_nonlast_tokens, ElementsAre(0, 2));
  EXPECT_EQ(m->max_nonlast_tokens, 2);
  EXPECT_DOUBLE_EQ(m->comm_saving, 0.5);  // 1 - 2/4
  // H*D*dtype = 2 bytes per token; N - 1 = 1.
  const SchemeBytes& full = m->bytes[static_cast<int>(CommScheme::kFullKv)];
  const SchemeBytes& gather = m->bytes[static_cast<int>(CommScheme::kAllGather)];
  const SchemeBytes& targeted = m->bytes[static_cast<int>(CommScheme::kTargeted)];
  EXPECT_EQ(full.bottleneck, 32);    // 4 * 2 * 4 * 1
  EXPECT_EQ(gather.bottleneck, 16);  // 4 * 2 * 2 * 1
  // Rank 1 sends 2 tokens of KV forward and gets their gradients back; rank 0
  // receives them and returns gradients: 2 * 2 * 2 = 8 bytes each way.
  EXPECT_THAT(targeted.sent, ElementsAre(8, 8));
  EXPECT_THAT(targeted.received, ElementsAre(8, 8));
  // One phase: rank 1 sends 2 tokens, rank 0 receives 2 (8 bytes); both
  // phases 16, against full KV's 4 tokens a phase.
  EXPECT_THAT(targeted.phase.sent_tokens, ElementsAre(0, 2));
  EXPECT_THAT(targeted.phase.received_tokens, ElementsAre(2, 0));
  EXPECT_EQ(targeted.phase.bottleneck_tokens, 2);
  EXPECT_EQ(targeted.phase.bottleneck_bytes, 8);
  EXPECT_EQ(targeted.bottleneck, 16);
  EXPECT_EQ(full.phase.bottleneck_tokens, 4);
  EXPECT_EQ(full.phase.bottleneck_bytes, 16);
  EXPECT_EQ(gather.phase.bottleneck_tokens, 2);
  EXPECT_DOUBLE_EQ(m->targeted_saving, 0.5);
  EXPECT_THAT(m->rank_segments, ElementsAre(1, 2));
  EXPECT_EQ(m->cut_docs, 1);
  EXPECT_EQ(m->min_cut_shard_len, 2);
}

TEST(AnalyzePlanTest, SingleRankMovesNothing) {
  Plan plan{1, {3, 4}, 0, {{0, 0, 3, 0}, {1, 0, 4, 0}}, {}};
  absl::StatusOr<PlanMetrics> m = AnalyzePlan(plan, ModelShape{});
  ASSERT_THAT(m, IsOk());
  EXPECT_DOUBLE_EQ(m->imbalance, 1.0);
  EXPECT_DOUBLE_EQ(m->comm_saving, 1.0);
  EXPECT_DOUBLE_EQ(m->targeted_saving, 1.0);
  EXPECT_EQ(m->bytes[0].bottleneck, 0);
  EXPECT_EQ(m->cut_docs, 0);
  EXPECT_EQ(m->min_cut_shard_len, 0);
}

TEST(AnalyzePlanTest, TargetedSendsOnlyToRanksThatNeedIt) {
  // One doc of 9 tokens on 3 ranks, pieces [0,3)->r0, [3,6)->r1, [6,9)->r2.
  // r0's piece goes to r1 and r2; r1's to r2. Forward tokens: r0 sends 6,
  // r1 sends 3 and receives 3, r2 receives 6. With 1 byte per token, each
  // rank moves 2 * (sent + received) bytes.
  Plan plan{3, {9}, 0, {{0, 0, 3, 0}, {0, 3, 3, 1}, {0, 6, 3, 2}}, {}};
  absl::StatusOr<PlanMetrics> m = AnalyzePlan(plan, ModelShape{1, 1, 1});
  ASSERT_THAT(m, IsOk());
  EXPECT_THAT(m->bytes[2].sent, ElementsAre(12, 12, 12));
  EXPECT_THAT(m->bytes[2].phase.sent_tokens, ElementsAre(6, 3, 0));
  EXPECT_THAT(m->bytes[2].phase.received_tokens, ElementsAre(0, 3, 6));
  EXPECT_EQ(m->bytes[2].phase.max_sent_tokens, 6);
  EXPECT_EQ(m->bytes[2].phase.max_received_tokens, 6);
  EXPECT_EQ(m->bytes[2].bottleneck, 24);  // 2 phases * 2 (K, V) * 6 tokens
  // All-gather pads to the largest buffer (3) and sends to 2 peers: 4*3*2.
  EXPECT_EQ(m->bytes[1].bottleneck, 24);
  EXPECT_EQ(m->bytes[0].bottleneck, 24);  // 4 * 3 * 2: all tokens are non-last except r2's
  EXPECT_THAT(m->rank_workload, ElementsAre(6.0, 15.0, 24.0));
}

// SPEC "Targeted exchange, per phase": one 16-token document at N = 2 as
// per_doc. Forward, rank 0 receives [4, 12) (8 tokens) and sends [0, 4) (4);
// rank 1 receives 4 and sends 8: the phase's bottleneck is 8 tokens, as much
// as full KV moves (C/N = 8), so the targeted saving is 0. Adding rank 0's
// forward receives to its backward sends reported 6 tokens' worth.
TEST(AnalyzePlanTest, TargetedBottleneckIsPerPhase) {
  Plan plan{2, {16}, 0, {{0, 0, 4, 0}, {0, 12, 4, 0}, {0, 4, 8, 1}}, {}};
  absl::StatusOr<PlanMetrics> m = AnalyzePlan(plan, ModelShape{1, 1, 2});
  ASSERT_THAT(m, IsOk());
  const SchemeBytes& t = m->bytes[static_cast<int>(CommScheme::kTargeted)];
  EXPECT_THAT(t.phase.sent_tokens, ElementsAre(4, 8));
  EXPECT_THAT(t.phase.received_tokens, ElementsAre(8, 4));
  EXPECT_EQ(t.phase.max_sent_tokens, 8);
  EXPECT_EQ(t.phase.max_received_tokens, 8);
  EXPECT_EQ(t.phase.bottleneck_tokens, 8);
  EXPECT_EQ(t.phase.bottleneck_bytes, 32);  // 8 tokens * 2 (K, V) * 2 bytes
  EXPECT_EQ(t.phase.max_sent_bytes, 32);
  EXPECT_EQ(t.bottleneck, 64);              // both phases
  EXPECT_THAT(t.sent, ElementsAre(48, 48)); // (4 + 8) * 2 * 2 each, over both phases
  EXPECT_DOUBLE_EQ(m->targeted_saving, 0.0);
}

// docs [6, 2, 4] on 3 ranks: rank 1 sends doc 0's 2-token head to rank 0,
// the tail's owner. The all-gather moves max nonlast (2) x (N - 1) = 4
// tokens a phase, the targeted exchange 2: the targeted one is cheaper. In
// the hand-worked plans above the two tie, and the all-gather is named.
TEST(AnalyzePlanTest, CheaperSchemeIsTheOneThatMovesLess) {
  Plan plan{3, {6, 2, 4}, 0, {{0, 2, 4, 0}, {0, 0, 2, 1}, {1, 0, 2, 1}, {2, 0, 4, 2}}, {}};
  absl::StatusOr<PlanMetrics> m = AnalyzePlan(plan, ModelShape{1, 1, 1});
  ASSERT_THAT(m, IsOk());
  EXPECT_EQ(m->bytes[static_cast<int>(CommScheme::kAllGather)].phase.bottleneck_tokens, 4);
  EXPECT_EQ(m->bytes[static_cast<int>(CommScheme::kTargeted)].phase.bottleneck_tokens, 2);
  EXPECT_EQ(m->cheaper_scheme, CommScheme::kTargeted);
  absl::StatusOr<PlanMetrics> tie = AnalyzePlan(HeadTailPlan(), ModelShape{1, 1, 1});
  ASSERT_THAT(tie, IsOk());
  EXPECT_EQ(tie->cheaper_scheme, CommScheme::kAllGather);
}

// One 9-token document on 3 ranks, [0,3) r0, [3,6) r1, [6,9) r2, with 2
// ranks per node (nodes {0, 1} and {2}). Forward, r0 sends 3 tokens to r1
// (intra) and 3 to r2 (inter), r1 sends 3 to r2 (inter): 3 intra, 6 inter
// tokens; 2 bytes each (K and V at 1 byte). The all-gathers send each
// rank's buffer to 2 peers: pairs (0,1), (1,0) intra, the other 4 inter.
TEST(AnalyzePlanTest, IntraAndInterNodeBytes) {
  Plan plan{3, {9}, 0, {{0, 0, 3, 0}, {0, 3, 3, 1}, {0, 6, 3, 2}}, {}};
  absl::StatusOr<PlanMetrics> m = AnalyzePlan(plan, ModelShape{1, 1, 1}, 2);
  ASSERT_THAT(m, IsOk());
  const PhaseTraffic& t = m->bytes[static_cast<int>(CommScheme::kTargeted)].phase;
  EXPECT_EQ(t.intra_node_bytes, 6);
  EXPECT_EQ(t.inter_node_bytes, 12);
  const PhaseTraffic& full = m->bytes[static_cast<int>(CommScheme::kFullKv)].phase;
  EXPECT_EQ(full.intra_node_bytes, 2 * 3 * 2);  // 2 pairs x C/N = 3 tokens x 2 bytes
  EXPECT_EQ(full.inter_node_bytes, 4 * 3 * 2);
  const PhaseTraffic& gather = m->bytes[static_cast<int>(CommScheme::kAllGather)].phase;
  EXPECT_EQ(gather.intra_node_bytes, 2 * 3 * 2);  // max nonlast 3
  EXPECT_EQ(gather.inter_node_bytes, 4 * 3 * 2);
  // One node (0, or as many ranks as N): nothing inter-node.
  for (int32_t rpn : {0, 3, 8}) {
    absl::StatusOr<PlanMetrics> one = AnalyzePlan(plan, ModelShape{1, 1, 1}, rpn);
    ASSERT_THAT(one, IsOk());
    EXPECT_EQ(one->bytes[static_cast<int>(CommScheme::kTargeted)].phase.intra_node_bytes, 18);
    EXPECT_EQ(one->bytes[static_cast<int>(CommScheme::kTargeted)].phase.inter_node_bytes, 0);
    EXPECT_EQ(one->bytes[static_cast<int>(CommScheme::kFullKv)].phase.inter_node_bytes, 0);
  }
  EXPECT_THAT(AnalyzePlan(plan, ModelShape{1, 1, 1}, -1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ranks_per_node")));
}

// The pair matrix of the plans above: one 9-token document over 3 ranks
// (r0 sends 3 to r1 and 3 to r2, r1 sends 3 to r2), and SPEC's 16-token
// per_doc at N = 2 (r0 sends [0, 4) to r1, r1 sends [4, 12) to r0; r0's
// tail [12, 16) is the last piece and goes nowhere).
TEST(TargetedPairTokensTest, HandWorked) {
  EXPECT_THAT(TargetedPairTokens(Plan{3, {9}, 0, {{0, 0, 3, 0}, {0, 3, 3, 1}, {0, 6, 3, 2}}, {}}),
              ElementsAre(0, 3, 3, 0, 0, 3, 0, 0, 0));
  EXPECT_THAT(TargetedPairTokens(Plan{2, {16}, 0, {{0, 0, 4, 0}, {0, 12, 4, 0}, {0, 4, 8, 1}}, {}}),
              ElementsAre(0, 4, 8, 0));
  EXPECT_THAT(TargetedPairTokens(HeadTailPlan()), ElementsAre(0, 0, 2, 0));
}

TEST(AnalyzePlanTest, RejectsBadShape) {
  EXPECT_THAT(AnalyzePlan(HeadTailPlan(), ModelShape{0, 128, 2}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("heads")));
  EXPECT_THAT(AnalyzePlan(HeadTailPlan(), ModelShape{8, 2000, 2}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("head_dim")));
  EXPECT_THAT(AnalyzePlan(HeadTailPlan(), ModelShape{8, 128, 3}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dtype_bytes")));
}

TEST(ValidatePlanTest, AcceptsHandWorkedPlan) { EXPECT_THAT(ValidatePlan(HeadTailPlan()), IsOk()); }

TEST(ValidatePlanTest, NamesEachViolation) {
  struct Case {
    const char* name;
    void (*mutate)(Plan&);
    const char* message;
  };
  const std::vector<Case> cases = {
      {"bad padding", [](Plan& p) { p.padding = 1; }, "padding: 1, expected 0"},
      {"doc index", [](Plan& p) { p.shards[2].doc = 5; }, "shards[2].doc: 5"},
      {"rank range", [](Plan& p) { p.shards[2].rank = 2; }, "shards[2].rank: 2 is outside"},
      {"rank order", [](Plan& p) { std::swap(p.shards[0], p.shards[2]); }, "grouped by rank"},
      {"empty shard", [](Plan& p) { p.shards[2].len = 0; }, "shards[2]: range [0, 0)"},
      {"past doc end", [](Plan& p) { p.shards[2].len = 3; }, "outside doc 1 of 2 tokens"},
      {"gap", [](Plan& p) { p.shards[0] = {0, 3, 3, 0}; }, "doc 0 token 2 is not covered"},
      {"overlap", [](Plan& p) { p.shards[0] = {0, 1, 5, 0}; }, "doc 0 token 1 is covered twice"},
      {"tail missing", [](Plan& p) { p.shards[0].len = 3; }, "doc 0: tokens [5, 6) are not covered"},
      {"adjacent on one rank",
       [](Plan& p) { p.shards = {{1, 0, 2, 0}, {0, 2, 4, 1}, {0, 0, 2, 1}}; },
       "must be one shard"},
      {"unequal tokens",
       [](Plan& p) { p.shards = {{0, 0, 6, 0}, {1, 0, 2, 1}}; },
       "rank 0: holds 6 real tokens, expected 4"},
      {"bad batch", [](Plan& p) { p.cp_size = 0; }, "plan: cp_size"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Plan plan = HeadTailPlan();
    c.mutate(plan);
    EXPECT_THAT(ValidatePlan(plan), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)));
  }
}

TEST(CommLayoutTest, HandWorkedHeadTail) {
  absl::StatusOr<CommLayout> layout = BuildCommLayout(HeadTailPlan());
  ASSERT_THAT(layout, IsOk());
  ASSERT_EQ(layout->ranks.size(), 2u);
  const RankLayout& r0 = layout->ranks[0];
  const RankLayout& r1 = layout->ranks[1];
  EXPECT_THAT(r0.shards, ElementsAre(0));
  EXPECT_THAT(r0.doc_pos, ElementsAre(1));
  EXPECT_TRUE(r0.send.empty());
  EXPECT_THAT(r1.shards, ElementsAre(1, 2));
  EXPECT_THAT(r1.shard_offset, ElementsAre(0, 2));
  ASSERT_EQ(r1.send.size(), 1u);
  EXPECT_EQ(r1.send[0].shard, 1);
  EXPECT_EQ(r1.send[0].offset, 0);
  EXPECT_EQ(r1.send[0].len, 2);
  EXPECT_EQ(r1.send_tokens, 2);
  ASSERT_EQ(r1.targeted.size(), 1u);
  EXPECT_EQ(r1.targeted[0].dest, 0);
  EXPECT_THAT(r1.targeted[0].send_indices, ElementsAre(0));
  EXPECT_EQ(r1.targeted[0].tokens, 2);
  ASSERT_EQ(layout->docs[0].size(), 2u);
  EXPECT_EQ(layout->docs[0][0].rank, 1);
  EXPECT_EQ(layout->docs[0][0].send_index, 0);
  EXPECT_EQ(layout->docs[0][1].rank, 0);
  EXPECT_EQ(layout->docs[0][1].send_index, -1);
}

TEST(CommSchemeTest, NamesRoundTrip) {
  for (CommScheme s : kAllCommSchemes) {
    EXPECT_THAT(ParseCommScheme(CommSchemeName(s)), IsOk());
    EXPECT_EQ(*ParseCommScheme(CommSchemeName(s)), s);
  }
  EXPECT_THAT(ParseCommScheme("ring"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("scheme: unknown")));
}

}  // namespace
}  // namespace flashcp::core
