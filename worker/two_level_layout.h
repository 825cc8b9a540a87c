// One rank's layout under the two-level scheme (core/two_level.h): for a rank
// group spanning several nodes in equal parts, the all-to-all within the
// rank's node part (CpRankLayout::a2a over the part, BuildAllToAllPartLayout:
// the part's tokens in head-parallel rows by (document, position)), then,
// across nodes, the KV of the runs core::TwoLevelNeeds names (the analyzer's
// own runs: node a's tokens of each document before the last position the
// document has on node b) between same-position ranks, and attention on the
// part's tokens with those prefixes staged.
//
// The CpRankLayout's KV-row fields describe the exchange across nodes in
// head-parallel rows of this position's KV heads ([K | V] of kv_j heads):
// pack_rows (head-parallel rows sent, per peer in part order), sends, recvs
// (peers: the same position of each other part; zero-row messages omitted),
// recv_rows, back_first, back_rows; and the attention batches over the
// head-parallel rows: whole_* (runs of a document's consecutive positions on
// the part that start at 0) and prefix_* with stage_src (a head-parallel row,
// or RemoteRow of a received row) and stage_rounds, as for a KV scheme.
// collective is kAllToAll and a2a.two_level is set; CallsExchange is true.
#ifndef FLASHCP_WORKER_TWO_LEVEL_LAYOUT_H_
#define FLASHCP_WORKER_TWO_LEVEL_LAYOUT_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/analysis.h"
#include "core/types.h"
#include "worker/cp_layout.h"

namespace flashcp::worker {

// `group`: a mixed plan's rank group (a union of the plan's rank groups)
// holding `rank`, any order. InvalidArgument for an invalid plan, a rank
// outside it or a group without it; FailedPrecondition as
// core::TwoLevelNeeds (naming ranks_per_node: no nodes, one node, or
// unequal parts).
absl::StatusOr<CpRankLayout> BuildTwoLevelRankLayout(const core::Plan& plan,
                                                     const core::CommLayout& layout,
                                                     int32_t rank, std::vector<int32_t> group,
                                                     int32_t ranks_per_node);

}  // namespace flashcp::worker

#endif  // FLASHCP_WORKER_TWO_LEVEL_LAYOUT_H_
