#include "core/rank_groups.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "absl/numeric/int128.h"
#include "absl/strings/str_cat.h"
#include "core/mask.h"
#include "core/status_macros.h"
#include "core/two_level.h"

namespace flashcp::core {
namespace {

absl::StatusOr<int64_t> Checked(absl::int128 value, absl::string_view what) {
  if (value > absl::int128(std::numeric_limits<int64_t>::max())) {
    return absl::OutOfRangeError(absl::StrCat(what, ": byte count overflows int64"));
  }
  return static_cast<int64_t>(value);
}

int32_t Find(std::vector<int32_t>& parent, int32_t x) {
  while (parent[x] != x) {
    parent[x] = parent[parent[x]];
    x = parent[x];
  }
  return x;
}

// InvalidArgument unless the groups' ranks are distinct and in [0, n).
absl::Status CheckGroups(const std::vector<std::vector<int32_t>>& groups, int32_t n,
                         bool must_cover) {
  std::vector<uint8_t> seen(n, 0);
  int64_t covered = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("groups[", g, "]: no ranks"));
    }
    for (int32_t r : groups[g]) {
      if (r < 0 || r >= n) {
        return absl::InvalidArgumentError(
            absl::StrCat("groups[", g, "]: rank ", r, " is outside [0, ", n, ")"));
      }
      if (seen[r]) {
        return absl::InvalidArgumentError(
            absl::StrCat("groups[", g, "]: rank ", r, " is in more than one group"));
      }
      seen[r] = 1;
      ++covered;
    }
  }
  if (must_cover && covered != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("groups: cover ", covered, " of the ", n, " ranks; every rank needs a group"));
  }
  return absl::OkStatus();
}

// Ranks of `group` on another node than rank r, as (count, sum of `value`)
// for each rank: the group's totals less those of r's node.
struct OffNode {
  std::vector<int64_t> count;
  std::vector<absl::int128> sum;
};
OffNode OffNodeTotals(const std::vector<int32_t>& group, const std::vector<int64_t>& value,
                      int32_t per_node) {
  absl::int128 total = 0;
  for (int64_t v : value) total += v;
  OffNode out;
  out.count.assign(group.size(), 0);
  out.sum.assign(group.size(), 0);
  // Positions in `group` by rank: runs of one node.
  std::vector<size_t> order(group.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return group[a] < group[b]; });
  for (size_t b = 0; b < order.size();) {
    const int32_t node = group[order[b]] / per_node;
    size_t e = b;
    absl::int128 here = 0;
    while (e < order.size() && group[order[e]] / per_node == node) here += value[order[e++]];
    for (size_t i = b; i < e; ++i) {
      out.count[order[i]] = static_cast<int64_t>(group.size() - (e - b));
      out.sum[order[i]] = total - here;
    }
    b = e;
  }
  return out;
}

// One phase of the all-to-all within `group` (K >= 2), per position, in
// (token, head) rows: AllToAllTraffic's formulas. `t`: tokens per position.
struct GroupRows {
  std::vector<absl::int128> sent, received, inter_sent, inter_received;
};
GroupRows AllToAllRows(const std::vector<int32_t>& group, const std::vector<int64_t>& t,
                       const AllToAllHeads& heads, int32_t per_node) {
  const int32_t k = static_cast<int32_t>(group.size());
  const int64_t hq = heads.query[0].count;  // equal at every position
  std::vector<int64_t> kv(k);
  absl::int128 s = 0;
  for (int32_t j = 0; j < k; ++j) {
    kv[j] = heads.kv[j].count;
    s += t[j];
  }
  const OffNode off_t = OffNodeTotals(group, t, per_node);
  const OffNode off_kv = OffNodeTotals(group, kv, per_node);
  GroupRows out;
  out.sent.resize(k);
  out.received.resize(k);
  out.inter_sent.resize(k);
  out.inter_received.resize(k);
  for (int32_t j = 0; j < k; ++j) {
    const absl::int128 tr = t[j], others = s - tr, x = off_t.count[j];
    out.sent[j] = tr * (k - 1) * hq + 2 * tr * (heads.kv_total - kv[j]) + others * hq;
    out.received[j] = others * hq + 2 * others * kv[j] + tr * (k - 1) * hq;
    out.inter_sent[j] = tr * x * hq + 2 * tr * off_kv.sum[j] + off_t.sum[j] * hq;
    out.inter_received[j] = off_t.sum[j] * hq + 2 * off_t.sum[j] * kv[j] + tr * x * hq;
  }
  return out;
}

}  // namespace

