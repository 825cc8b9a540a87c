#include "planner_service/pipeline_service.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/ilp/pipeline_ckpt.h"
#include "core/pipeline.h"
#include "planner_service/pooled_unary_reactor.h"
#include "proto/pipeline_convert.h"

namespace flashcp::planner_service {
namespace {

// Why a call nobody waits for any more should stop, or OK.
absl::Status StopStatus(grpc::CallbackServerContext* context) {
  if (!context->IsCancelled()) return absl::OkStatus();
  return absl::CancelledError("planner: the call was cancelled or its deadline passed");
}

// Converts, plans (CBC checkpointing; stops with the call) and converts back.
absl::StatusOr<v1::PipelinePlan> PlanOne(const ServiceDeps& deps,
                                         const v1::PlanPipelineRequest& request,
                                         grpc::CallbackServerContext* context) {
  absl::StatusOr<proto::PipelineInput> in =
      proto::PipelineRequestFromProto(request, deps.config.limits);
  if (!in.ok()) return in.status();
  in->options.ckpt_solver = core::ilp::SolvePipelineCkpt;
  in->options.ckpt.time_limit_seconds =
      std::min(kPipelineCkptSeconds, absl::ToDoubleSeconds(deps.config.ilp_time_limit));
  in->options.stop = core::StopToken([context] { return StopStatus(context); });
  const absl::Time t0 = deps.clock->Now();
  absl::StatusOr<core::PipelinePlan> plan = core::PlanPipeline(in->request, in->options);
  if (!plan.ok()) return plan.status();
  return proto::PipelinePlanToProto(*plan, in->batch_id,
                                    absl::ToDoubleSeconds(deps.clock->Now() - t0));
}

// One stream, one item at a time: read, plan on the pool, write, read. A
// failed item is answered with `error` set. At most one operation or job is
// outstanding, so Finish (after the client's last write, or a failed write)
// leaves nothing running that refers to the reactor.
class StreamReactor final
    : public grpc::ServerBidiReactor<v1::PlanPipelineRequest, v1::PipelinePlan> {
 public:
  StreamReactor(const ServiceDeps& deps, grpc::CallbackServerContext* context)
      : deps_(deps), context_(context) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    const absl::StatusOr<PlanningPool::Ticket> ticket =
        deps_.pool->Submit([this] { RunJob(); }, context_->peer());
    if (!ticket.ok()) Answer(ticket.status());
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "planner: the stream's write failed"));
      return;
    }
    StartRead(&request_);
  }

  void OnDone() override { delete this; }

 private:
  void RunJob() {
    const absl::Time t0 = deps_.clock->Now();
    absl::StatusOr<v1::PipelinePlan> plan = PlanOne(deps_, request_, context_);
    deps_.observer->OnRequestDone("PlanPipelineStream", plan.status().code(),
                                  absl::ToDoubleSeconds(deps_.clock->Now() - t0));
    if (plan.ok()) {
      response_ = *std::move(plan);
      StartWrite(&response_);
      return;
    }
    Answer(plan.status());
  }

  void Answer(const absl::Status& error) {
    response_.Clear();
    response_.set_batch_id(request_.batch_id());
    response_.set_error(absl::StrCat(absl::StatusCodeToString(error.code()), ": ", error.message()));
    StartWrite(&response_);
  }

  const ServiceDeps& deps_;
  grpc::CallbackServerContext* const context_;
  v1::PlanPipelineRequest request_;
  v1::PipelinePlan response_;
};

}  // namespace

grpc::ServerUnaryReactor* PipelinePlannerService::PlanPipeline(
    grpc::CallbackServerContext* context, const v1::PlanPipelineRequest* request,
    v1::PipelinePlan* response) {
  auto* reactor = new PooledUnaryReactor<v1::PipelinePlan>(deps_, "PlanPipeline",
                                                           deps_.clock->Now(), response);
  reactor->Start(deps_.pool, context->peer(), [deps = &deps_, request, context] {
    return PlanOne(*deps, *request, context);
  });
  return reactor;
}

grpc::ServerBidiReactor<v1::PlanPipelineRequest, v1::PipelinePlan>*
PipelinePlannerService::PlanPipelineStream(grpc::CallbackServerContext* context) {
  return new StreamReactor(deps_, context);
}

}  // namespace flashcp::planner_service
