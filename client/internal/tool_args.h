// What flashcp-client, flashcp-loadgen and flashcp-worker make of their
// shared flags (client/internal/tool_flags.h defines the tools' flags).
// ToolArgs is left for flashcp-worker's TLS flags only, until its main reads
// them with TlsOptionsFromGiven. Pure: no I/O.
#ifndef FLASHCP_CLIENT_INTERNAL_TOOL_ARGS_H_
#define FLASHCP_CLIENT_INTERNAL_TOOL_ARGS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/grpc_planner_client.h"

namespace flashcp::client::internal {

class ToolArgs {
 public:
  // Parses "--name value", "--name=value" and, for `switches`, a bare
  // "--name". InvalidArgument naming the argument for an unknown flag, a
  // missing value or a positional argument.
  static absl::StatusOr<ToolArgs> Parse(const std::vector<std::string>& args,
                                        const std::set<std::string>& value_flags,
                                        const std::set<std::string>& switches);

  bool Has(absl::string_view name) const { return values_.count(std::string(name)) > 0; }
  std::string String(absl::string_view name, absl::string_view fallback) const;
  // InvalidArgument naming the flag unless the value is an integer (a number)
  // within [lo, hi].
  absl::StatusOr<int64_t> Int(absl::string_view name, int64_t fallback, int64_t lo,
                              int64_t hi) const;
  absl::StatusOr<double> Double(absl::string_view name, double fallback, double lo,
                                double hi) const;

 private:
  std::map<std::string, std::string> values_;  // switches map to ""
};

// flashcp-plan's --min_shard_tokens M (tokens in [0, 2^40]; 0 turns the rule
// off) as the PlanRequest.min_shard_tokens to send: 0 (the server's default,
// 128) when the flag is absent (nullopt), -1 (off) for M = 0, else M. Both
// tools then plan with the same core options for the same flag.
// InvalidArgument naming the flag for a bad value.
absl::StatusOr<int64_t> MinShardTokensField(std::optional<int64_t> flag);

// The TLS flags both tools share (value flags), spelled like flashcp-planner's.
inline constexpr const char* kTlsFlags[] = {"tls_ca", "tls_cert", "tls_key", "tls_server_name"};

// The TLS flags as TlsOptions: nullopt (plaintext) when none is given; TLS
// when --tls_ca is. InvalidArgument naming the flag for --tls_cert, --tls_key
// or --tls_server_name without --tls_ca, for --tls_cert without --tls_key or
// the reverse, and for an empty value. The files are read later (WithTls).
// `given`: the TLS flags given, by name, and their values.
absl::StatusOr<std::optional<TlsOptions>> TlsOptionsFromGiven(
    const std::map<std::string, std::string>& given);
absl::StatusOr<std::optional<TlsOptions>> TlsOptionsFromArgs(const ToolArgs& args);

}  // namespace flashcp::client::internal

#endif  // FLASHCP_CLIENT_INTERNAL_TOOL_ARGS_H_
