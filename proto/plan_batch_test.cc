// PlanBatch, its bounds and the checked serialization, with an injected clock
// and a recording observer: exact planning_seconds, no sleeps.
#include "proto/plan_batch.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/step_choice.h"
#include "core/step_time.h"
#include "core/strategies.h"
#include "core/testing/status_matchers.h"
#include "core/testing/ticking_clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::proto {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;
using ::testing::ElementsAre;

// Each clock reading 1 ms after the previous one.
constexpr absl::Duration kTick = absl::Milliseconds(1);

struct Planned {
  std::string method;  // the strategy's name
  double seconds;
};

class RecordingObserver final : public PlanObserver {
 public:
  void OnPlanned(core::Strategy strategy, double seconds, const core::PlanMetrics& m) override {
    absl::MutexLock lock(&mu_);
    planned.push_back({std::string(core::StrategyName(strategy)), seconds});
    imbalances.push_back(m.imbalance);
  }

  absl::Mutex mu_;
  std::vector<Planned> planned;
  std::vector<double> imbalances;
};

TEST(PlanBatchTest, PlanningSecondsComeFromTheInjectedClock) {
  core::testing::TickingClock clock{kTick};
  RecordingObserver observer;
  PlanInput in;
  in.batch_id = 5;
  in.batch = core::Batch{{5, 3}, 2};
  in.strategy = core::Strategy::kRing;
  absl::StatusOr<v1::PlanResponse> r = PlanBatch(in, clock, observer);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->batch_id(), 5u);
  EXPECT_EQ(r->metrics().planning_seconds(), 0.001);  // two readings, one tick apart
  ASSERT_EQ(observer.planned.size(), 1u);
  EXPECT_EQ(observer.planned[0].method, "ring");
  EXPECT_EQ(observer.planned[0].seconds, 0.001);
  EXPECT_DOUBLE_EQ(observer.imbalances[0], 11.0 / 10.5);
}

// A request naming a cluster gets the step-time model's prediction of its
// plan, exactly core::ReportStepTime's; by step time, flashcp's plan is
// PlanFlashCpByStepTime's.
TEST(PlanBatchTest, PredictedStepTimeWhenAClusterIsNamed) {
  core::testing::TickingClock clock{kTick};
  RecordingObserver observer;
  PlanInput in;
  in.batch = core::Batch{{4000, 3000, 900, 500, 300, 200, 100}, 4};
  in.strategy = core::Strategy::kFlashCp;
  in.options.ranks_per_node = 2;
  core::StepTimeOptions step;
  step.cluster_name = "h100-sxm";
  step.cluster = core::ClusterPreset("h100-sxm").value();
  step.cluster.ranks_per_node = 2;
  step.layers = 3;
  step.per_rank = true;
  in.step_time = step;
  absl::StatusOr<v1::PlanResponse> r = PlanBatch(in, clock, observer);
  ASSERT_THAT(r, IsOk());
  absl::StatusOr<core::Plan> plan = core::MakePlan(in.strategy, in.batch, in.options);
  ASSERT_THAT(plan, IsOk());
  absl::StatusOr<core::StepTimeReport> want =
      core::ReportStepTime(in.strategy, *plan, in.shape, 3, step.cluster, "h100-sxm");
  ASSERT_THAT(want, IsOk());
  EXPECT_EQ(r->metrics().predicted_step_seconds(), want->native().step_seconds);
  EXPECT_EQ(r->metrics().predicted_exchange(), core::StepExchangeName(want->exchange));
  EXPECT_EQ(r->metrics().predicted_cluster(), "h100-sxm");
  EXPECT_EQ(r->metrics().predicted_exchanges_size(), core::kNumStepExchanges);
  EXPECT_EQ(r->metrics().rank_predicted_times_size(), 4);

  in.choose_by_step_time = true;
  r = PlanBatch(in, clock, observer);
  ASSERT_THAT(r, IsOk());
  absl::StatusOr<core::StepChoice> choice =
      core::PlanFlashCpByStepTime(in.batch, in.options, in.shape, step);
  ASSERT_THAT(choice, IsOk());
  EXPECT_EQ(r->metrics().predicted_step_seconds(), choice->report.native().step_seconds);
  EXPECT_LE(r->metrics().predicted_step_seconds(), want->native().step_seconds);
  ASSERT_EQ(r->shards_size(), static_cast<int>(choice->plan.shards.size()));
}

