// The pipeline mode's cost model, 1F1B op order and checkpoint programme
// (core/internal/pipeline_internal.h; docs/pipeline.md, "Model").
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/analysis.h"
#include "core/internal/pipeline_internal.h"
#include "core/status_macros.h"
#include "core/types.h"

namespace flashcp::core {

std::vector<std::string> PipelineProfileNames() {
  return {std::string(kDefaultPipelineProfile), std::string(kCpuTinyDecoderProfile)};
}

absl::StatusOr<PipelineProfile> NamedPipelineProfile(absl::string_view name) {
  if (name == kDefaultPipelineProfile) return PipelineProfile{};
  if (name == kCpuTinyDecoderProfile) {
    // Fitted by bench/pipeline_cpu_fit.py (docs/benchmarks.md, "Pipeline plans
    // executed on CPU"; bench/results/pipeline/pipeline_cpu_fit.json): the
    // tiny decoder L = 4, D = 64, F = 256, V = 128 in fp32, one torch thread
    // per stage process on the 2-vCPU VM. Times: op CPU seconds; memory: heap
    // bytes above weights and gradients (so 8 bytes of state per parameter:
    // fp32 weights and gradients, no optimizer); ckpt and K/V counted (4 D,
    // 2 x 4 D_kv). Sends: loopback gloo, not fitted (the default values).
    PipelineProfile p;
    p.fwd_pair_s = 3.387e-8;
    p.fwd_token_s = 7.732e-6;
    p.fwd_chunk_s = 8.453e-4;
    p.bwd_pair_s = 3.197e-8;
    p.bwd_token_s = 1.168e-5;
    p.bwd_chunk_s = 7.843e-4;
    p.act_token_bytes = 8248;
    p.logits_token_bytes = 1879;
    p.ckpt_token_bytes = 256;
    p.kv_token_bytes = 512;
    p.state_bytes_per_param = 8;
    return p;
  }
  return absl::NotFoundError(absl::StrCat("pipeline profile \"", name, "\" is unknown; known: ",
                                          absl::StrJoin(PipelineProfileNames(), ", ")));
}

absl::Status SetPipelineCoefficient(PipelineProfile& profile, absl::string_view name, double value) {
  static constexpr std::pair<absl::string_view, double PipelineProfile::*> kFields[] = {
      {"fwd_pair_s", &PipelineProfile::fwd_pair_s},
      {"fwd_token_s", &PipelineProfile::fwd_token_s},
      {"fwd_chunk_s", &PipelineProfile::fwd_chunk_s},
      {"bwd_pair_s", &PipelineProfile::bwd_pair_s},
      {"bwd_token_s", &PipelineProfile::bwd_token_s},
      {"bwd_chunk_s", &PipelineProfile::bwd_chunk_s},
      {"a2a_bytes_per_s", &PipelineProfile::a2a_bytes_per_s},
      {"a2a_latency_s", &PipelineProfile::a2a_latency_s},
      {"p2p_bytes_per_s", &PipelineProfile::p2p_bytes_per_s},
      {"p2p_latency_s", &PipelineProfile::p2p_latency_s},
      {"act_token_bytes", &PipelineProfile::act_token_bytes},
      {"ckpt_token_bytes", &PipelineProfile::ckpt_token_bytes},
      {"kv_token_bytes", &PipelineProfile::kv_token_bytes},
      {"logits_token_bytes", &PipelineProfile::logits_token_bytes},
      {"state_bytes_per_param", &PipelineProfile::state_bytes_per_param},
  };
  for (const auto& [n, field] : kFields) {
    if (n == name) {
      profile.*field = value;
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("profile.", name, ": unknown coefficient"));
}

absl::string_view PipelineStrategyName(PipelineStrategy s) {
  switch (s) {
    case PipelineStrategy::kDpp: return "dpp";
    case PipelineStrategy::kBatchLevel: return "batch_level";
    case PipelineStrategy::kTokenLevel: return "token_level";
    case PipelineStrategy::kDppNoWbc: return "dpp_no_wbc";
    case PipelineStrategy::kDppNoCkpt: return "dpp_no_ckpt";
    case PipelineStrategy::kDppFullCkpt: return "dpp_full_ckpt";
  }
  return "unknown";
}

absl::StatusOr<PipelineStrategy> ParsePipelineStrategy(absl::string_view name) {
  std::vector<std::string> names;
  for (PipelineStrategy s : kAllPipelineStrategies) {
    if (PipelineStrategyName(s) == name) return s;
    names.emplace_back(PipelineStrategyName(s));
  }
  return absl::InvalidArgumentError(absl::StrCat("pipeline strategy \"", name,
                                                 "\" is unknown; known: ", absl::StrJoin(names, ", ")));
}

absl::string_view ChunkKindName(ChunkKind k) {
  switch (k) {
    case ChunkKind::kPacked: return "packed";
    case ChunkKind::kSplit: return "split";
    case ChunkKind::kHybrid: return "hybrid";
    case ChunkKind::kMixed: return "mixed";
  }
  return "unknown";
}

namespace {

absl::Status CheckInt(absl::string_view field, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": must be in [", lo, ", ", hi, "], got ", v));
  }
  return absl::OkStatus();
}

