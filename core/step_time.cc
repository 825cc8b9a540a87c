#include "core/step_time.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/rank_groups.h"
#include "core/status_macros.h"

namespace flashcp::core {
namespace {

struct NamedCluster {
  absl::string_view name;
  ClusterSpec spec;
};

ClusterSpec H200() { return ClusterSpec{}; }  // the defaults are the H200 node

ClusterSpec H100Sxm() {
  ClusterSpec c;
  c.hbm_bytes_per_second = 3.35e12;
  return c;
}

std::vector<NamedCluster> Presets() { return {{"h100-sxm", H100Sxm()}, {"h200", H200()}}; }

absl::Status FiniteIn(absl::string_view field, double v, double lo, bool lo_open) {
  if (!std::isfinite(v) || v < lo || (lo_open && v == lo)) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": must be finite and ",
                                                   lo_open ? "> " : ">= ", lo, ", got ", v));
  }
  return absl::OkStatus();
}

// Node of rank r: r / ranks_per_node (0: everything on node 0).
int32_t NodeOf(int32_t r, int32_t ranks_per_node) {
  return ranks_per_node == 0 ? 0 : r / ranks_per_node;
}

// Sum over integers u in [1, x] of clamp(u, 0, t): the (query, key) pairs of
// x queries whose causal reach into a t-key block grows by one per query.
double RampSum(double x, double t) {
  if (x <= 0) return 0;
  if (x <= t) return x * (x + 1) / 2;
  return t * (t + 1) / 2 + (x - t) * t;
}

// Pairs (q, k), k <= q, with q in [a, a + s) and k in [b, b + t) of one
// document: sum over q of clamp(q + 1 - b, 0, t).
double BlockPairs(int64_t a, int64_t s, int64_t b, int64_t t) {
  const double lo = static_cast<double>(a + 1 - b), hi = static_cast<double>(a + s - b);
  return RampSum(hi, static_cast<double>(t)) - RampSum(lo - 1, static_cast<double>(t));
}

// One rank's profile features, split by whether a shard is whole (prefix 0:
// it needs no remote KV and overlaps the exchange) or prefixed.
struct SplitFeatures {
  RankFeatures whole, prefixed;
};

// Attention features of hop i of ring attention for one rank: its queries
// against one rank's keys.
struct HopFeatures {
  double self_pairs = 0;   // a shard against itself (causal diagonal)
  double cross_pairs = 0;  // against another shard (a full or partial rectangle)
  double segments = 0;     // (query shard, key shard) calls with pairs
  double tokens = 0;       // query tokens with pairs
};

struct Model {
  const Plan& plan;
  ModelShape shape;
  int32_t layers;
  const ClusterSpec& c;
  int32_t n;
  double scale;           // compute seconds per profile second
  double token_bytes;     // one token's K and V
  std::vector<SplitFeatures> split;
  std::vector<int64_t> nonlast;  // per rank
  int32_t nodes = 1;
  std::vector<int32_t> node_size;
};

double Compute(const Model& m, const RankFeatures& f) {
  return m.scale * PredictRankCost(m.c.compute, f);
}

// One rank's compute, forward + backward seconds: what may run during the
// exchange (whole shards) and what needs it (prefixed shards).
struct RankCompute {
  double whole = 0, prefixed = 0;
};

// Finishes a prediction from per-rank compute and exchange times of one
// phase, with the engine's overlap of whole shards.
StepTimePrediction Finish(const Model& m, StepExchange e, const std::vector<RankCompute>& c,
                          const std::vector<double>& x) {
  StepTimePrediction p;
  p.exchange = e;
  p.layers = m.layers;
  const double ff = m.c.forward_fraction;
  double max_x = 0;
  for (int32_t r = 0; r < m.n; ++r) {
    const double whole = c[r].whole;
    const double pre = c[r].prefixed;
    RankStepTime t;
    t.forward_compute = ff * (whole + pre);
    t.backward_compute = (1 - ff) * (whole + pre);
    t.exchange = x[r];
    if (m.c.overlap_whole_shards) {
      t.forward = std::max(ff * whole, x[r]) + ff * pre;
      t.backward = (1 - ff) * pre + std::max((1 - ff) * whole, x[r]);
    } else {
      t.forward = t.forward_compute + x[r];
      t.backward = t.backward_compute + x[r];
    }
    t.exposed_exchange = t.forward + t.backward - t.forward_compute - t.backward_compute;
    p.forward_seconds = std::max(p.forward_seconds, t.forward);
    p.backward_seconds = std::max(p.backward_seconds, t.backward);
    p.compute_seconds = std::max(p.compute_seconds, t.forward_compute + t.backward_compute);
    max_x = std::max(max_x, x[r]);
    p.ranks.push_back(t);
  }
  p.exchange_seconds = 2 * max_x;
  p.step_seconds = m.layers * (p.forward_seconds + p.backward_seconds);
  p.exposed_exchange_seconds = std::max(0.0, p.step_seconds - m.layers * p.compute_seconds);
  return p;
}

