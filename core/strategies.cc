#include "core/strategies.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/analysis.h"
#include "core/echo.h"
#include "core/cost_model.h"
#include "core/internal/recut.h"
#include "core/internal/strategies_internal.h"
#include "core/status_macros.h"

namespace flashcp::core {

absl::string_view StrategyName(Strategy strategy) {
  switch (strategy) {
    case Strategy::kLlama3:
      return "llama3";
    case Strategy::kPerDoc:
      return "per_doc";
    case Strategy::kRing:
      return "ring";
    case Strategy::kZigzag:
      return "zigzag";
    case Strategy::kWholeDoc:
      return "whole_doc";
    case Strategy::kFlashCpPaper:
      return "flashcp_paper";
    case Strategy::kFlashCp:
      return "flashcp";
    case Strategy::kIlp:
      return "ilp";
    case Strategy::kMagi:
      return "magi";
  }
  return "unknown";
}

absl::StatusOr<Strategy> ParseStrategy(absl::string_view name) {
  for (Strategy s : kAllStrategies) {
    if (StrategyName(s) == name) return s;
  }
  std::vector<absl::string_view> names;
  for (Strategy s : kAllStrategies) names.push_back(StrategyName(s));
  return absl::InvalidArgumentError(absl::StrCat("strategy: unknown strategy ", Echo(name), " (",
                                                 absl::StrJoin(names, ", "), ")"));
}

namespace {

absl::StatusOr<Plan> PlanWith(Strategy strategy, const Batch& batch, const PlanOptions& options,
                              PlanInfo* info) {
  switch (strategy) {
    case Strategy::kLlama3:
      return internal::PlanLlama3(batch);
    case Strategy::kPerDoc:
    case Strategy::kZigzag:
      return internal::PlanPerDoc(batch);
    case Strategy::kRing:
      return internal::PlanRing(batch);
    case Strategy::kWholeDoc:
      return internal::PlanWholeDoc(batch);
    case Strategy::kFlashCpPaper:
      return internal::PlanFlashCpPaper(batch, options.target_imbalance);
    case Strategy::kFlashCp:
      return internal::PlanFlashCp(batch, options);
    case Strategy::kIlp:
      return internal::PlanIlp(batch, options.ilp, options.stop, info);
    case Strategy::kMagi:
      return internal::PlanMagi(batch);
  }
  return absl::InvalidArgumentError("strategy: unknown strategy");
}

// The strategies whose cut points are theirs to choose by balance: the
// others' cuts are their definition (equal chunks, zigzags).
bool BalancesOnCost(Strategy strategy) {
  return strategy == Strategy::kWholeDoc || strategy == Strategy::kFlashCpPaper ||
         strategy == Strategy::kFlashCp;
}

// Re-cuts `plan` (internal::RecutPieces: same pieces, ranks and order, cut
// points moved) so that the cost model's heaviest rank is as light as the
// program finds; keeps `plan` unless that lowers the model's maximum.
Plan BalanceOnCost(Strategy strategy, const Batch& batch, Plan plan,
                   const PlanOptions& options) {
  const CostPrediction before = PredictPlanCost(options.cost, plan);
  const double max_before = *std::max_element(before.rank_cost.begin(), before.rank_cost.end());
  // The re-cut keeps every piece of a cut document at >= keep + 1 tokens:
  // flashcp's minimum shard where the plan has none shorter (so it makes no
  // new sliver), 1 for the strategies without the rule.
  int64_t shortest = std::numeric_limits<int64_t>::max();
  {
    std::vector<int32_t> pieces_of(batch.doc_lens.size(), 0);
    for (const Shard& s : plan.shards) ++pieces_of[s.doc];
    for (const Shard& s : plan.shards) {
      if (pieces_of[s.doc] > 1) shortest = std::min(shortest, s.len);
    }
  }
  const int64_t rule = strategy == Strategy::kFlashCp ? options.min_shard_tokens : 1;
  const int64_t keep = std::max<int64_t>(1, std::min(rule, shortest - 1));
  std::vector<Shard> pieces = plan.shards;
  if (!internal::RecutPieces(batch, pieces, keep, kCostRecutRounds,
                             max_before, options.cost)
           .has_value()) {
    return plan;
  }
  return internal::FinishPlan(batch, std::move(pieces));
}

}  // namespace

absl::StatusOr<Plan> MakePlan(Strategy strategy, const Batch& batch, const PlanOptions& options,
                              PlanInfo* info) {
  FLASHCP_RETURN_IF_ERROR(ValidateBatch(batch));
  if (!(options.target_imbalance >= 1.0) || !std::isfinite(options.target_imbalance)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "target_imbalance: must be a finite ratio >= 1, got ", options.target_imbalance));
  }
  if (options.min_shard_tokens < 0 || options.min_shard_tokens > kMaxTokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "min_shard_tokens: must be in [0, 2^40], got ", options.min_shard_tokens));
  }
  FLASHCP_RETURN_IF_ERROR(ValidateRanksPerNode(options.ranks_per_node));
  if (absl::Status s = ValidateCostCoefficients(options.cost); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("cost.", s.message()));
  }
  FLASHCP_RETURN_IF_ERROR(options.stop.Check());
  absl::StatusOr<Plan> plan = PlanWith(strategy, batch, options, info);
  if (plan.ok() && BalancesOnCost(strategy) && !IsPairsModel(options.cost)) {
    FLASHCP_RETURN_IF_ERROR(options.stop.Check());
    plan = BalanceOnCost(strategy, batch, *std::move(plan), options);
  }
  // A stop that came while a short planner ran: the caller no longer wants it.
  if (plan.ok()) FLASHCP_RETURN_IF_ERROR(options.stop.Check());
  return plan;
}

int64_t MaxPlanShards(Strategy strategy, const Batch& batch) {
  const int64_t n = static_cast<int64_t>(batch.doc_lens.size());
  const int64_t ranks = batch.cp_size;
  int64_t per_doc = 0;  // P
  for (int64_t len : batch.doc_lens) per_doc += std::min(len, 2 * ranks);
  int64_t bound = per_doc + ranks;
  switch (strategy) {
    case Strategy::kRing:
    case Strategy::kWholeDoc:
      bound = n + ranks - 1;
      break;
    case Strategy::kLlama3:
      bound = n + 2 * ranks - 1;
      break;
    case Strategy::kMagi:
      // At most 16 chunks a rank (the chunk is at least half of ceil(C/8N));
      // each chunk boundary splits at most one document.
      bound = n + 16 * ranks - 1;
      break;
    case Strategy::kPerDoc:
    case Strategy::kZigzag:
      bound = per_doc;
      break;
    case Strategy::kFlashCpPaper:
    case Strategy::kFlashCp:
    case Strategy::kIlp:
      break;
  }
  return std::min(bound, TotalTokens(batch.doc_lens));
}

}  // namespace flashcp::core
