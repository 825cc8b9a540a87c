// The two-level scheme (issue 27; docs/benchmarks.md "With MHA"): for a rank
// group spanning several nodes, Ulysses within each node and a targeted KV
// exchange across nodes. Each node's part of the group (the group's ranks on
// that node, P of them on every node it spans) runs the all-to-all among
// itself (AllToAllTraffic: Q, K, V in, O out; position j of the part then
// holds every token of the node's part for its query heads and kv_j KV
// heads, AllToAllGroupHeads(P)); across nodes, position j of node b sends
// position j of node b' the KV (its kv_j heads) of the tokens of node b that
// queries on node b' attend to: of each document, node b's tokens before the
// last position the document has on node b'. Attention then runs on whole
// node parts with those prefixes staged. Pure.
#ifndef FLASHCP_CORE_TWO_LEVEL_H_
#define FLASHCP_CORE_TWO_LEVEL_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/analysis.h"
#include "core/rank_groups.h"
#include "core/types.h"

namespace flashcp::core {

// A run of one document's positions [start, start + len).
struct DocRun {
  int32_t doc = 0;
  int64_t start = 0;
  int64_t len = 0;
  friend bool operator==(const DocRun&, const DocRun&) = default;
};
// runs[a][b]: the tokens node part a sends node part b (parts in node order),
// the KV node b's queries need from node a, documents ascending and each's
// runs by start (the order the exchange carries them in: the analyzer counts
// these runs, the engine and flashcp.torch move them); need[a][b] their
// token count.
struct TwoLevelParts {
  std::vector<std::vector<int32_t>> parts;  // the group's ranks per node, ascending
  std::vector<std::vector<int64_t>> need;   // [part][part], tokens; 0 on the diagonal
  std::vector<std::vector<std::vector<DocRun>>> runs;  // [part][part]; empty on the diagonal
};
// The group's node parts and their cross-node needs. FailedPrecondition
// naming ranks_per_node where the group spans one node (the scheme is the
// all-to-all there) or none is set, or its parts differ in size (the
// same-position exchange needs equal parts). `ranks` ascending, a union of
// the plan's rank groups.
absl::StatusOr<TwoLevelParts> TwoLevelNeeds(const Plan& plan, const std::vector<int32_t>& ranks,
                                            int32_t ranks_per_node);

// One phase of `ranks` running the two-level scheme, per position of
// `ranks`, in bytes (as GroupSchemePhase): sent = the node all-to-all's
// rows + inter-node rows, where position j of part a sends
//   2 kv_j sum_b need[a][b]  rows (head rows of D x dtype bytes)
// and receives 2 kv_j sum_b need[b][a]; inter_* are those cross-node rows.
// `metrics` = AnalyzePlan(plan, shape, ranks_per_node). FailedPrecondition
// as TwoLevelNeeds, or naming query_heads where P does not divide Hq.
absl::StatusOr<GroupPhaseBytes> TwoLevelGroupPhase(const Plan& plan, const PlanMetrics& metrics,
                                                   const std::vector<int32_t>& ranks,
                                                   const ModelShape& shape,
                                                   int32_t ranks_per_node);

}  // namespace flashcp::core

#endif  // FLASHCP_CORE_TWO_LEVEL_H_
