// Pieces of the pipeline mode shared by its planner, its checkpoint rows and
// its simulator (core/pipeline.h): the per-chunk cost model, the 1F1B op
// order and the checkpoint programme of a plan.
#ifndef FLASHCP_CORE_INTERNAL_PIPELINE_INTERNAL_H_
#define FLASHCP_CORE_INTERNAL_PIPELINE_INTERNAL_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "core/pipeline.h"

namespace flashcp::core::internal {

// Layers per stage, L / d_p.
inline int32_t StageLayers(const PipelineRequest& r) { return r.model.layers / r.pp_size; }

// One chunk's costs on one stage (a complete request: CompletePipelineRequest).
struct ChunkCost {
  double tokens = 0;
  double nonfinal_tokens = 0;  // tokens of slices that are not their document's last
  double fwd_s = 0;            // forward of the stage's L / d_p layers
  double bwd_s = 0;            // backward of those layers, no recompute
  double layer_fwd_s = 0;      // forward of one layer: the price of one recomputed layer
  double p2p_s = 0;            // send of its activations (or gradients) to the next stage
};
ChunkCost ChunkCosts(const PipelineRequest& r, const PipelineChunk& c);

// Forward + backward time of `len` tokens with context `start`, all of a
// stage's layers, without overheads: what Algorithm 1 balances.
double SliceWork(const PipelineRequest& r, int64_t start, int64_t len);

// Model-state bytes of stage p (weights, grads, optimizer; embedding on the
// first stage and the LM head on the last), ZeRO-3 over d_s.
double ModelStateBytes(const PipelineRequest& r, int32_t stage);

// Bytes of chunk c's activations on `stage` while alive (forward to backward)
// with `ckpt` layers checkpointed: full layers, checkpointed inputs (plus the
// K/V later slices need) and, on the last stage, logits.
double ActivationBytes(const PipelineRequest& r, const PipelineChunk& c, int32_t stage,
                       int32_t ckpt);
// Bytes one checkpointed layer saves: ActivationBytes(ckpt) - ActivationBytes(ckpt + 1).
double CkptSavingBytes(const PipelineRequest& r, const PipelineChunk& c);
// Working memory of one layer during a backward op (the recomputed or the
// gradient layer): one full layer's activations.
double BackwardTransientBytes(const PipelineRequest& r, const PipelineChunk& c);
// dK/dV of a slice, all of a stage's layers: allocated at its document's
// first backward (the last slice's), freed at the slice's own backward.
double DkvBytes(const PipelineRequest& r, int64_t tokens);

// Backward order of a pipeline: `forward` with every maximal run of chunks
// linked by a shared document reversed.
std::vector<int32_t> BackwardOrder(const std::vector<PipelineChunk>& chunks,
                                   const std::vector<int32_t>& forward);

// One op of a stage's order.
struct StageOp {
  int32_t chunk = 0;
  bool backward = false;
};
// 1F1B per stage: forward while fewer than d_p - p + R - 1 chunks are in
// flight (R: the pipeline's longest run of chunks sharing a document, Eq. 7's
// N_split) or the next backward's forward has not run here; else the next
// backward.
std::vector<std::vector<StageOp>> StageOrders(int32_t pp_size, const PipelineGroup& group);

// The checkpoint programme of `plan`'s pipelines (Eq. 15-20): variable j of
// pipeline g is its diagonal b(k) + d_p - 1 - p (b: position in backward
// order); one row per stage op whose live memory may exceed the budget.
struct CkptModel {
  CkptProblem problem;
  // Per pipeline, the first variable's index; stage p, chunk k of pipeline g
  // use var_base[g] + pos_b[k] + d_p - 1 - p.
  std::vector<int32_t> var_base;
  std::vector<int32_t> pos_b;   // per chunk, its position in its pipeline's backward order
  std::vector<int32_t> group;   // per chunk, its pipeline
  double worst_over_bytes = 0;  // largest rhs - (most saving): > 0 means infeasible
  int32_t VarOf(int32_t pp, int32_t stage, int32_t chunk) const {
    return var_base[group[chunk]] + pos_b[chunk] + pp - 1 - stage;
  }
};
CkptModel BuildCkptModel(const PipelineRequest& r, const PipelinePlan& plan);
// ckpt[stage][chunk] from the variables.
std::vector<std::vector<int32_t>> CkptFromValues(const PipelineRequest& r, const PipelinePlan& plan,
                                                 const CkptModel& m,
                                                 const std::vector<int32_t>& values);

// The event replay of SimulatePipeline without its validation: `plan`'s
// pipelines may cover only some of its chunks (the planner replays candidate
// pipelines alone); ckpt must have a count for every chunk they list.
absl::StatusOr<PipelineSim> ReplayPipeline(const PipelineRequest& r, const PipelinePlan& plan);

}  // namespace flashcp::core::internal

#endif  // FLASHCP_CORE_INTERNAL_PIPELINE_INTERNAL_H_
