// A PlannerClient test double for code that reads plans from PlanStream
// (worker/plan_feed.h and the daemon above it).
#ifndef FLASHCP_WORKER_TESTING_SCRIPTED_PLANNER_H_
#define FLASHCP_WORKER_TESTING_SCRIPTED_PLANNER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/planner_client.h"
#include "core/analysis.h"
#include "core/clock.h"
#include "core/cost_model.h"
#include "core/step_time.h"
#include "core/strategies.h"
#include "core/types.h"
#include "proto/convert.h"

namespace flashcp::worker::testing {

// A planner whose streams echo each request's documents back, and whose first
// `broken_streams` streams break with UNAVAILABLE after `answers_before_break`
// answers (a planner restart mid-stream).
class ScriptedPlanner final : public client::PlannerClient {
 public:
  ScriptedPlanner(int broken_streams, int answers_before_break)
      : broken_streams_(broken_streams), answers_before_break_(answers_before_break) {}
  // Answers with real plans (core::MakePlan, AnalyzePlan) instead of echoes,
  // and advances `clock` by `first_answer_delay` before its first answer: a
  // planner that takes that long (of the clock's time) for the first plan.
  ScriptedPlanner(core::ManualClock* clock, absl::Duration first_answer_delay)
      : broken_streams_(0), answers_before_break_(0), clock_(clock),
        first_answer_delay_(first_answer_delay) {}

