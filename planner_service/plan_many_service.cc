#include "planner_service/plan_many_service.h"

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/status_macros.h"
#include "planner_service/pooled_unary_reactor.h"
#include "planner_service/service_calls.h"
#include "proto/convert.h"
#include "proto/plan_batch.h"
#include "proto/rpc/raw_message.h"

namespace flashcp::planner_service {
namespace {

// Plan's preparation of one item; ilp is refused here (it would hold the
// planning thread for seconds, and it has a pool of its own behind Plan).
absl::StatusOr<Prepared> PrepareItem(const v1::PlanRequest& request, const ServiceDeps& deps,
                                     const std::string& tenant) {
  absl::StatusOr<Prepared> prepared = PrepareParsed(request, deps, tenant);
  if (prepared.ok() && prepared->input.strategy == core::Strategy::kIlp) {
    return absl::UnimplementedError(
        "strategy: ilp is not planned by PlanMany (its plans take seconds); send it to Plan");
  }
  return prepared;
}

}  // namespace

absl::StatusOr<v1::PlanManyResponse> PlanEach(const ServiceDeps& deps, const std::string& tenant,
                                              const v1::PlanManyRequest& request,
                                              const core::StopToken& stop) {
  std::vector<absl::StatusOr<Prepared>> items;
  items.reserve(request.requests_size());
  int64_t bound = 0;
  for (const v1::PlanRequest& r : request.requests()) {
    items.push_back(PrepareItem(r, deps, tenant));
    if (items.back().ok()) bound += items.back()->response_bound;
  }
  const int64_t max_bytes = deps.config.bounds.max_response_bytes;
  if (bound > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "requests: the ", items.size(), " answers may take ", bound,
        " bytes together, above this server's --max_response_bytes (", max_bytes,
        "); send fewer per call"));
  }
  v1::PlanManyResponse out;
  out.mutable_responses()->Reserve(request.requests_size());
  for (size_t i = 0; i < items.size(); ++i) {
    FLASHCP_RETURN_IF_ERROR(stop.Check());
    const uint64_t batch_id = request.requests(static_cast<int>(i)).batch_id();
    if (!items[i].ok()) {
      *out.add_responses() = proto::ErrorResponseToProto(batch_id, items[i].status());
      continue;
    }
    proto::PlanInput& input = items[i]->input;
    input.options.stop = stop;
    absl::StatusOr<v1::PlanResponse> planned = proto::PlanBatch(input, *deps.clock, *deps.observer);
    if (planned.ok()) {
      *out.add_responses() = *std::move(planned);
      continue;
    }
    FLASHCP_RETURN_IF_ERROR(stop.Check());  // stopped: nobody reads the answers
    *out.add_responses() = proto::ErrorResponseToProto(batch_id, planned.status());
  }
  return out;
}

grpc::ServerUnaryReactor* ManyPlannerService::PlanMany(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request,
                                                       grpc::ByteBuffer* response) {
  const absl::Time received = deps_.clock->Now();
  auto* reactor = new PooledUnaryReactor<grpc::ByteBuffer>(deps_, "PlanMany", received, response);
  v1::PlanManyRequest many;
  grpc::ByteBuffer bytes(*request);  // shares the slices
  if (absl::Status parsed = proto::rpc::ParseRaw(&bytes, &many); !parsed.ok()) {
    reactor->Reject(parsed);
    return reactor;
  }
  if (many.requests_size() == 0) {
    reactor->Reject(absl::InvalidArgumentError(
        absl::StrCat("requests: empty; send 1 to ", kMaxPlansPerCall, " PlanRequests")));
    return reactor;
  }
  if (many.requests_size() > kMaxPlansPerCall) {
    reactor->Reject(absl::ResourceExhaustedError(absl::StrCat(
        "requests: ", many.requests_size(), " in one call, above ", kMaxPlansPerCall,
        "; send fewer per call")));
    return reactor;
  }
  reactor->Start(deps_.pool, context->peer(),
                 [deps = &deps_, tenant = CallerOf(*context).calibration.tenant,
                  many = std::move(many), stop = CallStopToken(context, deps_.clock, received)]()
                     -> absl::StatusOr<grpc::ByteBuffer> {
                   FLASHCP_ASSIGN_OR_RETURN(const v1::PlanManyResponse answers,
                                            PlanEach(*deps, tenant, many, stop));
                   return Serialize(answers);
                 });
  return reactor;
}

}  // namespace flashcp::planner_service
