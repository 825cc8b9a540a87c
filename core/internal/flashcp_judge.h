// flashcp's one judge of candidate plans (docs/planner.md, "Least KV
// moved"): every candidate stage (flashcp_stages.h) only generates raw
// candidates and offers them here; what a stage accepts is the fields of
// its Acceptance row and of its StageAtN (flashcp_tuning.h, kRankBands).
//
// Per candidate, in order (each step a field):
//  1. screen the raw candidate: over reach x R, over allgather_reach x the
//     reference's all-gather where the all-gather is held, and moving more
//     than moved_reach x the best so far (targeted phase; moved_reach 0:
//     the raw candidate must already move less, fully measured), all
//     before any repair;
//  2. where `repaired` > 0, keep the `repaired` raw ones that move least
//     (targeted phase) and go on with those once all are offered (Finish),
//     screened again where `rescreen`; else go on with each as offered;
//  3. repair its slivers (RepairSlivers within R x mean) where `repair`;
//  4. balance it where over R (BalanceByWholeExchanges, `balancing`),
//     dropped if still over;
//  5. the sliver rule (`slivers`);
//  6. with the targeted objective, dropped unless below the best targeted
//     phase so far; role swaps where `swaps` is kEachCandidate;
//  7. where the all-gather is held, dropped if over the reference's;
//  8. kept where it moves less under `objective` than the best so far.
// With swaps kWinnerAndChosen, Finish swaps the roles of the winner and of
// the reference and keeps the one moving less; with no winner, the
// reference's roles swapped.
#ifndef FLASHCP_CORE_INTERNAL_FLASHCP_JUDGE_H_
#define FLASHCP_CORE_INTERNAL_FLASHCP_JUDGE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "core/internal/flashcp_options.h"
#include "core/internal/flashcp_score.h"
#include "core/internal/flashcp_tuning.h"
#include "core/types.h"

namespace flashcp::core::internal {

// What "moves less" compares.
enum class Objective {
  // Strictly less than the best so far under the cheaper exchange.
  kCheaper,
  // A strictly lower targeted phase bottleneck than the best so far, before
  // and after the role swaps, and no more than the reference under the
  // cheaper exchange.
  kTargeted,
};

// Which slivers (cut shards under the minimum shard m) a kept plan may have.
enum class SliverRule {
  kNone,                     // none
  kNoneWhereReferenceHasNone,  // none where the reference has none, else any
  kNoMoreThanReference,      // no more than the reference
};

// Balancing exchanges for a candidate over R (flashcp_roles.h).
struct Balancing {
  int32_t partners = kPostPassPartners;  // the lightest ranks an exchange tries
  int32_t moves_per_rank = kPostPassMovesPerRank;  // exchanges per call: this x N
  bool move_cut = false;                 // pieces of cut documents may move
  // The exchanges per plan (calls: at most max(1, budget / (moves per
  // call)), the plan-time budget); 0: no bound.
  int32_t budget = 0;
};

// Role swaps (SwapRolesForTargeted, at most kSwapsPerRank x N per plan).
enum class Swaps {
  kEachCandidate,    // each candidate's roles, before it is judged
  kWinnerAndChosen,  // the winner's and the reference's, at Finish
};

// One stage's acceptance rules.
struct Acceptance {
  Objective objective = Objective::kCheaper;
  SliverRule slivers = SliverRule::kNoMoreThanReference;
  // Raw candidates moving (targeted phase) over this x the best so far are
  // dropped before their repairs; 0: dropped unless they already move less
  // (the objective, fully measured).
  double moved_reach = kMovedReach;
  // Where the all-gather is held: raw candidates over this x the
  // reference's all-gather are dropped before their repairs.
  double allgather_reach = kAllgatherReach;
  // The moved_reach screen again, against the best so far, before each kept
  // raw candidate's repairs.
  bool rescreen = true;
  // Slivers repaired by the judge (RepairSlivers within R x mean).
  bool repair = true;
  Balancing balancing;
  Swaps swaps = Swaps::kEachCandidate;
};

// Judges the candidates of one stage against `reference` (a valid plan
// that cuts some document, `reference_score` its ScorePlan) by `rules` and
// `at` (its row of kRankBands; `at.repaired`, reach and all-gather hold).
class CandidateJudge {
 public:
  CandidateJudge(const Batch& batch, const FlashCpOptions& options, const Acceptance& rules,
                 const StageAtN& at, Plan reference, const PlanScore& reference_score);

  // Offers one raw candidate (pieces for FinishPlan; every rank exactly its
  // RankTargets tokens). Where `workload` is given (each rank's workload of
  // `pieces`), a candidate it says is certainly over reach x R is dropped
  // before its plan is made. With `repaired` 0 it is judged now, and
  // `pieces` is left holding a buffer for the next candidate (contents
  // meaningless); else it is screened and kept for Finish.
  void Offer(std::vector<Shard>& pieces, const std::vector<double>* workload = nullptr);

  // The winner so far, if any candidate was kept (before Finish's swaps).
  const std::optional<Plan>& winner() const { return winner_; }

  // Judges the kept raw candidates (repaired > 0) and returns the plan
  // chosen: the winner or the reference, roles swapped as `swaps` says. The
  // stop token's status once it says stop.
  absl::StatusOr<Plan> Finish();

 private:
  struct Raw {
    int64_t targeted = 0;  // the raw plan's targeted phase bottleneck
    std::vector<Shard> pieces;
    Plan plan;
    PlanScore score;
    Exchange exchange;      // where `measured`: Measure(plan, score)
    bool measured = false;
  };
  // Step 1 on a finished raw plan; fills raw.targeted or raw.exchange.
  bool Screen(Raw& raw) const;
  // Steps 3 to 8; keeps the candidate if it wins.
  void Judge(Raw& raw);
  bool Balance(Raw& raw);
  bool SliversAllowed(const Raw& raw) const;
  bool MovesLess(const Exchange& e) const;
  bool AllgatherHeld(const PlanScore& score, double reach) const;
  int64_t Best() const;  // the best so far, in the objective's measure
  Plan SwapRoles(const Plan& plan) const;

  const Batch& batch_;
  const FlashCpOptions& options_;
  const Acceptance& rules_;
  const StageAtN& at_;
  const int32_t n_;
  const int64_t m_;
  Plan reference_;
  Exchange reference_exchange_;
  int64_t reference_slivers_ = 0;
  Exchange best_;              // of the winner so far, else the reference
  std::optional<Plan> winner_;
  int32_t balanced_ = 0;       // balancing calls made
  int32_t max_balanced_ = 0;   // calls allowed (0: any)
  std::vector<Raw> raws_;      // screened, kept for Finish
  Raw current_;                // the candidate judged now (repaired 0)
};

}  // namespace flashcp::core::internal

#endif  // FLASHCP_CORE_INTERNAL_FLASHCP_JUDGE_H_
