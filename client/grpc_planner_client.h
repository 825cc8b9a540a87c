// PlannerClient over a gRPC channel. The channel is injected (MakeChannel
// builds one with the client's settings); tests inject one to a real server.
#ifndef FLASHCP_CLIENT_GRPC_PLANNER_CLIENT_H_
#define FLASHCP_CLIENT_GRPC_PLANNER_CLIENT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/planner_client.h"
#include "flashcp/v1/planner.grpc.pb.h"
#include "grpcpp/channel.h"

namespace flashcp::client {

struct ChannelOptions {
  // Largest message received, bytes (plans of 10^6-document batches are large).
  int max_receive_message_bytes = 256 << 20;
  // gRPC's reconnect backoff after a failed connection attempt. gRPC's own
  // default grows to 120 s, which would keep a channel failing long after the
  // server is up; the retry decorator does the patient waiting instead.
  absl::Duration initial_reconnect_backoff = absl::Milliseconds(100);
  absl::Duration max_reconnect_backoff = absl::Seconds(1);
  // Its own connection: channels to one target otherwise share one (gRPC's
  // global subchannel pool), which a load generator's threads must not.
  bool own_connection = false;
};

// An insecure channel to `target` ("host:port", "unix:path").
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                           const ChannelOptions& options = {});

class GrpcPlannerClient final : public PlannerClient {
 public:
  explicit GrpcPlannerClient(std::shared_ptr<grpc::ChannelInterface> channel);

  PlanResult Plan(const v1::PlanRequest& request, const CallOptions& options) override;
  void PlanAsync(const v1::PlanRequest& request, const CallOptions& options,
                 PlanCallback done) override;
  std::unique_ptr<PlanStream> OpenPlanStream(const CallOptions& options) override;
  absl::StatusOr<v1::ListStrategiesResponse> ListStrategies(const CallOptions& options) override;
  absl::StatusOr<v1::ServerInfo> GetServerInfo(const CallOptions& options) override;

 private:
  std::unique_ptr<v1::Planner::Stub> stub_;
};

}  // namespace flashcp::client

#endif  // FLASHCP_CLIENT_GRPC_PLANNER_CLIENT_H_
