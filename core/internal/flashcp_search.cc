#include "core/internal/flashcp_search.h"

#include <algorithm>
#include <utility>

#include "core/internal/flashcp_slivers.h"
#include "core/internal/strategies_internal.h"

namespace flashcp::core::internal {

CompactedSearch::CompactedSearch(const Batch& batch, const FlashCpOptions& options)
    : batch_(batch),
      o_(options),
      scales_(kScales),
      tried_(options.order.size() + 1, -1),
      searched_(options.order.size() + 1),
      part_{std::vector<int64_t>(batch.cp_size, 0), 0, 0} {}

SearchCandidate CompactedSearch::TakeBest() {
  SearchCandidate out;
  out.pieces = std::move(best_.pieces);
  out.placement.held = std::move(best_.placement.held);
  out.k = best_.k;
  out.reduced = best_.reduced;
  out.score = best_.score;
  return out;
}

const CompactedSearch::ReducedZig& CompactedSearch::ReducedZigOf(size_t k) {
  for (const ReducedZig& z : reduced_zigs_) {
    if (z.k == k) return z;
  }
  // PerDocPieces of the k longest documents: the prefix of one run over the
  // order, extended as far as a k asks (the room of a shorter prefix is the
  // run's plus the pieces after it), then fitted to the rooms as there.
  const int64_t m = o_.min_shard;
  if (run_.begins.empty()) run_.room = o_.targets;
  const size_t done = run_.begins.size();
  if (k > done) {
    AppendPerDocPieces(batch_,
                       std::span<const int32_t>(o_.order).subspan(done, k - done), m,
                       &run_.room, run_.cursor, run_.pieces, &run_.begins);
  }
  const size_t end = k < run_.begins.size() ? run_.begins[k] : run_.pieces.size();
  ReducedZig& z = reduced_zigs_.emplace_back();
  z.k = k;
  z.pieces.assign(run_.pieces.begin(), run_.pieces.begin() + static_cast<std::ptrdiff_t>(end));
  z.need = run_.room;
  for (size_t i = end; i < run_.pieces.size(); ++i) z.need[run_.pieces[i].rank] += run_.pieces[i].len;
  if (m > 0 && *std::min_element(z.need.begin(), z.need.end()) < 0) {
    ShiftPiecesToRoom(batch_, m, z.pieces, z.need);
    z.refit = true;
    z.score = ScoreOf(z.pieces);
    return z;
  }
  // Unfitted, the pieces are the run's prefix [0, end): its score extends
  // the longest prefix scored before below it.
  const std::pair<size_t, ZigScore>* from = nullptr;
  for (const auto& scored : run_.scored) {
    if (scored.first <= end && (from == nullptr || scored.first > from->first)) from = &scored;
  }
  ZigScore score = from != nullptr ? from->second : ScoreOf({});
  const size_t begin = from != nullptr ? from->first : 0;
  AddToZigScore(std::span<const Shard>(run_.pieces).subspan(begin, end - begin), score);
  z.score = score;
  run_.scored.emplace_back(end, std::move(score));
  return z;
}

void CompactedSearch::AddToZigScore(std::span<const Shard> pieces, ZigScore& score) {
  AddPieceWorkloads(pieces, score.workload);
  zig_buffer_.assign(pieces.begin(), pieces.end());
  AddPieces(batch_, zig_buffer_, score.part);
  const int64_t m = o_.min_shard;
  if (m > 1) {
    for (const Shard& sh : pieces) {
      if (sh.len < m && sh.len < batch_.doc_lens[sh.doc]) ++score.slivers;
    }
  }
}

CompactedSearch::ZigScore CompactedSearch::ScoreOf(std::span<const Shard> pieces) {
  const size_t n = static_cast<size_t>(batch_.cp_size);
  ZigScore score{std::vector<double>(n, 0.0), PartialScore{std::vector<int64_t>(n, 0), 0, 0}, 0};
  AddToZigScore(pieces, score);
  return score;
}

void CompactedSearch::AddToPool(SearchCandidate c) {
  // Equal candidates would take several of the fallback's repair slots (at
  // k = n no document is left to place, so every scale and cap gives the
  // same one).
  const bool seen = std::any_of(pool_->begin(), pool_->end(), [&](const SearchCandidate& x) {
    return x.k == c.k && x.reduced == c.reduced && SameScore(x.score, c.score) &&
           x.pieces == c.pieces && x.placement.held == c.placement.held;
  });
  if (!seen) pool_->push_back(std::move(c));
}

bool CompactedSearch::Consider(size_t k, bool reduced, const ZigScore& zig, bool& feasible) {
  const int64_t m = o_.min_shard;
  // The cheap score first (Per-Doc pieces counted once per k).
  part_.nonlast.assign(zig.part.nonlast.begin(), zig.part.nonlast.end());
  part_.cut_docs = zig.part.cut_docs;
  part_.min_cut_len = zig.part.min_cut_len;
  AddPieces(batch_, pieces_, part_);
  double max_w = 0;
  for (double w : workload_) max_w = std::max(max_w, w);
  PlanScore score;
  score.imbalance = o_.total_work > 0 ? max_w / o_.mean_work : 1.0;
  score.max_nonlast = *std::max_element(part_.nonlast.begin(), part_.nonlast.end());
  score.cut_docs = part_.cut_docs;
  score.min_cut_len = part_.min_cut_len;
  const bool slivers = m > 1 && part_.min_cut_len != 0 && part_.min_cut_len < m;
  // Slivers are charged in the score; the winner alone is repaired
  // (RepairSlivers costs O(slivers x cut pieces), too much for every
  // candidate at large N).
  if (slivers) {
    score.slivers = zig.slivers;
    for (const Shard& sh : pieces_) {
      if (sh.len < m && sh.len < batch_.doc_lens[sh.doc]) ++score.slivers;
    }
  }
  if (score.imbalance <= o_.target || !slivers) {
    if (pool_ != nullptr) {
      AddToPool(SearchCandidate{pieces_, {{}, used_->held, 0}, k, reduced, score});
    } else {
      Searched& c = searched_[k].emplace_back();
      c.pieces = pieces_;
      c.held_end.reserve(used_->held.size());
      for (const std::vector<int32_t>& docs : used_->held) {
        c.held.insert(c.held.end(), docs.begin(), docs.end());
        c.held_end.push_back(static_cast<uint32_t>(c.held.size()));
      }
      c.reduced = reduced;
      c.score = score;
    }
  }
  if (!have_ || Better(score, best_.score, o_.target, o_.sliver_cost)) {
    best_.pieces.swap(pieces_);                // pieces_ is cleared before its next use
    best_.placement.held.swap(used_->held);  // used_ is refilled before its next use
    best_.k = k;
    best_.reduced = reduced;
    best_.score = score;
    have_ = true;
  }
  feasible |= score.imbalance <= o_.target;
  return slivers;
}

void CompactedSearch::TryVariants(size_t k, bool reduced, const ZigScore& zig,
                                  const std::vector<int64_t>& need,
                                  const std::vector<int32_t>& rest, bool& feasible) {
  const int64_t m = o_.min_shard;
  // rho = 0 is plain LPT; larger rho anticipates the workload that
  // equalization moves. Whole moves always: they never cost communication,
  // and head-only equalization never won (docs/planner.md). Head swaps for
  // would-be slivers first capped at 4m tokens; only if slivers remain, once
  // more uncapped. Both caps equalize the same LPT placement, so it is made
  // once per rho and copied for the first cap only when a second may follow.
  // Where the cap decided nothing, the uncapped equalization would be the
  // same step for step, hence the same candidate, which changes nothing
  // (Better is strict, the pool keeps distinct ones): it is not made.
  for (double scale : scales_) {
    const double rho = scale * o_.median_density;
    placed_workload_.assign(zig.workload.begin(), zig.workload.end());
    PlaceWholeDocs(batch_, rest, need, rho, placed_workload_, placement_, scratch_);
    for (int64_t cap : {4 * m, int64_t{0}}) {
      const bool last = m <= 1 || cap == 0;
      pieces_.clear();
      workload_.assign(placed_workload_.begin(), placed_workload_.end());
      if (!last) trial_ = placement_;  // element-wise: keeps trial_'s capacity
      used_ = last ? &placement_ : &trial_;
      const bool cap_decided = EqualizeWholeDocs(batch_, need, *used_, workload_, pieces_,
                                                 WholeDocOptions{rho, true, m, cap}, scratch_);
      if (!Consider(k, reduced, zig, feasible) || last || !cap_decided) break;
    }
  }
}

bool CompactedSearch::TryK(size_t k) {
  if (tried_[k] >= 0) return tried_[k] == 1;
  if (stopped_.ok()) stopped_ = o_.CheckStop();
  if (!stopped_.ok()) return true;
  const int64_t m = o_.min_shard;
  const auto split = o_.order.begin() + static_cast<std::ptrdiff_t>(k);
  const std::vector<int32_t> zig_docs(o_.order.begin(), split);
  const std::vector<int32_t> rest(split, o_.order.end());
  bool feasible = false;
  // Per-Doc under the minimum-shard rule (fewer ranks for shorter
  // documents), then every Whole-Doc variant on top of it.
  bool refit = false;
  if (m > 0) {
    const ReducedZig& z = ReducedZigOf(k);  // valid throughout: TryVariants adds none
    refit = z.refit;
    if (*std::min_element(z.need.begin(), z.need.end()) >= 0) {
      TryVariants(k, true, z.score, z.need, rest, feasible);
    }
  } else {
    std::vector<int64_t> need = o_.targets;
    const std::vector<Shard> zig = PerDocPieces(batch_, zig_docs, m, &need, &refit);
    TryVariants(k, false, ScoreOf(zig), need, rest, feasible);
  }
  // Where the reduced zigzag overfilled a rank (only when Per-Doc documents
  // are nearly the whole batch), PerDocPieces shifted its cut points to fit
  // the ranks' rooms, or could not; either way the full 2N-chunk zigzag
  // competes too (its token counts never exceed a rank's target and every
  // rank gets the same share of every document: the best balance, short
  // shards and all, which the score charges).
  if (refit) {
    ExtendFullRun(k);  // its entries stay valid throughout: TryVariants extends none
    TryVariants(k, false, full_.scores[k], full_.needs[k], rest, feasible);
  }
  tried_[k] = feasible ? 1 : 0;
  return feasible;
}

absl::Status CompactedSearch::FindBoundary() {
  // A document whose rank must keep more than R * mean workload even after
  // giving away everything but its last C/N tokens, W(L - C/N, C/N) > R *
  // mean, is Per-Doc in every feasible plan, so k >= k_lb. The first guess
  // k_est also counts every document whose whole workload exceeds R * mean;
  // then the search walks to the boundary: down from k_est by galloping and
  // bisection if k_est is feasible, else up. Usually two or three values of
  // k, each cheaper plan (smaller k) preferred by the score.
  const size_t n_docs = o_.order.size();
  const int64_t per_rank = TokensPerRank(TotalTokens(batch_.doc_lens), batch_.cp_size);
  size_t k_lb = 0, k_est = 0;
  for (int32_t d : o_.order) {
    const int64_t len = batch_.doc_lens[d];
    if (len > per_rank && RangeWorkload(len - per_rank, per_rank) > o_.max_work) ++k_lb;
    if (RangeWorkload(0, len) > o_.max_work) ++k_est;
  }
  k_est = std::max(k_est, k_lb);
  size_t lo, hi;  // TryK(lo) infeasible (or lo + 1 == k_lb), TryK(hi) feasible (or hi == n)
  if (TryK(k_est)) {
    hi = k_est;
    size_t step = 1;
    lo = k_est;
    while (true) {
      if (hi <= k_lb) {
        lo = hi;  // nothing below k_lb is feasible
        break;
      }
      const size_t cand = hi >= k_lb + step ? hi - step : k_lb;
      if (TryK(cand)) {
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
    while (hi < n_docs && !TryK(hi)) {
      lo = hi;
      step *= 2;
      hi = std::min(n_docs, hi + step);
    }
    if (hi == n_docs) TryK(n_docs);
  }
  while (hi > lo + 1) {
    const size_t mid = lo + (hi - lo) / 2;
    if (TryK(mid)) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  searched_met_ = tried_;
  return stopped_;
}

void CompactedSearch::TryKAgain(size_t k) {
  if (k >= searched_met_.size() || searched_met_[k] < 0 || tried_[k] >= 0) {
    TryK(k);
    return;
  }
  // As TryK: the stop token is asked once per k made.
  if (stopped_.ok()) stopped_ = o_.CheckStop();
  if (!stopped_.ok()) return;
  for (Searched& c : searched_[k]) {
    SearchCandidate x{std::move(c.pieces), {}, k, c.reduced, c.score};
    x.placement.held.resize(c.held_end.size());
    uint32_t begin = 0;
    for (size_t r = 0; r < c.held_end.size(); ++r) {
      x.placement.held[r].assign(c.held.begin() + begin, c.held.begin() + c.held_end[r]);
      begin = c.held_end[r];
    }
    AddToPool(std::move(x));
  }
  searched_[k].clear();
  tried_[k] = searched_met_[k];
}

absl::StatusOr<std::vector<SearchCandidate>> CompactedSearch::FallbackCandidates(size_t k0) {
  const size_t n_docs = o_.order.size();
  std::vector<SearchCandidate> candidates;
  pool_ = &candidates;
  // The first pass (kScales) repeats candidates FindBoundary made: none
  // beats the best, which it already compared them with, so only the pool
  // gains them.
  scales_ = kScales;
  std::fill(tried_.begin(), tried_.end(), int8_t{-1});
  TryKAgain(k0);
  if (k0 < n_docs) TryKAgain(k0 + 1);
  searched_met_.clear();  // taken: a later call makes its candidates anew
  scales_ = kMoreScales;
  std::fill(tried_.begin(), tried_.end(), int8_t{-1});
  TryK(k0);
  if (k0 < n_docs) TryK(k0 + 1);
  // And every document Per-Doc (k = n): where the winner's k is near n, the
  // reduced zigzag of all of them, its cut points shifted to fit, can meet R
  // without a sliver while the search stopped at a full 2N-chunk zigzag with
  // many slivers.
  if (n_docs - k0 <= 8 || 2 * k0 >= n_docs) TryK(n_docs);
  pool_ = nullptr;
  if (!stopped_.ok()) return stopped_;
  return candidates;
}

std::vector<Shard> CompactedSearch::Assemble(std::vector<Shard> pieces,
                                             const WholeDocPlacement& held, size_t k,
                                             bool reduced) {
  AppendHeldWhole(batch_, held, pieces);
  if (reduced) {
    const std::vector<Shard>& zig = ReducedZigOf(k).pieces;
    pieces.insert(pieces.end(), zig.begin(), zig.end());
  } else {  // the full 2N-chunk zigzag
    ExtendFullRun(k);
    pieces.insert(pieces.end(), full_.pieces.begin(),
                  full_.pieces.begin() + static_cast<std::ptrdiff_t>(full_.ends[k]));
  }
  return pieces;
}

void CompactedSearch::ExtendFullRun(size_t k) {
  FullRun& run = full_;
  if (run.ends.empty()) {
    run.ends.push_back(0);
    run.scores.push_back(ScoreOf({}));
    run.needs.push_back(o_.targets);
  }
  // PerDocPieces without a minimum shard or rooms is AppendPerDocPieces
  // from a fresh cursor, document by document.
  for (size_t d = run.ends.size() - 1; d < k; ++d) {
    const size_t begin = run.pieces.size();
    AppendPerDocPieces(batch_, std::span<const int32_t>(o_.order).subspan(d, 1), 0, nullptr,
                       run.cursor, run.pieces);
    const std::span<const Shard> added = std::span<const Shard>(run.pieces).subspan(begin);
    ZigScore score = run.scores.back();
    AddToZigScore(added, score);
    std::vector<int64_t> need = run.needs.back();
    for (const Shard& s : added) need[s.rank] -= s.len;
    run.ends.push_back(run.pieces.size());
    run.scores.push_back(std::move(score));
    run.needs.push_back(std::move(need));
  }
}

bool CompactedSearch::PerDocKeepsSlivers(size_t k, bool reduced) {
  for (const auto& [at, mode, keeps] : keeps_slivers_) {
    if (at == k && mode == reduced) return keeps;
  }
  RepairScratch scratch;
  if (!reduced) ExtendFullRun(k);
  const bool keeps =
      reduced ? PartKeepsSlivers(batch_, ReducedZigOf(k).pieces, o_.min_shard, scratch)
              : PartKeepsSlivers(batch_, std::span<const Shard>(full_.pieces).first(full_.ends[k]),
                                 o_.min_shard, scratch);
  keeps_slivers_.emplace_back(k, reduced, keeps);
  return keeps;
}

}  // namespace flashcp::core::internal
