// FlashCP, our planner: hand-worked small cases, its building blocks, and a
// quality regression on the data-set generators against the paper's heuristic.
#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "core/analysis.h"
#include "core/datasets.h"
#include "core/internal/flashcp_roles.h"
#include "core/internal/flashcp_repair.h"
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
using ::testing::ElementsAre;

TEST(FlashCpTest, EqualDocumentsStayWhole) {
  // [4, 4] on 2 ranks: one whole document per rank, W 10 each: imbalance 1,
  // nothing cut, nothing communicated.
  absl::StatusOr<Plan> plan = MakePlan(Strategy::kFlashCp, Batch{{4, 4}, 2});
  ASSERT_THAT(plan, IsOk());
  EXPECT_THAT(plan->shards, ElementsAre(Shard{0, 0, 4, 0}, Shard{1, 0, 4, 1}));
}

// The tiny hand-worked cases below turn the minimum-shard rule off (their
// documents are far shorter than its default 128 tokens); the rule has its
// own cases further down.
PlanOptions NoMinShard() {
  PlanOptions o;
  o.min_shard_tokens = 0;
  return o;
}

TEST(FlashCpTest, FallsBackToPerDocForTheLongDocument) {
  // [8, 2, 2] on 2 ranks, R = 1.02. k = 0 (no Per-Doc): every rho puts doc 0
  // (W 36) alone on a rank, imbalance >= 33/21. k = 1: doc 0 zigzagged gives
  // r0 [0,2) + [6,8) and r1 [2,6), W 18 each, 4 tokens each; docs 1 and 2
  // (W 3) one per rank: 21 and 21, imbalance 1.0, and only doc 0 is cut.
  absl::StatusOr<Plan> plan = MakePlan(Strategy::kFlashCp, Batch{{8, 2, 2}, 2}, NoMinShard());
  ASSERT_THAT(plan, IsOk());
  EXPECT_THAT(plan->shards, ElementsAre(Shard{0, 0, 2, 0}, Shard{0, 6, 2, 0}, Shard{1, 0, 2, 0},
                                        Shard{0, 2, 4, 1}, Shard{2, 0, 2, 1}));
}

TEST(FlashCpTest, BestImbalanceWhenTargetUnreachable) {
  // [6, 2] on 2 ranks, R = 1.02: nothing reaches it.
  // k = 0: W 18 vs 6 (1.5). k = 1: doc 0 zigzag r0 W 9, r1 W 12; doc 1 to
  //   r0, head [0,1) (W 1) to r1: 11 vs 13 (13/12 = 1.083).
  // k = 2: all Per-Doc, 10 vs 14 (1.167). The least imbalanced plan wins.
  absl::StatusOr<Plan> plan = MakePlan(Strategy::kFlashCp, Batch{{6, 2}, 2}, NoMinShard());
  ASSERT_THAT(plan, IsOk());
  EXPECT_THAT(plan->shards, ElementsAre(Shard{0, 0, 2, 0}, Shard{0, 5, 1, 0}, Shard{1, 1, 1, 0},
                                        Shard{0, 2, 3, 1}, Shard{1, 0, 1, 1}));
  absl::StatusOr<PlanMetrics> m = AnalyzePlan(*plan, ModelShape{});
  ASSERT_THAT(m, IsOk());
  EXPECT_THAT(m->rank_workload, ElementsAre(11.0, 13.0));
}

