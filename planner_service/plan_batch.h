// The planning step of the service: one validated request in, one response
// out. Runs on a planning-pool thread; pure apart from the clock it is given
// and the observer it reports to.
#ifndef FLASHCP_PLANNER_SERVICE_PLAN_BATCH_H_
#define FLASHCP_PLANNER_SERVICE_PLAN_BATCH_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "flashcp/v1/planner.pb.h"
#include "core/clock.h"
#include "planner_service/observer.h"
#include "proto/convert.h"

namespace flashcp::planner_service {

// Bounds on one plan's work and answer, checked from the request alone
// before planning (docs/deploy.md, "Trust and limits").
struct PlanBounds {
  // Shards x ranks the plan may reach (core::MaxPlanShards x cp_size): the
  // analysis and the layout cost about this much time and memory.
  int64_t max_shard_ranks = int64_t{1} << 30;  // --max_shard_ranks
  // The serialized response (proto::MaxResponseBytes); clients refuse large
  // answers (the Python client at 256 MiB).
  int64_t max_response_bytes = int64_t{64} << 20;  // --max_response_bytes
};

// The response bytes `input`'s answer may take (proto::MaxResponseBytes),
// or RESOURCE_EXHAUSTED naming the bound and its flag when the plan may pass
// `bounds`.
absl::StatusOr<int64_t> CheckPlanBounds(const proto::PlanInput& input, const PlanBounds& bounds);

// core::MakePlan, core::AnalyzePlan, core::PredictPlanCost under the
// input's cost model and (if asked) core::BuildCommLayout, converted to a
// response whose metrics.planning_seconds is the `clock` time
// those took. Errors are the core's, unchanged (e.g. Unimplemented for a
// strategy not built yet; input.options.stop's status once it says stop, also
// between the steps). On success reports observer.OnPlanned.
absl::StatusOr<v1::PlanResponse> PlanBatch(const proto::PlanInput& input, const core::Clock& clock,
                                           ServiceObserver& observer);

// `response` serialized; ResourceExhausted (naming both sizes) when it is
// larger than `max_bytes`, and never above protobuf's 2 GiB limit, where its
// serializer fails (and would leave an empty PlanResponse behind).
inline constexpr int64_t kMaxSerializedBytes = (int64_t{1} << 31) - 1;
absl::StatusOr<std::string> SerializeResponse(const v1::PlanResponse& response,
                                              int64_t max_bytes = kMaxSerializedBytes);

}  // namespace flashcp::planner_service

#endif  // FLASHCP_PLANNER_SERVICE_PLAN_BATCH_H_
