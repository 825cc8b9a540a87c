// Property test of the pipeline planner (core/pipeline.h) on 1,000 random
// batches: the chunk invariants, checked here independently of
// ValidatePipelinePlan, and a replay within the memory budget.
#include <algorithm>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "core/pipeline.h"
#include "core/random.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::core {
namespace {

using ::flashcp::core::testing::IsOk;
using ::testing::HasSubstr;

// A skewed batch: mostly short documents, some long ones.
PipelineRequest RandomRequest(SplitMix64Rng& rng) {
  PipelineRequest r;
  const int n = 1 + static_cast<int>(rng.Next() % 32);
  for (int i = 0; i < n; ++i) {
    const double u = rng.Uniform();
    const int64_t hi = u < 0.15 ? 65536 : 4096;
    r.doc_lens.push_back(1 + static_cast<int64_t>(rng.Uniform() * rng.Uniform() * hi));
  }
  const int32_t pps[] = {2, 4, 8};
  r.pp_size = pps[rng.Next() % 3];
  r.sp_size = rng.Next() % 3 == 0 ? 2 : 1;
  r.memory_budget_bytes = (56.0 + 40.0 * rng.Uniform()) * (int64_t{1} << 30);
  return r;
}

TEST(PipelinePropertyTest, ChunkInvariantsAndReplayOnRandomBatches) {
  SplitMix64Rng rng(20261207);
  int planned = 0, no_fit = 0;
  for (int trial = 0; trial < 1000; ++trial) {
    const PipelineRequest req = RandomRequest(rng);
    PipelineOptions o;
    o.min_slice_tokens = 2048;
    const auto plan = PlanPipeline(req, o);
    if (!plan.ok()) {
      // Only a batch that fits no plan may fail, and it says by how much.
      ASSERT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition) << plan.status();
      EXPECT_THAT(plan.status().message(), HasSubstr("bytes"));
      ++no_fit;
      continue;
    }
    ++planned;
    const size_t nd = req.doc_lens.size();
    const int32_t lp = req.model.layers / req.pp_size;
    // Where each chunk runs: pipeline and forward position.
    std::vector<std::pair<int, int>> where(plan->chunks.size(), {-1, -1});
    for (size_t g = 0; g < plan->pipelines.size(); ++g) {
      const auto& f = plan->pipelines[g].forward;
      for (size_t i = 0; i < f.size(); ++i) {
        ASSERT_EQ(where[f[i]].first, -1) << "chunk in two pipelines";
        where[f[i]] = {static_cast<int>(g), static_cast<int>(i)};
      }
    }
    std::vector<std::vector<std::pair<int64_t, int64_t>>> pieces(nd);  // (start, len)
    std::vector<std::vector<std::pair<int64_t, size_t>>> slice_chunk(nd);
    for (size_t k = 0; k < plan->chunks.size(); ++k) {
      ASSERT_NE(where[k].first, -1) << "chunk in no pipeline";
      int tails = 0;
      for (const PipelineSlice& s : plan->chunks[k].slices) {
        pieces[s.doc].emplace_back(s.start, s.len);
        slice_chunk[s.doc].emplace_back(s.start, k);
        tails += s.start > 0 && s.start + s.len == req.doc_lens[s.doc];
      }
      ASSERT_LE(tails, 1) << "two tails in chunk " << k;
      const auto& c = plan->chunks[k];
      if (c.kind == ChunkKind::kSplit) {
        ASSERT_EQ(c.slices.size(), 1u);
      }
      if (c.kind == ChunkKind::kHybrid) {
        ASSERT_EQ(tails, 1);
      }
      if (c.kind == ChunkKind::kPacked) {
        for (const auto& s : c.slices) ASSERT_EQ(s.len, req.doc_lens[s.doc]);
      }
      for (int32_t p = 0; p < req.pp_size; ++p) {
        ASSERT_GE(plan->ckpt[p][k], 0);
        ASSERT_LE(plan->ckpt[p][k], lp);
      }
    }
    for (size_t d = 0; d < nd; ++d) {
      // Every token exactly once.
      std::sort(pieces[d].begin(), pieces[d].end());
      int64_t at = 0;
      for (const auto& [start, len] : pieces[d]) {
        ASSERT_EQ(start, at) << "doc " << d;
        at += len;
      }
      ASSERT_EQ(at, req.doc_lens[d]);
      // Slices in consecutive chunks of one pipeline, forward in token order,
      // backward in reverse.
      std::sort(slice_chunk[d].begin(), slice_chunk[d].end());
      for (size_t i = 1; i < slice_chunk[d].size(); ++i) {
        const auto a = where[slice_chunk[d][i - 1].second];
        const auto b = where[slice_chunk[d][i].second];
        ASSERT_EQ(a.first, b.first);
        ASSERT_EQ(a.second + 1, b.second);
        const auto& bwd = plan->pipelines[a.first].backward;
        const auto pa = std::find(bwd.begin(), bwd.end(), slice_chunk[d][i - 1].second);
        const auto pb = std::find(bwd.begin(), bwd.end(), slice_chunk[d][i].second);
        ASSERT_LT(pb, pa) << "backward not in reverse";
      }
    }
    // The replay stays within the budget.
    const auto full = CompletePipelineRequest(req);
    const auto sim = SimulatePipeline(*full, *plan);
    ASSERT_THAT(sim, IsOk());
    for (double peak : sim->stage_peak_bytes) ASSERT_LE(peak, req.memory_budget_bytes);
    ASSERT_EQ(sim->iteration_s, plan->prediction.iteration_s);
  }
  EXPECT_EQ(planned + no_fit, 1000);
  EXPECT_GE(planned, 900) << "the generator should mostly make batches that fit";
}

