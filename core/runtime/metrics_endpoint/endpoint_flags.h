// The /metrics server's flags, --metrics_max_connections and
// --metrics_request_timeout
// (absl flags, read by core/flags.h): defined once here for the programs that
// serve /metrics (flashcp-planner, flashcp-worker), their defaults
// EndpointOptions{}'s. Its own target (flashcp_metrics_endpoint_flags): no
// other program gets them.
#ifndef FLASHCP_RUNTIME_METRICS_ENDPOINT_ENDPOINT_FLAGS_H_
#define FLASHCP_RUNTIME_METRICS_ENDPOINT_ENDPOINT_FLAGS_H_

#include "core/runtime/metrics_endpoint/metrics_endpoint.h"

namespace flashcp::core::runtime::metrics_endpoint {

// The flags as parsed, unchecked (ValidateEndpointOptions checks them).
EndpointOptions EndpointOptionsFromFlags();

}  // namespace flashcp::core::runtime::metrics_endpoint

#endif  // FLASHCP_RUNTIME_METRICS_ENDPOINT_ENDPOINT_FLAGS_H_