TEST(WholeDocPiecesTest, WholeMovesAvoidCuts) {
  // [5, 3, 1, 1, 1, 1] on 2 ranks (6 tokens each). Plain LPT (rho 0): doc 0
  // (W 15) -> r0, doc 1 (W 6) -> r1, then the 1-token docs (W 1) to the
  // lighter rank: r1 reaches 7, 8, 9, 10 < 15: r0 5 tokens, r1 7.
  const Batch batch{{5, 3, 1, 1, 1, 1}, 2};
  const std::vector<int32_t> order = {0, 1, 2, 3, 4, 5};
  const std::vector<int64_t> need = {6, 6};
  // With whole moves, r1's shortest document (doc 5, 1 token) moves whole to
  // r0: W 16 vs 9, nothing cut.
  std::vector<double> w = {0, 0};
  std::vector<Shard> pieces;
  internal::WholeDocPieces(batch, order, need, w, pieces, {0.0, true});
  EXPECT_EQ(internal::FinishPlan(batch, pieces).shards,
            (std::vector<Shard>{{0, 0, 5, 0}, {5, 0, 1, 0}, {1, 0, 3, 1}, {2, 0, 1, 1},
                                {3, 0, 1, 1}, {4, 0, 1, 1}}));
  EXPECT_THAT(w, ElementsAre(16.0, 9.0));
  // The paper's equalization cuts the head [0, 1) of r1's longest document
  // (doc 1) instead: the same W 1 moves, but doc 1 is now cut and its head's
  // KV must travel.
  w = {0, 0};
  pieces.clear();
  internal::WholeDocPieces(batch, order, need, w, pieces);
  EXPECT_EQ(internal::FinishPlan(batch, pieces).shards,
            (std::vector<Shard>{{0, 0, 5, 0}, {1, 0, 1, 0}, {1, 1, 2, 1}, {2, 0, 1, 1},
                                {3, 0, 1, 1}, {4, 0, 1, 1}, {5, 0, 1, 1}}));
  EXPECT_THAT(w, ElementsAre(16.0, 9.0));
}

TEST(WholeDocPiecesTest, RhoSteersLptTowardTokenBalance) {
  // [4, 3, 3] on 2 ranks, 5 tokens each; rho 4, key = W - 4 * (tokens - 5),
  // both ranks start at key 20 (lowest index wins ties).
  //   doc 0 (W 10) -> r0: key 10 - 4 * (4 - 5) = 14.
  //   doc 1 (W 6)  -> r0 (14 < 20): key 16 - 4 * (7 - 5) = 8.
  //   doc 2 (W 6)  -> r0 (8 < 20): W 22, 10 tokens, 5 excess.
  // Equalization: whole doc 2 (3 tokens, W 6) to r1, then head [0, 2) of
  // doc 0 (W 3) to r1. (rho 0 would have put docs 1 and 2 on r1.)
  const Batch batch{{4, 3, 3}, 2};
  const std::vector<int32_t> order = {0, 1, 2};
  std::vector<double> w = {0, 0};
  std::vector<Shard> pieces;
  internal::WholeDocPieces(batch, order, {5, 5}, w, pieces, {4.0, true});
  EXPECT_EQ(internal::FinishPlan(batch, pieces).shards,
            (std::vector<Shard>{{0, 2, 2, 0}, {1, 0, 3, 0}, {0, 0, 2, 1}, {2, 0, 3, 1}}));
  // r0: [2,4) of doc 0 = (4+2+1)*2/2 = 7, plus doc 1 (6) = 13; r1: 3 + 6 = 9.
  EXPECT_THAT(w, ElementsAre(13.0, 9.0));
}

TEST(FlashCpTest, SingleRankKeepsEverythingWhole) {
  absl::StatusOr<Plan> plan = MakePlan(Strategy::kFlashCp, Batch{{3, 1, 2}, 1});
  ASSERT_THAT(plan, IsOk());
  EXPECT_THAT(plan->shards, ElementsAre(Shard{0, 0, 3, 0}, Shard{1, 0, 1, 0}, Shard{2, 0, 2, 0}));
}

TEST(PerDocPiecesTest, MatchesPlanPerDocOnTheWholeBatch) {
  const Batch batch{{7, 1, 12, 5, 30}, 3};
  const std::vector<int32_t> all = {0, 1, 2, 3, 4};
  EXPECT_EQ(internal::FinishPlan(batch, internal::PerDocPieces(batch, all)).shards,
            internal::PlanPerDoc(batch).shards);
}

