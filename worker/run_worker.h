// flashcp-worker's process: the planner channels, the /metrics endpoint, the
// rank backend, the daemon and its WorkerControl server, and the signals
// that end it. worker_main.cc only turns flags into WorkerOptions.
#ifndef FLASHCP_WORKER_RUN_WORKER_H_
#define FLASHCP_WORKER_RUN_WORKER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "client/grpc_planner_client.h"
#include "core/runtime/listener/resilient_server.h"
#include "prometheus/registry.h"
#include "core/runtime/metrics_endpoint/metrics_endpoint.h"
#include "worker/daemon_options.h"
#include "worker/rank_backend.h"

namespace flashcp::worker {

struct WorkerOptions {
  DaemonOptions daemon;
  std::string planner = "127.0.0.1:50051";  // planner gRPC HOST:PORT
  std::string rendezvous;                   // the Rendezvous' HOST:PORT; empty: the planner's
  client::ChannelOptions channel;           // both channels' (TLS)
  std::string metrics = "127.0.0.1:0";      // /metrics HOST:PORT; port 0 picks one
  core::runtime::metrics_endpoint::EndpointOptions metrics_http;
  std::string control = "127.0.0.1:0";  // WorkerControl (and health) HOST:PORT; port 0 picks one
  // The control port's connection bounds and listener rebuild (the planner's defaults).
  core::runtime::listener::ConnectionOptions connections;
  int32_t local_rank = -1;              // the local_rank label; -1: none
  std::string version;                  // build_info's version
  CudaBackendFactory cuda;              // --device cuda:K's backend; empty: built without CUDA
};

// ValidateDaemonOptions, and InvalidArgument naming --local_rank, or --control
// or --metrics unless HOST:PORT with a port in 0..65535.
absl::Status ValidateWorkerOptions(const WorkerOptions& options);

// The binary's life. Blocks SIGTERM and SIGINT (call before any thread
// starts); serves /metrics from `registry` (PrometheusWorkerMetrics records
// into it) and WorkerControl with grpc.health.v1.Health
// (SERVING for "" and "flashcp.v1.WorkerControl" while the daemon runs,
// NOT_SERVING as the control server drains or while its listener is stalled;
// listener/resilient_server.h rebuilds it); prints
//   WORKER rank=R control=HOST:PORT metrics=HOST:PORT
// to stdout once both are bound; runs the daemon, which a SIGTERM or SIGINT
// ends after the step in flight. The daemon's Status, or the first setup
// failure (Unavailable naming --control or --metrics for an address it
// cannot listen on).
absl::Status RunWorker(const WorkerOptions& options,
                       std::shared_ptr<prometheus::Registry> registry);

}  // namespace flashcp::worker

#endif  // FLASHCP_WORKER_RUN_WORKER_H_
