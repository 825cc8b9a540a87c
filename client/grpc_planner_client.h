// PlannerClient over a gRPC channel. The channel is injected (MakeChannel
// builds one with the client's settings, plaintext or TLS); tests inject one
// to a real server.
#ifndef FLASHCP_CLIENT_GRPC_PLANNER_CLIENT_H_
#define FLASHCP_CLIENT_GRPC_PLANNER_CLIENT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/planner_client.h"
#include "flashcp/v1/planner.grpc.pb.h"
#include "grpcpp/channel.h"
#include "grpcpp/security/credentials.h"

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
  // Transport security: null is plaintext; WithTls sets TLS credentials.
  std::shared_ptr<grpc::ChannelCredentials> credentials{};
  // With TLS, the name the server's certificate must carry instead of the
  // target's host (e.g. dialling an IP whose certificate names a DNS name).
  // Empty: the target's host.
  std::string tls_server_name{};
};

// TLS for a channel, as the tools' flags give it: PEM file paths. The names in
// the comments are the flags of flashcp-client and flashcp-loadgen, which
// match flashcp-planner's --tls_cert / --tls_key.
struct TlsOptions {
  // --tls_ca: CA bundle the server's certificate must chain to (required).
  std::string ca_file{};
  // --tls_cert, --tls_key: client certificate and its private key, for a
  // server that requires one (mTLS, flashcp-planner --tls_client_ca); both
  // or neither.
  std::string cert_file{};
  std::string key_file{};
  // --tls_server_name: becomes ChannelOptions::tls_server_name.
  std::string server_name{};
};

// `options` with TLS credentials read from the files of `tls` now (a later
// change to the files does not affect the channel) and tls_server_name set.
// InvalidArgument naming the flag for an empty ca_file, for cert_file without
// key_file or the reverse, or for a file that holds no PEM block of its kind
// or is too large; core::ReadPem's errno-coded errors, naming the flag and the
// path, for one that cannot be opened or read.
absl::StatusOr<ChannelOptions> WithTls(ChannelOptions options, const TlsOptions& tls);

// A channel to `target` ("host:port", "unix:path"): TLS when
// options.credentials is set (WithTls), else plaintext.
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
  absl::StatusOr<v1::ReportStepTimesResponse> ReportStepTimes(
      const v1::ReportStepTimesRequest& request, const CallOptions& options) override;

 private:
  std::unique_ptr<v1::Planner::Stub> stub_;
};

}  // namespace flashcp::client

#endif  // FLASHCP_CLIENT_GRPC_PLANNER_CLIENT_H_