TEST(PerDocPiecesTest, SubsetKeepsDocumentIndices) {
  // Doc 2 (4 tokens) alone on 2 ranks: chunks of 1, owners 0, 1, 1, 0.
  const Batch batch{{9, 9, 4}, 2};
  EXPECT_EQ(internal::FinishPlan(batch, internal::PerDocPieces(batch, {2})).shards,
            (std::vector<Shard>{{2, 0, 1, 0}, {2, 3, 1, 0}, {2, 1, 2, 1}}));
}

// The minimum-shard rule (PlanOptions::min_shard_tokens, docs/planner.md).

TEST(PerDocPiecesTest, MinShardUsesFewerRanks) {
  // Doc 0, 10 tokens, N = 4, min 2: c = clamp(10 / (2 * 2), 1, 4) = 2 ranks,
  // 2c = 4 chunks of 10 / 4 = 2, the 10 % 4 = 2 leftovers to positions 0 and
  // 1 (front chunks): [3, 3, 2, 2]; chunk k to position k < c ? k : 2c-1-k,
  // i.e. ranks 0, 1, 1, 0. Every chunk >= 2 tokens.
  const Batch batch{{10}, 4};
  EXPECT_EQ(internal::FinishPlan(batch, internal::PerDocPieces(batch, {0}, 2)).shards,
            (std::vector<Shard>{{0, 0, 3, 0}, {0, 8, 2, 0}, {0, 3, 5, 1}}));
  // A document shorter than 4 * min stays whole (c = 1), on the next rank in
  // turn: doc 1 (7 tokens, min 2) after doc 0 took ranks 0 and 1 goes to r2.
  const Batch two{{10, 7}, 4};
  EXPECT_EQ(internal::FinishPlan(two, internal::PerDocPieces(two, {0, 1}, 2)).shards,
            (std::vector<Shard>{{0, 0, 3, 0}, {0, 8, 2, 0}, {0, 3, 5, 1}, {1, 0, 7, 2}}));
}

// PerDocPieces of documents 0 and 1 with `room_each` tokens of room on each
// rank and minimum shard `min_shard`: the plan's shards, the rooms left and
// whether the zigzag needed a refit.
struct FittedPerDoc {
  std::vector<Shard> shards;
  std::vector<int64_t> room;
  bool refit = false;
};
FittedPerDoc FitTwoDocs(const Batch& batch, int64_t room_each, int64_t min_shard) {
  FittedPerDoc fit;
  fit.room.assign(batch.cp_size, room_each);
  fit.shards = internal::FinishPlan(
                   batch, internal::PerDocPieces(batch, {0, 1}, min_shard, &fit.room, &fit.refit))
                   .shards;
  return fit;
}

TEST(PerDocPiecesTest, ShiftsCutPointsWhenARankOverfills) {
  // docs [24, 10] on 2 ranks, min 3, room 17 each. Doc 0: c = clamp(24 / 6,
  // 1, 2) = 2 = N, chunks of 6: r0 [0,6) + [18,24), r1 [6,18); rooms 5 and
  // 5. Doc 1: c = clamp(10 / 6, 1, 2) = 1, whole to the rank of most room
  // (r0, lowest on the tie): r0's room -5. The 5 tokens go back to r1 by
  // cut-point shifts of doc 0 (each piece keeps >= 3): no boundary can
  // carry 5 (r0's pieces spare 3 each), so first 2 ([0,6) -> [0,4), r1's
  // piece grows to [4,18)), then 3 ([18,24) -> [21,24), r1's to [4,21)).
  // Rooms 0 and 0; `refit` says the zigzag was refitted.
  const FittedPerDoc fit = FitTwoDocs(Batch{{24, 10}, 2}, 17, 3);
  EXPECT_EQ(fit.shards,
            (std::vector<Shard>{{0, 0, 4, 0}, {0, 21, 3, 0}, {1, 0, 10, 0}, {0, 4, 17, 1}}));
  EXPECT_EQ(fit.room, (std::vector<int64_t>{0, 0}));
  EXPECT_TRUE(fit.refit);
}

