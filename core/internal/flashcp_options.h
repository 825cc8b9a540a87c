// flashcp's one options struct: what every stage of the planner
// (flashcp.cc's orchestrator, docs/planner.md) reads, fixed for one plan:
// the caller's PlanOptions and what follows from the batch (the stages'
// tuning: flashcp_tuning.h).
#ifndef FLASHCP_CORE_INTERNAL_FLASHCP_OPTIONS_H_
#define FLASHCP_CORE_INTERNAL_FLASHCP_OPTIONS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "core/internal/flashcp_tuning.h"
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

  // The stages' tuning is flashcp_tuning.h's; these names of it are kept
  // for code written against them.
  static constexpr const auto& kScales = internal::kScales;
  static constexpr const auto& kMoreScales = internal::kMoreScales;
  static constexpr size_t kMaxFallbacks = internal::kMaxFallbacks;
  static constexpr size_t kMaxRecuts = internal::kMaxRecuts;
  static constexpr int32_t kRecutRounds = internal::kRecutRounds;
  static constexpr const auto& kGroupBounds = internal::kGroupBounds;
  static constexpr const auto& kFilledGroups = internal::kFilledGroups;
  static constexpr int32_t kBalancePartners = internal::kBalancePartners;
  static constexpr double kBalanceReach = internal::kBalanceReach;
  static constexpr int32_t kBalanceMoves = internal::kBalanceMoves;
  static constexpr int32_t kSwapsPerRank = internal::kSwapsPerRank;

  static FlashCpOptions For(const Batch& batch, const PlanOptions& options);
};

}  // namespace flashcp::core::internal

#endif  // FLASHCP_CORE_INTERNAL_FLASHCP_OPTIONS_H_
