#include "core/internal/flashcp_recut.h"

#include <utility>

#include "core/internal/flashcp_score.h"
#include "core/internal/per_doc.h"
#include "core/internal/recut.h"
#include "core/internal/strategies_internal.h"

namespace flashcp::core::internal {

Plan RecutCandidates(const Batch& batch, const FlashCpOptions& options, CompactedSearch& search,
                     const std::vector<SearchCandidate>& candidates, Plan plan) {
  const int64_t m = options.min_shard;
  PlanScore plan_score = ScorePlan(plan);
  plan_score.slivers = CountSlivers(plan, m);
  const auto recut = [&](std::vector<Shard> pieces) {
    // The margin absorbs the workload sums' rounding.
    if (!RecutPieces(batch, pieces, m, kRecutRounds,
                     options.max_work * (1 + 1e-9))) {
      return;
    }
    Plan other = FinishPlan(batch, std::move(pieces));
    const PlanScore score = ScorePlan(other);
    // RecutPieces keeps every piece >= m, so `other` has no sliver.
    if (score.imbalance > options.target ||
        !Better(score, plan_score, options.target, options.sliver_cost)) {
      return;
    }
    plan = std::move(other);
    plan_score = score;
  };
  size_t recuts = 0;
  for (const bool missed_r : {true, false}) {
    for (size_t i = 0; i < candidates.size() && recuts < kMaxRecuts; ++i) {
      const SearchCandidate& c = candidates[i];
      if ((c.score.imbalance > options.target) != missed_r) continue;
      ++recuts;
      recut(search.Assemble(c.pieces, c.placement, c.k, c.reduced));
    }
  }
  recut(PerDocPieces(batch, options.order, m));
  return plan;
}

}  // namespace flashcp::core::internal