std::vector<std::vector<int32_t>> PlanRankGroups(const Plan& plan) {
  const int32_t n = plan.cp_size;
  std::vector<int32_t> parent(n);
  std::iota(parent.begin(), parent.end(), 0);
  std::vector<int32_t> first_rank(plan.doc_lens.size(), -1);
  for (const Shard& s : plan.shards) {
    int32_t& f = first_rank[s.doc];
    if (f < 0) {
      f = s.rank;
      continue;
    }
    const int32_t a = Find(parent, f), b = Find(parent, s.rank);
    if (a != b) parent[std::max(a, b)] = std::min(a, b);
  }
  std::vector<std::vector<int32_t>> groups;
  std::vector<int32_t> index(n, -1);  // root -> group
  for (int32_t r = 0; r < n; ++r) {
    const int32_t root = Find(parent, r);
    if (index[root] < 0) {
      index[root] = static_cast<int32_t>(groups.size());
      groups.emplace_back();
    }
    groups[index[root]].push_back(r);
  }
  return groups;
}

absl::StatusOr<AllToAllHeads> AllToAllGroupHeads(int32_t group_size, const ModelShape& shape) {
  FLASHCP_RETURN_IF_ERROR(ValidateModelShape(shape));
  if (group_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("group size: must be >= 1, got ", group_size));
  }
  const int32_t hq = QueryHeads(shape);
  if (hq % group_size != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "query_heads: the all-to-all over a group of ", group_size, " ranks splits the Hq = ", hq,
        " query heads evenly, so the group size must divide Hq"));
  }
  const int32_t per_rank = hq / group_size;
  const int32_t q_per_kv = hq / shape.heads;  // ValidateModelShape: heads | Hq
  AllToAllHeads out;
  for (int32_t j = 0; j < group_size; ++j) {
    const int32_t first = j * per_rank;
    const int32_t kv_first = first / q_per_kv;
    const int32_t kv_last = (first + per_rank - 1) / q_per_kv;
    out.query.push_back(HeadRange{first, per_rank});
    out.kv.push_back(HeadRange{kv_first, kv_last - kv_first + 1});
    out.kv_total += kv_last - kv_first + 1;
  }
  out.replicated_kv_heads = out.kv_total - shape.heads;
  return out;
}

absl::StatusOr<AllToAllPhase> AllToAllTraffic(const std::vector<int64_t>& tokens,
                                              const std::vector<std::vector<int32_t>>& groups,
                                              const ModelShape& shape, int32_t ranks_per_node) {
  FLASHCP_RETURN_IF_ERROR(ValidateModelShape(shape));
  FLASHCP_RETURN_IF_ERROR(ValidateRanksPerNode(ranks_per_node));
  const int32_t n = static_cast<int32_t>(tokens.size());
  FLASHCP_RETURN_IF_ERROR(CheckGroups(groups, n, /*must_cover=*/false));
  const int32_t per_node = ranks_per_node <= 0 ? std::max(n, 1) : ranks_per_node;
  AllToAllPhase out;
  out.sent.assign(n, 0);
  out.received.assign(n, 0);
  out.inter_sent.assign(n, 0);
  out.inter_received.assign(n, 0);
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::vector<int32_t>& group = groups[g];
    const int32_t k = static_cast<int32_t>(group.size());
    if (k == 1) continue;  // whole documents: nothing moves
    absl::StatusOr<AllToAllHeads> heads = AllToAllGroupHeads(k, shape);
    if (!heads.ok()) {
      return absl::Status(heads.status().code(),
                          absl::StrCat(heads.status().message(), " (group ", g, ": ranks ",
                                       group.front(), "..", group.back(), ")"));
    }
    out.replicated_kv_heads += heads->replicated_kv_heads;
    std::vector<int64_t> t(k);
    for (int32_t j = 0; j < k; ++j) t[j] = tokens[group[j]];
    const GroupRows rows = AllToAllRows(group, t, *heads, per_node);
    for (int32_t j = 0; j < k; ++j) {
      const int32_t r = group[j];
      FLASHCP_ASSIGN_OR_RETURN(out.sent[r], Checked(rows.sent[j], "all_to_all"));
      FLASHCP_ASSIGN_OR_RETURN(out.received[r], Checked(rows.received[j], "all_to_all"));
      FLASHCP_ASSIGN_OR_RETURN(out.inter_sent[r], Checked(rows.inter_sent[j], "all_to_all"));
      FLASHCP_ASSIGN_OR_RETURN(out.inter_received[r],
                               Checked(rows.inter_received[j], "all_to_all"));
    }
  }
  return out;
}