  class Stream final : public client::PlanStream {
   public:
    Stream(int answers, ScriptedPlanner* planner) : answers_left_(answers), planner_(planner) {}
    bool Write(const v1::PlanRequest& request) override {
      planner_->RecordRequest(request);
      absl::MutexLock lock(&mu_);
      if (cancelled_) return false;
      pending_.push_back(request);
      return true;
    }
    bool WritesDone() override {
      absl::MutexLock lock(&mu_);
      done_writing_ = true;
      return true;
    }
    bool Read(v1::PlanResponse* response) override {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](Stream* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
            return !s->pending_.empty() || s->done_writing_ || s->cancelled_ ||
                   s->answers_left_ == 0;
          },
          this));
      if (cancelled_ || answers_left_ == 0 || pending_.empty()) return false;
      const v1::PlanRequest r = pending_.front();
      pending_.erase(pending_.begin());
      --answers_left_;
      response->Clear();
      if (planner_->clock_ != nullptr) {
        if (!planner_->answered_) planner_->clock_->Advance(planner_->first_answer_delay_);
        planner_->answered_ = true;
        *response = planner_->answers_++ == planner_->fail_answer_
                        ? proto::ErrorResponseToProto(r.batch_id(), planner_->fail_status_)
                        : RealPlan(r);
        return true;
      }
      response->set_batch_id(r.batch_id());
      response->mutable_doc_lens()->CopyFrom(r.doc_lens());
      return true;
    }
    void Cancel() override {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
    }
    absl::Status Finish() override {
      absl::MutexLock lock(&mu_);
      return answers_left_ == 0 ? absl::UnavailableError("connection reset") : absl::OkStatus();
    }

   private:
    static v1::PlanResponse RealPlan(const v1::PlanRequest& r) {
      const absl::StatusOr<proto::PlanInput> in = proto::RequestFromProto(r, core::BatchLimits{});
      if (!in.ok()) return proto::ErrorResponseToProto(r.batch_id(), in.status());
      const absl::StatusOr<core::Plan> plan = core::MakePlan(in->strategy, in->batch, in->options);
      if (!plan.ok()) return proto::ErrorResponseToProto(r.batch_id(), plan.status());
      const absl::StatusOr<core::PlanMetrics> metrics = core::AnalyzePlan(*plan, in->shape);
      if (!metrics.ok()) return proto::ErrorResponseToProto(r.batch_id(), metrics.status());
      // The pairs profile's report, as the service sends it.
      core::PlanCostReport cost;
      cost.profile = std::string(core::kPairsProfile);
      cost.prediction = core::PredictPlanCost(cost.coefficients, *plan);
      v1::PlanResponse response = proto::ResponseToProto(r.batch_id(), in->strategy, *plan,
                                                         *metrics, nullptr, 0.0, nullptr, &cost);
      if (in->step_time.has_value()) {  // the request named a cluster: the service's report
        const absl::StatusOr<core::StepTimeReport> step =
            core::ReportStepTime(in->strategy, *plan, in->shape, in->step_time->layers,
                                 in->step_time->cluster, in->step_time->cluster_name);
        if (!step.ok()) return proto::ErrorResponseToProto(r.batch_id(), step.status());
        proto::StepTimeToProto(*step, false, response.mutable_metrics());
      }
      return response;
    }

    absl::Mutex mu_;
    std::vector<v1::PlanRequest> pending_ ABSL_GUARDED_BY(mu_);
    bool done_writing_ ABSL_GUARDED_BY(mu_) = false;
    bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
    int answers_left_ ABSL_GUARDED_BY(mu_);
    ScriptedPlanner* const planner_;
  };

  std::unique_ptr<client::PlanStream> OpenPlanStream(const client::CallOptions&) override {
    absl::MutexLock lock(&mu_);
    ++opened_;
    return std::make_unique<Stream>(opened_ <= broken_streams_ ? answers_before_break_ : 1 << 30,
                                    this);
  }
  client::PlanResult Plan(const v1::PlanRequest&, const client::CallOptions&) override {
    return absl::UnimplementedError("Plan");
  }
  void PlanAsync(const v1::PlanRequest&, const client::CallOptions&,
                 client::PlanCallback done) override {
    std::move(done)(absl::UnimplementedError("PlanAsync"));
  }
  absl::StatusOr<v1::ListStrategiesResponse> ListStrategies(const client::CallOptions&) override {
    return absl::UnimplementedError("ListStrategies");
  }
  absl::StatusOr<v1::ServerInfo> GetServerInfo(const client::CallOptions&) override {
    return absl::UnimplementedError("GetServerInfo");
  }
  // Real-plan mode: answer number `index` (0-based, over all streams) is a
  // per-item error with `status` (the service's `error` field). Call before
  // the first stream opens.
  void FailAnswer(int index, absl::Status status) {
    fail_answer_ = index;
    fail_status_ = std::move(status);
  }
  int opened() {
    absl::MutexLock lock(&mu_);
    return opened_;
  }
  // The element size (bytes) of every request written to any stream, in order.
  std::vector<int32_t> request_dtype_bytes() {
    absl::MutexLock lock(&mu_);
    return request_dtype_bytes_;
  }
  // The rank_speed of every request written, in order.
  std::vector<std::vector<double>> request_rank_speeds() {
    absl::MutexLock lock(&mu_);
    return request_rank_speeds_;
  }
  // The cluster of every request written, in order.
  std::vector<std::string> request_clusters() {
    absl::MutexLock lock(&mu_);
    return request_clusters_;
  }
  // The attention_mask and block_size of every request written, in order.
  std::vector<std::pair<std::string, int64_t>> request_masks() {
    absl::MutexLock lock(&mu_);
    return request_masks_;
  }
  void RecordRequest(const v1::PlanRequest& request) {
    absl::MutexLock lock(&mu_);
    request_masks_.emplace_back(request.attention_mask(), request.block_size());
    request_clusters_.push_back(request.cluster());
    request_dtype_bytes_.push_back(request.dtype_bytes());
    request_rank_speeds_.emplace_back(request.rank_speed().begin(), request.rank_speed().end());
  }

 private:
  absl::Mutex mu_;
  std::vector<int32_t> request_dtype_bytes_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<double>> request_rank_speeds_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> request_clusters_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<std::string, int64_t>> request_masks_ ABSL_GUARDED_BY(mu_);
  const int broken_streams_, answers_before_break_;
  int opened_ ABSL_GUARDED_BY(mu_) = 0;
  core::ManualClock* const clock_ = nullptr;
  const absl::Duration first_answer_delay_;
  bool answered_ = false;  // only the streams' Read, on the feed's one thread
  int answers_ = 0;        // likewise
  int fail_answer_ = -1;   // FailAnswer
  absl::Status fail_status_;
};

}  // namespace flashcp::worker::testing

#endif  // FLASHCP_WORKER_TESTING_SCRIPTED_PLANNER_H_
