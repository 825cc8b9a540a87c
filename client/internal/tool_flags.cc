#include "client/internal/tool_flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "client/internal/tls_flags.h"
#include "core/status_macros.h"
#include "core/types.h"

ABSL_FLAG(std::string, server, "", "the planner, HOST:PORT (required)");
ABSL_FLAG(double, connect_timeout, 10,
          "seconds to wait (retrying) for the planner to answer first, in [0, 1e7]");
ABSL_FLAG(int64_t, cp, 8, "ranks in the CP group");
ABSL_FLAG(std::string, strategy, "", "a strategy the server lists; empty: the server's default");
ABSL_FLAG(int64_t, context, 131072, "tokens per sampled batch");
ABSL_FLAG(uint64_t, seed, 1, "sampling seed");

namespace flashcp::client::internal {

absl::StatusOr<ToolFlags> ToolFlagsFromCommandLine(const core::CommandLine& line) {
  ToolFlags f;
  f.server = absl::GetFlag(FLAGS_server);
  if (f.server.empty()) return absl::InvalidArgumentError("--server HOST:PORT is required");
  FLASHCP_ASSIGN_OR_RETURN(
      const double connect,
      core::DoubleFlagIn("connect_timeout", absl::GetFlag(FLAGS_connect_timeout), 0, 1e7));
  f.connect_timeout = absl::Seconds(connect);
  FLASHCP_ASSIGN_OR_RETURN(f.tls, TlsFromFlags(line));
  FLASHCP_ASSIGN_OR_RETURN(const int64_t cp,
                           core::IntFlagIn("cp", absl::GetFlag(FLAGS_cp), 1, core::kMaxCpSize));
  f.cp_size = static_cast<int32_t>(cp);
  f.strategy = absl::GetFlag(FLAGS_strategy);
  FLASHCP_ASSIGN_OR_RETURN(
      f.context, core::IntFlagIn("context", absl::GetFlag(FLAGS_context), 1, core::kMaxTokens));
  f.seed = absl::GetFlag(FLAGS_seed);
  return f;
}

}  // namespace flashcp::client::internal
