#include <algorithm>
#include <cstdint>
#include <tuple>
#include <utility>
#include <vector>

#include "core/analysis.h"
#include "core/random.h"
#include "core/strategies.h"
#include "core/internal/strategies_internal.h"
#include "core/testing/candidates.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::core {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<Shard> PlanShards(Strategy s, const Batch& batch) {
  absl::StatusOr<Plan> plan = MakePlan(s, batch);
  EXPECT_THAT(plan, IsOk());
  if (!plan.ok()) return {};
  EXPECT_THAT(ValidatePlan(*plan), IsOk());
  return plan->shards;
}

// FinishPlan against the plain definition (a comparison sort by rank,
// document and start, then touching pieces of one document on one rank
// merged) on raw pieces: Per-Doc and Llama3 plans' shards split (touching
// pieces on one rank), with empty pieces, shuffled or left in order; below
// and above the counting sort's 64 pieces.
TEST(FinishPlanTest, SortsAndMergesAsTheDefinition) {
  SplitMix64Rng rng(20261204);
  const auto below = [&](int64_t k) { return static_cast<int64_t>(rng.Next() % k); };
  int merged = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int32_t n = static_cast<int32_t>(1 + below(16));
    const Batch batch{testing::LogUniformDocs(rng, 16 + below(4096)), n};
    if (TotalTokens(batch.doc_lens) < n) continue;
    const Plan plan = trial % 2 == 0 ? internal::PlanPerDoc(batch) : internal::PlanLlama3(batch);
    const std::vector<Shard> raw = testing::RawPiecesOf(plan.shards, rng, trial % 3 != 0);
    std::vector<Shard> expected = raw;
    std::erase_if(expected, [](const Shard& s) { return s.len == 0; });
    std::sort(expected.begin(), expected.end(), [](const Shard& a, const Shard& b) {
      return std::tie(a.rank, a.doc, a.start) < std::tie(b.rank, b.doc, b.start);
    });
    size_t kept = 0;
    for (const Shard& s : expected) {
      if (kept > 0 && expected[kept - 1].rank == s.rank && expected[kept - 1].doc == s.doc &&
          expected[kept - 1].start + expected[kept - 1].len == s.start) {
        expected[kept - 1].len += s.len;
      } else {
        expected[kept++] = s;
      }
    }
    expected.resize(kept);
    merged += raw.size() > expected.size() + 8 ? 1 : 0;
    const Plan finished = internal::FinishPlan(batch, raw);
    ASSERT_EQ(finished.shards, expected) << "trial " << trial;
    EXPECT_EQ(finished.shards, plan.shards) << "trial " << trial;  // the plan's own shards
    EXPECT_EQ(finished.padding, plan.padding);
    EXPECT_EQ(finished.doc_lens, batch.doc_lens);
  }
  EXPECT_GT(merged, 100);
}

TEST(RingTest, ContiguousChunks) {
  // docs [5, 3], N = 2: targets 4 and 4; rank 0 takes packed [0, 4), rank 1 [4, 8).
  EXPECT_THAT(PlanShards(Strategy::kRing, Batch{{5, 3}, 2}),
              ElementsAre(Shard{0, 0, 4, 0}, Shard{0, 4, 1, 1}, Shard{1, 0, 3, 1}));
}

TEST(Llama3Test, ZigzagChunksOfThePackedSequence) {
  // docs [5, 3], N = 2: four chunks of 2 tokens, owners 0, 1, 1, 0:
  // packed [0,2) doc0 -> r0; [2,4) doc0 -> r1; [4,6) doc0[4,5) + doc1[0,1) -> r1;
  // [6,8) doc1[1,3) -> r0. Rank 1's doc0 pieces [2,4) and [4,5) merge.
  EXPECT_THAT(PlanShards(Strategy::kLlama3, Batch{{5, 3}, 2}),
              ElementsAre(Shard{0, 0, 2, 0}, Shard{1, 1, 2, 0}, Shard{0, 2, 3, 1},
                          Shard{1, 0, 1, 1}));
}

