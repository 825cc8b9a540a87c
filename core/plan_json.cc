#include "core/plan_json.h"

#include <charconv>
#include <cmath>
#include <string>
#include <system_error>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/plan_hash.h"
#include "core/mask.h"

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
// format); JSON has no NaN or infinity, so those are the strings protobuf's
// JSON mapping uses.
void AppendDouble(std::string& out, double value) {
  if (std::isnan(value)) {
    out += "\"NaN\"";
    return;
  }
  if (std::isinf(value)) {
    out += value > 0 ? "\"Infinity\"" : "\"-Infinity\"";
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

namespace {

// `"key":` after a comma unless `first`.
void AppendKey(std::string& out, absl::string_view key, bool first = false) {
  if (!first) out += ',';
  out += '"';
  out.append(key.data(), key.size());
  out += "\":";
}

template <typename T>
void AppendField(std::string& out, absl::string_view key, const T& value) {
  AppendKey(out, key);
  if constexpr (std::is_floating_point_v<T>) {
    AppendDouble(out, value);
  } else if constexpr (std::is_same_v<T, bool>) {
    out += value ? "true" : "false";
  } else if constexpr (std::is_integral_v<T>) {
    absl::StrAppend(&out, value);
  } else {
    AppendArray(out, value);
  }
}

// planner.proto's SchemeBytes, fields in number order.
void AppendSchemeBytes(std::string& out, CommScheme scheme, const SchemeBytes& b) {
  AppendKey(out, "scheme", /*first=*/true);
  AppendString(out, CommSchemeName(scheme));
  AppendField(out, "sent_bytes", b.sent);
  AppendField(out, "received_bytes", b.received);
  AppendField(out, "bottleneck_bytes", b.bottleneck);
  const PhaseTraffic& p = b.phase;
  AppendField(out, "phase_sent_tokens", p.sent_tokens);
  AppendField(out, "phase_received_tokens", p.received_tokens);
  AppendField(out, "phase_max_sent_tokens", p.max_sent_tokens);
  AppendField(out, "phase_max_received_tokens", p.max_received_tokens);
  AppendField(out, "phase_bottleneck_tokens", p.bottleneck_tokens);
  AppendField(out, "phase_max_sent_bytes", p.max_sent_bytes);
  AppendField(out, "phase_max_received_bytes", p.max_received_bytes);
  AppendField(out, "phase_bottleneck_bytes", p.bottleneck_bytes);
  AppendField(out, "phase_intra_node_bytes", p.intra_node_bytes);
  AppendField(out, "phase_inter_node_bytes", p.inter_node_bytes);
  AppendField(out, "phase_inter_node_sent_bytes", p.inter_node_sent_bytes);
  AppendField(out, "phase_inter_node_received_bytes", p.inter_node_received_bytes);
  AppendField(out, "phase_max_intra_node_bytes", p.max_intra_node_bytes);
  AppendField(out, "phase_max_inter_node_bytes", p.max_inter_node_bytes);
  if (!p.clean_received_tokens.empty()) {  // block diffusion only
    AppendField(out, "phase_clean_received_tokens", p.clean_received_tokens);
    AppendField(out, "phase_noisy_received_tokens", p.noisy_received_tokens);
    AppendField(out, "phase_max_clean_received_bytes", p.max_clean_received_bytes);
    AppendField(out, "phase_max_noisy_received_bytes", p.max_noisy_received_bytes);
  }
}

// planner.proto's PlanMetrics, fields in number order.
void AppendMetrics(std::string& out, const PlanMetrics& m, double planning_seconds,
                   const PlanCostReport* cost) {
  AppendKey(out, "imbalance_ratio", /*first=*/true);
  AppendDouble(out, m.imbalance);
  AppendField(out, "comm_saving_ratio", m.comm_saving);
  AppendField(out, "targeted_saving_ratio", m.targeted_saving);
  AppendField(out, "tokens_per_rank", m.tokens_per_rank);
  AppendField(out, "rank_tokens", m.rank_tokens);
  AppendField(out, "rank_workload", m.rank_workload);
  AppendField(out, "rank_nonlast_tokens", m.rank_nonlast_tokens);
  AppendField(out, "rank_segments", m.rank_segments);
  AppendField(out, "cut_docs", m.cut_docs);
  AppendField(out, "min_cut_shard_len", m.min_cut_shard_len);
  AppendKey(out, "bytes");
  out += '[';
  for (CommScheme scheme : kAllCommSchemes) {
    if (scheme != kAllCommSchemes[0]) out += ',';
    out += '{';
    AppendSchemeBytes(out, scheme, m.bytes[static_cast<int>(scheme)]);
    out += '}';
  }
  out += ']';
  AppendField(out, "planning_seconds", planning_seconds);
  AppendKey(out, "cheaper_scheme");
  AppendString(out, CommSchemeName(m.cheaper_scheme));
  if (cost != nullptr) {
    AppendKey(out, "cost_profile");
    AppendString(out, cost->profile);
    AppendKey(out, "cost");
    out += '{';
    AppendKey(out, "whole_pair", /*first=*/true);
    AppendDouble(out, cost->coefficients.whole_pair);
    AppendField(out, "prefixed_pair", cost->coefficients.prefixed_pair);
    AppendField(out, "sequence", cost->coefficients.sequence);
    AppendField(out, "token", cost->coefficients.token);
    out += '}';
    AppendField(out, "cost_calibrated", cost->calibrated);
    AppendField(out, "rank_predicted_cost", cost->prediction.rank_cost);
    AppendField(out, "predicted_cost_imbalance", cost->prediction.imbalance);
  }
  if (IsBlockDiffusion(m.mask)) {
    AppendField(out, "rank_noisy_tokens", m.rank_noisy_tokens);
    AppendField(out, "cut_noisy_blocks", m.cut_noisy_blocks);
  }
  AppendKey(out, "all_to_all_inapplicable");
  AppendString(out, m.all_to_all_inapplicable);
  AppendField(out, "all_to_all_replicated_kv_heads", m.all_to_all_replicated_kv_heads);
}

// planner.proto's PlanMetrics fields 30-38 (proto::StepTimeToProto).
void AppendStepTime(std::string& out, const StepTimeReport& r, bool per_rank) {
  const StepTimePrediction& p = r.native();
  AppendField(out, "predicted_step_seconds", p.step_seconds);
  AppendKey(out, "predicted_exchange");
  AppendString(out, StepExchangeName(r.exchange));
  AppendField(out, "predicted_forward_seconds", p.forward_seconds);
  AppendField(out, "predicted_backward_seconds", p.backward_seconds);
  AppendField(out, "predicted_exposed_exchange_seconds", p.exposed_exchange_seconds);
  AppendField(out, "predicted_compute_seconds", p.layers * p.compute_seconds);
  AppendKey(out, "predicted_exchanges");
  out += '[';
  for (int e = 0; e < kNumStepExchanges; ++e) {
    if (e > 0) out += ',';
    out += '{';
    AppendKey(out, "exchange", /*first=*/true);
    AppendString(out, StepExchangeName(static_cast<StepExchange>(e)));
    AppendField(out, "step_seconds", r.all[e].step_seconds);
    AppendField(out, "exposed_exchange_seconds", r.all[e].exposed_exchange_seconds);
    AppendField(out, "exchange_seconds", r.all[e].exchange_seconds);
    if (!r.all[e].inapplicable.empty()) {  // as proto3's JSON: an empty string is left out
      AppendKey(out, "inapplicable");
      AppendString(out, r.all[e].inapplicable);
    }
    out += '}';
  }
  out += ']';
  if (per_rank) {
    AppendKey(out, "rank_predicted_times");
    out += '[';
    for (size_t i = 0; i < p.ranks.size(); ++i) {
      const RankStepTime& t = p.ranks[i];
      if (i > 0) out += ',';
      out += '{';
      AppendKey(out, "forward_compute", /*first=*/true);
      AppendDouble(out, t.forward_compute);
      AppendField(out, "backward_compute", t.backward_compute);
      AppendField(out, "exchange", t.exchange);
      AppendField(out, "forward", t.forward);
      AppendField(out, "backward", t.backward);
      AppendField(out, "exposed_exchange", t.exposed_exchange);
      out += '}';
    }
    out += ']';
  }
  AppendKey(out, "predicted_cluster");
  AppendString(out, r.cluster);
}

}  // namespace

std::string PlanToJson(const Plan& plan, const PlanMetrics& metrics,
                       const PlanJsonFields& fields) {
  std::string out;
  out.reserve(1024 + 16 * plan.doc_lens.size() + 48 * plan.shards.size() +
              160 * static_cast<size_t>(plan.cp_size));
  out += '{';
  AppendKey(out, "batch_id", /*first=*/true);
  absl::StrAppend(&out, fields.batch_id);
  AppendKey(out, "strategy");
  AppendString(out, fields.strategy);
  AppendField(out, "cp_size", plan.cp_size);
  AppendField(out, "doc_lens", plan.doc_lens);
  AppendField(out, "padding", plan.padding);
  out += ",\"shards\":[";
  for (size_t i = 0; i < plan.shards.size(); ++i) {
    const Shard& s = plan.shards[i];
    absl::StrAppend(&out, i > 0 ? "," : "", "{\"doc\":", s.doc, ",\"start\":", s.start,
                    ",\"len\":", s.len, ",\"rank\":", s.rank, "}");
  }
  out += "],\"metrics\":{";
  AppendMetrics(out, metrics, fields.planning_seconds, fields.cost);
  if (fields.step != nullptr) AppendStepTime(out, *fields.step, fields.step_per_rank);
  out += '}';
  if (fields.ilp != nullptr) {
    out += ",\"ilp\":{";
    AppendKey(out, "optimal", /*first=*/true);
    out += fields.ilp->ilp_optimal ? "true" : "false";
    AppendField(out, "gap", fields.ilp->ilp_gap);
    AppendField(out, "granularity", fields.ilp->ilp_granularity);
    out += '}';
  }
  AppendKey(out, "plan_hash");
  AppendString(out, PlanHashHex(PlanHash(plan)));
  AppendKey(out, "planner_version");
  AppendString(out, fields.planner_version != nullptr ? absl::string_view(*fields.planner_version)
                                                      : PlannerVersion());
  if (IsBlockDiffusion(plan.mask)) {
    AppendKey(out, "attention_mask");
    AppendString(out, MaskKindName(plan.mask.kind));
    AppendField(out, "block_size", plan.mask.block_size);
  }
  out += '}';
  return out;
}

std::string JsonString(absl::string_view s) {
  std::string out;
  AppendString(out, s);
  return out;
}

}  // namespace flashcp::core
