// flashcp.v1.PipelinePlanner (proto/flashcp/v1/pipeline.proto): a thin
// adapter over core::PlanPipeline. Requests are converted
// (proto/pipeline_convert.h), planned on the planner's pool with the CBC
// checkpoint ILP and a StopToken that stops when the call is cancelled or its
// deadline passes, and converted back; errors map through the one
// absl -> grpc status mapping (proto/rpc/grpc_status.h).
#ifndef FLASHCP_PLANNER_SERVICE_PIPELINE_SERVICE_H_
#define FLASHCP_PLANNER_SERVICE_PIPELINE_SERVICE_H_

#include "flashcp/v1/pipeline.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "planner_service/service.h"

namespace flashcp::planner_service {

// The checkpoint ILP's CBC limit per plan, at most the server's ILP limit.
inline constexpr double kPipelineCkptSeconds = 5;

class PipelinePlannerService final : public v1::PipelinePlanner::CallbackService {
 public:
  // `deps` as PlannerService's; pool, clock and observer must be set and
  // outlive the service.
  explicit PipelinePlannerService(ServiceDeps deps) : deps_(std::move(deps)) {}

  grpc::ServerUnaryReactor* PlanPipeline(grpc::CallbackServerContext* context,
                                         const v1::PlanPipelineRequest* request,
                                         v1::PipelinePlan* response) override;
  grpc::ServerBidiReactor<v1::PlanPipelineRequest, v1::PipelinePlan>* PlanPipelineStream(
      grpc::CallbackServerContext* context) override;

 private:
  ServiceDeps deps_;
};

}  // namespace flashcp::planner_service

#endif  // FLASHCP_PLANNER_SERVICE_PIPELINE_SERVICE_H_
