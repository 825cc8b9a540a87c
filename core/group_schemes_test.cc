#include "core/group_schemes.h"

#include <cstdint>
#include <vector>

#include "core/datasets.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::core {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// One document of 64 tokens zigzagged on 4 ranks (per_doc): T = 16. Per
// rank and phase, in (token, head) rows of D * e bytes:
//   all-to-all: T (2 Hq + 2 Hkv) (K-1)/K = 24 (Hq + Hkv) rows (K | Hkv);
//   all-gather: block T to K - 1 peers, 2 Hkv rows a token = 96 Hkv;
//   targeted: rank 0 (chunks 0 and 7) receives chunks 1..6 = 48 tokens = 96 Hkv.
TEST(ChooseGroupSchemesTest, AllToAllWinsWithManyKvHeadsAndLosesWithFew) {
  absl::StatusOr<Plan> plan = MakePlan(Strategy::kPerDoc, Batch{{64}, 4});
  ASSERT_THAT(plan, IsOk());
  // MHA, Hq = Hkv = 8: all-to-all 24 * 16 = 384 rows against 768.
  ModelShape mha{8, 1, 1, 8};
  absl::StatusOr<PlanMetrics> m = AnalyzePlan(*plan, mha);
  ASSERT_THAT(m, IsOk());
  absl::StatusOr<GroupSchemeChoice> c = ChooseGroupSchemes(*plan, *m, mha, 0, 8.0);
  ASSERT_THAT(c, IsOk());
  ASSERT_EQ(c->groups.size(), 1u);
  EXPECT_EQ(c->groups[0].group.scheme, CommScheme::kAllToAll);
  EXPECT_EQ(c->groups[0].weighted_bottleneck, 384.0);
  EXPECT_EQ(c->bytes.phase.bottleneck_bytes, 384);
  // GQA, Hq = 32, Hkv = 1 (replicated to each of the 4 ranks): all-to-all
  // 16*3*8 + 2*16*3 + 48*8 = 864 rows, the KV exchanges 96: targeted and
  // all-gather tie, targeted (first) is kept.
  ModelShape gqa{1, 1, 1, 32};
  m = AnalyzePlan(*plan, gqa);
  ASSERT_THAT(m, IsOk());
  c = ChooseGroupSchemes(*plan, *m, gqa, 0, 8.0);
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(c->groups[0].group.scheme, CommScheme::kTargeted);
  EXPECT_EQ(c->groups[0].weighted_bottleneck, 96.0);
}

TEST(ChooseGroupSchemesTest, InterNodeBytesWeighByTheRatio) {
  // The same group over 2 nodes of 2 ranks, MHA Hq = Hkv = 4: all-to-all
  // 24 * 8 = 192 rows a phase, 2 of 4 peers off the node (128 rows, 64 on
  // it); all-gather: 16 tokens of 8 rows to 3 peers, 256 rows off the node;
  // targeted: rank 0 receives chunks 2..5 from the other node, 32 tokens,
  // 256 rows. So the all-to-all at every weight >= 1.
  absl::StatusOr<Plan> plan = MakePlan(Strategy::kPerDoc, Batch{{64}, 4});
  ASSERT_THAT(plan, IsOk());
  const ModelShape shape{4, 1, 1, 4};
  absl::StatusOr<PlanMetrics> m = AnalyzePlan(*plan, shape, 2);
  ASSERT_THAT(m, IsOk());
  for (double w : {1.0, 8.0}) {
    absl::StatusOr<GroupSchemeChoice> c = ChooseGroupSchemes(*plan, *m, shape, 2, w);
    ASSERT_THAT(c, IsOk());
    EXPECT_EQ(c->groups[0].group.scheme, CommScheme::kAllToAll) << w;
    EXPECT_EQ(c->groups[0].weighted_bottleneck, w * 128.0) << w;
    EXPECT_EQ(c->bytes.phase.max_inter_node_bytes, 128);
    EXPECT_EQ(c->bytes.phase.max_intra_node_bytes, 64);
  }
  EXPECT_THAT(ChooseGroupSchemes(*plan, *m, shape, 2, 0.5),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("inter_node_weight")));
}