// DPP's search covers the token-capped chunkings of dpp_no_wbc (and, with
// greedy checkpointing, the no-checkpointing plans whenever those fit), so
// with the greedy checkpointing (no solver) its replayed time is never above
// either ablation's on any batch.
TEST(PipelinePropertyTest, DppIsNeverSlowerThanItsAblationsUnderGreedyCheckpointing) {
  SplitMix64Rng rng(7);
  int compared = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const PipelineRequest req = RandomRequest(rng);
    PipelineOptions o;
    o.min_slice_tokens = 2048;
    const auto dpp = PlanPipeline(req, o);
    for (PipelineStrategy s : {PipelineStrategy::kDppNoWbc, PipelineStrategy::kDppNoCkpt}) {
      o.strategy = s;
      const auto other = PlanPipeline(req, o);
      if (!other.ok()) continue;
      ASSERT_THAT(dpp, IsOk()) << "an ablation fits, so DPP must";
      EXPECT_LE(dpp->prediction.iteration_s, other->prediction.iteration_s)
          << "trial " << trial << " against " << PipelineStrategyName(s);
      ++compared;
    }
  }
  EXPECT_GE(compared, 300);
}

// The search skips chunkings whose lower bound is not below the best replay
// so far: it must return exactly the plan the exhaustive search returns.
TEST(PipelinePropertyTest, PruningByTheLowerBoundLosesNothing) {
  SplitMix64Rng rng(11);
  int pruned_equal = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const PipelineRequest req = RandomRequest(rng);
    PipelineOptions o;
    o.min_slice_tokens = 1024;
    const auto pruned = PlanPipeline(req, o);
    o.prune_by_bound = false;
    const auto full = PlanPipeline(req, o);
    ASSERT_EQ(pruned.ok(), full.ok()) << "trial " << trial;
    if (!full.ok()) continue;
    ASSERT_EQ(pruned->prediction.iteration_s, full->prediction.iteration_s) << "trial " << trial;
    ASSERT_EQ(pruned->slice_count, full->slice_count) << "trial " << trial;
    ASSERT_EQ(pruned->chunks.size(), full->chunks.size()) << "trial " << trial;
    ASSERT_EQ(pruned->ckpt, full->ckpt) << "trial " << trial;
    ++pruned_equal;
  }
  EXPECT_GE(pruned_equal, 180);
}

}  // namespace
}  // namespace flashcp::core
