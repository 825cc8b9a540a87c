// The flashcp.v1.Planner gRPC service: a thin callback-API adapter (STYLE
// item 7). Its methods are raw: the service parses each message itself, so
// that a malformed one gets INVALID_ARGUMENT naming its type (in a stream,
// that item's error; the stream goes on) and an oversized PlanRequest is
// refused before it is parsed. Each call is
// validated, bounded (proto/plan_batch.h) and converted (proto/convert.h) on the
// gRPC thread, planned on a PlanningPool, serialized and finished from the
// pool thread. A call that is cancelled or whose deadline passes stops its
// plan (core::StopToken). It holds no state beyond its collaborators.
#ifndef FLASHCP_PLANNER_SERVICE_SERVICE_H_
#define FLASHCP_PLANNER_SERVICE_SERVICE_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "core/types.h"
#include "flashcp/v1/planner.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "core/clock.h"
#include "planner_service/calibration.h"
#include "planner_service/held_bytes.h"
#include "planner_service/observer.h"
#include "proto/plan_batch.h"
#include "planner_service/planning_pool.h"
#include "planner_service/rate_limiter.h"

namespace flashcp::planner_service {

struct ServiceConfig {
  core::BatchLimits limits = proto::kDefaultBatchLimits;  // above these: RESOURCE_EXHAUSTED
  proto::PlanBounds bounds;        // shards x ranks and response bytes, before planning
  // PlanStream items one stream may have read and not yet answered; the
  // stream stops reading at this many and resumes as answers are written.
  int stream_window = 64;
  // Response bytes one stream may hold unread (each item counted at its
  // bound, CheckPlanBounds, until planned, then at its size); the stream
  // stops reading at this many. At least bounds.max_response_bytes.
  int64_t stream_window_bytes = int64_t{128} << 20;
  // `ilp` plans: refused (UNIMPLEMENTED) unless allowed; when allowed they run
  // on their own pool (ServiceDeps::ilp_pool), each within this wall-clock
  // limit from the call's arrival (CBC stops then with its best plan).
  bool allow_ilp = false;
  absl::Duration ilp_time_limit = absl::Seconds(10);
  std::string version;  // reported by GetServerInfo
};

// The collaborators every call uses; they outlive the service.
struct ServiceDeps {
  ServiceConfig config;
  PlanningPool* pool = nullptr;
  PlanningPool* ilp_pool = nullptr;    // `ilp` plans only; may be null when !allow_ilp
  HeldBytes* stream_bytes = nullptr;   // all streams' unread response bytes
  const core::Clock* clock = nullptr;
  ServiceObserver* observer = nullptr;
  // Cost profiles' online fits (ReportStepTimes); null: ReportStepTimes is
  // UNIMPLEMENTED and named profiles plan with their shipped coefficients.
  Calibration* calibration = nullptr;
  // ReportStepTimes calls per client (service.cc's CallerOf: the mTLS
  // identity, else the host); null: unlimited. Above it: RESOURCE_EXHAUSTED.
  KeyedRateLimiter* report_limiter = nullptr;
};

class PlannerService final
    : public v1::Planner::WithRawCallbackMethod_Plan<v1::Planner::WithRawCallbackMethod_PlanStream<
          v1::Planner::WithRawCallbackMethod_ListStrategies<
              v1::Planner::WithRawCallbackMethod_GetServerInfo<
                  v1::Planner::WithRawCallbackMethod_ReportStepTimes<
                      v1::Planner::Service>>>>> {
 public:
  explicit PlannerService(ServiceDeps deps) : deps_(std::move(deps)) {}

  grpc::ServerUnaryReactor* Plan(grpc::CallbackServerContext* context,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* PlanStream(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* ListStrategies(grpc::CallbackServerContext* context,
                                           const grpc::ByteBuffer* request,
                                           grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ReportStepTimes(grpc::CallbackServerContext* context,
                                            const grpc::ByteBuffer* request,
                                            grpc::ByteBuffer* response) override;

 private:
  const ServiceDeps deps_;
};

}  // namespace flashcp::planner_service

#endif  // FLASHCP_PLANNER_SERVICE_SERVICE_H_
