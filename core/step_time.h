// A step-time model: the predicted attention time of one training step of a
// plan on a cluster (issue 29). Pure functions over plain structs; the one
// place that turns a plan, a model shape and a cluster into seconds.
//
// Per transformer layer and rank r, with compute from a GPU cost profile
// (core/cost_model.h, forward + backward seconds, split by forward_fraction)
// and the exchange from each link class's bytes over its bandwidth:
//
//   collectives (full_kv, allgather) and targeted, with the overlap the CUDA
//   engine does (worker/cuda/gpu_cp_step.cc: the whole shards, those with
//   prefix 0, are queued before the exchange and run during it; backward runs
//   the prefixed shards first and returns dK/dV while the whole shards'
//   backward runs):
//     fwd_r = max(whole_f_r, X_r) + prefixed_f_r
//     bwd_r = prefixed_b_r + max(whole_b_r, X_r)
//   without overlap (the CPU engine, worker/engine.cc, and the paper's stacked
//   breakdown): whole + X + prefixed in each phase. X_r = 0 where the scheme
//   moves nothing.
//
//   ring (ring and zigzag: full KV passed around the ring, Ring-Attention):
//   N - 1 hops in lockstep, hop i computing rank r's queries against rank
//   (r - i) mod N's keys while the next block travels;
//     fwd = sum_{i < N-1} max(max_r c_f(r, i), T) + max_r c_f(r, N-1)
//     bwd = sum_{i < N-1} max(max_r c_b(r, i), 2T) + max_r c_b(r, N-1) + T
//   (backward passes K, V and the partial dK, dV each hop, and the last hop
//   returns dK, dV to their owner). Each hop is its own attention call: the
//   profile's sequence and token terms count per hop, plus the merge of the
//   partial outputs (merge_passes reads or writes of an fp32 output over HBM).
//
//   all_to_all (Ulysses, within each of the plan's rank groups): one
//   all-to-all brings Q, K, V of a rank's share of the heads before the
//   attention and a second returns O after it (backward: dO in, dQ, dK, dV
//   out), so nothing overlaps; a rank of a group of K runs whole-document
//   attention over all of its group's documents for Hq/K of the heads:
//     fwd_r = c_f(group) / K + X_r,  bwd_r = c_b(group) / K + X_r
//   with X_r from the analyzer's all_to_all rows (PlanAllToAllPhase). Not
//   applicable (StepTimePrediction::inapplicable) under block diffusion or
//   where a group's size does not divide Hq.
//
// The step's attention time: layers * (max_r fwd_r + max_r bwd_r): the
// exchange of every layer synchronises the group, so each phase of each
// layer waits for its slowest rank.
#ifndef FLASHCP_CORE_STEP_TIME_H_
#define FLASHCP_CORE_STEP_TIME_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/analysis.h"
#include "core/cost_model.h"
#include "core/strategies.h"
#include "core/types.h"