// Finite, in [lo, 1e15]; `positive` also rules out 0.
absl::Status CheckReal(absl::string_view field, double v, bool positive) {
  if (!std::isfinite(v) || v < 0 || v > 1e15 || (positive && v <= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": must be a finite number ", positive ? "> 0" : ">= 0", " and <= 1e15, got ", v));
  }
  return absl::OkStatus();
}

// Parameters of one transformer layer: Q and O (D x D), K and V (D x D_kv),
// gated MLP (3 x D x F).
double LayerParams(const PipelineModel& m) {
  const double d = m.hidden;
  return 2 * d * d + 2 * d * m.kv_hidden + 3 * d * m.ffn_hidden;
}

}  // namespace

absl::StatusOr<PipelineRequest> CompletePipelineRequest(const PipelineRequest& request) {
  PipelineRequest r = request;
  if (r.doc_lens.empty()) return absl::InvalidArgumentError("doc_lens: no documents");
  FLASHCP_RETURN_IF_ERROR(
      CheckInt("doc_lens (count)", static_cast<int64_t>(r.doc_lens.size()), 1, kMaxDocs));
  int64_t total = 0;
  for (size_t d = 0; d < r.doc_lens.size(); ++d) {
    FLASHCP_RETURN_IF_ERROR(
        CheckInt(absl::StrCat("doc_lens[", d, "]"), r.doc_lens[d], 1, kMaxTokens));
    total += r.doc_lens[d];
    if (total > kMaxTokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("doc_lens: more than ", kMaxTokens, " tokens in all"));
    }
  }
  FLASHCP_RETURN_IF_ERROR(CheckInt("pp_size", r.pp_size, 1, 1024));
  FLASHCP_RETURN_IF_ERROR(CheckInt("sp_size", r.sp_size, 1, 4096));
  FLASHCP_RETURN_IF_ERROR(CheckReal("memory_budget_bytes", r.memory_budget_bytes, true));
  PipelineModel& m = r.model;
  FLASHCP_RETURN_IF_ERROR(CheckInt("model.layers", m.layers, 1, 100000));
  if (m.layers % r.pp_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("model.layers: ", m.layers,
                                                   " is not a multiple of pp_size ", r.pp_size));
  }
  FLASHCP_RETURN_IF_ERROR(CheckInt("model.hidden", m.hidden, 1, 1 << 20));
  FLASHCP_RETURN_IF_ERROR(CheckInt("model.kv_hidden", m.kv_hidden, 1, 1 << 20));
  FLASHCP_RETURN_IF_ERROR(CheckInt("model.ffn_hidden", m.ffn_hidden, 1, 1 << 22));
  FLASHCP_RETURN_IF_ERROR(CheckInt("model.vocab", m.vocab, 1, 1 << 24));
  FLASHCP_RETURN_IF_ERROR(CheckInt("model.bytes_per_element", m.bytes_per_element, 1, 8));

  PipelineProfile& p = r.profile;
  const struct {
    const char* name;
    double* v;
    bool positive;
  } fields[] = {
      {"profile.fwd_pair_s", &p.fwd_pair_s, false},
      {"profile.fwd_token_s", &p.fwd_token_s, false},
      {"profile.fwd_chunk_s", &p.fwd_chunk_s, false},
      {"profile.bwd_pair_s", &p.bwd_pair_s, false},
      {"profile.bwd_token_s", &p.bwd_token_s, false},
      {"profile.bwd_chunk_s", &p.bwd_chunk_s, false},
      {"profile.a2a_bytes_per_s", &p.a2a_bytes_per_s, true},
      {"profile.a2a_latency_s", &p.a2a_latency_s, false},
      {"profile.p2p_bytes_per_s", &p.p2p_bytes_per_s, true},
      {"profile.p2p_latency_s", &p.p2p_latency_s, false},
      {"profile.act_token_bytes", &p.act_token_bytes, false},
      {"profile.ckpt_token_bytes", &p.ckpt_token_bytes, false},
      {"profile.kv_token_bytes", &p.kv_token_bytes, false},
      {"profile.logits_token_bytes", &p.logits_token_bytes, false},
      {"profile.state_bytes_per_param", &p.state_bytes_per_param, false},
  };
  for (const auto& f : fields) FLASHCP_RETURN_IF_ERROR(CheckReal(f.name, *f.v, f.positive));
  const double e = m.bytes_per_element;
  // Derived defaults (PipelineProfile): attention 4 D flops per pair at 200
  // TFLOP/s, linear layers 2 flops per parameter and token at 300 TFLOP/s.
  if (p.fwd_pair_s == 0) p.fwd_pair_s = 4.0 * m.hidden / 200e12;
  if (p.fwd_token_s == 0) p.fwd_token_s = 2.0 * LayerParams(m) / 300e12;
  if (p.bwd_pair_s == 0) p.bwd_pair_s = 2 * p.fwd_pair_s;
  if (p.bwd_token_s == 0) p.bwd_token_s = 2 * p.fwd_token_s;
  if (p.bwd_chunk_s == 0) p.bwd_chunk_s = 2 * p.fwd_chunk_s;
  if (p.act_token_bytes == 0) p.act_token_bytes = 34.0 * m.hidden;
  if (p.ckpt_token_bytes == 0) p.ckpt_token_bytes = e * m.hidden;
  if (p.kv_token_bytes == 0) p.kv_token_bytes = 2 * e * m.kv_hidden;
  if (p.logits_token_bytes == 0) p.logits_token_bytes = 4.0 * m.vocab;
  if (p.fwd_pair_s + p.fwd_token_s <= 0) {
    return absl::InvalidArgumentError(
        "profile.fwd_pair_s: with fwd_token_s, must not both be 0 after derivation");
  }
  // A checkpointed layer must keep less than a full one, or checkpointing
  // cannot save memory (the programme's coefficients are then positive).
  if (p.act_token_bytes <= p.ckpt_token_bytes + p.kv_token_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "profile.act_token_bytes: ", p.act_token_bytes,
        " must exceed ckpt_token_bytes + kv_token_bytes = ", p.ckpt_token_bytes + p.kv_token_bytes));
  }
  return r;
}

