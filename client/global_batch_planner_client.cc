#include "client/global_batch_planner_client.h"

#include <chrono>

#include "absl/time/time.h"
#include "core/analysis.h"
#include "core/types.h"
#include "proto/convert.h"
#include "proto/global_batch_convert.h"
#include "proto/rpc/grpc_status.h"

namespace flashcp::client {

absl::StatusOr<v1::GlobalBatchPlan> GlobalBatchPlannerClient::PlanGlobalBatch(
    const v1::PlanGlobalBatchRequest& request, const CallOptions& options) const {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       absl::ToChronoMilliseconds(options.timeout));
  context.set_wait_for_ready(options.wait_for_ready);
  v1::GlobalBatchPlan plan;
  const grpc::Status s = stub_->PlanGlobalBatch(&context, request, &plan);
  if (!s.ok()) return proto::rpc::FromGrpcStatus(s);
  return plan;
}

absl::StatusOr<core::GlobalBatchPlan> GlobalBatchPlannerClient::PlanGlobalBatch(
    const std::vector<int64_t>& doc_lens, const core::GlobalBatchOptions& options,
    uint64_t batch_id, const CallOptions& call) const {
  const v1::PlanRequest plan =
      proto::RequestToProto(batch_id, core::Batch{{}, options.cp_size}, options.strategy,
                            options.plan, core::ModelShape{}, /*include_layout=*/false);
  absl::StatusOr<v1::GlobalBatchPlan> answer = PlanGlobalBatch(
      proto::GlobalBatchRequestToProto(batch_id, doc_lens, options.dp_size, options.context, plan),
      call);
  if (!answer.ok()) return answer.status();
  return proto::GlobalBatchPlanFromProto(*answer);
}

}  // namespace flashcp::client