TEST(PerDocPiecesTest, LeavesPiecesAndRoomsWhenTheShiftsFallShort) {
  // docs [16, 10] on 2 ranks, min 3, room 13 each. Doc 0: c = clamp(16 / 6,
  // 1, 2) = 2, chunks of 4: r0 [0,4) + [12,16), r1 [4,12); rooms 5 and 5.
  // Doc 1: c = clamp(10 / 6, 1, 2) = 1, whole to r0 (the tie's lowest): r0's
  // room -5. Every boundary between r0 and r1 is in doc 0, where r0's two
  // pieces can spare 1 token each (4 -> 3): 2 of the 5 tokens could move,
  // not all. The fit is all or nothing: pieces and rooms stay as they were
  // (r0 over by 5), and `refit` says a refit was needed (the caller then
  // scores the full zigzag too).
  const FittedPerDoc fit = FitTwoDocs(Batch{{16, 10}, 2}, 13, 3);
  EXPECT_EQ(fit.shards,
            (std::vector<Shard>{{0, 0, 4, 0}, {0, 12, 4, 0}, {1, 0, 10, 0}, {0, 4, 8, 1}}));
  EXPECT_EQ(fit.room, (std::vector<int64_t>{-5, 5}));
  EXPECT_TRUE(fit.refit);
}

// The old WLB-LLM failure: a rank receives heads of several long documents
// from several donors, each sized to its remaining deficit, so some are
// slivers, and no other cut document links the donors back to it (no
// chain). wlbllm, 128K, N = 4, seed 1, batch 20: before the whole-document
// repair, rank 2 got heads [0,44) of doc 4, [0,150) of doc 28 and [0,37) of
// doc 19, and the 44- and 37-token ones stayed. Now r2's 88-token document
// goes to r0 and doc 4's head grows by 88 to 132; doc 19's head grows by
// 110 to 147 as r2 swaps its 3258-token document for r3's 3148-token one;
// imbalance 1.0046.
TEST(FlashCpTest, WlbLlmHeadsAreRepairedWithWholeDocuments) {
  const Batch batch{{3571, 3477, 3288, 3568, 6227, 4705, 3343, 4584, 3148, 1951, 3990,
                     3744, 4865, 5298, 508,  1062, 2718, 696,  1599, 5568, 88,   5575,
                     4257, 5178, 937,  590,  4201, 305,  6004, 3443, 2685, 1441, 3450,
                     5060, 4031, 757,  5310, 840,  3258, 3083, 2669},
                    4};
  absl::StatusOr<Plan> plan = MakePlan(Strategy::kFlashCp, batch);
  ASSERT_THAT(plan, IsOk());
  std::vector<Shard> cut;
  for (const Shard& s : plan->shards) {
    if (s.len < batch.doc_lens[s.doc]) cut.push_back(s);
  }
  EXPECT_EQ(cut, (std::vector<Shard>{{4, 132, 6095, 0}, {28, 150, 5854, 1}, {4, 0, 132, 2},
                                     {19, 0, 147, 2}, {28, 0, 150, 2}, {19, 147, 5421, 3}}));
  absl::StatusOr<PlanMetrics> m = AnalyzePlan(*plan, ModelShape{});
  ASSERT_THAT(m, IsOk());
  EXPECT_EQ(m->rank_tokens, std::vector<int64_t>(4, 32768));
  EXPECT_EQ(m->rank_nonlast_tokens, (std::vector<int64_t>{0, 0, 429, 0}));
  EXPECT_LE(m->imbalance, 1.02);
}

