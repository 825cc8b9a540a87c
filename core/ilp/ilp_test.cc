// Tests of the `ilp` strategy. Workload arithmetic: token i (0-based) of a
// document attends to i + 1 keys, so a shard [a, a+s) costs (2a + s + 1) s / 2
// pairs (SPEC Eq. 3); the objective is max_r W_r + w * max_r nonlast_r.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/analysis.h"
#include "core/ilp/ilp.h"
#include "core/strategies.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::core {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;
using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The objective recomputed independently of the ILP, from AnalyzePlan.
double Objective(const Plan& plan, double comm_weight) {
  absl::StatusOr<PlanMetrics> m = AnalyzePlan(plan, ModelShape{});
  EXPECT_THAT(m, IsOk());
  if (!m.ok()) return std::numeric_limits<double>::infinity();
  return *std::max_element(m->rank_workload.begin(), m->rank_workload.end()) +
         comm_weight * static_cast<double>(m->max_nonlast_tokens);
}

PlanOptions IlpOpts(int64_t granularity = 0, double comm_weight = 0, double seconds = 10) {
  PlanOptions o;
  o.ilp.solver = ilp::Solve;
  o.ilp.granularity = granularity;
  o.ilp.comm_weight = comm_weight;
  o.ilp.time_limit_seconds = seconds;
  return o;
}

struct Solved {
  Plan plan;
  PlanInfo info;
};

Solved SolveIlp(const Batch& batch, const PlanOptions& options = IlpOpts()) {
  Solved s;
  absl::StatusOr<Plan> plan = MakePlan(Strategy::kIlp, batch, options, &s.info);
  EXPECT_THAT(plan, IsOk());
  if (!plan.ok()) return s;
  EXPECT_THAT(ValidatePlan(*plan), IsOk());
  s.plan = *std::move(plan);
  return s;
}

TEST(IlpTest, WholeDocumentsWhenTheyBalance) {
  // docs [4, 4], N = 2: each doc whole on its own rank. W = 4*5/2 = 10 on both
  // ranks, no non-last tokens: objective 10, imbalance 1, comm saving 100%.
  // Block 0 sits on rank 0 (symmetry breaking), so doc 0 is rank 0's.
  const Solved s = SolveIlp(Batch{{4, 4}, 2});
  EXPECT_THAT(s.plan.shards, ElementsAre(Shard{0, 0, 4, 0}, Shard{1, 0, 4, 1}));
  EXPECT_TRUE(s.info.ilp_optimal);
  EXPECT_EQ(s.info.ilp_gap, 0.0);
  EXPECT_DOUBLE_EQ(s.info.ilp_objective, 10.0);
  EXPECT_EQ(s.info.ilp_granularity, 1);  // ceil(8 / 32)
}

TEST(IlpTest, TokenEqualityForcesACut) {
  // docs [3, 1], N = 2: 2 tokens per rank, so doc 0 must be cut. Token values
  // doc 0: 1, 2, 3; doc 1: 1. Total 7, mean 3.5, default w = 0.02 * 3.5 / 2
  // = 0.035. Splits {1,3}|{2,1'}: max W 4, non-last 1 and 1 -> 4 + w;
  // {3,1'}|{1,2}: max 4, non-last 2 -> 4 + 2w; the rest have max W >= 5.
  // Optimum: rank 0 = doc 0 [0,1) + [2,3), rank 1 = doc 0 [1,2) + doc 1.
  const Batch batch{{3, 1}, 2};
  EXPECT_DOUBLE_EQ(ilp::DefaultCommWeight(batch), 0.035);
  const Solved s = SolveIlp(batch);
  EXPECT_THAT(s.plan.shards, ElementsAre(Shard{0, 0, 1, 0}, Shard{0, 2, 1, 0}, Shard{0, 1, 1, 1},
                                         Shard{1, 0, 1, 1}));
  EXPECT_TRUE(s.info.ilp_optimal);
  EXPECT_NEAR(s.info.ilp_objective, 4.035, 1e-12);
  EXPECT_NEAR(Objective(s.plan, 0.035), 4.035, 1e-12);
}

