// What flashcp-client, flashcp-loadgen and flashcp-worker make of their
// shared flags (client/internal/tool_flags.h defines the tools' flags).
// Pure: no I/O.
#ifndef FLASHCP_CLIENT_INTERNAL_TOOL_ARGS_H_
#define FLASHCP_CLIENT_INTERNAL_TOOL_ARGS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "client/grpc_planner_client.h"

namespace flashcp::client::internal {

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

}  // namespace flashcp::client::internal

#endif  // FLASHCP_CLIENT_INTERNAL_TOOL_ARGS_H_
