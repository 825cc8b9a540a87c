// flashcp's role-swap and balancing stage (flashcp_roles.h), hand-worked.
#include <vector>

#include "core/analysis.h"
#include "core/internal/flashcp_roles.h"
#include "core/internal/flashcp_util.h"
#include "core/internal/strategies_internal.h"
#include "core/types.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::core {
namespace {

using ::testing::ElementsAre;

// Two 12-token documents cut alike over N = 3 ranks (4 tokens each, rank r
// holding [4r, 4r + 4) of both): rank 0 sends 16 (each head to 2 ranks),
// rank 2 receives 16. Dealing out doc 0's roles again (longest first, ties
// by index; the role receiving most over sending to the rank receiving
// least over sending so far) reverses doc 0: every rank then sends and
// receives 8, and each holds 52 pairs (was 20 / 52 / 84). No swap after
// that lowers 8.
TEST(SwapRolesForTargetedTest, TwoAlikeCutsSpreadOverTheirRanks) {
  const Batch batch{{12, 12}, 3};
  const Plan plan = internal::FinishPlan(
      batch, {Shard{0, 0, 4, 0}, Shard{0, 4, 4, 1}, Shard{0, 8, 4, 2}, Shard{1, 0, 4, 0},
              Shard{1, 4, 4, 1}, Shard{1, 8, 4, 2}});
  ASSERT_EQ(TargetedPhaseBottleneck(plan), 16);
  const Plan swapped = internal::SwapRolesForTargeted(batch, plan, 0.0, 12);
  EXPECT_EQ(swapped.shards,
            (std::vector<Shard>{Shard{0, 8, 4, 0}, Shard{1, 0, 4, 0}, Shard{0, 4, 4, 1},
                                Shard{1, 4, 4, 1}, Shard{0, 0, 4, 2}, Shard{1, 8, 4, 2}}));
  EXPECT_EQ(TargetedPhaseBottleneck(swapped), 8);
  EXPECT_THAT(internal::PieceWorkloads(batch.cp_size, swapped.shards),
              ElementsAre(52.0, 52.0, 52.0));
  // The spread is not a swap: with max_swaps = 0 it alone reaches 8.
  EXPECT_EQ(TargetedPhaseBottleneck(internal::SwapRolesForTargeted(batch, plan, 0.0, 0)), 8);
}

// Roles of unequal tokens never swap (each rank keeps its tokens), and a
// swap that gains nothing is not made: doc 0 (8 tokens) cut 4 / 4 over
// ranks 0 and 1, doc 1 (12) cut 4 / 8 over ranks 1 and 0, doc 2 (4) whole
// on rank 1. Each rank sends 4 and receives 4; swapping doc 0's equal roles
// would make rank 0 receive 8: the plan comes back.
TEST(SwapRolesForTargetedTest, UnequalRolesStay) {
  const Batch batch{{8, 12, 4}, 2};
  const Plan plan = internal::FinishPlan(
      batch, {Shard{0, 0, 4, 0}, Shard{0, 4, 4, 1}, Shard{1, 0, 4, 1}, Shard{1, 4, 8, 0},
              Shard{2, 0, 4, 1}});
  const Plan swapped = internal::SwapRolesForTargeted(batch, plan, 1e9, 8);
  EXPECT_EQ(swapped.shards, plan.shards);
}

// Rank 0 holds docs 0 and 1 (4 tokens each, 20 pairs), rank 1 docs 2..5
// (3, 1, 2, 2 tokens, 13 pairs). Doc 0 for docs 2 and 3 (3 + 1 tokens)
// moves 3 x 1 = 3 pairs: 17 / 16, within 17, no document cut (docs 4 and 5
// for doc 0 would move 4, also 17 at the peak, found later: not taken).
TEST(BalanceByWholeExchangesTest, OneForTwoWholeDocuments) {
  const Batch batch{{4, 4, 3, 1, 2, 2}, 2};
  const Plan plan = internal::FinishPlan(
      batch, {Shard{0, 0, 4, 0}, Shard{1, 0, 4, 0}, Shard{2, 0, 3, 1}, Shard{3, 0, 1, 1},
              Shard{4, 0, 2, 1}, Shard{5, 0, 2, 1}});
  const Plan out = internal::BalanceByWholeExchanges(batch, plan, 17.0, 4, 8, 1);
  EXPECT_EQ(out.shards,
            (std::vector<Shard>{Shard{1, 0, 4, 0}, Shard{2, 0, 3, 0}, Shard{3, 0, 1, 0},
                                Shard{0, 0, 4, 1}, Shard{4, 0, 2, 1}, Shard{5, 0, 2, 1}}));
  EXPECT_THAT(internal::PieceWorkloads(batch.cp_size, out.shards), ElementsAre(17.0, 16.0));
  // Already within the bound: nothing moves.
  EXPECT_EQ(internal::BalanceByWholeExchanges(batch, plan, 20.0, 4, 8, 1).shards, plan.shards);
}

// Equal exchanges: the first offered wins. Rank 0 holds docs 0 and 1 (6
// tokens each, 42 pairs), rank 1 docs 2..5 (2, 4, 4, 2 tokens, 26 pairs).
// Doc 0 for doc 2 and doc 3 (2 x 4 pairs), for doc 3 and doc 2 (4 x 2,
// the same exchange), for doc 4 and doc 2, for doc 5 and doc 3, and doc 1
// for any of those, all move 8 pairs and cut nothing: 34 / 34. The first
// in plan order (x, then y) is taken. Within 34, or not, it is the only
// move: after it no exchange lowers the heavier rank.
TEST(BalanceByWholeExchangesTest, EqualExchangesTakeTheFirst) {
  const Batch batch{{6, 6, 2, 4, 4, 2}, 2};
  const Plan plan = internal::FinishPlan(
      batch, {Shard{0, 0, 6, 0}, Shard{1, 0, 6, 0}, Shard{2, 0, 2, 1}, Shard{3, 0, 4, 1},
              Shard{4, 0, 4, 1}, Shard{5, 0, 2, 1}});
  const std::vector<Shard> expected{Shard{1, 0, 6, 0}, Shard{2, 0, 2, 0}, Shard{3, 0, 4, 0},
                                    Shard{0, 0, 6, 1}, Shard{4, 0, 4, 1}, Shard{5, 0, 2, 1}};
  for (const double bound : {34.0, 0.0}) {
    const Plan out = internal::BalanceByWholeExchanges(batch, plan, bound, 4, 8, 1);
    EXPECT_EQ(out.shards, expected) << bound;
    EXPECT_THAT(internal::PieceWorkloads(batch.cp_size, out.shards), ElementsAre(34.0, 34.0));
  }
}

// Rank 0: docs 0 and 1 (5 and 3 tokens, 21 pairs); rank 1: docs 2, 3, 4
// (4, 1, 3 tokens, 17 pairs); bound 19. No whole z matches; doc 1 for doc
// 3 and the 2-token head of a longer whole document moves 1 x 2 = 2 pairs:
// 19 / 19. With min_shard 1 that is doc 4 (3 tokens, the shortest with >= 3);
// with min_shard 2, doc 2 (4 tokens, so its tail keeps 2).
TEST(BalanceByWholeExchangesTest, OneForOneAndAHead) {
  const Batch batch{{5, 3, 4, 1, 3}, 2};
  const Plan plan = internal::FinishPlan(
      batch, {Shard{0, 0, 5, 0}, Shard{1, 0, 3, 0}, Shard{2, 0, 4, 1}, Shard{3, 0, 1, 1},
              Shard{4, 0, 3, 1}});
  const Plan out = internal::BalanceByWholeExchanges(batch, plan, 19.0, 4, 8, 1);
  EXPECT_EQ(out.shards,
            (std::vector<Shard>{Shard{0, 0, 5, 0}, Shard{3, 0, 1, 0}, Shard{4, 0, 2, 0},
                                Shard{1, 0, 3, 1}, Shard{2, 0, 4, 1}, Shard{4, 2, 1, 1}}));
  EXPECT_THAT(internal::PieceWorkloads(batch.cp_size, out.shards), ElementsAre(19.0, 19.0));
  const Plan out2 = internal::BalanceByWholeExchanges(batch, plan, 19.0, 4, 8, 2);
  EXPECT_EQ(out2.shards,
            (std::vector<Shard>{Shard{0, 0, 5, 0}, Shard{2, 0, 2, 0}, Shard{3, 0, 1, 0},
                                Shard{1, 0, 3, 1}, Shard{2, 2, 2, 1}, Shard{4, 0, 3, 1}}));
}

// Rank 0: doc 0's [4, 6) (2 x 4 + 3 = 11 pairs) and doc 1 whole (6 tokens,
// 21 pairs): 32; rank 1: doc 0's [0, 4) and docs 2 and 3 (2 tokens each):
// 16; bound 24. No exchange of whole documents works (rank 0's only whole
// one, 6 tokens, is matched by no y and z of rank 1's). With move_cut, rank
// 0's cut piece (2 tokens at position 4) goes for doc 2 (2 tokens): its
// prefix's 2 x 4 = 8 pairs move, 24 / 24, and doc 0 is whole again on
// rank 1.
TEST(BalanceByWholeExchangesTest, ACutPieceForAWholeDocumentOfItsLength) {
  const Batch batch{{6, 6, 2, 2}, 2};
  const Plan plan = internal::FinishPlan(
      batch, {Shard{0, 0, 4, 1}, Shard{0, 4, 2, 0}, Shard{1, 0, 6, 0}, Shard{2, 0, 2, 1},
              Shard{3, 0, 2, 1}});
  EXPECT_EQ(internal::BalanceByWholeExchanges(batch, plan, 24.0, 4, 8, 1).shards, plan.shards);
  const Plan out = internal::BalanceByWholeExchanges(batch, plan, 24.0, 4, 8, 1, true);
  EXPECT_EQ(out.shards, (std::vector<Shard>{Shard{1, 0, 6, 0}, Shard{2, 0, 2, 0},
                                            Shard{0, 0, 6, 1}, Shard{3, 0, 2, 1}}));
  EXPECT_THAT(internal::PieceWorkloads(batch.cp_size, out.shards), ElementsAre(24.0, 24.0));
}

}  // namespace
}  // namespace flashcp::core
