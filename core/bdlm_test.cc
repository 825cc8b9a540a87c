// Strategies under the block-diffusion mask: csbp against Turbo-dLLM's
// reference vectors (tests/unit/schedules/test_block_schedule.py, via
// ../shared/paper/related-systems-notes.md 1.3), and flashcp's invariants.
#include <algorithm>
#include <vector>

#include "core/analysis.h"
#include "core/internal/bdlm.h"
#include "core/mask.h"
#include "core/random.h"
#include "core/strategies.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::core {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Tasks = std::vector<std::vector<int64_t>>;

TEST(CsbpScheduleTest, DualEndPairs) {
  EXPECT_EQ(internal::DualEndPairs(8), (Tasks{{0, 7}, {1, 6}, {2, 5}, {3, 4}}));
  EXPECT_EQ(internal::DualEndPairs(5), (Tasks{{0, 4}, {1, 3}, {2}}));
}

std::vector<int64_t> Costs(const std::vector<Tasks>& a) {
  std::vector<int64_t> out;
  for (const Tasks& w : a) {
    int64_t s = 0;
    for (const auto& t : w) {
      for (int64_t k : t) s += k;
    }
    out.push_back(s);
  }
  return out;
}

TEST(CsbpScheduleTest, ThirtyTwoBlocksOverEight) {
  absl::StatusOr<std::vector<Tasks>> a = internal::DualEndAssignments(32, 8);
  ASSERT_THAT(a, IsOk());
  ASSERT_EQ(a->size(), 8u);
  for (int64_t w = 0; w < 8; ++w) {
    EXPECT_EQ((*a)[w], (Tasks{{2 * w, 31 - 2 * w}, {2 * w + 1, 30 - 2 * w}})) << w;
  }
  EXPECT_EQ(Costs(*a), std::vector<int64_t>(8, 62));
}

TEST(CsbpScheduleTest, ThirtyTwoBlocksOverFour) {
  absl::StatusOr<std::vector<Tasks>> a = internal::DualEndAssignments(32, 4);
  ASSERT_THAT(a, IsOk());
  EXPECT_EQ(Costs(*a), std::vector<int64_t>(4, 124));
  EXPECT_EQ((*a)[0], (Tasks{{0, 31}, {1, 30}, {2, 29}, {3, 28}}));
}

TEST(CsbpScheduleTest, TenBlocksOverFour) {
  absl::StatusOr<std::vector<Tasks>> a = internal::DualEndAssignments(10, 4);
  ASSERT_THAT(a, IsOk());
  EXPECT_EQ(*a, (std::vector<Tasks>{{{0, 9}, {1, 8}}, {{2, 7}}, {{3, 6}}, {{4, 5}}}));
}

TEST(CsbpScheduleTest, FiveBlocksOverTwoMiddleToLightest) {
  absl::StatusOr<std::vector<Tasks>> a = internal::DualEndAssignments(5, 2);
  ASSERT_THAT(a, IsOk());
  EXPECT_EQ(*a, (std::vector<Tasks>{{{0, 4}, {2}}, {{1, 3}}}));
}

TEST(CsbpScheduleTest, FiveBlocksOverFourShortLpt) {
  absl::StatusOr<std::vector<Tasks>> a = internal::DualEndAssignments(5, 4);
  ASSERT_THAT(a, IsOk());
  // Largest first to the lightest: 4, 3, 2, 1 to workers 0-3, then 0 to worker 3.
  EXPECT_EQ(*a, (std::vector<Tasks>{{{4}}, {{3}}, {{2}}, {{1}, {0}}}));
  std::vector<int64_t> all;
  for (const Tasks& w : *a) {
    EXPECT_FALSE(w.empty());
    for (const auto& t : w) all.insert(all.end(), t.begin(), t.end());
  }
  std::sort(all.begin(), all.end());
  EXPECT_THAT(all, ElementsAre(0, 1, 2, 3, 4));
}

TEST(CsbpScheduleTest, FewerBlocksThanWorkersIsAnError) {
  EXPECT_THAT(internal::DualEndAssignments(3, 4),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("block_size")));
}

