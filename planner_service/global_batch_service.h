// flashcp.v1.GlobalBatchPlanner (proto/flashcp/v1/global_batch.proto): a
// thin adapter over core::PlanGlobalBatch (proto/global_batch.h). The request
// is converted on the gRPC thread (the replicas' options as Plan validates
// them, the caller's calibrated profile included), its answer's size bounded
// (proto::CheckGlobalBatchBounds: RESOURCE_EXHAUSTED above
// --max_response_bytes, before any planning), planned on the planner's
// pool (the ILP's pool for strategy ilp, which needs --allow_ilp) with a
// StopToken that stops when the call is cancelled or its deadline passes;
// errors map through the one absl -> grpc status mapping (proto/rpc/grpc_status.h).
#ifndef FLASHCP_PLANNER_SERVICE_GLOBAL_BATCH_SERVICE_H_
#define FLASHCP_PLANNER_SERVICE_GLOBAL_BATCH_SERVICE_H_

#include "flashcp/v1/global_batch.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "planner_service/service.h"

namespace flashcp::planner_service {

class GlobalBatchPlannerService final : public v1::GlobalBatchPlanner::CallbackService {
 public:
  // `deps` as PlannerService's; pool, clock and observer must be set and
  // outlive the service.
  explicit GlobalBatchPlannerService(ServiceDeps deps) : deps_(std::move(deps)) {}

  grpc::ServerUnaryReactor* PlanGlobalBatch(grpc::CallbackServerContext* context,
                                            const v1::PlanGlobalBatchRequest* request,
                                            v1::GlobalBatchPlan* response) override;

 private:
  ServiceDeps deps_;
};

}  // namespace flashcp::planner_service

#endif  // FLASHCP_PLANNER_SERVICE_GLOBAL_BATCH_SERVICE_H_
