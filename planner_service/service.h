// The flashcp.v1.Planner gRPC service: a thin callback-API adapter (STYLE
// item 7). Each call is validated and converted (proto/convert.h) on the gRPC
// thread, planned on the PlanningPool (plan_batch.h), converted back and
// finished from the pool thread. It holds no state beyond its collaborators.
#ifndef FLASHCP_PLANNER_SERVICE_SERVICE_H_
#define FLASHCP_PLANNER_SERVICE_SERVICE_H_

#include <string>

#include "core/types.h"
#include "flashcp/v1/planner.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "planner_service/clock.h"
#include "planner_service/observer.h"
#include "planner_service/planning_pool.h"

namespace flashcp::planner_service {

struct ServiceConfig {
  core::BatchLimits limits;  // above these: RESOURCE_EXHAUSTED
  // PlanStream items one stream may have read and not yet answered; the
  // stream stops reading at this many and resumes as answers are written.
  int stream_window = 64;
  std::string version;  // reported by GetServerInfo
};

// The collaborators every call uses; they outlive the service.
struct ServiceDeps {
  ServiceConfig config;
  PlanningPool* pool = nullptr;
  const Clock* clock = nullptr;
  ServiceObserver* observer = nullptr;
};

class PlannerService final : public v1::Planner::CallbackService {
 public:
  explicit PlannerService(ServiceDeps deps) : deps_(std::move(deps)) {}

  grpc::ServerUnaryReactor* Plan(grpc::CallbackServerContext* context,
                                 const v1::PlanRequest* request,
                                 v1::PlanResponse* response) override;
  grpc::ServerBidiReactor<v1::PlanRequest, v1::PlanResponse>* PlanStream(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* ListStrategies(grpc::CallbackServerContext* context,
                                           const v1::ListStrategiesRequest* request,
                                           v1::ListStrategiesResponse* response) override;
  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const v1::GetServerInfoRequest* request,
                                          v1::ServerInfo* response) override;

 private:
  const ServiceDeps deps_;
};

}  // namespace flashcp::planner_service

#endif  // FLASHCP_PLANNER_SERVICE_SERVICE_H_
