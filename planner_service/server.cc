#include "planner_service/server.h"

#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/file.h"
#include "core/log.h"
#include "core/status_macros.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/security/server_credentials.h"
#include "planner_service/log_limiter.h"
#include "planner_service/metrics.h"
#include "proto/convert.h"
#include "proto/rendezvous_limits.h"
#include "core/runtime/process/host_port.h"
#include "core/runtime/process/signals.h"

namespace flashcp::planner_service {
namespace {

constexpr char kPlannerServiceName[] = "flashcp.v1.Planner";
constexpr char kRendezvousServiceName[] = "flashcp.v1.Rendezvous";

bool ServesPlanning(ServeRole r) { return r != ServeRole::kRendezvous; }
bool ServesRendezvous(ServeRole r) { return r != ServeRole::kPlanning; }

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeCredentials(
    const ServerOptions& options) {
  if (options.tls_cert.empty()) return grpc::InsecureServerCredentials();
  FLASHCP_ASSIGN_OR_RETURN(const std::string cert,
                           core::ReadPem(options.tls_cert, "--tls_cert", "CERTIFICATE"));
  FLASHCP_ASSIGN_OR_RETURN(const std::string key,
                           core::ReadPem(options.tls_key, "--tls_key", "PRIVATE KEY"));
  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  if (!options.tls_client_ca.empty()) {
    FLASHCP_ASSIGN_OR_RETURN(ssl.pem_root_certs,
                             core::ReadPem(options.tls_client_ca, "--tls_client_ca",
                                             "CERTIFICATE"));
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  ssl.pem_key_cert_pairs.push_back({key, cert});
  return grpc::SslServerCredentials(ssl);
}

}  // namespace

absl::StatusOr<ServeRole> ParseServeRole(absl::string_view name) {
  if (name == "all") return ServeRole::kAll;
  if (name == "planning") return ServeRole::kPlanning;
  if (name == "rendezvous") return ServeRole::kRendezvous;
  return absl::InvalidArgumentError(
      absl::StrCat("--serve: want all, planning or rendezvous, got \"", name, "\""));
}

namespace {

// ValidateOptions in parts, checked in this order: the pools, queues and
// batch limits; the per-plan and per-stream byte bounds; the ILP and TLS;
// the connections' timeouts and the listener.
absl::Status ValidatePoolsAndLimits(const ServerOptions& o) {
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
  if (o.max_message_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_message_bytes: must be at least 0 (0: from the limits), got ", o.max_message_bytes));
  }
  if (o.queue_per_client < 0 || o.queue_per_client > o.queue_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("--queue_per_client: must be in [0, --queue_size = ", o.queue_size,
                     "] (0: queue_size / 4), got ", o.queue_per_client));
  }
  return absl::OkStatus();
}

absl::Status ValidateByteBounds(const ServerOptions& o) {
  if (o.bounds.max_shard_ranks < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_shard_ranks: must be at least 1, got ", o.bounds.max_shard_ranks));
  }
  if (o.bounds.max_response_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_response_bytes: must be at least 1, got ", o.bounds.max_response_bytes));
  }
  if (o.stream_window_bytes < o.bounds.max_response_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--stream_window_bytes: must be at least --max_response_bytes = ",
        o.bounds.max_response_bytes, ", got ", o.stream_window_bytes));
  }
  if (o.stream_buffer_bytes < o.stream_window_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--stream_buffer_bytes: must be at least --stream_window_bytes = ", o.stream_window_bytes,
        ", got ", o.stream_buffer_bytes));
  }
  return absl::OkStatus();
}

absl::Status ValidateIlpTlsAndConnections(const ServerOptions& o) {
  if (o.ilp_threads < 1 || o.ilp_threads > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ilp_threads: must be in [1, 64], got ", o.ilp_threads));
  }
  if (o.ilp_time_limit < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--ilp_time_limit: must not be negative");
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
  for (const auto& [flag, d] : {std::pair{"--handshake_timeout", o.handshake_timeout},
                                {"--max_connection_idle", o.max_connection_idle},
                                {"--max_connection_age", o.max_connection_age},
                                {"--max_connection_age_grace", o.max_connection_age_grace},
                                {"--listener_check_interval", o.listener_check_interval}}) {
    if (d < absl::ZeroDuration() || d > absl::Hours(24 * 365)) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": must be in [0, 365d], got ", absl::FormatDuration(d)));
    }
  }
  if (o.handshake_timeout < absl::Milliseconds(1)) {
    return absl::InvalidArgumentError("--handshake_timeout: must be at least 1ms");
  }
  if (o.grpc_max_threads < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("--grpc_max_threads: must be at least 2, got ", o.grpc_max_threads));
  }
  if (o.listener_stall_checks < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--listener_stall_checks: must be at least 1, got ", o.listener_stall_checks));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateOptions(const ServerOptions& o) {
  FLASHCP_RETURN_IF_ERROR(core::runtime::process::SplitHostPort(o.listen, "--listen").status());
  if (!o.metrics.empty()) {
    FLASHCP_RETURN_IF_ERROR(core::runtime::process::SplitHostPort(o.metrics, "--metrics").status());
  }
  FLASHCP_RETURN_IF_ERROR(ValidatePoolsAndLimits(o));
  FLASHCP_RETURN_IF_ERROR(ValidateByteBounds(o));
  FLASHCP_RETURN_IF_ERROR(ValidateIlpTlsAndConnections(o));
  FLASHCP_RETURN_IF_ERROR(core::runtime::metrics_endpoint::ValidateEndpointOptions(o.metrics_http));
  return ValidateRendezvousOptions(o.rendezvous);
}

