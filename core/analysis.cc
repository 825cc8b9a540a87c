#include "core/analysis.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "absl/numeric/int128.h"
#include "absl/strings/str_cat.h"
#include "core/echo.h"
#include "core/rank_groups.h"
#include "core/mask.h"
#include "core/mask_layout.h"
#include "core/internal/targeted_phase.h"
#include "core/status_macros.h"

namespace flashcp::core {
namespace {

using internal::DocIndex;
using internal::IndexByDoc;
using internal::TargetedPhase;

absl::StatusOr<int64_t> CheckedBytes(absl::int128 value, absl::string_view what) {
  if (value > absl::int128(std::numeric_limits<int64_t>::max())) {
    return absl::OutOfRangeError(absl::StrCat(what, ": byte count overflows int64"));
  }
  return static_cast<int64_t>(value);
}

// Fills `out` from one phase's tokens per rank (forward; backward mirrors
// it): a rank sends in both phases what it sends forward plus what it
// received forward (the gradients go back), and receives symmetrically.
absl::Status FillSchemeBytes(const std::vector<int64_t>& phase_sent,
                             const std::vector<int64_t>& phase_received,
                             absl::int128 per_token, absl::string_view what, SchemeBytes& out) {
  const size_t n = phase_sent.size();
  PhaseTraffic& p = out.phase;
  p.sent_tokens = phase_sent;
  p.received_tokens = phase_received;
  out.sent.resize(n);
  out.received.resize(n);
  for (size_t r = 0; r < n; ++r) {
    p.max_sent_tokens = std::max(p.max_sent_tokens, phase_sent[r]);
    p.max_received_tokens = std::max(p.max_received_tokens, phase_received[r]);
    FLASHCP_ASSIGN_OR_RETURN(
        out.sent[r],
        CheckedBytes(2 * per_token * (absl::int128(phase_sent[r]) + phase_received[r]), what));
    out.received[r] = out.sent[r];
  }
  p.bottleneck_tokens = std::max(p.max_sent_tokens, p.max_received_tokens);
  const absl::int128 kv = 2 * per_token;  // K and V (or dK and dV) per token
  FLASHCP_ASSIGN_OR_RETURN(p.max_sent_bytes, CheckedBytes(kv * p.max_sent_tokens, what));
  FLASHCP_ASSIGN_OR_RETURN(p.max_received_bytes, CheckedBytes(kv * p.max_received_tokens, what));
  FLASHCP_ASSIGN_OR_RETURN(p.bottleneck_bytes, CheckedBytes(kv * p.bottleneck_tokens, what));
  FLASHCP_ASSIGN_OR_RETURN(out.bottleneck, CheckedBytes(2 * kv * p.bottleneck_tokens, what));
  return absl::OkStatus();
}

}  // namespace

absl::string_view CommSchemeName(CommScheme scheme) {
  switch (scheme) {
    case CommScheme::kFullKv:
      return "full_kv";
    case CommScheme::kAllGather:
      return "allgather";
    case CommScheme::kTargeted:
      return "targeted";
    case CommScheme::kAllToAll:
      return "all_to_all";
  }
  return "unknown";
}

absl::StatusOr<CommScheme> ParseCommScheme(absl::string_view name) {
  for (CommScheme s : kAllCommSchemes) {
    if (CommSchemeName(s) == name) return s;
  }
  return absl::InvalidArgumentError(absl::StrCat("scheme: unknown communication scheme ",
                                                 Echo(name), " (full_kv, allgather, targeted, all_to_all)"));
}

absl::Status ValidateModelShape(const ModelShape& shape) {
  if (shape.heads < 1 || shape.heads > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("heads: must be in [1, 1024], got ", shape.heads));
  }
  if (shape.head_dim < 1 || shape.head_dim > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("head_dim: must be in [1, 1024], got ", shape.head_dim));
  }
  if (shape.dtype_bytes != 1 && shape.dtype_bytes != 2 && shape.dtype_bytes != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype_bytes: must be 1, 2 or 4, got ", shape.dtype_bytes));
  }
  if (shape.query_heads != 0 && (shape.query_heads < 1 || shape.query_heads > 1024 ||
                                 shape.query_heads % shape.heads != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "query_heads: must be 0 (equal to heads) or a multiple of heads (", shape.heads,
        ") in [1, 1024], got ", shape.query_heads));
  }
  return absl::OkStatus();
}

