// flashcp's grouped stage (docs/planner.md, "Least KV moved"): plans in
// which each document too heavy to keep whole is zigzagged over the
// smallest group of the least-loaded ranks that carry its workload within a
// bound, so that groups of different documents seldom share a rank (BASP's
// batch-aware grouping, ../shared/paper); the rest are placed whole by
// workload and equalized by heads (WholeDocPieces). A rank then receives
// about one document's prefix, not a share of every long document's, and
// sends its pieces to c - 1 ranks, not N - 1. A group's rank p takes chunks
// p and 2c-1-p, so the head and the tail share a rank (the one that needs
// the longest prefix needs no head from elsewhere).
#ifndef FLASHCP_CORE_INTERNAL_FLASHCP_GROUPED_H_
#define FLASHCP_CORE_INTERNAL_FLASHCP_GROUPED_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "core/internal/flashcp_judge.h"
#include "core/internal/flashcp_options.h"
#include "core/internal/flashcp_tuning.h"
#include "core/types.h"

namespace flashcp::core::internal {

// The grouped pieces of one variant: documents whose whole workload exceeds
// `group_bound` (longest first; so a prefix of `order`) zigzagged over
// groups (the fewest least-loaded ranks that each take their share within
// `group_bound` pairs and their room; within one node of `ranks_per_node`
// where one has enough such ranks), the rest Whole-Doc with `rho`. Appends
// to `out`; false where some group cannot be found or its zigzag chunks
// would be shorter than `m`.
//
// With small_share > 0 (filled: kRankBands' filled_groups), a rank's load is
// projected as its pairs plus its free tokens at the density (pairs per
// token) of the small documents (at most small_share x group_bound pairs
// each, left to Whole-Doc): a rank holding a group's few dense tokens must still take its
// share of light ones. Every heavier document, longest first, then goes
// whole to the rank of least projected load with room for it where that
// keeps it within group_bound projected, else over a group chosen and sized
// by projected load (without the projection where none fits with it).
// Unfilled, the groups' ranks end near the bound with most of their tokens
// free, and the documents kept whole, placed after them by workload alone,
// then push them over it.
//
// Where `workload` is not null it receives each rank's workload (SPEC Eq. 3
// pairs) of the pieces appended, as their placement tracked it: the sums
// the grouped stage's candidates track the same way and tell most candidates
// over the target from (ImbalanceCertainlyOver); tests check them here.
bool GroupedPieces(const Batch& batch, const std::vector<int32_t>& order, double group_bound,
                   double rho, int64_t m, int32_t ranks_per_node, double small_share,
                   std::vector<Shard>& out, std::vector<double>* workload = nullptr);

// The grouped stage's (bound, small share) variants at N ranks: the group
// bound is `bound` x R x mean workload; where kRankBands says filled, the
// filled groups (small share > 0, kFilledGroups), at bounds nearer R, else
// kGroupBounds unfilled.
std::vector<std::pair<double, double>> GroupedVariants(int32_t n);

// The grouped stage's generator (flashcp_stages.h): over the first
// at.variants group bounds and small shares (GroupedVariants) and every rho
// scale (kScales), the grouped pieces, cut pieces shorter than the minimum
// shard repaired (RepairSlivers within R x mean), offered to `judge` with
// their tracked per-rank workload. The stop token's status once it says
// stop.
absl::Status GroupedCandidates(const Batch& batch, const FlashCpOptions& options,
                               const RankBand& band, const StageAtN& at, CandidateJudge& judge);

}  // namespace flashcp::core::internal

#endif  // FLASHCP_CORE_INTERNAL_FLASHCP_GROUPED_H_