// clean_shards_for_rank, dual_chunk: balanced_bounds(L, 2c, r) and (2c-1-r).
TEST(CsbpScheduleTest, BalancedBounds) {
  EXPECT_EQ(internal::BalancedBounds(10, 4, 0), std::make_pair(int64_t{0}, int64_t{3}));
  EXPECT_EQ(internal::BalancedBounds(10, 4, 1), std::make_pair(int64_t{3}, int64_t{6}));
  EXPECT_EQ(internal::BalancedBounds(10, 4, 2), std::make_pair(int64_t{6}, int64_t{8}));
  EXPECT_EQ(internal::BalancedBounds(10, 4, 3), std::make_pair(int64_t{8}, int64_t{10}));
}

// A one-document batch: csbp's plan is the schedule's blocks and the dual
// chunks of the clean copy, exactly.
TEST(CsbpPlanTest, OneDocumentEqualsTheSchedule) {
  for (const auto& [blocks, n, b] : std::vector<std::tuple<int64_t, int32_t, int64_t>>{
           {32, 8, 4}, {32, 4, 16}, {16, 4, 64}, {64, 16, 4}}) {
    const int64_t len = blocks * b;
    PlanOptions options;
    options.attention_mask = {MaskKind::kBlockDiffusion, b};
    absl::StatusOr<Plan> plan = MakePlan(Strategy::kCsbp, Batch{{len}, n}, options);
    ASSERT_THAT(plan, IsOk());
    absl::StatusOr<std::vector<Tasks>> a = internal::DualEndAssignments(blocks, n);
    ASSERT_THAT(a, IsOk());
    for (int32_t r = 0; r < n; ++r) {
      std::vector<int64_t> want_noisy;
      for (const auto& t : (*a)[r]) want_noisy.insert(want_noisy.end(), t.begin(), t.end());
      std::sort(want_noisy.begin(), want_noisy.end());
      std::vector<int64_t> got_noisy;
      std::vector<std::pair<int64_t, int64_t>> got_clean;
      for (const Shard& s : plan->shards) {
        if (s.rank != r) continue;
        if (s.doc == 0) {
          EXPECT_EQ(s.start % b, 0);
          for (int64_t k = s.start / b; k < (s.start + s.len) / b; ++k) got_noisy.push_back(k);
        } else {
          got_clean.push_back({s.start, s.start + s.len});
        }
      }
      std::sort(got_noisy.begin(), got_noisy.end());
      EXPECT_EQ(got_noisy, want_noisy) << "rank " << r;
      const auto head = internal::BalancedBounds(len, 2 * n, r);
      const auto tail = internal::BalancedBounds(len, 2 * n, 2 * n - 1 - r);
      std::vector<std::pair<int64_t, int64_t>> want_clean = {head, tail};
      if (head.second == tail.first) want_clean = {{head.first, tail.second}};  // N = 1 style merge
      EXPECT_EQ(got_clean, want_clean) << "rank " << r;
    }
    absl::StatusOr<PlanMetrics> m = AnalyzePlan(*plan, ModelShape{1, 1, 1});
    ASSERT_THAT(m, IsOk());
    EXPECT_EQ(m->cut_noisy_blocks, 0);
    EXPECT_DOUBLE_EQ(m->imbalance, 1.0);  // pairs and dual chunks balance exactly
    // Clean K/V received per rank: L (N-1)/N under the compacted all-gather
    // (every rank's clean chunks are needed by the rank of the last block);
    // llama3 over the 2C sequence moves 2L (N-1)/N.
    const PhaseTraffic& g = m->bytes[static_cast<int>(CommScheme::kAllGather)].phase;
    EXPECT_EQ(g.max_received_tokens, len * (n - 1) / n);
    absl::StatusOr<Plan> llama = MakePlan(Strategy::kLlama3, Batch{{len}, n}, options);
    ASSERT_THAT(llama, IsOk());
    absl::StatusOr<PlanMetrics> lm = AnalyzePlan(*llama, ModelShape{1, 1, 1});
    ASSERT_THAT(lm, IsOk());
    EXPECT_EQ(lm->bytes[static_cast<int>(CommScheme::kFullKv)].phase.max_received_tokens,
              2 * len * (n - 1) / n);
  }
}