int MaxMessageBytes(const ServerOptions& o) {
  if (o.max_message_bytes > 0) return o.max_message_bytes;
  namespace rdv = proto::rendezvous;
  // A Set's value or a Get's keys (each with its tag and length), and room
  // for the small fields.
  constexpr int64_t kRendezvous = int64_t{rdv::kMaxValueBytes} +
                                  int64_t{rdv::kMaxKeysPerGet} * (rdv::kMaxKeyBytes + 3) + 4096;
  return static_cast<int>(
      std::max({proto::MaxRequestBytes(o.limits), kRendezvous, proto::kMaxReportBytes}));
}

std::string ListeningLine(absl::string_view grpc_address, absl::string_view metrics_address) {
  return absl::StrCat("LISTENING grpc=", grpc_address,
                      " metrics=", metrics_address.empty() ? "-" : metrics_address);
}

absl::StatusOr<int64_t> RaiseFdLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) {
    return absl::InternalError(absl::StrCat("getrlimit(RLIMIT_NOFILE): ", std::strerror(errno)));
  }
  if (limit.rlim_cur != limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &limit) != 0) {
      return absl::InternalError(
          absl::StrCat("setrlimit(RLIMIT_NOFILE): ", std::strerror(errno)));
    }
  }
  return static_cast<int64_t>(limit.rlim_cur);
}

absl::StatusOr<std::unique_ptr<PlannerServer>> PlannerServer::Start(
    const ServerOptions& options, ServiceObserver* observer, const core::Clock* clock,
    RendezvousObserver* rendezvous_observer) {
  FLASHCP_RETURN_IF_ERROR(ValidateOptions(options));
  FLASHCP_ASSIGN_OR_RETURN(const auto host_port,
                           core::runtime::process::SplitHostPort(options.listen, "--listen"));
  FLASHCP_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                           MakeCredentials(options));

  std::unique_ptr<PlannerServer> s(new PlannerServer());
  s->options_ = options;
  FLASHCP_ASSIGN_OR_RETURN(
      s->pool_,
      PlanningPool::Create(
          PlanningPool::Options{options.threads, options.queue_size, options.testing_hold_planning,
                                options.queue_per_client > 0
                                    ? options.queue_per_client
                                    : std::max(1, options.queue_size / 4)},
          [observer](int64_t depth) { observer->OnQueueDepth(depth); }));
  if (options.allow_ilp) {
    FLASHCP_ASSIGN_OR_RETURN(
        s->ilp_pool_, PlanningPool::Create(PlanningPool::Options{
                          options.ilp_threads, options.ilp_threads, options.testing_hold_planning,
                          /*client_capacity=*/0}));
  }
  s->stream_bytes_ = std::make_unique<HeldBytes>(
      options.stream_buffer_bytes, [observer](int64_t bytes) { observer->OnStreamHeldBytes(bytes); });
  ServiceDeps deps;
  deps.config.limits = options.limits;
  deps.config.bounds = options.bounds;
  deps.config.stream_window = options.stream_window;
  deps.config.stream_window_bytes = options.stream_window_bytes;
  deps.config.allow_ilp = options.allow_ilp;
  deps.config.ilp_time_limit = options.ilp_time_limit;
  deps.config.version = options.version;
  deps.pool = s->pool_.get();
  deps.ilp_pool = s->ilp_pool_.get();
  deps.stream_bytes = s->stream_bytes_.get();
  deps.clock = clock;
  deps.observer = observer;
  s->calibration_ = std::make_unique<Calibration>(observer, options.calibration);
  deps.calibration = s->calibration_.get();
  s->report_limiter_ = std::make_unique<KeyedRateLimiter>(options.report_rate, clock);
  deps.report_limiter = s->report_limiter_.get();
  s->pipeline_service_ = std::make_unique<PipelinePlannerService>(deps);
  s->global_batch_service_ = std::make_unique<GlobalBatchPlannerService>(deps);
  s->many_service_ = std::make_unique<ManyPlannerService>(deps);
  s->service_ = std::make_unique<PlannerService>(std::move(deps));

  s->rendezvous_ = std::make_unique<RendezvousHost>(options.rendezvous, /*clock=*/nullptr,
                                                    RandomToken, rendezvous_observer);
  // A process-wide switch that gRPC reads when a server is built.
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  PlannerServer* server = s.get();
  const int max_message_bytes = MaxMessageBytes(options);
  std::vector<std::string> health;
  if (ServesPlanning(options.serve)) health.push_back(kPlannerServiceName);
  if (ServesRendezvous(options.serve)) health.push_back(kRendezvousServiceName);
  core::runtime::listener::ConnectionOptions connections;
  connections.handshake_timeout = options.handshake_timeout;
  connections.max_connection_idle = options.max_connection_idle;
  connections.max_connection_age = options.max_connection_age;
  connections.max_connection_age_grace = options.max_connection_age_grace;
  connections.max_threads = options.grpc_max_threads;
  connections.listener_check_interval = options.listener_check_interval;
  connections.listener_stall_checks = options.listener_stall_checks;
  absl::StatusOr<std::unique_ptr<core::runtime::listener::ResilientServer>> started =
      core::runtime::listener::ResilientServer::Start(
          options.listen, "--listen", credentials, connections,
          [server, max_message_bytes](grpc::ServerBuilder& builder) {
            if (ServesPlanning(server->options_.serve)) {
              builder.RegisterService(server->service_.get());
              builder.RegisterService(server->pipeline_service_.get());
              builder.RegisterService(server->global_batch_service_.get());
              builder.RegisterService(server->many_service_.get());
            }
            if (ServesRendezvous(server->options_.serve)) {
              builder.RegisterService(server->rendezvous_->service());
            }
            builder.SetMaxReceiveMessageSize(max_message_bytes);
          },
          std::move(health), &s->watchdog_clock_);
  if (!started.ok()) {
    s->pool_->Shutdown();
    if (s->ilp_pool_) s->ilp_pool_->Shutdown();
    return started.status();
  }
  s->server_ = *std::move(started);
  s->address_ = absl::StrCat(host_port.first, ":", s->server_->port());
  return s;
}

