#include "planner_service/plan_batch.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "core/analysis.h"
#include "core/ilp/ilp.h"
#include "core/status_macros.h"
#include "core/strategies.h"

namespace flashcp::planner_service {

absl::StatusOr<int64_t> CheckPlanBounds(const proto::PlanInput& input, const PlanBounds& bounds) {
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
  const int64_t bytes = proto::MaxResponseBytes(input, shards);
  if (bytes > bounds.max_response_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "planner: the response may take up to ", bytes, " bytes", 
        input.include_layout ? " with include_layout" : "", ", above --max_response_bytes = ",
        bounds.max_response_bytes, "; plan a smaller batch",
        input.include_layout ? " or leave include_layout off" : ""));
  }
  return bytes;
}

absl::StatusOr<v1::PlanResponse> PlanBatch(const proto::PlanInput& input, const core::Clock& clock,
                                           ServiceObserver& observer) {
  const absl::Time start = clock.Now();
  core::PlanOptions options = input.options;
  options.ilp.solver = core::ilp::Solve;  // the planner links the ILP
  core::PlanInfo info;
  FLASHCP_ASSIGN_OR_RETURN(const core::Plan plan,
                           core::MakePlan(input.strategy, input.batch, options, &info));
  FLASHCP_RETURN_IF_ERROR(input.options.stop.Check());
  FLASHCP_ASSIGN_OR_RETURN(const core::PlanMetrics metrics,
                           core::AnalyzePlan(plan, input.shape, input.options.ranks_per_node));
  std::optional<core::CommLayout> layout;
  if (input.include_layout) {
    FLASHCP_RETURN_IF_ERROR(input.options.stop.Check());
    FLASHCP_ASSIGN_OR_RETURN(layout, core::BuildCommLayout(plan));
  }
  const core::PlanCostReport cost{input.cost_profile, input.options.cost, input.cost_calibrated,
                                  core::PredictPlanCost(input.options.cost, plan,
                                                        input.options.rank_speed)};
  const double seconds = absl::ToDoubleSeconds(clock.Now() - start);
  observer.OnPlanned(input.strategy, seconds, metrics);
  return proto::ResponseToProto(input.batch_id, input.strategy, plan, metrics,
                                layout ? &*layout : nullptr, seconds,
                                input.strategy == core::Strategy::kIlp ? &info : nullptr, &cost);
}

}  // namespace flashcp::planner_service