// A sliver with no chain and no whole-document fix: the repair cuts a new
// head. wlbllm, 128K, N = 8, seed 1, batch 5: the winner (k = 0, imbalance
// 1.0150 before repair) keeps a 79-token piece [1199, 1278) of doc 26 on r5,
// a rank holding only long whole documents. The piece grows by m = 128 to
// [1199, 1406) out of r7's [1278, ...), and r5 hands r7 the 128-token head
// of its shortest whole document of >= 256 tokens (doc 5, 3006 tokens; its
// tail [128, 3006) stays on r5 as the last shard). Tokens stay 16384 per
// rank; r5's workload rises about 128 x 1342 (the grown piece's prefix), to
// 1.0197, under R = 1.02. (Before the new-head fix this batch fell back to
// a k = 1 plan with 5 cut documents and max non-last 1470 tokens; now 3 cut
// documents and 1097.)
TEST(FlashCpTest, WlbLlmSliverGrowsByANewHead) {
  const Batch batch{{4182, 1656, 792,  4943, 5781, 3006, 3477, 5220, 1934, 3958,
                     1407, 4742, 5582, 1824, 4080, 2524, 2589, 3457, 4310, 2696,
                     5519, 1127, 2031, 2012, 4516, 7275, 5170, 3791, 3805, 5755,
                     359,  4682, 2701, 963,  3098, 3440, 5828, 840},
                    8};
  absl::StatusOr<Plan> plan = MakePlan(Strategy::kFlashCp, batch);
  ASSERT_THAT(plan, IsOk());
  std::vector<Shard> cut;
  for (const Shard& s : plan->shards) {
    if (s.len < batch.doc_lens[s.doc]) cut.push_back(s);
  }
  EXPECT_EQ(cut, (std::vector<Shard>{{7, 0, 1097, 0},
                                     {7, 1097, 248, 1},
                                     {26, 0, 533, 1},
                                     {26, 823, 243, 2},
                                     {26, 533, 290, 3},
                                     {26, 1066, 133, 4},
                                     {5, 128, 2878, 5},
                                     {26, 1199, 207, 5},
                                     {7, 1345, 3875, 6},
                                     {5, 0, 128, 7},
                                     {26, 1406, 3764, 7}}));
  absl::StatusOr<PlanMetrics> m = AnalyzePlan(*plan, ModelShape{});
  ASSERT_THAT(m, IsOk());
  EXPECT_EQ(m->rank_tokens, std::vector<int64_t>(8, 16384));
  EXPECT_EQ(m->cut_docs, 3);
  EXPECT_EQ(m->min_cut_shard_len, 128);
  EXPECT_EQ(m->rank_nonlast_tokens,
            (std::vector<int64_t>{1097, 781, 243, 290, 133, 207, 0, 128}));
  EXPECT_LE(m->imbalance, 1.02);
}

// Batches of the data-set generators (128K, seed 1, 200 per cell, R 1.02,
// the default 128-token minimum) with a cut shard < 128: none. (WLB-LLM N = 8
// batch 148 kept three until the repair could cut a new head; it is now
// sliver-free at imbalance 1.0133.)
TEST(FlashCpQualityTest, NoSliversOnGeneratedBatches) {
  for (Dataset ds : {Dataset::kWlbLlm, Dataset::kPile, Dataset::kRedPajama}) {
    absl::StatusOr<std::vector<std::vector<int64_t>>> batches = SampleBatches(ds, 131072, 200, 1);
    ASSERT_THAT(batches, IsOk());
    for (int32_t n : {4, 8}) {
      std::vector<size_t> with_short;
      for (size_t i = 0; i < batches->size(); ++i) {
        absl::StatusOr<Plan> plan = MakePlan(Strategy::kFlashCp, Batch{(*batches)[i], n});
        ASSERT_THAT(plan, IsOk());
        absl::StatusOr<PlanMetrics> m = AnalyzePlan(*plan, ModelShape{});
        ASSERT_THAT(m, IsOk());
        if (m->cut_docs > 0 && m->min_cut_shard_len < 128) with_short.push_back(i);
      }
      EXPECT_EQ(with_short, std::vector<size_t>{}) << DatasetName(ds) << " N=" << n;
    }
  }
}

