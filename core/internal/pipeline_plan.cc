// The pipeline planner and its baselines (core/pipeline.h; docs/pipeline.md,
// "Planner"): chunking (Algorithm 1 or a token cap: pipeline_chunking.cc),
// grouping into pipelines by a dynamic programme over cut points,
// checkpointing (greedy, none, full, uniform, or the injected ILP), scored by
// the event replay.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/internal/pipeline_chunking.h"
#include "core/internal/pipeline_internal.h"
#include "core/status_macros.h"

namespace flashcp::core {
namespace {

using internal::ChunkBalanced;
using internal::Chunking;
using internal::ChunkTokenCap;
using internal::StageLayers;

// First-fit decreasing bins of `cap` tokens (every document fits: cap >= lmax).
std::vector<std::vector<int32_t>> PackBins(const PipelineRequest& r, int64_t cap) {
  std::vector<int32_t> docs(r.doc_lens.size());
  std::iota(docs.begin(), docs.end(), 0);
  std::stable_sort(docs.begin(), docs.end(),
                   [&](int32_t a, int32_t b) { return r.doc_lens[a] > r.doc_lens[b]; });
  std::vector<std::vector<int32_t>> bins;
  std::vector<int64_t> fill;
  for (int32_t d : docs) {
    size_t b = 0;
    while (b < bins.size() && fill[b] + r.doc_lens[d] > cap) ++b;
    if (b == bins.size()) {
      bins.emplace_back();
      fill.push_back(0);
    }
    bins[b].push_back(d);
    fill[b] += r.doc_lens[d];
  }
  return bins;
}

enum class CkptMode { kGreedy, kNone, kFull, kUniform };

// One evaluated pipeline (or whole plan): its replay, or by how many bytes
// its tightest stage misses the budget.
struct Scored {
  bool fits = false;
  double time = std::numeric_limits<double>::infinity();
  double over_bytes = std::numeric_limits<double>::infinity();
  PipelinePlan plan;  // chunks, pipelines and ckpt as evaluated (own numbering)
  int32_t uniform = -1;
};

// Checkpoints and replays `plan` (pipelines and chunks set).
absl::StatusOr<Scored> Checkpoint(const PipelineRequest& r, PipelinePlan plan, CkptMode mode) {
  Scored s;
  const int32_t lp = StageLayers(r);
  const size_t nc = plan.chunks.size();
  auto uniform = [&](int32_t c) {
    plan.ckpt.assign(r.pp_size, std::vector<int32_t>(nc, c));
  };
  if (mode == CkptMode::kGreedy) {
    const internal::CkptModel m = internal::BuildCkptModel(r, plan);
    if (m.worst_over_bytes > 0) {
      s.over_bytes = m.worst_over_bytes;
      return s;
    }
    FLASHCP_ASSIGN_OR_RETURN(const CkptSolution sol, SolveCkptGreedy(m.problem));
    plan.ckpt = internal::CkptFromValues(r, plan, m, sol.values);
  } else if (mode == CkptMode::kNone) {
    uniform(0);
  } else if (mode == CkptMode::kFull) {
    uniform(lp);
  } else {
    // Smallest uniform count that fits: peak memory falls as it grows.
    int32_t lo = 0, hi = lp;
    uniform(lp);
    FLASHCP_ASSIGN_OR_RETURN(PipelineSim full, internal::ReplayPipeline(r, plan));
    if (PipelineOverBudget(r, full) > 0) {
      s.over_bytes = PipelineOverBudget(r, full);
      return s;
    }
    while (lo < hi) {
      const int32_t mid = (lo + hi) / 2;
      uniform(mid);
      FLASHCP_ASSIGN_OR_RETURN(PipelineSim sim, internal::ReplayPipeline(r, plan));
      if (PipelineOverBudget(r, sim) > 0) lo = mid + 1; else hi = mid;
    }
    uniform(lo);
    s.uniform = lo;
  }
  FLASHCP_ASSIGN_OR_RETURN(plan.prediction, internal::ReplayPipeline(r, plan));
  s.over_bytes = PipelineOverBudget(r, plan.prediction);
  s.fits = s.over_bytes <= 0;
  s.time = s.fits ? plan.prediction.iteration_s : std::numeric_limits<double>::infinity();
  s.plan = std::move(plan);
  return s;
}

// A plan of the given units as one pipeline, chunks renumbered.
PipelinePlan SubPlan(const Chunking& ch, size_t from, size_t to) {
  PipelinePlan p;
  PipelineGroup g;
  for (size_t u = from; u < to; ++u) {
    for (int32_t k : ch.units[u]) {
      g.forward.push_back(static_cast<int32_t>(p.chunks.size()));
      p.chunks.push_back(ch.chunks[k]);
    }
  }
  g.backward = internal::BackwardOrder(p.chunks, g.forward);
  p.pipelines.push_back(std::move(g));
  return p;
}

// Groups the units into back-to-back pipelines (Eq. 14): dp over at most
// kMaxCuts + 1 evenly spaced cut points (every pipeline boundary falls on
// one: the paper's solver rarely schedules more than 2 pipelines); a pipeline's cost is its replayed time under
// `mode` (pipelines do not overlap, so times add). Returns the whole plan.
absl::StatusOr<Scored> Group(const PipelineRequest& r, const Chunking& ch, CkptMode mode,
                             int32_t max_pipelines) {
  constexpr size_t kMaxCuts = 6;
  const size_t nu = ch.units.size();
  std::vector<size_t> cuts;
  const size_t q = std::min<size_t>({nu, kMaxCuts, static_cast<size_t>(max_pipelines) * 2});
  for (size_t i = 0; i <= q; ++i) cuts.push_back(i * nu / q);
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  const size_t m = cuts.size();
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // dp[i][g]: best time of units [0, cuts[i]) in g pipelines.
  const size_t gmax = static_cast<size_t>(max_pipelines);
  std::vector<std::vector<double>> dp(m, std::vector<double>(gmax + 1, kInf));
  std::vector<std::vector<size_t>> from(m, std::vector<size_t>(gmax + 1, 0));
  std::vector<std::vector<std::optional<Scored>>> memo(m, std::vector<std::optional<Scored>>(m));
  double least_over = kInf;
  dp[0][0] = 0;
  for (size_t i = 1; i < m; ++i) {
    for (size_t j = 0; j < i; ++j) {
      bool any = false;
      for (size_t g = 0; g < gmax; ++g) any |= dp[j][g] < kInf;
      if (!any) continue;
      FLASHCP_ASSIGN_OR_RETURN(Scored s, Checkpoint(r, SubPlan(ch, cuts[j], cuts[i]), mode));
      least_over = std::min(least_over, s.over_bytes);
      if (!s.fits) continue;
      for (size_t g = 0; g < gmax; ++g) {
        if (dp[j][g] + s.time < dp[i][g + 1]) {
          dp[i][g + 1] = dp[j][g] + s.time;
          from[i][g + 1] = j;
        }
      }
      memo[j][i] = std::move(s);
    }
  }
  size_t best_g = 0;
  for (size_t g = 1; g <= gmax; ++g) {
    if (dp[m - 1][g] < dp[m - 1][best_g]) best_g = g;
  }
  Scored out;
  if (dp[m - 1][best_g] == kInf) {
    out.over_bytes = least_over;
    return out;
  }
  // Stitch the chosen pipelines into one plan, in order.
  std::vector<std::pair<size_t, size_t>> spans;
  for (size_t i = m - 1, g = best_g; i > 0; --g) {
    spans.emplace_back(from[i][g], i);
    i = from[i][g];
  }
  std::reverse(spans.begin(), spans.end());
  PipelinePlan& plan = out.plan;
  plan.ckpt.assign(r.pp_size, {});
  for (const auto& [j, i] : spans) {
    const PipelinePlan& sub = memo[j][i]->plan;
    const int32_t base = static_cast<int32_t>(plan.chunks.size());
    PipelineGroup g = sub.pipelines[0];
    for (int32_t& k : g.forward) k += base;
    for (int32_t& k : g.backward) k += base;
    plan.pipelines.push_back(std::move(g));
    plan.chunks.insert(plan.chunks.end(), sub.chunks.begin(), sub.chunks.end());
    for (int32_t p = 0; p < r.pp_size; ++p) {
      plan.ckpt[p].insert(plan.ckpt[p].end(), sub.ckpt[p].begin(), sub.ckpt[p].end());
    }
  }
  FLASHCP_ASSIGN_OR_RETURN(plan.prediction, internal::ReplayPipeline(r, plan));
  out.over_bytes = PipelineOverBudget(r, plan.prediction);
  out.fits = out.over_bytes <= 0;
  out.time = plan.prediction.iteration_s;
  return out;
}

absl::Status NoFit(const PipelineRequest& r, PipelineStrategy s, double over) {
  return absl::FailedPreconditionError(absl::StrFormat(
      "pipeline strategy %s: no plan fits memory_budget_bytes = %.0f: the closest one needs "
      "%.0f bytes (%.3f GiB) more on its tightest stage",
      PipelineStrategyName(s), r.memory_budget_bytes, over, over / (1 << 30)));
}

// The K candidates: every K to 8, then steps of about a quarter (10, 12,
// 15, 18, 22, ...) to 256, while lmax / K >= min_slice.
std::vector<int32_t> SliceCounts(int64_t lmax, int64_t min_slice) {
  std::vector<int32_t> ks{1};
  for (int32_t k = 2; k <= 256 && lmax / k >= std::max<int64_t>(min_slice, 1);
       k = std::max(k + 1, k + k / 4)) {
    ks.push_back(k);
  }
  return ks;
}

bool SameChunks(const Chunking& a, const Chunking& b) {
  if (a.units != b.units || a.chunks.size() != b.chunks.size()) return false;
  for (size_t i = 0; i < a.chunks.size(); ++i) {
    if (a.chunks[i].kind != b.chunks[i].kind || a.chunks[i].slices != b.chunks[i].slices) return false;
  }
  return true;
}

// A lower bound on the replayed time of any grouping of `ch` (pipelines
// back to back, any checkpointing): every stage runs every chunk's forward
// and backward; the last stage starts no earlier than the first chunk's
// forward has crossed the other stages; and every stage's last op is the
// backward of the last unit's first chunk (the last pipeline's backward
// order ends with it), which then crosses the other stages again.
double LowerBound(const PipelineRequest& r, const Chunking& ch) {
  double busy = 0;
  for (const PipelineChunk& c : ch.chunks) {
    const internal::ChunkCost cost = internal::ChunkCosts(r, c);
    busy += cost.fwd_s + cost.bwd_s;
  }
  if (ch.units.empty()) return busy;
  const internal::ChunkCost first = internal::ChunkCosts(r, ch.chunks[ch.units.front().front()]);
  const internal::ChunkCost last = internal::ChunkCosts(r, ch.chunks[ch.units.back().front()]);
  return busy + (r.pp_size - 1) * (first.fwd_s + first.p2p_s + last.bwd_s + last.p2p_s);
}

absl::StatusOr<PipelinePlan> PlanSearch(const PipelineRequest& r, const PipelineOptions& o) {
  const PipelineStrategy st = o.strategy;
  const CkptMode mode = st == PipelineStrategy::kDppNoCkpt     ? CkptMode::kNone
                        : st == PipelineStrategy::kDppFullCkpt ? CkptMode::kFull
                                                               : CkptMode::kGreedy;
  const int64_t lmax = *std::max_element(r.doc_lens.begin(), r.doc_lens.end());
  Scored best;
  int32_t best_k = 0;
  double least_over = std::numeric_limits<double>::infinity();
  const std::vector<int32_t> ks =
      o.slice_count > 0 ? std::vector<int32_t>{o.slice_count} : SliceCounts(lmax, o.min_slice_tokens);
  // Chunkings per K: Algorithm 1 with no token capacity and with lmax / K,
  // and (kDpp) with no capacity and every cut document on its own mesh;
  // and the token-capped chunking (ChunkTokenCap), the only one of kDppNoWbc
  // and also a candidate of kDpp, whose search keeps whichever chunking
  // replays fastest (docs/pipeline.md, "Planner").
  struct Candidate {
    int32_t k;
    Chunking chunking;
    double bound;  // LowerBound of its plan's replayed time
  };
  std::vector<Candidate> candidates;
  auto add = [&](int32_t k, std::optional<Chunking> ch) {
    if (!ch) return;
    // Chunkings of one K often coincide (no document but the longest cut).
    for (size_t i = candidates.size(); i > 0 && candidates[i - 1].k == k; --i) {
      if (SameChunks(candidates[i - 1].chunking, *ch)) return;
    }
    candidates.push_back({k, std::move(*ch), 0});
  };
  for (int32_t k : ks) {
    FLASHCP_RETURN_IF_ERROR(o.stop.Check());
    if (st == PipelineStrategy::kDppNoWbc) {
      add(k, ChunkTokenCap(r, k));
      continue;
    }
    add(k, ChunkBalanced(r, k, 0, false));
    if (k > 1) add(k, ChunkBalanced(r, k, (lmax + k - 1) / k, false));
    if (st == PipelineStrategy::kDpp) {
      add(k, ChunkTokenCap(r, k));
      if (k > 1) add(k, ChunkBalanced(r, k, 0, true));
    }
  }
  // Best bound first; a candidate whose bound is not below the best replay
  // so far cannot win (ties keep the earlier candidate), so the search stops
  // there. The bound ignores recompute, so it prunes most without memory
  // pressure.
  for (Candidate& c : candidates) c.bound = LowerBound(r, c.chunking);
  std::vector<size_t> order(candidates.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return candidates[a].bound < candidates[b].bound; });
  size_t best_index = 0;
  for (size_t i : order) {
    FLASHCP_RETURN_IF_ERROR(o.stop.Check());
    const Candidate& c = candidates[i];
    if (o.prune_by_bound && best.fits && c.bound * (1 - 1e-9) >= best.time) break;
    FLASHCP_ASSIGN_OR_RETURN(Scored s, Group(r, c.chunking, mode, o.max_pipelines));
    least_over = std::min(least_over, s.over_bytes);
    if (s.fits && (s.time < best.time || (s.time == best.time && i < best_index))) {
      best = std::move(s);
      best_k = c.k;
      best_index = i;
    }
  }
  if (!best.fits) return NoFit(r, st, least_over);
  PipelinePlan plan = std::move(best.plan);
  plan.strategy = st;
  plan.slice_count = best_k;
  plan.ckpt_solver = mode == CkptMode::kNone ? "none" : mode == CkptMode::kFull ? "full" : "greedy";
  if (mode == CkptMode::kGreedy && o.ckpt_solver != nullptr) {
    // The exact programme over the chosen chunks and pipelines, from the
    // greedy checkpointing as its incumbent.
    const internal::CkptModel m = internal::BuildCkptModel(r, plan);
    std::vector<int32_t> start(m.problem.vars, 0);
    for (int32_t p = 0; p < r.pp_size; ++p) {
      for (size_t k = 0; k < plan.chunks.size(); ++k) {
        start[m.VarOf(r.pp_size, p, static_cast<int32_t>(k))] = plan.ckpt[p][k];
      }
    }
    // Diagonal variables are shared, so `start` holds each one's value.
    FLASHCP_ASSIGN_OR_RETURN(const CkptSolution sol, o.ckpt_solver(m.problem, start, o.ckpt, o.stop));
    PipelinePlan exact = plan;
    exact.ckpt = internal::CkptFromValues(r, plan, m, sol.values);
    FLASHCP_ASSIGN_OR_RETURN(exact.prediction, internal::ReplayPipeline(r, exact));
    // The programme minimizes its recompute estimate, not the replayed time:
    // its checkpointing is kept unless the greedy one replays faster (the
    // gap is reported either way).
    plan.ckpt_gap = sol.gap;
    plan.ckpt_optimal = sol.optimal;
    if (exact.prediction.iteration_s <= plan.prediction.iteration_s) {
      plan.ckpt = std::move(exact.ckpt);
      plan.prediction = std::move(exact.prediction);
      plan.ckpt_solver = "ilp";
    }
  }
  return plan;
}

// Batch-level and token-level PP: bins of lmax tokens, uniform checkpointing.
absl::StatusOr<PipelinePlan> PlanFixed(const PipelineRequest& r, const PipelineOptions& o) {
  const int64_t lmax = *std::max_element(r.doc_lens.begin(), r.doc_lens.end());
  const auto bins = PackBins(r, lmax);
  std::vector<int32_t> splits{1};
  if (o.strategy == PipelineStrategy::kTokenLevel) splits = {2, 4, 8, 16};
  Scored best;
  double least_over = std::numeric_limits<double>::infinity();
  for (int32_t sp : splits) {
    FLASHCP_RETURN_IF_ERROR(o.stop.Check());
    const int64_t size = (lmax + sp - 1) / sp;  // fixed slice tokens
    if (sp > 1 && size < 1) continue;
    PipelinePlan plan;
    PipelineGroup g;
    for (const auto& bin : bins) {
      if (sp == 1) {
        PipelineChunk c{ChunkKind::kPacked, {}};
        for (int32_t d : bin) c.slices.push_back(PipelineSlice{d, 0, r.doc_lens[d]});
        g.forward.push_back(static_cast<int32_t>(plan.chunks.size()));
        plan.chunks.push_back(std::move(c));
        continue;
      }
      // The packed sequence cut every `size` tokens, across documents.
      PipelineChunk c{ChunkKind::kMixed, {}};
      int64_t in_chunk = 0;
      for (int32_t d : bin) {
        for (int64_t a = 0; a < r.doc_lens[d];) {
          const int64_t len = std::min(r.doc_lens[d] - a, size - in_chunk);
          c.slices.push_back(PipelineSlice{d, a, len});
          a += len;
          in_chunk += len;
          if (in_chunk == size) {
            g.forward.push_back(static_cast<int32_t>(plan.chunks.size()));
            plan.chunks.push_back(std::move(c));
            c = PipelineChunk{ChunkKind::kMixed, {}};
            in_chunk = 0;
          }
        }
      }
      if (!c.slices.empty()) {
        g.forward.push_back(static_cast<int32_t>(plan.chunks.size()));
        plan.chunks.push_back(std::move(c));
      }
    }
    g.backward = internal::BackwardOrder(plan.chunks, g.forward);
    plan.pipelines.push_back(std::move(g));
    FLASHCP_ASSIGN_OR_RETURN(Scored s, Checkpoint(r, std::move(plan), CkptMode::kUniform));
    least_over = std::min(least_over, s.over_bytes);
    if (s.fits && s.time < best.time) {
      best = std::move(s);
      best.plan.slice_count = sp;
    }
  }
  if (!best.fits) return NoFit(r, o.strategy, least_over);
  best.plan.strategy = o.strategy;
  best.plan.ckpt_solver = "uniform";
  return std::move(best.plan);
}

}  // namespace

