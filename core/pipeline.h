// Pipeline-parallel plans that follow the batch (DPP, arXiv 2509.21275 §III;
// docs/pipeline.md): a global batch's documents become pipeline micro-batches
// ("chunks": packed, split or hybrid), grouped into 1F1B pipelines run back to
// back, with layer checkpointing per (stage, chunk) shared along the
// pipeline's diagonals. Pure functions over plain structs: no clock, no I/O.
//
// The planner (PlanPipeline) searches the slice count K of the longest
// document; for each K it chunks the batch (Algorithm 1, workload-balanced),
// groups the chunks into pipelines by a dynamic programme (Eq. 14) and
// checkpoints them; the best K by the event simulator's iteration time is
// kept, and its checkpointing is then solved exactly (Eq. 15-20) by the
// injected solver (core/ilp/pipeline_ckpt.h, on CBC) when one is set.
// SimulatePipeline replays any plan, the baselines' included, event by event.
#ifndef FLASHCP_CORE_PIPELINE_H_
#define FLASHCP_CORE_PIPELINE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/strategies.h"

namespace flashcp::core {

// The model that is trained; defaults: LLaMA-2-7B.
struct PipelineModel {
  int32_t layers = 32;            // L; a multiple of pp_size
  int32_t hidden = 4096;          // D
  int32_t kv_hidden = 4096;       // D_kv = KV heads x head dim
  int32_t ffn_hidden = 11008;     // MLP width
  int32_t vocab = 32000;          // V
  int32_t bytes_per_element = 2;  // e: activations (bf16)
};

// Time and memory coefficients. Times are seconds on one GPU at d_s = 1 per
// transformer layer; d_s divides the pair and token terms (Ulysses splits
// heads). Memory is bytes per token and layer at d_s = 1, divided by d_s.
// A coefficient left at 0 where "0: derived" is said takes the derived value
// (PipelineProfileFor fills them). The shipped profile "analytic" is an
// estimate for an H100-class GPU in bf16 (docs/pipeline.md), not a fit;
// "cpu_tiny_decoder" is a fit, for a tiny decoder on CPU.
struct PipelineProfile {
  double fwd_pair_s = 0;   // per causal (query, key) pair; 0: 4 D flops at 200 TFLOP/s
  double fwd_token_s = 0;  // per token; 0: 2 x layer params flops at 300 TFLOP/s
  double fwd_chunk_s = 2e-5;  // per chunk and layer: launches, small kernels
  double bwd_pair_s = 0;   // 0: 2 x fwd_pair_s
  double bwd_token_s = 0;  // 0: 2 x fwd_token_s
  double bwd_chunk_s = 0;  // 0: 2 x fwd_chunk_s
  double a2a_bytes_per_s = 1e11;  // Ulysses all-to-all bandwidth (used when d_s > 1)
  double a2a_latency_s = 1e-5;
  double p2p_bytes_per_s = 2.5e10;  // stage-to-stage activation / gradient send
  double p2p_latency_s = 2e-5;
  double act_token_bytes = 0;     // a full layer's activations; 0: 34 D
  double ckpt_token_bytes = 0;    // a checkpointed layer's kept input; 0: e D
  double kv_token_bytes = 0;      // K and V of one layer (kept for later slices); 0: 2 e D_kv
  double logits_token_bytes = 0;  // last stage's logits (fp32); 0: 4 V
  double state_bytes_per_param = 16;  // weights, grads, Adam (mixed precision); ZeRO-3 over d_s
};
inline constexpr absl::string_view kDefaultPipelineProfile = "analytic";
// Fitted from CPU pipeline runs of a tiny fp32 decoder (L = 4, D = 64,
// F = 256, V = 128; bench/pipeline_cpu_fit.py): for that model only.
inline constexpr absl::string_view kCpuTinyDecoderProfile = "cpu_tiny_decoder";
std::vector<std::string> PipelineProfileNames();
// NotFound naming the profile and the known ones for an unknown name.
absl::StatusOr<PipelineProfile> NamedPipelineProfile(absl::string_view name);
// Sets the coefficient named as its PipelineProfile field ("fwd_pair_s");
// InvalidArgument naming an unknown one (the value is checked later, by
// CompletePipelineRequest).
absl::Status SetPipelineCoefficient(PipelineProfile& profile, absl::string_view name, double value);

// One batch to plan. Every field but doc_lens has a default, so {doc_lens, 4}
// plans for 4 stages.
struct PipelineRequest {
  std::vector<int64_t> doc_lens;  // tokens per document, each >= 1
  int32_t pp_size = 4;            // d_p, pipeline stages
  int32_t sp_size = 1;            // d_s, Ulysses degree inside a stage
  double memory_budget_bytes = 80.0 * (int64_t{1} << 30);  // per GPU
  PipelineModel model;
  PipelineProfile profile;  // zeros derived (see PipelineProfile)
};

// Plan-level strategies: the planner and its baselines (docs/pipeline.md).
enum class PipelineStrategy {
  kDpp = 0,          // Algorithm 1 + DP grouping + checkpoint ILP
  kBatchLevel = 1,   // documents packed to a fixed length, one micro-batch each
  kTokenLevel = 2,   // packed sequences cut in fixed slices (Seq1F1B-like)
  kDppNoWbc = 3,     // DPP with token-capped chunking instead of Algorithm 1
  kDppNoCkpt = 4,    // DPP with no checkpointing
  kDppFullCkpt = 5,  // DPP with every layer checkpointed
};
inline constexpr PipelineStrategy kAllPipelineStrategies[] = {
    PipelineStrategy::kDpp,      PipelineStrategy::kBatchLevel, PipelineStrategy::kTokenLevel,
    PipelineStrategy::kDppNoWbc, PipelineStrategy::kDppNoCkpt,  PipelineStrategy::kDppFullCkpt};
absl::string_view PipelineStrategyName(PipelineStrategy s);  // "dpp", "batch_level", ...
absl::StatusOr<PipelineStrategy> ParsePipelineStrategy(absl::string_view name);

enum class ChunkKind { kPacked = 0, kSplit = 1, kHybrid = 2, kMixed = 3 };
absl::string_view ChunkKindName(ChunkKind k);  // "packed", "split", "hybrid", "mixed"

// Tokens [start, start + len) of document `doc`; its attention context is
// `start` (the document's earlier tokens).
struct PipelineSlice {
  int32_t doc = 0;
  int64_t start = 0;
  int64_t len = 0;
  friend bool operator==(const PipelineSlice&, const PipelineSlice&) = default;
};

// One micro-batch. packed: whole documents; split: one slice of a longer
// document, not the whole of it; hybrid: a document's tail slice (first in
// `slices`) plus whole documents. kMixed: only the token-level baseline,
// whose fixed slices cut anywhere.
struct PipelineChunk {
  ChunkKind kind = ChunkKind::kPacked;
  std::vector<PipelineSlice> slices;
};

// One 1F1B pipeline: chunk ids in forward order; backward order is forward
// order with each run of chunks that share a document reversed (a split
// document's slices run backward last slice first).
struct PipelineGroup {
  std::vector<int32_t> forward;
  std::vector<int32_t> backward;
};

// What the event simulator measured (SimulatePipeline).
struct PipelineOp {
  int32_t stage = 0;
  int32_t chunk = 0;
  bool backward = false;
  double start_s = 0, end_s = 0;
  double recompute_s = 0;  // the leading part of a backward op spent recomputing
};
struct PipelineSim {
  double iteration_s = 0;
  double bubble_share = 0;    // 1 - busy time / (stages x iteration)
  double recompute_s = 0;     // recompute time summed over stages, divided by stages
  std::vector<double> stage_peak_bytes;  // model states + activations, per stage
  std::vector<double> stage_model_state_bytes;
  std::vector<PipelineOp> ops;  // every op, in start order
  // Per stage, (time, bytes) after each change of live memory.
  std::vector<std::vector<std::pair<double, double>>> memory_timeline;
};

struct PipelinePlan {
  PipelineStrategy strategy = PipelineStrategy::kDpp;
  std::vector<PipelineChunk> chunks;
  std::vector<PipelineGroup> pipelines;  // run back to back
  std::vector<std::vector<int32_t>> ckpt;  // [stage][chunk]: layers in [0, L / d_p]
  int32_t slice_count = 0;   // K chosen for the longest document (0: not sliced by K)
  // "ilp"; "greedy" (no solver set, or its checkpointing replayed slower
  // than the greedy one); "none", "full", "uniform" for the baselines.
  std::string ckpt_solver;
  double ckpt_gap = 0;       // relative gap of the checkpoint solve; 0 when optimal
  bool ckpt_optimal = false;
  PipelineSim prediction;    // SimulatePipeline(request, plan)
};

// The checkpoint programme (Eq. 15-20), in the form every solver sees:
// minimize sum_j cost[j] * c[j] over integers c[j] in [0, max_value] subject
// to, for every row, sum_(j, a) a * c[j] >= rhs (a > 0: bytes a checkpointed
// layer saves; rhs: bytes above the budget with nothing checkpointed).
struct CkptRow {
  std::vector<std::pair<int32_t, double>> terms;
  double rhs = 0;
};
struct CkptProblem {
  int32_t vars = 0;
  int32_t max_value = 0;
  std::vector<double> cost;  // seconds per layer of c[j]
  std::vector<CkptRow> rows;
};
struct CkptSolution {
  std::vector<int32_t> values;
  double objective = 0;
  double gap = 0;
  bool optimal = false;
};
struct CkptSolveOptions {
  double time_limit_seconds = 5;
  double relative_gap = 0.02;  // the paper's SCIP setting
};
// A checkpoint solver: core::ilp::SolvePipelineCkpt links CBC. It gets a
// feasible `start`; returns `stop`'s status once it says stop.
using CkptSolver = absl::StatusOr<CkptSolution> (*)(const CkptProblem& problem,
                                                    const std::vector<int32_t>& start,
                                                    const CkptSolveOptions& options,
                                                    const StopToken& stop);

// Greedy: every variable at max_value, then each, most costly first, lowered
// as far as every row allows. FailedPrecondition with the bytes missing when
// even max_value everywhere violates a row.
absl::StatusOr<CkptSolution> SolveCkptGreedy(const CkptProblem& problem);

struct PipelineOptions {
  PipelineStrategy strategy = PipelineStrategy::kDpp;
  // Null: the greedy checkpointing above (ckpt_solver "greedy").
  CkptSolver ckpt_solver = nullptr;
  CkptSolveOptions ckpt;
  int64_t min_slice_tokens = 256;  // K candidates leave no mesh slice shorter
  int32_t slice_count = 0;         // K for the DPP strategies; 0: searched
  int32_t max_pipelines = 8;       // bound on the DP's pipelines
  // Skip chunkings whose lower bound on the replayed time is not below the
  // best replay so far (the plan is the same; false: replay every one).
  bool prune_by_bound = true;
  StopToken stop;
};

// The request with every derived coefficient filled in. InvalidArgument naming
// the field (doc_lens, pp_size, sp_size, memory_budget_bytes, model.<f>,
// profile.<f>) for a bad request.
absl::StatusOr<PipelineRequest> CompletePipelineRequest(const PipelineRequest& request);

// Plans the batch. InvalidArgument as above; FailedPrecondition saying by how
// many bytes the tightest stage exceeds the budget when no plan fits (for
// kDppNoCkpt and the fixed-length baselines too); options.stop's status once
// it says stop. The plan passes ValidatePipelinePlan and carries its replay.
absl::StatusOr<PipelinePlan> PlanPipeline(const PipelineRequest& request,
                                          const PipelineOptions& options = {});

// Invariants: every token in exactly one chunk; each document's slices in
// consecutive chunks of one pipeline, in token order along its forward order;
// backward orders as PipelineGroup says; every chunk in exactly one pipeline;
// ckpt counts in [0, L / d_p]. For every strategy but kTokenLevel also: chunk
// kinds as PipelineChunk says and never two tail slices in one chunk.
// InvalidArgument naming what breaks.
absl::Status ValidatePipelinePlan(const PipelineRequest& request, const PipelinePlan& plan);

// Replays the plan event by event (docs/pipeline.md, "Simulator"): per-stage
// op order is 1F1B, ops start when their stage is free and their inputs have
// arrived; memory is allocated and freed at op boundaries. InvalidArgument for
// an invalid plan (ValidatePipelinePlan); Internal if the schedule deadlocks.
absl::StatusOr<PipelineSim> SimulatePipeline(const PipelineRequest& request,
                                             const PipelinePlan& plan);

// Bytes over the budget at the replay's worst stage (<= 0: fits).
double PipelineOverBudget(const PipelineRequest& request, const PipelineSim& sim);

// Per stage, the op order of one pipeline (1F1B, docs/pipeline.md,
// "Schedule"): the order the simulator replays and an executor runs
// (flashcp.torch.pipeline). Only stage, chunk and backward are set.
std::vector<std::vector<PipelineOp>> PipelineStageOrder(int32_t pp_size,
                                                        const PipelineGroup& group);

}  // namespace flashcp::core

#endif  // FLASHCP_CORE_PIPELINE_H_
