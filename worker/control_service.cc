#include "worker/control_service.h"

#include "proto/grpc_status.h"

namespace flashcp::worker {

grpc::Status WorkerControlService::GetStatus(grpc::ServerContext*, const v1::GetStatusRequest*,
                                             v1::WorkerStatus* response) {
  *response = daemon_->Status();
  return grpc::Status::OK;
}

grpc::Status WorkerControlService::StartRun(grpc::ServerContext*,
                                            const v1::StartRunRequest* request,
                                            v1::StartRunResponse*) {
  return proto::ToGrpcStatus(
      daemon_->StartRun(request->steps(), request->strategy(), request->scheme()));
}

grpc::Status WorkerControlService::StopRun(grpc::ServerContext*, const v1::StopRunRequest*,
                                           v1::StopRunResponse*) {
  return proto::ToGrpcStatus(daemon_->StopRun());
}

}  // namespace flashcp::worker
