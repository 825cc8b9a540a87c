// core::PlanToJson writes the proto's schema: protobuf's own JSON parser
// reads it back as exactly the PlanResponse that convert builds.
#include "core/plan_json.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/analysis.h"
#include "core/datasets.h"
#include "core/ilp/ilp.h"
#include "core/step_time.h"
#include "core/strategies.h"
#include "core/testing/status_matchers.h"
#include "flashcp/v1/planner.pb.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "proto/convert.h"

namespace flashcp::proto {
namespace {

using ::flashcp::core::testing::IsOk;

// Strict: an unknown key fails the parse, so core's JSON writes no field the
// proto lacks.
absl::StatusOr<v1::PlanResponse> Parse(const std::string& json) {
  v1::PlanResponse response;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &response);
  if (!status.ok()) return absl::InvalidArgumentError(status.ToString());
  return response;
}

TEST(PlanJsonSchemaTest, EveryStrategyOnADataSetParsesToResponseToProto) {
  // Small batches so that the ILP proves or stops quickly; two nodes of two
  // ranks so that the intra/inter-node byte fields are not all zero.
  absl::StatusOr<std::vector<std::vector<int64_t>>> batches =
      core::SampleBatches(core::Dataset::kPile, /*context=*/4096, /*count=*/3, /*seed=*/1);
  ASSERT_THAT(batches, IsOk());
  const core::ModelShape shape{8, 64, 2};
  int checked = 0;
  for (size_t i = 0; i < batches->size(); ++i) {
    const core::Batch batch{(*batches)[i], 4};
    for (core::Strategy s : core::AllStrategies()) {
      if (s == core::Strategy::kBasp) continue;  // refuses unequal documents (basp_test)
      core::PlanOptions options;
      options.ilp.time_limit_seconds = 0.2;
      options.ilp.solver = core::ilp::Solve;
      core::PlanInfo info;
      absl::StatusOr<core::Plan> plan = core::MakePlan(s, batch, options, &info);
      ASSERT_THAT(plan, IsOk()) << core::StrategyName(s);
      absl::StatusOr<core::PlanMetrics> metrics =
          core::AnalyzePlan(*plan, shape, /*ranks_per_node=*/2);
      ASSERT_THAT(metrics, IsOk());
      const core::PlanInfo* ilp = s == core::Strategy::kIlp ? &info : nullptr;
      const double seconds = 0.001 * static_cast<double>(i + 1) / 3;  // not a short decimal
      const core::PlanCostReport cost{std::string(core::kPairsProfile), options.cost, false,
                                      core::PredictPlanCost(options.cost, *plan)};
      // Batch 0 without a step time, 1 with, 2 with per-rank times too.
      core::ClusterSpec cluster = core::ClusterPreset("h100-sxm").value();
      cluster.ranks_per_node = 2;
      absl::StatusOr<core::StepTimeReport> step =
          core::ReportStepTime(s, *plan, shape, /*layers=*/3, cluster, "h100-sxm");
      ASSERT_THAT(step, IsOk());
      const bool per_rank = i == 2;
      const std::string json = core::PlanToJson(
          *plan, *metrics,
          {.batch_id = i, .strategy = core::StrategyName(s), .planning_seconds = seconds,
           .ilp = ilp, .cost = &cost, .step = i > 0 ? &*step : nullptr,
           .step_per_rank = per_rank});
      absl::StatusOr<v1::PlanResponse> parsed = Parse(json);
      ASSERT_THAT(parsed, IsOk()) << json;
      v1::PlanResponse want =
          ResponseToProto(i, s, *plan, *metrics, /*layout=*/nullptr, seconds, ilp, &cost);
      if (i > 0) StepTimeToProto(*step, per_rank, want.mutable_metrics());
      EXPECT_EQ(want.metrics().rank_predicted_times_size(), per_rank ? 4 : 0);
      std::string diff;
      google::protobuf::util::MessageDifferencer differencer;
      differencer.ReportDifferencesToString(&diff);
      EXPECT_TRUE(differencer.Compare(want, *parsed))
          << core::StrategyName(s) << " batch " << i << ":\n" << diff;
      EXPECT_EQ(parsed->has_ilp(), s == core::Strategy::kIlp);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 3 * (static_cast<int>(core::AllStrategies().size()) - 1));
}

TEST(PlanJsonSchemaTest, NonFiniteDoublesAndEscapedNamesParse) {
  core::Plan plan;
  plan.cp_size = 1;
  plan.doc_lens = {3};
  plan.shards = {core::Shard{0, 0, 3, 0}};
  core::PlanMetrics m;
  m.comm_saving = std::numeric_limits<double>::quiet_NaN();
  m.targeted_saving = -std::numeric_limits<double>::infinity();
  m.rank_workload = {std::numeric_limits<double>::infinity()};
  absl::StatusOr<v1::PlanResponse> parsed =
      Parse(core::PlanToJson(plan, m, {.batch_id = ~uint64_t{0}, .strategy = "a\"b\\c\n\x01"}));
  ASSERT_THAT(parsed, IsOk());
  EXPECT_EQ(parsed->batch_id(), ~uint64_t{0});
  EXPECT_EQ(parsed->strategy(), "a\"b\\c\n\x01");
  EXPECT_TRUE(std::isnan(parsed->metrics().comm_saving_ratio()));
  EXPECT_EQ(parsed->metrics().targeted_saving_ratio(), -std::numeric_limits<double>::infinity());
  ASSERT_EQ(parsed->metrics().rank_workload_size(), 1);
  EXPECT_EQ(parsed->metrics().rank_workload(0), std::numeric_limits<double>::infinity());
}

}  // namespace
}  // namespace flashcp::proto
