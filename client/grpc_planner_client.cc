#include "client/grpc_planner_client.h"

#include <chrono>
#include <memory>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/file.h"
#include "core/status_macros.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "proto/rpc/grpc_status.h"

namespace flashcp::client {
namespace {

int ToMillis(absl::Duration d) { return static_cast<int>(absl::ToInt64Milliseconds(d)); }

void Configure(grpc::ClientContext& context, const CallOptions& options) {
  context.set_deadline(absl::ToChronoTime(absl::Now() + options.timeout));
  context.set_wait_for_ready(options.wait_for_ready);
}

// The sync PlanStream over one ClientReaderWriter. The context outlives the
// call object, which it must.
class GrpcPlanStream final : public PlanStream {
 public:
  GrpcPlanStream(v1::Planner::Stub& stub, const CallOptions& options) {
    Configure(context_, options);
    stream_ = stub.PlanStream(&context_);
  }
  ~GrpcPlanStream() override {
    if (!finished_) {
      context_.TryCancel();
      (void)stream_->Finish();
    }
  }
  bool Write(const v1::PlanRequest& request) override { return stream_->Write(request); }
  bool WritesDone() override { return stream_->WritesDone(); }
  bool Read(v1::PlanResponse* response) override { return stream_->Read(response); }
  void Cancel() override { context_.TryCancel(); }
  absl::Status Finish() override {
    finished_ = true;
    return proto::rpc::FromGrpcStatus(stream_->Finish());
  }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::PlanRequest, v1::PlanResponse>> stream_;
  bool finished_ = false;
};

template <typename Response, typename Call>
absl::StatusOr<Response> Unary(const CallOptions& options, Call call) {
  grpc::ClientContext context;
  Configure(context, options);
  Response response;
  const grpc::Status status = call(&context, &response);
  if (!status.ok()) return proto::rpc::FromGrpcStatus(status);
  return response;
}

}  // namespace

absl::StatusOr<ChannelOptions> WithTls(ChannelOptions options, const TlsOptions& tls) {
  if (tls.ca_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls_ca: required for TLS (the CA bundle the server's certificate chains to)");
  }
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    return absl::InvalidArgumentError("--tls_cert, --tls_key: set both or neither");
  }
  grpc::SslCredentialsOptions ssl;
  FLASHCP_ASSIGN_OR_RETURN(ssl.pem_root_certs,
                           core::ReadPem(tls.ca_file, "--tls_ca", "CERTIFICATE"));
  if (!tls.cert_file.empty()) {
    FLASHCP_ASSIGN_OR_RETURN(ssl.pem_cert_chain,
                             core::ReadPem(tls.cert_file, "--tls_cert", "CERTIFICATE"));
    FLASHCP_ASSIGN_OR_RETURN(ssl.pem_private_key,
                             core::ReadPem(tls.key_file, "--tls_key", "PRIVATE KEY"));
  }
  options.credentials = grpc::SslCredentials(ssl);
  if (options.credentials == nullptr) {  // gRPC could not make them (out of memory)
    return absl::InternalError("TLS: gRPC made no channel credentials");
  }
  options.tls_server_name = tls.server_name;
  return options;
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                           const ChannelOptions& options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, ToMillis(options.initial_reconnect_backoff));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, ToMillis(options.max_reconnect_backoff));
  if (options.own_connection) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  if (options.credentials == nullptr) {
    return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  }
  if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
  return grpc::CreateCustomChannel(target, options.credentials, args);
}

GrpcPlannerClient::GrpcPlannerClient(std::shared_ptr<grpc::ChannelInterface> channel)
    : stub_(v1::Planner::NewStub(std::move(channel))) {}

PlanResult GrpcPlannerClient::Plan(const v1::PlanRequest& request, const CallOptions& options) {
  return Unary<v1::PlanResponse>(options, [&](grpc::ClientContext* context, auto* response) {
    return stub_->Plan(context, request, response);
  });
}

void GrpcPlannerClient::PlanAsync(const v1::PlanRequest& request, const CallOptions& options,
                                  PlanCallback done) {
  // Owns what the call needs until gRPC calls back.
  struct Call {
    grpc::ClientContext context;
    v1::PlanRequest request;
    v1::PlanResponse response;
    PlanCallback done;
  };
  auto* call = new Call;
  Configure(call->context, options);
  call->request = request;
  call->done = std::move(done);
  stub_->async()->Plan(&call->context, &call->request, &call->response,
                       [call](grpc::Status status) {
                         // The call's gRPC objects go before `done` runs: once
                         // it has, the caller may destroy the channel and with
                         // it gRPC, which must not find this context alive.
                         PlanCallback done = std::move(call->done);
                         PlanResult result = status.ok()
                                                 ? PlanResult(std::move(call->response))
                                                 : PlanResult(proto::rpc::FromGrpcStatus(status));
                         delete call;
                         std::move(done)(std::move(result));
                       });
}

std::unique_ptr<PlanStream> GrpcPlannerClient::OpenPlanStream(const CallOptions& options) {
  return std::make_unique<GrpcPlanStream>(*stub_, options);
}

absl::StatusOr<v1::ListStrategiesResponse> GrpcPlannerClient::ListStrategies(
    const CallOptions& options) {
  return Unary<v1::ListStrategiesResponse>(
      options, [&](grpc::ClientContext* context, auto* response) {
        return stub_->ListStrategies(context, v1::ListStrategiesRequest(), response);
      });
}

absl::StatusOr<v1::ServerInfo> GrpcPlannerClient::GetServerInfo(const CallOptions& options) {
  return Unary<v1::ServerInfo>(options, [&](grpc::ClientContext* context, auto* response) {
    return stub_->GetServerInfo(context, v1::GetServerInfoRequest(), response);
  });
}

absl::StatusOr<v1::ReportStepTimesResponse> GrpcPlannerClient::ReportStepTimes(
    const v1::ReportStepTimesRequest& request, const CallOptions& options) {
  return Unary<v1::ReportStepTimesResponse>(
      options, [&](grpc::ClientContext* context, auto* response) {
        return stub_->ReportStepTimes(context, request, response);
      });
}

}  // namespace flashcp::client
