// The pipeline mode's plan invariants and its event simulator
// (core/pipeline.h; docs/pipeline.md, "Simulator"). The simulator shares the
// per-chunk cost model and the 1F1B op order with the planner but not the
// checkpoint programme's live-set rows: it times every op and keeps its own
// allocation ledger per stage, so a plan whose rows were wrong shows up here.
#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/internal/pipeline_internal.h"
#include "core/status_macros.h"

namespace flashcp::core {

using internal::StageLayers;

namespace {

// Per document: (start, chunk) of its slices.
using DocPieces = std::vector<std::vector<std::pair<int64_t, int32_t>>>;

// Chunk k's kind matches its slices (whole, cut and tail counts).
absl::Status CheckChunkKind(const PipelineRequest& r, const PipelineChunk& c, size_t k, int tails,
                            int whole, int cut) {
  if (tails > 1) {
    return absl::InvalidArgumentError(absl::StrCat("chunks[", k, "]: ", tails, " tail slices"));
  }
  bool ok = false;
  switch (c.kind) {
    case ChunkKind::kPacked: ok = cut == 0; break;
    case ChunkKind::kSplit: ok = c.slices.size() == 1 && cut == 1; break;
    case ChunkKind::kHybrid:
      ok = tails == 1 && cut == 1 && whole >= 1 && c.slices[0].start > 0 &&
           c.slices[0].start + c.slices[0].len == r.doc_lens[c.slices[0].doc];
      break;
    case ChunkKind::kMixed: ok = false; break;
  }
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunks[", k, "]: not a valid ", ChunkKindName(c.kind), " chunk"));
  }
  return absl::OkStatus();
}

// Every slice inside its document and every chunk of its kind; fills the
// pieces per document, checked against tiling by CheckTiling.
absl::Status CheckChunks(const PipelineRequest& r, const PipelinePlan& plan, DocPieces& pieces) {
  const size_t nd = r.doc_lens.size();
  for (size_t k = 0; k < plan.chunks.size(); ++k) {
    const PipelineChunk& c = plan.chunks[k];
    if (c.slices.empty()) return absl::InvalidArgumentError(absl::StrCat("chunks[", k, "]: empty"));
    int tails = 0, whole = 0, cut = 0;
    for (const PipelineSlice& s : c.slices) {
      if (s.doc < 0 || static_cast<size_t>(s.doc) >= nd || s.len < 1 || s.start < 0 ||
          s.start + s.len > r.doc_lens[s.doc]) {
        return absl::InvalidArgumentError(absl::StrCat("chunks[", k, "]: slice (doc ", s.doc,
                                                       ", start ", s.start, ", len ", s.len,
                                                       ") is outside its document"));
      }
      pieces[s.doc].emplace_back(s.start, static_cast<int32_t>(k));
      const bool is_whole = s.start == 0 && s.len == r.doc_lens[s.doc];
      whole += is_whole;
      cut += !is_whole;
      tails += !is_whole && s.start > 0 && s.start + s.len == r.doc_lens[s.doc];
    }
    if (plan.strategy == PipelineStrategy::kTokenLevel) continue;
    FLASHCP_RETURN_IF_ERROR(CheckChunkKind(r, c, k, tails, whole, cut));
  }
  return absl::OkStatus();
}

// Pipelines: every chunk exactly once; fills each chunk's pipeline and
// forward position.
absl::Status CheckPipelines(const PipelinePlan& plan, std::vector<int32_t>& group,
                            std::vector<int32_t>& fpos) {
  const size_t nc = plan.chunks.size();
  for (size_t g = 0; g < plan.pipelines.size(); ++g) {
    const PipelineGroup& grp = plan.pipelines[g];
    if (grp.forward.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("pipelines[", g, "]: no chunks"));
    }
    for (size_t i = 0; i < grp.forward.size(); ++i) {
      const int32_t k = grp.forward[i];
      if (k < 0 || static_cast<size_t>(k) >= nc || group[k] != -1) {
        return absl::InvalidArgumentError(
            absl::StrCat("pipelines[", g, "].forward: chunk ", k, " unknown or listed twice"));
      }
      group[k] = static_cast<int32_t>(g);
      fpos[k] = static_cast<int32_t>(i);
    }
    if (grp.backward != internal::BackwardOrder(plan.chunks, grp.forward)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pipelines[", g, "].backward: not the forward order with shared-document runs reversed"));
    }
  }
  for (size_t k = 0; k < nc; ++k) {
    if (group[k] == -1) {
      return absl::InvalidArgumentError(absl::StrCat("chunks[", k, "]: in no pipeline"));
    }
  }
  return absl::OkStatus();
}

