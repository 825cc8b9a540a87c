#include "core/strategies.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/analysis.h"
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
  return absl::InvalidArgumentError(absl::StrCat(
      "strategy: unknown strategy \"", name,
      "\" (llama3, per_doc, ring, zigzag, whole_doc, flashcp_paper, flashcp, ilp, magi)"));
}

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
      return internal::PlanIlp(batch, options.ilp, info);
    case Strategy::kMagi:
      return internal::PlanMagi(batch);
  }
  return absl::InvalidArgumentError("strategy: unknown strategy");
}

}  // namespace flashcp::core
