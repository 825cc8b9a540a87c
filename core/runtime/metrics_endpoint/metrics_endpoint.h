// The Prometheus /metrics HTTP endpoint that the planner and the worker both
// serve: prometheus-cpp's Exposer (civetweb underneath) with bounds on what
// idle connections can hold. civetweb serves one connection per thread and
// waits request_timeout for a request to arrive, so with prometheus-cpp's
// default (2 threads, civetweb's 30 s) two silent TCP connections stop every
// scrape; here more threads serve, and a connection that has not sent its
// request in time is closed.
#ifndef FLASHCP_RUNTIME_METRICS_ENDPOINT_METRICS_ENDPOINT_H_
#define FLASHCP_RUNTIME_METRICS_ENDPOINT_METRICS_ENDPOINT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "prometheus/exposer.h"

namespace flashcp::core::runtime::metrics_endpoint {

struct EndpointOptions {
  int threads = 8;  // connections served at once (civetweb num_threads), 1..256
  // How long a connection may take to send a complete request (and the
  // server to write the answer) before it is closed (civetweb
  // request_timeout_ms); 1 ms .. 10 min.
  absl::Duration request_timeout = absl::Seconds(2);
};

// InvalidArgument naming --metrics_threads or --metrics_request_timeout.
absl::Status ValidateEndpointOptions(const EndpointOptions& options);

// civetweb's options for an Exposer listening on `address` (HOST:PORT, as
// civetweb spells it: "[::1]:0" for IPv6).
std::vector<std::string> CivetwebOptions(absl::string_view address,
                                         const EndpointOptions& options);

// An Exposer listening on `address`. Unavailable naming --metrics if it
// cannot listen there; the options' errors as ValidateEndpointOptions.
absl::StatusOr<std::unique_ptr<prometheus::Exposer>> StartExposer(absl::string_view address,
                                                                  const EndpointOptions& options);

}  // namespace flashcp::core::runtime::metrics_endpoint

#endif  // FLASHCP_RUNTIME_METRICS_ENDPOINT_METRICS_ENDPOINT_H_