TEST(IlpTest, BalanceForcesACut) {
  // docs [4, 2, 2], N = 2, 4 tokens per rank. Whole docs ({doc0} | {doc1,
  // doc2}) meet the token targets but W = 10 | 6: imbalance 10/8 = 1.25.
  // Balance 8 | 8 from token values doc0 {1,2,3,4}, doc1/doc2 {1,2}: the
  // cheapest in comm puts doc 0's [0,1) and [3,4) (1 + 4) with a whole short
  // doc (3) on one rank, doc 0's [1,3) (2 + 3) with the other on the other:
  // non-last 1 | 2, so the objective is 8 + 2w with w = 0.02 * 8 / 4 = 0.04.
  // Either short doc may join rank 0.
  const Batch batch{{4, 2, 2}, 2};
  const Solved s = SolveIlp(batch);
  EXPECT_THAT(s.plan.shards,
              AnyOf(ElementsAre(Shard{0, 0, 1, 0}, Shard{0, 3, 1, 0}, Shard{1, 0, 2, 0},
                                Shard{0, 1, 2, 1}, Shard{2, 0, 2, 1}),
                    ElementsAre(Shard{0, 0, 1, 0}, Shard{0, 3, 1, 0}, Shard{2, 0, 2, 0},
                                Shard{0, 1, 2, 1}, Shard{1, 0, 2, 1})));
  EXPECT_TRUE(s.info.ilp_optimal);
  EXPECT_NEAR(s.info.ilp_objective, 8.08, 1e-12);
  absl::StatusOr<PlanMetrics> m = AnalyzePlan(s.plan, ModelShape{});
  ASSERT_THAT(m, IsOk());
  EXPECT_DOUBLE_EQ(m->imbalance, 1.0);
  EXPECT_EQ(m->max_nonlast_tokens, 2);
}

TEST(IlpTest, HeavyCommWeightKeepsDocumentsWhole) {
  // The same batch with w = 10: whole docs cost 10 + 0; any cut costs at least
  // 8 + 10 * 1 (a cut document has a non-last token). So doc 0 alone on rank 0.
  const Solved s = SolveIlp(Batch{{4, 2, 2}, 2}, IlpOpts(0, 10.0));
  EXPECT_THAT(s.plan.shards, ElementsAre(Shard{0, 0, 4, 0}, Shard{1, 0, 2, 1}, Shard{2, 0, 2, 1}));
  EXPECT_TRUE(s.info.ilp_optimal);
  EXPECT_DOUBLE_EQ(s.info.ilp_objective, 10.0);
}

TEST(IlpTest, PaddingRankHoldsOneTokenLess) {
  // docs [5], N = 2: targets 3 | 2, one padding token on rank 1. Values 1..5,
  // total 15, mean 7.5; w = 0.02 * 7.5 / 3 = 0.05. Rank 1's pair sums to 7 or 8
  // for max W 8: {3,5} or {2,5} leave 3 non-last tokens on one rank; {3,4}
  // (doc [2,4)) leaves rank 0 = [0,2) + [4,5) with 2 and rank 1 with 2:
  // objective 8 + 2 * 0.05 = 8.1.
  const Solved s = SolveIlp(Batch{{5}, 2});
  EXPECT_EQ(s.plan.padding, 1);
  EXPECT_THAT(s.plan.shards, ElementsAre(Shard{0, 0, 2, 0}, Shard{0, 4, 1, 0}, Shard{0, 2, 2, 1}));
  EXPECT_NEAR(s.info.ilp_objective, 8.1, 1e-12);
}

TEST(IlpTest, OneRankKeepsEverythingWhole) {
  // N = 1: W = 3*4/2 + 2*3/2 = 9, nothing travels.
  const Solved s = SolveIlp(Batch{{3, 2}, 1});
  EXPECT_THAT(s.plan.shards, ElementsAre(Shard{0, 0, 3, 0}, Shard{1, 0, 2, 0}));
  EXPECT_TRUE(s.info.ilp_optimal);
  EXPECT_DOUBLE_EQ(s.info.ilp_objective, 9.0);
}

// Every shard boundary of the ILP's plan lies on the granularity grid or on a
// shard boundary of a heuristic's plan (Ring and Llama3 always, and the best
// heuristic that fits the bound).
void ExpectCutsOnModelGrid(const Batch& batch, int64_t g, const Plan& plan) {
  std::set<std::pair<int32_t, int64_t>> allowed;
  for (Strategy s : AllStrategies()) {
    if (s == Strategy::kIlp || s == Strategy::kBasp) continue;  // basp: equal documents only
    absl::StatusOr<Plan> p = MakePlan(s, batch);
    ASSERT_THAT(p, IsOk());
    for (const Shard& sh : p->shards) allowed.insert({sh.doc, sh.start});
  }
  for (const Shard& sh : plan.shards) {
    for (int64_t cut : {sh.start, sh.start + sh.len}) {
      if (cut % g == 0 || cut == batch.doc_lens[sh.doc]) continue;
      EXPECT_TRUE(allowed.contains({sh.doc, cut}))
          << "doc " << sh.doc << " cut at " << cut;
    }
  }
}