absl::Status ValidatePlan(const Plan& plan) {
  {
    absl::Status s = ValidateBatch(Batch{plan.doc_lens, plan.cp_size});
    if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("plan: ", s.message()));
  }
  FLASHCP_RETURN_IF_ERROR(ValidatePlanMask(plan));
  const int32_t n = plan.cp_size;
  const int64_t total = TotalTokens(plan.doc_lens);
  if (plan.padding != PaddingTokens(total, n)) {
    return absl::InvalidArgumentError(absl::StrCat("padding: ", plan.padding, ", expected ",
                                                   PaddingTokens(total, n), " for ", total,
                                                   " tokens on ", n, " ranks"));
  }
  if (plan.shards.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError("shards: too many shards");
  }
  std::vector<int64_t> rank_tokens(n, 0);
  int32_t prev_rank = 0;
  for (size_t i = 0; i < plan.shards.size(); ++i) {
    const Shard& s = plan.shards[i];
    if (s.doc < 0 || static_cast<size_t>(s.doc) >= plan.doc_lens.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("shards[", i, "].doc: ", s.doc, " is not a document index"));
    }
    if (s.rank < 0 || s.rank >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("shards[", i, "].rank: ", s.rank, " is outside [0, ", n, ")"));
    }
    if (s.rank < prev_rank) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shards[", i, "].rank: ", s.rank, " after rank ", prev_rank, "; shards must be grouped by rank ascending"));
    }
    prev_rank = s.rank;
    if (s.len < 1 || s.start < 0 || s.start > plan.doc_lens[s.doc] - s.len) {
      return absl::InvalidArgumentError(
          absl::StrCat("shards[", i, "]: range [", s.start, ", ", s.start + s.len,
                       ") is empty or outside doc ", s.doc, " of ", plan.doc_lens[s.doc],
                       " tokens"));
    }
    rank_tokens[s.rank] += s.len;
  }
  const DocIndex index = IndexByDoc(plan);
  for (size_t d = 0; d < plan.doc_lens.size(); ++d) {
    int64_t next = 0;
    int32_t prev = -1;
    for (int32_t k = index.begin[d]; k < index.begin[d + 1]; ++k) {
      const int32_t i = index.shards[k];
      const Shard& s = plan.shards[i];
      if (s.start != next) {
        return absl::InvalidArgumentError(absl::StrCat(
            "shards[", i, "]: doc ", d, " token ", std::min(s.start, next),
            s.start > next ? " is not covered" : " is covered twice"));
      }
      if (prev >= 0 && plan.shards[prev].rank == s.rank) {
        return absl::InvalidArgumentError(
            absl::StrCat("shards[", prev, "] and shards[", i, "]: adjacent shards of doc ", d,
                         " on rank ", s.rank, " must be one shard"));
      }
      next = s.start + s.len;
      prev = i;
    }
    if (next != plan.doc_lens[d]) {
      return absl::InvalidArgumentError(absl::StrCat("doc ", d, ": tokens [", next, ", ",
                                                     plan.doc_lens[d], ") are not covered"));
    }
  }
  for (int32_t r = 0; r < n; ++r) {
    const int64_t want = RankRealTokens(total, n, r);
    if (rank_tokens[r] != want) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", r, ": holds ", rank_tokens[r],
                                                     " real tokens, expected ", want));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<CommLayout> BuildCommLayout(const Plan& plan) {
  FLASHCP_RETURN_IF_ERROR(ValidatePlan(plan));
  // The compacted send ranges below are the causal mask's (whole non-last
  // shards); the block-diffusion exchange is ComputeMaskTraffic's.
  if (IsBlockDiffusion(plan.mask)) return BuildMaskCommLayout(plan);
  const int32_t n = plan.cp_size;
  const DocIndex index = IndexByDoc(plan);
  CommLayout layout;
  layout.ranks.resize(n);
  layout.docs.resize(plan.doc_lens.size());
  std::vector<int32_t> pos_of_shard(plan.shards.size());
  for (size_t d = 0; d < plan.doc_lens.size(); ++d) {
    for (int32_t k = index.begin[d]; k < index.begin[d + 1]; ++k) {
      const int32_t i = index.shards[k];
      pos_of_shard[i] = k - index.begin[d];
      layout.docs[d].push_back(DocPiece{i, plan.shards[i].rank, -1});
    }
  }
  for (size_t i = 0; i < plan.shards.size(); ++i) {
    const Shard& s = plan.shards[i];
    RankLayout& rank = layout.ranks[s.rank];
    const int64_t offset = rank.shard_offset.empty()
                               ? 0
                               : rank.shard_offset.back() + plan.shards[rank.shards.back()].len;
    rank.shards.push_back(static_cast<int32_t>(i));
    rank.shard_offset.push_back(offset);
    rank.doc_pos.push_back(pos_of_shard[i]);
    const bool last = pos_of_shard[i] + 1 == static_cast<int32_t>(layout.docs[s.doc].size());
    if (!last) {
      layout.docs[s.doc][pos_of_shard[i]].send_index = static_cast<int32_t>(rank.send.size());
      rank.send.push_back(SendRange{static_cast<int32_t>(i), rank.send_tokens, s.len});
      rank.send_tokens += s.len;
    }
  }
  // Targeted: piece k of a document goes to every other rank that owns a later piece.
  struct Edge {
    int32_t src, dest, send_index;
  };
  std::vector<Edge> edges;
  std::vector<int32_t> later;  // distinct ranks owning later pieces of the current doc
  std::vector<uint8_t> seen(n, 0);
  for (const std::vector<DocPiece>& pieces : layout.docs) {
    later.clear();
    for (int32_t k = static_cast<int32_t>(pieces.size()) - 1; k >= 0; --k) {
      const DocPiece& p = pieces[k];
      for (int32_t dest : later) {
        if (dest != p.rank) edges.push_back(Edge{p.rank, dest, p.send_index});
      }
      if (!seen[p.rank]) {
        seen[p.rank] = 1;
        later.push_back(p.rank);
      }
    }
    for (int32_t r : later) seen[r] = 0;
  }
  std::sort(edges.begin(), edges.end(), [](const Edge& a, const Edge& b) {
    return std::tie(a.src, a.dest, a.send_index) < std::tie(b.src, b.dest, b.send_index);
  });
  for (const Edge& e : edges) {
    RankLayout& src = layout.ranks[e.src];
    if (src.targeted.empty() || src.targeted.back().dest != e.dest) {
      src.targeted.push_back(TargetedSend{e.dest, {}, 0});
    }
    src.targeted.back().send_indices.push_back(e.send_index);
    src.targeted.back().tokens += src.send[e.send_index].len;
  }
  return layout;
}