TEST(Llama3Test, OddTargetsWithPadding) {
  // 7 tokens on 2 ranks: targets 4 and 3 (one padding token on rank 1).
  // Chunk sizes: r0 front 2, r1 front 2, r1 back 1, r0 back 2.
  absl::StatusOr<Plan> plan = MakePlan(Strategy::kLlama3, Batch{{7}, 2});
  ASSERT_THAT(plan, IsOk());
  EXPECT_EQ(plan->padding, 1);
  EXPECT_THAT(plan->shards, ElementsAre(Shard{0, 0, 2, 0}, Shard{0, 5, 2, 0}, Shard{0, 2, 3, 1}));
}

TEST(PerDocTest, LeftoversDealtRoundRobinAcrossDocuments) {
  // doc 0 (5 tokens): 4 chunks of 1, one leftover to rank 0's front chunk:
  //   sizes [2,1,1,1], owners [0,1,1,0]: r0 [0,2), r1 [2,4), r0 [4,5).
  // doc 1 (3 tokens): chunks of 0, leftovers to r1 (front), r0 (front), r1 (back):
  //   sizes [1,1,1,0]: r0 [0,1), r1 [1,3).
  EXPECT_THAT(PlanShards(Strategy::kPerDoc, Batch{{5, 3}, 2}),
              ElementsAre(Shard{0, 0, 2, 0}, Shard{0, 4, 1, 0}, Shard{1, 0, 1, 0},
                          Shard{0, 2, 2, 1}, Shard{1, 1, 2, 1}));
  EXPECT_EQ(PlanShards(Strategy::kZigzag, Batch{{5, 3}, 2}),
            PlanShards(Strategy::kPerDoc, Batch{{5, 3}, 2}));
}

TEST(PerDocTest, PerfectBalanceOnDivisibleDocuments) {
  // One doc of 8 on 2 ranks: chunks of 2; r0 gets [0,2) and [6,8), r1 [2,6).
  // Workloads: r0 = 3 + (12+2+1)*2/2 = 18; r1 = (4+4+1)*4/2 = 18.
  absl::StatusOr<Plan> plan = MakePlan(Strategy::kPerDoc, Batch{{8}, 2});
  ASSERT_THAT(plan, IsOk());
  absl::StatusOr<PlanMetrics> m = AnalyzePlan(*plan, ModelShape{});
  ASSERT_THAT(m, IsOk());
  EXPECT_THAT(m->rank_workload, ElementsAre(18.0, 18.0));
  EXPECT_DOUBLE_EQ(m->imbalance, 1.0);
}

// magi, worked by hand. docs [16], N = 2: chunk ceil(16 / 16) = 1 token, 8
// per rank; token i's causal area is i + 1. Largest first to the least-loaded
// rank (ties to the lower rank): 16 r0, 15 r1, 14 r1, 13 r0, 12 r0, 11 r1,
// 10 r1, 9 r0, 8 r0, 7 r1, 6 r1, 5 r0, 4 r0, 3 r1, 2 r1, 1 r0: 68 pairs each.
TEST(MagiTest, OneDocumentInOneTokenChunks) {
  EXPECT_THAT(PlanShards(Strategy::kMagi, Batch{{16}, 2}),
              ElementsAre(Shard{0, 0, 1, 0}, Shard{0, 3, 2, 0}, Shard{0, 7, 2, 0},
                          Shard{0, 11, 2, 0}, Shard{0, 15, 1, 0}, Shard{0, 1, 2, 1},
                          Shard{0, 5, 2, 1}, Shard{0, 9, 2, 1}, Shard{0, 13, 2, 1}));
}

// docs [4, 12], N = 2: areas 1..4 (doc 0) and 1..12 (doc 1); equal areas go
// later chunk first. 12..5 as above fill both ranks to 34 with four chunks
// each; then 4 (doc 1) r0, 4 (doc 0) r1, 3 r0, 3 r1, 2 r0, 2 r1, 1 (doc 1)
// r0, and doc 0's first token to r1, r0 being full: 44 pairs each.
TEST(MagiTest, TiesGoToTheLaterChunkAndTheLowerRank) {
  EXPECT_THAT(PlanShards(Strategy::kMagi, Batch{{4, 12}, 2}),
              ElementsAre(Shard{1, 0, 5, 0}, Shard{1, 7, 2, 0}, Shard{1, 11, 1, 0},
                          Shard{0, 0, 4, 1}, Shard{1, 5, 2, 1}, Shard{1, 9, 2, 1}));
}