// Finishes a prediction of collectives or targeted: each rank's own shards.
StepTimePrediction FromExchange(const Model& m, StepExchange e, const std::vector<double>& x) {
  std::vector<RankCompute> c(m.n);
  for (int32_t r = 0; r < m.n; ++r) {
    c[r] = {Compute(m, m.split[r].whole), Compute(m, m.split[r].prefixed)};
  }
  return Finish(m, e, c, x);
}

// All-gather of equal blocks of `block` bytes (full_kv, allgather): every
// rank receives N - 1 blocks, over NVLink at most at its link's rate; each
// node receives every other node's blocks once over its shared NICs.
double CollectiveSeconds(const Model& m, double block) {
  if (block <= 0 || m.n == 1) return 0;
  const int32_t n = m.n;
  double intra_ranks = 0;  // the largest node's ranks
  for (int32_t s : m.node_size) intra_ranks = std::max<double>(intra_ranks, s);
  double t = (n - 1) * block / m.c.nvlink_bytes_per_second;
  if (m.nodes > 1) {
    for (int32_t s : m.node_size) {
      t = std::max(t, (n - s) * block / (s * m.c.nic_bytes_per_second));
    }
  }
  return t + (intra_ranks - 1) * m.c.nvlink_latency_seconds +
         (m.nodes - 1) * m.c.nic_latency_seconds;
}

// One rank's exchange time of one phase: its `intra` bytes over NVLink and
// its node's larger of sent and received bytes over the node's shared NICs,
// each with `rounds` latencies (messages in sequence); the slower of the two.
double LinkSeconds(const Model& m, int32_t r, double intra, const std::vector<double>& node_send,
                   const std::vector<double>& node_recv, int rounds) {
  const int32_t k = NodeOf(r, m.c.ranks_per_node);
  const double inter = std::max(node_send[k], node_recv[k]);
  double t = 0;
  if (intra > 0) t = intra / m.c.nvlink_bytes_per_second + rounds * m.c.nvlink_latency_seconds;
  if (inter > 0) {
    t = std::max(t, inter / (m.node_size[k] * m.c.nic_bytes_per_second) +
                        rounds * m.c.nic_latency_seconds);
  }
  return t;
}

std::vector<double> TargetedSeconds(const Model& m) {
  const int32_t n = m.n;
  const std::vector<int64_t> pair = TargetedPairTokens(m.plan);
  const int32_t rpn = m.c.ranks_per_node;
  std::vector<double> intra_send(n, 0), intra_recv(n, 0), node_send(m.nodes, 0),
      node_recv(m.nodes, 0);
  for (int32_t a = 0; a < n; ++a) {
    for (int32_t b = 0; b < n; ++b) {
      const double bytes = static_cast<double>(pair[static_cast<size_t>(a) * n + b]) * m.token_bytes;
      if (bytes == 0) continue;
      const int32_t na = NodeOf(a, rpn), nb = NodeOf(b, rpn);
      if (na == nb) {
        intra_send[a] += bytes;
        intra_recv[b] += bytes;
      } else {
        node_send[na] += bytes;
        node_recv[nb] += bytes;
      }
    }
  }
  std::vector<double> x(n, 0);
  for (int32_t r = 0; r < n; ++r) {
    x[r] = LinkSeconds(m, r, std::max(intra_send[r], intra_recv[r]), node_send, node_recv, 1);
  }
  return x;
}

