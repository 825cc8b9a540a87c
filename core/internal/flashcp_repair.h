// flashcp's repair stage (docs/planner.md, "Minimum shard"): the search
// winner's slivers repaired, else other candidates'; on the primitives of
// flashcp_slivers.h (edits of raw pieces that keep every rank's token count
// and move only cut points or whole documents). Pure functions over plain
// data.
#ifndef FLASHCP_CORE_INTERNAL_FLASHCP_REPAIR_H_
#define FLASHCP_CORE_INTERNAL_FLASHCP_REPAIR_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "core/internal/flashcp_options.h"
#include "core/internal/flashcp_score.h"
#include "core/internal/flashcp_search.h"
#include "core/internal/flashcp_slivers.h"  // the primitives, formerly here
#include "core/types.h"

namespace flashcp::core::internal {

// A candidate's whole plan from its raw `pieces` (CompactedSearch::Assemble)
// and its search score, slivers repaired (RepairSlivers within
// R * mean, each fix raising the maximum non-last tokens by at most
// options.sliver_cost). Every fix keeps each rank within max(R * mean, its
// current maximum), so a plan that met the target still does; should
// rounding of the workload sums ever tip it over, the unrepaired plan is
// kept: the target comes first (docs/planner.md).
Plan RepairCandidate(const Batch& batch, const FlashCpOptions& options, std::vector<Shard> pieces,
                     const PlanScore& score);

// The winner of the search, as the fallback knows it again: by its k,
// Per-Doc mode, piece count and score.
struct WinnerKey {
  size_t k = 0;
  bool reduced = true;
  size_t pieces = 0;
  PlanScore score;
};

// The fallback's repair: of the first kMaxFallbacks distinct `candidates`
// (sorted by Better) that meet R, the winner skipped (rebuilt, it would be
// repaired to the same failure; a different candidate equal in all of
// WinnerKey would be skipped too), the best repaired plan (Better on the
// repaired plans' scores) with no cut piece shorter than m that still meets
// the target; nullopt if none. A candidate whose repair certainly keeps a
// sliver (RepairAllSlivers; for the candidates sharing a Per-Doc part,
// CompactedSearch::PerDocKeepsSlivers, told before it is assembled) takes
// its slot without being repaired: the answer is the same, only cheaper.
std::optional<Plan> RepairFallback(const Batch& batch, const FlashCpOptions& options,
                                   CompactedSearch& search,
                                   const std::vector<SearchCandidate>& candidates,
                                   const WinnerKey& winner);

}  // namespace flashcp::core::internal

#endif  // FLASHCP_CORE_INTERNAL_FLASHCP_REPAIR_H_