TEST(IlpTest, CoarseGridStaysFeasibleWithExactTokens) {
  // docs [6, 6, 6], N = 4 at g = 6: targets 5, 5, 4, 4 are not sums of whole
  // documents; the Ring and Llama3 cut points keep the model feasible. The
  // best heuristic's cuts are blocks too, so the ILP is never worse than it.
  const Batch batch{{6, 6, 6}, 4};
  const Solved s = SolveIlp(batch, IlpOpts(6, 0, 1));
  EXPECT_EQ(s.info.ilp_granularity, 6);
  absl::StatusOr<PlanMetrics> m = AnalyzePlan(s.plan, ModelShape{});
  ASSERT_THAT(m, IsOk());
  EXPECT_THAT(m->rank_tokens, ElementsAre(5, 5, 4, 4));
  ExpectCutsOnModelGrid(batch, 6, s.plan);
  for (Strategy h : AllStrategies()) {
    if (h == Strategy::kIlp || h == Strategy::kBasp) continue;  // basp: equal documents only
    absl::StatusOr<Plan> p = MakePlan(h, batch);
    ASSERT_THAT(p, IsOk());
    const double w = ilp::DefaultCommWeight(batch);
    EXPECT_LE(s.info.ilp_objective, Objective(*p, w) * (1 + 1e-9)) << StrategyName(h);
  }
}

TEST(IlpTest, PlansRespectTheGranularity) {
  const Batch batch{{37, 11, 50, 2}, 3};
  const Solved s = SolveIlp(batch, IlpOpts(8, 0, 1));
  EXPECT_EQ(s.info.ilp_granularity, 8);
  ExpectCutsOnModelGrid(batch, 8, s.plan);
  EXPECT_GE(s.info.ilp_gap, 0.0);
  EXPECT_LE(s.info.ilp_gap, 1.0);
}

TEST(IlpTest, DefaultGranularityIsAboutSixteenBlocksPerRank) {
  EXPECT_EQ(ilp::DefaultGranularity(Batch{{100, 28}, 2}), 4);   // ceil(128 / 32)
  EXPECT_EQ(ilp::DefaultGranularity(Batch{{100, 29}, 2}), 5);   // ceil(129 / 32)
  EXPECT_EQ(ilp::DefaultGranularity(Batch{{3}, 2}), 1);
}

// The key property: at granularity 1 every plan is representable, so the
// proven-optimal ILP is never worse than any heuristic under the same
// objective. Loops over every other strategy.
TEST(IlpTest, NeverWorseThanAnyHeuristicAtGranularityOne) {
  // 30 batches of 1-4 documents of 1-5 tokens on 1-4 ranks (at most 80
  // binaries): CBC proves each optimal in well under a second.
  constexpr int kTrials = 30;
  std::mt19937 rng(20260608);
  int compared = 0;
  for (int trial = 0; trial < kTrials; ++trial) {
    const int docs = std::uniform_int_distribution<int>(1, 4)(rng);
    Batch batch;
    for (int d = 0; d < docs; ++d) {
      batch.doc_lens.push_back(std::uniform_int_distribution<int64_t>(1, 5)(rng));
    }
    const int64_t total = TotalTokens(batch.doc_lens);
    batch.cp_size = std::uniform_int_distribution<int32_t>(
        1, static_cast<int32_t>(std::min<int64_t>(4, total)))(rng);
    for (double weight : {0.0, 0.5, 5.0}) {
      const double w = weight > 0 ? weight : ilp::DefaultCommWeight(batch);
      const Solved ilp = SolveIlp(batch, IlpOpts(1, weight));
      const std::string ctx = absl::StrCat("trial ", trial, " docs ", batch.doc_lens.size(),
                                           " N ", batch.cp_size, " w ", w);
      ASSERT_TRUE(ilp.info.ilp_optimal) << ctx;
      EXPECT_NEAR(ilp.info.ilp_objective, Objective(ilp.plan, w),
                  1e-9 * ilp.info.ilp_objective) << ctx;
      for (Strategy h : AllStrategies()) {
        if (h == Strategy::kIlp || h == Strategy::kBasp) continue;  // basp: equal documents only
        absl::StatusOr<Plan> p = MakePlan(h, batch);
        ASSERT_THAT(p, IsOk()) << StrategyName(h);
        EXPECT_LE(ilp.info.ilp_objective, Objective(*p, w) * (1 + 1e-9))
            << ctx << " vs " << StrategyName(h);
        ++compared;
      }
    }
  }
  EXPECT_GE(compared, kTrials * 3 * 4);  // llama3, per_doc, ring, zigzag at least
}

