// Density-fill candidates (core/internal/flashcp_kvfill.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "core/analysis.h"
#include "core/datasets.h"
#include "core/internal/flashcp_kvfill.h"
#include "core/internal/flashcp_options.h"
#include "core/internal/flashcp_score.h"
#include "core/internal/flashcp_stages.h"
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
using ::flashcp::core::testing::ExpectKeptOnlyWhenBetter;
using ::flashcp::core::testing::ExpectStageReplacesCompacted;
using ::flashcp::core::testing::LogUniformDocs;
using ::flashcp::core::testing::MinShard;
using internal::SparseOrder;

// Docs {8, 1, 1, 1, 1}, N = 2, minimum shard 1: C/N = 6, 36 + 4 = 40
// pairs, mean 20, 40 / 12 = 3.33 pairs per token. Doc 0 (4.5 per token) is
// dense, the others (1) sparse. Rank 0 aims at 20: y = 2 sparse tokens
// (docs 4 and 3, shortest first, ties by the later index) and a pair of 2
// + 2 of doc 0, [0,2) (3 pairs) and [6,8) (15): 20. With y = 1 it would be
// [0,3) + [6,8) + 1 = 22, with y = 0 [0,3) + [5,8) = 27. Rank 1 takes the
// rest: [2,6) (18) and docs 1 and 2: 20.
TEST(KvFillPiecesTest, DenseDocumentPeeledFromTheOutside) {
  const Batch batch{{8, 1, 1, 1, 1}, 2};
  const internal::FlashCpOptions options = internal::FlashCpOptions::For(batch, MinShard(1));
  std::vector<Shard> pieces;
  ASSERT_TRUE(internal::KvFillPieces(batch, options, SparseOrder::kShortestFirst, pieces));
  const Plan plan = internal::FinishPlan(batch, pieces);
  EXPECT_EQ(plan.shards, (std::vector<Shard>{Shard{0, 0, 2, 0}, Shard{0, 6, 2, 0},
                                             Shard{3, 0, 1, 0}, Shard{4, 0, 1, 0},
                                             Shard{0, 2, 4, 1}, Shard{1, 0, 1, 1},
                                             Shard{2, 0, 1, 1}}));
  EXPECT_THAT(ValidatePlan(plan), IsOk());
  EXPECT_DOUBLE_EQ(internal::ScorePlan(plan).imbalance, 1.0);
  // Rank 0 (head and tail) receives [2,6) (4) and sends [0,2) (2); rank 1
  // receives [0,2) and sends [2,6).
  EXPECT_EQ(TargetedPhaseBottleneck(plan), 4);
}

// Docs {10, 5, 1}, N = 2, minimum shard 2: C/N = 8, 55 + 15 + 1 = 71
// pairs, mean 35.5, 4.44 per token; doc 0 (5.5) dense, docs 1 (3) and 2
// (1) sparse. Rank 0: without the minimum the least y at or under 35.5 is
// 2 (doc 2 whole, a 1-token head of doc 1, and [0,3) [7,10) of doc 0: 1 +
// 1 + 6 + 27 = 35; y = 1 gives 38). With it, the 1-token head is too short:
// doc 2 goes back and doc 1's head is 2 tokens (3 pairs), 3 + 33 = 36, the
// nearest to the aim of the splits tried (y = 1: 38, y = 3: 29). Rank 1
// takes the rest: [3,7) of doc 0 (22), [2,5) of doc 1 (12), doc 2 (1): 35.
TEST(KvFillPiecesTest, ShortSparseHeadTakesAWholeDocumentsPlace) {
  const Batch batch{{10, 5, 1}, 2};
  const internal::FlashCpOptions options = internal::FlashCpOptions::For(batch, MinShard(2));
  std::vector<Shard> pieces;
  ASSERT_TRUE(internal::KvFillPieces(batch, options, SparseOrder::kShortestFirst, pieces));
  const Plan plan = internal::FinishPlan(batch, pieces);
  EXPECT_EQ(plan.shards,
            (std::vector<Shard>{Shard{0, 0, 3, 0}, Shard{0, 7, 3, 0}, Shard{1, 0, 2, 0},
                                Shard{0, 3, 4, 1}, Shard{1, 2, 3, 1}, Shard{2, 0, 1, 1}}));
  EXPECT_THAT(ValidatePlan(plan), IsOk());
  EXPECT_DOUBLE_EQ(internal::ScorePlan(plan).imbalance, 36.0 / 35.5);
  EXPECT_EQ(internal::CountSlivers(plan, 2), 0);
}

