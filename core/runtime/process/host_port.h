// Listen addresses as the planner's and the worker's flags give them.
#ifndef FLASHCP_RUNTIME_PROCESS_HOST_PORT_H_
#define FLASHCP_RUNTIME_PROCESS_HOST_PORT_H_

#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace flashcp::core::runtime::process {

// "host:port" -> ("host", port); the host may be bracketed IPv6 ("[::1]").
// InvalidArgument naming `flag` unless the port is 0..65535 and the host non-empty.
absl::StatusOr<std::pair<std::string, int>> SplitHostPort(absl::string_view address,
                                                          absl::string_view flag);

}  // namespace flashcp::core::runtime::process

#endif  // FLASHCP_RUNTIME_PROCESS_HOST_PORT_H_