absl::StatusOr<PipelinePlan> PlanPipeline(const PipelineRequest& request,
                                          const PipelineOptions& options) {
  FLASHCP_ASSIGN_OR_RETURN(const PipelineRequest r, CompletePipelineRequest(request));
  if (options.min_slice_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("min_slice_tokens: must be >= 1, got ",
                                                   options.min_slice_tokens));
  }
  if (options.slice_count < 0 || options.slice_count > (1 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat("slice_count: must be in [0, 2^20], got ",
                                                   options.slice_count));
  }
  if (options.max_pipelines < 1 || options.max_pipelines > 64) {
    return absl::InvalidArgumentError(absl::StrCat("max_pipelines: must be in [1, 64], got ",
                                                   options.max_pipelines));
  }
  if (!std::isfinite(options.ckpt.time_limit_seconds) || options.ckpt.time_limit_seconds < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ckpt.time_limit_seconds: must be a finite number >= 0, got ", options.ckpt.time_limit_seconds));
  }
  if (!(options.ckpt.relative_gap >= 0 && options.ckpt.relative_gap <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ckpt.relative_gap: must be in [0, 1], got ", options.ckpt.relative_gap));
  }
  FLASHCP_RETURN_IF_ERROR(options.stop.Check());
  absl::StatusOr<PipelinePlan> plan;
  switch (options.strategy) {
    case PipelineStrategy::kBatchLevel:
    case PipelineStrategy::kTokenLevel:
      plan = PlanFixed(r, options);
      break;
    default:
      plan = PlanSearch(r, options);
  }
  if (!plan.ok()) return plan.status();
  FLASHCP_RETURN_IF_ERROR(options.stop.Check());
  FLASHCP_RETURN_IF_ERROR(ValidatePipelinePlan(r, *plan));
  return plan;
}

}  // namespace flashcp::core