// Hop features of every (query rank, key rank) pair, row-major N x N.
std::vector<HopFeatures> RingHops(const Plan& plan) {
  const int32_t n = plan.cp_size;
  std::vector<std::vector<int32_t>> docs(plan.doc_lens.size());
  for (size_t i = 0; i < plan.shards.size(); ++i) {
    docs[plan.shards[i].doc].push_back(static_cast<int32_t>(i));
  }
  std::vector<HopFeatures> hop(static_cast<size_t>(n) * n);
  std::vector<int32_t> seen(n, -1);  // last query shard counted for a key rank
  for (const std::vector<int32_t>& pieces : docs) {
    for (const int32_t qi : pieces) {
      const Shard& q = plan.shards[qi];
      for (const int32_t ki : pieces) {
        const Shard& k = plan.shards[ki];
        if (k.start > q.start + q.len - 1) continue;  // keys after every query
        const double pairs = BlockPairs(q.start, q.len, k.start, k.len);
        if (pairs <= 0) continue;
        HopFeatures& h = hop[static_cast<size_t>(q.rank) * n + k.rank];
        (qi == ki ? h.self_pairs : h.cross_pairs) += pairs;
        h.segments += 1;
        if (seen[k.rank] != qi) {
          seen[k.rank] = qi;
          h.tokens += static_cast<double>(q.len);
        }
      }
    }
  }
  return hop;
}

StepTimePrediction Ring(const Model& m) {
  const int32_t n = m.n;
  const std::vector<HopFeatures> hop = RingHops(m.plan);
  const double block = static_cast<double>(TokensPerRank(TotalTokens(m.plan.doc_lens), n)) *
                       m.token_bytes;
  const bool cross_node = m.nodes > 1;
  const double transfer =
      n == 1 ? 0
             : block / (cross_node ? m.c.nic_bytes_per_second : m.c.nvlink_bytes_per_second) +
                   (cross_node ? m.c.nic_latency_seconds : m.c.nvlink_latency_seconds);
  const double ff = m.c.forward_fraction;
  const double hq = m.shape.query_heads == 0 ? m.shape.heads : m.shape.query_heads;
  const double merge_bytes_per_token = m.c.merge_passes * hq * m.shape.head_dim * 4.0;
  // c[r][i]: rank r's compute at hop i, forward and backward.
  std::vector<std::vector<double>> cf(n, std::vector<double>(n, 0)),
      cb(n, std::vector<double>(n, 0));
  for (int32_t r = 0; r < n; ++r) {
    for (int32_t i = 0; i < n; ++i) {
      const HopFeatures& h = hop[static_cast<size_t>(r) * n + ((r - i) % n + n) % n];
      const double attn =
          m.scale * (m.c.compute.whole_pair * h.self_pairs +
                     m.c.compute.prefixed_pair * h.cross_pairs +
                     m.c.compute.sequence * h.segments + m.c.compute.token * h.tokens);
      const double merge = (i > 0 && m.c.hbm_bytes_per_second > 0)
                               ? h.tokens * merge_bytes_per_token / m.c.hbm_bytes_per_second
                               : 0;
      cf[r][i] = ff * attn + merge;
      cb[r][i] = (1 - ff) * attn + merge;
    }
  }
  StepTimePrediction p;
  p.exchange = StepExchange::kRing;
  p.layers = m.layers;
  for (int32_t r = 0; r < n; ++r) {
    RankStepTime t;
    t.exchange = transfer;
    for (int32_t i = 0; i < n; ++i) {
      t.forward_compute += cf[r][i];
      t.backward_compute += cb[r][i];
      const bool last = i == n - 1;
      t.forward += last ? cf[r][i] : std::max(cf[r][i], transfer);
      t.backward += last ? cb[r][i] : std::max(cb[r][i], 2 * transfer);
    }
    if (n > 1) t.backward += transfer;
    t.exposed_exchange = t.forward + t.backward - t.forward_compute - t.backward_compute;
    p.compute_seconds = std::max(p.compute_seconds, t.forward_compute + t.backward_compute);
    p.ranks.push_back(t);
  }
  // Lockstep: each hop waits for its slowest rank.
  for (int32_t i = 0; i < n; ++i) {
    double f = 0, b = 0;
    for (int32_t r = 0; r < n; ++r) {
      f = std::max(f, cf[r][i]);
      b = std::max(b, cb[r][i]);
    }
    const bool last = i == n - 1;
    p.forward_seconds += last ? f : std::max(f, transfer);
    p.backward_seconds += last ? b : std::max(b, 2 * transfer);
  }
  if (n > 1) p.backward_seconds += transfer;
  p.exchange_seconds = n > 1 ? (3.0 * (n - 1) + 1) * transfer : 0;
  p.step_seconds = m.layers * (p.forward_seconds + p.backward_seconds);
  p.exposed_exchange_seconds = std::max(0.0, p.step_seconds - m.layers * p.compute_seconds);
  return p;
}

