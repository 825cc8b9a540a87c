// flashcp's node placement (docs/planner.md, "Topology"), its last stage:
// which of a plan's ranks share a node. Every rank of a plan holds C/N
// tokens and, without rank speeds, the same workload budget, so giving rank
// r's shards to rank pi(r) for a permutation pi is an equally valid, equally
// balanced plan: each rank's workload, non-last tokens and targeted sends
// and receives move with its shards, so the imbalance and every scheme's
// phase bottleneck are unchanged. Only which pairs of ranks share a node
// changes, and with it the targeted exchange's inter-node bytes (rank r is on
// node r / ranks_per_node, core::AnalyzePlan's rule), which this stage
// lowers.
//
// Only the ranks' real token counts tell them apart (padding sits on the
// last ranks, core/types.h): a relabeling maps ranks to ranks of the same
// count. With rank speeds that differ (PlanOptions::rank_speed), rank r's
// budget is its own, so ranks are not interchangeable and nothing is
// relabeled.
#ifndef FLASHCP_CORE_INTERNAL_FLASHCP_NODES_H_
#define FLASHCP_CORE_INTERNAL_FLASHCP_NODES_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "core/internal/flashcp_tuning.h"
#include "core/types.h"

namespace flashcp::core::internal {

// One phase's targeted tokens between ranks on different nodes (node of rank
// r: r / ranks_per_node; 0 or >= N: one node), summed over ranks, from
// `pair_tokens` (core::TargetedPairTokens) and a rank count N: core::AnalyzePlan's
// targeted inter_node_bytes / (2 H D dtype).
int64_t InterNodeTokens(absl::Span<const int64_t> pair_tokens, int32_t cp_size,
                        int32_t ranks_per_node);

// The relabeling PlaceRanksOnNodes applies: rank r of `plan` becomes rank
// new_rank[r]. It maps each rank to one of the same real token count, and
// its inter-node tokens (InterNodeTokens of the relabeled plan) are never
// above `plan`'s: the identity where no relabeling found moves less, and
// where ranks_per_node is 0 or >= N. A node is ranks [k P, (k + 1) P) for
// P = ranks_per_node; where P does not divide N the last node holds the
// N mod P ranks left (AnalyzePlan's rule), and placement works the same.
// Search: two starts, the plan's own nodes and nodes filled greedily by
// pair traffic (a node's first two ranks the heaviest pair that fits, then
// the rank exchanging most with those already there), each improved by
// Kernighan-Lin passes of rank swaps between nodes: a pass swaps, best
// first and each rank once, until kNodePlacementStall swaps after its best
// prefix (at most N / 2), and keeps that prefix; at most
// kNodePlacementPasses passes, and one that gains nothing ends them. The
// start that ends lower wins, the plan's own on a tie. Deterministic (ties
// to the lowest rank ids). O(N^2) per swap, plus TargetedPairTokens. `plan`
// must be valid (ValidatePlan; not checked); ranks_per_node >= 0.
std::vector<int32_t> NodePlacement(const Plan& plan, int32_t ranks_per_node);

// `plan` with rank r's shards given to rank new_rank[r], each rank's shards
// in their order: valid where `plan` is and `new_rank` is a permutation
// mapping ranks to ranks of the same real token count (not checked).
Plan RelabelRanks(const Plan& plan, absl::Span<const int32_t> new_rank);

// The stage: `plan` relabeled by NodePlacement, or `plan` itself where
// `rank_speed` (PlanOptions::rank_speed) is non-empty and not all equal.
Plan PlaceRanksOnNodes(Plan plan, int32_t ranks_per_node, absl::Span<const double> rank_speed);

}  // namespace flashcp::core::internal

#endif  // FLASHCP_CORE_INTERNAL_FLASHCP_NODES_H_