// Each document tiled by its slices, in consecutive chunks of one pipeline.
absl::Status CheckTiling(const PipelineRequest& r, const PipelinePlan& plan, DocPieces& pieces,
                         const std::vector<int32_t>& group, const std::vector<int32_t>& fpos) {
  for (size_t d = 0; d < r.doc_lens.size(); ++d) {
    auto& ps = pieces[d];
    std::sort(ps.begin(), ps.end());
    int64_t at = 0;
    for (size_t i = 0; i < ps.size(); ++i) {
      const auto [start, k] = ps[i];
      if (start != at) {
        return absl::InvalidArgumentError(absl::StrCat("doc_lens[", d, "]: token ", at,
                                                       " is in no chunk or in two"));
      }
      for (const PipelineSlice& s : plan.chunks[k].slices) {
        if (s.doc == static_cast<int32_t>(d) && s.start == start) at += s.len;
      }
      if (i > 0) {
        const int32_t prev = ps[i - 1].second;
        if (group[prev] != group[k] || fpos[k] != fpos[prev] + 1) {
          return absl::InvalidArgumentError(absl::StrCat(
              "doc_lens[", d, "]: slices not in consecutive chunks of one pipeline in token order"));
        }
      }
    }
    if (at != r.doc_lens[d]) {
      return absl::InvalidArgumentError(absl::StrCat("doc_lens[", d, "]: token ", at,
                                                     " is in no chunk or in two"));
    }
  }
  return absl::OkStatus();
}

