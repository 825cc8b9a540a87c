// flashcp's one options struct: what every stage of the planner
// (flashcp.cc's orchestrator, docs/planner.md) reads, fixed for one plan:
// the caller's PlanOptions, what follows from the batch, and the stages'
// bounds.
#ifndef FLASHCP_CORE_INTERNAL_FLASHCP_OPTIONS_H_
#define FLASHCP_CORE_INTERNAL_FLASHCP_OPTIONS_H_

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "core/strategies.h"
#include "core/types.h"

namespace flashcp::core::internal {

struct FlashCpOptions {
  // From PlanOptions.
  double target = PlanOptions{}.target_imbalance;      // R, the imbalance target
  int64_t min_shard = PlanOptions{}.min_shard_tokens;  // m (0: off)
  int32_t ranks_per_node = 0;
  // PlanOptions::stop, not copied (a check may keep state); it must outlive
  // this struct. Null: never stops.
  const StopToken* stop = nullptr;
  absl::Status CheckStop() const { return stop != nullptr ? stop->Check() : absl::OkStatus(); }

  // From the batch.
  std::vector<int32_t> order;  // documents longest first (DocsLongestFirst)
  std::vector<int64_t> targets;  // per-rank tokens (RankTargets)
  double total_work = 0;       // SPEC Eq. 3 pairs of the whole batch
  double mean_work = 0;        // total_work / N
  double max_work = 0;         // R * mean_work: the most a rank may carry
  // Density scale of the workload that token equalization moves: a median
  // document's workload per token, (L + 1) / 2 pairs.
  double median_density = 0;
  // What one sliver left in a plan is worth in non-last tokens
  // (Better's charge): 8m.
  int64_t sliver_cost = 0;

  // Search: rho / median_density per Whole-Doc variant; the fallback also
  // tries the ones between.
  static constexpr std::array<double, 4> kScales = {0.0, 0.5, 1.0, 2.0};
  static constexpr std::array<double, 4> kMoreScales = {0.25, 0.75, 1.5, 3.0};
  // Fallback: candidates repaired, then re-cut, and re-cut rounds of each.
  static constexpr size_t kMaxFallbacks = 5;
  static constexpr size_t kMaxRecuts = 3;
  static constexpr int32_t kRecutRounds = 8;
  // Grouped plans (flashcp_grouped.h): group bounds as fractions of R * mean
  // (a smaller bound: larger groups, better balance, more to move).
  static constexpr std::array<double, 4> kGroupBounds = {1.0, 0.85, 0.7, 0.55};
  // Beyond 8 ranks, where groups are filled (a rank's free tokens projected
  // at the small documents' density, flashcp_grouped.h): (bound, small
  // share) per variant, bounds nearer R, a document being small where it
  // weighs at most the share x the bound (then left to Whole-Doc).
  static constexpr std::array<std::pair<double, double>, 4> kFilledGroups = {
      {{1.0, 0.1}, {0.97, 0.1}, {0.93, 0.1}, {1.0, 0.2}}};
  // Balancing exchanges (flashcp_roles.h) beyond 8 ranks: the lightest ranks
  // tried, the imbalance / R a candidate is balanced from, and the moves per
  // plan (each call up to 2N), the planning-time budget.
  static constexpr int32_t kBalancePartners = 4;
  static constexpr double kBalanceReach = 1.05;
  static constexpr int32_t kBalanceMoves = 512;
  // Role swaps: at most this many times N per plan.
  static constexpr int32_t kSwapsPerRank = 1;

  static FlashCpOptions For(const Batch& batch, const PlanOptions& options);
};

}  // namespace flashcp::core::internal

#endif  // FLASHCP_CORE_INTERNAL_FLASHCP_OPTIONS_H_
