#include "core/two_level.h"

#include <algorithm>
#include <map>

#include "absl/numeric/int128.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace flashcp::core {
namespace {

absl::StatusOr<int64_t> Rows(absl::int128 x) {
  if (x > absl::int128(INT64_MAX)) return absl::OutOfRangeError("two_level: bytes overflow int64");
  return static_cast<int64_t>(x);
}

}  // namespace

absl::StatusOr<TwoLevelParts> TwoLevelNeeds(const Plan& plan, const std::vector<int32_t>& ranks,
                                            int32_t ranks_per_node) {
  if (ranks_per_node <= 0) {
    return absl::FailedPreconditionError(
        "ranks_per_node: the two-level scheme needs nodes (ranks_per_node > 0)");
  }
  TwoLevelParts out;
  std::map<int32_t, int32_t> part_of_node;
  std::vector<int32_t> part_of_rank(plan.cp_size, -1);
  for (int32_t r : ranks) {
    const int32_t node = r / ranks_per_node;
    auto [it, fresh] = part_of_node.emplace(node, static_cast<int32_t>(out.parts.size()));
    if (fresh) out.parts.emplace_back();
    out.parts[it->second].push_back(r);
    part_of_rank[r] = it->second;
  }
  if (out.parts.size() < 2) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ranks_per_node: the group spans one node of ", ranks_per_node,
        " ranks; the two-level scheme is the all-to-all there"));
  }
  for (const std::vector<int32_t>& p : out.parts) {
    if (p.size() != out.parts.front().size()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "ranks_per_node: the group has ", out.parts.front().size(), " ranks on node ",
          out.parts.front().front() / ranks_per_node, " but ", p.size(), " on node ",
          p.front() / ranks_per_node, "; the same-position exchange needs equal parts"));
    }
  }
  const size_t np = out.parts.size();
  out.need.assign(np, std::vector<int64_t>(np, 0));
  out.runs.assign(np, std::vector<std::vector<DocRun>>(np));
  // Per document: per part, its shards there and the end of its last
  // position there (a query at position p attends keys at positions <= p).
  std::map<int32_t, std::vector<std::vector<const Shard*>>> shards_of;
  for (const Shard& s : plan.shards) {
    const int32_t part = part_of_rank[s.rank];
    if (part < 0) continue;
    auto& per_part = shards_of[s.doc];
    if (per_part.empty()) per_part.resize(np);
    per_part[part].push_back(&s);
  }
  for (auto& [doc, per_part] : shards_of) {
    for (std::vector<const Shard*>& v : per_part)
      std::sort(v.begin(), v.end(),
                [](const Shard* x, const Shard* y) { return x->start < y->start; });
  }
  for (const auto& [doc, per_part] : shards_of) {
    for (size_t b = 0; b < np; ++b) {
      int64_t end = 0;  // queries on part b attend keys before `end`
      for (const Shard* s : per_part[b]) end = std::max(end, s->start + s->len);
      if (end == 0) continue;
      for (size_t a = 0; a < np; ++a) {
        if (a == b) continue;
        for (const Shard* s : per_part[a]) {
          const int64_t len = std::clamp(end - s->start, int64_t{0}, s->len);
          if (len == 0) continue;
          out.need[a][b] += len;
          out.runs[a][b].push_back(DocRun{doc, s->start, len});
        }
      }
    }
  }
  return out;
}

absl::StatusOr<GroupPhaseBytes> TwoLevelGroupPhase(const Plan& plan, const PlanMetrics& metrics,
                                                   const std::vector<int32_t>& ranks,
                                                   const ModelShape& shape,
                                                   int32_t ranks_per_node) {
  FLASHCP_ASSIGN_OR_RETURN(const TwoLevelParts parts, TwoLevelNeeds(plan, ranks, ranks_per_node));
  const int32_t p = static_cast<int32_t>(parts.parts.front().size());
  FLASHCP_ASSIGN_OR_RETURN(const AllToAllHeads heads, AllToAllGroupHeads(p, shape));
  FLASHCP_ASSIGN_OR_RETURN(
      const AllToAllPhase intra,
      AllToAllTraffic(metrics.rank_tokens, parts.parts, shape, ranks_per_node));
  const absl::int128 head_row = int64_t{shape.head_dim} * shape.dtype_bytes;
  std::map<int32_t, int32_t> position;  // rank -> index in `ranks`
  for (size_t i = 0; i < ranks.size(); ++i) position[ranks[i]] = static_cast<int32_t>(i);
  GroupPhaseBytes out;
  const size_t k = ranks.size();
  out.sent.assign(k, 0);
  out.received.assign(k, 0);
  out.inter_sent.assign(k, 0);
  out.inter_received.assign(k, 0);
  for (size_t a = 0; a < parts.parts.size(); ++a) {
    absl::int128 away = 0, in = 0;  // tokens
    for (size_t b = 0; b < parts.parts.size(); ++b) {
      away += parts.need[a][b];
      in += parts.need[b][a];
    }
    for (int32_t j = 0; j < p; ++j) {
      const int32_t r = parts.parts[a][j];
      const int32_t i = position.at(r);
      const absl::int128 kv_rows = 2 * absl::int128(heads.kv[j].count);
      FLASHCP_ASSIGN_OR_RETURN(out.inter_sent[i], Rows(head_row * kv_rows * away));
      FLASHCP_ASSIGN_OR_RETURN(out.inter_received[i], Rows(head_row * kv_rows * in));
      FLASHCP_ASSIGN_OR_RETURN(out.sent[i],
                               Rows(head_row * intra.sent[r] + out.inter_sent[i]));
      FLASHCP_ASSIGN_OR_RETURN(out.received[i],
                               Rows(head_row * intra.received[r] + out.inter_received[i]));
    }
  }
  return out;
}

}  // namespace flashcp::core
