// The repair stage (flashcp_repair.h): the search winner's and the
// fallback candidates' slivers repaired (flashcp_slivers.h).
#include "core/internal/flashcp_repair.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <tuple>
#include <utility>

#include "core/internal/strategies_internal.h"

namespace flashcp::core::internal {

Plan RepairCandidate(const Batch& batch, const FlashCpOptions& options, std::vector<Shard> pieces,
                     const PlanScore& score) {
  if (options.min_shard > 1 && score.slivers > 0) {
    Plan repaired = FinishPlan(batch, RepairSlivers(batch, pieces, options.min_shard,
                                                    options.max_work, options.sliver_cost));
    if (score.imbalance > options.target || ScorePlan(repaired).imbalance <= options.target) {
      return repaired;
    }
  }
  return FinishPlan(batch, std::move(pieces));
}

std::optional<Plan> RepairFallback(const Batch& batch, const FlashCpOptions& options,
                                   CompactedSearch& search,
                                   const std::vector<SearchCandidate>& candidates,
                                   const WinnerKey& winner) {
  std::optional<Plan> found;
  PlanScore found_score;
  size_t repairs = 0;
  for (size_t i = 0; i < candidates.size() && repairs < kMaxFallbacks; ++i) {
    const SearchCandidate& c = candidates[i];
    if (c.score.imbalance > options.target) break;  // sorted: the rest miss R too
    if (c.k == winner.k && c.reduced == winner.reduced && c.pieces.size() == winner.pieces &&
        SameScore(c.score, winner.score)) {
      continue;  // costs no repair slot
    }
    ++repairs;
    Plan other = RepairCandidate(batch, options,
                                 search.Assemble(c.pieces, c.placement, c.k, c.reduced), c.score);
    if (CountSlivers(other, options.min_shard) > 0) continue;
    const PlanScore score = ScorePlan(other);
    if (score.imbalance > options.target) continue;
    if (!found.has_value() || Better(score, found_score, options.target, options.sliver_cost)) {
      found = std::move(other);
      found_score = score;
    }
  }
  return found;
}

}  // namespace flashcp::core::internal