TEST(IlpTest, TimeLimitReturnsBestFoundWithGap) {
  // 40 documents on 4 ranks at the default granularity: about 100 blocks,
  // 400 binaries; a zero time limit stops CBC at once, a short one soon. Both
  // return a valid plan no worse than any heuristic's (the incumbent).
  std::mt19937 rng(7);
  Batch batch{{}, 4};
  for (int d = 0; d < 40; ++d) {
    batch.doc_lens.push_back(std::uniform_int_distribution<int64_t>(1, 200)(rng));
  }
  const double w = ilp::DefaultCommWeight(batch);
  double start_obj = std::numeric_limits<double>::infinity();  // best heuristic
  for (Strategy h : AllStrategies()) {
    if (h == Strategy::kIlp || h == Strategy::kBasp) continue;  // basp: equal documents only
    absl::StatusOr<Plan> p = MakePlan(h, batch);
    ASSERT_THAT(p, IsOk());
    start_obj = std::min(start_obj, Objective(*p, w));
  }
  for (double seconds : {0.0, 0.3}) {
    const Solved s = SolveIlp(batch, IlpOpts(0, 0, seconds));
    EXPECT_EQ(s.info.ilp_granularity, ilp::DefaultGranularity(batch));
    EXPECT_GE(s.info.ilp_gap, 0.0) << seconds;
    EXPECT_LE(s.info.ilp_gap, 1.0) << seconds;
    if (s.info.ilp_optimal) {
      EXPECT_EQ(s.info.ilp_gap, 0.0) << seconds;
    }
    EXPECT_NEAR(s.info.ilp_objective, Objective(s.plan, w), 1e-9 * s.info.ilp_objective);
    EXPECT_LE(s.info.ilp_objective, start_obj * (1 + 1e-12)) << seconds;
  }
}

// core links no CBC: MakePlan reaches the ILP only through the injected
// solver, and says so without one.
TEST(IlpTest, WithoutTheSolverMakePlanSaysHowToLinkIt) {
  PlanOptions o = IlpOpts();
  o.ilp.solver = nullptr;
  EXPECT_THAT(MakePlan(Strategy::kIlp, Batch{{4, 4}, 2}, o),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "strategy: ilp needs the ILP solver: build with FLASHCP_BUILD_ILP, link "
                       "flashcp_ilp (core/ilp/ilp.h) and set PlanOptions.ilp.solver = "
                       "core::ilp::Solve"));
}

TEST(IlpTest, RejectsBadOptions) {
  const Batch batch{{4, 4}, 2};
  const auto invalid = [](const char* field) {
    return StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(field));
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_THAT(MakePlan(Strategy::kIlp, batch, IlpOpts(-1)), invalid("ilp.granularity"));
  EXPECT_THAT(MakePlan(Strategy::kIlp, batch, IlpOpts(0, 0, -1)),
              invalid("ilp.time_limit_seconds"));
  EXPECT_THAT(MakePlan(Strategy::kIlp, batch, IlpOpts(0, 0, nan)),
              invalid("ilp.time_limit_seconds"));
  EXPECT_THAT(MakePlan(Strategy::kIlp, batch, IlpOpts(0, 0, inf)),
              invalid("ilp.time_limit_seconds"));
  EXPECT_THAT(MakePlan(Strategy::kIlp, batch, IlpOpts(0, -0.5)), invalid("ilp.comm_weight"));
  EXPECT_THAT(MakePlan(Strategy::kIlp, batch, IlpOpts(0, nan)), invalid("ilp.comm_weight"));
  EXPECT_THAT(MakePlan(Strategy::kIlp, batch, IlpOpts(0, inf)), invalid("ilp.comm_weight"));
  // 100,000 one-token blocks x 8 ranks: far above the 4096-binary limit.
  EXPECT_THAT(MakePlan(Strategy::kIlp, Batch{{100'000}, 8}, IlpOpts(1)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("ilp.granularity"), HasSubstr("800000 binary"),
                             HasSubstr("4096"))));
  // 513 one-token blocks x 8 ranks = 4104, just above the bound (512 x 8 is
  // at it); checked on the grid before the Ring/Llama3 cuts add any.
  EXPECT_THAT(MakePlan(Strategy::kIlp, Batch{{513}, 8}, IlpOpts(1)),
              invalid("ilp.granularity"));
  // A bad batch is the batch's error, before any option is looked at.
  EXPECT_THAT(MakePlan(Strategy::kIlp, Batch{{}, 2}, IlpOpts(-1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("doc")));
}

}  // namespace
}  // namespace flashcp::core
