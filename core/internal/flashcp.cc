// FlashCP, our planner (docs/planner.md): Whole-Doc placement steered by rho
// with whole-document moves, a Per-Doc fallback for the documents too long to
// balance (the fewest, found by search), the minimum-shard rule (with a
// repair of the winner and, if that fails, of other candidates, then a
// re-cut of their cut points by linear programming), and a small
// candidate search scored on imbalance, then communication, then cuts.
#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "core/internal/flashcp_repair.h"
#include "core/internal/flashcp_score.h"
#include "core/internal/flashcp_util.h"
#include "core/internal/recut.h"
#include "core/internal/strategies_internal.h"
#include "core/status_macros.h"

namespace flashcp::core::internal {
namespace {

bool HasShortCut(const Plan& plan, int64_t m) { return CountShortCuts(plan, m) > 0; }

}  // namespace

absl::StatusOr<Plan> PlanFlashCpCompacted(const Batch& batch, const PlanOptions& options) {
  const double target = options.target_imbalance;
  const int64_t m = options.min_shard_tokens;
  const int32_t n = batch.cp_size;
  const std::vector<int32_t> order = DocsLongestFirst(batch);
  const std::vector<int64_t> targets = RankTargets(batch);
  const size_t n_docs = order.size();

  // The winner is kept as its Per-Doc count and its other pieces; the Per-Doc
  // pieces are rebuilt at the end.
  std::vector<Shard> best_pieces;
  size_t best_k = 0;
  bool best_reduced = true;  // Per-Doc with the minimum-shard rule
  PlanScore best_score;
  bool have = false;
  // Density scale of the workload that token equalization moves: a median
  // document's workload per token.
  const double median_density =
      (static_cast<double>(batch.doc_lens[order[n_docs / 2]]) + 1.0) / 2.0;
  double total_work = 0;
  for (int64_t len : batch.doc_lens) total_work += RangeWorkload(0, len);
  const double mean_work = total_work / n;
  // What one short cut piece left in a plan is worth in non-last tokens.
  const int64_t short_cost = 8 * m;

  // Every Whole-Doc variant with the k longest documents zigzagged (Per-Doc);
  // keeps the best plan seen and returns true if one of these meets the target.
  std::vector<int8_t> tried(n_docs + 1, -1);
  // Reused by every candidate of this plan (no per-candidate allocation once
  // grown): the Whole-Doc steps' buffers, the candidate's pieces (swapped with the
  // best plan's when it wins) and per-rank workload, and the partial score.
  WholeDocScratch scratch;
  // One rho's LPT placement, a copy to equalize when a second cap may
  // follow, the one the current candidate consumed, and the winner's (its
  // documents kept whole, which are not in `best_pieces`).
  WholeDocPlacement placement, trial, best_placement;
  WholeDocPlacement* used = nullptr;
  std::vector<double> placed_workload;  // per-rank workload after LPT
  // While `pool` is set (the fallback below), every candidate that meets the
  // target or has no sliver is also kept in `candidates` (its cut and moved
  // pieces and its placement's whole documents: O(n) per candidate): the
  // first to be repaired, the others to be re-cut.
  struct Candidate {
    std::vector<Shard> pieces;
    WholeDocPlacement placement;  // only `held` is used
    size_t k;
    bool reduced;
    PlanScore score;
  };
  std::vector<Candidate> candidates;
  std::vector<Candidate>* pool = nullptr;
  // rho / median_density per variant (docs/planner.md); the fallback tries
  // the ones between.
  static constexpr std::array<double, 4> kScales = {0.0, 0.5, 1.0, 2.0};
  static constexpr std::array<double, 4> kMoreScales = {0.25, 0.75, 1.5, 3.0};
  std::span<const double> scales = kScales;

  // The reduced zigzag of the k longest documents, per k: the same for every
  // variant at k, for the winner's build and for the fallback's second
  // search, and fitting it to the ranks' rooms (ShiftPiecesToRoom) is costly
  // (docs/planner.md, "Complexity"), so it is made once per k. Few k are
  // tried (O(log n) plus the fallback's), so a list searched linearly.
  struct ReducedZig {
    size_t k;
    std::vector<Shard> pieces;
    std::vector<int64_t> need;  // targets less the pieces' tokens per rank
    bool refit = false;         // the pieces were shifted to fit (or could not be)
  };
  std::vector<ReducedZig> reduced_zigs;
  const auto reduced_zig = [&](size_t k) -> const ReducedZig& {
    for (const ReducedZig& z : reduced_zigs) {
      if (z.k == k) return z;
    }
    ReducedZig& z = reduced_zigs.emplace_back();
    z.k = k;
    z.need = targets;
    const std::vector<int32_t> zig_docs(order.begin(),
                                        order.begin() + static_cast<std::ptrdiff_t>(k));
    z.pieces = PerDocPieces(batch, zig_docs, m, &z.need, &z.refit);
    return z;
  };

  std::vector<Shard> pieces;
  std::vector<double> workload;
  PartialScore part{std::vector<int64_t>(n, 0), 0, 0};
  // options.stop's answer once it says stop: every try_k then returns at
  // once (as feasible, which ends the search) and the plan returns it.
  absl::Status stopped;
  const auto try_k = [&](size_t k) {
    if (tried[k] >= 0) return tried[k] == 1;
    if (stopped.ok()) stopped = options.stop.Check();
    if (!stopped.ok()) return true;
    const auto split = order.begin() + static_cast<std::ptrdiff_t>(k);
    const std::vector<int32_t> zig_docs(order.begin(), split);
    const std::vector<int32_t> rest(split, order.end());
    bool feasible = false;
    // Per-Doc under the minimum-shard rule (fewer ranks for shorter
    // documents), then every Whole-Doc variant on top of it.
    bool reduced = m > 0;
    std::vector<int64_t> need = targets;
    bool refit = false;
    std::vector<Shard> zig;
    if (reduced) {
      const ReducedZig& z = reduced_zig(k);
      zig = z.pieces;
      need = z.need;
      refit = z.refit;
    } else {
      zig = PerDocPieces(batch, zig_docs, m, &need, &refit);
    }
    const auto run_zig = [&]() {
      const std::vector<double> zig_workload = PieceWorkloads(n, zig);
      PartialScore zig_part{std::vector<int64_t>(n, 0), 0, 0};
      AddPieces(batch, zig, zig_part);
      // One candidate: its pieces besides `zig` and the documents `used` keeps
      // whole (which add nothing to the score), and the per-rank workload.
      // Returns whether it had short cut pieces before any repair.
      const auto consider = [&]() {
        // The cheap score first (Per-Doc pieces counted once per k).
        part.nonlast.assign(zig_part.nonlast.begin(), zig_part.nonlast.end());
        part.cut_docs = zig_part.cut_docs;
        part.min_cut_len = zig_part.min_cut_len;
        AddPieces(batch, pieces, part);
        double max_w = 0;
        for (double w : workload) max_w = std::max(max_w, w);
        PlanScore score;
        score.imbalance = total_work > 0 ? max_w / mean_work : 1.0;
        score.max_nonlast = *std::max_element(part.nonlast.begin(), part.nonlast.end());
        score.cut_docs = part.cut_docs;
        score.min_cut_len = part.min_cut_len;
        const bool slivers = m > 1 && part.min_cut_len != 0 && part.min_cut_len < m;
        // Short cut pieces are charged in the score; the winner alone is
        // repaired at the end (RepairShortShards costs O(slivers x cut
        // pieces), too much for every candidate at large N).
        if (slivers) {
          for (const Shard& sh : pieces) {
            if (sh.len < m && sh.len < batch.doc_lens[sh.doc]) ++score.short_cuts;
          }
          for (const Shard& sh : zig) {
            if (sh.len < m && sh.len < batch.doc_lens[sh.doc]) ++score.short_cuts;
          }
        }
        if (pool != nullptr && (score.imbalance <= target || !slivers)) {
          // Equal candidates would take several of the fallback's repair
          // slots (at k = n no document is left to place, so every scale
          // and cap gives the same one).
          const bool seen =
              std::any_of(pool->begin(), pool->end(), [&](const Candidate& c) {
                return c.k == k && c.reduced == reduced && SameScore(c.score, score) &&
                       c.pieces == pieces && c.placement.held == used->held;
              });
          if (!seen) pool->push_back(Candidate{pieces, {{}, used->held, 0}, k, reduced, score});
        }
        if (!have || Better(score, best_score, target, short_cost)) {
          best_pieces.swap(pieces);  // `pieces` is cleared before its next use
          best_placement.held.swap(used->held);  // `used` is refilled before its next use
          best_k = k;
          best_reduced = reduced;
          best_score = score;
          have = true;
        }
        feasible |= score.imbalance <= target;
        return slivers;
      };
      // rho = 0 is plain LPT; larger rho anticipates the workload that
      // equalization moves. Whole moves always: they never cost communication
      // and (measured, docs/planner.md) head-only equalization never won. Head
      // swaps for would-be slivers first capped at 4m tokens; only if slivers
      // remain, once more uncapped.
      // Both caps equalize the same LPT placement, so it is made once per rho
      // and copied for the first cap only when a second may follow.
      for (double scale : scales) {
        const double rho = scale * median_density;
        placed_workload.assign(zig_workload.begin(), zig_workload.end());
        PlaceWholeDocs(batch, rest, need, rho, placed_workload, placement, scratch);
        for (int64_t cap : {4 * m, int64_t{0}}) {
          const bool last = m <= 1 || cap == 0;
          pieces.clear();
          workload.assign(placed_workload.begin(), placed_workload.end());
          if (!last) trial = placement;  // element-wise: keeps trial's capacity
          used = last ? &placement : &trial;
          EqualizeWholeDocs(batch, need, *used, workload, pieces,
                            WholeDocOptions{rho, true, m, cap}, scratch);
          if (!consider() || last) break;
        }
      }
    };
    if (!reduced || *std::min_element(need.begin(), need.end()) >= 0) run_zig();
    // Where the reduced zigzag overfilled a rank (only when Per-Doc
    // documents are nearly the whole batch), PerDocPieces shifted its cut
    // points to fit the ranks' rooms, or could not; either way the full
    // 2N-chunk zigzag competes too (its token counts never exceed a rank's
    // target and every rank gets the same share of every document: the best
    // balance, short shards and all, which the score charges).
    if (refit) {
      reduced = false;
      zig = PerDocPieces(batch, zig_docs);
      need = targets;
      for (const Shard& s : zig) need[s.rank] -= s.len;
      run_zig();
    }
    tried[k] = feasible ? 1 : 0;
    return feasible;
  };

  // Fewer Per-Doc documents means less communication; imbalance mostly falls
  // as k grows (the search assumes it does). A document whose rank must keep
  // more than R * mean workload even after giving away everything but its
  // last C/N tokens, W(L - C/N, C/N) > R * mean, is Per-Doc in every feasible
  // plan, so k >= k_lb. The first guess k_est also counts every document
  // whose whole workload exceeds R * mean; then the search walks to the
  // boundary (k feasible, k - 1 not): down from k_est by galloping and
  // bisection if k_est is feasible, else up. Usually two or three values of
  // k, each cheaper plan (smaller k) preferred by the score.
  const int64_t per_rank = TokensPerRank(TotalTokens(batch.doc_lens), n);
  size_t k_lb = 0, k_est = 0;
  for (int32_t d : order) {
    const int64_t len = batch.doc_lens[d];
    const double bound = target * mean_work;
    if (len > per_rank && RangeWorkload(len - per_rank, per_rank) > bound) ++k_lb;
    if (RangeWorkload(0, len) > bound) ++k_est;
  }
  k_est = std::max(k_est, k_lb);
  size_t lo, hi;  // try_k(lo) infeasible (or lo + 1 == k_lb), try_k(hi) feasible (or hi == n)
  if (try_k(k_est)) {
    hi = k_est;
    size_t step = 1;
    lo = k_est;
    while (true) {
      if (hi <= k_lb) {
        lo = hi;  // nothing below k_lb is feasible
        break;
      }
      const size_t cand = hi >= k_lb + step ? hi - step : k_lb;
      if (try_k(cand)) {
        hi = cand;
        step *= 2;
      } else {
        lo = cand;
        break;
      }
    }
  } else {
    lo = k_est;
    size_t step = 1;
    hi = std::min(n_docs, k_est + step);
    while (hi < n_docs && !try_k(hi)) {
      lo = hi;
      step *= 2;
      hi = std::min(n_docs, hi + step);
    }
    if (hi == n_docs) try_k(n_docs);
  }
  while (hi > lo + 1) {
    const size_t mid = lo + (hi - lo) / 2;
    if (try_k(mid)) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  FLASHCP_RETURN_IF_ERROR(stopped);
  // A candidate's whole pieces: its own, the documents its placement kept
  // whole, its Per-Doc pieces (rebuilt).
  const auto assemble = [&](std::vector<Shard> pieces_of, const WholeDocPlacement& held,
                            size_t k, bool reduced) {
    AppendHeldWhole(batch, held, pieces_of);
    if (reduced) {
      const std::vector<Shard>& zig = reduced_zig(k).pieces;
      pieces_of.insert(pieces_of.end(), zig.begin(), zig.end());
    } else {  // the full 2N-chunk zigzag
      const std::vector<int32_t> zig_docs(order.begin(),
                                          order.begin() + static_cast<std::ptrdiff_t>(k));
      const std::vector<Shard> zig = PerDocPieces(batch, zig_docs);
      pieces_of.insert(pieces_of.end(), zig.begin(), zig.end());
    }
    return pieces_of;
  };
  // A candidate's whole plan, short cut pieces repaired.
  const auto build = [&](std::vector<Shard> pieces_of, const WholeDocPlacement& held, size_t k,
                         bool reduced, const PlanScore& score) {
    pieces_of = assemble(std::move(pieces_of), held, k, reduced);
    if (m > 1 && score.short_cuts > 0) {
      // Every fix of the repair keeps each rank within max(R * mean, its
      // current maximum), so a plan that met the target still does; should
      // rounding of the workload sums ever tip it over (not seen on the
      // property test's or the data sets' batches), the unrepaired plan is
      // kept: the target comes first (docs/planner.md).
      Plan repaired =
          FinishPlan(batch, RepairShortShards(batch, pieces_of, m, target * mean_work, short_cost));
      if (score.imbalance > target || ScorePlan(repaired).imbalance <= target) return repaired;
    }
    return FinishPlan(batch, std::move(pieces_of));
  };
  const size_t pieces0 = best_pieces.size();  // to know the winner again below
  Plan plan = build(std::move(best_pieces), best_placement, best_k, best_reduced, best_score);
  if (m <= 1 || !HasShortCut(plan, m) || best_score.imbalance > target) return plan;
  // No plan free of slivers meets R (the margin absorbs the sums' rounding):
  // the fallback below could not succeed, so it is not tried.
  if (SliverFreeWorkloadBound(batch, m) > target * mean_work * (1 + 1e-9)) return plan;
  // The winner keeps a cut piece shorter than m that its repair could not
  // remove. The candidates at the winner's k and at k + 1 (one more Per-Doc
  // document: better balanced, so more meet R) are built again, with the
  // four usual rho scales and four between them, and those that meet R (or
  // have no sliver, for the re-cut below) are kept, and those with every
  // document Per-Doc (below). Of the first five
  // distinct ones in score order (the winner skipped, not repaired again),
  // the best repaired plan with no such piece that still meets the target
  // wins; if none, the winner stays. Rare (a few batches in a hundred on
  // WLB-LLM at 128K), and then about two more searches' worth of candidates
  // plus up to five repairs; other batches pay nothing.
  // The winner (the search below overwrites best_*).
  const size_t k0 = best_k;
  const bool reduced0 = best_reduced;
  const PlanScore score0 = best_score;
  pool = &candidates;
  for (const std::span<const double> set : {std::span<const double>(kScales),
                                            std::span<const double>(kMoreScales)}) {
    scales = set;
    std::fill(tried.begin(), tried.end(), int8_t{-1});
    try_k(k0);
    if (k0 < n_docs) try_k(k0 + 1);
  }
  // And every document Per-Doc (k = n): where the winner's k is near n, the
  // reduced zigzag of all of them, its cut points shifted to fit, can meet R
  // without a sliver while the search stopped at a full 2N-chunk zigzag with
  // hundreds (the property test's random batches). Only where the winner
  // already has half the documents or all but 8 Per-Doc, so that this costs
  // at most about what its own k did (trying it for every batch of n N <=
  // 4,096 took RedPajama 128K N = 8's p99 from 0.3 to 0.7 ms).
  if (n_docs - k0 <= 8 || 2 * k0 >= n_docs) try_k(n_docs);
  pool = nullptr;
  FLASHCP_RETURN_IF_ERROR(stopped);
  std::stable_sort(candidates.begin(), candidates.end(),
                   [&](const Candidate& x, const Candidate& y) {
                     return Better(x.score, y.score, target, short_cost);
                   });
  // Repairs tried, bounding the worst case; the repaired plans are compared
  // on communication (their scores before repair only ordered them).
  constexpr size_t kMaxFallbacks = 5;
  bool found = false;
  PlanScore found_score;
  size_t repairs = 0;
  for (size_t i = 0; i < candidates.size() && repairs < kMaxFallbacks; ++i) {
    const Candidate& c = candidates[i];
    if (c.score.imbalance > target) break;  // sorted: the rest miss R too (kept to re-cut)
    // The winner itself comes back (first, as a rule): rebuilt, it would be
    // repaired to the same failure, so it is skipped. It is known by its k,
    // Per-Doc mode, piece count and score (a different candidate equal in
    // all of these would be skipped too; on the property test's and the
    // data sets' batches, plans are the same as without the skip).
    if (c.k == k0 && c.reduced == reduced0 && c.pieces.size() == pieces0 &&
        SameScore(c.score, score0)) {
      continue;  // costs no repair slot
    }
    ++repairs;
    Plan other = build(c.pieces, c.placement, c.k, c.reduced, c.score);
    if (HasShortCut(other, m)) continue;
    const PlanScore score = ScorePlan(other);
    if (score.imbalance > target) continue;
    if (!found || Better(score, found_score, target, short_cost)) {
      plan = std::move(other);
      found_score = score;
      found = true;
    }
  }
  if (found) return plan;
  FLASHCP_RETURN_IF_ERROR(options.stop.Check());
  // No repaired candidate is free of slivers within R. Where the trouble is
  // the cut points (a reduced zigzag fitted to the ranks' rooms by shifts
  // that ignore workload; a Whole-Doc head sized to a token deficit), moving
  // them can fix both: RecutPieces keeps each piece on its rank and in its
  // place in the document and solves for cut points that give every rank its
  // tokens, every piece >= m and the least maximum workload. Tried on
  // kMaxRecuts candidates, first those without a sliver that missed R (least
  // imbalanced first), then those that met R but kept a sliver through their
  // repair (in score order, the winner too; they seldom gain: 3 wins in about
  // 1,800 tries on the property test's batches, against 15 in 22 for the
  // former), and on every document Per-Doc in reduced zigzags over
  // consecutive ranks, not fitted (the program sets the tokens). A re-cut
  // plan wins only if it meets R and beats the repaired winner with its
  // slivers charged (8m non-last tokens each): a sliver costs less than much
  // more communication.
  constexpr size_t kMaxRecuts = 3;
  constexpr int32_t kRecutRounds = 8;
  PlanScore found_score_or_winner = ScorePlan(plan);
  found_score_or_winner.short_cuts = CountShortCuts(plan, m);
  const auto recut = [&](std::vector<Shard> pieces_of) {
    if (!RecutPieces(batch, pieces_of, m, kRecutRounds, target * mean_work * (1 + 1e-9))) return;
    Plan other = FinishPlan(batch, std::move(pieces_of));
    const PlanScore score = ScorePlan(other);
    // RecutPieces keeps every piece >= m, so `other` has no sliver.
    if (score.imbalance > target || !Better(score, found_score_or_winner, target, short_cost)) {
      return;
    }
    plan = std::move(other);
    found_score_or_winner = score;
  };
  size_t recuts = 0;
  for (const bool missed_r : {true, false}) {
    for (size_t i = 0; i < candidates.size() && recuts < kMaxRecuts; ++i) {
      const Candidate& c = candidates[i];
      if ((c.score.imbalance > target) != missed_r) continue;
      ++recuts;
      recut(assemble(c.pieces, c.placement, c.k, c.reduced));
    }
  }
  recut(PerDocPieces(batch, order, m));
  return plan;
}

}  // namespace flashcp::core::internal
