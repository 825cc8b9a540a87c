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

namespace {

// RepairCandidate; where `only_clear`, nullopt where its plan would
// certainly keep a sliver (RepairAllSlivers: the repaired plan keeps one,
// and so do the pieces as given).
std::optional<Plan> Repaired(const Batch& batch, const FlashCpOptions& options,
                             std::vector<Shard> pieces, const PlanScore& score,
                             RepairScratch& scratch, bool only_clear) {
  if (options.min_shard > 1 && score.slivers > 0) {
    std::optional<std::vector<Shard>> fixed =
        only_clear ? RepairAllSlivers(batch, pieces, options.min_shard, options.max_work,
                                      options.sliver_cost, scratch)
                   : RepairSlivers(batch, pieces, options.min_shard, options.max_work,
                                   options.sliver_cost, scratch);
    if (!fixed.has_value()) return std::nullopt;
    Plan repaired = FinishPlan(batch, *std::move(fixed));
    if (score.imbalance > options.target || ScorePlan(repaired).imbalance <= options.target) {
      return repaired;
    }
  }
  return FinishPlan(batch, std::move(pieces));
}

}  // namespace

Plan RepairCandidate(const Batch& batch, const FlashCpOptions& options, std::vector<Shard> pieces,
                     const PlanScore& score) {
  RepairScratch scratch;
  return *Repaired(batch, options, std::move(pieces), score, scratch, false);
}

std::optional<Plan> RepairFallback(const Batch& batch, const FlashCpOptions& options,
                                   CompactedSearch& search,
                                   const std::vector<SearchCandidate>& candidates,
                                   const WinnerKey& winner) {
  std::optional<Plan> found;
  PlanScore found_score;
  RepairScratch scratch;
  size_t repairs = 0;
  for (size_t i = 0; i < candidates.size() && repairs < kMaxFallbacks; ++i) {
    const SearchCandidate& c = candidates[i];
    if (c.score.imbalance > options.target) break;  // sorted: the rest miss R too
    if (c.k == winner.k && c.reduced == winner.reduced && c.pieces.size() == winner.pieces &&
        SameScore(c.score, winner.score)) {
      continue;  // costs no repair slot
    }
    ++repairs;
    // As Repaired would find, without assembling the candidate.
    if (options.min_shard > 1 && c.score.slivers > 0 &&
        search.PerDocKeepsSlivers(c.k, c.reduced)) {
      continue;
    }
    std::optional<Plan> repaired =
        Repaired(batch, options, search.Assemble(c.pieces, c.placement, c.k, c.reduced), c.score,
                 scratch, true);
    if (!repaired.has_value() || CountSlivers(*repaired, options.min_shard) > 0) continue;
    Plan& other = *repaired;
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