absl::Status ValidateRanksPerNode(int32_t ranks_per_node) {
  if (ranks_per_node < 0 || ranks_per_node > kMaxCpSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ranks_per_node: must be in [0, ", kMaxCpSize, "] (0: one node), got ", ranks_per_node));
  }
  return absl::OkStatus();
}

int64_t TargetedPhaseBottleneck(const Plan& plan) {
  std::vector<int64_t> sent, recv;
  if (IsBlockDiffusion(plan.mask)) {
    MaskTraffic t = ComputeMaskTraffic(plan);
    sent = std::move(t.sent_tokens);
    recv = std::move(t.received_tokens);
  } else {
    TargetedPhase(plan, IndexByDoc(plan), sent, recv);
  }
  int64_t bottleneck = 0;
  for (size_t r = 0; r < sent.size(); ++r) bottleneck = std::max({bottleneck, sent[r], recv[r]});
  return bottleneck;
}

std::vector<int64_t> TargetedPairTokens(const Plan& plan) {
  const size_t n = static_cast<size_t>(plan.cp_size);
  if (IsBlockDiffusion(plan.mask)) return ComputeMaskTraffic(plan).pair_tokens;
  std::vector<int64_t> sent, recv, pairs(n * n, 0);
  TargetedPhase(plan, IndexByDoc(plan), sent, recv, 0, nullptr, &pairs);
  return pairs;
}

