#include "core/runtime/metrics_endpoint/endpoint_flags.h"

#include <cstdint>

#include "absl/flags/flag.h"
#include "absl/time/time.h"

ABSL_FLAG(int32_t, metrics_max_connections,
          flashcp::core::runtime::metrics_endpoint::EndpointOptions{}.max_connections,
          "connections the /metrics and /healthz server keeps open, in [1, 65536]; one more "
          "closes the oldest");
ABSL_FLAG(absl::Duration, metrics_request_timeout,
          flashcp::core::runtime::metrics_endpoint::EndpointOptions{}.request_timeout,
          "a /metrics connection that has not sent its request (or read its answer) in this is "
          "closed, in [1ms, 10m]");

namespace flashcp::core::runtime::metrics_endpoint {

EndpointOptions EndpointOptionsFromFlags() {
  return {absl::GetFlag(FLAGS_metrics_max_connections),
          absl::GetFlag(FLAGS_metrics_request_timeout)};
}

}  // namespace flashcp::core::runtime::metrics_endpoint
