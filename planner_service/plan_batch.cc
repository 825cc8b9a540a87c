#include "planner_service/plan_batch.h"

#include <optional>

#include "core/analysis.h"
#include "core/status_macros.h"
#include "core/strategies.h"

namespace flashcp::planner_service {

absl::StatusOr<v1::PlanResponse> PlanBatch(const proto::PlanInput& input, const Clock& clock,
                                           ServiceObserver& observer) {
  const absl::Time start = clock.Now();
  FLASHCP_ASSIGN_OR_RETURN(const core::Plan plan,
                           core::MakePlan(input.strategy, input.batch, input.options));
  FLASHCP_ASSIGN_OR_RETURN(const core::PlanMetrics metrics, core::AnalyzePlan(plan, input.shape, input.options.ranks_per_node));
  std::optional<core::CommLayout> layout;
  if (input.include_layout) {
    FLASHCP_ASSIGN_OR_RETURN(layout, core::BuildCommLayout(plan));
  }
  const double seconds = absl::ToDoubleSeconds(clock.Now() - start);
  observer.OnPlanned(input.strategy, seconds, metrics);
  return proto::ResponseToProto(input.batch_id, input.strategy, plan, metrics,
                                layout ? &*layout : nullptr, seconds);
}

}  // namespace flashcp::planner_service
