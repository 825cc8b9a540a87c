#include "client/many_planner_client.h"

#include <chrono>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "proto/convert.h"
#include "proto/rpc/grpc_status.h"

namespace flashcp::client {

absl::StatusOr<v1::PlanManyResponse> ManyPlannerClient::PlanMany(
    const v1::PlanManyRequest& request, const CallOptions& options) const {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       absl::ToChronoMilliseconds(options.timeout));
  context.set_wait_for_ready(options.wait_for_ready);
  v1::PlanManyResponse response;
  const grpc::Status s = stub_->PlanMany(&context, request, &response);
  if (!s.ok()) return proto::rpc::FromGrpcStatus(s);
  return response;
}

absl::StatusOr<std::vector<absl::StatusOr<v1::PlanResponse>>> ManyPlannerClient::PlanEach(
    const std::vector<v1::PlanRequest>& requests, const CallOptions& options) const {
  v1::PlanManyRequest many;
  many.mutable_requests()->Reserve(static_cast<int>(requests.size()));
  for (const v1::PlanRequest& r : requests) *many.add_requests() = r;
  absl::StatusOr<v1::PlanManyResponse> answer = PlanMany(many, options);
  if (!answer.ok()) return answer.status();
  if (answer->responses_size() != many.requests_size()) {
    return absl::InternalError(absl::StrCat("PlanMany: ", answer->responses_size(),
                                            " answers to ", many.requests_size(), " requests"));
  }
  std::vector<absl::StatusOr<v1::PlanResponse>> out;
  out.reserve(requests.size());
  for (v1::PlanResponse& r : *answer->mutable_responses()) {
    if (r.has_error()) {
      out.emplace_back(proto::ErrorFromProto(r.error()));
    } else {
      out.emplace_back(std::move(r));
    }
  }
  return out;
}

}  // namespace flashcp::client