TEST(FlashCpTest, RecutKeepsAShortDocumentWhole) {
  // Docs [42, 1063] on 3 ranks: 1105 tokens, 369 / 368 / 368. Before the
  // re-cut (3e88e0e), flashcp cut doc 0 into two slivers, 28 tokens on rank
  // 2 and 14 on rank 1, beside a zigzag of doc 1 fitted to the rooms
  // (imbalance 1.0142), and no repair could grow them. Re-cut (RecutPieces)
  // keeps doc 0 whole on rank 0 and moves doc 1's cut points instead:
  //   rank 0: W(0, 42) + W(0, 145) + W(881, 182) = 903 + 10585 + 176995 = 188483
  //   rank 1: W(145, 184) + W(697, 184) = 43700 + 145268 = 188968
  //   rank 2: W(329, 368) = (658 + 369) * 184 = 188968
  // against a mean of (903 + 565516) / 3 = 188806.3: imbalance 1.00086.
  absl::StatusOr<Plan> plan = MakePlan(Strategy::kFlashCp, Batch{{42, 1063}, 3});
  ASSERT_THAT(plan, IsOk());
  EXPECT_THAT(plan->shards, ElementsAre(Shard{0, 0, 42, 0}, Shard{1, 0, 145, 0},
                                        Shard{1, 881, 182, 0}, Shard{1, 145, 184, 1},
                                        Shard{1, 697, 184, 1}, Shard{1, 329, 368, 2}));
  absl::StatusOr<PlanMetrics> m = AnalyzePlan(*plan, ModelShape{});
  ASSERT_THAT(m, IsOk());
  EXPECT_NEAR(m->imbalance, 188968.0 / (566419.0 / 3), 1e-12);
}

TEST(FlashCpTest, MinShardPerDocChunks) {
  // [16, 4, 4] on 2 ranks, min 4, R 1.02. Total W 136 + 10 + 10 = 156, mean
  // 78, bound 79.56. Doc 0 (16 > C/N = 12) keeps at least W(4, 12) = 126 on
  // one rank unless zigzagged: k >= 1. k = 1: c = clamp(16 / 8, 1, 2) = 2 =
  // N: chunks of 4: r0 [0,4) + [12,16) (W 10 + 58 = 68), r1 [4,12) (W 68),
  // need 4 and 4; docs 1 and 2 (W 10) one each (tie to r0 first): 78 / 78.
  // Every cut shard has 4 tokens, the minimum.
  PlanOptions o;
  o.min_shard_tokens = 4;
  absl::StatusOr<Plan> plan = MakePlan(Strategy::kFlashCp, Batch{{16, 4, 4}, 2}, o);
  ASSERT_THAT(plan, IsOk());
  EXPECT_THAT(plan->shards, ElementsAre(Shard{0, 0, 4, 0}, Shard{0, 12, 4, 0}, Shard{1, 0, 4, 0},
                                        Shard{0, 4, 8, 1}, Shard{2, 0, 4, 1}));
}

TEST(FlashCpTest, MinShardHeadsAreNotSlivers) {
  // [300, 200, 20] on 2 ranks (260 tokens each), min 50. Total W 45150 +
  // 20100 + 210 = 65460, mean 32730, bound (R 1.02) 33384.6. Doc 0 (300 >
  // C/N = 260) keeps W(40, 260) = 44330 > bound on one rank unless
  // zigzagged, so k >= 1: c = clamp(300 / 100, 1, 2) = 2 = N, chunks of 75:
  // r0 [0,75) + [225,300), r1 [75,225). The rest is equalized with heads of
  // at least 50 tokens; every cut shard of the plan has >= 50 tokens, while
  // the rule off (min 0) is free to cut exact-shortfall heads.
  PlanOptions o;
  o.min_shard_tokens = 50;
  absl::StatusOr<Plan> plan = MakePlan(Strategy::kFlashCp, Batch{{300, 200, 20}, 2}, o);
  ASSERT_THAT(plan, IsOk());
  absl::StatusOr<PlanMetrics> m = AnalyzePlan(*plan, ModelShape{});
  ASSERT_THAT(m, IsOk());
  EXPECT_GE(m->min_cut_shard_len, 50);
  EXPECT_LE(m->imbalance, 1.02);
}

TEST(FlashCpTest, RejectsNegativeMinShard) {
  PlanOptions o;
  o.min_shard_tokens = -1;
  absl::StatusOr<Plan> plan = MakePlan(Strategy::kFlashCp, Batch{{4, 4}, 2}, o);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(plan.status().message()), ::testing::HasSubstr("min_shard_tokens"));
}