// The all-to-all's exchange of one phase per rank, from the analyzer's rows
// (PlanAllToAllPhase) at D * dtype bytes each: the rank's bytes within its
// node over NVLink (the larger of sent and received), and its node's bytes
// to and from other nodes over the node's shared NICs, each plus two
// latencies (two rounds: Q, K, V in before the attention, O out after); the
// slower of the two. Backward moves what forward received, the same time.
// The rounds' bytes are summed before the larger of sent and received is
// taken: exact where the group's ranks hold equal real tokens (every rank
// holds C/N rows), low by at most the padding rows' share otherwise.
std::vector<double> AllToAllSeconds(const Model& m, const AllToAllPhase& a) {
  const double row = static_cast<double>(AllToAllRowBytes(m.shape));
  const int32_t rpn = m.c.ranks_per_node;
  std::vector<double> node_sent(m.nodes, 0), node_recv(m.nodes, 0);
  for (int32_t r = 0; r < m.n; ++r) {
    node_sent[NodeOf(r, rpn)] += static_cast<double>(a.inter_sent[r]) * row;
    node_recv[NodeOf(r, rpn)] += static_cast<double>(a.inter_received[r]) * row;
  }
  std::vector<double> x(m.n, 0);
  for (int32_t r = 0; r < m.n; ++r) {
    const double intra = row * static_cast<double>(std::max(a.sent[r] - a.inter_sent[r],
                                                            a.received[r] - a.inter_received[r]));
    x[r] = LinkSeconds(m, r, intra, node_sent, node_recv, 2);
  }
  return x;
}

// The all-to-all's compute per rank: a rank of a group of K (`groups`: the
// plan's, PlanRankGroups) runs every one of its group's documents whole (the profile's whole-pair, sequence and
// token terms over the group) for Hq / K of the heads, so 1/K of the group's
// time; nothing of it overlaps the exchange (all "prefixed" in Finish's
// terms: the heads arrive before it, the output leaves after).
std::vector<RankCompute> AllToAllCompute(const Model& m,
                                         const std::vector<std::vector<int32_t>>& groups) {
  std::vector<int32_t> group_of(m.n, 0);
  for (size_t g = 0; g < groups.size(); ++g) {
    for (int32_t r : groups[g]) group_of[r] = static_cast<int32_t>(g);
  }
  std::vector<RankFeatures> f(groups.size());
  std::vector<uint8_t> seen(m.plan.doc_lens.size(), 0);
  for (const Shard& s : m.plan.shards) {
    RankFeatures& g = f[group_of[s.rank]];
    g.tokens += static_cast<double>(s.len);
    if (seen[s.doc]) continue;
    seen[s.doc] = 1;
    g.whole_pairs += ShardWorkload(0, m.plan.doc_lens[s.doc]);
    g.sequences += 1;
  }
  std::vector<RankCompute> c(m.n);
  for (int32_t r = 0; r < m.n; ++r) {
    const size_t g = static_cast<size_t>(group_of[r]);
    c[r].prefixed = Compute(m, f[g]) / static_cast<double>(groups[g].size());
  }
  return c;
}

absl::StatusOr<StepTimePrediction> AllToAll(const Model& m) {
  const std::vector<std::vector<int32_t>> groups = PlanRankGroups(m.plan);
  absl::StatusOr<AllToAllPhase> phase =
      PlanAllToAllPhase(m.plan, groups, m.shape, m.c.ranks_per_node);
  if (!phase.ok()) {
    if (phase.status().code() != absl::StatusCode::kFailedPrecondition) return phase.status();
    StepTimePrediction p;  // not applicable: no times (the analyzer's message says why)
    p.exchange = StepExchange::kAllToAll;
    p.layers = m.layers;
    p.inapplicable = std::string(phase.status().message());
    return p;
  }
  return Finish(m, StepExchange::kAllToAll, AllToAllCompute(m, groups),
                AllToAllSeconds(m, *phase));
}

