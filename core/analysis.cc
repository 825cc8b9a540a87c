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
#include "core/status_macros.h"

namespace flashcp::core {
namespace {

// Shards grouped by document, each group sorted by start: a CSR table, so a
// batch of a million documents costs two flat arrays, not a million vectors.
struct DocIndex {
  std::vector<int32_t> begin;   // size n_docs + 1; group of doc d is [begin[d], begin[d+1])
  std::vector<int32_t> shards;  // shard indices
};

DocIndex IndexByDoc(const Plan& plan) {
  const size_t n_docs = plan.doc_lens.size();
  DocIndex index;
  index.begin.assign(n_docs + 1, 0);
  for (const Shard& s : plan.shards) ++index.begin[s.doc + 1];
  std::partial_sum(index.begin.begin(), index.begin.end(), index.begin.begin());
  index.shards.resize(plan.shards.size());
  std::vector<int32_t> fill(index.begin.begin(), index.begin.end() - 1);
  for (size_t i = 0; i < plan.shards.size(); ++i) {
    index.shards[fill[plan.shards[i].doc]++] = static_cast<int32_t>(i);
  }
  // Most documents are whole (one shard) and many cut ones come in order:
  // those need no sort.
  const auto by_start = [&](int32_t a, int32_t b) {
    return plan.shards[a].start < plan.shards[b].start;
  };
  for (size_t d = 0; d < n_docs; ++d) {
    const auto first = index.shards.begin() + index.begin[d];
    const auto last = index.shards.begin() + index.begin[d + 1];
    if (last - first > 1 && !std::is_sorted(first, last, by_start)) {
      std::sort(first, last, by_start);
    }
  }
  return index;
}

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

// One phase's targeted tokens per rank (SPEC "Targeted exchange, per
// phase"), from a valid plan's shards grouped by document.
// With `inter` set, also the tokens sent to ranks on other nodes (node of
// rank r: r / ranks_per_node; ranks_per_node 0: one node), summed over ranks;
// with `pairs` set (N x N, zeroed by the caller), the tokens each rank sends
// each other one, pairs[src * N + dest]; with `rank_inter` set (and
// `inter`), per rank the tokens sent to ([0]) and received from ([1]) ranks
// on other nodes.
void TargetedPhase(const Plan& plan, const DocIndex& index, std::vector<int64_t>& fwd_sent,
                   std::vector<int64_t>& fwd_recv, int32_t ranks_per_node = 0,
                   int64_t* inter = nullptr, std::vector<int64_t>* pairs = nullptr,
                   std::array<std::vector<int64_t>, 2>* rank_inter = nullptr) {
  const int32_t n = plan.cp_size;
  const int32_t per_node = ranks_per_node <= 0 ? n : ranks_per_node;
  std::vector<int32_t> node_distinct((n + per_node - 1) / per_node, 0);
  if (inter != nullptr) *inter = 0;
  std::vector<int64_t> node_tokens;  // per node: tokens of the pieces before the current one
  if (rank_inter != nullptr) {
    (*rank_inter)[0].assign(n, 0);
    (*rank_inter)[1].assign(n, 0);
    node_tokens.assign(node_distinct.size(), 0);
  }
  // Forward KV tokens each rank sends and receives under kTargeted, counted
  // in O(pieces) per document: rank d receives every piece before its own last
  // piece of the document that it does not own itself.
  fwd_sent.assign(n, 0);
  fwd_recv.assign(n, 0);
  std::vector<int32_t> last_pos(n, -1);
  // Capacity hints: at most n distinct owners per document, and usually at
  // most two pieces per owner (a zigzag's), so the per-document buffers
  // below are allocated once, not regrown document after document.
  const size_t pieces_hint = 2 * static_cast<size_t>(n) + 1;
  std::vector<int32_t> touched;
  touched.reserve(n);
  std::vector<int64_t> prefix_tokens;  // tokens of pieces [0, k)
  prefix_tokens.reserve(pieces_hint);
  std::vector<int64_t> own_before;     // per rank: its tokens among the pieces seen so far
  own_before.assign(n, 0);
  std::vector<int32_t> distinct_after;
  distinct_after.reserve(pieces_hint);
  std::vector<int32_t> later;  // distinct owners of the pieces after the current one
  for (size_t d = 0; d < plan.doc_lens.size(); ++d) {
    const int32_t b = index.begin[d], e = index.begin[d + 1], count = e - b;
    if (count <= 1 || n == 1) continue;
    touched.clear();
    for (int32_t k = 0; k < count; ++k) {
      const int32_t r = plan.shards[index.shards[b + k]].rank;
      if (last_pos[r] < 0) touched.push_back(r);
      last_pos[r] = k;
    }
    // distinct_after[k]: distinct owners of pieces k+1..count-1.
    distinct_after.assign(count, 0);
    int32_t distinct = 0;
    for (int32_t k = count - 1; k >= 0; --k) {
      distinct_after[k] = distinct;
      if (last_pos[plan.shards[index.shards[b + k]].rank] == k) ++distinct;
    }
    // Received by r: tokens of pieces before last_pos[r], minus r's own among them.
    prefix_tokens.assign(count + 1, 0);
    for (int32_t k = 0; k < count; ++k) {
      prefix_tokens[k + 1] = prefix_tokens[k] + plan.shards[index.shards[b + k]].len;
    }
    for (int32_t k = 0; k < count; ++k) {
      const Shard& s = plan.shards[index.shards[b + k]];
      const bool owner_later = last_pos[s.rank] > k;
      fwd_sent[s.rank] += s.len * (distinct_after[k] - (owner_later ? 1 : 0));
      if (k < last_pos[s.rank]) own_before[s.rank] += s.len;
    }
    if (inter != nullptr) {
      // Piece k goes to the distinct owners of later pieces but itself; of
      // those, the ones outside its node: walk back, counting owners per node.
      for (int32_t k = count - 1; k >= 0; --k) {
        const Shard& s = plan.shards[index.shards[b + k]];
        const int32_t node = s.rank / per_node;
        const int32_t later_total = distinct_after[k];
        const int32_t later_here = node_distinct[node];
        const bool owner_later = last_pos[s.rank] > k;
        // The owner's own later piece counts in both; the rest of its node's are intra.
        const int64_t piece_inter = s.len * ((later_total - (owner_later ? 1 : 0)) -
                                             (later_here - (owner_later ? 1 : 0)));
        *inter += piece_inter;
        if (rank_inter != nullptr) (*rank_inter)[0][s.rank] += piece_inter;
        if (last_pos[s.rank] == k) ++node_distinct[node];
      }
      for (int32_t r : touched) node_distinct[r / per_node] = 0;
      if (rank_inter != nullptr) {
        // Rank r receives the pieces before its last one held off its node.
        for (int32_t k = 0; k < count; ++k) {
          const Shard& s = plan.shards[index.shards[b + k]];
          const int32_t node = s.rank / per_node;
          if (last_pos[s.rank] == k) {
            (*rank_inter)[1][s.rank] += prefix_tokens[k] - node_tokens[node];
          }
          node_tokens[node] += s.len;
        }
        for (int32_t r : touched) node_tokens[r / per_node] = 0;
      }
    }
    if (pairs != nullptr) {
      // Piece k goes to each distinct owner of a later piece but its own.
      later.clear();
      for (int32_t k = count - 1; k >= 0; --k) {
        const Shard& s = plan.shards[index.shards[b + k]];
        for (int32_t dest : later) {
          if (dest != s.rank) (*pairs)[static_cast<size_t>(s.rank) * n + dest] += s.len;
        }
        if (last_pos[s.rank] == k) later.push_back(s.rank);
      }
    }
    for (int32_t r : touched) {
      fwd_recv[r] += prefix_tokens[last_pos[r]] - own_before[r];
      own_before[r] = 0;
      last_pos[r] = -1;
    }
  }
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

  const DocIndex index = IndexByDoc(plan);
  for (size_t d = 0; d < plan.doc_lens.size(); ++d) {
    if (index.begin[d + 1] - index.begin[d] <= 1) continue;
    ++m.cut_docs;
    for (int32_t k = index.begin[d]; k < index.begin[d + 1]; ++k) {
      const int64_t len = plan.shards[index.shards[k]].len;
      if (m.min_cut_shard_len == 0 || len < m.min_cut_shard_len) m.min_cut_shard_len = len;
    }
  }
  const bool bd = IsBlockDiffusion(plan.mask);
  m.mask = plan.mask;
  std::vector<int64_t> fwd_sent, fwd_recv;
  int64_t targeted_inter = 0;
  std::array<std::vector<int64_t>, 2> targeted_rank_inter;
  MaskTraffic bd_traffic;  // block diffusion only
  if (bd) {
    bd_traffic = ComputeMaskTraffic(plan);
    fwd_sent = bd_traffic.sent_tokens;
    fwd_recv = bd_traffic.received_tokens;
    const int32_t node_size = ranks_per_node <= 0 ? n : ranks_per_node;
    targeted_rank_inter[0].assign(n, 0);
    targeted_rank_inter[1].assign(n, 0);
    for (int32_t a = 0; a < n; ++a) {
      for (int32_t b = 0; b < n; ++b) {
        if (a / node_size != b / node_size) {
          const int64_t t = bd_traffic.pair_tokens[static_cast<size_t>(a) * n + b];
          targeted_inter += t;
          targeted_rank_inter[0][a] += t;
          targeted_rank_inter[1][b] += t;
        }
      }
    }
    m.rank_nonlast_tokens = bd_traffic.needed_elsewhere_tokens;
    m.rank_noisy_tokens.assign(n, 0);
    m.cut_noisy_blocks = CutNoisyBlocks(plan);
  } else {
    TargetedPhase(plan, index, fwd_sent, fwd_recv, ranks_per_node, &targeted_inter, nullptr,
                  &targeted_rank_inter);
  }
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
  m.imbalance = max_workload / (total_workload / n);
  m.max_nonlast_tokens =
      *std::max_element(m.rank_nonlast_tokens.begin(), m.rank_nonlast_tokens.end());
  m.comm_saving = 1.0 - static_cast<double>(m.max_nonlast_tokens) /
                            static_cast<double>(m.tokens_per_rank);

  const absl::int128 per_token = absl::int128(shape.heads) * shape.head_dim * shape.dtype_bytes;
  const int64_t peers = n - 1;
  std::vector<int64_t> full_tokens(n, m.tokens_per_rank * peers);
  std::vector<int64_t> gather_tokens(n, m.max_nonlast_tokens * peers);
  FLASHCP_RETURN_IF_ERROR(FillSchemeBytes(full_tokens, full_tokens, per_token, "full_kv",
                                          m.bytes[static_cast<int>(CommScheme::kFullKv)]));
  FLASHCP_RETURN_IF_ERROR(FillSchemeBytes(gather_tokens, gather_tokens, per_token, "allgather",
                                          m.bytes[static_cast<int>(CommScheme::kAllGather)]));
  FLASHCP_RETURN_IF_ERROR(FillSchemeBytes(fwd_sent, fwd_recv, per_token, "targeted",
                                          m.bytes[static_cast<int>(CommScheme::kTargeted)]));
  // Intra- and inter-node bytes of one phase: an all-gather sends every
  // rank's buffer to each peer, so per rank r (N - 1) copies, those to ranks
  // outside r's node inter-node.
  const int32_t per_node = ranks_per_node <= 0 ? n : ranks_per_node;
  int64_t inter_pairs = 0;  // ordered (sender, receiver) pairs on different nodes
  for (int32_t r = 0; r < n; ++r) {
    const int32_t node_begin = r / per_node * per_node;
    inter_pairs += n - (std::min(n, node_begin + per_node) - node_begin);
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
  FLASHCP_RETURN_IF_ERROR(split(m.bytes[static_cast<int>(CommScheme::kFullKv)],
                                absl::int128(m.tokens_per_rank) * inter_pairs,
                                absl::int128(m.tokens_per_rank) * all_pairs));
  FLASHCP_RETURN_IF_ERROR(split(m.bytes[static_cast<int>(CommScheme::kAllGather)],
                                absl::int128(m.max_nonlast_tokens) * inter_pairs,
                                absl::int128(m.max_nonlast_tokens) * all_pairs));
  absl::int128 targeted_total = 0;
  for (int64_t t : fwd_sent) targeted_total += t;
  FLASHCP_RETURN_IF_ERROR(split(m.bytes[static_cast<int>(CommScheme::kTargeted)],
                                targeted_inter, targeted_total));
  // Per rank and link: an all-gather block goes to each peer off the rank's
  // node (and one comes from each).
  {
    std::vector<int64_t> full_inter(n), gather_inter(n);
    for (int32_t r = 0; r < n; ++r) {
      const int32_t node_begin = r / per_node * per_node;
      const int64_t off_node = n - (std::min(n, node_begin + per_node) - node_begin);
      full_inter[r] = m.tokens_per_rank * off_node;
      gather_inter[r] = m.max_nonlast_tokens * off_node;
    }
    const int64_t kv_row = static_cast<int64_t>(2 * per_token);
    FLASHCP_RETURN_IF_ERROR(FillLinkSplit(full_inter, full_inter, kv_row,
                                          m.bytes[static_cast<int>(CommScheme::kFullKv)].phase));
    FLASHCP_RETURN_IF_ERROR(FillLinkSplit(
        gather_inter, gather_inter, kv_row, m.bytes[static_cast<int>(CommScheme::kAllGather)].phase));
    FLASHCP_RETURN_IF_ERROR(FillLinkSplit(targeted_rank_inter[0], targeted_rank_inter[1], kv_row,
                                          m.bytes[static_cast<int>(CommScheme::kTargeted)].phase));
  }
  // The all-to-all within the plan's rank groups, where every group's size
  // divides Hq.
  {
    SchemeBytes& a2a = m.bytes[static_cast<int>(CommScheme::kAllToAll)];
    // Under block diffusion a document's noisy and clean copies are two plan
    // documents, so the plan's rank groups do not say which ranks a head
    // split must span: the scheme is not offered there.
    absl::StatusOr<AllToAllPhase> phase =
        bd ? absl::StatusOr<AllToAllPhase>(absl::FailedPreconditionError(
                 "attention_mask: the all-to-all scheme is not planned under block diffusion"))
           : AllToAllTraffic(m.rank_tokens, PlanRankGroups(plan), shape, ranks_per_node);
    if (phase.ok()) {
      FLASHCP_RETURN_IF_ERROR(FillSchemeBytesFromUnits(
          phase->sent, phase->received, phase->inter_sent, phase->inter_received,
          int64_t{shape.head_dim} * shape.dtype_bytes, a2a));
      m.all_to_all_replicated_kv_heads = phase->replicated_kv_heads;
    } else if (phase.status().code() == absl::StatusCode::kFailedPrecondition) {
      m.all_to_all_inapplicable = std::string(phase.status().message());
      const std::vector<int64_t> zero(n, 0);
      FLASHCP_RETURN_IF_ERROR(FillSchemeBytesFromUnits(zero, zero, zero, zero, 1, a2a));
    } else {
      return phase.status();
    }
  }
  if (bd) {
    // Clean and noisy K/V received per rank: an all-gather delivers every
    // peer's buffer (full_kv: its tokens; allgather: its needed-elsewhere
    // tokens), the targeted exchange the needed tokens.
    std::vector<int64_t> clean(n), noisy(n), clean_buf(n), noisy_buf(n);
    for (int32_t r = 0; r < n; ++r) {
      clean[r] = m.rank_tokens[r] - m.rank_noisy_tokens[r];
      noisy[r] = m.rank_noisy_tokens[r];
      clean_buf[r] = bd_traffic.clean_needed_elsewhere_tokens[r];
      noisy_buf[r] = bd_traffic.needed_elsewhere_tokens[r] - clean_buf[r];
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
      targeted_noisy[r] = bd_traffic.received_tokens[r] - bd_traffic.clean_received_tokens[r];
    }
    FLASHCP_RETURN_IF_ERROR(
        fill(CommScheme::kTargeted, bd_traffic.clean_received_tokens, targeted_noisy));
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
