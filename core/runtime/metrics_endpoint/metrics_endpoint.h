// The HTTP endpoint that the planner and the worker serve on --metrics:
// GET /metrics (the Prometheus text format of the registered collectables)
// and GET /healthz (the liveness probe). It replaces prometheus-cpp's Exposer,
// whose civetweb serves one connection per thread and waits for each
// connection's request: with 8 threads and a 2 s request timeout, ~40 silent
// TCP connections held a scrape for ~10 s, Prometheus's default scrape
// timeout (issue 31 item 8). Here one thread polls every connection, so a
// silent connection costs an fd and a slot, not a thread, and a request that
// arrives is answered at once, whatever else is open:
// - at most max_connections are open; accepting one more closes the oldest,
//   so a flood of silent connections cannot keep a new one out;
// - a connection that has not sent its request, or not read its answer,
//   within request_timeout is closed;
// - one fd is held in reserve: when accept() fails for want of fds (EMFILE,
//   ENFILE: a connection flood on the process's gRPC port), the reserve is
//   released to accept and answer one connection, so the liveness probe is
//   answered while the process is out of fds (issue 31 item 7).
#ifndef FLASHCP_RUNTIME_METRICS_ENDPOINT_METRICS_ENDPOINT_H_
#define FLASHCP_RUNTIME_METRICS_ENDPOINT_METRICS_ENDPOINT_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "prometheus/collectable.h"

namespace flashcp::core::runtime::metrics_endpoint {

struct EndpointOptions {
  // Connections open at once, 1..65536; one more closes the oldest.
  int max_connections = 256;
  // How long a connection may take to send a complete request, and then to
  // read the answer, before it is closed; 1 ms .. 10 min.
  absl::Duration request_timeout = absl::Seconds(2);
};

// InvalidArgument naming --metrics_max_connections or --metrics_request_timeout.
absl::Status ValidateEndpointOptions(const EndpointOptions& options);

// What /healthz answers: OK is 200 "ok", an error 503 with its message.
using LivenessCheck = std::function<absl::Status()>;

class MetricsServer {
 public:
  // Listens on `address` (HOST:PORT, port 0 picks one; IPv6 as "[::1]:0")
  // and serves from a thread of its own. Unavailable naming --metrics if it
  // cannot listen there; the options' errors as ValidateEndpointOptions.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(absl::string_view address,
                                                            const EndpointOptions& options);
  ~MetricsServer();  // stops the thread and closes every connection
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // Each /metrics answer collects what is still alive of these.
  void RegisterCollectable(const std::weak_ptr<prometheus::Collectable>& collectable);
  // /healthz's check (none: always 200). Runs on the server's thread, so it
  // must not block.
  void SetLivenessCheck(LivenessCheck check);
  int port() const { return port_; }
  // Connections accepted with the reserve fd (tests read it).
  int64_t reserve_accepts() const;

 private:
  struct Connection;
  MetricsServer(int listen_fd, int wake_fd, int port, EndpointOptions options);
  void Loop();
  void Accept(std::vector<Connection>& connections);
  // Reads or writes what `c` is ready for; true when it is done (to close).
  bool Serve(Connection& c);
  // The answer to one request (its first line and headers in `request`).
  std::string Answer(absl::string_view request);

  const int listen_fd_;
  const int wake_fd_;  // an eventfd: written once to stop the loop
  const int port_;
  const EndpointOptions options_;
  int reserve_fd_ = -1;  // the loop's own; -1 while released
  mutable absl::Mutex mu_;
  std::vector<std::weak_ptr<prometheus::Collectable>> collectables_ ABSL_GUARDED_BY(mu_);
  LivenessCheck liveness_ ABSL_GUARDED_BY(mu_);
  int64_t reserve_accepts_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace flashcp::core::runtime::metrics_endpoint

#endif  // FLASHCP_RUNTIME_METRICS_ENDPOINT_METRICS_ENDPOINT_H_