absl::StatusOr<Model> MakeModel(const Plan& plan, const ModelShape& shape, int32_t layers,
                                const ClusterSpec& cluster) {
  FLASHCP_RETURN_IF_ERROR(ValidateStepShape(shape, layers));
  FLASHCP_RETURN_IF_ERROR(ValidateClusterSpec(cluster));
  if (plan.cp_size > kMaxStepTimeCpSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cp_size: step time is predicted for at most ", kMaxStepTimeCpSize, " ranks, got ",
        plan.cp_size));
  }
  FLASHCP_RETURN_IF_ERROR(ValidatePlan(plan));
  Model m{plan, shape, layers, cluster, plan.cp_size, 0, 0, {}, {}, 1, {}};
  const double hq = shape.query_heads == 0 ? shape.heads : shape.query_heads;
  m.scale = cluster.compute_scale * hq * shape.head_dim /
            (static_cast<double>(cluster.profile_query_heads) * cluster.profile_head_dim);
  m.token_bytes = 2.0 * shape.heads * shape.head_dim * shape.dtype_bytes;
  m.split.resize(m.n);
  m.nonlast.assign(m.n, 0);
  for (const Shard& s : plan.shards) {
    RankFeatures& f = s.start == 0 ? m.split[s.rank].whole : m.split[s.rank].prefixed;
    (s.start == 0 ? f.whole_pairs : f.prefixed_pairs) += ShardWorkload(s.start, s.len);
    f.sequences += 1;
    f.tokens += static_cast<double>(s.len);
    if (s.start + s.len < plan.doc_lens[s.doc]) m.nonlast[s.rank] += s.len;
  }
  const int32_t rpn = cluster.ranks_per_node;
  m.nodes = rpn == 0 ? 1 : (m.n + rpn - 1) / rpn;
  m.node_size.assign(m.nodes, 0);
  for (int32_t r = 0; r < m.n; ++r) ++m.node_size[NodeOf(r, rpn)];
  return m;
}

absl::StatusOr<StepTimePrediction> Predict(const Model& m, StepExchange e) {
  switch (e) {
    case StepExchange::kFullKv: {
      const double block =
          static_cast<double>(TokensPerRank(TotalTokens(m.plan.doc_lens), m.n)) * m.token_bytes;
      return FromExchange(m, e, std::vector<double>(m.n, CollectiveSeconds(m, block)));
    }
    case StepExchange::kAllGather: {
      const double block =
          static_cast<double>(*std::max_element(m.nonlast.begin(), m.nonlast.end())) *
          m.token_bytes;
      return FromExchange(m, e, std::vector<double>(m.n, CollectiveSeconds(m, block)));
    }
    case StepExchange::kTargeted:
      return FromExchange(m, e, TargetedSeconds(m));
    case StepExchange::kRing:
      return Ring(m);
    case StepExchange::kAllToAll:
      return AllToAll(m);
  }
  return StepTimePrediction{};
}

}  // namespace

absl::string_view StepExchangeName(StepExchange e) {
  switch (e) {
    case StepExchange::kFullKv: return "full_kv";
    case StepExchange::kAllGather: return "allgather";
    case StepExchange::kTargeted: return "targeted";
    case StepExchange::kRing: return "ring";
    case StepExchange::kAllToAll: return "all_to_all";
  }
  return "?";
}

std::vector<std::string> ClusterPresetNames() {
  std::vector<std::string> names;
  for (const NamedCluster& p : Presets()) names.emplace_back(p.name);
  return names;
}

absl::StatusOr<ClusterSpec> ClusterPreset(absl::string_view name) {
  for (const NamedCluster& p : Presets()) {
    if (p.name == name) return p.spec;
  }
  return absl::NotFoundError(absl::StrCat("cluster preset \"", name, "\" is unknown; known: ",
                                          absl::StrJoin(ClusterPresetNames(), ", ")));
}

