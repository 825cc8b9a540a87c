// flashcp.v1.WorkerControl over a WorkerDaemon: a thin adapter on gRPC's
// callback API (every call is short: it takes the daemon's lock, never
// waits). The methods are raw (proto/rpc/raw_message.h): a request that does not
// parse gets INVALID_ARGUMENT naming its type, where the generated handler
// answered with an empty message.
#ifndef FLASHCP_WORKER_CONTROL_SERVICE_H_
#define FLASHCP_WORKER_CONTROL_SERVICE_H_

#include "flashcp/v1/worker.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "worker/daemon.h"

namespace flashcp::worker {

class WorkerControlService final
    : public v1::WorkerControl::WithRawCallbackMethod_GetStatus<
          v1::WorkerControl::WithRawCallbackMethod_StartRun<
              v1::WorkerControl::WithRawCallbackMethod_StopRun<v1::WorkerControl::Service>>> {
 public:
  explicit WorkerControlService(WorkerDaemon* daemon) : daemon_(daemon) {}
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* StartRun(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* StopRun(grpc::CallbackServerContext* context,
                                    const grpc::ByteBuffer* request,
                                    grpc::ByteBuffer* response) override;

 private:
  WorkerDaemon* const daemon_;
};

}  // namespace flashcp::worker

#endif  // FLASHCP_WORKER_CONTROL_SERVICE_H_
