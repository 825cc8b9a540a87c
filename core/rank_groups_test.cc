#include "core/rank_groups.h"

#include <cstdint>
#include <vector>

#include "core/analysis.h"
#include "core/random.h"
#include "core/strategies.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::core {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;
using ::testing::Each;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int kA2a = static_cast<int>(CommScheme::kAllToAll);

// Two documents of 8 tokens, document i zigzagged on ranks 2i and 2i + 1.
Plan TwoPairs() {
  return Plan{4,
              {8, 8},
              0,
              {{0, 0, 2, 0}, {0, 6, 2, 0}, {0, 2, 4, 1}, {1, 0, 2, 2}, {1, 6, 2, 2}, {1, 2, 4, 3}}, {}};
}

TEST(PlanRankGroupsTest, RanksSharingADocumentFormOneGroup) {
  EXPECT_THAT(PlanRankGroups(TwoPairs()), ElementsAre(ElementsAre(0, 1), ElementsAre(2, 3)));
  // Rank 1 holds doc 1 whole; doc 0 links ranks 0 and 2, doc 2 ranks 2 and 3.
  const Plan plan{4,
                  {6, 4, 6},
                  0,
                  {{0, 0, 4, 0}, {1, 0, 4, 1}, {0, 4, 2, 2}, {2, 0, 2, 2}, {2, 2, 4, 3}}, {}};
  ASSERT_THAT(ValidatePlan(plan), IsOk());
  EXPECT_THAT(PlanRankGroups(plan), ElementsAre(ElementsAre(0, 2, 3), ElementsAre(1)));
}

TEST(AllToAllGroupHeadsTest, SplitsQueryHeadsAndReplicatesSharedKvHeads) {
  // Hq = 8, Hkv = 2 (4 query heads per KV head), K = 4: positions 0 and 1
  // read KV head 0, positions 2 and 3 KV head 1: each KV head twice.
  absl::StatusOr<AllToAllHeads> h = AllToAllGroupHeads(4, ModelShape{2, 4, 2, 8});
  ASSERT_THAT(h, IsOk());
  EXPECT_THAT(h->query, ElementsAre(HeadRange{0, 2}, HeadRange{2, 2}, HeadRange{4, 2},
                                    HeadRange{6, 2}));
  EXPECT_THAT(h->kv, ElementsAre(HeadRange{0, 1}, HeadRange{0, 1}, HeadRange{1, 1},
                                 HeadRange{1, 1}));
  EXPECT_EQ(h->kv_total, 4);
  EXPECT_EQ(h->replicated_kv_heads, 2);
  // K divides Hkv: no replica.
  h = AllToAllGroupHeads(2, ModelShape{4, 4, 2, 8});
  ASSERT_THAT(h, IsOk());
  EXPECT_THAT(h->kv, ElementsAre(HeadRange{0, 2}, HeadRange{2, 2}));
  EXPECT_EQ(h->replicated_kv_heads, 0);
  EXPECT_THAT(AllToAllGroupHeads(3, ModelShape{4, 4, 2, 8}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("query_heads: the all-to-all over a group of 3 ranks")));
}

TEST(ModelShapeTest, QueryHeadsMustBeAMultipleOfHeads) {
  EXPECT_THAT(ValidateModelShape(ModelShape{8, 128, 2, 32}), IsOk());
  EXPECT_THAT(ValidateModelShape(ModelShape{8, 128, 2, 0}), IsOk());
  EXPECT_THAT(ValidateModelShape(ModelShape{8, 128, 2, 12}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("query_heads: must be 0 (equal to heads) or a multiple of heads (8)")));
  EXPECT_THAT(ValidateModelShape(ModelShape{8, 128, 2, 2048}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("query_heads")));
}

// The formula, one phase, bytes per rank: e D (2 Hq + 2 Hkv) T (K-1)/K.
int64_t UlyssesBytes(int64_t e, int64_t d, int64_t hq, int64_t hkv, int64_t t, int64_t k) {
  return e * d * (2 * hq + 2 * hkv) * t * (k - 1) / k;
}