// Docs {22, 13, 1}, N = 3, minimum shard 1: C/N = 12, 253 + 91 + 1 = 345
// pairs, mean 115, 9.58 per token. Doc 0 (11.5) is dense; docs 1 (7) and 2
// (1) sparse, doc 1 longer than C/N, so peeled mirrored too. Rank 0: doc
// 2, a 1-token head of doc 1 (too short for a pair) and [0,5) [17,22) of
// doc 0: 1 + 1 + 15 + 100 = 117, the nearest to 115 (y = 3, a pair of doc
// 1: 112; y = 1: 122). Rank 1 aims at (345 - 117) / 2 = 114: doc 1's next
// pair [1,4) [10,13) (9 + 36) and doc 0's [5,8) [14,17) (21 + 48): 114.
// Rank 2 takes the middles, [8,14) of doc 0 (69) and [4,10) of doc 1
// (45): 114.
TEST(KvFillPiecesTest, SparseDocumentLongerThanARankPeeledMirrored) {
  const Batch batch{{22, 13, 1}, 3};
  const internal::FlashCpOptions options = internal::FlashCpOptions::For(batch, MinShard(1));
  std::vector<Shard> pieces;
  ASSERT_TRUE(internal::KvFillPieces(batch, options, SparseOrder::kShortestFirst, pieces));
  const Plan plan = internal::FinishPlan(batch, pieces);
  EXPECT_EQ(plan.shards,
            (std::vector<Shard>{Shard{0, 0, 5, 0}, Shard{0, 17, 5, 0}, Shard{1, 0, 1, 0},
                                Shard{2, 0, 1, 0}, Shard{0, 5, 3, 1}, Shard{0, 14, 3, 1},
                                Shard{1, 1, 3, 1}, Shard{1, 10, 3, 1}, Shard{0, 8, 6, 2},
                                Shard{1, 4, 6, 2}}));
  EXPECT_THAT(ValidatePlan(plan), IsOk());
  EXPECT_DOUBLE_EQ(internal::ScorePlan(plan).imbalance, 117.0 / 115.0);
  // Rank 1 receives 11 of doc 0 and 7 of doc 1; rank 2 sends [8,14) twice
  // and [4,10) once (to rank 1).
  EXPECT_EQ(TargetedPhaseBottleneck(plan), 18);
}

// Nothing denser than the mean rank (equal documents): false, `out` as it
// was.
TEST(KvFillPiecesTest, NoDenseDocumentIsFalse) {
  const Batch batch{{4, 4, 4, 4}, 2};
  const internal::FlashCpOptions options = internal::FlashCpOptions::For(batch, MinShard(1));
  std::vector<Shard> pieces{Shard{0, 0, 1, 0}};
  EXPECT_FALSE(internal::KvFillPieces(batch, options, SparseOrder::kShortestFirst, pieces));
  EXPECT_EQ(pieces, (std::vector<Shard>{Shard{0, 0, 1, 0}}));
}

// At N <= 8 the plan comes back as it was (the all-gather's budget there).
TEST(PreferKvFillTest, EightRanksKeepThePlan) {
  absl::StatusOr<std::vector<std::vector<int64_t>>> batches =
      SampleBatches(Dataset::kPile, 131072, 1, /*seed=*/1);
  ASSERT_THAT(batches, IsOk());
  const Batch batch{(*batches)[0], 8};
  const internal::FlashCpOptions options = internal::FlashCpOptions::For(batch, PlanOptions{});
  const Plan per_doc = internal::PlanPerDoc(batch);
  absl::StatusOr<Plan> kept = internal::PreferKvFill(batch, options, per_doc);
  ASSERT_THAT(kept, IsOk());
  EXPECT_EQ(kept->shards, per_doc.shards);
}