PlannerServer::~PlannerServer() { Shutdown(); }

void PlannerServer::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  if (server_ != nullptr) {
    // NOT_SERVING first, so that health watchers and load balancers see the
    // drain; then gRPC refuses new calls and waits for the in-flight ones.
    server_->BeginDrain();
    rendezvous_->Shutdown();  // waiting rendezvous calls end now with UNAVAILABLE
    pool_->Release();  // held jobs (test hook) must run for the drain to end
    if (ilp_pool_) ilp_pool_->Release();
    server_->Shutdown(absl::Now() + options_.drain_timeout);
  }
  pool_->Shutdown();
  if (ilp_pool_) ilp_pool_->Shutdown();
}

absl::Status RunPlanner(const ServerOptions& options,
                        std::shared_ptr<prometheus::Registry> registry) {
  const core::runtime::process::SignalWaiter signals({SIGTERM, SIGINT, SIGUSR1});
  FLASHCP_RETURN_IF_ERROR(ValidateOptions(options));

  std::unique_ptr<core::runtime::metrics_endpoint::MetricsServer> exposer;
  std::string metrics_address;
  if (!options.metrics.empty()) {
    FLASHCP_ASSIGN_OR_RETURN(const auto host_port,
                             core::runtime::process::SplitHostPort(options.metrics, "--metrics"));
    FLASHCP_ASSIGN_OR_RETURN(exposer,
                             core::runtime::metrics_endpoint::MetricsServer::Start(options.metrics,
                                                                                options.metrics_http));
    exposer->RegisterCollectable(registry);
    metrics_address = absl::StrCat(host_port.first, ":", exposer->port());
  }

  FLASHCP_ASSIGN_OR_RETURN(const int64_t fd_limit, RaiseFdLimit());
  const core::RealClock clock;
  // Any client can make protobuf log (a string field with invalid UTF-8 logs
  // one ERROR line per message): kProtobufLogLines per kProtobufLogWindow.
  LogLimiter protobuf_log_limiter(kProtobufLogLines, kProtobufLogWindow, &clock);
  RouteProtobufLogs(&protobuf_log_limiter);
  struct Unroute {  // before the limiter goes, on every return
    ~Unroute() { RouteProtobufLogs(nullptr); }
  } unroute;
  PrometheusMetrics metrics(*registry, options.version);
  metrics.SetQueueCapacity(options.queue_size);
  FLASHCP_ASSIGN_OR_RETURN(std::unique_ptr<PlannerServer> server,
                           PlannerServer::Start(options, &metrics, &clock, &metrics));

  const std::string line = ListeningLine(server->address(), metrics_address);
  std::fprintf(stdout, "%s\n", line.c_str());
  std::fflush(stdout);
  FLASHCP_LOG(INFO) << "flashcp-planner " << options.version << ": " << line << " threads "
                    << options.threads << " queue " << options.queue_size << " fd limit " << fd_limit;

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