TEST(AllToAllAnalysisTest, OneGroupOfNHandWorked) {
  // One document of 32 tokens on 4 ranks (per_doc): one group, T = 8.
  // e = 2, D = 2, Hq = 8, Hkv = 4: 2 * 2 * (16 + 8) * 8 * 3 / 4 = 576 bytes a phase.
  absl::StatusOr<Plan> plan = MakePlan(Strategy::kPerDoc, Batch{{32}, 4});
  ASSERT_THAT(plan, IsOk());
  const ModelShape shape{4, 2, 2, 8};
  absl::StatusOr<PlanMetrics> m = AnalyzePlan(*plan, shape, /*ranks_per_node=*/2);
  ASSERT_THAT(m, IsOk());
  EXPECT_EQ(m->all_to_all_inapplicable, "");
  EXPECT_EQ(m->all_to_all_replicated_kv_heads, 0);
  const SchemeBytes& a2a = m->bytes[kA2a];
  EXPECT_EQ(UlyssesBytes(2, 2, 8, 4, 8, 4), 576);
  // Rows: 8 * 3 * 2 (Q) + 2 * 8 * 3 (K, V) + 24 * 2 (O) = 144, 4 bytes each.
  EXPECT_THAT(a2a.phase.sent_tokens, Each(144));
  EXPECT_THAT(a2a.phase.received_tokens, Each(144));
  EXPECT_EQ(a2a.phase.bottleneck_bytes, 576);
  EXPECT_THAT(a2a.sent, Each(2 * 576));  // backward the same again
  EXPECT_EQ(a2a.bottleneck, 2 * 576);
  // G = 2 per node: e D (2 Hq + 2 Hkv) T (N - G) / N = 4 * 24 * 8 * 2 / 4 = 384 cross the NIC.
  EXPECT_THAT(a2a.phase.inter_node_sent_bytes, Each(384));
  EXPECT_THAT(a2a.phase.inter_node_received_bytes, Each(384));
  EXPECT_EQ(a2a.phase.max_inter_node_bytes, 384);
  EXPECT_EQ(a2a.phase.max_intra_node_bytes, 576 - 384);
  EXPECT_EQ(a2a.phase.inter_node_bytes, 4 * 384);
  EXPECT_EQ(a2a.phase.intra_node_bytes, 4 * (576 - 384));
}

TEST(AllToAllAnalysisTest, FormulaHoldsExactlyForOneGroupAcrossShapesAndNodes) {
  for (int32_t n : {2, 4, 8, 16}) {
    for (int32_t g : {1, 2, 4, 8, 16}) {
      if (g > n) continue;
      for (int32_t hkv : {16, 32}) {
        for (int32_t hq : {32, 64}) {
          const int64_t t = 24;
          absl::StatusOr<Plan> plan = MakePlan(Strategy::kPerDoc, Batch{{t * n}, n});
          ASSERT_THAT(plan, IsOk());
          absl::StatusOr<PlanMetrics> m = AnalyzePlan(*plan, ModelShape{hkv, 8, 2, hq}, g);
          ASSERT_THAT(m, IsOk());
          const PhaseTraffic& p = m->bytes[kA2a].phase;
          const int64_t want = UlyssesBytes(2, 8, hq, hkv, t, n);
          const int64_t want_inter = 2 * 8 * (2 * hq + 2 * hkv) * t * (n - g) / n;
          for (int32_t r = 0; r < n; ++r) {
            EXPECT_EQ(p.sent_tokens[r] * 16, want) << n << " " << g << " " << r;
            EXPECT_EQ(p.received_tokens[r] * 16, want);
            EXPECT_EQ(p.inter_node_sent_bytes[r], want_inter) << n << " " << g;
            EXPECT_EQ(p.inter_node_received_bytes[r], want_inter);
          }
          EXPECT_EQ(p.bottleneck_bytes, want);
        }
      }
    }
  }
}

TEST(AllToAllAnalysisTest, NodeAlignedGroupsOfGNeverLeaveTheNode) {
  // Groups {0, 1} and {2, 3}, T = 4, e = 2, D = 2, Hq = 4, Hkv = 2, K = 2:
  // 2 * 2 * (8 + 4) * 4 * 1 / 2 = 96 bytes a phase per rank.
  const ModelShape shape{2, 2, 2, 4};
  absl::StatusOr<PlanMetrics> m = AnalyzePlan(TwoPairs(), shape, /*ranks_per_node=*/2);
  ASSERT_THAT(m, IsOk());
  const PhaseTraffic& p = m->bytes[kA2a].phase;
  EXPECT_EQ(p.bottleneck_bytes, UlyssesBytes(2, 2, 4, 2, 4, 2));
  EXPECT_EQ(p.bottleneck_bytes, 96);
  EXPECT_THAT(p.inter_node_sent_bytes, Each(0));
  EXPECT_EQ(p.inter_node_bytes, 0);
  EXPECT_EQ(p.max_inter_node_bytes, 0);
  EXPECT_EQ(p.max_intra_node_bytes, 96);
  // One rank per node: all of it crosses.
  m = AnalyzePlan(TwoPairs(), shape, /*ranks_per_node=*/1);
  ASSERT_THAT(m, IsOk());
  EXPECT_THAT(m->bytes[kA2a].phase.inter_node_sent_bytes, Each(96));
  EXPECT_EQ(m->bytes[kA2a].phase.max_intra_node_bytes, 0);
}

