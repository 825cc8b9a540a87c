// flashcp.v1.ManyPlanner (proto/flashcp/v1/plan_many.proto): several
// PlanRequests in one call, a thin adapter like Plan's. The message is
// parsed and its size checked on the gRPC thread; one job on the planner's
// pool then prepares every item as Plan does (service_calls.h's
// PrepareParsed), plans them in order (proto::PlanBatch) and serializes the
// answer, so that gRPC's work per call and the hop to a planning thread are
// paid once for all the items. The call's StopToken stops it when the call
// is cancelled or its deadline passes. Errors map through the one absl ->
// grpc status mapping (proto/rpc/grpc_status.h).
#ifndef FLASHCP_PLANNER_SERVICE_PLAN_MANY_SERVICE_H_
#define FLASHCP_PLANNER_SERVICE_PLAN_MANY_SERVICE_H_

#include <string>

#include "absl/status/statusor.h"
#include "core/strategies.h"
#include "flashcp/v1/plan_many.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "planner_service/service.h"

namespace flashcp::planner_service {

// Requests one PlanMany call may carry: one call holds one planning thread
// for all of them, so this bounds how long it keeps others waiting.
inline constexpr int kMaxPlansPerCall = 256;

// One call's items, on a planning thread: each prepared as Plan prepares its
// request (for `tenant`'s calibration) and planned in order; an item that
// fails answers with PlanResponse.error. The call's own errors:
// RESOURCE_EXHAUSTED naming `requests` when the answers' bounds together pass
// deps.config.bounds.max_response_bytes; `stop`'s status once it says stop.
absl::StatusOr<v1::PlanManyResponse> PlanEach(const ServiceDeps& deps, const std::string& tenant,
                                              const v1::PlanManyRequest& request,
                                              const core::StopToken& stop);

class ManyPlannerService final
    : public v1::ManyPlanner::WithRawCallbackMethod_PlanMany<v1::ManyPlanner::Service> {
 public:
  // `deps` as PlannerService's; pool, clock and observer must be set and
  // outlive the service.
  explicit ManyPlannerService(ServiceDeps deps) : deps_(std::move(deps)) {}

  grpc::ServerUnaryReactor* PlanMany(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;

 private:
  const ServiceDeps deps_;
};

}  // namespace flashcp::planner_service

#endif  // FLASHCP_PLANNER_SERVICE_PLAN_MANY_SERVICE_H_