absl::StatusOr<AllToAllPhase> PlanAllToAllPhase(const Plan& plan, const ModelShape& shape,
                                                int32_t ranks_per_node) {
  return PlanAllToAllPhase(plan, PlanRankGroups(plan), shape, ranks_per_node);
}

absl::StatusOr<AllToAllPhase> PlanAllToAllPhase(const Plan& plan,
                                                const std::vector<std::vector<int32_t>>& groups,
                                                const ModelShape& shape, int32_t ranks_per_node) {
  if (IsBlockDiffusion(plan.mask)) {
    return absl::FailedPreconditionError(
        "attention_mask: the all-to-all scheme is not planned under block diffusion");
  }
  std::vector<int64_t> tokens(plan.cp_size, 0);  // real tokens: padding never travels
  for (const Shard& s : plan.shards) tokens[s.rank] += s.len;
  return AllToAllTraffic(tokens, groups, shape, ranks_per_node);
}

absl::Status FillLinkSplit(const std::vector<int64_t>& inter_sent,
                           const std::vector<int64_t>& inter_received, int64_t unit_bytes,
                           PhaseTraffic& phase) {
  const size_t n = phase.sent_tokens.size();
  phase.inter_node_sent_bytes.assign(n, 0);
  phase.inter_node_received_bytes.assign(n, 0);
  phase.max_intra_node_bytes = 0;
  phase.max_inter_node_bytes = 0;
  for (size_t r = 0; r < n; ++r) {
    const absl::int128 unit = unit_bytes;
    FLASHCP_ASSIGN_OR_RETURN(phase.inter_node_sent_bytes[r],
                             Checked(unit * inter_sent[r], "inter-node"));
    FLASHCP_ASSIGN_OR_RETURN(phase.inter_node_received_bytes[r],
                             Checked(unit * inter_received[r], "inter-node"));
    FLASHCP_ASSIGN_OR_RETURN(
        const int64_t intra_sent,
        Checked(unit * (absl::int128(phase.sent_tokens[r]) - inter_sent[r]), "intra-node"));
    FLASHCP_ASSIGN_OR_RETURN(
        const int64_t intra_recv,
        Checked(unit * (absl::int128(phase.received_tokens[r]) - inter_received[r]),
                "intra-node"));
    phase.max_intra_node_bytes = std::max({phase.max_intra_node_bytes, intra_sent, intra_recv});
    phase.max_inter_node_bytes =
        std::max({phase.max_inter_node_bytes, phase.inter_node_sent_bytes[r],
                  phase.inter_node_received_bytes[r]});
  }
  return absl::OkStatus();
}

