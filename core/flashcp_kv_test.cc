// Chunk-heap candidates (core/internal/flashcp_kv.h).
#include <cstdint>
#include <vector>

#include "core/analysis.h"
#include "core/datasets.h"
#include "core/internal/flashcp_kv.h"
#include "core/internal/flashcp_score.h"
#include "core/internal/flashcp_stages.h"
#include "core/internal/flashcp_util.h"
#include "core/internal/strategies_internal.h"
#include "core/strategies.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::core {
namespace {

using ::flashcp::core::testing::IsOk;

// Docs {12, 4}, N = 2, 2 chunks per rank: chunks of 4 tokens, doc 0's
// [0,4) [4,8) [8,12) (10, 26, 42 pairs) and doc 1 (10). Dealt 42, 26, then
// the tie of 10s later chunk first. Slack 0 (MagiAttention's rule): 42 to
// rank 0, 26 to rank 1 (the least), doc 1 to rank 1 (36 < 42), doc 0's head
// to rank 0, the only one not full: doc 0 on both ranks, its head and tail
// on rank 0.
TEST(KvHeapPiecesTest, SlackZeroIsTheMinHeap) {
  const Batch batch{{12, 4}, 2};
  const Plan plan = internal::FinishPlan(batch, internal::KvHeapPieces(batch, 2, 0.0));
  EXPECT_EQ(plan.shards, (std::vector<Shard>{Shard{0, 0, 4, 0}, Shard{0, 8, 4, 0},
                                             Shard{0, 4, 4, 1}, Shard{1, 0, 4, 1}}));
}

// The same with slack 100 pairs: chunk [4,8) joins its neighbour [8,12) on
// rank 0 (load 42 <= 0 + 100), which is then full, so doc 0 is cut once,
// contiguously: rank 0 [4,12), rank 1 the head and doc 1 (whose chunk has
// no neighbour: [8,12) is another document's).
TEST(KvHeapPiecesTest, SlackKeepsNeighbouringChunksTogether) {
  const Batch batch{{12, 4}, 2};
  const Plan plan = internal::FinishPlan(batch, internal::KvHeapPieces(batch, 2, 100.0));
  EXPECT_EQ(plan.shards, (std::vector<Shard>{Shard{0, 4, 8, 0}, Shard{0, 0, 4, 1},
                                             Shard{1, 0, 4, 1}}));
}

// Docs {7}, N = 2 (one padding token, on rank 1: targets 4 and 3), 2 chunks
// per rank: near-equal chunks [0,1) [1,3) [3,5) [5,7) (1, 5, 9, 13 pairs).
// 13 to rank 0, 9 and 5 to rank 1, 1 to rank 0: 3 and 4 tokens; rank 0's
// last chunk grows by one, rank 1's shrinks by one.
TEST(KvHeapPiecesTest, LastChunksTakeUpTheTokenTargets) {
  const Batch batch{{7}, 2};
  const Plan plan = internal::FinishPlan(batch, internal::KvHeapPieces(batch, 2, 0.0));
  EXPECT_EQ(plan.shards,
            (std::vector<Shard>{Shard{0, 0, 1, 0}, Shard{0, 4, 3, 0}, Shard{0, 1, 3, 1}}));
  EXPECT_EQ(plan.padding, 1);
  EXPECT_THAT(ValidatePlan(plan), IsOk());
}

// At N <= 8 the plan comes back as it was.
TEST(PreferLeastKvTest, UpToEightRanksKeepsThePlan) {
  absl::StatusOr<std::vector<std::vector<int64_t>>> batches =
      SampleBatches(Dataset::kWlbLlm, 131072, 1, /*seed=*/1);
  ASSERT_THAT(batches, IsOk());
  const Batch batch{(*batches)[0], 8};
  absl::StatusOr<Plan> compacted = internal::PlanFlashCpCompacted(batch, PlanOptions{});
  ASSERT_THAT(compacted, IsOk());
  absl::StatusOr<Plan> kept = internal::PreferLeastKv(
      batch, internal::FlashCpOptions::For(batch, PlanOptions{}), *compacted);
  ASSERT_THAT(kept, IsOk());
  EXPECT_EQ(kept->shards, compacted->shards);
}

// WLB-LLM's first batch at 128K (seed 1), N = 16: the compacted search
// zigzags its long documents over all 16 ranks (targeted bottleneck 106,184
// tokens, 13.0 C/N, before role swaps); a chunk-heap candidate meets R = 1.02
// with no cut shard under 128 tokens and moves 17,014 (2.1 C/N).
TEST(PreferLeastKvTest, ChunkHeapReplacesAWideZigzag) {
  absl::StatusOr<std::vector<std::vector<int64_t>>> batches =
      SampleBatches(Dataset::kWlbLlm, 131072, 1, /*seed=*/1);
  ASSERT_THAT(batches, IsOk());
  const Batch batch{(*batches)[0], 16};
  const PlanOptions options;
  absl::StatusOr<Plan> compacted = internal::PlanFlashCpCompacted(batch, options);
  ASSERT_THAT(compacted, IsOk());
  EXPECT_EQ(TargetedPhaseBottleneck(*compacted), 106184);
  absl::StatusOr<Plan> plan = internal::PreferLeastKv(
      batch, internal::FlashCpOptions::For(batch, options), *compacted);
  ASSERT_THAT(plan, IsOk());
  EXPECT_THAT(ValidatePlan(*plan), IsOk());
  const internal::PlanScore score = internal::ScorePlan(*plan);
  EXPECT_LE(score.imbalance, options.target_imbalance);
  EXPECT_GE(score.min_cut_len, 128);
  EXPECT_EQ(TargetedPhaseBottleneck(*plan), 17014);
}

}  // namespace
}  // namespace flashcp::core