TEST(AllToAllAnalysisTest, KvHeadsReplicatedWhereTheGroupHasMoreRanksThanKvHeads) {
  // Hq = 8, Hkv = 2, K = 4, T = 8: each rank reads one KV head, so the group
  // moves K = 4 KV heads' rows, not Hkv = 2: the formula with Hkv -> 4.
  absl::StatusOr<Plan> plan = MakePlan(Strategy::kPerDoc, Batch{{32}, 4});
  ASSERT_THAT(plan, IsOk());
  absl::StatusOr<PlanMetrics> m = AnalyzePlan(*plan, ModelShape{2, 2, 2, 8});
  ASSERT_THAT(m, IsOk());
  EXPECT_EQ(m->all_to_all_replicated_kv_heads, 2);
  EXPECT_EQ(m->bytes[kA2a].phase.bottleneck_bytes, UlyssesBytes(2, 2, 8, 4, 8, 4));
  EXPECT_EQ(m->bytes[kA2a].phase.bottleneck_bytes, 576);
}

TEST(AllToAllAnalysisTest, AGroupWhoseSizeDoesNotDivideHqIsReported) {
  absl::StatusOr<Plan> plan = MakePlan(Strategy::kPerDoc, Batch{{30}, 3});
  ASSERT_THAT(plan, IsOk());
  absl::StatusOr<PlanMetrics> m = AnalyzePlan(*plan, ModelShape{4, 2, 2, 8});
  ASSERT_THAT(m, IsOk());
  EXPECT_THAT(m->all_to_all_inapplicable,
              HasSubstr("query_heads: the all-to-all over a group of 3 ranks splits the Hq = 8"));
  EXPECT_THAT(m->all_to_all_inapplicable, HasSubstr("(group 0: ranks 0..2)"));
  EXPECT_THAT(m->bytes[kA2a].sent, ElementsAre(0, 0, 0));
  EXPECT_EQ(m->bytes[kA2a].bottleneck, 0);
}

TEST(AllToAllAnalysisTest, WholeDocumentsMoveNothing) {
  const Plan plan{2, {4, 4}, 0, {{0, 0, 4, 0}, {1, 0, 4, 1}}, {}};
  absl::StatusOr<PlanMetrics> m = AnalyzePlan(plan, ModelShape{});
  ASSERT_THAT(m, IsOk());
  EXPECT_THAT(m->bytes[kA2a].sent, ElementsAre(0, 0));
  EXPECT_EQ(m->all_to_all_inapplicable, "");
}

