#include "planner_service/global_batch_service.h"

#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/ilp/ilp.h"
#include "core/status_macros.h"
#include "proto/global_batch.h"
#include "proto/rpc/grpc_status.h"
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
  if (input.replica.strategy == core::Strategy::kIlp && !deps.config.allow_ilp) {
    return absl::UnimplementedError(
        "plan.strategy: ilp is disabled on this server (start it with --allow_ilp)");
  }
  SetIlpBudget(deps, received, input.replica);
  input.replica.options.ilp.solver = core::ilp::Solve;  // this binary links the ILP
  const core::Clock* clock = deps.clock;
  input.replica.options.stop = core::StopToken([context, clock, received] {
    return context->IsCancelled() ? DroppedStatus(*context, *clock, received) : absl::OkStatus();
  });
  return input;
}

// One call: planned on the pool; Finish exactly once (on a bad request or
// admission failure, from the job, or from OnCancel while still queued).
class Reactor final : public grpc::ServerUnaryReactor {
 public:
  Reactor(const ServiceDeps& deps, grpc::CallbackServerContext* context,
          const v1::PlanGlobalBatchRequest* request, v1::GlobalBatchPlan* response)
      : deps_(deps), response_(response), received_(deps.clock->Now()) {
    deps_.observer->OnInflightChange(+1);
    absl::StatusOr<proto::GlobalBatchInput> input = Prepare(deps_, context, *request, received_);
    if (!input.ok()) {
      FinishWith(input.status());
      return;
    }
    input_ = *std::move(input);
    absl::Status admitted;
    {
      absl::MutexLock lock(&mu_);
      absl::StatusOr<PlanningPool::Ticket> ticket =
          PoolFor(deps_, input_.replica.strategy)->Submit([this] { RunJob(); }, context->peer());
      if (ticket.ok()) {
        ticket_ = *ticket;
      } else {
        admitted = ticket.status();
      }
    }
    if (!admitted.ok()) FinishWith(admitted);
  }

  void OnCancel() override {
    bool dropped = false;
    {
      absl::MutexLock lock(&mu_);
      dropped = ticket_.has_value() &&
                PoolFor(deps_, input_.replica.strategy)->Cancel(*ticket_);
    }
    if (dropped) FinishWith(absl::CancelledError("planner: the call was cancelled while queued"));
  }

  void OnDone() override { delete this; }

 private:
  void RunJob() {
    absl::StatusOr<v1::GlobalBatchPlan> plan = proto::PlanGlobalBatchRequest(input_, *deps_.clock);
    if (plan.ok()) *response_ = *std::move(plan);
    FinishWith(plan.status());
  }

  void FinishWith(const absl::Status& status) {
    deps_.observer->OnRequestDone("PlanGlobalBatch", status.code(),
                                  absl::ToDoubleSeconds(deps_.clock->Now() - received_));
    deps_.observer->OnInflightChange(-1);
    Finish(proto::rpc::ToGrpcStatus(status));
  }

  const ServiceDeps& deps_;
  v1::GlobalBatchPlan* const response_;
  const absl::Time received_;
  proto::GlobalBatchInput input_;
  absl::Mutex mu_;
  std::optional<PlanningPool::Ticket> ticket_;
};

}  // namespace

grpc::ServerUnaryReactor* GlobalBatchPlannerService::PlanGlobalBatch(
    grpc::CallbackServerContext* context, const v1::PlanGlobalBatchRequest* request,
    v1::GlobalBatchPlan* response) {
  return new Reactor(deps_, context, request, response);
}

}  // namespace flashcp::planner_service
