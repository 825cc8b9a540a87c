// The planning step of the service: one validated request in, one response
// out. Runs on a planning-pool thread; pure apart from the clock it is given
// and the observer it reports to.
#ifndef FLASHCP_PLANNER_SERVICE_PLAN_BATCH_H_
#define FLASHCP_PLANNER_SERVICE_PLAN_BATCH_H_

#include "absl/status/statusor.h"
#include "flashcp/v1/planner.pb.h"
#include "planner_service/clock.h"
#include "planner_service/observer.h"
#include "proto/convert.h"

namespace flashcp::planner_service {

// core::MakePlan, core::AnalyzePlan and (if asked) core::BuildCommLayout,
// converted to a response whose metrics.planning_seconds is the `clock` time
// those took. Errors are the core's, unchanged (e.g. Unimplemented for a
// strategy not built yet). On success reports observer.OnPlanned.
absl::StatusOr<v1::PlanResponse> PlanBatch(const proto::PlanInput& input, const Clock& clock,
                                           ServiceObserver& observer);

}  // namespace flashcp::planner_service

#endif  // FLASHCP_PLANNER_SERVICE_PLAN_BATCH_H_
