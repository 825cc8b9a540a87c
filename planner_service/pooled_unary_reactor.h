// One unary call planned on a planning pool, for the modes whose call is
// "prepare, plan on the pool, answer" (PlanPipeline, PlanGlobalBatch).
// Finish runs exactly once: on a refused request (Reject), on admission
// failure, from the job, or from OnCancel while the job was still queued.
#ifndef FLASHCP_PLANNER_SERVICE_POOLED_UNARY_REACTOR_H_
#define FLASHCP_PLANNER_SERVICE_POOLED_UNARY_REACTOR_H_

#include <functional>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "planner_service/planning_pool.h"
#include "planner_service/service_calls.h"
#include "proto/rpc/grpc_status.h"

namespace flashcp::planner_service {

template <typename Response>
class PooledUnaryReactor final : public grpc::ServerUnaryReactor {
 public:
  using Job = std::function<absl::StatusOr<Response>()>;

  // `method` names the call in the observer's request metrics; `received`
  // is when the call arrived (its latency starts there).
  PooledUnaryReactor(const ServiceDeps& deps, std::string method, absl::Time received,
                     Response* response)
      : deps_(deps), method_(std::move(method)), response_(response), received_(received) {
    deps_.observer->OnInflightChange(+1);
  }

  absl::Time received() const { return received_; }

  // Finishes the call with `status` (a request refused before planning).
  void Reject(const absl::Status& status) { FinishWith(status); }

  // Queues `job` on `pool` for `peer`; its result answers the call. A pool
  // that refuses the job (full, shut down) finishes the call with why.
  void Start(PlanningPool* pool, const std::string& peer, Job job) {
    job_ = std::move(job);
    absl::Status admitted;
    {
      absl::MutexLock lock(&mu_);
      pool_ = pool;
      absl::StatusOr<PlanningPool::Ticket> ticket = pool_->Submit([this] { RunJob(); }, peer);
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
    if (dropped) FinishWith(absl::CancelledError("planner: the call was cancelled while queued"));
  }

  void OnDone() override { delete this; }

 private:
  void RunJob() {
    absl::StatusOr<Response> result = job_();
    if (result.ok()) *response_ = *std::move(result);
    FinishWith(result.status());
  }

  void FinishWith(const absl::Status& status) {
    deps_.observer->OnRequestDone(method_, status.code(),
                                  absl::ToDoubleSeconds(deps_.clock->Now() - received_));
    deps_.observer->OnInflightChange(-1);
    Finish(proto::rpc::ToGrpcStatus(status));
  }

  const ServiceDeps& deps_;
  const std::string method_;
  Response* const response_;
  const absl::Time received_;
  Job job_;
  absl::Mutex mu_;
  PlanningPool* pool_ = nullptr;  // set by Start
  std::optional<PlanningPool::Ticket> ticket_;
};

}  // namespace flashcp::planner_service

#endif  // FLASHCP_PLANNER_SERVICE_POOLED_UNARY_REACTOR_H_
