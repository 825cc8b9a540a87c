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

absl::StatusOr<int64_t> MinShardTokensField(const ToolArgs& args) {
  if (!args.Has("min-shard-tokens")) return 0;
  absl::StatusOr<int64_t> m = args.Int("min-shard-tokens", 0, 0, core::kMaxTokens);
  if (!m.ok()) return m.status();
  return *m == 0 ? proto::kMinShardTokensOff : *m;
}

absl::StatusOr<std::optional<TlsOptions>> TlsOptionsFromArgs(const ToolArgs& args) {
  for (const char* flag : kTlsFlags) {
    if (args.Has(flag) && args.String(flag, "").empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": empty value"));
    }
  }
  if (!args.Has("tls_ca")) {
    for (const char* flag : kTlsFlags) {
      if (args.Has(flag)) {
        return absl::InvalidArgumentError(absl::StrCat("--", flag, ": needs --tls_ca"));
      }
    }
    return std::nullopt;
  }
  if (args.Has("tls_cert") != args.Has("tls_key")) {
    return absl::InvalidArgumentError("--tls_cert, --tls_key: set both or neither");
  }
  TlsOptions tls;
  tls.ca_file = args.String("tls_ca", "");
  tls.cert_file = args.String("tls_cert", "");
  tls.key_file = args.String("tls_key", "");
  tls.server_name = args.String("tls_server_name", "");
  return tls;
}

}  // namespace flashcp::client::internal
