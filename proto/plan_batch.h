// The planning step of the service and of flashcp.plan in process: one
// validated request in, one response out, under the service's bounds. Runs on
// a planning-pool thread (or the caller's); pure apart from the clock it is
// given and the observer it reports to. In flashcp_proto, beside the
// converter, so that the Python extension plans as the planner does without
// linking the planner service, gRPC or CBC: the `ilp` strategy runs the
// solver the caller sets in input.options.ilp.solver (the planner service
// sets core::ilp::Solve; unset, MakePlan says FailedPrecondition).
#ifndef FLASHCP_PROTO_PLAN_BATCH_H_
#define FLASHCP_PROTO_PLAN_BATCH_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "core/analysis.h"
#include "core/clock.h"
#include "core/strategies.h"
#include "core/types.h"
#include "flashcp/v1/planner.pb.h"
#include "proto/convert.h"

namespace flashcp::proto {

// The batch bounds a planner enforces unless told otherwise (flashcp-planner's
// --max_docs, --max_tokens and --max_cp_size default to these, through
// ServerOptions; flashcp.plan in process too); core::BatchLimits{} is the
// model's own ceiling, far above.
inline constexpr core::BatchLimits kDefaultBatchLimits{65536, int64_t{1} << 24, 1024};

// What PlanBatch reports: one successful plan, its planning and analysis time
// and its quality. The service's observer (planner_service/observer.h) is
// one; implementations must be thread-safe (planning threads call it).
class PlanObserver {
 public:
  virtual ~PlanObserver() = default;
  virtual void OnPlanned(core::Strategy strategy, double planning_seconds,
                         const core::PlanMetrics& metrics) = 0;
};

// Reports nothing.
class NullPlanObserver final : public PlanObserver {
 public:
  void OnPlanned(core::Strategy, double, const core::PlanMetrics&) override {}
};

// Bounds on one plan's work and answer, checked from the request alone
// before planning (docs/deploy.md, "Trust and limits").
struct PlanBounds {
  // Shards x ranks the plan may reach (core::MaxPlanShards x cp_size): the
  // analysis and the layout cost about this much time and memory.
  int64_t max_shard_ranks = int64_t{1} << 30;  // --max_shard_ranks
  // The serialized response (MaxResponseBytes); clients refuse large
  // answers (the Python client at 256 MiB).
  int64_t max_response_bytes = int64_t{64} << 20;  // --max_response_bytes
};

// The response bytes `input`'s answer may take (MaxResponseBytes),
// or RESOURCE_EXHAUSTED naming the bound and its flag when the plan may pass
// `bounds`.
absl::StatusOr<int64_t> CheckPlanBounds(const PlanInput& input, const PlanBounds& bounds);

// core::MakePlan, core::AnalyzePlan, core::PredictPlanCost under the
// input's cost model and (if asked) core::BuildCommLayout, converted to a
// response whose metrics.planning_seconds is the `clock` time
// those took. Errors are the core's, unchanged (e.g. Unimplemented for a
// strategy not built yet; FailedPrecondition for `ilp` when
// input.options.ilp.solver is unset, or the solver's own status;
// input.options.stop's status once it says stop, also between the steps).
// On success reports observer.OnPlanned.
absl::StatusOr<v1::PlanResponse> PlanBatch(const PlanInput& input, const core::Clock& clock,
                                           PlanObserver& observer);

// `response` serialized; ResourceExhausted (naming both sizes) when it is
// larger than `max_bytes`, and never above protobuf's 2 GiB limit, where its
// serializer fails (and would leave an empty PlanResponse behind).
inline constexpr int64_t kMaxSerializedBytes = (int64_t{1} << 31) - 1;
absl::StatusOr<std::string> SerializeResponse(const v1::PlanResponse& response,
                                              int64_t max_bytes = kMaxSerializedBytes);

}  // namespace flashcp::proto

#endif  // FLASHCP_PROTO_PLAN_BATCH_H_
