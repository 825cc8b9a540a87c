// flashcp's candidate stages as one table (flashcp_stages.h).
#include "core/internal/flashcp_stages.h"

#include <cstring>
#include <iterator>
#include <utility>

#include "core/internal/flashcp_grouped.h"
#include "core/internal/flashcp_kv.h"
#include "core/internal/flashcp_kvfill.h"
#include "core/internal/flashcp_kvgroups.h"
#include "core/status_macros.h"

namespace flashcp::core::internal {
namespace {

// The rules of each stage, as they were tuned; where two differ, each
// difference is a field (making them equal is a measured change of plans).
constexpr Stage kStages[] = {
    {"grouped", &RankBand::grouped, GroupedCandidates,
     Acceptance{.objective = Objective::kCheaper,
                .slivers = SliverRule::kNone,
                .moved_reach = 0.0,
                .allgather_reach = 1.0,
                .rescreen = false,
                .repair = false,  // GroupedCandidates repairs its own
                .balancing = {kBalancePartners, kBalanceMovesPerRank, true, kBalanceMoves},
                .swaps = Swaps::kWinnerAndChosen}},
    {"chunk_heap", &RankBand::chunk_heap, ChunkHeapCandidates,
     Acceptance{.objective = Objective::kTargeted,
                .slivers = SliverRule::kNoneWhereReferenceHasNone,
                .moved_reach = kMovedReach,
                .allgather_reach = kAllgatherReach,
                .rescreen = false,
                .repair = true,
                .balancing = {kPostPassPartners, kPostPassMovesPerRank, true, 0},
                .swaps = Swaps::kEachCandidate}},
    {"density_fill", &RankBand::fill, FillCandidates,
     Acceptance{.objective = Objective::kCheaper,
                .slivers = SliverRule::kNoMoreThanReference,
                .moved_reach = kFillMovedReach,
                .allgather_reach = kAllgatherReach,
                .rescreen = true,
                .repair = true,
                .balancing = {kPostPassPartners, kPostPassMovesPerRank, false, 0},
                .swaps = Swaps::kEachCandidate}},
    {"capacity_groups", &RankBand::kv_groups, KvGroupCandidates,
     Acceptance{.objective = Objective::kCheaper,
                .slivers = SliverRule::kNoMoreThanReference,
                .moved_reach = kMovedReach,
                .allgather_reach = kAllgatherReach,
                .rescreen = true,
                .repair = true,
                .balancing = {kPostPassPartners, kPostPassMovesPerRank, false, 0},
                .swaps = Swaps::kEachCandidate}},
};

const Stage& StageNamed(const char* name) {
  for (const Stage& stage : kStages) {
    if (std::strcmp(stage.name, name) == 0) return stage;
  }
  return kStages[0];  // not reached: every caller names a row
}

}  // namespace

std::span<const Stage> Stages() { return kStages; }

absl::StatusOr<Plan> RunStage(const Stage& stage, const Batch& batch,
                              const FlashCpOptions& options, Plan plan) {
  const RankBand& band = BandOf(batch.cp_size);
  const StageAtN& at = band.*stage.at;
  if (at.variants == 0) return plan;
  const PlanScore score = ScorePlan(plan);
  if (score.cut_docs == 0) return plan;  // nothing is exchanged to begin with
  CandidateJudge judge(batch, options, stage.acceptance, at, std::move(plan), score);
  FLASHCP_RETURN_IF_ERROR(stage.generate(batch, options, band, at, judge));
  return judge.Finish();
}

absl::StatusOr<Plan> PreferGrouped(const Batch& batch, const FlashCpOptions& options,
                                   Plan compacted) {
  return RunStage(StageNamed("grouped"), batch, options, std::move(compacted));
}

absl::StatusOr<Plan> PreferLeastKv(const Batch& batch, const FlashCpOptions& options,
                                   Plan chosen) {
  return RunStage(StageNamed("chunk_heap"), batch, options, std::move(chosen));
}

absl::StatusOr<Plan> PreferKvFill(const Batch& batch, const FlashCpOptions& options,
                                  Plan chosen) {
  return RunStage(StageNamed("density_fill"), batch, options, std::move(chosen));
}

absl::StatusOr<Plan> PreferKvGroups(const Batch& batch, const FlashCpOptions& options,
                                    Plan chosen) {
  return RunStage(StageNamed("capacity_groups"), batch, options, std::move(chosen));
}

absl::StatusOr<std::optional<Plan>> BestGroupedPlan(const Batch& batch,
                                                    const FlashCpOptions& options,
                                                    const Plan& compacted,
                                                    const PlanScore& compacted_score) {
  const Stage& stage = StageNamed("grouped");
  const RankBand& band = BandOf(batch.cp_size);
  CandidateJudge judge(batch, options, stage.acceptance, band.*stage.at, compacted,
                       compacted_score);
  FLASHCP_RETURN_IF_ERROR(stage.generate(batch, options, band, band.*stage.at, judge));
  return judge.winner();
}

}  // namespace flashcp::core::internal