// Every scheme's per-rank inter-node bytes against the pair matrix (targeted)
// and the closed forms (all-gathers), on random batches of every strategy.
TEST(LinkSplitTest, PerRankInterNodeBytesMatchThePairs) {
  SplitMix64Rng rng(7);
  const auto below = [&](uint64_t k) { return rng.Next() % k; };
  for (int iter = 0; iter < 300; ++iter) {
    const int32_t n = 2 + static_cast<int32_t>(below(14));
    const int32_t per_node = 1 + static_cast<int32_t>(below(static_cast<uint64_t>(n)));
    std::vector<int64_t> docs(1 + below(12));
    for (int64_t& d : docs) d = 1 + static_cast<int64_t>(below(200));
    int64_t total = 0;
    for (int64_t d : docs) total += d;
    if (total < n) continue;
    const Strategy strategy = AllStrategies()[below(AllStrategies().size())];
    if (strategy == Strategy::kIlp || strategy == Strategy::kBasp) continue;
    absl::StatusOr<Plan> plan = MakePlan(strategy, Batch{docs, n});
    ASSERT_THAT(plan, IsOk());
    const ModelShape shape{1, 1, 1};  // one byte per K or V element: kv row = 2 bytes
    absl::StatusOr<PlanMetrics> m = AnalyzePlan(*plan, shape, per_node);
    ASSERT_THAT(m, IsOk());
    const std::vector<int64_t> pairs = TargetedPairTokens(*plan);
    const PhaseTraffic& t = m->bytes[static_cast<int>(CommScheme::kTargeted)].phase;
    std::vector<int64_t> want_sent(n, 0), want_recv(n, 0);
    for (int32_t a = 0; a < n; ++a) {
      for (int32_t b = 0; b < n; ++b) {
        if (a / per_node == b / per_node) continue;
        want_sent[a] += 2 * pairs[static_cast<size_t>(a) * n + b];
        want_recv[b] += 2 * pairs[static_cast<size_t>(a) * n + b];
      }
    }
    EXPECT_EQ(t.inter_node_sent_bytes, want_sent) << StrategyName(strategy);
    EXPECT_EQ(t.inter_node_received_bytes, want_recv) << StrategyName(strategy);
    int64_t sum = 0;
    for (int64_t b : t.inter_node_sent_bytes) sum += b;
    EXPECT_EQ(sum, t.inter_node_bytes);
    const PhaseTraffic& full = m->bytes[static_cast<int>(CommScheme::kFullKv)].phase;
    sum = 0;
    for (int32_t r = 0; r < n; ++r) {
      const int32_t node_size = std::min(n, (r / per_node + 1) * per_node) - r / per_node * per_node;
      EXPECT_EQ(full.inter_node_sent_bytes[r], 2 * m->tokens_per_rank * (n - node_size));
      sum += full.inter_node_sent_bytes[r];
    }
    EXPECT_EQ(sum, full.inter_node_bytes);
  }
}

TEST(GroupedSchemeBytesTest, EachGroupRunsItsOwnScheme) {
  // Group {0, 1} all-gathers within itself, {2, 3} runs the all-to-all.
  // Shape: Hkv = 2, D = 2, e = 2, Hq = 4: a token's K and V 2 * 2 * 2 * 2 =
  // 16 bytes, a (token, head) row 4.
  const Plan plan = TwoPairs();
  const ModelShape shape{2, 2, 2, 4};
  absl::StatusOr<PlanMetrics> m = AnalyzePlan(plan, shape, 2);
  ASSERT_THAT(m, IsOk());
  absl::StatusOr<SchemeBytes> b = GroupedSchemeBytes(
      plan, *m, {{{0, 1}, CommScheme::kAllGather}, {{2, 3}, CommScheme::kAllToAll}}, shape, 2);
  ASSERT_THAT(b, IsOk());
  // All-gather within {0, 1}: the largest non-last block is rank 1's 4
  // tokens, to one peer: 4 * 16 = 64 bytes a phase. All-to-all: 96 (above).
  EXPECT_THAT(b->sent, ElementsAre(128, 128, 192, 192));
  EXPECT_EQ(b->phase.bottleneck_bytes, 96);
  EXPECT_EQ(b->phase.max_inter_node_bytes, 0);
  // Across nodes (one rank a node) the same bytes cross.
  m = AnalyzePlan(plan, shape, 1);
  ASSERT_THAT(m, IsOk());
  b = GroupedSchemeBytes(
      plan, *m, {{{0, 1}, CommScheme::kTargeted}, {{2, 3}, CommScheme::kFullKv}}, shape, 1);
  ASSERT_THAT(b, IsOk());
  // Targeted: rank 0's head [0, 2) goes to rank 1 (its last piece [6, 8) is
  // rank 0's, so rank 0 also receives [2, 6) from rank 1): 2 and 4 tokens;
  // full KV: 4 tokens to the one peer.
  EXPECT_THAT(b->phase.inter_node_sent_bytes, ElementsAre(32, 64, 64, 64));
  // Groups that split a document are refused.
  EXPECT_THAT(GroupedSchemeBytes(plan, *m,
                                 {{{0}, CommScheme::kAllToAll}, {{1, 2, 3}, CommScheme::kAllToAll}},
                                 shape, 1),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("groups: ranks 0 and 1 share a document")));
  EXPECT_THAT(GroupedSchemeBytes(plan, *m, {{{0, 1}, CommScheme::kAllToAll}}, shape, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cover 2 of the 4 ranks")));
}

}  // namespace
}  // namespace flashcp::core
