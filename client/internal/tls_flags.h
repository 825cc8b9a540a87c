// The planner connection's TLS flags, --tls_ca, --tls_cert, --tls_key and
// --tls_server_name (absl flags, read by core/flags.h): defined once here for
// every program that dials the planner (flashcp-client, flashcp-loadgen,
// flashcp-worker), spelled, checked and explained alike (README, "TLS"). Its
// own target (flashcp_client_tls_flags): no other program gets them.
#ifndef FLASHCP_CLIENT_INTERNAL_TLS_FLAGS_H_
#define FLASHCP_CLIENT_INTERNAL_TLS_FLAGS_H_

#include <optional>

#include "absl/status/statusor.h"
#include "client/grpc_planner_client.h"
#include "core/flags.h"

namespace flashcp::client::internal {

// The TLS flags given in `line` as TlsOptions (TlsOptionsFromGiven): nullopt
// (plaintext) without them; InvalidArgument naming the flag for a bad
// combination or an empty value (a flag given empty is refused, not taken for
// an absent one). The files are read later (WithTls).
absl::StatusOr<std::optional<TlsOptions>> TlsFromFlags(const core::CommandLine& line);

}  // namespace flashcp::client::internal

#endif  // FLASHCP_CLIENT_INTERNAL_TLS_FLAGS_H_
