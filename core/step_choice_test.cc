#include "core/step_choice.h"

#include <cstdint>
#include <vector>

#include "core/analysis.h"
#include "core/datasets.h"
#include "core/step_time.h"
#include "core/strategies.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::core {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;

TEST(StepChoiceTest, NeverSlowerThanFlashCpAndWithinTheGuard) {
  StepTimeOptions step;
  step.cluster = ClusterPreset("h100-sxm").value();
  step.cluster.ranks_per_node = 4;
  int improved = 0;
  for (int64_t k = 0; k < 6; ++k) {
    absl::StatusOr<std::vector<int64_t>> docs = SampleBatch(Dataset::kWlbLlm, 65536, 3, k);
    ASSERT_THAT(docs, IsOk());
    const Batch batch{*docs, 8};
    PlanOptions options;
    options.ranks_per_node = 4;
    absl::StatusOr<StepChoice> choice = PlanFlashCpByStepTime(batch, options, ModelShape{}, step);
    ASSERT_THAT(choice, IsOk());
    EXPECT_EQ(choice->candidates, 9);
    EXPECT_GE(choice->eligible, 1);
    ASSERT_THAT(ValidatePlan(choice->plan), IsOk());
    absl::StatusOr<Plan> plain = MakePlan(Strategy::kFlashCp, batch, options);
    ASSERT_THAT(plain, IsOk());
    absl::StatusOr<StepTimeReport> base =
        ReportStepTime(Strategy::kFlashCp, *plain, ModelShape{}, 1, step.cluster);
    ASSERT_THAT(base, IsOk());
    // The report is the chosen plan's, and never slower than flashcp's own.
    absl::StatusOr<StepTimeReport> again =
        ReportStepTime(Strategy::kFlashCp, choice->plan, ModelShape{}, 1, step.cluster);
    ASSERT_THAT(again, IsOk());
    EXPECT_EQ(again->native().step_seconds, choice->report.native().step_seconds);
    EXPECT_LE(choice->report.native().step_seconds, base->native().step_seconds);
    if (choice->variant == "flashcp") {
      EXPECT_EQ(choice->plan.shards, plain->shards);
    } else {
      ++improved;
      EXPECT_LT(choice->report.native().step_seconds, base->native().step_seconds);
    }
  }
  RecordProperty("improved", improved);
}

TEST(StepChoiceTest, StopsWhenAsked) {
  PlanOptions options;
  options.stop = StopToken([] { return absl::CancelledError("client went away"); });
  StepTimeOptions step;
  EXPECT_THAT(PlanFlashCpByStepTime(Batch{{100, 200, 300}, 2}, options, ModelShape{}, step),
              StatusIs(absl::StatusCode::kCancelled));
}

}  // namespace
}  // namespace flashcp::core
