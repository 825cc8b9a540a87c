#include "planner_service/service.h"

#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "planner_service/plan_stream.h"
#include "planner_service/service_calls.h"
#include "proto/convert.h"
#include "proto/plan_batch.h"
#include "proto/rpc/grpc_status.h"

// The service's calls by file: Plan here; PlanStream in plan_stream.cc;
// ListStrategies, GetServerInfo and ReportStepTimes in service_info.cc; what
// they share in service_calls.h.
namespace flashcp::planner_service {
namespace {

// One unary Plan call. Lives from Plan() until OnDone(); Finish() is called
// exactly once: on a validation or admission error (gRPC thread), from the
// planning job (pool thread), or from OnCancel when the job was still queued.
// A job already running stops at its next check of the call's StopToken.
class PlanReactor final : public grpc::ServerUnaryReactor {
 public:
  PlanReactor(const ServiceDeps& deps, grpc::CallbackServerContext* context,
              const grpc::ByteBuffer* request, grpc::ByteBuffer* response)
      : deps_(deps), context_(context), response_(response), received_(deps.clock->Now()) {
    deps_.observer->OnInflightChange(+1);
    grpc::ByteBuffer bytes(*request);  // shares the slices
    uint64_t batch_id = 0;
    absl::StatusOr<Prepared> prepared =
        Prepare(&bytes, deps_, CallerOf(*context).calibration.tenant, &batch_id);
    if (!prepared.ok()) {
      FinishWith(prepared.status());
      return;
    }
    proto::PlanInput input = std::move(prepared->input);
    input.options.stop = core::StopToken([this] { return StopStatus(); });
    SetIlpBudget(deps_, received_, input);
    pool_ = PoolFor(deps_, input.strategy);
    absl::Status admitted;
    {
      absl::MutexLock lock(&mu_);
      absl::StatusOr<PlanningPool::Ticket> ticket =
          pool_->Submit([this, in = std::move(input)] { RunJob(in); }, context_->peer());
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
      dropped = ticket_.has_value() && pool_->Cancel(*ticket_);
    }
    // Removed from the queue: the job will never run, so it is ours to finish.
    if (dropped) FinishWith(DroppedStatus(*context_, *deps_.clock, received_));
  }

  void OnDone() override { delete this; }

 private:
  // Why the plan should stop, or OK: the call was cancelled or its deadline
  // passed (gRPC cancels a call whose deadline passed).
  absl::Status StopStatus() const {
    if (!context_->IsCancelled()) return absl::OkStatus();
    return DroppedStatus(*context_, *deps_.clock, received_);
  }

  // On a pool thread.
  void RunJob(const proto::PlanInput& input) {
    absl::StatusOr<v1::PlanResponse> planned =
        proto::PlanBatch(input, *deps_.clock, *deps_.observer);
    if (!planned.ok()) {
      FinishWith(planned.status());
      return;
    }
    absl::StatusOr<grpc::ByteBuffer> bytes = Serialize(*planned);
    if (bytes.ok()) *response_ = *std::move(bytes);
    FinishWith(bytes.status());
  }

  // Reports and finishes; the reactor may be deleted as soon as Finish runs.
  void FinishWith(const absl::Status& status) {
    deps_.observer->OnRequestDone(
        "Plan", status.code(), absl::ToDoubleSeconds(deps_.clock->Now() - received_));
    deps_.observer->OnInflightChange(-1);
    Finish(proto::rpc::ToGrpcStatus(status));
  }

  const ServiceDeps& deps_;
  grpc::CallbackServerContext* const context_;
  grpc::ByteBuffer* const response_;
  const absl::Time received_;
  PlanningPool* pool_ = nullptr;  // set before the job is submitted
  absl::Mutex mu_;  // orders the ticket's publication against OnCancel
  std::optional<PlanningPool::Ticket> ticket_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

grpc::ServerUnaryReactor* PlannerService::Plan(grpc::CallbackServerContext* context,
                                               const grpc::ByteBuffer* request,
                                               grpc::ByteBuffer* response) {
  return new PlanReactor(deps_, context, request, response);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* PlannerService::PlanStream(
    grpc::CallbackServerContext* context) {
  return NewPlanStreamReactor(deps_, context);
}

}  // namespace flashcp::planner_service