// A stop token that says stop: its status.
TEST(PreferKvFillTest, StopsWhenTold) {
  absl::StatusOr<std::vector<std::vector<int64_t>>> batches =
      SampleBatches(Dataset::kPile, 131072, 1, /*seed=*/1);
  ASSERT_THAT(batches, IsOk());
  const Batch batch{(*batches)[0], 16};
  PlanOptions plan_options;
  plan_options.stop = StopToken([] { return absl::CancelledError("stop"); });
  const internal::FlashCpOptions options = internal::FlashCpOptions::For(batch, plan_options);
  EXPECT_EQ(internal::PreferKvFill(batch, options, internal::PlanPerDoc(batch)).status().code(),
            absl::StatusCode::kCancelled);
}

// Pile's twelfth 1M batch (seed 1) at N = 64: its longest document is 5.5
// C/N and heavy enough for 27 ranks, and documents of 2.5, 2.5 and 1.9 C/N
// follow. The compacted search's plan moves 530,782 tokens a phase (32.4
// C/N) under its cheaper exchange; a fill (its long documents on
// consecutive ranks) meets R = 1.02 with no cut shard under 128 tokens and
// moves 86,125 (5.3 C/N; magi 10.3).
TEST(PreferKvFillTest, ReplacesAPlanThatMovesMore) {
  absl::StatusOr<std::vector<std::vector<int64_t>>> batches =
      SampleBatches(Dataset::kPile, 1 << 20, 12, /*seed=*/1);
  ASSERT_THAT(batches, IsOk());
  ExpectStageReplacesCompacted(Batch{(*batches)[11], 64}, internal::PreferKvFill, 530782, 86125);
}

// Random batches, N = 2 to 64: every fill KvFillPieces builds (both orders)
// is a valid plan (exactly C/N tokens per rank, ValidatePlan) with no cut
// shard under the minimum, and PreferKvFill returns a valid plan that is
// either the one given or one that meets the target, has no more cut
// shards under the minimum than it and moves strictly less under its
// cheaper exchange.
TEST(KvFillPropertyTest, FillsAreValidAndKeptOnlyWhenBetter) {
  SplitMix64Rng rng(20261202);
  const auto below = [&](int64_t k) { return static_cast<int64_t>(rng.Next() % k); };
  int built = 0, replaced = 0, within = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int32_t n = static_cast<int32_t>(2 + below(63));
    const int64_t context = 64 * n + below(256 * n);
    const int64_t m = trial % 3 == 0 ? 0 : 1 + below(64);
    const std::vector<int64_t> docs = LogUniformDocs(rng, context);
    const Batch batch{docs, n};
    const PlanOptions plan_options = MinShard(m);
    const internal::FlashCpOptions options = internal::FlashCpOptions::For(batch, plan_options);
    for (const SparseOrder order : {SparseOrder::kShortestFirst, SparseOrder::kLongestFirst}) {
      std::vector<Shard> pieces;
      if (!internal::KvFillPieces(batch, options, order, pieces)) continue;
      ++built;
      const Plan plan = internal::FinishPlan(batch, pieces);
      ASSERT_THAT(ValidatePlan(plan), IsOk()) << "trial " << trial;
      EXPECT_EQ(internal::CountSlivers(plan, std::max<int64_t>(m, 1)), 0) << "trial " << trial;
      within += internal::ScorePlan(plan).imbalance <= plan_options.target_imbalance;
    }
    const Plan chosen = internal::PlanPerDoc(batch);
    absl::StatusOr<Plan> plan = internal::PreferKvFill(batch, options, chosen);
    ASSERT_THAT(plan, IsOk());
    ASSERT_THAT(ValidatePlan(*plan), IsOk()) << "trial " << trial;
    if (plan->shards == chosen.shards) continue;
    ++replaced;
    EXPECT_GT(n, 8) << "trial " << trial;
    ExpectKeptOnlyWhenBetter(chosen, *plan, plan_options.target_imbalance, m,
                             /*allgather_held=*/false, trial);
  }
  // Fills built, raw fills within R, plans replaced: the test sees each.
  EXPECT_EQ(built, 5349);
  EXPECT_EQ(within, 3069);
  EXPECT_EQ(replaced, 1417);
}

}  // namespace
}  // namespace flashcp::core
