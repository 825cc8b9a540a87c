#include "core/ilp/pipeline_ckpt.h"

#include <cstdint>
#include <limits>
#include <vector>

#include "core/internal/pipeline_internal.h"
#include "core/pipeline.h"
#include "core/random.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::core::ilp {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;
using ::testing::HasSubstr;

// The optimum by enumeration of every assignment; +inf when infeasible.
double BruteForce(const CkptProblem& p) {
  double best = std::numeric_limits<double>::infinity();
  std::vector<int32_t> c(p.vars, 0);
  while (true) {
    bool ok = true;
    for (const CkptRow& row : p.rows) {
      double lhs = 0;
      for (const auto& [j, a] : row.terms) lhs += a * c[j];
      ok &= lhs >= row.rhs;
    }
    if (ok) {
      double o = 0;
      for (int32_t j = 0; j < p.vars; ++j) o += p.cost[j] * c[j];
      best = std::min(best, o);
    }
    int32_t j = 0;
    while (j < p.vars && c[j] == p.max_value) c[j++] = 0;
    if (j == p.vars) break;
    ++c[j];
  }
  return best;
}

TEST(PipelineCkptIlpTest, EqualsBruteForceOnTinyProblems) {
  SplitMix64Rng rng(26);
  int solved = 0;
  for (int trial = 0; trial < 300; ++trial) {
    CkptProblem p;
    p.vars = 1 + static_cast<int32_t>(rng.Next() % 5);
    p.max_value = 1 + static_cast<int32_t>(rng.Next() % 4);
    for (int32_t j = 0; j < p.vars; ++j) p.cost.push_back(1e-4 * (1 + rng.Next() % 9));
    const int rows = 1 + static_cast<int>(rng.Next() % 5);
    for (int i = 0; i < rows; ++i) {
      CkptRow row;
      double most = 0;
      for (int32_t j = 0; j < p.vars; ++j) {
        if (rng.Next() % 3 == 0) continue;
        const double a = 1e8 * (1 + rng.Next() % 50);
        row.terms.emplace_back(j, a);
        most += a * p.max_value;
      }
      row.rhs = most * rng.Uniform();  // feasible at max_value
      p.rows.push_back(row);
    }
    const std::vector<int32_t> start(p.vars, p.max_value);
    CkptSolveOptions o;
    o.relative_gap = 0;
    o.time_limit_seconds = 10;
    const auto s = SolvePipelineCkpt(p, start, o, StopToken());
    ASSERT_THAT(s, IsOk());
    const double brute = BruteForce(p);
    EXPECT_NEAR(s->objective, brute, 1e-12) << "trial " << trial;
    EXPECT_TRUE(s->optimal);
    EXPECT_EQ(s->gap, 0);
    ++solved;
  }
  EXPECT_EQ(solved, 300);
}

TEST(PipelineCkptIlpTest, RejectsInfeasibleStartAndStops) {
  CkptProblem p;
  p.vars = 2;
  p.max_value = 3;
  p.cost = {1, 1};
  p.rows = {CkptRow{{{0, 1.0}, {1, 1.0}}, 4.0}};
  EXPECT_THAT(SolvePipelineCkpt(p, {1, 1}, {}, StopToken()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("start")));
  EXPECT_THAT(SolvePipelineCkpt(p, {3, 3}, {},
                                StopToken([] { return absl::CancelledError("client went away"); })),
              StatusIs(absl::StatusCode::kCancelled));
}

TEST(PipelineCkptIlpTest, PlannerWithIlpReplaysWithinBudgetAndBeatsGreedy) {
  SplitMix64Rng rng(7);
  int planned = 0;
  for (int trial = 0; trial < 4; ++trial) {
    PipelineRequest req;
    const int n = 8 + static_cast<int>(rng.Next() % 24);
    for (int i = 0; i < n; ++i) {
      const int64_t hi = rng.Uniform() < 0.2 ? 65536 : 8192;
      req.doc_lens.push_back(1 + static_cast<int64_t>(rng.Uniform() * hi));
    }
    req.pp_size = rng.Next() % 2 == 0 ? 4 : 8;
    req.memory_budget_bytes = 48.0 * (int64_t{1} << 30);
    PipelineOptions greedy_opts;
    greedy_opts.min_slice_tokens = 4096;  // fewer K candidates: a quick test
    const auto greedy = PlanPipeline(req, greedy_opts);
    PipelineOptions o;
    o.ckpt_solver = SolvePipelineCkpt;
    o.min_slice_tokens = 4096;
    o.ckpt.time_limit_seconds = 1;
    const auto plan = PlanPipeline(req, o);
    ASSERT_EQ(plan.ok(), greedy.ok()) << plan.status() << greedy.status();
    if (!plan.ok()) continue;
    ++planned;
    // The ILP's checkpointing, kept unless the greedy one replays faster.
    EXPECT_THAT(plan->ckpt_solver, ::testing::AnyOf("ilp", "greedy"));
    EXPECT_LE(plan->prediction.iteration_s, greedy->prediction.iteration_s);
    for (double peak : plan->prediction.stage_peak_bytes) EXPECT_LE(peak, req.memory_budget_bytes);
    // Same chunks and pipelines; the ILP's objective is at most greedy's.
    const auto full = CompletePipelineRequest(req);
    const auto m = internal::BuildCkptModel(*full, *plan);
    auto objective = [&](const PipelinePlan& pl) {
      double o2 = 0;
      std::vector<char> seen(m.problem.vars, 0);
      for (int32_t p = 0; p < req.pp_size; ++p) {
        for (size_t k = 0; k < pl.chunks.size(); ++k) {
          const int32_t j = m.VarOf(req.pp_size, p, static_cast<int32_t>(k));
          if (!seen[j]) o2 += m.problem.cost[j] * pl.ckpt[p][k];
          seen[j] = 1;
        }
      }
      return o2;
    };
    if (plan->ckpt_solver == "ilp") {
      EXPECT_LE(objective(*plan), objective(*greedy) + 1e-12);
    }
  }
  EXPECT_GE(planned, 3);
}

}  // namespace
}  // namespace flashcp::core::ilp
