// MakePlan's stop token (core::StopToken, IlpOptions::seconds_left) and the
// shard bound a service checks before planning (core::MaxPlanShards).
#include <cstdint>
#include <random>
#include <vector>

#include "core/analysis.h"
#include "core/ilp/ilp.h"
#include "core/strategies.h"
#include "core/testing/status_matchers.h"
#include "core/types.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::core {
namespace {

using ::flashcp::core::testing::IsOk;

// A token that says stop from its `from`-th check on, counting checks.
struct CountingStop {
  int64_t from;
  int64_t checks = 0;
  StopToken Token() {
    return StopToken([this] {
      ++checks;
      return checks >= from ? absl::CancelledError("stopped") : absl::OkStatus();
    });
  }
};

// A batch with a few long documents among many short ones, so that flashcp
// searches over k and its fallback runs for some of them.
Batch RandomBatch(std::mt19937_64& rng, int64_t max_docs, int32_t max_cp) {
  Batch b;
  const int64_t n = std::uniform_int_distribution<int64_t>(1, max_docs)(rng);
  for (int64_t d = 0; d < n; ++d) {
    const bool long_doc = std::uniform_int_distribution<int>(0, 9)(rng) == 0;
    b.doc_lens.push_back(std::uniform_int_distribution<int64_t>(1, long_doc ? 30000 : 2000)(rng));
  }
  const int64_t total = TotalTokens(b.doc_lens);
  b.cp_size = static_cast<int32_t>(
      std::min<int64_t>(total, std::uniform_int_distribution<int32_t>(1, max_cp)(rng)));
  return b;
}

TEST(StopTokenTest, FlashCpStopsAtEveryCheckAndANeverStopTokenChangesNothing) {
  std::mt19937_64 rng(12);
  for (int i = 0; i < 20; ++i) {
    const Batch batch = RandomBatch(rng, 200, 16);
    absl::StatusOr<Plan> plain = MakePlan(Strategy::kFlashCp, batch);
    ASSERT_THAT(plain, IsOk());
    CountingStop never{INT64_MAX};
    PlanOptions o;
    o.stop = never.Token();
    absl::StatusOr<Plan> with_token = MakePlan(Strategy::kFlashCp, batch, o);
    ASSERT_THAT(with_token, IsOk());
    EXPECT_EQ(with_token->shards, plain->shards);
    // Checked before planning, in the search and after: at least three.
    ASSERT_GE(never.checks, 3);
    for (int64_t from = 1; from <= never.checks; ++from) {
      CountingStop stop{from};
      o.stop = stop.Token();
      EXPECT_EQ(MakePlan(Strategy::kFlashCp, batch, o).status(), absl::CancelledError("stopped"))
          << i << " " << from;
      EXPECT_EQ(stop.checks, from) << "asked again after it said stop";
    }
  }
}

TEST(StopTokenTest, IlpStopsInsideCbcAndItsTimeBudgetEndsTheSearchWithAPlan) {
  std::mt19937 rng(7);  // as IlpTest.TimeLimitReturnsBestFoundWithGap: ~400 binaries
  Batch batch{{}, 4};
  for (int d = 0; d < 40; ++d) {
    batch.doc_lens.push_back(std::uniform_int_distribution<int64_t>(1, 200)(rng));
  }
  // Stopped: Cancelled, whichever check says so first.
  for (int64_t from : {1, 2, 5}) {
    CountingStop stop{from};
    PlanOptions o;
    o.ilp.solver = ilp::Solve;
    o.stop = stop.Token();
    EXPECT_EQ(MakePlan(Strategy::kIlp, batch, o).status(), absl::CancelledError("stopped"))
        << from;
  }
  // The budget already spent: CBC stops at once with the incumbent, a valid
  // plan, though its own 1,000 s limit is far off.
  int calls = 0;
  PlanOptions o;
  o.ilp.solver = ilp::Solve;
  o.ilp.time_limit_seconds = 1000;
  o.ilp.seconds_left = [&calls] {
    ++calls;
    return 0.0;
  };
  PlanInfo info;
  absl::StatusOr<Plan> plan = MakePlan(Strategy::kIlp, batch, o, &info);
  ASSERT_THAT(plan, IsOk());
  EXPECT_THAT(ValidatePlan(*plan), IsOk());
  EXPECT_FALSE(info.ilp_optimal);
  EXPECT_GE(calls, 1);
}

// MaxPlanShards bounds every strategy's real plans (and is exact where the
// formula is: per_doc on documents of at least 2N tokens at N >= 2 merges only
// the two middle chunks, so it is off by one per document there).
TEST(MaxPlanShardsTest, BoundsRealPlansOnRandomBatches) {
  std::mt19937_64 rng(2026);
  for (int i = 0; i < 150; ++i) {
    const Batch batch = RandomBatch(rng, 300, 64);
    for (Strategy s : AllStrategies()) {
      if (s == Strategy::kIlp) continue;  // below, on batches it accepts
      if (s == Strategy::kBasp) continue;  // equal documents only: basp_test
      absl::StatusOr<Plan> plan = MakePlan(s, batch);
      ASSERT_THAT(plan, IsOk());
      EXPECT_LE(static_cast<int64_t>(plan->shards.size()), MaxPlanShards(s, batch))
          << StrategyName(s) << " batch " << i << " n " << batch.doc_lens.size() << " N "
          << batch.cp_size;
    }
  }
  for (int i = 0; i < 20; ++i) {
    const Batch batch = RandomBatch(rng, 8, 4);
    PlanOptions o;
    o.ilp.solver = ilp::Solve;
    o.ilp.time_limit_seconds = 0.2;
    absl::StatusOr<Plan> plan = MakePlan(Strategy::kIlp, batch, o);
    if (!plan.ok()) continue;  // a model above the ILP's size limit
    EXPECT_LE(static_cast<int64_t>(plan->shards.size()), MaxPlanShards(Strategy::kIlp, batch));
  }
}

TEST(MaxPlanShardsTest, HandWorkedValues) {
  const Batch batch{{10, 3, 100}, 4};  // n 3, N 4, P = 8 + 3 + 8 = 19
  EXPECT_EQ(MaxPlanShards(Strategy::kRing, batch), 6);
  EXPECT_EQ(MaxPlanShards(Strategy::kWholeDoc, batch), 6);
  EXPECT_EQ(MaxPlanShards(Strategy::kLlama3, batch), 10);
  EXPECT_EQ(MaxPlanShards(Strategy::kPerDoc, batch), 19);
  EXPECT_EQ(MaxPlanShards(Strategy::kZigzag, batch), 19);
  EXPECT_EQ(MaxPlanShards(Strategy::kFlashCp, batch), 23);
  EXPECT_EQ(MaxPlanShards(Strategy::kIlp, batch), 23);
  // Never above the tokens.
  EXPECT_EQ(MaxPlanShards(Strategy::kFlashCp, Batch{{1, 1}, 2}), 2);
}

}  // namespace
}  // namespace flashcp::core
