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
//  4-7. the candidate stages (flashcp_stages.h, one table; which run at
//     which N: kRankBands in flashcp_tuning.h), each generating raw
//     candidates that one judge (flashcp_judge.h) keeps where they move
//     less: grouped plans (flashcp_grouped.h; the winner's and the
//     compacted plan's roles swapped, flashcp_roles.h), chunk heaps
//     (flashcp_kv.h), density fills (flashcp_kvfill.h), capacity groups
//     (flashcp_kvgroups.h);
//  8. node placement (flashcp_nodes.h), last: the ranks relabeled so that
//     those exchanging most share a node (ranks_per_node), which moves
//     nothing else.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "core/internal/flashcp_nodes.h"
#include "core/internal/flashcp_options.h"
#include "core/internal/flashcp_recut.h"
#include "core/internal/flashcp_repair.h"
#include "core/internal/flashcp_score.h"
#include "core/internal/flashcp_search.h"
#include "core/internal/flashcp_stages.h"
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

}  // namespace

absl::StatusOr<Plan> PlanFlashCpCompacted(const Batch& batch, const PlanOptions& plan_options) {
  return CompactedPlan(batch, FlashCpOptions::For(batch, plan_options));
}

absl::StatusOr<Plan> PlanFlashCp(const Batch& batch, const PlanOptions& plan_options) {
  const FlashCpOptions options = FlashCpOptions::For(batch, plan_options);
  FLASHCP_ASSIGN_OR_RETURN(Plan plan, CompactedPlan(batch, options));
  // Stages 4 to 7, in the table's order, each keeping every rank's tokens
  // (which run at which N: kRankBands).
  for (const Stage& stage : Stages()) {
    FLASHCP_ASSIGN_OR_RETURN(plan, RunStage(stage, batch, options, std::move(plan)));
  }
  // Stage 8, last: ranks placed on nodes (flashcp_nodes.h).
  return PlaceRanksOnNodes(std::move(plan), options.ranks_per_node, plan_options.rank_speed);
}

}  // namespace flashcp::core::internal