int64_t TargetedPhaseLowerBound(const Batch& batch, double max_workload) {
  const int64_t total = TotalTokens(batch.doc_lens);
  const int64_t floor_tokens = total / batch.cp_size;
  const int64_t ceil_tokens = TokensPerRank(total, batch.cp_size);
  int64_t bound = 0;
  for (int64_t len : batch.doc_lens) {
    if (len <= 1) continue;
    // Pairs of the rank holding the last token when it holds a of the
    // document's tokens: non-decreasing in a >= 1.
    const auto pairs = [&](int64_t a) {
      return ShardWorkload(0, a - 1) + static_cast<double>(len) +
             static_cast<double>(std::max<int64_t>(0, floor_tokens - a));
    };
    int64_t lo = 1, hi = std::min(len, ceil_tokens);  // the answer in [lo, hi] once lo fits
    if (pairs(lo) > max_workload) {
      bound = std::max(bound, len - 1);
      continue;
    }
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo + 1) / 2;
      if (pairs(mid) <= max_workload) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    bound = std::max(bound, len - lo);
  }
  return bound;
}

namespace {

// One phase's targeted traffic: tokens per rank, inter-node tokens (summed
// and per rank: sent [0], received [1]) and, under block diffusion, the mask's.
struct TargetedTraffic {
  std::vector<int64_t> sent, recv;
  int64_t inter = 0;
  std::array<std::vector<int64_t>, 2> rank_inter;
  MaskTraffic bd;  // block diffusion only
};

// Documents cut into several shards and the shortest such shard.
void CountCutDocs(const Plan& plan, const DocIndex& index, PlanMetrics& m) {
  for (size_t d = 0; d < plan.doc_lens.size(); ++d) {
    if (index.begin[d + 1] - index.begin[d] <= 1) continue;
    ++m.cut_docs;
    for (int32_t k = index.begin[d]; k < index.begin[d + 1]; ++k) {
      const int64_t len = plan.shards[index.shards[k]].len;
      if (m.min_cut_shard_len == 0 || len < m.min_cut_shard_len) m.min_cut_shard_len = len;
    }
  }
}

// The targeted traffic; under block diffusion also the mask's per-rank
// fields of m (needed-elsewhere tokens, noisy tokens zeroed, cut noisy blocks).
TargetedTraffic ComputeTargeted(const Plan& plan, const DocIndex& index, int32_t ranks_per_node,
                                PlanMetrics& m) {
  const int32_t n = plan.cp_size;
  TargetedTraffic t;
  if (!IsBlockDiffusion(plan.mask)) {
    TargetedPhase(plan, index, t.sent, t.recv, ranks_per_node, &t.inter, nullptr, &t.rank_inter);
    return t;
  }
  t.bd = ComputeMaskTraffic(plan);
  t.sent = t.bd.sent_tokens;
  t.recv = t.bd.received_tokens;
  const int32_t node_size = ranks_per_node <= 0 ? n : ranks_per_node;
  t.rank_inter[0].assign(n, 0);
  t.rank_inter[1].assign(n, 0);
  for (int32_t a = 0; a < n; ++a) {
    for (int32_t b = 0; b < n; ++b) {
      if (a / node_size != b / node_size) {
        const int64_t tokens = t.bd.pair_tokens[static_cast<size_t>(a) * n + b];
        t.inter += tokens;
        t.rank_inter[0][a] += tokens;
        t.rank_inter[1][b] += tokens;
      }
    }
  }
  m.rank_nonlast_tokens = t.bd.needed_elsewhere_tokens;
  m.rank_noisy_tokens.assign(n, 0);
  m.cut_noisy_blocks = CutNoisyBlocks(plan);
  return t;
}

// Per-rank tokens, workload, segments and non-last (or, under block
// diffusion, noisy) tokens, then the imbalance and the all-gather saving.
void AccumulateRanks(const Plan& plan, const DocIndex& index, PlanMetrics& m) {
  const bool bd = IsBlockDiffusion(plan.mask);
  std::vector<uint8_t> is_last(plan.shards.size(), 0);
  for (size_t d = 0; d < plan.doc_lens.size(); ++d) {
    is_last[index.shards[index.begin[d + 1] - 1]] = 1;
  }
  for (size_t i = 0; i < plan.shards.size(); ++i) {
    const Shard& s = plan.shards[i];
    m.rank_tokens[s.rank] += s.len;
    m.rank_workload[s.rank] += MaskedShardWorkload(plan, s);
    ++m.rank_segments[s.rank];
    if (bd) {
      if (IsNoisyDoc(plan, s.doc)) m.rank_noisy_tokens[s.rank] += s.len;
    } else if (!is_last[i]) {
      m.rank_nonlast_tokens[s.rank] += s.len;
    }
  }
  double total_workload = 0.0, max_workload = 0.0;
  for (double w : m.rank_workload) {
    total_workload += w;
    max_workload = std::max(max_workload, w);
  }
  m.imbalance = max_workload / (total_workload / plan.cp_size);
  m.max_nonlast_tokens =
      *std::max_element(m.rank_nonlast_tokens.begin(), m.rank_nonlast_tokens.end());
  m.comm_saving = 1.0 - static_cast<double>(m.max_nonlast_tokens) /
                            static_cast<double>(m.tokens_per_rank);
}

// Bytes of full_kv, allgather and targeted, per rank and intra/inter-node.
absl::Status FillGatherSchemes(int32_t n, int32_t ranks_per_node, absl::int128 per_token,
                               const TargetedTraffic& t, PlanMetrics& m) {
  SchemeBytes& full_kv = m.bytes[static_cast<int>(CommScheme::kFullKv)];
  SchemeBytes& gather = m.bytes[static_cast<int>(CommScheme::kAllGather)];
  SchemeBytes& targeted = m.bytes[static_cast<int>(CommScheme::kTargeted)];
  const int64_t peers = n - 1;
  std::vector<int64_t> full_tokens(n, m.tokens_per_rank * peers);
  std::vector<int64_t> gather_tokens(n, m.max_nonlast_tokens * peers);
  FLASHCP_RETURN_IF_ERROR(FillSchemeBytes(full_tokens, full_tokens, per_token, "full_kv", full_kv));
  FLASHCP_RETURN_IF_ERROR(
      FillSchemeBytes(gather_tokens, gather_tokens, per_token, "allgather", gather));
  FLASHCP_RETURN_IF_ERROR(FillSchemeBytes(t.sent, t.recv, per_token, "targeted", targeted));
  // Intra- and inter-node bytes of one phase: an all-gather sends every
  // rank's buffer to each peer, so per rank r (N - 1) copies, those to ranks
  // outside r's node inter-node.
  const int32_t per_node = ranks_per_node <= 0 ? n : ranks_per_node;
  int64_t inter_pairs = 0;  // ordered (sender, receiver) pairs on different nodes
  std::vector<int64_t> off_node(n);
  for (int32_t r = 0; r < n; ++r) {
    const int32_t node_begin = r / per_node * per_node;
    off_node[r] = n - (std::min(n, node_begin + per_node) - node_begin);
    inter_pairs += off_node[r];
  }
  const absl::int128 all_pairs = absl::int128(n) * (n - 1);
  const auto split = [&](SchemeBytes& b, absl::int128 inter_tokens,
                         absl::int128 total_tokens) -> absl::Status {
    FLASHCP_ASSIGN_OR_RETURN(b.phase.inter_node_bytes,
                             CheckedBytes(2 * per_token * inter_tokens, "inter-node"));
    FLASHCP_ASSIGN_OR_RETURN(b.phase.intra_node_bytes,
                             CheckedBytes(2 * per_token * (total_tokens - inter_tokens),
                                          "intra-node"));
    return absl::OkStatus();
  };
  FLASHCP_RETURN_IF_ERROR(split(full_kv, absl::int128(m.tokens_per_rank) * inter_pairs,
                                absl::int128(m.tokens_per_rank) * all_pairs));
  FLASHCP_RETURN_IF_ERROR(split(gather, absl::int128(m.max_nonlast_tokens) * inter_pairs,
                                absl::int128(m.max_nonlast_tokens) * all_pairs));
  absl::int128 targeted_total = 0;
  for (int64_t tokens : t.sent) targeted_total += tokens;
  FLASHCP_RETURN_IF_ERROR(split(targeted, t.inter, targeted_total));
  // Per rank and link: an all-gather block goes to each peer off the rank's
  // node (and one comes from each).
  std::vector<int64_t> full_inter(n), gather_inter(n);
  for (int32_t r = 0; r < n; ++r) {
    full_inter[r] = m.tokens_per_rank * off_node[r];
    gather_inter[r] = m.max_nonlast_tokens * off_node[r];
  }
  const int64_t kv_row = static_cast<int64_t>(2 * per_token);
  FLASHCP_RETURN_IF_ERROR(FillLinkSplit(full_inter, full_inter, kv_row, full_kv.phase));
  FLASHCP_RETURN_IF_ERROR(FillLinkSplit(gather_inter, gather_inter, kv_row, gather.phase));
  return FillLinkSplit(t.rank_inter[0], t.rank_inter[1], kv_row, targeted.phase);
}

// The all-to-all within the plan's rank groups (PlanAllToAllPhase); where it
// does not apply, why, and all 0.
absl::Status FillAllToAll(const Plan& plan, const ModelShape& shape, int32_t ranks_per_node,
                          PlanMetrics& m) {
  SchemeBytes& a2a = m.bytes[static_cast<int>(CommScheme::kAllToAll)];
  absl::StatusOr<AllToAllPhase> phase = PlanAllToAllPhase(plan, shape, ranks_per_node);
  if (phase.ok()) {
    FLASHCP_RETURN_IF_ERROR(FillSchemeBytesFromUnits(
        phase->sent, phase->received, phase->inter_sent, phase->inter_received,
        AllToAllRowBytes(shape), a2a));
    m.all_to_all_replicated_kv_heads = phase->replicated_kv_heads;
    return absl::OkStatus();
  }
  if (phase.status().code() != absl::StatusCode::kFailedPrecondition) return phase.status();
  m.all_to_all_inapplicable = std::string(phase.status().message());
  const std::vector<int64_t> zero(plan.cp_size, 0);
  return FillSchemeBytesFromUnits(zero, zero, zero, zero, 1, a2a);
}

// Block diffusion: clean and noisy K/V received per rank. An all-gather
// delivers every peer's buffer (full_kv: its tokens; allgather: its
// needed-elsewhere tokens), the targeted exchange the needed tokens.
absl::Status FillCleanNoisy(int32_t n, absl::int128 per_token, const MaskTraffic& bd,
                            PlanMetrics& m) {
  std::vector<int64_t> clean(n), noisy(n), clean_buf(n), noisy_buf(n);
  for (int32_t r = 0; r < n; ++r) {
    clean[r] = m.rank_tokens[r] - m.rank_noisy_tokens[r];
    noisy[r] = m.rank_noisy_tokens[r];
    clean_buf[r] = bd.clean_needed_elsewhere_tokens[r];
    noisy_buf[r] = bd.needed_elsewhere_tokens[r] - clean_buf[r];
  }
  const auto from_peers = [&](const std::vector<int64_t>& per_rank) {
    const int64_t sum = std::accumulate(per_rank.begin(), per_rank.end(), int64_t{0});
    std::vector<int64_t> out(n);
    for (int32_t r = 0; r < n; ++r) out[r] = sum - per_rank[r];
    return out;
  };
  const auto fill = [&](CommScheme scheme, std::vector<int64_t> clean_recv,
                        std::vector<int64_t> noisy_recv) -> absl::Status {
    PhaseTraffic& p = m.bytes[static_cast<int>(scheme)].phase;
    const int64_t max_clean = *std::max_element(clean_recv.begin(), clean_recv.end());
    const int64_t max_noisy = *std::max_element(noisy_recv.begin(), noisy_recv.end());
    FLASHCP_ASSIGN_OR_RETURN(p.max_clean_received_bytes,
                             CheckedBytes(2 * per_token * max_clean, "clean"));
    FLASHCP_ASSIGN_OR_RETURN(p.max_noisy_received_bytes,
                             CheckedBytes(2 * per_token * max_noisy, "noisy"));
    p.clean_received_tokens = std::move(clean_recv);
    p.noisy_received_tokens = std::move(noisy_recv);
    return absl::OkStatus();
  };
  FLASHCP_RETURN_IF_ERROR(fill(CommScheme::kFullKv, from_peers(clean), from_peers(noisy)));
  FLASHCP_RETURN_IF_ERROR(
      fill(CommScheme::kAllGather, from_peers(clean_buf), from_peers(noisy_buf)));
  std::vector<int64_t> targeted_noisy(n);
  for (int32_t r = 0; r < n; ++r) {
    targeted_noisy[r] = bd.received_tokens[r] - bd.clean_received_tokens[r];
  }
  return fill(CommScheme::kTargeted, bd.clean_received_tokens, targeted_noisy);
}

}  // namespace

