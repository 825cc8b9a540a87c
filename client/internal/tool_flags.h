// The flags flashcp-client and flashcp-loadgen share (absl flags, read by
// core/flags.h): the planner to reach and how (with client/internal/tls_flags.h),
// and the batches' common knobs.
// Its own target (flashcp_client_tool_flags): no other program gets them.
#ifndef FLASHCP_CLIENT_INTERNAL_TOOL_FLAGS_H_
#define FLASHCP_CLIENT_INTERNAL_TOOL_FLAGS_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/grpc_planner_client.h"
#include "core/flags.h"

ABSL_DECLARE_FLAG(std::string, server);
ABSL_DECLARE_FLAG(double, connect_timeout);
ABSL_DECLARE_FLAG(int64_t, cp);
ABSL_DECLARE_FLAG(std::string, strategy);
ABSL_DECLARE_FLAG(int64_t, context);
ABSL_DECLARE_FLAG(uint64_t, seed);

namespace flashcp::client::internal {

// The shared flags, checked.
struct ToolFlags {
  std::string server;
  absl::Duration connect_timeout;
  std::optional<TlsOptions> tls;  // nullopt: plaintext
  int32_t cp_size = 0;
  std::string strategy;  // empty: the server's
  int64_t context = 0;
  uint64_t seed = 0;
};

// The shared flags as parsed into `line`. InvalidArgument naming the flag
// for a missing --server, a value out of range or a bad TLS combination
// (TlsOptionsFromGiven).
absl::StatusOr<ToolFlags> ToolFlagsFromCommandLine(const core::CommandLine& line);

}  // namespace flashcp::client::internal

#endif  // FLASHCP_CLIENT_INTERNAL_TOOL_FLAGS_H_