// Quality regression on the generators (docs/benchmarks.md, "Plan quality"):
// at R = 1.02 flashcp meets the imbalance goals and communicates less than
// the paper's heuristic under the allgather scheme with the minimum-shard
// rule off; with the default rule (128 tokens) it may give up a little on
// WLB-LLM (measured: on par at N = 8), so there it must stay within 0.5
// points of the paper's heuristic, and strictly ahead on Pile.
TEST(FlashCpQualityTest, BeatsPaperHeuristicOnGeneratedBatches) {
  for (Dataset ds : {Dataset::kPile, Dataset::kWlbLlm}) {
    absl::StatusOr<std::vector<std::vector<int64_t>>> batches =
        SampleBatches(ds, 131072, 40, 7);
    ASSERT_THAT(batches, IsOk());
    for (int32_t n : {4, 8}) {
      double ours_imb = 0, ours_save = 0, paper_save = 0, off_save = 0;
      PlanOptions off;
      off.min_shard_tokens = 0;
      for (const std::vector<int64_t>& docs : *batches) {
        absl::StatusOr<Plan> ours = MakePlan(Strategy::kFlashCp, Batch{docs, n});
        absl::StatusOr<Plan> ours_off = MakePlan(Strategy::kFlashCp, Batch{docs, n}, off);
        ASSERT_THAT(ours_off, IsOk());
        absl::StatusOr<PlanMetrics> moff = AnalyzePlan(*ours_off, ModelShape{});
        ASSERT_THAT(moff, IsOk());
        off_save += moff->comm_saving;
        absl::StatusOr<Plan> paper = MakePlan(Strategy::kFlashCpPaper, Batch{docs, n});
        ASSERT_THAT(ours, IsOk());
        ASSERT_THAT(paper, IsOk());
        absl::StatusOr<PlanMetrics> mo = AnalyzePlan(*ours, ModelShape{});
        absl::StatusOr<PlanMetrics> mp = AnalyzePlan(*paper, ModelShape{});
        ASSERT_THAT(mo, IsOk());
        ASSERT_THAT(mp, IsOk());
        EXPECT_LE(mo->imbalance, 1.05) << DatasetName(ds) << " N=" << n;
        ours_imb += mo->imbalance;
        ours_save += mo->comm_saving;
        paper_save += mp->comm_saving;
      }
      const double k = static_cast<double>(batches->size());
      EXPECT_LE(ours_imb / k, 1.02) << DatasetName(ds) << " N=" << n;
      EXPECT_GT(off_save, paper_save) << DatasetName(ds) << " N=" << n;
      if (ds == Dataset::kPile) {
        EXPECT_GT(ours_save, paper_save) << DatasetName(ds) << " N=" << n;
      } else {
        EXPECT_GT(ours_save / k, paper_save / k - 0.005) << DatasetName(ds) << " N=" << n;
      }
    }
  }
}

