// flashcp's opt-in measure (issue 29, "The planner's measure"): plan several
// variants of flashcp through MakePlan and keep the one of least predicted
// step time (core/step_time.h), the imbalance target kept as a guard. A
// wrapper around the planner, so that flashcp's stages and the plans of every
// request that does not ask for it stay exactly as they are.
#ifndef FLASHCP_CORE_STEP_CHOICE_H_
#define FLASHCP_CORE_STEP_CHOICE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "core/analysis.h"
#include "core/step_time.h"
#include "core/strategies.h"
#include "core/types.h"

namespace flashcp::core {

struct StepChoice {
  Plan plan;
  StepTimeReport report;  // of `plan`
  std::string variant;    // which candidate won (kStepChoiceVariants)
  int32_t candidates = 0; // planned
  int32_t eligible = 0;   // within the guard
};

// The candidates, in order (the first is flashcp as asked; a tie keeps the
// earlier one):
//   "flashcp": MakePlan(kFlashCp, batch, options);
//   "flashcp_cost": the same, balancing the cluster's compute profile
//     (options.cost = cluster.compute) instead of pairs; skipped when options
//     already name a cost model;
//   "flashcp_tight": target 1 + (R - 1) / 2 (more balance, more exchange);
//   "flashcp_coarse": min_shard_tokens 1024 (fewer short shards);
//   "flashcp_flat": ranks_per_node 0 (no node grouping; planned as one node,
//     predicted on the cluster); skipped when options have no nodes;
//   "flashcp_fine": min_shard_tokens 0 (the minimum-shard rule off);
//   "flashcp_paper", "whole_doc", "per_doc": those planners at R (Algorithm
//     1, its Whole-Doc stage, and its Per-Doc extreme).
// Guard: a candidate is eligible when its workload imbalance (SPEC Eq. 3)
// or its predicted compute imbalance (max / mean of the ranks' compute under
// the cluster's profile) is at most max(R, the first candidate's); the first
// always is. Each is predicted with the exchange flashcp runs
// (NativeExchange(kFlashCp): the faster of allgather and targeted).
// Errors: MakePlan's (options.stop's status once it says stop, asked before
// each candidate) and ReportStepTime's.
absl::StatusOr<StepChoice> PlanFlashCpByStepTime(const Batch& batch, const PlanOptions& options,
                                                 const ModelShape& shape,
                                                 const StepTimeOptions& step);

}  // namespace flashcp::core

#endif  // FLASHCP_CORE_STEP_CHOICE_H_
