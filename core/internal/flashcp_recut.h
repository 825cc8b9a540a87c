// flashcp's re-cut stage (docs/planner.md, "Re-cut"): where no repaired
// candidate is free of slivers within R, the cut points of a few candidates
// are moved by linear programming (RecutPieces, recut.h).
#ifndef FLASHCP_CORE_INTERNAL_FLASHCP_RECUT_H_
#define FLASHCP_CORE_INTERNAL_FLASHCP_RECUT_H_

#include <vector>

#include "core/internal/flashcp_options.h"
#include "core/internal/flashcp_search.h"
#include "core/types.h"

namespace flashcp::core::internal {

// Where the trouble is the cut points (a reduced zigzag fitted to the ranks'
// rooms by shifts that ignore workload; a Whole-Doc head sized to a token
// deficit), moving them can fix both: RecutPieces keeps each piece on its
// rank and in its place in the document and solves for cut points that give
// every rank its tokens, every piece >= m and the least maximum workload.
// Tried on kMaxRecuts of `candidates` (sorted by Better): first those that
// missed R (they have no sliver; least imbalanced first), then those that
// met R but kept a sliver through their repair (in score order, the winner
// too; they seldom gain), and on every document Per-Doc in reduced zigzags
// over consecutive ranks, not fitted (the program sets the tokens). A
// re-cut plan replaces `plan` (the repaired winner) only if it meets R and
// is Better than it with its slivers charged (sliver_cost non-last tokens
// each): a sliver costs less than much more communication.
Plan RecutCandidates(const Batch& batch, const FlashCpOptions& options, CompactedSearch& search,
                     const std::vector<SearchCandidate>& candidates, Plan plan);

}  // namespace flashcp::core::internal

#endif  // FLASHCP_CORE_INTERNAL_FLASHCP_RECUT_H_
