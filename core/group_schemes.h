// flashcp's choice of rank groups and schemes (issue 27): a plan's rank
// groups (core/rank_groups.h) each run the scheme that moves the fewest bytes
// on the group's busiest link, inter-node bytes weighted by the NVLink : NIC
// bandwidth ratio; and, for flashcp, the plan chosen for it among flashcp's
// (node-aware with ranks_per_node) and basp's where the batch allows one.
// Pure, like the planners; flashcp's own plans are untouched.
#ifndef FLASHCP_CORE_GROUP_SCHEMES_H_
#define FLASHCP_CORE_GROUP_SCHEMES_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/analysis.h"
#include "core/rank_groups.h"
#include "core/strategies.h"
#include "core/types.h"

namespace flashcp::core {

// NVLink : NIC (an inter-node byte costs this many intra-node ones).
inline constexpr double kDefaultInterNodeWeight = 8.0;
// InvalidArgument naming inter_node_weight unless finite in [1, 1000].
absl::Status ValidateInterNodeWeight(double weight);

// One phase's busiest link in intra-node byte units: max over the group's
// ranks of max(intra-node bytes, weight * inter-node bytes), each the larger
// of sent and received (a rank's NVLink and NIC run side by side, so the
// slower one bounds it).
double WeightedBottleneck(const GroupPhaseBytes& bytes, double weight);

struct ChosenGroup {
  RankGroup group;                  // ranks and the scheme it runs
  double weighted_bottleneck = 0;   // WeightedBottleneck of that scheme, one phase
};
struct GroupSchemeChoice {
  std::vector<ChosenGroup> groups;  // PlanRankGroups' order
  SchemeBytes bytes;                // the plan run so (GroupedSchemeBytes)
  double weighted_bottleneck = 0;   // max over groups
};

// Per rank group of `plan` (metrics = AnalyzePlan(plan, shape,
// ranks_per_node)) the scheme among targeted, allgather (within the group),
// all_to_all (where the group's size divides Hq) and the two-level scheme
// (core/two_level.h: where the group spans nodes in equal parts whose size
// divides Hq; RankGroup::two_level) with the least WeightedBottleneck; on a
// tie the earlier of that list (one rank: targeted, nothing moves).
// InvalidArgument for a bad weight, shape or ranks_per_node.
absl::StatusOr<GroupSchemeChoice> ChooseGroupSchemes(const Plan& plan, const PlanMetrics& metrics,
                                                     const ModelShape& shape,
                                                     int32_t ranks_per_node, double weight);

struct GroupSchemePlan {
  Strategy source = Strategy::kFlashCp;  // the strategy whose plan it is
  Plan plan;
  PlanMetrics metrics;
  GroupSchemeChoice choice;
};
// Plans `batch` with `strategy` (MakePlan; options.ranks_per_node is the
// topology) and chooses its groups' schemes. For flashcp, basp's plan is a
// candidate too where the batch allows one (B equal documents, B | N) and its
// imbalance is within target_imbalance: the plan with the lower weighted
// bottleneck wins, flashcp's on a tie. Errors as MakePlan and
// ChooseGroupSchemes.
absl::StatusOr<GroupSchemePlan> PlanWithGroupSchemes(Strategy strategy, const Batch& batch,
                                                     const PlanOptions& options,
                                                     const ModelShape& shape, double weight);

}  // namespace flashcp::core

#endif  // FLASHCP_CORE_GROUP_SCHEMES_H_
