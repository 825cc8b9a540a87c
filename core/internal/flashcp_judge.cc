// flashcp's one judge of candidate plans (flashcp_judge.h).
#include "core/internal/flashcp_judge.h"

#include <algorithm>
#include <utility>

#include "core/analysis.h"
#include "core/internal/flashcp_balance.h"
#include "core/internal/flashcp_roles.h"
#include "core/internal/flashcp_slivers.h"
#include "core/internal/strategies_internal.h"
#include "core/status_macros.h"

namespace flashcp::core::internal {

CandidateJudge::CandidateJudge(const Batch& batch, const FlashCpOptions& options,
                               const Acceptance& rules, const StageAtN& at, Plan reference,
                               const PlanScore& reference_score)
    : batch_(batch),
      options_(options),
      rules_(rules),
      at_(at),
      n_(batch.cp_size),
      m_(options.min_shard),
      reference_(std::move(reference)),
      reference_exchange_(Measure(reference_, reference_score)),
      reference_slivers_(m_ > 1 ? CountSlivers(reference_, m_) : 0),
      best_(reference_exchange_) {
  const Balancing& b = rules_.balancing;
  if (b.budget > 0) max_balanced_ = std::max<int32_t>(1, b.budget / (b.moves_per_rank * n_));
}

void CandidateJudge::Offer(std::vector<Shard>& pieces, const std::vector<double>* workload) {
  // Most candidates of a stage that tracks workloads miss the reach: told
  // before their plan is made.
  if (workload != nullptr &&
      ImbalanceCertainlyOver(batch_, *workload, at_.reach * options_.target)) {
    return;
  }
  if (at_.repaired == 0) {
    current_.plan = FinishPlan(batch_, std::move(pieces));
    current_.score = ScorePlan(current_.plan);
    current_.measured = false;
    if (Screen(current_)) Judge(current_);
    // The plan's buffer (none where it won) is the next candidate's.
    if (pieces.empty()) pieces = std::move(current_.plan.shards);
    return;
  }
  Raw raw;
  raw.plan = FinishPlan(batch_, pieces);
  raw.score = ScorePlan(raw.plan);
  if (!Screen(raw)) return;
  raw.pieces = std::move(pieces);
  raws_.push_back(std::move(raw));
}

absl::StatusOr<Plan> CandidateJudge::Finish() {
  if (at_.repaired > 0) {
    // Only the `repaired` that move least go on: their repairs cost far
    // more than building them.
    std::stable_sort(raws_.begin(), raws_.end(),
                     [](const Raw& a, const Raw& b) { return a.targeted < b.targeted; });
    if (raws_.size() > at_.repaired) raws_.resize(at_.repaired);
    for (Raw& raw : raws_) {
      FLASHCP_RETURN_IF_ERROR(options_.CheckStop());
      // Out of reach of one kept before it: not worth its repairs.
      if (rules_.rescreen && static_cast<double>(raw.targeted) >
                                 rules_.moved_reach * static_cast<double>(Best())) {
        continue;
      }
      Judge(raw);
    }
    raws_.clear();
  }
  if (rules_.swaps == Swaps::kWinnerAndChosen) {
    if (!winner_.has_value()) return SwapRoles(reference_);
    // Both swapped; the one moving less under its cheaper exchange (then
    // under the all-gather) is kept.
    Plan swapped = SwapRoles(*winner_);
    Plan other = SwapRoles(reference_);
    const Exchange a = Measure(swapped, ScorePlan(swapped));
    const Exchange b = Measure(other, ScorePlan(other));
    if (b.cheaper() < a.cheaper() || (b.cheaper() == a.cheaper() && b.allgather < a.allgather)) {
      return other;
    }
    return swapped;
  }
  if (winner_.has_value()) return *std::move(winner_);
  return std::move(reference_);
}

bool CandidateJudge::Screen(Raw& raw) const {
  if (raw.score.imbalance > at_.reach * options_.target) return false;
  if (at_.allgather_held && !AllgatherHeld(raw.score, rules_.allgather_reach)) return false;
  if (rules_.moved_reach == 0) {
    raw.exchange = Measure(raw.plan, raw.score);
    raw.measured = true;
    return MovesLess(raw.exchange);
  }
  raw.targeted = TargetedPhaseBottleneck(raw.plan);
  return static_cast<double>(raw.targeted) <= rules_.moved_reach * static_cast<double>(Best());
}

void CandidateJudge::Judge(Raw& raw) {
  // While `as_raw`, raw.plan is the raw candidate: its score, targeted
  // phase (or exchange, where measured) still hold.
  bool as_raw = true;
  if (rules_.repair && m_ > 1 && raw.score.min_cut_len != 0 && raw.score.min_cut_len < m_) {
    raw.plan = FinishPlan(batch_, RepairSlivers(batch_, std::move(raw.pieces), m_,
                                                options_.max_work));
    raw.score = ScorePlan(raw.plan);
    as_raw = false;
  }
  if (raw.score.imbalance > options_.target) {
    if (!Balance(raw)) return;
    as_raw = false;
  }
  if (!SliversAllowed(raw)) return;
  if (rules_.objective == Objective::kTargeted) {
    const int64_t targeted = !as_raw        ? TargetedPhaseBottleneck(raw.plan)
                             : raw.measured ? raw.exchange.targeted
                                            : raw.targeted;
    if (targeted >= best_.targeted) return;
  }
  if (rules_.swaps == Swaps::kEachCandidate) {
    Plan swapped = SwapRoles(raw.plan);
    if (swapped.shards != raw.plan.shards) {  // else the score (and as_raw) still hold
      raw.plan = std::move(swapped);
      raw.score = ScorePlan(raw.plan);
      as_raw = false;
    }
  }
  if (at_.allgather_held && !AllgatherHeld(raw.score, 1.0)) return;
  Exchange exchange;
  if (!as_raw) {
    exchange = Measure(raw.plan, raw.score);
  } else if (raw.measured) {
    exchange = raw.exchange;
  } else {
    exchange = Exchange{AllgatherTokens(raw.score, n_), raw.targeted};
  }
  if (!MovesLess(exchange)) return;
  best_ = exchange;
  winner_ = std::move(raw.plan);
}

bool CandidateJudge::Balance(Raw& raw) {
  // Balancing exchanges add only the heads they cut, within the plan-time
  // budget (each call O(partners x whole documents per rank^2)).
  if (max_balanced_ > 0) {
    if (balanced_ == max_balanced_) return false;
    ++balanced_;
  }
  const Balancing& b = rules_.balancing;
  raw.plan = BalanceByWholeExchanges(batch_, raw.plan, options_.max_work, b.partners,
                                     b.moves_per_rank * n_, m_, b.move_cut);
  raw.score = ScorePlan(raw.plan);
  return raw.score.imbalance <= options_.target;
}

bool CandidateJudge::SliversAllowed(const Raw& raw) const {
  if (m_ <= 1) return true;
  const bool has = raw.score.min_cut_len != 0 && raw.score.min_cut_len < m_;
  switch (rules_.slivers) {
    case SliverRule::kNone:
      return !has;
    case SliverRule::kNoneWhereReferenceHasNone:
      return !has || reference_slivers_ > 0;
    case SliverRule::kNoMoreThanReference:
      return !has || CountSlivers(raw.plan, m_) <= reference_slivers_;
  }
  return false;
}

bool CandidateJudge::MovesLess(const Exchange& e) const {
  if (rules_.objective == Objective::kTargeted) {
    return e.targeted < best_.targeted && e.cheaper() <= reference_exchange_.cheaper();
  }
  return e.cheaper() < best_.cheaper();
}

bool CandidateJudge::AllgatherHeld(const PlanScore& score, double reach) const {
  return static_cast<double>(AllgatherTokens(score, n_)) <=
         reach * static_cast<double>(reference_exchange_.allgather);
}

int64_t CandidateJudge::Best() const {
  return rules_.objective == Objective::kTargeted ? best_.targeted : best_.cheaper();
}

Plan CandidateJudge::SwapRoles(const Plan& plan) const {
  return SwapRolesForTargeted(batch_, plan, options_.max_work, kSwapsPerRank * n_);
}

}  // namespace flashcp::core::internal
