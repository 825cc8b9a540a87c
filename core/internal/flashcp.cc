// FlashCP, our planner (docs/planner.md), as stages over one options struct
// (FlashCpOptions, flashcp_options.h):
//  1. search (flashcp_search.h): Whole-Doc placement steered by rho with
//     whole-document moves, the k longest documents Per-Doc (the fewest that
//     balance, found by search), candidates scored (flashcp_score.h) on
//     imbalance, then the compacted all-gather, then cuts;
//  2. repair (flashcp_repair.h): the minimum-shard rule's repair of the
//     winner and, if that fails, of other candidates;
//  3. re-cut (flashcp_recut.h): their cut points moved by linear
//     programming;
//  4. grouped plans (flashcp_grouped.h), which replace the compacted one
//     where they move less KV under the cheaper exchange;
//  5. role swaps (flashcp_roles.h): which of a cut document's ranks holds
//     which of its pieces, so that the heads and tails of different
//     documents land on different ranks;
//  6. post-passes over the final plan (PlanFlashCp): from 9 to 32 ranks
//     chunk-heap candidates (flashcp_kv.h), beyond 8 ranks density fills
//     (flashcp_kvfill.h), then at every N >= 3 capacity-group candidates
//     (flashcp_kvgroups.h), each where it moves less;
//  7. node placement (flashcp_nodes.h), last: the ranks relabeled so that
//     those exchanging most share a node (ranks_per_node), which moves
//     nothing else.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "core/internal/flashcp_grouped.h"
#include "core/internal/flashcp_kv.h"
#include "core/internal/flashcp_kvfill.h"
#include "core/internal/flashcp_kvgroups.h"
#include "core/internal/flashcp_nodes.h"
#include "core/internal/flashcp_options.h"
#include "core/internal/flashcp_recut.h"
#include "core/internal/flashcp_repair.h"
#include "core/internal/flashcp_roles.h"
#include "core/internal/flashcp_score.h"
#include "core/internal/flashcp_search.h"
#include "core/internal/strategies_internal.h"
#include "core/status_macros.h"

namespace flashcp::core::internal {
namespace {

bool HasSliver(const Plan& plan, int64_t m) { return CountSlivers(plan, m) > 0; }


// Stages 1-3: the plan of least compacted all-gather within R.
absl::StatusOr<Plan> CompactedPlan(const Batch& batch, const FlashCpOptions& options) {
  const int64_t m = options.min_shard;
  // Search: the best candidate over k, repaired.
  CompactedSearch search(batch, options);
  FLASHCP_RETURN_IF_ERROR(search.FindBoundary());
  SearchCandidate best = search.TakeBest();
  const WinnerKey winner{best.k, best.reduced, best.pieces.size(), best.score};
  Plan plan = RepairCandidate(
      batch, options, search.Assemble(std::move(best.pieces), best.placement, best.k, best.reduced),
      best.score);
  if (m <= 1 || !HasSliver(plan, m) || winner.score.imbalance > options.target) return plan;
  // No plan free of slivers meets R (the margin absorbs the sums' rounding):
  // the fallback below could not succeed, so it is not tried.
  if (SliverFreeWorkloadBound(batch, m) > options.max_work * (1 + 1e-9)) return plan;
  // Fallback, rare (the winner keeps a cut piece shorter than m that its
  // repair could not remove): more candidates near the winner's k, the best
  // of a few repaired, else a few re-cut; other batches pay nothing.
  FLASHCP_ASSIGN_OR_RETURN(std::vector<SearchCandidate> candidates,
                           search.FallbackCandidates(winner.k));
  std::stable_sort(candidates.begin(), candidates.end(),
                   [&](const SearchCandidate& x, const SearchCandidate& y) {
                     return Better(x.score, y.score, options.target, options.sliver_cost);
                   });
  std::optional<Plan> repaired = RepairFallback(batch, options, search, candidates, winner);
  if (repaired.has_value()) return *std::move(repaired);
  FLASHCP_RETURN_IF_ERROR(options.CheckStop());
  return RecutCandidates(batch, options, search, candidates, std::move(plan));
}

// Stages 4 and 5: `compacted`, or a grouped plan where that moves less, its
// roles swapped. Where a grouped plan won, the compacted one's roles are
// swapped too, and the one moving less under its cheaper exchange (then
// under the all-gather) is kept.
absl::StatusOr<Plan> LeastMovedPlan(const Batch& batch, const FlashCpOptions& options,
                                    Plan compacted) {
  const int32_t n = batch.cp_size;
  if (n <= 2) return compacted;  // at N = 2 a cut document moves the same either way
  const PlanScore score = ScorePlan(compacted);
  if (score.cut_docs == 0) return compacted;  // nothing is exchanged to begin with
  FLASHCP_ASSIGN_OR_RETURN(std::optional<Plan> grouped,
                           BestGroupedPlan(batch, options, compacted, score));
  // At most kSwapsPerRank x N swaps per plan (each O(roles of the
  // bottleneck rank x ranks of their documents)).
  const int32_t max_swaps = FlashCpOptions::kSwapsPerRank * n;
  if (!grouped.has_value()) {
    return SwapRolesForTargeted(batch, compacted, options.max_work, max_swaps);
  }
  Plan swapped = SwapRolesForTargeted(batch, *grouped, options.max_work, max_swaps);
  Plan other = SwapRolesForTargeted(batch, compacted, options.max_work, max_swaps);
  const Exchange a = Measure(swapped, ScorePlan(swapped));
  const Exchange b = Measure(other, ScorePlan(other));
  if (b.cheaper() < a.cheaper() || (b.cheaper() == a.cheaper() && b.allgather < a.allgather)) {
    return other;
  }
  return swapped;
}

}  // namespace

absl::StatusOr<Plan> PlanFlashCpCompacted(const Batch& batch, const PlanOptions& plan_options) {
  return CompactedPlan(batch, FlashCpOptions::For(batch, plan_options));
}

absl::StatusOr<Plan> PlanFlashCp(const Batch& batch, const PlanOptions& plan_options) {
  const FlashCpOptions options = FlashCpOptions::For(batch, plan_options);
  FLASHCP_ASSIGN_OR_RETURN(Plan plan, CompactedPlan(batch, options));
  FLASHCP_ASSIGN_OR_RETURN(plan, LeastMovedPlan(batch, options, std::move(plan)));
  // Stage 6, post-passes over the final plan: each takes and returns the
  // whole plan, keeping every rank's tokens. Add them here, in order.
  // From 9 to kChunkHeapMaxRanks ranks, chunk-heap candidates where they
  // move less (flashcp_kv.h).
  FLASHCP_ASSIGN_OR_RETURN(plan, PreferLeastKv(batch, options, std::move(plan)));
  // Beyond 8 ranks, density fills where they move less (flashcp_kvfill.h).
  FLASHCP_ASSIGN_OR_RETURN(plan, PreferKvFill(batch, options, std::move(plan)));
  // Capacity groups where they move less (flashcp_kvgroups.h).
  FLASHCP_ASSIGN_OR_RETURN(plan, PreferKvGroups(batch, options, std::move(plan)));
  // Stage 7, last: ranks placed on nodes (flashcp_nodes.h).
  return PlaceRanksOnNodes(std::move(plan), options.ranks_per_node, plan_options.rank_speed);
}

}  // namespace flashcp::core::internal