TEST(ChooseGroupSchemesTest, ChoosesTheCheapestPerGroupOnDataSets) {
  absl::StatusOr<std::vector<std::vector<int64_t>>> batches =
      SampleBatches(Dataset::kPile, 32768, 6, 3);
  ASSERT_THAT(batches, IsOk());
  for (const std::vector<int64_t>& docs : *batches) {
    for (int32_t hq : {8, 32}) {
      const ModelShape shape{8, 128, 2, hq};
      absl::StatusOr<Plan> plan = MakePlan(Strategy::kFlashCp, Batch{docs, 16});
      ASSERT_THAT(plan, IsOk());
      absl::StatusOr<PlanMetrics> m = AnalyzePlan(*plan, shape, 8);
      ASSERT_THAT(m, IsOk());
      absl::StatusOr<GroupSchemeChoice> c = ChooseGroupSchemes(*plan, *m, shape, 8, 8.0);
      ASSERT_THAT(c, IsOk());
      double worst = 0;
      for (const ChosenGroup& g : c->groups) {
        for (CommScheme s : {CommScheme::kTargeted, CommScheme::kAllGather, CommScheme::kAllToAll}) {
          absl::StatusOr<GroupPhaseBytes> b = GroupSchemePhase(*m, {g.group.ranks, s}, shape, 8);
          if (!b.ok()) continue;
          EXPECT_LE(g.weighted_bottleneck, WeightedBottleneck(*b, 8.0));
        }
        worst = std::max(worst, g.weighted_bottleneck);
      }
      EXPECT_EQ(c->weighted_bottleneck, worst);
      // Never worse than the whole plan under targeted alone.
      const PhaseTraffic& t = m->bytes[static_cast<int>(CommScheme::kTargeted)].phase;
      EXPECT_LE(c->bytes.phase.max_inter_node_bytes * 8.0,
                std::max<double>(t.max_intra_node_bytes, 8.0 * t.max_inter_node_bytes));
    }
  }
}

TEST(PlanWithGroupSchemesTest, FlashcpPlanUnchangedAndBaspConsidered) {
  PlanOptions options;
  options.ranks_per_node = 8;
  const ModelShape shape{8, 128, 2, 32};
  // Unequal documents: flashcp's own plan, byte for byte.
  const Batch batch{{30000, 2000, 700, 32836}, 16};
  absl::StatusOr<GroupSchemePlan> p =
      PlanWithGroupSchemes(Strategy::kFlashCp, batch, options, shape, 8.0);
  ASSERT_THAT(p, IsOk());
  absl::StatusOr<Plan> flashcp = MakePlan(Strategy::kFlashCp, batch, options);
  ASSERT_THAT(flashcp, IsOk());
  EXPECT_EQ(p->source, Strategy::kFlashCp);
  EXPECT_EQ(p->plan.shards, flashcp->shards);
  // Equal documents, B | N: whichever moves less on its busiest link.
  const Batch equal{{32768, 32768}, 16};
  p = PlanWithGroupSchemes(Strategy::kFlashCp, equal, options, shape, 8.0);
  ASSERT_THAT(p, IsOk());
  for (Strategy s : {Strategy::kFlashCp, Strategy::kBasp}) {
    absl::StatusOr<Plan> plan = MakePlan(s, equal, options);
    ASSERT_THAT(plan, IsOk());
    absl::StatusOr<PlanMetrics> m = AnalyzePlan(*plan, shape, 8);
    ASSERT_THAT(m, IsOk());
    absl::StatusOr<GroupSchemeChoice> c = ChooseGroupSchemes(*plan, *m, shape, 8, 8.0);
    ASSERT_THAT(c, IsOk());
    EXPECT_LE(p->choice.weighted_bottleneck, c->weighted_bottleneck) << StrategyName(s);
  }
  EXPECT_EQ(p->choice.bytes.phase.max_inter_node_bytes, 0);
  EXPECT_THAT(PlanWithGroupSchemes(Strategy::kFlashCp, batch, options, shape, 0.0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("inter_node_weight")));
}

}  // namespace
}  // namespace flashcp::core
