// FlashCP, our planner (docs/planner.md): Whole-Doc placement steered by rho
// with whole-document moves, a Per-Doc fallback for the documents too long to
// balance (the fewest, found by search), the minimum-shard rule (with a
// repair of the winner and, if that fails, of other candidates, then a
// re-cut of their cut points by linear programming), and a small
// candidate search scored on imbalance, then communication, then cuts.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "core/internal/flashcp_options.h"
#include "core/internal/flashcp_recut.h"
#include "core/internal/flashcp_repair.h"
#include "core/internal/flashcp_score.h"
#include "core/internal/flashcp_search.h"
#include "core/internal/strategies_internal.h"
#include "core/status_macros.h"

namespace flashcp::core::internal {
namespace {

bool HasShortCut(const Plan& plan, int64_t m) { return CountShortCuts(plan, m) > 0; }

}  // namespace

absl::StatusOr<Plan> PlanFlashCpCompacted(const Batch& batch, const PlanOptions& plan_options) {
  const FlashCpOptions options = FlashCpOptions::For(batch, plan_options);
  const int64_t m = options.min_shard;
  // Search: the best candidate over k, repaired.
  CompactedSearch search(batch, options);
  FLASHCP_RETURN_IF_ERROR(search.FindBoundary());
  SearchCandidate best = search.TakeBest();
  const WinnerKey winner{best.k, best.reduced, best.pieces.size(), best.score};
  Plan plan = RepairCandidate(
      batch, options, search.Assemble(std::move(best.pieces), best.placement, best.k, best.reduced),
      best.score);
  if (m <= 1 || !HasShortCut(plan, m) || winner.score.imbalance > options.target) return plan;
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
                     return Better(x.score, y.score, options.target, options.short_cost);
                   });
  std::optional<Plan> repaired = RepairFallback(batch, options, search, candidates, winner);
  if (repaired.has_value()) return *std::move(repaired);
  FLASHCP_RETURN_IF_ERROR(options.CheckStop());
  return RecutCandidates(batch, options, search, candidates, std::move(plan));
}

}  // namespace flashcp::core::internal
