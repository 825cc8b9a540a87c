// flashcp.v1.WorkerControl over a WorkerDaemon: a thin adapter (sync API:
// every call is short).
#ifndef FLASHCP_WORKER_CONTROL_SERVICE_H_
#define FLASHCP_WORKER_CONTROL_SERVICE_H_

#include "flashcp/v1/worker.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "worker/daemon.h"

namespace flashcp::worker {

class WorkerControlService final : public v1::WorkerControl::Service {
 public:
  explicit WorkerControlService(WorkerDaemon* daemon) : daemon_(daemon) {}
  grpc::Status GetStatus(grpc::ServerContext*, const v1::GetStatusRequest*,
                         v1::WorkerStatus* response) override;
  grpc::Status StartRun(grpc::ServerContext*, const v1::StartRunRequest* request,
                        v1::StartRunResponse*) override;
  grpc::Status StopRun(grpc::ServerContext*, const v1::StopRunRequest*,
                       v1::StopRunResponse*) override;

 private:
  WorkerDaemon* const daemon_;
};

}  // namespace flashcp::worker

#endif  // FLASHCP_WORKER_CONTROL_SERVICE_H_
