// The C++ client of flashcp.v1.ManyPlanner (proto/flashcp/v1/plan_many.proto):
// several PlanRequests in one call, answered in order, over a gRPC channel
// (MakeChannel's, or a test's). One call, no retries: a caller that wants
// them wraps the call.
#ifndef FLASHCP_CLIENT_MANY_PLANNER_CLIENT_H_
#define FLASHCP_CLIENT_MANY_PLANNER_CLIENT_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "client/planner_client.h"
#include "flashcp/v1/plan_many.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace flashcp::client {

class ManyPlannerClient {
 public:
  explicit ManyPlannerClient(std::shared_ptr<grpc::Channel> channel)
      : stub_(v1::ManyPlanner::NewStub(std::move(channel))) {}

  // The server's answer: responses[i] for requests[i], each a plan or its
  // item's error (PlanResponse.error). The call's status as an absl::Status
  // (proto::rpc::FromGrpcStatus): e.g. INVALID_ARGUMENT for no requests,
  // RESOURCE_EXHAUSTED for too many.
  absl::StatusOr<v1::PlanManyResponse> PlanMany(const v1::PlanManyRequest& request,
                                                const CallOptions& options = {}) const;

  // The same with each answer as a status: an item's error becomes its
  // status (proto::ErrorFromProto: code and message), as Plan would have
  // returned it.
  absl::StatusOr<std::vector<absl::StatusOr<v1::PlanResponse>>> PlanEach(
      const std::vector<v1::PlanRequest>& requests, const CallOptions& options = {}) const;

 private:
  std::unique_ptr<v1::ManyPlanner::Stub> stub_;
};

}  // namespace flashcp::client

#endif  // FLASHCP_CLIENT_MANY_PLANNER_CLIENT_H_