// docs [7], N = 2: C/N = 4, one padding token (area 0) in chunk 7. Areas
// 7..1 then 0: r0 gets chunks 6, 3, 2 and the padding chunk 7, r1 chunks 5,
// 4, 1, 0. Rank 1 holds the padding token, so its last chunk (5) gives up
// its token and the chunks after it shift down by one: r0 [2, 4) and [5, 7),
// r1 [0, 2) and [4, 5).
TEST(MagiTest, PaddingComesOffThePaddedRanksLastChunk) {
  EXPECT_THAT(PlanShards(Strategy::kMagi, Batch{{7}, 2}),
              ElementsAre(Shard{0, 2, 2, 0}, Shard{0, 5, 2, 0}, Shard{0, 0, 2, 1},
                          Shard{0, 4, 1, 1}));
}

TEST(MagiTest, ChunkIsCeilOfCOver8NOrTheLargestDivisorOfCOverNBelowIt) {
  EXPECT_EQ(internal::MagiChunkTokens(131072, 8), 2048);
  EXPECT_EQ(internal::MagiChunkTokens(1 << 20, 64), 2048);
  EXPECT_EQ(internal::MagiChunkTokens(96, 4), 3);    // C/N = 24, ceil(96 / 32) = 3
  EXPECT_EQ(internal::MagiChunkTokens(100, 4), 0);   // C/N = 25: divisor 1 < 4 / 2: near-equal
  EXPECT_EQ(internal::MagiChunkTokens(120, 4), 3);   // C/N = 30, ceil(120 / 32) = 4: 3
  EXPECT_EQ(internal::MagiChunkTokens(7, 2), 1);
}

// C/N = 1009, a prime: no divisor near ceil(1009 / 8) = 127, so 8 near-equal
// chunks a rank (126 or 127 tokens), not 1009 one-token chunks.
TEST(MagiTest, PrimeTokensPerRankGetsNearEqualChunks) {
  absl::StatusOr<Plan> plan = MakePlan(Strategy::kMagi, Batch{{2018}, 2});
  ASSERT_THAT(plan, IsOk());
  EXPECT_THAT(ValidatePlan(*plan), IsOk());
  EXPECT_LE(plan->shards.size(), 16u);
  for (const Shard& s : plan->shards) EXPECT_GE(s.len, 126) << s.start;
}

// Small prime and near-prime C/N with padding: every rank still gets exactly
// its target (ValidatePlan) however the near-equal chunks fall.
TEST(MagiTest, NearEqualChunksAlwaysMeetTheTargets) {
  for (int64_t total = 17; total < 400; ++total) {
    for (int32_t n : {1, 2, 3, 5, 8}) {
      absl::StatusOr<Plan> plan = MakePlan(Strategy::kMagi, Batch{{total / 3, total - total / 3}, n});
      ASSERT_THAT(plan, IsOk()) << total << " " << n;
      EXPECT_THAT(ValidatePlan(*plan), IsOk()) << total << " " << n;
    }
  }
}

TEST(StrategyNameTest, RoundTripsAndRejectsUnknown) {
  for (Strategy s : AllStrategies()) {
    absl::StatusOr<Strategy> parsed = ParseStrategy(StrategyName(s));
    ASSERT_THAT(parsed, IsOk());
    EXPECT_EQ(*parsed, s);
  }
  EXPECT_THAT(ParseStrategy("best"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("strategy: unknown")));
}

TEST(MakePlanTest, RejectsBadInput) {
  EXPECT_THAT(MakePlan(Strategy::kRing, Batch{{}, 2}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("doc_lens")));
  PlanOptions options;
  options.target_imbalance = 0.9;
  EXPECT_THAT(MakePlan(Strategy::kRing, Batch{{4}, 2}, options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("target_imbalance")));
}

}  // namespace
}  // namespace flashcp::core