// Every rank holds exactly 2C/N tokens (ValidatePlan) and MaxPlanShards
// bounds the shards, on thousands of random packed batches, for every
// block-diffusion strategy.
TEST(BlockDiffusionPropertyTest, ValidPlansOnRandomBatches) {
  SplitMix64Rng rng(2525);
  int planned = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    std::vector<int64_t> docs(1 + rng.Next() % 12);
    const int64_t max_len = (iter % 3 == 0) ? 4 : 600;
    for (int64_t& d : docs) d = 1 + static_cast<int64_t>(rng.Next() % max_len);
    const int32_t n = static_cast<int32_t>(1 + rng.Next() % 8);
    if (TotalTokens(docs) < n) continue;
    PlanOptions options;
    options.attention_mask = {MaskKind::kBlockDiffusion, static_cast<int64_t>(1 + rng.Next() % 64)};
    for (Strategy s : {Strategy::kLlama3, Strategy::kCsbp, Strategy::kFlashCp}) {
      absl::StatusOr<Plan> plan = MakePlan(s, Batch{docs, n}, options);
      if (s == Strategy::kCsbp && plan.status().code() == absl::StatusCode::kFailedPrecondition) {
        continue;  // fewer packed blocks than ranks
      }
      ASSERT_THAT(plan, IsOk()) << StrategyName(s);
      ASSERT_THAT(ValidatePlan(*plan), IsOk()) << StrategyName(s);
      EXPECT_EQ(plan->mask, options.attention_mask);
      EXPECT_EQ(plan->doc_lens.size(), 2 * docs.size());
      EXPECT_LE(static_cast<int64_t>(plan->shards.size()),
                MaxPlanShards(s, Batch{docs, n}, options.attention_mask))
          << StrategyName(s);
      ++planned;
    }
  }
  EXPECT_GT(planned, 4000);
}

// flashcp never moves more than csbp on a one-document batch (csbp is one of
// its candidates), and keeps short documents whole.
TEST(BlockDiffusionFlashCpTest, NeverMoreThanCsbpOnOneDocument) {
  for (int32_t n : {2, 4, 8}) {
    for (int64_t b : {4, 16, 64}) {
      for (int64_t len : {int64_t{4096}, int64_t{10000}, int64_t{32768}}) {
        PlanOptions options;
        options.attention_mask = {MaskKind::kBlockDiffusion, b};
        absl::StatusOr<Plan> f = MakePlan(Strategy::kFlashCp, Batch{{len}, n}, options);
        absl::StatusOr<Plan> c = MakePlan(Strategy::kCsbp, Batch{{len}, n}, options);
        ASSERT_THAT(f, IsOk());
        ASSERT_THAT(c, IsOk());
        absl::StatusOr<PlanMetrics> fm = AnalyzePlan(*f, ModelShape{});
        absl::StatusOr<PlanMetrics> cm = AnalyzePlan(*c, ModelShape{});
        ASSERT_THAT(fm, IsOk());
        ASSERT_THAT(cm, IsOk());
        const auto moved = [](const PlanMetrics& m) {
          return m.bytes[static_cast<int>(m.cheaper_scheme)].phase.bottleneck_bytes;
        };
        EXPECT_LE(moved(*fm), moved(*cm)) << n << " " << b << " " << len;
        EXPECT_LE(fm->imbalance, 1.02) << n << " " << b << " " << len;
      }
    }
  }
}

TEST(BlockDiffusionFlashCpTest, ShortDocumentsStayWholeAndMoveNothing) {
  PlanOptions options;
  options.attention_mask = {MaskKind::kBlockDiffusion, 4};
  // Four equal documents on four ranks: each rank one whole document.
  absl::StatusOr<Plan> plan = MakePlan(Strategy::kFlashCp, Batch{{64, 64, 64, 64}, 4}, options);
  ASSERT_THAT(plan, IsOk());
  absl::StatusOr<PlanMetrics> m = AnalyzePlan(*plan, ModelShape{});
  ASSERT_THAT(m, IsOk());
  EXPECT_EQ(m->bytes[static_cast<int>(CommScheme::kTargeted)].phase.bottleneck_tokens, 0);
  EXPECT_DOUBLE_EQ(m->imbalance, 1.0);
  EXPECT_EQ(m->cut_docs, 0);
}

}  // namespace
}  // namespace flashcp::core
