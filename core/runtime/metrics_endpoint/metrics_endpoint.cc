#include "core/runtime/metrics_endpoint/metrics_endpoint.h"

#include <exception>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace flashcp::core::runtime::metrics_endpoint {

absl::Status ValidateEndpointOptions(const EndpointOptions& o) {
  if (o.threads < 1 || o.threads > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_threads: must be in [1, 256], got ", o.threads));
  }
  if (o.request_timeout < absl::Milliseconds(1) || o.request_timeout > absl::Minutes(10)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_request_timeout: must be in [1ms, 10m], got ",
                     absl::FormatDuration(o.request_timeout)));
  }
  return absl::OkStatus();
}

std::vector<std::string> CivetwebOptions(absl::string_view address, const EndpointOptions& o) {
  return {"listening_ports",
          std::string(address),
          "num_threads",
          absl::StrCat(o.threads),
          "request_timeout_ms",
          absl::StrCat(absl::ToInt64Milliseconds(o.request_timeout))};
}

absl::StatusOr<std::unique_ptr<prometheus::Exposer>> StartExposer(absl::string_view address,
                                                                  const EndpointOptions& options) {
  FLASHCP_RETURN_IF_ERROR(ValidateEndpointOptions(options));
  std::unique_ptr<prometheus::Exposer> exposer;
  try {  // civetweb reports a failed bind by throwing; turn it into a Status here
    exposer = std::make_unique<prometheus::Exposer>(CivetwebOptions(address, options));
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("--metrics: cannot listen on ", address, ": ", e.what()));
  }
  if (exposer->GetListeningPorts().empty()) {
    return absl::UnavailableError(absl::StrCat("--metrics: cannot listen on ", address));
  }
  return exposer;
}

}  // namespace flashcp::core::runtime::metrics_endpoint