absl::Status ValidateClusterSpec(const ClusterSpec& c) {
  FLASHCP_RETURN_IF_ERROR(ValidateRanksPerNode(c.ranks_per_node));
  FLASHCP_RETURN_IF_ERROR(FiniteIn("nvlink_bytes_per_second", c.nvlink_bytes_per_second, 0, true));
  FLASHCP_RETURN_IF_ERROR(FiniteIn("nic_bytes_per_second", c.nic_bytes_per_second, 0, true));
  FLASHCP_RETURN_IF_ERROR(FiniteIn("nvlink_latency_seconds", c.nvlink_latency_seconds, 0, false));
  FLASHCP_RETURN_IF_ERROR(FiniteIn("nic_latency_seconds", c.nic_latency_seconds, 0, false));
  FLASHCP_RETURN_IF_ERROR(FiniteIn("hbm_bytes_per_second", c.hbm_bytes_per_second, 0, false));
  FLASHCP_RETURN_IF_ERROR(FiniteIn("merge_passes", c.merge_passes, 0, false));
  FLASHCP_RETURN_IF_ERROR(FiniteIn("compute_scale", c.compute_scale, 0, true));
  if (absl::Status s = ValidateCostCoefficients(c.compute); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("compute.", s.message()));
  }
  if (c.profile_query_heads < 1 || c.profile_query_heads > 1 << 20) {
    return absl::InvalidArgumentError(absl::StrCat(
        "profile_query_heads: must be in [1, 1048576], got ", c.profile_query_heads));
  }
  if (c.profile_head_dim < 1 || c.profile_head_dim > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("profile_head_dim: must be in [1, 1024], got ", c.profile_head_dim));
  }
  if (!std::isfinite(c.forward_fraction) || c.forward_fraction <= 0 || c.forward_fraction >= 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("forward_fraction: must be in (0, 1), got ", c.forward_fraction));
  }
  return absl::OkStatus();
}

absl::Status ValidateStepShape(const ModelShape& shape, int32_t layers) {
  FLASHCP_RETURN_IF_ERROR(ValidateModelShape(shape));
  if (shape.query_heads < 0 || shape.query_heads > 1 << 20 ||
      (shape.query_heads > 0 && shape.query_heads % shape.heads != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "query_heads: must be 0 (= heads) or a multiple of heads (", shape.heads,
        ") up to 1048576, got ", shape.query_heads));
  }
  if (layers < 1 || layers > 100000) {
    return absl::InvalidArgumentError(
        absl::StrCat("layers: must be in [1, 100000], got ", layers));
  }
  return absl::OkStatus();
}

absl::StatusOr<StepTimePrediction> PredictStepTime(const Plan& plan, const ModelShape& shape,
                                                   int32_t layers, const ClusterSpec& cluster,
                                                   StepExchange exchange) {
  FLASHCP_ASSIGN_OR_RETURN(const Model m, MakeModel(plan, shape, layers, cluster));
  return Predict(m, exchange);
}

absl::StatusOr<std::array<StepTimePrediction, kNumStepExchanges>> PredictAllExchanges(
    const Plan& plan, const ModelShape& shape, int32_t layers, const ClusterSpec& cluster) {
  FLASHCP_ASSIGN_OR_RETURN(const Model m, MakeModel(plan, shape, layers, cluster));
  std::array<StepTimePrediction, kNumStepExchanges> out;
  for (int e = 0; e < kNumStepExchanges; ++e) {
    FLASHCP_ASSIGN_OR_RETURN(out[e], Predict(m, static_cast<StepExchange>(e)));
  }
  return out;
}

StepExchange NativeExchange(Strategy strategy,
                            const std::array<StepTimePrediction, kNumStepExchanges>& all) {
  switch (strategy) {
    case Strategy::kLlama3:
    case Strategy::kPerDoc:
      return StepExchange::kFullKv;
    case Strategy::kRing:
    case Strategy::kZigzag:
      return StepExchange::kRing;
    case Strategy::kMagi:
      return StepExchange::kTargeted;
    case Strategy::kBasp:
      return StepExchange::kAllToAll;
    case Strategy::kFlashCp: {
      const double ag = all[static_cast<int>(StepExchange::kAllGather)].step_seconds;
      const double tg = all[static_cast<int>(StepExchange::kTargeted)].step_seconds;
      return tg < ag ? StepExchange::kTargeted : StepExchange::kAllGather;
    }
    default:
      return StepExchange::kAllGather;
  }
}

absl::StatusOr<StepTimeReport> ReportStepTime(Strategy strategy, const Plan& plan,
                                              const ModelShape& shape, int32_t layers,
                                              const ClusterSpec& cluster,
                                              absl::string_view cluster_name) {
  StepTimeReport r;
  r.cluster = std::string(cluster_name);
  FLASHCP_ASSIGN_OR_RETURN(r.all, PredictAllExchanges(plan, shape, layers, cluster));
  r.exchange = NativeExchange(strategy, r.all);
  return r;
}

}  // namespace flashcp::core