namespace internal {

double SliceWork(const PipelineRequest& r, int64_t start, int64_t len) {
  const PipelineProfile& p = r.profile;
  const double pairs = ShardWorkload(start, len);
  return StageLayers(r) *
         ((p.fwd_pair_s + p.bwd_pair_s) * pairs + (p.fwd_token_s + p.bwd_token_s) * len) /
         r.sp_size;
}

ChunkCost ChunkCosts(const PipelineRequest& r, const PipelineChunk& c) {
  const PipelineProfile& p = r.profile;
  const PipelineModel& m = r.model;
  ChunkCost cost;
  double pairs = 0;
  for (const PipelineSlice& s : c.slices) {
    pairs += ShardWorkload(s.start, s.len);
    cost.tokens += static_cast<double>(s.len);
    if (s.start + s.len < r.doc_lens[s.doc]) cost.nonfinal_tokens += static_cast<double>(s.len);
  }
  const double ds = r.sp_size;
  // Ulysses (Eq. 3): per layer and pass, all-to-alls of e (D + D_kv) bytes per
  // token over d_s, two latency terms, twice (before and after attention).
  const double a2a =
      r.sp_size > 1
          ? 2 * (m.bytes_per_element * (m.hidden + m.kv_hidden) * cost.tokens /
                     (ds * p.a2a_bytes_per_s) +
                 2 * p.a2a_latency_s)
          : 0.0;
  cost.layer_fwd_s = (p.fwd_pair_s * pairs + p.fwd_token_s * cost.tokens) / ds + p.fwd_chunk_s + a2a;
  const double layer_bwd = (p.bwd_pair_s * pairs + p.bwd_token_s * cost.tokens) / ds +
                           p.bwd_chunk_s + a2a;
  cost.fwd_s = StageLayers(r) * cost.layer_fwd_s;
  cost.bwd_s = StageLayers(r) * layer_bwd;
  cost.p2p_s = p.p2p_latency_s +
               m.bytes_per_element * static_cast<double>(m.hidden) * cost.tokens /
                   (ds * p.p2p_bytes_per_s);
  return cost;
}

double ModelStateBytes(const PipelineRequest& r, int32_t stage) {
  const PipelineModel& m = r.model;
  double params = StageLayers(r) * LayerParams(m);
  const double embed = static_cast<double>(m.vocab) * m.hidden;
  if (stage == 0) params += embed;
  if (stage == r.pp_size - 1) params += embed;
  return r.profile.state_bytes_per_param * params / r.sp_size;
}

double ActivationBytes(const PipelineRequest& r, const PipelineChunk& c, int32_t stage,
                       int32_t ckpt) {
  const PipelineProfile& p = r.profile;
  double tokens = 0, nonfinal = 0;
  for (const PipelineSlice& s : c.slices) {
    tokens += static_cast<double>(s.len);
    if (s.start + s.len < r.doc_lens[s.doc]) nonfinal += static_cast<double>(s.len);
  }
  const double full = (StageLayers(r) - ckpt) * p.act_token_bytes * tokens;
  const double kept = ckpt * (p.ckpt_token_bytes * tokens + p.kv_token_bytes * nonfinal);
  const double logits = stage == r.pp_size - 1 ? p.logits_token_bytes * tokens : 0.0;
  return (full + kept + logits) / r.sp_size;
}

double CkptSavingBytes(const PipelineRequest& r, const PipelineChunk& c) {
  return ActivationBytes(r, c, 0, 0) - ActivationBytes(r, c, 0, 1);
}

double BackwardTransientBytes(const PipelineRequest& r, const PipelineChunk& c) {
  double tokens = 0;
  for (const PipelineSlice& s : c.slices) tokens += static_cast<double>(s.len);
  return r.profile.act_token_bytes * tokens / r.sp_size;
}

double DkvBytes(const PipelineRequest& r, int64_t tokens) {
  return StageLayers(r) * r.profile.kv_token_bytes * static_cast<double>(tokens) / r.sp_size;
}

std::vector<int32_t> BackwardOrder(const std::vector<PipelineChunk>& chunks,
                                   const std::vector<int32_t>& forward) {
  std::vector<int32_t> order;
  order.reserve(forward.size());
  size_t i = 0;
  while (i < forward.size()) {
    size_t j = i + 1;
    // Extend the run while the next chunk shares a document with the current.
    while (j < forward.size()) {
      bool linked = false;
      for (const PipelineSlice& a : chunks[forward[j - 1]].slices) {
        for (const PipelineSlice& b : chunks[forward[j]].slices) linked |= a.doc == b.doc;
      }
      if (!linked) break;
      ++j;
    }
    for (size_t k = j; k > i; --k) order.push_back(forward[k - 1]);
    i = j;
  }
  return order;
}

std::vector<std::vector<StageOp>> StageOrders(int32_t pp_size, const PipelineGroup& group) {
  const size_t n = group.forward.size();
  std::vector<std::vector<StageOp>> orders(pp_size);
  // The longest reversed run (a split document's slices): its backward can
  // start only after all its forwards, so every stage may hold that many
  // more chunks in flight (the window d_p - p + N_split of Eq. 7) and keeps
  // running forwards meanwhile instead of draining the pipeline.
  int32_t max_id = 0;
  for (int32_t k : group.forward) max_id = std::max(max_id, k);
  std::vector<size_t> fpos(max_id + 1, 0);
  for (size_t i = 0; i < n; ++i) fpos[group.forward[i]] = i;
  size_t longest_run = 1;
  for (size_t i = 0; i < n;) {
    const size_t run = fpos[group.backward[i]] >= i ? fpos[group.backward[i]] - i + 1 : 1;
    longest_run = std::max(longest_run, run);
    i += run;
  }
  for (int32_t p = 0; p < pp_size; ++p) {
    std::vector<StageOp>& ops = orders[p];
    ops.reserve(2 * n);
    std::vector<char> done_f(max_id + 1, 0);  // by chunk id: forward done on this stage
    size_t f = 0, b = 0;
    const size_t limit = static_cast<size_t>(pp_size - p) + longest_run - 1;
    while (f < n || b < n) {
      const bool can_b = b < n && done_f[group.backward[b]];
      if (f < n && (!can_b || f - b < limit)) {
        ops.push_back(StageOp{group.forward[f], false});
        done_f[group.forward[f]] = 1;
        ++f;
      } else {
        ops.push_back(StageOp{group.backward[b], true});
        ++b;
      }
    }
  }
  return orders;
}

CkptModel BuildCkptModel(const PipelineRequest& r, const PipelinePlan& plan) {
  const int32_t pp = r.pp_size;
  const size_t nc = plan.chunks.size();
  CkptModel m;
  m.problem.max_value = StageLayers(r);
  m.pos_b.assign(nc, 0);
  m.group.assign(nc, 0);
  int32_t vars = 0;
  for (size_t g = 0; g < plan.pipelines.size(); ++g) {
    const PipelineGroup& grp = plan.pipelines[g];
    m.var_base.push_back(vars);
    for (size_t i = 0; i < grp.backward.size(); ++i) {
      m.pos_b[grp.backward[i]] = static_cast<int32_t>(i);
      m.group[grp.backward[i]] = static_cast<int32_t>(g);
    }
    vars += static_cast<int32_t>(grp.forward.size()) + pp - 1;
  }
  m.problem.vars = vars;
  m.problem.cost.assign(vars, 0.0);
  std::vector<ChunkCost> costs(nc);
  // Per chunk: bytes with nothing checkpointed on a stage before the last
  // and on the last (its logits), one checkpointed layer's saving, and a
  // backward's working layer; computed once, read at every op below.
  std::vector<double> saving(nc), transient(nc), act_inner(nc), act_last(nc);
  for (size_t k = 0; k < nc; ++k) {
    costs[k] = ChunkCosts(r, plan.chunks[k]);
    saving[k] = CkptSavingBytes(r, plan.chunks[k]);
    transient[k] = BackwardTransientBytes(r, plan.chunks[k]);
    act_inner[k] = ActivationBytes(r, plan.chunks[k], 0, 0);
    act_last[k] = ActivationBytes(r, plan.chunks[k], pp - 1, 0);
  }
  // Objective: a diagonal's recompute delays the pipeline once (Eq. 15-16),
  // by its slowest member's recompute: cost = max layer forward time on it.
  for (int32_t p = 0; p < pp; ++p) {
    for (size_t k = 0; k < nc; ++k) {
      const int32_t j = m.VarOf(pp, p, static_cast<int32_t>(k));
      m.problem.cost[j] = std::max(m.problem.cost[j], costs[k].layer_fwd_s);
    }
  }
  // A row at every op: what is live after a forward or during a backward,
  // walked along the stage's own op order (no timing needed: a stage's
  // memory changes only at its own ops).
  constexpr double kMarginBytes = 1024;  // covers rounding between this sum and the replay's
  const int32_t max_c = m.problem.max_value;
  for (size_t g = 0; g < plan.pipelines.size(); ++g) {
    const auto orders = StageOrders(pp, plan.pipelines[g]);
    for (int32_t p = 0; p < pp; ++p) {
      const double avail = r.memory_budget_bytes - ModelStateBytes(r, p) - kMarginBytes;
      std::vector<int32_t> live;
      double dkv_live = 0;
      for (const StageOp& op : orders[p]) {
        const PipelineChunk& c = plan.chunks[op.chunk];
        double extra = 0;
        if (!op.backward) {
          live.push_back(op.chunk);
        } else {
          // dK/dV of a document's earlier slices appear at its last slice's backward.
          for (const PipelineSlice& s : c.slices) {
            if (s.start > 0 && s.start + s.len == r.doc_lens[s.doc]) dkv_live += DkvBytes(r, s.start);
          }
          extra = transient[op.chunk];
        }
        const std::vector<double>& act = p == pp - 1 ? act_last : act_inner;
        double need = dkv_live + extra - avail;
        double most = 0;
        for (int32_t k : live) {
          need += act[k];
          most += saving[k] * max_c;
        }
        m.worst_over_bytes = std::max(m.worst_over_bytes, need - most);
        if (need > 0) {
          CkptRow row;
          row.terms.reserve(live.size());
          for (int32_t k : live) row.terms.emplace_back(m.VarOf(pp, p, k), saving[k]);
          row.rhs = need;
          m.problem.rows.push_back(std::move(row));
        }
        if (op.backward) {
          live.erase(std::find(live.begin(), live.end(), op.chunk));
          for (const PipelineSlice& s : c.slices) {
            if (s.start + s.len < r.doc_lens[s.doc]) dkv_live -= DkvBytes(r, s.len);
          }
        }
      }
    }
  }
  return m;
}

std::vector<std::vector<int32_t>> CkptFromValues(const PipelineRequest& r, const PipelinePlan& plan,
                                                 const CkptModel& m,
                                                 const std::vector<int32_t>& values) {
  std::vector<std::vector<int32_t>> ckpt(r.pp_size, std::vector<int32_t>(plan.chunks.size(), 0));
  for (int32_t p = 0; p < r.pp_size; ++p) {
    for (size_t k = 0; k < plan.chunks.size(); ++k) {
      ckpt[p][k] = values[m.VarOf(r.pp_size, p, static_cast<int32_t>(k))];
    }
  }
  return ckpt;
}

}  // namespace internal