// An exchange that does not apply to the plan reaches the response as its
// reason, with no time: one document over a group of 3 ranks, whose size
// does not divide the default query heads.
TEST(PlanBatchTest, AnInapplicableAllToAllSaysWhyInTheResponse) {
  core::testing::TickingClock clock{kTick};
  RecordingObserver observer;
  PlanInput in;
  in.batch = core::Batch{{3000}, 3};
  in.strategy = core::Strategy::kLlama3;
  ASSERT_NE(core::QueryHeads(in.shape) % 3, 0);
  core::StepTimeOptions step;
  step.cluster_name = "h200";
  step.cluster = core::ClusterPreset("h200").value();
  in.step_time = step;
  absl::StatusOr<v1::PlanResponse> r = PlanBatch(in, clock, observer);
  ASSERT_THAT(r, IsOk());
  ASSERT_EQ(r->metrics().predicted_exchanges_size(), core::kNumStepExchanges);
  const v1::ExchangeStepTime& a2a =
      r->metrics().predicted_exchanges(static_cast<int>(core::StepExchange::kAllToAll));
  EXPECT_EQ(a2a.exchange(), "all_to_all");
  EXPECT_EQ(a2a.inapplicable(), r->metrics().all_to_all_inapplicable());
  EXPECT_THAT(a2a.inapplicable(), ::testing::StartsWith("query_heads: "));
  EXPECT_EQ(a2a.step_seconds(), 0);
  const v1::ExchangeStepTime& ag =
      r->metrics().predicted_exchanges(static_cast<int>(core::StepExchange::kAllGather));
  EXPECT_EQ(ag.inapplicable(), "");
  EXPECT_GT(ag.step_seconds(), 0);
}

TEST(PlanBatchTest, ChooseSchemesAddsTheGroupsAndKeepsFlashcpsPlan) {
  core::testing::TickingClock clock{kTick};
  RecordingObserver observer;
  PlanInput in;
  in.batch = core::Batch{{32768, 32768}, 16};
  in.strategy = core::Strategy::kFlashCp;
  in.options.ranks_per_node = 8;
  absl::StatusOr<v1::PlanResponse> plain = PlanBatch(in, clock, observer);
  ASSERT_THAT(plain, IsOk());
  EXPECT_EQ(plain->groups_size(), 0);
  EXPECT_EQ(plain->plan_source(), "");
  in.choose_schemes = true;
  absl::StatusOr<v1::PlanResponse> r = PlanBatch(in, clock, observer);
  ASSERT_THAT(r, IsOk());
  // Two equal documents on 16 ranks, 8 a node: flashcp's plan (or basp's,
  // which groups them the same way) keeps each document on one node.
  ASSERT_GE(r->groups_size(), 2);
  int64_t ranks = 0;
  for (const v1::SchemeGroup& g : r->groups()) {
    ranks += g.ranks_size();
    EXPECT_TRUE(g.scheme() == "targeted" || g.scheme() == "allgather" ||
                g.scheme() == "all_to_all")
        << g.scheme();
  }
  EXPECT_EQ(ranks, 16);
  EXPECT_EQ(r->chosen_bytes().scheme(), "chosen");
  EXPECT_EQ(r->chosen_bytes().phase_max_inter_node_bytes(), 0);
  if (r->plan_source() == "flashcp") {
    ASSERT_EQ(r->shards_size(), plain->shards_size());
    for (int i = 0; i < r->shards_size(); ++i) {
      EXPECT_EQ(r->shards(i).SerializeAsString(), plain->shards(i).SerializeAsString());
    }
  } else {
    EXPECT_EQ(r->plan_source(), "basp");
  }
}

// A block-diffusion request: the response covers both copies and says so;
// with include_layout the missing layout is UNIMPLEMENTED, not a wrong one.
// A block-diffusion request: the response covers both copies and says so;
// with include_layout the mask's layout (core/mask_layout.h): rank 0's clean
// block 1 needs the clean block 0 rank 1 holds, nothing else travels.
TEST(PlanBatchTest, BlockDiffusionPlansBothCopies) {
  core::testing::TickingClock clock{kTick};
  RecordingObserver observer;
  PlanInput in;
  in.batch = core::Batch{{8}, 2};
  in.strategy = core::Strategy::kLlama3;
  in.options.attention_mask = {core::MaskKind::kBlockDiffusion, 4};
  absl::StatusOr<int64_t> bound = CheckPlanBounds(in, PlanBounds{});
  ASSERT_THAT(bound, IsOk());
  absl::StatusOr<v1::PlanResponse> r = PlanBatch(in, clock, observer);
  ASSERT_THAT(r, IsOk());
  EXPECT_LE(static_cast<int64_t>(r->ByteSizeLong()), *bound);
  EXPECT_EQ(r->attention_mask(), "block_diffusion");
  EXPECT_EQ(r->block_size(), 4);
  EXPECT_THAT(r->doc_lens(), ElementsAre(8, 8));
  EXPECT_THAT(r->metrics().rank_noisy_tokens(), ElementsAre(4, 4));
  EXPECT_THAT(r->metrics().rank_workload(), ElementsAre(48.0, 48.0));
  in.include_layout = true;
  r = PlanBatch(in, clock, observer);
  ASSERT_THAT(r, IsOk());
  ASSERT_EQ(r->layout_size(), 2);
  EXPECT_EQ(r->layout(0).send_tokens(), 0);
  EXPECT_EQ(r->layout(1).send_tokens(), 4);
  ASSERT_EQ(r->layout(1).targeted_size(), 1);
  EXPECT_EQ(r->layout(1).targeted(0).dest(), 0);
  EXPECT_EQ(r->layout(1).targeted(0).tokens(), 4);
}

