// The C++ client of flashcp.v1.PipelinePlanner (proto/flashcp/v1/pipeline.proto):
// pipeline plans over a gRPC channel (MakeChannel's, or a test's). One call,
// no retries: a caller that wants them wraps the call.
#ifndef FLASHCP_CLIENT_PIPELINE_PLANNER_CLIENT_H_
#define FLASHCP_CLIENT_PIPELINE_PLANNER_CLIENT_H_

#include <memory>

#include "absl/status/statusor.h"
#include "client/planner_client.h"
#include "core/pipeline.h"
#include "flashcp/v1/pipeline.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace flashcp::client {

class PipelinePlannerClient {
 public:
  explicit PipelinePlannerClient(std::shared_ptr<grpc::Channel> channel)
      : stub_(v1::PipelinePlanner::NewStub(std::move(channel))) {}

  // The server's status as an absl::Status (proto::rpc::FromGrpcStatus): e.g.
  // INVALID_ARGUMENT naming the field, FAILED_PRECONDITION when nothing fits.
  absl::StatusOr<v1::PipelinePlan> PlanPipeline(const v1::PlanPipelineRequest& request,
                                                const CallOptions& options = {}) const;

  // The same, as core structs (proto/pipeline_convert.h): the request's
  // fields and `strategy`, the plan back with its prediction's summary.
  absl::StatusOr<core::PipelinePlan> PlanPipeline(const core::PipelineRequest& request,
                                                  core::PipelineStrategy strategy,
                                                  const CallOptions& options = {}) const;

 private:
  std::unique_ptr<v1::PipelinePlanner::Stub> stub_;
};

}  // namespace flashcp::client

#endif  // FLASHCP_CLIENT_PIPELINE_PLANNER_CLIENT_H_