// flashcp against its compacted search alone (flashcp.cc): on every
// batch the plan meets the target and moves no more under either the
// all-gather or its cheaper exchange; on some it moves strictly less.
TEST(FlashCpTargetedTest, GroupedPlansMoveLessAndNeverMoreAllGather) {
  int strictly_less = 0;
  for (Dataset d : kAllDatasets) {
    absl::StatusOr<std::vector<std::vector<int64_t>>> batches = SampleBatches(d, 131072, 8, 1);
    ASSERT_THAT(batches, IsOk());
    for (const std::vector<int64_t>& docs : *batches) {
      const Batch batch{docs, 4};
      const PlanOptions options;
      absl::StatusOr<Plan> compacted_or = internal::PlanFlashCpCompacted(batch, options);
      ASSERT_THAT(compacted_or, IsOk());
      const Plan& compacted = *compacted_or;
      absl::StatusOr<Plan> plan = MakePlan(Strategy::kFlashCp, batch, options);
      ASSERT_THAT(plan, IsOk());
      absl::StatusOr<PlanMetrics> a = AnalyzePlan(compacted, ModelShape{});
      absl::StatusOr<PlanMetrics> b = AnalyzePlan(*plan, ModelShape{});
      ASSERT_THAT(a, IsOk());
      ASSERT_THAT(b, IsOk());
      const auto phase = [](const PlanMetrics& m, CommScheme s) {
        return m.bytes[static_cast<int>(s)].phase.bottleneck_tokens;
      };
      const auto cheaper = [&](const PlanMetrics& m) {
        return std::min(phase(m, CommScheme::kAllGather), phase(m, CommScheme::kTargeted));
      };
      EXPECT_LE(b->imbalance, options.target_imbalance);
      EXPECT_LE(phase(*b, CommScheme::kAllGather), phase(*a, CommScheme::kAllGather));
      EXPECT_LE(cheaper(*b), cheaper(*a));
      if (cheaper(*b) < cheaper(*a)) ++strictly_less;
    }
  }
  // Of 24 batches at N = 4: 7 by grouped plans alone, 11 with role swaps,
  // 12 with capacity groups (flashcp_kvgroups.h).
  EXPECT_EQ(strictly_less, 12);
}

// SPEC's example (one 16-token document, N = 2; C/N = 8, mean workload 68):
// the rank holding the last token holds at most 8 of it, so it receives at
// least 8, as per_doc does. With less workload allowed, fewer tokens fit
// beside the last one: W(0, a - 1) + 16 + (8 - a) <= 30 holds up to a = 5
// (29 pairs; a = 6 needs 33), so 11; below 23 pairs (a = 1) no plan fits: 15.
TEST(TargetedPhaseLowerBoundTest, LastTokenRankReceivesTheRest) {
  const Batch batch{{16}, 2};
  EXPECT_EQ(TargetedPhaseLowerBound(batch, 68.0), 8);
  EXPECT_EQ(TargetedPhaseLowerBound(batch, 30.0), 11);
  EXPECT_EQ(TargetedPhaseLowerBound(batch, 29.0), 11);
  EXPECT_EQ(TargetedPhaseLowerBound(batch, 28.9), 12);
  EXPECT_EQ(TargetedPhaseLowerBound(batch, 22.0), 15);
  // Documents kept whole by every plan (a = L fits) need nothing.
  EXPECT_EQ(TargetedPhaseLowerBound(Batch{{4, 4}, 2}, 10.0), 0);
}

// No plan beats the bound: every strategy's plan on the data sets, at the
// plan's own maximum rank workload.
TEST(TargetedPhaseLowerBoundTest, NoPlanBeatsIt) {
  int64_t positive = 0;
  for (Dataset d : kAllDatasets) {
    for (int32_t n : {4, 8, 16}) {
      absl::StatusOr<std::vector<std::vector<int64_t>>> batches = SampleBatches(d, 131072, 4, 3);
      ASSERT_THAT(batches, IsOk());
      for (const std::vector<int64_t>& docs : *batches) {
        const Batch batch{docs, n};
        for (Strategy s : AllStrategies()) {
          if (s == Strategy::kIlp || s == Strategy::kBasp) continue;  // basp: equal documents only
          absl::StatusOr<Plan> plan = MakePlan(s, batch, PlanOptions{});
          ASSERT_THAT(plan, IsOk());
          absl::StatusOr<PlanMetrics> m = AnalyzePlan(*plan, ModelShape{});
          ASSERT_THAT(m, IsOk());
          const double max_w = *std::max_element(m->rank_workload.begin(), m->rank_workload.end());
          const int64_t bound = TargetedPhaseLowerBound(batch, max_w);
          EXPECT_GE(m->bytes[static_cast<int>(CommScheme::kTargeted)].phase.bottleneck_tokens, bound)
              << StrategyName(s) << " " << DatasetName(d) << " N=" << n;
          positive += bound > 0 ? 1 : 0;
        }
      }
    }
  }
  EXPECT_GT(positive, 0);
}

}  // namespace
}  // namespace flashcp::core
