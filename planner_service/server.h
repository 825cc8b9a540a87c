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
#include "core/clock.h"
#include "core/types.h"
#include "grpcpp/grpcpp.h"
#include "planner_service/calibration.h"
#include "planner_service/held_bytes.h"
#include "core/runtime/listener/resilient_server.h"
#include "planner_service/observer.h"
#include "proto/plan_batch.h"
#include "planner_service/planning_pool.h"
#include "planner_service/rate_limiter.h"
#include "planner_service/rendezvous_service.h"
#include "planner_service/global_batch_service.h"
#include "planner_service/plan_many_service.h"
#include "planner_service/pipeline_service.h"
#include "planner_service/service.h"
#include "prometheus/registry.h"
#include "core/runtime/metrics_endpoint/metrics_endpoint.h"

namespace flashcp::planner_service {

// What one planner process serves (--serve). Planning is stateless, so its
// replicas scale behind one Service; the rendezvous holds the forming groups'
// state in memory, so it runs as one replica of its own (docs/deploy.md).
enum class ServeRole { kAll, kPlanning, kRendezvous };
// "all", "planning" or "rendezvous"; InvalidArgument naming --serve otherwise.
absl::StatusOr<ServeRole> ParseServeRole(absl::string_view name);

struct ServerOptions {
  std::string listen = "0.0.0.0:50051";  // HOST:PORT; port 0 picks a free port
  ServeRole serve = ServeRole::kAll;     // flashcp.v1.Planner, flashcp.v1.Rendezvous, or both
  std::string metrics = "0.0.0.0:9464";  // HOST:PORT for /metrics; empty disables
  int threads = 2;                       // planning threads
  int queue_size = 256;                  // planning jobs that may wait
  int queue_per_client = 0;              // of those, one client's; 0: queue_size / 4
  int stream_window = ServiceConfig{}.stream_window;  // in-flight items per PlanStream
  // Unread response bytes per PlanStream.
  int64_t stream_window_bytes = ServiceConfig{}.stream_window_bytes;
  int64_t stream_buffer_bytes = int64_t{512} << 20;  // unread response bytes, all streams
  core::BatchLimits limits = ServiceConfig{}.limits;  // kDefaultBatchLimits
  proto::PlanBounds bounds;              // --max_shard_ranks, --max_response_bytes
  // Largest message accepted, bytes; 0 sizes it from the limits (the largest
  // valid PlanRequest, proto::MaxRequestBytes, or Rendezvous request).
  int max_message_bytes = 0;
  bool allow_ilp = ServiceConfig{}.allow_ilp;  // `ilp` plans; refused (UNIMPLEMENTED) when off
  int ilp_threads = 1;                   // ILP plans at once (their own pool; as many may wait)
  absl::Duration ilp_time_limit = ServiceConfig{}.ilp_time_limit;  // per ILP call, from its arrival
  std::string tls_cert;                  // PEM files; TLS when tls_cert is set
  std::string tls_key;
  std::string tls_client_ca;             // mTLS: clients must present a cert it signed
  absl::Duration drain_timeout = absl::Seconds(30);  // then in-flight calls are cancelled
  RendezvousOptions rendezvous;          // the --rendezvous_* flags (ValidateRendezvousOptions)
  // Connections (docs/deploy.md, "Connections"). gRPC 1.51 has no bound on
  // their number; the fd limit is the bound, and these reap the idle ones.
  absl::Duration handshake_timeout = absl::Seconds(10);     // TCP open, no HTTP/2 (TLS) yet
  absl::Duration max_connection_idle = absl::Minutes(5);    // no call for this long: GOAWAY
  absl::Duration max_connection_age = absl::ZeroDuration(); // 0: unbounded
  absl::Duration max_connection_age_grace = absl::Minutes(1);  // calls may finish, then closed
  int grpc_max_threads = 2048;  // threads gRPC may make for synchronous handlers
  // Once the listener has left connections unaccepted for
  // listener_stall_checks checks in a row, listener_check_interval apart (0
  // disables the check), health says NOT_SERVING and the server is rebuilt on
  // its port (listener/resilient_server.h).
  absl::Duration listener_check_interval = absl::Seconds(1);
  int listener_stall_checks = 5;
  core::runtime::metrics_endpoint::EndpointOptions metrics_http;  // the /metrics server's bounds
  CalibrationOptions calibration;        // ReportStepTimes' windows (calibration.h)
  KeyedRateLimiter::Options report_rate;  // ReportStepTimes per client
  bool testing_hold_planning = false;    // test hook: plan nothing until SIGUSR1
  std::string version;                   // build version, for GetServerInfo and build_info
};

// InvalidArgument naming the flag ("--threads: ...") for a bad option.
absl::Status ValidateOptions(const ServerOptions& options);

// The server's receive limit: options.max_message_bytes, or where 0 the
// largest valid request of either service at the options' limits.
int MaxMessageBytes(const ServerOptions& options);

// The one startup line other tools parse; keep it stable:
//   LISTENING grpc=HOST:PORT metrics=HOST:PORT    (metrics=- when disabled)
std::string ListeningLine(absl::string_view grpc_address, absl::string_view metrics_address);

// protobuf's log lines (clients cause them) the planner writes: at most
// kProtobufLogLines per kProtobufLogWindow, then a count of those dropped.
inline constexpr int kProtobufLogLines = 10;
inline constexpr absl::Duration kProtobufLogWindow = absl::Minutes(1);

// Raises this process's soft RLIMIT_NOFILE to its hard limit (every accepted
// connection holds an fd); the new soft limit. Internal with errno's text.
absl::StatusOr<int64_t> RaiseFdLimit();

// A running gRPC server: the planning pool, the service, health and reflection.
class PlannerServer {
 public:
  // Binds and starts serving the services of options.serve; health reports
  // SERVING for "" and the name of each service served ("flashcp.v1.Planner",
  // "flashcp.v1.Rendezvous"; NOT_SERVING from a stalled listener until the
  // server is rebuilt). A service not served answers UNIMPLEMENTED.
  // `observer`, `clock` and `rendezvous_observer` (null: none) must outlive
  // the server.
  static absl::StatusOr<std::unique_ptr<PlannerServer>> Start(
      const ServerOptions& options, ServiceObserver* observer, const core::Clock* clock,
      RendezvousObserver* rendezvous_observer = nullptr);
  ~PlannerServer();  // Shutdown()

