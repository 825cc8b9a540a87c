#include "client/internal/tool_args.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "core/types.h"
#include "proto/convert.h"

namespace flashcp::client::internal {

absl::StatusOr<int64_t> MinShardTokensField(std::optional<int64_t> flag) {
  if (!flag.has_value()) return 0;
  if (*flag < 0 || *flag > core::kMaxTokens) {
    return absl::InvalidArgumentError(absl::StrCat("--min_shard_tokens: must be an integer in [0, ",
                                                   core::kMaxTokens, "], got \"", *flag, "\""));
  }
  return *flag == 0 ? proto::kMinShardTokensOff : *flag;
}

absl::StatusOr<std::optional<TlsOptions>> TlsOptionsFromGiven(
    const std::map<std::string, std::string>& given) {
  auto has = [&](const char* flag) { return given.count(flag) > 0; };
  auto value = [&](const char* flag) {
    auto it = given.find(flag);
    return it == given.end() ? std::string() : it->second;
  };
  for (const char* flag : kTlsFlags) {
    if (has(flag) && value(flag).empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": empty value"));
    }
  }
  if (!has("tls_ca")) {
    for (const char* flag : kTlsFlags) {
      if (has(flag)) {
        return absl::InvalidArgumentError(absl::StrCat("--", flag, ": needs --tls_ca"));
      }
    }
    return std::nullopt;
  }
  if (has("tls_cert") != has("tls_key")) {
    return absl::InvalidArgumentError("--tls_cert, --tls_key: set both or neither");
  }
  TlsOptions tls;
  tls.ca_file = value("tls_ca");
  tls.cert_file = value("tls_cert");
  tls.key_file = value("tls_key");
  tls.server_name = value("tls_server_name");
  return tls;
}

}  // namespace flashcp::client::internal
