// Grouped candidates (core/internal/flashcp_grouped.h).
#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "core/analysis.h"
#include "core/datasets.h"
#include "core/internal/flashcp_grouped.h"
#include "core/internal/flashcp_options.h"
#include "core/internal/flashcp_repair.h"
#include "core/internal/flashcp_score.h"
#include "core/internal/flashcp_stages.h"
#include "core/internal/flashcp_util.h"
#include "core/internal/strategies_internal.h"
#include "core/random.h"
#include "core/strategies.h"
#include "core/testing/candidates.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::core {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::LogUniformDocs;
using ::flashcp::core::testing::MinShard;

// Pile's second batch at 1M (seed 1), N = 64: longest documents 1.85, 1.84
// and 1.55 C/N. The compacted search zigzags them over nearly every rank
// (targeted bottleneck 313,509 tokens). Unfilled groups (bound R x mean)
// leave their ranks near the bound with most of their tokens free, and the
// documents kept whole then land on them: 1.3145 imbalance, and no grouped
// plan met R (before filled groups BestGroupedPlan returned none here).
// Filled (loads projected with the free tokens at the small documents'
// density) the same bound gives 1.0119, and the best grouped plan meets R
// and moves 28,616 tokens (1.75 C/N; magi 63,463).
TEST(GroupedPiecesTest, FilledGroupsLeaveRoomForTheRest) {
  absl::StatusOr<std::vector<std::vector<int64_t>>> batches =
      SampleBatches(Dataset::kPile, 1048576, 2, /*seed=*/1);
  ASSERT_THAT(batches, IsOk());
  const Batch batch{(*batches)[1], 64};
  const PlanOptions options;
  const internal::FlashCpOptions o = internal::FlashCpOptions::For(batch, options);
  const auto imbalance = [&](double small_share) {
    std::vector<Shard> pieces;
    EXPECT_TRUE(internal::GroupedPieces(batch, o.order, o.max_work, 0.0, o.min_shard, 0,
                                        small_share, pieces));
    return internal::ScorePlan(internal::FinishPlan(batch, std::move(pieces))).imbalance;
  };
  EXPECT_NEAR(imbalance(0.0), 1.31446, 5e-5);
  EXPECT_NEAR(imbalance(0.1), 1.01186, 5e-5);

  absl::StatusOr<Plan> compacted = internal::PlanFlashCpCompacted(batch, options);
  ASSERT_THAT(compacted, IsOk());
  const internal::PlanScore score = internal::ScorePlan(*compacted);
  EXPECT_EQ(TargetedPhaseBottleneck(*compacted), 313509);
  absl::StatusOr<std::optional<Plan>> grouped =
      internal::BestGroupedPlan(batch, o, *compacted, score);
  ASSERT_THAT(grouped, IsOk());
  ASSERT_TRUE(grouped->has_value());
  EXPECT_THAT(ValidatePlan(**grouped), IsOk());
  const internal::PlanScore g = internal::ScorePlan(**grouped);
  EXPECT_LE(g.imbalance, options.target_imbalance);
  EXPECT_GE(g.min_cut_len, 128);
  EXPECT_EQ(TargetedPhaseBottleneck(**grouped), 28616);
}

// Random batches, every grouped candidate (BestGroupedPlan's group bounds,
// filled beyond 8 ranks, and scales): the workload GroupedPieces tracks is
// its pieces' per-rank workload exactly; without a cut piece shorter than
// m, RepairSlivers changes nothing; and ImbalanceCertainlyOver, told the
// tracked workload (or the repaired pieces' where some piece is short),
// says "over" exactly where the plan BestGroupedPlan finishes (RepairSlivers,
// FinishPlan, ScorePlan) scores above the limit. At limits R and either side
// of the candidate's own imbalance, so that both answers are met.
TEST(GroupedPiecesTest, TrackedWorkloadTellsThePlansImbalance) {
  SplitMix64Rng rng(20261202);
  const auto below = [&](int64_t k) { return static_cast<int64_t>(rng.Next() % k); };
  int candidates = 0, short_pieces = 0, over = 0, not_over = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    // Every eighth trial beyond 16 ranks, where GroupDocuments keeps its
    // rank order from one document to the next.
    const int32_t n = static_cast<int32_t>(trial % 8 == 7 ? 17 + below(48) : 2 + below(15));
    const int64_t context = 1024 + below(16384);
    const int64_t m = trial % 4 == 0 ? 0 : 1 + below(128);
    const Batch batch{LogUniformDocs(rng, context), n};
    if (TotalTokens(batch.doc_lens) < n) continue;
    const internal::FlashCpOptions o = internal::FlashCpOptions::For(batch, MinShard(m));
    for (const auto& [bound, share] : internal::GroupedVariants(n)) {
      for (double scale : internal::kScales) {
        std::vector<Shard> pieces;
        std::vector<double> workload;
        if (!internal::GroupedPieces(batch, o.order, bound * o.target * o.mean_work,
                                     scale * o.median_density, m, o.ranks_per_node, share,
                                     pieces, &workload)) {
          continue;
        }
        ++candidates;
        ASSERT_EQ(workload, internal::PieceWorkloads(n, pieces)) << "trial " << trial;
        const bool has_short = std::any_of(pieces.begin(), pieces.end(), [&](const Shard& s) {
          return m > 1 && s.len > 0 && s.len < m && s.len < batch.doc_lens[s.doc];
        });
        std::vector<Shard> repaired = pieces;
        if (m > 1) repaired = internal::RepairSlivers(batch, pieces, m, o.max_work);
        const Plan full = internal::FinishPlan(batch, repaired);
        const double imbalance = internal::ScorePlan(full).imbalance;
        if (has_short) {
          ++short_pieces;
          workload = internal::PieceWorkloads(n, repaired);
        } else {
          EXPECT_EQ(full.shards, internal::FinishPlan(batch, pieces).shards) << "trial " << trial;
        }
        EXPECT_EQ(internal::WorkloadImbalance(workload), imbalance) << "trial " << trial;
        for (double limit : {o.target, imbalance * (1 - 1e-6), imbalance * (1 + 1e-6)}) {
          const bool certain = internal::ImbalanceCertainlyOver(batch, workload, limit);
          EXPECT_EQ(certain, imbalance > limit)
              << "trial " << trial << " limit " << limit << " imbalance " << imbalance;
          (certain ? over : not_over) += 1;
        }
      }
    }
  }
  // Not vacuous: thousands of candidates, both answers, short pieces.
  EXPECT_GT(candidates, 3000);
  EXPECT_GT(short_pieces, 1000);
  EXPECT_GT(over, 3000);
  EXPECT_GT(not_over, 3000);
}

}  // namespace
}  // namespace flashcp::core