absl::Status FillSchemeBytesFromUnits(const std::vector<int64_t>& phase_sent,
                                      const std::vector<int64_t>& phase_received,
                                      const std::vector<int64_t>& inter_sent,
                                      const std::vector<int64_t>& inter_received,
                                      int64_t unit_bytes, SchemeBytes& out) {
  const size_t n = phase_sent.size();
  out = SchemeBytes{};
  PhaseTraffic& p = out.phase;
  p.sent_tokens = phase_sent;
  p.received_tokens = phase_received;
  out.sent.resize(n);
  out.received.resize(n);
  const absl::int128 unit = unit_bytes;
  absl::int128 total = 0, inter = 0;
  for (size_t r = 0; r < n; ++r) {
    p.max_sent_tokens = std::max(p.max_sent_tokens, phase_sent[r]);
    p.max_received_tokens = std::max(p.max_received_tokens, phase_received[r]);
    // Backward sends what forward received (and receives what it sent).
    FLASHCP_ASSIGN_OR_RETURN(
        out.sent[r], Checked(unit * (absl::int128(phase_sent[r]) + phase_received[r]), "bytes"));
    out.received[r] = out.sent[r];
    total += phase_sent[r];
    inter += inter_sent[r];
  }
  p.bottleneck_tokens = std::max(p.max_sent_tokens, p.max_received_tokens);
  FLASHCP_ASSIGN_OR_RETURN(p.max_sent_bytes, Checked(unit * p.max_sent_tokens, "bytes"));
  FLASHCP_ASSIGN_OR_RETURN(p.max_received_bytes, Checked(unit * p.max_received_tokens, "bytes"));
  FLASHCP_ASSIGN_OR_RETURN(p.bottleneck_bytes, Checked(unit * p.bottleneck_tokens, "bytes"));
  FLASHCP_ASSIGN_OR_RETURN(out.bottleneck, Checked(2 * unit * p.bottleneck_tokens, "bytes"));
  FLASHCP_ASSIGN_OR_RETURN(p.inter_node_bytes, Checked(unit * inter, "inter-node"));
  FLASHCP_ASSIGN_OR_RETURN(p.intra_node_bytes, Checked(unit * (total - inter), "intra-node"));
  return FillLinkSplit(inter_sent, inter_received, unit_bytes, p);
}

absl::StatusOr<GroupPhaseBytes> GroupSchemePhase(const PlanMetrics& metrics,
                                                 const RankGroup& g, const ModelShape& shape,
                                                 int32_t ranks_per_node) {
  const int32_t n = static_cast<int32_t>(metrics.rank_tokens.size());
  const int32_t per_node = ranks_per_node <= 0 ? std::max(n, 1) : ranks_per_node;
  const int64_t kv_row = int64_t{2} * shape.heads * shape.head_dim * shape.dtype_bytes;
  const int64_t head_row = int64_t{shape.head_dim} * shape.dtype_bytes;
  const int32_t k = static_cast<int32_t>(g.ranks.size());
  GroupPhaseBytes out;
  out.sent.assign(k, 0);
  out.received.assign(k, 0);
  out.inter_sent.assign(k, 0);
  out.inter_received.assign(k, 0);
  switch (g.scheme) {
    case CommScheme::kFullKv:
    case CommScheme::kAllGather: {
      int64_t block = metrics.tokens_per_rank;
      if (g.scheme == CommScheme::kAllGather) {
        block = 0;
        for (int32_t r : g.ranks) block = std::max(block, metrics.rank_nonlast_tokens[r]);
      }
      const OffNode off = OffNodeTotals(g.ranks, std::vector<int64_t>(k, 0), per_node);
      for (int32_t j = 0; j < k; ++j) {
        FLASHCP_ASSIGN_OR_RETURN(out.sent[j],
                                 Checked(absl::int128(kv_row) * block * (k - 1), "allgather"));
        out.received[j] = out.sent[j];
        FLASHCP_ASSIGN_OR_RETURN(
            out.inter_sent[j], Checked(absl::int128(kv_row) * block * off.count[j], "allgather"));
        out.inter_received[j] = out.inter_sent[j];
      }
      break;
    }
    case CommScheme::kTargeted: {
      const PhaseTraffic& targeted = metrics.bytes[static_cast<int>(CommScheme::kTargeted)].phase;
      for (int32_t j = 0; j < k; ++j) {
        const int32_t r = g.ranks[j];
        FLASHCP_ASSIGN_OR_RETURN(
            out.sent[j], Checked(absl::int128(kv_row) * targeted.sent_tokens[r], "targeted"));
        FLASHCP_ASSIGN_OR_RETURN(out.received[j], Checked(absl::int128(kv_row) *
                                                              targeted.received_tokens[r],
                                                          "targeted"));
        out.inter_sent[j] = targeted.inter_node_sent_bytes[r];
        out.inter_received[j] = targeted.inter_node_received_bytes[r];
      }
      break;
    }
    case CommScheme::kAllToAll: {
      if (k == 1) break;  // whole documents: nothing moves
      FLASHCP_ASSIGN_OR_RETURN(AllToAllHeads heads, AllToAllGroupHeads(k, shape));
      std::vector<int64_t> t(k);
      for (int32_t j = 0; j < k; ++j) t[j] = metrics.rank_tokens[g.ranks[j]];
      const GroupRows rows = AllToAllRows(g.ranks, t, heads, per_node);
      const absl::int128 unit = head_row;
      for (int32_t j = 0; j < k; ++j) {
        FLASHCP_ASSIGN_OR_RETURN(out.sent[j], Checked(unit * rows.sent[j], "all_to_all"));
        FLASHCP_ASSIGN_OR_RETURN(out.received[j], Checked(unit * rows.received[j], "all_to_all"));
        FLASHCP_ASSIGN_OR_RETURN(out.inter_sent[j],
                                 Checked(unit * rows.inter_sent[j], "all_to_all"));
        FLASHCP_ASSIGN_OR_RETURN(out.inter_received[j],
                                 Checked(unit * rows.inter_received[j], "all_to_all"));
      }
      break;
    }
  }
  return out;
}

