// The Planner service's small calls (service.h): ListStrategies and
// GetServerInfo (fixed answers), ReportStepTimes (calibration).
#include <functional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/status_macros.h"
#include "core/strategies.h"
#include "planner_service/service.h"
#include "planner_service/service_calls.h"
#include "proto/convert.h"
#include "proto/rpc/grpc_status.h"
#include "proto/rpc/raw_message.h"

namespace flashcp::planner_service {
namespace {

constexpr char kApiVersion[] = "flashcp.v1";

// A unary call with a small fixed answer: its `Request` parsed (INVALID_ARGUMENT
// if it is not one), `fill` builds the `Reply`, serialized into `out`.
template <typename Request, typename Reply>
grpc::ServerUnaryReactor* AnswerSmallCall(const ServiceDeps& deps, absl::string_view method,
                                          grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* in, grpc::ByteBuffer* out,
                                          const std::function<void(Reply&)>& fill) {
  const absl::Time received = deps.clock->Now();
  grpc::ByteBuffer bytes(*in);
  Request request;
  absl::Status status = proto::rpc::ParseRaw(&bytes, &request);
  if (status.ok()) {
    Reply reply;
    fill(reply);
    absl::StatusOr<grpc::ByteBuffer> serialized = Serialize(reply);
    status = serialized.status();
    if (serialized.ok()) *out = *std::move(serialized);
  }
  deps.observer->OnRequestDone(method, status.code(),
                               absl::ToDoubleSeconds(deps.clock->Now() - received));
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(proto::rpc::ToGrpcStatus(status));
  return reactor;
}

// One ReportStepTimes call: rate-limited per client (Caller::rate_key),
// checked and parsed on the gRPC thread; the refit runs on the calibration's
// own thread, which finishes the call.
class ReportReactor final : public grpc::ServerUnaryReactor {
 public:
  ReportReactor(const ServiceDeps& deps, grpc::CallbackServerContext* context,
                const grpc::ByteBuffer* request, grpc::ByteBuffer* response)
      : deps_(deps), response_(response), received_(deps.clock->Now()) {
    absl::StatusOr<proto::StepTimesReport> report = Check(*context, *request);
    if (!report.ok()) {
      FinishWith(report.status());
      return;
    }
    const int64_t accepted = static_cast<int64_t>(report->samples.size());
    deps_.calibration->Report(
        CallerOf(*context).calibration, *std::move(report),
        [this, accepted](absl::StatusOr<core::CostCalibrator::State> state) {
          absl::Status status = state.status();
          if (state.ok()) {
            absl::StatusOr<grpc::ByteBuffer> bytes =
                Serialize(proto::StepTimesResponseToProto(accepted, *state));
            status = bytes.status();
            if (bytes.ok()) *response_ = *std::move(bytes);
          }
          FinishWith(status);
        });
  }

  void OnDone() override { delete this; }

 private:
  absl::StatusOr<proto::StepTimesReport> Check(const grpc::CallbackServerContext& context,
                                               const grpc::ByteBuffer& request) {
    if (deps_.calibration == nullptr) {
      return absl::UnimplementedError("ReportStepTimes: this planner does not calibrate");
    }
    if (deps_.report_limiter != nullptr &&
        !deps_.report_limiter->Allow(CallerOf(context).rate_key)) {
      const KeyedRateLimiter::Options& o = deps_.report_limiter->options();
      return absl::ResourceExhaustedError(absl::StrCat(
          "ReportStepTimes: rate limit: at most ", o.per_second, " reports per second (bursts of ",
          o.burst, ") per client (mTLS identity, else host); retry later"));
    }
    if (static_cast<int64_t>(request.Length()) > proto::kMaxReportBytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "request: ", request.Length(), " bytes, above the largest valid "
          "flashcp.v1.ReportStepTimesRequest (", proto::kMaxReportBytes, " bytes)"));
    }
    grpc::ByteBuffer bytes(request);
    v1::ReportStepTimesRequest message;
    FLASHCP_RETURN_IF_ERROR(proto::rpc::ParseRaw(&bytes, &message));
    return proto::StepTimesFromProto(message);
  }

  void FinishWith(const absl::Status& status) {
    deps_.observer->OnRequestDone("ReportStepTimes", status.code(),
                                  absl::ToDoubleSeconds(deps_.clock->Now() - received_));
    Finish(proto::rpc::ToGrpcStatus(status));
  }

  const ServiceDeps& deps_;
  grpc::ByteBuffer* const response_;
  const absl::Time received_;
};

}  // namespace

grpc::ServerUnaryReactor* PlannerService::ListStrategies(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* request,
                                                         grpc::ByteBuffer* response) {
  return AnswerSmallCall<v1::ListStrategiesRequest, v1::ListStrategiesResponse>(
      deps_, "ListStrategies", context, request, response, [](v1::ListStrategiesResponse& r) {
        for (core::Strategy s : core::AllStrategies()) {
          v1::StrategyInfo* info = r.add_strategies();
          info->set_name(std::string(core::StrategyName(s)));
          info->set_description(std::string(core::StrategyDescription(s)));
          info->set_is_default(s == proto::kDefaultStrategy);
        }
      });
}

grpc::ServerUnaryReactor* PlannerService::GetServerInfo(grpc::CallbackServerContext* context,
                                                        const grpc::ByteBuffer* request,
                                                        grpc::ByteBuffer* response) {
  return AnswerSmallCall<v1::GetServerInfoRequest, v1::ServerInfo>(
      deps_, "GetServerInfo", context, request, response, [this](v1::ServerInfo& r) {
        r.set_version(deps_.config.version);
        r.set_api_version(kApiVersion);
        r.set_planner_threads(deps_.pool->options().threads);
        r.set_queue_capacity(deps_.pool->options().queue_capacity);
        r.set_max_docs_per_batch(deps_.config.limits.max_docs);
        r.set_max_tokens_per_batch(deps_.config.limits.max_tokens);
        r.set_max_cp_size(deps_.config.limits.max_cp_size);
      });
}

grpc::ServerUnaryReactor* PlannerService::ReportStepTimes(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* request,
                                                          grpc::ByteBuffer* response) {
  return new ReportReactor(deps_, context, request, response);
}

}  // namespace flashcp::planner_service
