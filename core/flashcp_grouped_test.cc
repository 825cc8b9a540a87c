// Grouped candidates (core/internal/flashcp_grouped.h).
#include <cstdint>
#include <optional>
#include <vector>

#include "core/analysis.h"
#include "core/datasets.h"
#include "core/internal/flashcp_grouped.h"
#include "core/internal/flashcp_options.h"
#include "core/internal/flashcp_score.h"
#include "core/internal/flashcp_util.h"
#include "core/internal/strategies_internal.h"
#include "core/strategies.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::core {
namespace {

using ::flashcp::core::testing::IsOk;

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

}  // namespace
}  // namespace flashcp::core