TEST(PlanBatchTest, CoreErrorsPassThroughUnchanged) {
  core::testing::TickingClock clock{kTick};
  RecordingObserver observer;
  PlanInput in;
  in.batch = core::Batch{{5, 3}, 2};
  in.strategy = core::Strategy::kRing;
  in.options.target_imbalance = 0.5;  // RequestFromProto would refuse; MakePlan does too
  EXPECT_EQ(PlanBatch(in, clock, observer).status(),
            absl::InvalidArgumentError("target_imbalance: must be a finite ratio >= 1, got 0.5"));
  EXPECT_TRUE(observer.planned.empty());
}

// The ILP is injected (flashcp_proto links no CBC): unset, `ilp` is the
// core's FailedPrecondition and nothing is reported.
TEST(PlanBatchTest, IlpWithoutASolverIsFailedPrecondition) {
  core::testing::TickingClock clock{kTick};
  RecordingObserver observer;
  PlanInput in;
  in.batch = core::Batch{{5, 3}, 2};
  in.strategy = core::Strategy::kIlp;
  EXPECT_THAT(PlanBatch(in, clock, observer).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_TRUE(observer.planned.empty());
}

// A stand-in for core::ilp::Solve: ring's plan, with a recognisable info.
absl::StatusOr<core::Plan> FakeIlp(const core::Batch& batch, const core::IlpOptions&,
                                   const core::StopToken&, core::PlanInfo* info) {
  info->ilp_gap = 0.25;
  info->ilp_optimal = false;
  info->ilp_granularity = 7;
  return core::MakePlan(core::Strategy::kRing, batch);
}

absl::StatusOr<core::Plan> RefusingIlp(const core::Batch&, const core::IlpOptions&,
                                       const core::StopToken&, core::PlanInfo*) {
  return absl::FailedPreconditionError("ilp: not here");
}

TEST(PlanBatchTest, IlpRunsTheCallersSolverAndReportsItsInfo) {
  core::testing::TickingClock clock{kTick};
  RecordingObserver observer;
  PlanInput in;
  in.batch = core::Batch{{5, 3}, 2};
  in.strategy = core::Strategy::kIlp;
  in.options.ilp.solver = FakeIlp;
  absl::StatusOr<v1::PlanResponse> r = PlanBatch(in, clock, observer);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->ilp().gap(), 0.25);
  EXPECT_FALSE(r->ilp().optimal());
  EXPECT_EQ(r->ilp().granularity(), 7);
  ASSERT_EQ(observer.planned.size(), 1u);
  EXPECT_EQ(observer.planned[0].method, "ilp");
  in.options.ilp.solver = RefusingIlp;  // its status, unchanged
  EXPECT_EQ(PlanBatch(in, clock, observer).status(),
            absl::FailedPreconditionError("ilp: not here"));
  EXPECT_EQ(observer.planned.size(), 1u);
}

// Issue 31 item 6: a response that cannot serialize is an error, never an
// empty PlanResponse (the in-process flashcp.plan serializes through this).
TEST(SerializeResponseTest, AResponseAboveItsBoundIsAnErrorNotEmpty) {
  v1::PlanResponse r;
  r.set_batch_id(7);
  for (int i = 0; i < 100; ++i) r.add_doc_lens(1000 + i);
  absl::StatusOr<std::string> all = SerializeResponse(r);
  ASSERT_THAT(all.status(), IsOk());
  EXPECT_EQ(static_cast<int64_t>(all->size()), static_cast<int64_t>(r.ByteSizeLong()));
  EXPECT_EQ(SerializeResponse(r, 100).status(),
            absl::ResourceExhaustedError(absl::StrCat(
                "response: ", r.ByteSizeLong(), " bytes, above the 100 bytes it may take")));
}

}  // namespace
}  // namespace flashcp::proto
