#include "planner_service/global_batch_service.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "core/ilp/ilp.h"
#include "core/status_macros.h"
#include "proto/global_batch.h"
#include "planner_service/pooled_unary_reactor.h"
#include "planner_service/service_calls.h"

namespace flashcp::planner_service {
namespace {

// The request converted and checked, on the gRPC thread.
absl::StatusOr<proto::GlobalBatchInput> Prepare(const ServiceDeps& deps,
                                                grpc::CallbackServerContext* context,
                                                const v1::PlanGlobalBatchRequest& request,
                                                absl::Time received) {
  proto::CostResolver resolve;
  if (deps.calibration != nullptr) {
    resolve = [&deps, tenant = CallerOf(*context).calibration.tenant](
                  absl::string_view profile) { return deps.calibration->Resolve(tenant, profile); };
  }
  FLASHCP_ASSIGN_OR_RETURN(proto::GlobalBatchInput input,
                           proto::GlobalBatchRequestFromProto(request, deps.config.limits, resolve));
  // The answer's size, bounded from the request before any planning.
  FLASHCP_RETURN_IF_ERROR(proto::CheckGlobalBatchBounds(input, deps.config.bounds).status());
  if (input.replica.strategy == core::Strategy::kIlp && !deps.config.allow_ilp) {
    return absl::UnimplementedError(
        "plan.strategy: ilp is disabled on this server (start it with --allow_ilp)");
  }
  SetIlpBudget(deps, received, input.replica);
  input.replica.options.ilp.solver = core::ilp::Solve;  // this binary links the ILP
  input.replica.options.stop = CallStopToken(context, deps.clock, received);
  return input;
}

}  // namespace

grpc::ServerUnaryReactor* GlobalBatchPlannerService::PlanGlobalBatch(
    grpc::CallbackServerContext* context, const v1::PlanGlobalBatchRequest* request,
    v1::GlobalBatchPlan* response) {
  auto* reactor = new PooledUnaryReactor<v1::GlobalBatchPlan>(deps_, "PlanGlobalBatch",
                                                              deps_.clock->Now(), response);
  absl::StatusOr<proto::GlobalBatchInput> input =
      Prepare(deps_, context, *request, reactor->received());
  if (!input.ok()) {
    reactor->Reject(input.status());
    return reactor;
  }
  PlanningPool* pool = PoolFor(deps_, input->replica.strategy);
  reactor->Start(pool, context->peer(), [clock = deps_.clock, in = *std::move(input)] {
    return proto::PlanGlobalBatchRequest(in, *clock);
  });
  return reactor;
}

}  // namespace flashcp::planner_service
