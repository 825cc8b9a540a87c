#include "planner_service/server.h"

#include <csignal>
#include <cstdio>
#include <exception>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/log.h"
#include "core/status_macros.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "planner_service/metrics.h"
#include "planner_service/signals.h"
#include "prometheus/exposer.h"

namespace flashcp::planner_service {
namespace {

constexpr char kServiceName[] = "flashcp.v1.Planner";

absl::StatusOr<std::string> ReadFile(const std::string& path, absl::string_view flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(flag, ": cannot open \"", path, "\""));
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(flag, ": cannot read \"", path, "\""));
  return s.str();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeCredentials(
    const ServerOptions& options) {
  if (options.tls_cert.empty()) return grpc::InsecureServerCredentials();
  FLASHCP_ASSIGN_OR_RETURN(const std::string cert, ReadFile(options.tls_cert, "--tls_cert"));
  FLASHCP_ASSIGN_OR_RETURN(const std::string key, ReadFile(options.tls_key, "--tls_key"));
  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  if (!options.tls_client_ca.empty()) {
    FLASHCP_ASSIGN_OR_RETURN(ssl.pem_root_certs,
                             ReadFile(options.tls_client_ca, "--tls_client_ca"));
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  ssl.pem_key_cert_pairs.push_back({key, cert});
  return grpc::SslServerCredentials(ssl);
}

}  // namespace

absl::Status ValidateOptions(const ServerOptions& o) {
  FLASHCP_RETURN_IF_ERROR(SplitHostPort(o.listen, "--listen").status());
  if (!o.metrics.empty()) FLASHCP_RETURN_IF_ERROR(SplitHostPort(o.metrics, "--metrics").status());
  if (o.threads < 1 || o.threads > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("--threads: must be in [1, 1024], got ",
                                                   o.threads));
  }
  if (o.queue_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--queue_size: must be at least 1, got ", o.queue_size));
  }
  if (o.stream_window < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--stream_window: must be at least 1, got ", o.stream_window));
  }
  if (o.limits.max_docs < 1 || o.limits.max_docs > core::kMaxDocs) {
    return absl::InvalidArgumentError(absl::StrCat("--max_docs: must be in [1, ", core::kMaxDocs,
                                                   "], got ", o.limits.max_docs));
  }
  if (o.limits.max_tokens < 1 || o.limits.max_tokens > core::kMaxTokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_tokens: must be in [1, 2^40], got ", o.limits.max_tokens));
  }
  if (o.limits.max_cp_size < 1 || o.limits.max_cp_size > core::kMaxCpSize) {
    return absl::InvalidArgumentError(absl::StrCat("--max_cp_size: must be in [1, ",
                                                   core::kMaxCpSize, "], got ",
                                                   o.limits.max_cp_size));
  }
  if (o.max_message_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_message_bytes: must be at least 1, got ", o.max_message_bytes));
  }
  if (o.tls_cert.empty() != o.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls_cert, --tls_key: set both or neither");
  }
  if (!o.tls_client_ca.empty() && o.tls_cert.empty()) {
    return absl::InvalidArgumentError("--tls_client_ca: needs --tls_cert and --tls_key");
  }
  if (o.drain_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--drain_timeout: must not be negative");
  }
  return ValidateRendezvousOptions(o.rendezvous);
}

absl::StatusOr<std::pair<std::string, int>> SplitHostPort(absl::string_view address,
                                                          absl::string_view flag) {
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": want HOST:PORT, got \"", address, "\""));
  }
  int port = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": the port must be 0..65535, got \"", address, "\""));
  }
  return std::make_pair(std::string(address.substr(0, colon)), port);
}

std::string ListeningLine(absl::string_view grpc_address, absl::string_view metrics_address) {
  return absl::StrCat("LISTENING grpc=", grpc_address,
                      " metrics=", metrics_address.empty() ? "-" : metrics_address);
}

