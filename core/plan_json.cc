#include "core/plan_json.h"

#include <charconv>
#include <cmath>
#include <string>
#include <system_error>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"

namespace flashcp::core {
namespace {

constexpr int64_t kMaxLength = int64_t{1} << 40;  // exclusive bound on one length
constexpr size_t kQuoteLimit = 24;                // characters of a bad token quoted back

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f'; }

// A bad token, quoted and shortened so an error never echoes a huge line.
std::string Quote(absl::string_view token) {
  if (token.size() <= kQuoteLimit) return absl::StrCat("\"", token, "\"");
  return absl::StrCat("\"", token.substr(0, kQuoteLimit), "...\"");
}

absl::StatusOr<int64_t> ParseLength(absl::string_view token, int64_t position) {
  int64_t value = 0;
  for (char c : token) {
    if (c < '0' || c > '9') {
      return absl::InvalidArgumentError(absl::StrCat("token ", position, ": ", Quote(token),
                                                     " is not a positive integer"));
    }
    value = value * 10 + (c - '0');
    if (value >= kMaxLength) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token ", position, ": ", Quote(token), " is not below 2^40"));
    }
  }
  if (value < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("token ", position, ": ", Quote(token), " is not a positive integer"));
  }
  return value;
}

// Shortest decimal that reads back as the same double (std::to_chars without a
// format); JSON has no NaN or infinity, so those become null.
void AppendDouble(std::string& out, double value) {
  if (!std::isfinite(value)) {
    out += "null";
    return;
  }
  char buf[32];
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof(buf), value);
  out.append(buf, r.ptr);
}

void AppendString(std::string& out, absl::string_view s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (c < 0x20) {
          static constexpr char kHex[] = "0123456789abcdef";
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 0xf];
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

template <typename T>
void AppendArray(std::string& out, const std::vector<T>& values) {
  out += '[';
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += ',';
    if constexpr (std::is_floating_point_v<T>) {
      AppendDouble(out, values[i]);
    } else {
      absl::StrAppend(&out, values[i]);
    }
  }
  out += ']';
}

}  // namespace

absl::StatusOr<std::vector<int64_t>> ParseBatchLine(absl::string_view line) {
  // Tokens are separated by one comma and/or any whitespace around it; two
  // commas with nothing between them are an empty token, which is an error.
  std::vector<int64_t> lens;
  int64_t position = 0;
  size_t i = 0;
  const size_t n = line.size();
  while (i < n && IsSpace(line[i])) ++i;
  if (i == n) return absl::InvalidArgumentError("empty line: no document lengths");
  while (true) {
    const size_t begin = i;
    while (i < n && line[i] != ',' && !IsSpace(line[i])) ++i;
    const absl::string_view token = line.substr(begin, i - begin);
    if (token.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("token ", position, ": empty (two commas in a row, or a leading comma)"));
    }
    absl::StatusOr<int64_t> len = ParseLength(token, position);
    if (!len.ok()) return len.status();
    lens.push_back(*len);
    ++position;
    while (i < n && IsSpace(line[i])) ++i;
    if (i == n) break;
    if (line[i] == ',') {
      ++i;
      while (i < n && IsSpace(line[i])) ++i;
      if (i == n) {
        return absl::InvalidArgumentError(
            absl::StrCat("token ", position, ": empty (the line ends with a comma)"));
      }
    }
  }
  return lens;
}

std::string PlanToJson(const Plan& plan, const PlanMetrics& metrics, absl::string_view strategy,
                       absl::string_view extra) {
  std::string out;
  out.reserve(128 + 16 * plan.doc_lens.size() + 48 * plan.shards.size());
  absl::StrAppend(&out, "{\"cp_size\":", plan.cp_size, ",\"docs\":");
  AppendArray(out, plan.doc_lens);
  absl::StrAppend(&out, ",\"padding\":", plan.padding, ",\"shards\":[");
  for (size_t i = 0; i < plan.shards.size(); ++i) {
    const Shard& s = plan.shards[i];
    absl::StrAppend(&out, i > 0 ? "," : "", "{\"doc\":", s.doc, ",\"start\":", s.start,
                    ",\"len\":", s.len, ",\"rank\":", s.rank, "}");
  }
  out += "],\"metrics\":{\"imbalance\":";
  AppendDouble(out, metrics.imbalance);
  out += ",\"comm_saving\":";
  AppendDouble(out, metrics.comm_saving);
  out += ",\"targeted_saving\":";
  AppendDouble(out, metrics.targeted_saving);
  absl::StrAppend(&out, ",\"cut_docs\":", metrics.cut_docs,
                  ",\"min_cut_shard_len\":", metrics.min_cut_shard_len,
                  ",\"tokens_per_rank\":", metrics.tokens_per_rank, ",\"rank_workload\":");
  AppendArray(out, metrics.rank_workload);
  out += ",\"rank_nonlast_tokens\":";
  AppendArray(out, metrics.rank_nonlast_tokens);
  absl::StrAppend(
      &out, ",\"bytes_full_kv\":",
      metrics.bytes[static_cast<int>(CommScheme::kFullKv)].bottleneck, ",\"bytes_allgather\":",
      metrics.bytes[static_cast<int>(CommScheme::kAllGather)].bottleneck, ",\"bytes_targeted\":",
      metrics.bytes[static_cast<int>(CommScheme::kTargeted)].bottleneck, "},\"strategy\":");
  AppendString(out, strategy);
  out.append(extra.data(), extra.size());
  out += '}';
  return out;
}

std::string JsonString(absl::string_view s) {
  std::string out;
  AppendString(out, s);
  return out;
}

}  // namespace flashcp::core