// One checkpoint row per stage, one count in [0, layers per stage] per chunk.
absl::Status CheckCkpt(const PipelineRequest& r, const PipelinePlan& plan) {
  const size_t nc = plan.chunks.size();
  if (plan.ckpt.size() != static_cast<size_t>(r.pp_size)) {
    return absl::InvalidArgumentError("ckpt: not one row per stage");
  }
  for (int32_t p = 0; p < r.pp_size; ++p) {
    if (plan.ckpt[p].size() != nc) {
      return absl::InvalidArgumentError(absl::StrCat("ckpt[", p, "]: not one count per chunk"));
    }
    for (size_t k = 0; k < nc; ++k) {
      if (plan.ckpt[p][k] < 0 || plan.ckpt[p][k] > StageLayers(r)) {
        return absl::InvalidArgumentError(absl::StrCat("ckpt[", p, "][", k, "]: ", plan.ckpt[p][k],
                                                       " is outside [0, ", StageLayers(r), "]"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidatePipelinePlan(const PipelineRequest& r, const PipelinePlan& plan) {
  const size_t nc = plan.chunks.size();
  DocPieces pieces(r.doc_lens.size());
  FLASHCP_RETURN_IF_ERROR(CheckChunks(r, plan, pieces));
  std::vector<int32_t> group(nc, -1), fpos(nc, -1);
  FLASHCP_RETURN_IF_ERROR(CheckPipelines(plan, group, fpos));
  FLASHCP_RETURN_IF_ERROR(CheckTiling(r, plan, pieces, group, fpos));
  return CheckCkpt(r, plan);
}

std::vector<std::vector<PipelineOp>> PipelineStageOrder(int32_t pp_size,
                                                        const PipelineGroup& group) {
  std::vector<std::vector<PipelineOp>> out(std::max(pp_size, 0));
  const auto orders = internal::StageOrders(pp_size, group);
  for (int32_t p = 0; p < pp_size; ++p) {
    for (const internal::StageOp& op : orders[p]) {
      out[p].push_back(PipelineOp{.stage = p, .chunk = op.chunk, .backward = op.backward});
    }
  }
  return out;
}

absl::StatusOr<PipelineSim> SimulatePipeline(const PipelineRequest& r, const PipelinePlan& plan) {
  FLASHCP_RETURN_IF_ERROR(ValidatePipelinePlan(r, plan));
  return internal::ReplayPipeline(r, plan);
}

namespace {

constexpr double kNotYet = -1;  // an op's end time before it has run

// Per document, its (chunk, len, start) pieces.
using SlicePieces = std::vector<std::vector<std::tuple<int32_t, int64_t, int64_t>>>;

// The ready op that starts first (ties: lowest stage): (stage, start), or
// stage -1 when none is ready.
std::pair<int32_t, double> NextOp(const std::vector<std::vector<internal::StageOp>>& orders,
                                  const std::vector<size_t>& next,
                                  const std::vector<std::vector<double>>& f_end,
                                  const std::vector<std::vector<double>>& b_end,
                                  const std::vector<double>& free_at,
                                  const std::vector<internal::ChunkCost>& costs, double t0) {
  const int32_t pp = static_cast<int32_t>(orders.size());
  int32_t best = -1;
  double best_start = 0;
  for (int32_t p = 0; p < pp; ++p) {
    if (next[p] >= orders[p].size()) continue;
    const internal::StageOp& op = orders[p][next[p]];
    double ready;
    if (!op.backward) {
      ready = p == 0 ? t0 : f_end[p - 1][op.chunk];
      if (ready == kNotYet) continue;
      if (p > 0) ready += costs[op.chunk].p2p_s;
    } else {
      ready = p == pp - 1 ? f_end[p][op.chunk] : b_end[p + 1][op.chunk];
      if (ready == kNotYet) continue;
      if (p < pp - 1) ready += costs[op.chunk].p2p_s;
    }
    const double start = std::max(ready, free_at[p]);
    if (best == -1 || start < best_start) {
      best = p;
      best_start = start;
    }
  }
  return {best, best_start};
}

// Bytes a chunk's forward leaves allocated on stage p with ck checkpointed
// layers: full activations of the others, the checkpoints (and K/V needed by
// later slices) of those, and the logits on the last stage.
double ForwardHeldBytes(const PipelineRequest& r, const internal::ChunkCost& cost, int32_t ck,
                        int32_t p) {
  const double full = (StageLayers(r) - ck) * r.profile.act_token_bytes * cost.tokens;
  const double kept = ck * (r.profile.ckpt_token_bytes * cost.tokens +
                            r.profile.kv_token_bytes * cost.nonfinal_tokens);
  const double logits = p == r.pp_size - 1 ? r.profile.logits_token_bytes * cost.tokens : 0.0;
  return (full + kept + logits) / r.sp_size;
}

// The dK/dV of the earlier slices of every document whose last slice chunk c
// holds, added to their chunks' entries of dkv (one stage's); returns the sum.
double AddBackwardDkv(const PipelineRequest& r, const PipelineChunk& c,
                      const SlicePieces& doc_pieces, std::vector<double>& dkv) {
  double new_dkv = 0;
  for (const PipelineSlice& s : c.slices) {
    if (s.start > 0 && s.start + s.len == r.doc_lens[s.doc]) {
      // The earlier slices' chunks each own their part.
      for (const auto& [k2, len2, start2] : doc_pieces[s.doc]) {
        if (start2 < s.start) {
          const double b =
              StageLayers(r) * r.profile.kv_token_bytes * static_cast<double>(len2) / r.sp_size;
          dkv[k2] += b;
          new_dkv += b;
        }
      }
    }
  }
  return new_dkv;
}

}  // namespace

absl::StatusOr<PipelineSim> internal::ReplayPipeline(const PipelineRequest& r,
                                                     const PipelinePlan& plan) {
  const int32_t pp = r.pp_size;
  const size_t nc = plan.chunks.size();
  std::vector<internal::ChunkCost> costs(nc);
  for (size_t k = 0; k < nc; ++k) costs[k] = internal::ChunkCosts(r, plan.chunks[k]);

  // Per document, its (chunk, len, start) pieces.
  SlicePieces doc_pieces(r.doc_lens.size());
  for (size_t k = 0; k < nc; ++k) {
    for (const PipelineSlice& s : plan.chunks[k].slices) {
      doc_pieces[s.doc].emplace_back(static_cast<int32_t>(k), s.len, s.start);
    }
  }
  PipelineSim sim;
  sim.stage_model_state_bytes.resize(pp);
  sim.stage_peak_bytes.resize(pp);
  sim.memory_timeline.resize(pp);
  std::vector<double> live(pp);
  for (int32_t p = 0; p < pp; ++p) {
    live[p] = sim.stage_model_state_bytes[p] = internal::ModelStateBytes(r, p);
    sim.stage_peak_bytes[p] = live[p];
    sim.memory_timeline[p].emplace_back(0.0, live[p]);
  }
  // Per stage and chunk: bytes its forward left allocated, and its own dK/dV.
  std::vector<std::vector<double>> held(pp, std::vector<double>(nc, 0.0));
  std::vector<std::vector<double>> dkv(pp, std::vector<double>(nc, 0.0));
  double busy = 0, recompute = 0;
  double t0 = 0;  // the current pipeline's start: all stages idle
  for (const PipelineGroup& grp : plan.pipelines) {
    const auto orders = internal::StageOrders(pp, grp);
    std::vector<std::vector<double>> f_end(pp, std::vector<double>(nc, kNotYet));
    std::vector<std::vector<double>> b_end(pp, std::vector<double>(nc, kNotYet));
    std::vector<size_t> next(pp, 0);
    std::vector<double> free_at(pp, t0);
    size_t remaining = 0;
    for (const auto& o : orders) remaining += o.size();
    while (remaining > 0) {
      const auto [best, best_start] = NextOp(orders, next, f_end, b_end, free_at, costs, t0);
      if (best == -1) {
        return absl::InternalError("pipeline simulator: the 1F1B order deadlocked");
      }
      const int32_t p = best;
      const internal::StageOp op = orders[p][next[p]++];
      --remaining;
      const PipelineChunk& c = plan.chunks[op.chunk];
      PipelineOp rec{p, op.chunk, op.backward, best_start, 0, 0};
      if (!op.backward) {
        // Activations are held from the forward's start (they grow during
        // it; nothing on this stage frees meanwhile, so the peak is the same).
        held[p][op.chunk] = ForwardHeldBytes(r, costs[op.chunk], plan.ckpt[p][op.chunk], p);
        live[p] += held[p][op.chunk];
        rec.end_s = best_start + costs[op.chunk].fwd_s;
        f_end[p][op.chunk] = rec.end_s;
      } else {
        // Backward: one layer's working set, and the dK/dV of the earlier
        // slices of every document whose last slice this is.
        const double transient = r.profile.act_token_bytes * costs[op.chunk].tokens / r.sp_size;
        const double new_dkv = AddBackwardDkv(r, c, doc_pieces, dkv[p]);
        live[p] += transient + new_dkv;
        rec.recompute_s = plan.ckpt[p][op.chunk] * costs[op.chunk].layer_fwd_s;
        rec.end_s = best_start + rec.recompute_s + costs[op.chunk].bwd_s;
        recompute += rec.recompute_s;
        b_end[p][op.chunk] = rec.end_s;
      }
      sim.memory_timeline[p].emplace_back(best_start, live[p]);
      sim.stage_peak_bytes[p] = std::max(sim.stage_peak_bytes[p], live[p]);
      if (op.backward) {
        live[p] -= held[p][op.chunk] + dkv[p][op.chunk] +
                   r.profile.act_token_bytes * costs[op.chunk].tokens / r.sp_size;
        held[p][op.chunk] = dkv[p][op.chunk] = 0;
        sim.memory_timeline[p].emplace_back(rec.end_s, live[p]);
      }
      busy += rec.end_s - rec.start_s;
      free_at[p] = rec.end_s;
      sim.ops.push_back(rec);
    }
    for (int32_t p = 0; p < pp; ++p) t0 = std::max(t0, free_at[p]);
  }
  sim.iteration_s = t0;
  sim.bubble_share = t0 > 0 ? std::max(0.0, 1.0 - busy / (pp * t0)) : 0.0;
  sim.recompute_s = recompute / pp;
  std::stable_sort(sim.ops.begin(), sim.ops.end(),
                   [](const PipelineOp& a, const PipelineOp& b) { return a.start_s < b.start_s; });
  return sim;
}

double PipelineOverBudget(const PipelineRequest& r, const PipelineSim& sim) {
  double over = -std::numeric_limits<double>::infinity();
  for (double peak : sim.stage_peak_bytes) over = std::max(over, peak - r.memory_budget_bytes);
  return over;
}

}  // namespace flashcp::core
