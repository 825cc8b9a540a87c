// The C++ client of flashcp.v1.GlobalBatchPlanner (proto/flashcp/v1/
// global_batch.proto): one global batch over DP replicas, over a gRPC channel
// (MakeChannel's, or a test's). One call, no retries: a caller that wants
// them wraps the call.
#ifndef FLASHCP_CLIENT_GLOBAL_BATCH_PLANNER_CLIENT_H_
#define FLASHCP_CLIENT_GLOBAL_BATCH_PLANNER_CLIENT_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "client/planner_client.h"
#include "core/global_batch.h"
#include "flashcp/v1/global_batch.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace flashcp::client {

class GlobalBatchPlannerClient {
 public:
  explicit GlobalBatchPlannerClient(std::shared_ptr<grpc::Channel> channel)
      : stub_(v1::GlobalBatchPlanner::NewStub(std::move(channel))) {}

  // The server's status as an absl::Status (proto::rpc::FromGrpcStatus): e.g.
  // INVALID_ARGUMENT naming the field, FAILED_PRECONDITION naming doc_lens
  // where the documents do not fit the replicas whole.
  absl::StatusOr<v1::GlobalBatchPlan> PlanGlobalBatch(const v1::PlanGlobalBatchRequest& request,
                                                      const CallOptions& options = {}) const;

  // The same from core structs: `doc_lens` over options.dp_size replicas of
  // options.cp_size ranks, options.context tokens each, with options.strategy
  // and options.plan (RequestToProto's fields; the default model shape). The
  // answer back in core form (proto::GlobalBatchPlanFromProto).
  absl::StatusOr<core::GlobalBatchPlan> PlanGlobalBatch(const std::vector<int64_t>& doc_lens,
                                                        const core::GlobalBatchOptions& options,
                                                        uint64_t batch_id = 0,
                                                        const CallOptions& call = {}) const;

 private:
  std::unique_ptr<v1::GlobalBatchPlanner::Stub> stub_;
};

}  // namespace flashcp::client

#endif  // FLASHCP_CLIENT_GLOBAL_BATCH_PLANNER_CLIENT_H_
