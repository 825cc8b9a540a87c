// SliverRepair's fixes of one sliver: a chain, whole-document moves, a new cut (sliver_repair.h).
#include "core/internal/sliver_repair.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <tuple>
#include <utility>
#include <vector>

namespace flashcp::core::internal {

bool SliverRepair::Fix(size_t c, size_t i) {
  std::vector<Piece>& p = docs[c];
  const int64_t s = p[i].len;
  const int32_t a = p[i].rank;
  // Absorb into a neighbour (the sliver's tokens go to its rank B, and B
  // returns s tokens to A along a chain), preferring the one that merges.
  for (int side : {-1, +1}) {
    const int64_t j = static_cast<int64_t>(i) + side;
    if (j < 0 || j >= static_cast<int64_t>(p.size())) continue;
    const int32_t b = p[j].rank;
    std::vector<Shift> path;
    if (!BalancedChain(b, a, s, static_cast<int32_t>(c), a, b, -RangeWorkload(p[i].start, s),
                       path)) {
      continue;
    }
    Apply(path, s);
    BeginEdit(c);
    AbsorbPiece(p, i, side);
    EndEdit(c);
    return true;
  }
  // Grow the sliver to m out of a neighbour that keeps >= m; A returns the
  // g tokens to B along a chain.
  const int64_t g = m_ - s;
  for (int side : {-1, +1}) {
    const int64_t j = static_cast<int64_t>(i) + side;
    if (j < 0 || j >= static_cast<int64_t>(p.size())) continue;
    if (p[j].len - g < m_) continue;
    const int32_t b = p[j].rank;
    std::vector<Shift> path;
    if (!BalancedChain(a, b, g, static_cast<int32_t>(c), a, b, GrowthWorkload(p[i], side, g),
                       path)) {
      continue;
    }
    Apply(path, g);
    ShiftTracked(c, i, side, g);
    return true;
  }
  return FixByWhole(c, i) || FixByNewCut(c, i);
}

bool SliverRepair::FixByWhole(size_t c, size_t i) {
  const std::vector<Piece>& p = docs[c];
  const std::vector<double>& work = RankWorkloads();
  const std::vector<int64_t>& nonlast = RankNonlast();
  const WholeFix fix{c,
                     i,
                     p[i].len,
                     p[i].rank,
                     std::max(max_work_, *std::max_element(work.begin(), work.end())),
                     *std::max_element(nonlast.begin(), nonlast.end())};
  WholeMove best;
  bool found = false;
  for (int side : {-1, +1}) {
    const int64_t j = static_cast<int64_t>(i) + side;
    if (j < 0 || j >= static_cast<int64_t>(p.size())) continue;
    SearchWholeMoves(fix, side, best, found);
  }
  if (!found) return false;
  ApplyWholeMove(c, i, best);
  return true;
}

bool SliverRepair::FixByNewCut(size_t c, size_t i) {
  std::vector<Piece>& p = docs[c];
  const int32_t a = p[i].rank;
  // A's shortest whole document that can lose an m-token head.
  const std::vector<std::pair<int64_t, int32_t>>& wa = whole[a];
  const auto cut =
      std::lower_bound(wa.begin(), wa.end(), std::pair<int64_t, int32_t>{2 * m_, -1});
  if (cut == wa.end()) return false;
  const std::vector<double>& work = RankWorkloads();
  const std::vector<int64_t>& nonlast = RankNonlast();
  const double limit = std::max(max_work_, *std::max_element(work.begin(), work.end()));
  const int64_t max_nonlast_now = *std::max_element(nonlast.begin(), nonlast.end());
  const int64_t g = m_;
  const double head_work = RangeWorkload(0, g);
  int best_side = 0;
  int64_t best_nonlast = 0;
  for (int side : {-1, +1}) {
    const int64_t j = static_cast<int64_t>(i) + side;
    if (j < 0 || j >= static_cast<int64_t>(p.size())) continue;
    if (p[j].len - g < m_) continue;
    const int32_t b = p[j].rank;
    // Workload A gains: the sliver's g new tokens (just before it, or
    // just after), less the head it hands over.
    const double gain = GrowthWorkload(p[i], side, g) - head_work;
    if (work[a] + gain > limit || work[b] - gain > limit) continue;
    int64_t mx = std::max(nonlast[a] + (i + 1 < p.size() ? g : 0),
                          nonlast[b] - (static_cast<size_t>(j) + 1 < p.size() ? g : 0) + g);
    for (int32_t r = 0; r < n_; ++r) {
      if (r != a && r != b) mx = std::max(mx, nonlast[r]);
    }
    if (mx > max_nonlast_now + max_nonlast_growth_) continue;
    if (best_side == 0 || mx < best_nonlast) {
      best_side = side;
      best_nonlast = mx;
    }
  }
  if (best_side == 0) return false;
  const int64_t j = static_cast<int64_t>(i) + best_side;
  const int32_t b = p[j].rank;
  // `work` and `nonlast` are not used after this: the edits change them.
  ShiftTracked(c, i, best_side, g);
  const auto [len, doc] = *cut;
  whole[a].erase(cut);
  MoveWholeWork(a, -1, len);
  // `p` is not used after this: docs may reallocate.
  docs.push_back({Piece{0, g, b}, Piece{g, len - g, a}});
  doc_index.push_back(doc);
  EndEdit(docs.size() - 1);
  return true;
}

int64_t SliverRepair::MaxNonlastAfter(size_t c, const std::vector<Piece>& after, int32_t a,
                                      int32_t b) {
  const std::vector<Piece>& p = docs[c];
  const std::vector<int64_t>& nonlast = RankNonlast();
  int64_t na = nonlast[a], nb = nonlast[b];
  for (size_t k = 0; k + 1 < p.size(); ++k) {
    if (p[k].rank == a) na -= p[k].len;
    if (p[k].rank == b) nb -= p[k].len;
  }
  for (size_t k = 0; k + 1 < after.size(); ++k) {
    if (after[k].rank == a) na += after[k].len;
    if (after[k].rank == b) nb += after[k].len;
  }
  int64_t mx = std::max(na, nb);
  for (int32_t r = 0; r < n_; ++r) {
    if (r != a && r != b) mx = std::max(mx, nonlast[r]);
  }
  return mx;
}

size_t SliverRepair::FirstWholeAtLeast(int32_t b, size_t nb, int64_t lb_min) const {
  if (lb_min <= 0) return 0;
  const std::vector<std::pair<int64_t, int32_t>>& wb = whole[b];
  return 1 + static_cast<size_t>(
                 std::lower_bound(wb.begin(), wb.begin() + static_cast<std::ptrdiff_t>(nb),
                                  lb_min,
                                  [](const std::pair<int64_t, int32_t>& w, int64_t v) {
                                    return w.first < v;
                                  }) -
                 wb.begin());
}

void SliverRepair::SearchWholeMoves(const WholeFix& f, int side, WholeMove& best, bool& found) {
  const std::vector<Piece>& p = docs[f.c];
  const int64_t j = static_cast<int64_t>(f.i) + side;
  const int32_t b = p[j].rank;
  const std::vector<int64_t>& nonlast = RankNonlast();
  const std::vector<std::pair<int64_t, int32_t>>& wa = whole[f.a];
  const std::vector<std::pair<int64_t, int32_t>>& wb = whole[b];
  const size_t na = std::min(wa.size(), kMaxWholeTried);
  const size_t nb = std::min(wb.size(), kMaxWholeTried);
  // This document's pieces after absorbing the sliver.
  after_ = p;
  AbsorbPiece(after_, f.i, side);
  const int64_t absorb_nonlast = MaxNonlastAfter(f.c, after_, f.a, b);
  // Growing moves g tokens from piece j to piece i: non-last tokens
  // change only where those pieces are not their document's last.
  int64_t rest_max = 0;  // max non-last tokens over the ranks but A and B
  for (int32_t r = 0; r < n_; ++r) {
    if (r != f.a && r != b) rest_max = std::max(rest_max, nonlast[r]);
  }
  const int64_t grow_a = f.i + 1 < p.size() ? 1 : 0;
  const int64_t grow_b = static_cast<size_t>(j) + 1 < p.size() ? 1 : 0;
  const int64_t lo = m_ - f.s, hi = p[j].len - m_;  // grow range for g
  for (size_t x = 0; x <= na; ++x) {
    const int64_t la = x > 0 ? wa[x - 1].first : 0;
    // g = la - lb must be in [lo, hi] or be -s: lb in [la - hi, la - lo]
    // or lb = la + s, and la - lo < la + s (lo > 0). wb is ascending, so
    // the y tried are a run: from the first with lb >= min(la - hi,
    // la + s) (y = 0 has lb = 0) while lb <= la + s, in the same order.
    for (size_t y = FirstWholeAtLeast(b, nb, std::min(la - hi, la + f.s)); y <= nb; ++y) {
      const int64_t lb = y > 0 ? wb[y - 1].first : 0;
      if (lb > la + f.s) break;
      if (x == 0 && y == 0) continue;
      const int64_t g = la - lb;
      if (g >= lo && g <= hi) {
        const int64_t grown = std::max(
            {rest_max, nonlast[f.a] + grow_a * g, nonlast[b] - grow_b * g});
        ConsiderWholeMove(f, b, WholeMove{side, true, g, x, y, grown, g, la + lb}, best, found);
      }
      if (g == -f.s) {
        ConsiderWholeMove(f, b, WholeMove{side, false, 0, x, y, absorb_nonlast, f.s, la + lb},
                          best, found);
      }
    }
  }
}

void SliverRepair::ConsiderWholeMove(const WholeFix& f, int32_t b, const WholeMove& mv,
                                     WholeMove& best, bool& found) {
  if (found && std::tie(mv.max_nonlast, mv.cost, mv.moved) >=
                   std::tie(best.max_nonlast, best.cost, best.moved)) {
    return;
  }
  const int64_t la = mv.from_a > 0 ? whole[f.a][mv.from_a - 1].first : 0;
  const int64_t lb = mv.from_b > 0 ? whole[b][mv.from_b - 1].first : 0;
  const Piece& sliver = docs[f.c][f.i];
  // Workload A gains: the tokens its cut piece gains (or loses), plus
  // the whole documents it receives, minus those it hands over.
  double gain = RangeWorkload(0, lb) - RangeWorkload(0, la);
  if (mv.grow) {
    gain += GrowthWorkload(sliver, mv.side, mv.g);
  } else {
    gain -= RangeWorkload(sliver.start, f.s);
  }
  const std::vector<double>& work = RankWorkloads();
  if (work[f.a] + gain > f.limit || work[b] - gain > f.limit) return;
  if (mv.max_nonlast > f.max_nonlast_now + max_nonlast_growth_) return;
  best = mv;
  found = true;
}

std::pair<int64_t, int32_t> SliverRepair::TakeWhole(int32_t from, size_t index) {
  const std::pair<int64_t, int32_t> d = whole[from][index];
  whole[from].erase(whole[from].begin() + static_cast<std::ptrdiff_t>(index));
  MoveWholeWork(from, -1, d.first);
  return d;
}

void SliverRepair::PutWhole(int32_t to, std::pair<int64_t, int32_t> d) {
  auto& w = whole[to];
  w.insert(std::lower_bound(w.begin(), w.end(), d), d);
  MoveWholeWork(-1, to, d.first);
}

void SliverRepair::ApplyWholeMove(size_t c, size_t i, const WholeMove& best) {
  std::vector<Piece>& p = docs[c];
  const int32_t a = p[i].rank;
  const int32_t b = p[static_cast<int64_t>(i) + best.side].rank;
  // The whole documents change ranks (kept ascending).
  std::pair<int64_t, int32_t> da{0, -1}, db{0, -1};
  if (best.from_a > 0) da = TakeWhole(a, best.from_a - 1);
  if (best.from_b > 0) db = TakeWhole(b, best.from_b - 1);
  if (da.second >= 0) PutWhole(b, da);
  if (db.second >= 0) PutWhole(a, db);
  if (best.grow) {
    ShiftTracked(c, i, best.side, best.g);
    return;
  }
  BeginEdit(c);
  AbsorbPiece(p, i, best.side);
  if (p.size() == 1) {  // the document is whole again
    PutWhole(p[0].rank, {p[0].len, doc_index[c]});
    p.clear();
  }
  EndEdit(c);
}

}  // namespace flashcp::core::internal