absl::StatusOr<std::unique_ptr<PlannerServer>> PlannerServer::Start(const ServerOptions& options,
                                                                    ServiceObserver* observer,
                                                                    const Clock* clock) {
  FLASHCP_RETURN_IF_ERROR(ValidateOptions(options));
  FLASHCP_ASSIGN_OR_RETURN(const auto host_port, SplitHostPort(options.listen, "--listen"));
  FLASHCP_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                           MakeCredentials(options));

  std::unique_ptr<PlannerServer> s(new PlannerServer());
  s->options_ = options;
  FLASHCP_ASSIGN_OR_RETURN(
      s->pool_,
      PlanningPool::Create(
          PlanningPool::Options{options.threads, options.queue_size, options.testing_hold_planning},
          [observer](int64_t depth) { observer->OnQueueDepth(depth); }));
  ServiceDeps deps;
  deps.config.limits = options.limits;
  deps.config.stream_window = options.stream_window;
  deps.config.version = options.version;
  deps.pool = s->pool_.get();
  deps.clock = clock;
  deps.observer = observer;
  s->service_ = std::make_unique<PlannerService>(std::move(deps));

  // Both are process-wide switches that gRPC reads when a server is built.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.listen, credentials, &port);
  builder.RegisterService(s->service_.get());
  s->rendezvous_ = std::make_unique<RendezvousHost>(options.rendezvous);
  builder.RegisterService(s->rendezvous_->service());
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || port == 0) {
    s->pool_->Shutdown();
    return absl::UnavailableError(
        absl::StrCat("--listen: cannot listen on ", options.listen, " (address in use?)"));
  }
  s->address_ = absl::StrCat(host_port.first, ":", port);
  grpc::HealthCheckServiceInterface* health = s->server_->GetHealthCheckService();
  health->SetServingStatus(true);
  health->SetServingStatus(kServiceName, true);
  return s;
}

PlannerServer::~PlannerServer() { Shutdown(); }

void PlannerServer::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  if (server_ != nullptr) {
    // NOT_SERVING first, so that health watchers and load balancers see the
    // drain; then gRPC refuses new calls and waits for the in-flight ones.
    server_->GetHealthCheckService()->SetServingStatus(false);
    rendezvous_->Shutdown();  // waiting rendezvous calls end now with UNAVAILABLE
    pool_->Release();  // held jobs (test hook) must run for the drain to end
    server_->Shutdown(absl::ToChronoTime(absl::Now() + options_.drain_timeout));
    server_->Wait();
  }
  pool_->Shutdown();
}

absl::Status RunPlanner(const ServerOptions& options,
                        std::shared_ptr<prometheus::Registry> registry) {
  const SignalWaiter signals({SIGTERM, SIGINT, SIGUSR1});
  FLASHCP_RETURN_IF_ERROR(ValidateOptions(options));

  std::unique_ptr<prometheus::Exposer> exposer;
  std::string metrics_address;
  if (!options.metrics.empty()) {
    FLASHCP_ASSIGN_OR_RETURN(const auto host_port, SplitHostPort(options.metrics, "--metrics"));
    try {  // civetweb reports a failed bind by throwing; turn it into a Status here
      exposer = std::make_unique<prometheus::Exposer>(options.metrics, /*num_threads=*/2);
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("--metrics: cannot listen on ", options.metrics, ": ", e.what()));
    }
    const std::vector<int> ports = exposer->GetListeningPorts();
    if (ports.empty()) {
      return absl::UnavailableError(absl::StrCat("--metrics: cannot listen on ", options.metrics));
    }
    exposer->RegisterCollectable(registry);
    metrics_address = absl::StrCat(host_port.first, ":", ports.front());
  }

  const RealClock clock;
  PrometheusMetrics metrics(*registry, options.version);
  FLASHCP_ASSIGN_OR_RETURN(std::unique_ptr<PlannerServer> server,
                           PlannerServer::Start(options, &metrics, &clock));

  const std::string line = ListeningLine(server->address(), metrics_address);
  std::fprintf(stdout, "%s\n", line.c_str());
  std::fflush(stdout);
  FLASHCP_LOG(INFO) << "flashcp-planner " << options.version << ": " << line << " threads "
                    << options.threads << " queue " << options.queue_size;

  for (;;) {
    FLASHCP_ASSIGN_OR_RETURN(const int sig, signals.Wait());
    if (sig == SIGUSR1) {
      FLASHCP_LOG(INFO) << "SIGUSR1: planning released";
      server->ReleasePlanning();
      continue;
    }
    FLASHCP_LOG(INFO) << (sig == SIGTERM ? "SIGTERM" : "SIGINT") << ": draining";
    break;
  }
  server->Shutdown();
  FLASHCP_LOG(INFO) << "drained; exiting";
  return absl::OkStatus();
}

}  // namespace flashcp::planner_service
