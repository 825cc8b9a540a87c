#include "proto/plan_batch.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/analysis.h"
#include "core/group_schemes.h"
#include "core/status_macros.h"
#include "core/step_choice.h"
#include "core/step_time.h"
#include "core/strategies.h"

namespace flashcp::proto {

absl::StatusOr<int64_t> CheckPlanBounds(const PlanInput& input, const PlanBounds& bounds) {
  const int64_t shards =
      core::MaxPlanShards(input.strategy, input.batch, input.options.attention_mask);
  const int64_t ranks = input.batch.cp_size;
  // shards <= 2^40 and ranks <= 2^16: no overflow.
  if (shards * ranks > bounds.max_shard_ranks) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "planner: ", core::StrategyName(input.strategy), " may cut this batch into up to ", shards,
        " shards; x ", ranks, " ranks = ", shards * ranks, ", above --max_shard_ranks = ",
        bounds.max_shard_ranks, "; plan fewer documents or tokens, or a smaller cp_size"));
  }
  const int64_t bytes = MaxResponseBytes(input, shards);
  if (bytes > bounds.max_response_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "planner: the response may take up to ", bytes, " bytes", 
        input.include_layout ? " with include_layout" : "", ", above --max_response_bytes = ",
        bounds.max_response_bytes, "; plan a smaller batch",
        input.include_layout ? " or leave include_layout off" : ""));
  }
  return bytes;
}

absl::StatusOr<v1::PlanResponse> PlanBatch(const PlanInput& input, const core::Clock& clock,
                                           PlanObserver& observer) {
  const absl::Time start = clock.Now();
  const core::PlanOptions& options = input.options;  // ilp: the caller's solver
  core::PlanInfo info;
  std::optional<core::StepTimeReport> step;
  // choose_schemes: the plan (flashcp's or basp's) and its groups' schemes;
  // else choose_by_step_time: flashcp's variant of least predicted step.
  std::optional<core::GroupSchemePlan> chosen;
  core::Plan plan;
  if (input.choose_schemes) {
    FLASHCP_ASSIGN_OR_RETURN(chosen, core::PlanWithGroupSchemes(input.strategy, input.batch,
                                                                 options, input.shape,
                                                                 input.inter_node_weight));
    plan = chosen->plan;
  } else if (input.choose_by_step_time && input.step_time.has_value() &&
             input.strategy == core::Strategy::kFlashCp) {
    FLASHCP_ASSIGN_OR_RETURN(
        core::StepChoice choice,
        core::PlanFlashCpByStepTime(input.batch, options, input.shape, *input.step_time));
    plan = std::move(choice.plan);
    step = std::move(choice.report);
  } else {
    FLASHCP_ASSIGN_OR_RETURN(plan, core::MakePlan(input.strategy, input.batch, options, &info));
  }
  FLASHCP_RETURN_IF_ERROR(input.options.stop.Check());
  FLASHCP_ASSIGN_OR_RETURN(
      const core::PlanMetrics metrics,
      chosen ? absl::StatusOr<core::PlanMetrics>(chosen->metrics)
             : core::AnalyzePlan(plan, input.shape, input.options.ranks_per_node));
  std::optional<core::CommLayout> layout;
  if (input.include_layout) {
    FLASHCP_RETURN_IF_ERROR(input.options.stop.Check());
    FLASHCP_ASSIGN_OR_RETURN(layout, core::BuildCommLayout(plan));
  }
  const core::PlanCostReport cost{input.cost_profile, input.options.cost, input.cost_calibrated,
                                  core::PredictPlanCost(input.options.cost, plan,
                                                        input.options.rank_speed)};
  if (input.step_time.has_value() && !step.has_value()) {
    FLASHCP_ASSIGN_OR_RETURN(
        step, core::ReportStepTime(input.strategy, plan, input.shape, input.step_time->layers,
                                   input.step_time->cluster, input.step_time->cluster_name));
  }
  const double seconds = absl::ToDoubleSeconds(clock.Now() - start);
  observer.OnPlanned(input.strategy, seconds, metrics);
  v1::PlanResponse response = ResponseToProto(
      input.batch_id, input.strategy, plan, metrics, layout ? &*layout : nullptr, seconds,
      input.strategy == core::Strategy::kIlp ? &info : nullptr, &cost);
  if (chosen) GroupSchemesToProto(*chosen, &response);
  if (step.has_value()) {
    StepTimeToProto(*step, input.step_time->per_rank, response.mutable_metrics());
  }
  return response;
}

absl::StatusOr<std::string> SerializeResponse(const v1::PlanResponse& response,
                                              int64_t max_bytes) {
  const int64_t limit = std::min(max_bytes, kMaxSerializedBytes);
  const int64_t size = static_cast<int64_t>(response.ByteSizeLong());
  if (size > limit) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "response: ", size, " bytes, above the ", limit, " bytes it may take"));
  }
  std::string out;
  if (!response.SerializeToString(&out)) {
    return absl::InternalError(absl::StrCat("response: cannot serialize ", size, " bytes"));
  }
  return out;
}

}  // namespace flashcp::proto