namespace flashcp::core {

// How the modelled step exchanges: the three KV CommSchemes (same values),
// Ring-Attention's ring of full KV, and the all-to-all of heads (Ulysses,
// CommScheme::kAllToAll; not that enum's value).
enum class StepExchange { kFullKv = 0, kAllGather = 1, kTargeted = 2, kRing = 3, kAllToAll = 4 };
inline constexpr int kNumStepExchanges = 5;
// "full_kv", "allgather", "targeted", "ring", "all_to_all"
absl::string_view StepExchangeName(StepExchange e);

// A cluster: its links and its GPU. Bandwidths are bytes per second per GPU
// and direction; latencies seconds per message (one step of a collective,
// one hop, one point-to-point round).
struct ClusterSpec {
  // Rank r is on node r / ranks_per_node; 0: all ranks on one node.
  int32_t ranks_per_node = 8;
  double nvlink_bytes_per_second = 450e9;
  double nvlink_latency_seconds = 2e-6;
  // A node's NICs are shared by its GPUs: a node moves at most
  // ranks_per_node * nic_bytes_per_second across nodes, per direction.
  double nic_bytes_per_second = 50e9;
  double nic_latency_seconds = 5e-6;
  // Attention compute: a cost profile in seconds, forward + backward, of one
  // layer at the profile's shape (profile_query_heads x profile_head_dim);
  // scaled by Hq * D over it, and by compute_scale (this GPU's time over the
  // profile's GPU's).
  CostCoefficients compute{1.05e-10, 1.25e-10, 7.6e-6, 4.6e-8};
  int32_t profile_query_heads = 32;
  int32_t profile_head_dim = 128;
  double compute_scale = 1.0;
  // Forward's share of a shard's forward + backward time, in (0, 1).
  double forward_fraction = 0.2617;
  // Ring's per-hop merge of partial outputs: HBM bytes per second, and fp32
  // passes over the rank's output (Hq * D floats per query token) per hop.
  double hbm_bytes_per_second = 4.8e12;
  double merge_passes = 3;
  // The CUDA engine's overlap of whole shards with the exchange; false: the
  // exchange and all compute in sequence (the CPU engine).
  bool overlap_whole_shards = true;
};

// The presets, each constant with its source (docs/step_time.md):
//   "h200": HGX H200: NVLink 4 at 900 GB/s per GPU both directions (450e9 per
//     direction), one 400 Gb/s ConnectX-7 per GPU (50e9), HBM3e 4.8 TB/s
//     (NVIDIA H200 data sheet); compute the shipped h200-cudnn profile
//     (docs/gpu.md run 3, measured); forward share 0.2617 from docs/gpu.md's
//     packed-batch kernel rates (forward 545 TFLOP/s, backward 483 at 2.5x the
//     FLOPs: (1/545) / (1/545 + 2.5/483)).
//   "h100-sxm": DGX H100: the same NVLink 4 and 400 Gb/s per GPU, HBM3 3.35
//     TB/s (NVIDIA H100 data sheet); compute the h200-cudnn profile at
//     compute_scale 1 (same GH100 SMs and 989 TFLOP/s dense BF16 peak in both
//     data sheets; attention is compute bound; not measured on an H100).
//   Latencies in both (2 us NVLink, 5 us NIC) are assumptions of the order of
//   NCCL's small-message latency, not measurements.
std::vector<std::string> ClusterPresetNames();
// NotFound naming the preset and the known ones.
absl::StatusOr<ClusterSpec> ClusterPreset(absl::string_view name);

// InvalidArgument naming the field: bandwidths finite and > 0, latencies and
// hbm finite and >= 0, compute passes ValidateCostCoefficients (field
// "compute.<name>"), profile shape >= 1, compute_scale finite and > 0,
// forward_fraction in (0, 1), merge_passes finite and >= 0,
// ranks_per_node as ValidateRanksPerNode.
absl::Status ValidateClusterSpec(const ClusterSpec& cluster);

// The largest group the model predicts for (the targeted exchange's N x N
// pair matrix).
inline constexpr int32_t kMaxStepTimeCpSize = 1024;

// One rank's predicted times of one layer, seconds.
struct RankStepTime {
  double forward_compute = 0;   // attention forward, all its shards (ring: its hops)
  double backward_compute = 0;
  double exchange = 0;          // one phase's exchange (ring: one hop's transfer)
  double forward = 0;           // with the exchange, as overlapped
  double backward = 0;
  // forward + backward - forward_compute - backward_compute: the exchange
  // its compute does not hide.
  double exposed_exchange = 0;
};

struct StepTimePrediction {
  StepExchange exchange = StepExchange::kAllGather;
  int32_t layers = 1;
  // Where the exchange cannot run on the plan (all_to_all: block diffusion,
  // or a rank group whose size does not divide Hq), why: the analyzer's
  // PlanMetrics::all_to_all_inapplicable message. Then no time is predicted:
  // `ranks` is empty and every time below 0, not a figure to compare. Empty
  // where the exchange applies.
  std::string inapplicable;
  std::vector<RankStepTime> ranks;  // per rank, one layer
  // One layer's phases: the slowest rank's (ring: the lockstep sum over hops).
  double forward_seconds = 0;
  double backward_seconds = 0;
  // The slowest rank's compute, both phases, one layer.
  double compute_seconds = 0;
  // One layer's exchange time, both phases, of the rank that waits longest,
  // as if nothing overlapped it (ring: every hop's transfer, both phases).
  double exchange_seconds = 0;
  // layers * (forward_seconds + backward_seconds): the step's attention time.
  double step_seconds = 0;
  // step_seconds - layers * compute_seconds (>= 0 up to rounding): what the
  // step pays for the exchange beyond its slowest rank's compute.
  double exposed_exchange_seconds = 0;
};

// The shape the model uses: ModelShape (ValidateModelShape) with query_heads
// 0 or a positive multiple of heads (GQA), and layers in [1, 100000].
// InvalidArgument naming the field.
absl::Status ValidateStepShape(const ModelShape& shape, int32_t layers);

// Predicts one exchange for a valid plan (ValidatePlan). InvalidArgument
// naming the field for a bad shape, layers or cluster, or cp_size above
// kMaxStepTimeCpSize; OutOfRange where the all-to-all's row counts overflow
// int64 (PredictAllExchanges, and so every strategy's report, then fails
// too, as AnalyzePlan does on the same plan). An exchange that does not apply
// to the plan is not an error: its prediction says so
// (StepTimePrediction::inapplicable).
absl::StatusOr<StepTimePrediction> PredictStepTime(const Plan& plan, const ModelShape& shape,
                                                   int32_t layers, const ClusterSpec& cluster,
                                                   StepExchange exchange);

// Every exchange at once (indexed by StepExchange), sharing the plan's
// features.
absl::StatusOr<std::array<StepTimePrediction, kNumStepExchanges>> PredictAllExchanges(
    const Plan& plan, const ModelShape& shape, int32_t layers, const ClusterSpec& cluster);

// The exchange a strategy runs with as its system does: llama3, per_doc:
// full_kv (Llama3 CP, Per-Doc CP); ring, zigzag: ring; whole_doc,
// flashcp_paper, ilp: allgather (the paper's Eq. 5); magi: targeted
// (GroupCast); basp: all_to_all (Ulysses within each group; where that is
// inapplicable, so is the native prediction: BASP has no other exchange);
// flashcp: whichever of allgather and targeted `all` predicts faster
// (allgather on a tie).
StepExchange NativeExchange(Strategy strategy,
                            const std::array<StepTimePrediction, kNumStepExchanges>& all);

// What a plan reports about its step (PlanMetrics' predicted times): every
// exchange, and the one the strategy runs with.
struct StepTimeReport {
  std::string cluster;  // the preset the cluster started from; "" for none
  StepExchange exchange = StepExchange::kAllGather;  // NativeExchange
  std::array<StepTimePrediction, kNumStepExchanges> all;
  const StepTimePrediction& native() const { return all[static_cast<int>(exchange)]; }
};

// PredictAllExchanges and NativeExchange; errors as PredictStepTime's.
absl::StatusOr<StepTimeReport> ReportStepTime(Strategy strategy, const Plan& plan,
                                              const ModelShape& shape, int32_t layers,
                                              const ClusterSpec& cluster,
                                              absl::string_view cluster_name = "");

// What a caller asks the step-time model for (PlanRequest's cluster fields,
// the programs' cluster flags).
struct StepTimeOptions {
  std::string cluster_name;  // the preset `cluster` started from; "" for none
  ClusterSpec cluster;       // its ranks_per_node is the request's
  int32_t layers = 1;
  bool per_rank = false;     // report each rank's times too
};

}  // namespace flashcp::core

#endif  // FLASHCP_CORE_STEP_TIME_H_