absl::StatusOr<PlanMetrics> AnalyzePlan(const Plan& plan, const ModelShape& shape,
                                        int32_t ranks_per_node) {
  FLASHCP_RETURN_IF_ERROR(ValidateModelShape(shape));
  FLASHCP_RETURN_IF_ERROR(ValidateRanksPerNode(ranks_per_node));
  FLASHCP_RETURN_IF_ERROR(ValidatePlan(plan));
  const int32_t n = plan.cp_size;
  const int64_t total = TotalTokens(plan.doc_lens);
  PlanMetrics m;
  m.tokens_per_rank = TokensPerRank(total, n);
  m.padding = plan.padding;
  m.rank_tokens.assign(n, 0);
  m.rank_workload.assign(n, 0.0);
  m.rank_nonlast_tokens.assign(n, 0);
  m.rank_segments.assign(n, 0);
  m.mask = plan.mask;

  const DocIndex index = IndexByDoc(plan);
  CountCutDocs(plan, index, m);
  const TargetedTraffic targeted_traffic = ComputeTargeted(plan, index, ranks_per_node, m);
  AccumulateRanks(plan, index, m);
  const absl::int128 per_token = absl::int128(shape.heads) * shape.head_dim * shape.dtype_bytes;
  FLASHCP_RETURN_IF_ERROR(FillGatherSchemes(n, ranks_per_node, per_token, targeted_traffic, m));
  FLASHCP_RETURN_IF_ERROR(FillAllToAll(plan, shape, ranks_per_node, m));
  if (IsBlockDiffusion(plan.mask)) {
    FLASHCP_RETURN_IF_ERROR(FillCleanNoisy(n, per_token, targeted_traffic.bd, m));
  }
  const int64_t full = m.bytes[static_cast<int>(CommScheme::kFullKv)].phase.bottleneck_tokens;
  const int64_t targeted =
      m.bytes[static_cast<int>(CommScheme::kTargeted)].phase.bottleneck_tokens;
  m.targeted_saving =
      full == 0 ? 1.0 : 1.0 - static_cast<double>(targeted) / static_cast<double>(full);
  m.cheaper_scheme =
      targeted < m.bytes[static_cast<int>(CommScheme::kAllGather)].phase.bottleneck_tokens
          ? CommScheme::kTargeted
          : CommScheme::kAllGather;
  return m;
}

}  // namespace flashcp::core