absl::StatusOr<SchemeBytes> GroupedSchemeBytes(const Plan& plan, const PlanMetrics& metrics,
                                               const std::vector<RankGroup>& groups,
                                               const ModelShape& shape, int32_t ranks_per_node) {
  FLASHCP_RETURN_IF_ERROR(ValidateModelShape(shape));
  FLASHCP_RETURN_IF_ERROR(ValidateRanksPerNode(ranks_per_node));
  const int32_t n = plan.cp_size;
  std::vector<std::vector<int32_t>> rank_lists;
  rank_lists.reserve(groups.size());
  for (const RankGroup& g : groups) rank_lists.push_back(g.ranks);
  FLASHCP_RETURN_IF_ERROR(CheckGroups(rank_lists, n, /*must_cover=*/true));
  if (static_cast<int32_t>(metrics.rank_tokens.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat("metrics: ", metrics.rank_tokens.size(),
                                                   " ranks, the plan has ", n));
  }
  std::vector<int32_t> group_of(n, -1);
  for (size_t g = 0; g < groups.size(); ++g) {
    for (int32_t r : groups[g].ranks) group_of[r] = static_cast<int32_t>(g);
  }
  for (const std::vector<int32_t>& component : PlanRankGroups(plan)) {
    for (int32_t r : component) {
      if (group_of[r] != group_of[component.front()]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "groups: ranks ", component.front(), " and ", r,
            " share a document but are in different groups"));
      }
    }
  }
  std::vector<int64_t> sent(n, 0), recv(n, 0), inter_sent(n, 0), inter_recv(n, 0);
  for (const RankGroup& g : groups) {
    FLASHCP_ASSIGN_OR_RETURN(
        GroupPhaseBytes b,
        g.two_level && g.scheme == CommScheme::kAllToAll
            ? TwoLevelGroupPhase(plan, metrics, g.ranks, shape, ranks_per_node)
            : GroupSchemePhase(metrics, g, shape, ranks_per_node));
    for (size_t j = 0; j < g.ranks.size(); ++j) {
      const int32_t r = g.ranks[j];
      sent[r] = b.sent[j];
      recv[r] = b.received[j];
      inter_sent[r] = b.inter_sent[j];
      inter_recv[r] = b.inter_received[j];
    }
  }
  SchemeBytes out;
  FLASHCP_RETURN_IF_ERROR(
      FillSchemeBytesFromUnits(sent, recv, inter_sent, inter_recv, /*unit_bytes=*/1, out));
  // Mixed schemes have no common row: bytes only.
  out.phase.sent_tokens.clear();
  out.phase.received_tokens.clear();
  out.phase.max_sent_tokens = out.phase.max_received_tokens = out.phase.bottleneck_tokens = 0;
  return out;
}

}  // namespace flashcp::core
