#include "worker/control_service.h"

#include "proto/rpc/grpc_status.h"
#include "proto/rpc/raw_message.h"

namespace flashcp::worker {
namespace {

grpc::ServerUnaryReactor* Finished(grpc::CallbackServerContext* context,
                                   const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(proto::rpc::ToGrpcStatus(status));
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* WorkerControlService::GetStatus(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* raw,
                                                          grpc::ByteBuffer* response) {
  v1::GetStatusRequest request;
  if (absl::Status s = proto::rpc::ParseRaw(*raw, &request); !s.ok()) return Finished(context, s);
  return Finished(context, proto::rpc::SerializeRaw(daemon_->Status(), response));
}

grpc::ServerUnaryReactor* WorkerControlService::StartRun(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* raw,
                                                         grpc::ByteBuffer* response) {
  v1::StartRunRequest request;
  if (absl::Status s = proto::rpc::ParseRaw(*raw, &request); !s.ok()) return Finished(context, s);
  absl::Status s = daemon_->StartRun(request.steps(), request.strategy(), request.scheme());
  if (s.ok()) s = proto::rpc::SerializeRaw(v1::StartRunResponse(), response);
  return Finished(context, s);
}

grpc::ServerUnaryReactor* WorkerControlService::StopRun(grpc::CallbackServerContext* context,
                                                        const grpc::ByteBuffer* raw,
                                                        grpc::ByteBuffer* response) {
  v1::StopRunRequest request;
  if (absl::Status s = proto::rpc::ParseRaw(*raw, &request); !s.ok()) return Finished(context, s);
  absl::Status s = daemon_->StopRun();
  if (s.ok()) s = proto::rpc::SerializeRaw(v1::StopRunResponse(), response);
  return Finished(context, s);
}

}  // namespace flashcp::worker
