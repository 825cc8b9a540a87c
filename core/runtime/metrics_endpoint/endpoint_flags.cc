#include "core/runtime/metrics_endpoint/endpoint_flags.h"

#include <cstdint>

#include "absl/flags/flag.h"
#include "absl/time/time.h"

ABSL_FLAG(int32_t, metrics_threads,
          flashcp::core::runtime::metrics_endpoint::EndpointOptions{}.threads,
          "connections the /metrics server serves at once, in [1, 256]");
ABSL_FLAG(absl::Duration, metrics_request_timeout,
          flashcp::core::runtime::metrics_endpoint::EndpointOptions{}.request_timeout,
          "a /metrics connection that has not sent its request in this is closed, in [1ms, 10m]");

namespace flashcp::core::runtime::metrics_endpoint {

EndpointOptions EndpointOptionsFromFlags() {
  return {absl::GetFlag(FLAGS_metrics_threads), absl::GetFlag(FLAGS_metrics_request_timeout)};
}

}  // namespace flashcp::core::runtime::metrics_endpoint
