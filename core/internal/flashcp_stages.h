// flashcp's candidate stages (docs/planner.md, "Least KV moved") as one
// table: each stage a name, a generator of raw candidates (its own file)
// and the rules the one judge (flashcp_judge.h) keeps a candidate by; which
// stages run at which N is kRankBands (flashcp_tuning.h). A new stage is a
// generator in a new file, a row here and a column there.
#ifndef FLASHCP_CORE_INTERNAL_FLASHCP_STAGES_H_
#define FLASHCP_CORE_INTERNAL_FLASHCP_STAGES_H_

#include <optional>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/internal/flashcp_judge.h"
#include "core/internal/flashcp_options.h"
#include "core/internal/flashcp_score.h"
#include "core/internal/flashcp_tuning.h"
#include "core/types.h"

namespace flashcp::core::internal {

// Offers a stage's raw candidates at one band of N (`at`, its column of
// `band`) to `judge`; the stop token's status once it says stop.
using CandidateGenerator = absl::Status (*)(const Batch& batch, const FlashCpOptions& options,
                                            const RankBand& band, const StageAtN& at,
                                            CandidateJudge& judge);

struct Stage {
  const char* name;
  StageAtN RankBand::*at;  // its column of kRankBands
  CandidateGenerator generate;
  Acceptance acceptance;
};

// The stages, in the order they run over the compacted plan:
//  grouped          flashcp_grouped.h: documents zigzagged over groups of
//                   ranks; the winner's and the compacted plan's roles
//                   swapped, the one moving less kept;
//  chunk_heap       flashcp_kv.h: MagiAttention's chunk dispatch with
//                   neighbour affinity;
//  density_fill     flashcp_kvfill.h: ranks filled from both ends of the
//                   documents ordered by density;
//  capacity_groups  flashcp_kvgroups.h: mirrored chunk pairs levelled over
//                   the fewest ranks.
std::span<const Stage> Stages();

// `plan` (valid), or the stage's candidate its judge keeps. Where the stage
// does not run at N, or `plan` cuts no document, `plan` as it is. The stop
// token's status once it says stop.
absl::StatusOr<Plan> RunStage(const Stage& stage, const Batch& batch,
                              const FlashCpOptions& options, Plan plan);

// Each stage alone, by name (the tests' entry points).
absl::StatusOr<Plan> PreferGrouped(const Batch& batch, const FlashCpOptions& options,
                                   Plan compacted);
absl::StatusOr<Plan> PreferLeastKv(const Batch& batch, const FlashCpOptions& options,
                                   Plan chosen);
absl::StatusOr<Plan> PreferKvFill(const Batch& batch, const FlashCpOptions& options,
                                  Plan chosen);
absl::StatusOr<Plan> PreferKvGroups(const Batch& batch, const FlashCpOptions& options,
                                    Plan chosen);

// The grouped candidate the judge keeps over `compacted` (its score
// `compacted_score`), before the role swaps; nullopt where none qualifies.
absl::StatusOr<std::optional<Plan>> BestGroupedPlan(const Batch& batch,
                                                    const FlashCpOptions& options,
                                                    const Plan& compacted,
                                                    const PlanScore& compacted_score);

}  // namespace flashcp::core::internal

#endif  // FLASHCP_CORE_INTERNAL_FLASHCP_STAGES_H_
