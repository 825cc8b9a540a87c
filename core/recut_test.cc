#include "core/internal/recut.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <vector>

#include "core/internal/flashcp_util.h"
#include "core/internal/strategies_internal.h"
#include "core/types.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::core::internal {
namespace {

using ::testing::ElementsAre;
using ::testing::Optional;

constexpr double kNoBound = std::numeric_limits<double>::infinity();

std::vector<Shard> ByDocStart(std::vector<Shard> shards) {
  std::sort(shards.begin(), shards.end(), [](const Shard& a, const Shard& b) {
    return a.doc != b.doc ? a.doc < b.doc : a.start < b.start;
  });
  return shards;
}

// RecutPieces declines (nullopt) and leaves `before` as it was.
void ExpectDeclined(const Batch& batch, const std::vector<Shard>& before,
                    double accept_below = kNoBound) {
  std::vector<Shard> pieces = before;
  EXPECT_EQ(RecutPieces(batch, pieces, 128, 3, accept_below), std::nullopt);
  EXPECT_EQ(pieces, before);
}

TEST(RecutPiecesTest, MovesAZigzagsCutPointsToBalance) {
  // One 1000-token document on 2 ranks, 500 tokens each: rank 0 holds
  // [0, 200) and [700, 1000), rank 1 [200, 700). W(0, 200) = 200 * 201 / 2 =
  // 20100 and W(700, 300) = (1400 + 301) * 300 / 2 = 255150 make rank 0
  // 275250; rank 1 W(200, 500) = (400 + 501) * 500 / 2 = 225250. The same
  // pieces balance at [0, 250) + [750, 1000) against [250, 750): 31375 +
  // 218875 = 250250 each (the mean, 1000 * 1001 / 4).
  const Batch batch{{1000}, 2};
  std::vector<Shard> pieces = {{0, 0, 200, 0}, {0, 200, 500, 1}, {0, 700, 300, 0}};
  EXPECT_THAT(RecutPieces(batch, pieces, 128, 3, kNoBound), Optional(250250.0));
  EXPECT_THAT(ByDocStart(pieces),
              ElementsAre(Shard{0, 0, 250, 0}, Shard{0, 250, 500, 1}, Shard{0, 750, 250, 0}));
}

TEST(RecutPiecesTest, SetsTheRanksTokens) {
  // Docs [42, 1063] on 3 ranks (1105 tokens: 369, 368, 368). Doc 0 whole on
  // rank 0 (42 tokens), doc 1 in the zigzag rank 0, 1, 2, 2, 1, 0 with equal
  // chunks of 177 (178 for the first): rank 0 holds 42 + 355 = 397, 28 over.
  // The program keeps the pieces' ranks and order, gives every rank its
  // tokens exactly and every piece >= 128, and balances within 0.1% of the
  // mean (W(1063) + W(42) = 565516 + 903, over 3: 188806.3).
  const Batch batch{{42, 1063}, 3};
  std::vector<Shard> pieces = {{0, 0, 42, 0},     {1, 0, 178, 0},   {1, 178, 177, 1},
                               {1, 355, 177, 2},  {1, 532, 177, 2}, {1, 709, 177, 1},
                               {1, 886, 177, 0}};
  const std::optional<double> max_w = RecutPieces(batch, pieces, 128, 3, kNoBound);
  ASSERT_TRUE(max_w.has_value());
  EXPECT_LE(*max_w, 1.001 * (565516.0 + 903.0) / 3);
  std::vector<int64_t> tokens(3, 0);
  for (const Shard& s : pieces) {
    tokens[s.rank] += s.len;
    if (s.doc == 1) {
      EXPECT_GE(s.len, 128);
    }
  }
  EXPECT_THAT(tokens, ElementsAre(369, 368, 368));
  // Same ranks in the same order along doc 1 (rank 2's two chunks merged).
  std::vector<int32_t> ranks;
  for (const Shard& s : ByDocStart(pieces)) {
    if (s.doc == 1) ranks.push_back(s.rank);
  }
  EXPECT_THAT(ranks, ElementsAre(0, 1, 2, 1, 0));
  const std::vector<double> w = PieceWorkloads(3, pieces);
  EXPECT_DOUBLE_EQ(*std::max_element(w.begin(), w.end()), *max_w);
}

TEST(RecutPiecesTest, LeavesPiecesWhenARankCannotReachItsTokens) {
  // Rank 1 holds doc 0 whole (600 tokens) but must hold 550, and its piece
  // of doc 1 needs at least 129 more: no cut point can give it fewer.
  ExpectDeclined(Batch{{600, 500}, 2}, {{0, 0, 600, 1}, {1, 0, 250, 0}, {1, 250, 250, 1}});
}

TEST(RecutPiecesTest, LeavesPiecesWhenTheProgramIsInfeasible) {
  // Every rank could hold its 650 tokens (rank 0: doc 0's first and third
  // pieces and doc 1's tail, 3 x 129 at least; rank 1: doc 0's middle and
  // doc 1's head), but doc 0's three pieces need 3 x 129 = 387 > 300 tokens:
  // only the program finds that out.
  ExpectDeclined(Batch{{300, 1000}, 2}, {{0, 0, 100, 0},
                                         {0, 100, 100, 1},
                                         {0, 200, 100, 0},
                                         {1, 0, 500, 1},
                                         {1, 500, 500, 0}});
}

TEST(RecutPiecesTest, LeavesPiecesWithoutCutPoints) {
  // Doc 1's two pieces touch on rank 0: merged, it is whole, and no
  // document is cut.
  ExpectDeclined(Batch{{600, 500}, 2}, {{0, 0, 600, 1}, {1, 0, 250, 0}, {1, 250, 250, 0}});
}

TEST(RecutPiecesTest, LeavesPiecesWhenAPieceWouldFallUnderTheMinimum) {
  // One 300-token document on 2 ranks in three pieces: 150 tokens each
  // means a rank-0 head and tail of 150 in all, so one of them is < 128.
  ExpectDeclined(Batch{{300}, 2}, {{0, 0, 75, 0}, {0, 75, 150, 1}, {0, 225, 75, 0}});
}

TEST(RecutPiecesTest, LeavesPiecesWhenNotBelowTheBound) {
  // The balanced plan of the first test, asked to beat its own maximum.
  ExpectDeclined(Batch{{1000}, 2}, {{0, 0, 200, 0}, {0, 200, 500, 1}, {0, 700, 300, 0}},
                 250250.0);
}

}  // namespace
}  // namespace flashcp::core::internal
