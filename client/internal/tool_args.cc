#include "client/internal/tool_args.h"

#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/types.h"
#include "proto/convert.h"

namespace flashcp::client::internal {

absl::StatusOr<ToolArgs> ToolArgs::Parse(const std::vector<std::string>& args,
                                         const std::set<std::string>& value_flags,
                                         const std::set<std::string>& switches) {
  ToolArgs parsed;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument \"", arg, "\""));
    }
    std::string name = arg.substr(2);
    std::string value;
    bool has_value = false;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
      has_value = true;
    }
    if (switches.count(name) > 0) {
      if (has_value) return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value"));
      parsed.values_[name] = "";
      continue;
    }
    if (value_flags.count(name) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
    if (!has_value) {
      if (i + 1 == args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      }
      value = args[++i];
    }
    parsed.values_[name] = std::move(value);
  }
  return parsed;
}

std::string ToolArgs::String(absl::string_view name, absl::string_view fallback) const {
  auto it = values_.find(std::string(name));
  return it == values_.end() ? std::string(fallback) : it->second;
}

absl::StatusOr<int64_t> ToolArgs::Int(absl::string_view name, int64_t fallback, int64_t lo,
                                      int64_t hi) const {
  auto it = values_.find(std::string(name));
  if (it == values_.end()) return fallback;
  int64_t v = 0;
  if (!absl::SimpleAtoi(it->second, &v) || v < lo || v > hi) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, ": \"", it->second,
                                                   "\" is not an integer in [", lo, ", ", hi,
                                                   "]"));
  }
  return v;
}

absl::StatusOr<double> ToolArgs::Double(absl::string_view name, double fallback, double lo,
                                        double hi) const {
  auto it = values_.find(std::string(name));
  if (it == values_.end()) return fallback;
  double v = 0;
  if (!absl::SimpleAtod(it->second, &v) || !std::isfinite(v) || v < lo || v > hi) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, ": \"", it->second,
                                                   "\" is not a number in [", lo, ", ", hi,
                                                   "]"));
  }
  return v;
}

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

absl::StatusOr<std::optional<TlsOptions>> TlsOptionsFromArgs(const ToolArgs& args) {
  std::map<std::string, std::string> given;
  for (const char* flag : kTlsFlags) {
    if (args.Has(flag)) given[flag] = args.String(flag, "");
  }
  return TlsOptionsFromGiven(given);
}

}  // namespace flashcp::client::internal
