#include "client/internal/tls_flags.h"

#include <map>
#include <string>
#include <utility>

#include "absl/flags/flag.h"
#include "client/internal/tool_args.h"

ABSL_FLAG(std::string, tls_ca, "",
          "TLS to the planner: PEM CA bundle its certificate must chain to; plaintext without it");
ABSL_FLAG(std::string, tls_cert, "",
          "mTLS: PEM client certificate (for a planner run with --tls_client_ca); needs "
          "--tls_ca and --tls_key");
ABSL_FLAG(std::string, tls_key, "", "mTLS: PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_server_name, "",
          "TLS: the name the planner's certificate must carry, when it is not the host of the "
          "planner's address");

namespace flashcp::client::internal {

absl::StatusOr<std::optional<TlsOptions>> TlsFromFlags(const core::CommandLine& line) {
  const std::pair<const char*, const absl::Flag<std::string>*> flags[] = {
      {"tls_ca", &FLAGS_tls_ca},
      {"tls_cert", &FLAGS_tls_cert},
      {"tls_key", &FLAGS_tls_key},
      {"tls_server_name", &FLAGS_tls_server_name}};
  std::map<std::string, std::string> given;
  for (const auto& [name, flag] : flags) {
    if (line.given.count(name) > 0) given[name] = absl::GetFlag(*flag);
  }
  return TlsOptionsFromGiven(given);
}

}  // namespace flashcp::client::internal
