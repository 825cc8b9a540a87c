// The planner server's assembly: options, the gRPC server with health and
// reflection, and the process lifecycle (signals, LISTENING line, drain).
// The pieces it wires (PlanningPool, PlannerService, PrometheusMetrics) know
// nothing of each other beyond their interfaces.
#ifndef FLASHCP_PLANNER_SERVICE_SERVER_H_
#define FLASHCP_PLANNER_SERVICE_SERVER_H_

#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/types.h"
#include "grpcpp/grpcpp.h"
#include "planner_service/clock.h"
#include "planner_service/observer.h"
#include "planner_service/planning_pool.h"
#include "planner_service/rendezvous_service.h"
#include "planner_service/service.h"
#include "prometheus/registry.h"

namespace flashcp::planner_service {

struct ServerOptions {
  std::string listen = "0.0.0.0:50051";  // HOST:PORT; port 0 picks a free port
  std::string metrics = "0.0.0.0:9464";  // HOST:PORT for /metrics; empty disables
  int threads = 2;                       // planning threads
  int queue_size = 256;                  // planning jobs that may wait
  int stream_window = 64;                // in-flight items per PlanStream
  core::BatchLimits limits;
  int max_message_bytes = 64 << 20;      // largest request accepted, bytes
  std::string tls_cert;                  // PEM files; TLS when tls_cert is set
  std::string tls_key;
  std::string tls_client_ca;             // mTLS: clients must present a cert it signed
  absl::Duration drain_timeout = absl::Seconds(30);  // then in-flight calls are cancelled
  RendezvousOptions rendezvous;          // the --rendezvous_* flags (ValidateRendezvousOptions)
  bool testing_hold_planning = false;    // test hook: plan nothing until SIGUSR1
  std::string version;                   // build version, for GetServerInfo and build_info
};

// InvalidArgument naming the flag ("--threads: ...") for a bad option.
absl::Status ValidateOptions(const ServerOptions& options);

// "host:port" -> ("host", port); the host may be bracketed IPv6 ("[::1]").
// InvalidArgument naming `flag` unless the port is 0..65535 and the host non-empty.
absl::StatusOr<std::pair<std::string, int>> SplitHostPort(absl::string_view address,
                                                          absl::string_view flag);

// The one startup line other tools parse; keep it stable:
//   LISTENING grpc=HOST:PORT metrics=HOST:PORT    (metrics=- when disabled)
std::string ListeningLine(absl::string_view grpc_address, absl::string_view metrics_address);

// A running gRPC server: the planning pool, the service, health and reflection.
class PlannerServer {
 public:
  // Binds and starts serving; health reports SERVING for "" and
  // "flashcp.v1.Planner". `observer` and `clock` must outlive the server.
  static absl::StatusOr<std::unique_ptr<PlannerServer>> Start(const ServerOptions& options,
                                                             ServiceObserver* observer,
                                                             const Clock* clock);
  ~PlannerServer();  // Shutdown()

  // HOST:PORT with the bound port.
  const std::string& address() const { return address_; }

  // Lets planning start (ServerOptions::testing_hold_planning).
  void ReleasePlanning() { pool_->Release(); }

  // Drains: health NOT_SERVING, no new calls, in-flight calls finish (those
  // still running after drain_timeout are cancelled), then the pool stops.
  // Idempotent.
  void Shutdown();

 private:
  PlannerServer() = default;

  ServerOptions options_;
  std::string address_;
  std::unique_ptr<PlanningPool> pool_;
  std::unique_ptr<PlannerService> service_;
  std::unique_ptr<RendezvousHost> rendezvous_;  // flashcp.v1.Rendezvous, for worker groups
  std::unique_ptr<grpc::Server> server_;
  bool shut_down_ = false;
};

// The binary's life: blocks SIGTERM, SIGINT and SIGUSR1; serves /metrics from
// `registry` (unless options.metrics is empty) and the planner; prints the
// LISTENING line to stdout; on SIGTERM or SIGINT drains and returns OK.
// SIGUSR1 releases testing_hold_planning. Call before starting any thread.
absl::Status RunPlanner(const ServerOptions& options,
                        std::shared_ptr<prometheus::Registry> registry);

}  // namespace flashcp::planner_service

#endif  // FLASHCP_PLANNER_SERVICE_SERVER_H_