  // HOST:PORT with the bound port.
  const std::string& address() const { return address_; }

  // Servers rebuilt after a stalled listener.
  int64_t rebuilds() const { return server_->rebuilds(); }

  // Lets planning start (ServerOptions::testing_hold_planning).
  void ReleasePlanning() {
    pool_->Release();
    if (ilp_pool_) ilp_pool_->Release();
  }

  // Drains: health NOT_SERVING, no new calls, in-flight calls finish (those
  // still running after drain_timeout are cancelled, which stops their plans
  // at the planners' next check), then the pools stop.
  // Idempotent.
  void Shutdown();

 private:
  PlannerServer() = default;

  ServerOptions options_;
  std::string address_;
  std::unique_ptr<PlanningPool> pool_;
  std::unique_ptr<PlanningPool> ilp_pool_;  // when allow_ilp
  std::unique_ptr<HeldBytes> stream_bytes_;
  std::unique_ptr<Calibration> calibration_;  // cost profiles' online fits
  std::unique_ptr<KeyedRateLimiter> report_limiter_;
  std::unique_ptr<PlannerService> service_;
  std::unique_ptr<PipelinePlannerService> pipeline_service_;  // flashcp.v1.PipelinePlanner
  std::unique_ptr<GlobalBatchPlannerService> global_batch_service_;  // flashcp.v1.GlobalBatchPlanner
  std::unique_ptr<ManyPlannerService> many_service_;  // flashcp.v1.ManyPlanner
  std::unique_ptr<RendezvousHost> rendezvous_;  // flashcp.v1.Rendezvous, for worker groups
  core::RealClock watchdog_clock_;
  std::unique_ptr<core::runtime::listener::ResilientServer> server_;
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
