// The global-batch mode's planning step (issue 27): a converted
// flashcp.v1.PlanGlobalBatchRequest (proto/global_batch_convert.h) ->
// core::PlanGlobalBatch -> flashcp.v1.GlobalBatchPlan. Beside PlanBatch, in
// flashcp_proto; like PlanBatch it runs the ILP only through the solver the
// caller sets (input.replica.options.ilp.solver). Pure apart from the clock it
// is given.
#ifndef FLASHCP_PROTO_GLOBAL_BATCH_H_
#define FLASHCP_PROTO_GLOBAL_BATCH_H_

#include "absl/status/statusor.h"
#include "core/clock.h"
#include "flashcp/v1/global_batch.pb.h"
#include "proto/global_batch_convert.h"
#include "proto/plan_batch.h"

namespace flashcp::proto {

// MaxGlobalBatchResponseBytes(input), or RESOURCE_EXHAUSTED naming dp_size,
// cp_size, the documents and --max_response_bytes where it passes
// bounds.max_response_bytes (the server's largest answer). Before planning.
absl::StatusOr<int64_t> CheckGlobalBatchBounds(const GlobalBatchInput& input,
                                               const PlanBounds& bounds);

// core::PlanGlobalBatch (strategy ilp through the caller's solver; stopping on
// input.replica.options.stop between replicas' analyses), each replica's
// plan analysed (AnalyzePlan, PredictPlanCost) into a PlanResponse as Plan
// answers it; planning_seconds is the `clock` time all that took. Errors are
// the core's, unchanged.
absl::StatusOr<v1::GlobalBatchPlan> PlanGlobalBatchRequest(const GlobalBatchInput& input,
                                                           const core::Clock& clock);

}  // namespace flashcp::proto

#endif  // FLASHCP_PROTO_GLOBAL_BATCH_H_