absl::StatusOr<CkptSolution> SolveCkptGreedy(const CkptProblem& problem) {
  const int32_t n = problem.vars;
  std::vector<int32_t> c(n, problem.max_value);
  std::vector<double> lhs(problem.rows.size(), 0.0);
  std::vector<std::vector<std::pair<size_t, double>>> rows_of(n);
  double worst = 0;
  for (size_t i = 0; i < problem.rows.size(); ++i) {
    for (const auto& [j, a] : problem.rows[i].terms) {
      lhs[i] += a * problem.max_value;
      rows_of[j].emplace_back(i, a);
    }
    worst = std::max(worst, problem.rows[i].rhs - lhs[i]);
  }
  if (worst > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no checkpointing fits: with every layer checkpointed a stage still needs ", worst,
        " bytes more than the memory budget"));
  }
  std::vector<int32_t> order(n);
  for (int32_t j = 0; j < n; ++j) order[j] = j;
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return problem.cost[a] > problem.cost[b]; });
  for (int32_t j : order) {
    int32_t drop = c[j];
    for (const auto& [i, a] : rows_of[j]) {
      if (a <= 0) continue;
      const double slack = lhs[i] - problem.rows[i].rhs;
      drop = std::min<int32_t>(drop, static_cast<int32_t>(std::floor(slack / a + 1e-12)));
    }
    drop = std::max(drop, 0);
    if (drop == 0) continue;
    c[j] -= drop;
    for (const auto& [i, a] : rows_of[j]) lhs[i] -= a * drop;
  }
  CkptSolution s;
  s.values = std::move(c);
  for (int32_t j = 0; j < n; ++j) s.objective += problem.cost[j] * s.values[j];
  s.gap = 0;
  s.optimal = false;
  return s;
}

}  // namespace flashcp::core
