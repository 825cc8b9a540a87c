#include "core/group_schemes.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "core/two_level.h"

namespace flashcp::core {

absl::Status ValidateInterNodeWeight(double weight) {
  if (!(weight >= 1.0 && weight <= 1000.0)) {  // NaN fails too
    return absl::InvalidArgumentError(absl::StrCat(
        "inter_node_weight: must be a finite ratio in [1, 1000] (NVLink : NIC), got ", weight));
  }
  return absl::OkStatus();
}

double WeightedBottleneck(const GroupPhaseBytes& b, double weight) {
  double worst = 0;
  for (size_t j = 0; j < b.sent.size(); ++j) {
    const double intra = static_cast<double>(
        std::max(b.sent[j] - b.inter_sent[j], b.received[j] - b.inter_received[j]));
    const double inter = static_cast<double>(std::max(b.inter_sent[j], b.inter_received[j]));
    worst = std::max({worst, intra, weight * inter});
  }
  return worst;
}

absl::StatusOr<GroupSchemeChoice> ChooseGroupSchemes(const Plan& plan, const PlanMetrics& metrics,
                                                     const ModelShape& shape,
                                                     int32_t ranks_per_node, double weight) {
  FLASHCP_RETURN_IF_ERROR(ValidateInterNodeWeight(weight));
  FLASHCP_RETURN_IF_ERROR(ValidateModelShape(shape));
  FLASHCP_RETURN_IF_ERROR(ValidateRanksPerNode(ranks_per_node));
  constexpr CommScheme kCandidates[] = {CommScheme::kTargeted, CommScheme::kAllGather,
                                        CommScheme::kAllToAll};
  GroupSchemeChoice out;
  std::vector<RankGroup> groups;
  for (std::vector<int32_t>& ranks : PlanRankGroups(plan)) {
    ChosenGroup best{RankGroup{std::move(ranks), CommScheme::kTargeted}, 0};
    bool have = false;
    for (CommScheme scheme : kCandidates) {
      const RankGroup candidate{best.group.ranks, scheme};
      absl::StatusOr<GroupPhaseBytes> b =
          GroupSchemePhase(metrics, candidate, shape, ranks_per_node);
      if (b.status().code() == absl::StatusCode::kFailedPrecondition) continue;  // Hq
      FLASHCP_RETURN_IF_ERROR(b.status());
      const double cost = WeightedBottleneck(*b, weight);
      if (!have || cost < best.weighted_bottleneck) {
        best.group.scheme = scheme;
        best.weighted_bottleneck = cost;
        have = true;
      }
    }
    // The two-level scheme, last (ties keep the above), where the group
    // spans nodes in equal parts whose size divides Hq.
    absl::StatusOr<GroupPhaseBytes> two =
        TwoLevelGroupPhase(plan, metrics, best.group.ranks, shape, ranks_per_node);
    if (two.ok()) {
      const double cost = WeightedBottleneck(*two, weight);
      if (!have || cost < best.weighted_bottleneck) {
        best.group.scheme = CommScheme::kAllToAll;
        best.group.two_level = true;
        best.weighted_bottleneck = cost;
        have = true;
      }
    } else if (two.status().code() != absl::StatusCode::kFailedPrecondition) {
      return two.status();
    }
    out.weighted_bottleneck = std::max(out.weighted_bottleneck, best.weighted_bottleneck);
    groups.push_back(best.group);
    out.groups.push_back(std::move(best));
  }
  FLASHCP_ASSIGN_OR_RETURN(out.bytes,
                           GroupedSchemeBytes(plan, metrics, groups, shape, ranks_per_node));
  return out;
}

absl::StatusOr<GroupSchemePlan> PlanWithGroupSchemes(Strategy strategy, const Batch& batch,
                                                     const PlanOptions& options,
                                                     const ModelShape& shape, double weight) {
  FLASHCP_RETURN_IF_ERROR(ValidateInterNodeWeight(weight));
  FLASHCP_RETURN_IF_ERROR(ValidateModelShape(shape));
  const auto analyse = [&](Strategy source, Plan plan) -> absl::StatusOr<GroupSchemePlan> {
    GroupSchemePlan out;
    out.source = source;
    FLASHCP_ASSIGN_OR_RETURN(out.metrics, AnalyzePlan(plan, shape, options.ranks_per_node));
    FLASHCP_ASSIGN_OR_RETURN(
        out.choice, ChooseGroupSchemes(plan, out.metrics, shape, options.ranks_per_node, weight));
    out.plan = std::move(plan);
    return out;
  };
  FLASHCP_ASSIGN_OR_RETURN(Plan plan, MakePlan(strategy, batch, options));
  FLASHCP_ASSIGN_OR_RETURN(GroupSchemePlan best, analyse(strategy, std::move(plan)));
  if (strategy != Strategy::kFlashCp) return best;
  // basp's plan where the batch allows one (it refuses the rest, by design).
  absl::StatusOr<Plan> basp = MakePlan(Strategy::kBasp, batch, options);
  if (!basp.ok()) {
    if (basp.status().code() == absl::StatusCode::kInvalidArgument) return best;
    return basp.status();  // a stop
  }
  FLASHCP_ASSIGN_OR_RETURN(GroupSchemePlan other, analyse(Strategy::kBasp, *std::move(basp)));
  if (other.metrics.imbalance <= std::max(options.target_imbalance, best.metrics.imbalance) &&
      other.choice.weighted_bottleneck < best.choice.weighted_bottleneck) {
    return other;
  }
  return best;
}

}  // namespace flashcp::core
