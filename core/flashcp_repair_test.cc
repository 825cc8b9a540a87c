// flashcp's repair stage (flashcp_repair.h): slivers removed by chains of
// cut-point shifts, whole-document moves and new cuts, hand-worked.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "core/analysis.h"
#include "core/internal/flashcp_repair.h"
#include "core/internal/flashcp_util.h"
#include "core/internal/per_doc.h"
#include "core/internal/strategies_internal.h"
#include "core/random.h"
#include "core/testing/candidates.h"
#include "core/testing/status_matchers.h"
#include "core/types.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::core {
namespace {

using ::testing::ElementsAre;

TEST(RepairSliversTest, ChainAvoidsARelayOverTheBound) {
  // docs [10, 10, 10, 10, 10, 14] on 4 ranks, min 3. Doc 0: [0,1) r0 (the
  // sliver), [1,10) r1; doc 1: [0,5) r1, [5,10) r2; doc 2: [0,4) r2, [4,10)
  // r0; doc 3: [0,5) r1, [5,10) r3; doc 4: [0,4) r3, [4,10) r0; doc 5 whole
  // on r2. Workloads (W(p, s) = (2p + s + 1) s / 2): r0 1 + 45 + 45 = 91,
  // r1 54 + 15 + 15 = 84, r2 40 + 10 + 105 = 155, r3 40 + 10 = 50; bound 0,
  // so the current maximum, 155. Absorbing the sliver into r1 (r0 -1, r1
  // +1) needs a chain r1 -> r0 for 1 token. The shortest, through r2 (doc
  // 1: r1's [0,5) gives W(4,1) = 5 to r2; doc 2: r2's [0,4) gives W(3,1) =
  // 4 to r0), leaves r2 at 156: over. With r2 avoided, the chain through r3
  // (docs 3 and 4, the same amounts) leaves r0 94, r1 80, r3 51, r2 155.
  const Batch batch{{10, 10, 10, 10, 10, 14}, 4};
  const std::vector<Shard> pieces = {{0, 0, 1, 0},  {0, 1, 9, 1}, {1, 0, 5, 1}, {1, 5, 5, 2},
                                     {2, 0, 4, 2},  {2, 4, 6, 0}, {3, 0, 5, 1}, {3, 5, 5, 3},
                                     {4, 0, 4, 3},  {4, 4, 6, 0}, {5, 0, 14, 2}};
  EXPECT_EQ(internal::FinishPlan(batch, internal::RepairSlivers(batch, pieces, 3, 0.0)).shards,
            (std::vector<Shard>{{2, 4, 6, 0},
                                {4, 3, 7, 0},
                                {0, 0, 10, 1},
                                {1, 0, 5, 1},
                                {3, 0, 4, 1},
                                {1, 5, 5, 2},
                                {2, 0, 4, 2},
                                {5, 0, 14, 2},
                                {3, 4, 6, 3},
                                {4, 0, 3, 3}}));
}

TEST(RepairSliversTest, AbsorbsSliverAndShiftsAnotherCut) {
  // docs [10, 10] on 2 ranks, min 3. Doc 0: [0,1) on r1 (a 1-token sliver),
  // [1,10) on r0; doc 1: [0,5) on r0, [5,10) on r1. Tokens r0 9 + 5 = 14,
  // r1 1 + 5 = 6. Absorb: doc 0 goes whole to r0 (r0 +1 token); the chain
  // returns 1 token r0 -> r1 through doc 1's cut: [0,5) shrinks to [0,4)
  // (4 >= 3), r1's [5,10) grows to [4,10). Tokens still 14 and 6; doc 0 is no
  // longer cut.
  const Batch batch{{10, 10}, 2};
  const std::vector<Shard> fixed = internal::RepairSlivers(
      batch, {{0, 0, 1, 1}, {0, 1, 9, 0}, {1, 0, 5, 0}, {1, 5, 5, 1}}, 3);
  EXPECT_EQ(internal::FinishPlan(batch, fixed).shards,
            (std::vector<Shard>{{0, 0, 10, 0}, {1, 0, 4, 0}, {1, 4, 6, 1}}));
}

// One scratch, two repairs: the second (AbsorbsSliverAndShiftsAnotherCut's)
// finds its chain in its own boundary graph, not in the first's. The first,
// docs [9, 9, 6] on 3 ranks, min 3: doc 0 [0,1) r2 (a sliver), [1,9) r0;
// doc 1 [0,4) r1, [4,9) r2; doc 2 whole on r0. Its graph has no edge from r0
// but doc 0's own, and none of r1's or r2's leads to r0: no chain, and
// neither whole-document moves (r2 holds no whole document, r0's 6 tokens
// match no growth) nor a new cut (r2 has nothing to cut) fix it: it stays.
TEST(RepairSliversTest, ScratchKeepsNothingBetweenCalls) {
  internal::RepairScratch scratch;
  const Batch first{{9, 9, 6}, 3};
  const std::vector<Shard> pieces = {
      {0, 0, 1, 2}, {0, 1, 8, 0}, {1, 0, 4, 1}, {1, 4, 5, 2}, {2, 0, 6, 0}};
  EXPECT_EQ(internal::FinishPlan(first, internal::RepairSlivers(
                                            first, pieces, 3,
                                            std::numeric_limits<double>::infinity(),
                                            internal::kAnyNonlastGrowth, scratch))
                .shards,
            internal::FinishPlan(first, pieces).shards);
  const Batch batch{{10, 10}, 2};
  const std::vector<Shard> fixed = internal::RepairSlivers(
      batch, {{0, 0, 1, 1}, {0, 1, 9, 0}, {1, 0, 5, 0}, {1, 5, 5, 1}}, 3,
      std::numeric_limits<double>::infinity(), internal::kAnyNonlastGrowth, scratch);
  EXPECT_EQ(internal::FinishPlan(batch, fixed).shards,
            (std::vector<Shard>{{0, 0, 10, 0}, {1, 0, 4, 0}, {1, 4, 6, 1}}));
}

TEST(RepairSliversTest, GrowsSliverWhenAbsorbingHasNoChain) {
  // docs [10, 10] on 2 ranks, min 3. Doc 0: [0,2) r0 (sliver), [2,10) r1;
  // doc 1: [0,3) r1, [3,10) r0 (r1's piece is exactly the minimum: it
  // cannot give). Absorb into r1 would need r1 -> r0 through doc 1: r1's
  // [0,3) cannot shrink. Grow instead: [0,2) takes 1 token from [2,10)
  // (7 >= 3 left), and r0 returns 1 token to r1 through doc 1: r0's [3,10)
  // shrinks at its start to [4,10), r1's [0,3) grows to [0,4).
  const Batch batch{{10, 10}, 2};
  const std::vector<Shard> fixed = internal::RepairSlivers(
      batch, {{0, 0, 2, 0}, {0, 2, 8, 1}, {1, 0, 3, 1}, {1, 3, 7, 0}}, 3);
  EXPECT_EQ(internal::FinishPlan(batch, fixed).shards,
            (std::vector<Shard>{{0, 0, 3, 0}, {1, 4, 6, 0}, {0, 3, 7, 1}, {1, 0, 4, 1}}));
}

TEST(RepairSliversTest, LeavesSliverWithoutChain) {
  // [6, 2] on 2 ranks, min 3: doc 0 [2,6) r0, [0,2) r1, doc 1 whole on r1.
  // No other cut document: no chain. Whole-document moves: growing by g in
  // [1, 4 - 3] = [1, 1] needs r1 to hand r0 exactly 1 token of whole
  // documents (it has one of 2), absorbing needs r0 to hand r1 exactly 2
  // (it has none). The sliver stays.
  const Batch batch{{6, 2}, 2};
  const std::vector<Shard> fixed =
      internal::RepairSlivers(batch, {{0, 2, 4, 0}, {0, 0, 2, 1}, {1, 0, 2, 1}}, 3);
  EXPECT_EQ(internal::FinishPlan(batch, fixed).shards,
            (std::vector<Shard>{{0, 2, 4, 0}, {0, 0, 2, 1}, {1, 0, 2, 1}}));
}

TEST(RepairSliversTest, GrowsSliverByMovingAWholeDocument) {
  // docs [10, 2, 4] on 2 ranks, min 3. Doc 0: [0,1) r1 (a 1-token sliver),
  // [1,10) r0; doc 1 (2 tokens) whole on r1, doc 2 (4) whole on r0. No other
  // cut document: no chain of cut-point shifts, so neither absorbing nor
  // growing by a chain works. Whole-document moves: the sliver may grow by g
  // in [m - s, 9 - m] = [2, 6] out of r0's piece if r1 hands r0 whole
  // documents worth exactly g more than it gets back: doc 1 alone, g = 2
  // (absorbing would need r0 to hand r1 exactly 1 token more: no such set).
  // Doc 0 becomes [0,3) r1, [3,10) r0; doc 1 moves to r0. Tokens stay 13
  // and 3.
  const Batch batch{{10, 2, 4}, 2};
  const std::vector<Shard> fixed = internal::RepairSlivers(
      batch, {{0, 0, 1, 1}, {0, 1, 9, 0}, {1, 0, 2, 1}, {2, 0, 4, 0}}, 3);
  EXPECT_EQ(internal::FinishPlan(batch, fixed).shards,
            (std::vector<Shard>{{0, 3, 7, 0}, {1, 0, 2, 0}, {2, 0, 4, 0}, {0, 0, 3, 1}}));
  // The same move raises the plan's maximum non-last tokens from 1 (the
  // sliver) to 3; with at most 1 token of growth allowed it is refused and
  // the sliver stays.
  const std::vector<Shard> kept = internal::RepairSlivers(
      batch, {{0, 0, 1, 1}, {0, 1, 9, 0}, {1, 0, 2, 1}, {2, 0, 4, 0}}, 3,
      std::numeric_limits<double>::infinity(), 1);
  EXPECT_EQ(internal::FinishPlan(batch, kept).shards,
            (std::vector<Shard>{{0, 1, 9, 0}, {2, 0, 4, 0}, {0, 0, 1, 1}, {1, 0, 2, 1}}));
}

TEST(RepairSliversTest, AbsorbsSliverBySwappingWholeDocuments) {
  // docs [10, 5, 7] on 2 ranks, min 3. Doc 0: [0,2) r1 (sliver, s = 2),
  // [2,10) r0; doc 1 (5) whole on r1, doc 2 (7) whole on r0. Whole-document
  // moves that keep every rank's tokens:
  //  - grow by g in [1, 5] with r1 handing r0 doc 1 (g = 5): r1's non-last
  //    tokens become 7;
  //  - absorb (r0 takes the 2 tokens) with r0 handing r1 doc 2 and r1
  //    handing r0 doc 1: 7 - 5 = 2 = s. Doc 0 is whole again, nothing is
  //    non-last: this one wins.
  const Batch batch{{10, 5, 7}, 2};
  const std::vector<Shard> fixed = internal::RepairSlivers(
      batch, {{0, 0, 2, 1}, {0, 2, 8, 0}, {1, 0, 5, 1}, {2, 0, 7, 0}}, 3);
  EXPECT_EQ(internal::FinishPlan(batch, fixed).shards,
            (std::vector<Shard>{{0, 0, 10, 0}, {1, 0, 5, 0}, {2, 0, 7, 1}}));
}

TEST(RepairSliversTest, AbsorbsIntoAShortNeighbourByAWholeDocument) {
  // docs [3, 1, 5] on 2 ranks, min 4. Doc 0: [0,1) r0 (a 1-token sliver),
  // [1,3) r1 (2 tokens: too short to grow the sliver out of, hi = 2 - 4 < 0);
  // doc 1 whole on r1, doc 2 whole on r0. No other cut document: no chain.
  // Absorbing needs r1 to hand r0 exactly 1 token more of whole documents
  // than it gets back: doc 1. Doc 0 ends whole on r1; tokens stay 6 and 3.
  const Batch batch{{3, 1, 5}, 2};
  const std::vector<Shard> fixed =
      internal::RepairSlivers(batch, {{0, 0, 1, 0}, {0, 1, 2, 1}, {1, 0, 1, 1}, {2, 0, 5, 0}}, 4);
  EXPECT_EQ(internal::FinishPlan(batch, fixed).shards,
            (std::vector<Shard>{{1, 0, 1, 0}, {2, 0, 5, 0}, {0, 0, 3, 1}}));
}

TEST(RepairSliversTest, GrowsSliverByCuttingANewHead) {
  // docs [10, 8] on 2 ranks, min 3. Doc 0: [0,1) r1 (a 1-token sliver),
  // [1,10) r0; doc 1 (8 tokens) whole on r1. Tokens 9 and 9. No other cut
  // document: no chain. Whole-document moves: growing by g in [2, 9 - 3 =
  // 6] needs r1 to hand r0 exactly g (doc 1 has 8), absorbing needs r0 to
  // hand r1 exactly 1 (it has no whole document). A new cut: the sliver
  // grows by m = 3 to [0,4) out of r0's piece (6 >= 3 left), and r1 hands
  // r0 the 3-token head of doc 1 (its shortest whole document of >= 2m = 6
  // tokens), keeping its tail [3,8). Tokens r0 6 + 3 = 9, r1 4 + 5 = 9; no
  // cut shard below 3. Non-last tokens: r1 4, r0 3 (max 1 -> 4).
  const Batch batch{{10, 8}, 2};
  const std::vector<Shard> pieces = {{0, 0, 1, 1}, {0, 1, 9, 0}, {1, 0, 8, 1}};
  EXPECT_EQ(internal::FinishPlan(batch, internal::RepairSlivers(batch, pieces, 3)).shards,
            (std::vector<Shard>{{0, 4, 6, 0}, {1, 0, 3, 0}, {0, 0, 4, 1}, {1, 3, 5, 1}}));
  // The move raises the maximum non-last tokens by 3: with at most 2 allowed
  // it is refused and the sliver stays.
  EXPECT_EQ(internal::FinishPlan(batch, internal::RepairSlivers(
                                            batch, pieces, 3,
                                            std::numeric_limits<double>::infinity(), 2))
                .shards,
            (std::vector<Shard>{{0, 1, 9, 0}, {0, 0, 1, 1}, {1, 0, 8, 1}}));
}

TEST(RepairSliversTest, ChainFixMustKeepBalance) {
  // The pieces of GrowsSliverWhenAbsorbingHasNoChain: docs [10, 10], min 3,
  // doc 0 [0,2) r0, [2,10) r1; doc 1 [0,3) r1, [3,10) r0. Workloads (W(p, s)
  // = (2p + s + 1) s / 2): r0 W(0,2) + W(3,7) = 3 + 49 = 52, r1 W(2,8) +
  // W(0,3) = 52 + 6 = 58. The only fix, growing [0,2) by 1 (r0 +W(2,1) =
  // +3) and returning the token through doc 1 (r0's [3,10) gives W(3,1) = 4
  // to r1), leaves r0 51 and r1 58 - 3 + 4 = 59: over a bound of 58 (the
  // current maximum) it is refused, and no whole document can move; at 59
  // it is taken.
  const Batch batch{{10, 10}, 2};
  const std::vector<Shard> pieces = {{0, 0, 2, 0}, {0, 2, 8, 1}, {1, 0, 3, 1}, {1, 3, 7, 0}};
  EXPECT_EQ(internal::FinishPlan(batch, internal::RepairSlivers(batch, pieces, 3, 58.0)).shards,
            (std::vector<Shard>{{0, 0, 2, 0}, {1, 3, 7, 0}, {0, 2, 8, 1}, {1, 0, 3, 1}}));
  EXPECT_EQ(internal::FinishPlan(batch, internal::RepairSlivers(batch, pieces, 3, 59.0)).shards,
            (std::vector<Shard>{{0, 0, 3, 0}, {1, 4, 6, 0}, {0, 3, 7, 1}, {1, 0, 4, 1}}));
}

// RepairSlivers takes raw pieces: split (touching pieces of one shard on its
// rank, whole documents too), with empty pieces, in any order, they are
// repaired exactly as the finished plan's shards are; and one RepairScratch
// reused by every call (each batch its own N) changes nothing. Random
// batches, Per-Doc and Llama3 plans (many slivers), minimum shards and
// workload bounds.
TEST(RepairSliversTest, RawPiecesRepairAsTheirPlan) {
  SplitMix64Rng rng(20261203);
  internal::RepairScratch scratch;
  const auto below = [&](int64_t k) { return static_cast<int64_t>(rng.Next() % k); };
  int changed = 0;
  for (int trial = 0; trial < 600; ++trial) {
    const int32_t n = static_cast<int32_t>(2 + below(15));
    const Batch batch{testing::LogUniformDocs(rng, 256 + below(8192)), n};
    if (TotalTokens(batch.doc_lens) < n) continue;
    const Plan plan = trial % 2 == 0 ? internal::PlanPerDoc(batch) : internal::PlanLlama3(batch);
    const int64_t m = 2 + below(64);
    double mean = 0;
    for (double w : internal::PieceWorkloads(n, plan.shards)) mean += w / n;
    const double max_work =
        trial % 3 == 0 ? std::numeric_limits<double>::infinity() : mean * (1.0 + 0.01 * below(20));
    const std::vector<Shard> raw = testing::RawPiecesOf(plan.shards, rng, /*shuffle=*/true);
    const std::vector<Shard> expected = internal::FinishPlan(
        batch, internal::RepairSlivers(batch, plan.shards, m, max_work)).shards;
    ASSERT_EQ(internal::FinishPlan(batch, internal::RepairSlivers(batch, raw, m, max_work)).shards,
              expected)
        << "trial " << trial;
    ASSERT_EQ(internal::FinishPlan(batch, internal::RepairSlivers(batch, raw, m, max_work,
                                                                  internal::kAnyNonlastGrowth,
                                                                  scratch))
                  .shards,
              expected)
        << "trial " << trial;
    changed += expected != plan.shards ? 1 : 0;
  }
  EXPECT_GT(changed, 100);  // repairs happened
}

TEST(SliverFreeWorkloadBoundTest, LastShardAndRankTokens) {
  // Docs [300, 58], N = 2, m = 128: 358 tokens, floor(358 / 2) = 179 per rank.
  // Doc 0's last 128 tokens: W(172, 128) = (2*172 + 128 + 1) * 128 / 2 = 30272,
  // plus 179 - 128 = 51 other tokens: 30323. Doc 1 (whole, 58 < m):
  // W(0, 58) = 1711, plus 121: 1832. The bound is the larger, 30323; the mean
  // workload is (45150 + 1711) / 2 = 23430.5, so no plan free of slivers is
  // within 1.29x of it: keeping doc 1 whole leaves its rank 121 tokens of
  // doc 0, which are not all one shard of >= 128 but must be.
  EXPECT_DOUBLE_EQ(internal::SliverFreeWorkloadBound(Batch{{300, 58}, 2}, 128), 30323.0);
  // Docs [301, 58], N = 2: floor(359 / 2) = 179 (not the ceiling, 180):
  // W(173, 128) = (346 + 129) * 64 = 30400, plus 179 - 128 = 51: 30451.
  EXPECT_DOUBLE_EQ(internal::SliverFreeWorkloadBound(Batch{{301, 58}, 2}, 128), 30451.0);
  // Docs [476], N = 2: W(348, 128) = (696 + 129) * 64 = 52800, plus 110:
  // 52910, under the mean 56763 (a sliver is needed all the same: see
  // docs/planner.md; the bound is sufficient only).
  EXPECT_DOUBLE_EQ(internal::SliverFreeWorkloadBound(Batch{{476}, 2}, 128), 52910.0);
  // A document shorter than every rank's tokens counts whole plus the rest:
  // [10, 20], N = 1, m = 128: W(0, 20) + 30 - 20 = 210 + 10 = 220.
  EXPECT_DOUBLE_EQ(internal::SliverFreeWorkloadBound(Batch{{10, 20}, 1}, 128), 220.0);
}

// ShiftPiecesToRoom moves a rank's excess along one cut point: doc 0 [0,6)
// r0, [6,10) r1 and doc 1 (4 tokens) whole on r0, rooms -2 and +2 (r0 holds
// two tokens too many). The boundary moves left by 2: [0,4) r0, [4,10) r1,
// each piece still >= min_shard 3; the rooms become 0 and 0.
TEST(ShiftPiecesToRoomTest, MovesACutPointByTheExcess) {
  const Batch batch{{10, 4}, 2};
  std::vector<Shard> pieces = {{0, 0, 6, 0}, {0, 6, 4, 1}, {1, 0, 4, 0}};
  std::vector<int64_t> room = {-2, 2};
  ASSERT_TRUE(internal::ShiftPiecesToRoom(batch, 3, pieces, room));
  EXPECT_EQ(internal::FinishPlan(batch, pieces).shards,
            (std::vector<Shard>{{0, 0, 4, 0}, {1, 0, 4, 0}, {0, 4, 6, 1}}));
  EXPECT_THAT(room, ElementsAre(0, 0));
  // With min_shard 5 the left piece cannot shrink to 4: nothing changes.
  std::vector<Shard> kept = {{0, 0, 6, 0}, {0, 6, 4, 1}, {1, 0, 4, 0}};
  std::vector<int64_t> kept_room = {-2, 2};
  EXPECT_FALSE(internal::ShiftPiecesToRoom(batch, 5, kept, kept_room));
  EXPECT_EQ(kept, (std::vector<Shard>{{0, 0, 6, 0}, {0, 6, 4, 1}, {1, 0, 4, 0}}));
  EXPECT_THAT(kept_room, ElementsAre(-2, 2));
}

// A full 2N-chunk zigzag of D documents of 640 tokens on 32 ranks, min
// 128: each document in 64 chunks of 10 tokens, chunks 31 and 32 merged on
// rank 31, so 63 pieces, every one a sliver. A document ends whole or in at
// most 640 / 128 = 5 pieces, and each attempt takes at most two of one
// document's pieces away: it needs (63 - 5 + 1) / 2 = 29 attempts. Attempts
// allowed: 32 + 16 + min(4 slivers, 2^20 / (pieces + D + 1)).
// D = 60: 3,780 pieces, 2^20 / 3,841 = 272, so 320 attempts against 60 x 29
// = 1,740 needed: RepairAllSlivers gives up without trying, and the repair,
// tried, keeps slivers. D = 10: 630 pieces, 48 + min(2,520, 1,635) = 1,683
// attempts against 290: it repairs, as RepairSlivers does.
TEST(RepairAllSliversTest, GivesUpOnlyWhereTheAttemptsCannotSuffice) {
  internal::RepairScratch scratch;
  for (const int docs : {60, 10}) {
    const Batch batch{std::vector<int64_t>(docs, 640), 32};
    std::vector<int32_t> all(docs);
    for (int d = 0; d < docs; ++d) all[d] = d;
    const std::vector<Shard> zig = internal::PerDocPieces(batch, all);
    const std::vector<Shard> repaired = internal::RepairSlivers(
        batch, zig, 128, std::numeric_limits<double>::infinity(), internal::kAnyNonlastGrowth);
    const std::optional<std::vector<Shard>> all_clear = internal::RepairAllSlivers(
        batch, zig, 128, std::numeric_limits<double>::infinity(), internal::kAnyNonlastGrowth,
        scratch);
    EXPECT_EQ(internal::PartKeepsSlivers(batch, zig, 128, scratch), docs == 60);
    if (docs == 60) {
      EXPECT_FALSE(all_clear.has_value());
      EXPECT_GT(internal::CountSlivers(internal::FinishPlan(batch, repaired), 128), 0);
    } else {
      ASSERT_TRUE(all_clear.has_value());
      EXPECT_EQ(*all_clear, repaired);
    }
  }
}

// On random batches (many short documents, 64 to 1,087 tokens, a full
// zigzag of the k longest, k random, and the rest whole): RepairAllSlivers
// is RepairSlivers' result,
// or nullopt only where that result keeps a sliver; PartKeepsSlivers of the
// zigzag alone says nullopt only where RepairAllSlivers of the whole does.
TEST(RepairAllSliversTest, GivesUpOnlyWhereTheRepairKeepsASliver) {
  SplitMix64Rng rng(29);
  internal::RepairScratch scratch;
  const int64_t m = 128;
  int gave_up = 0, repaired_all = 0;
  for (int trial = 0; trial < 120; ++trial) {
    const int32_t n = trial % 2 == 0 ? 16 : 32;
    std::vector<int64_t> docs;
    for (int64_t total = 0; total < (1 << 16);) {
      docs.push_back(std::min<int64_t>(64 + static_cast<int64_t>(rng.Next() % 1024),
                                       (1 << 16) - total));
      total += docs.back();
    }
    const Batch batch{std::move(docs), n};
    std::vector<int32_t> order(batch.doc_lens.size());
    for (size_t d = 0; d < order.size(); ++d) order[d] = static_cast<int32_t>(d);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return batch.doc_lens[a] > batch.doc_lens[b]; });
    const size_t k = 1 + rng.Next() % order.size();
    const std::vector<Shard> zig = internal::PerDocPieces(
        batch, std::vector<int32_t>(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k)));
    std::vector<Shard> pieces = zig;
    for (size_t i = k; i < order.size(); ++i) {
      pieces.push_back(Shard{order[i], 0, batch.doc_lens[order[i]], static_cast<int32_t>(i % n)});
    }
    const double inf = std::numeric_limits<double>::infinity();
    const std::vector<Shard> full =
        internal::RepairSlivers(batch, pieces, m, inf, internal::kAnyNonlastGrowth);
    const std::optional<std::vector<Shard>> all_clear =
        internal::RepairAllSlivers(batch, pieces, m, inf, internal::kAnyNonlastGrowth, scratch);
    if (internal::PartKeepsSlivers(batch, zig, m, scratch)) {
      EXPECT_FALSE(all_clear.has_value()) << "trial " << trial;
    }
    if (all_clear.has_value()) {
      EXPECT_EQ(*all_clear, full) << "trial " << trial;
      ++repaired_all;
    } else {
      EXPECT_GT(internal::CountSlivers(internal::FinishPlan(batch, full), m), 0)
          << "trial " << trial;
      ++gave_up;
    }
  }
  // Both outcomes were checked.
  EXPECT_GT(gave_up, 0);
  EXPECT_GT(repaired_all, 0);
}

}  // namespace
}  // namespace flashcp::core
