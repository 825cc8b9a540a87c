// The repair stage (flashcp_repair.h): chains of cut-point shifts and
// whole-document moves that remove slivers or move tokens between
// ranks, each keeping every rank's token count.
#include "core/internal/flashcp_repair.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <tuple>
#include <utility>

#include "core/internal/flashcp_util.h"
#include "core/internal/strategies_internal.h"

namespace flashcp::core::internal {

namespace {

// One piece of a cut document, for RepairSlivers.
struct Piece {
  int64_t start = 0;
  int64_t len = 0;
  int32_t rank = 0;
};

// A cut-point shift: the boundary between pieces b and b + 1 of cut document
// `doc` moves so that `giver` hands tokens to the other side's rank.
struct Shift {
  int32_t doc = 0;
  int32_t boundary = 0;
  bool left_gives = false;  // piece b shrinks at its end (else b + 1 at its start)
};

// The one edit every repair makes to a cut document: moves the cut point
// between piece i of `p` (the document's pieces by start) and its neighbour
// i + side (side -1 or +1) so that piece i gains `delta` tokens (loses them
// if delta < 0) and the neighbour as many fewer. The two stay touching.
void ShiftCut(std::vector<Piece>& p, size_t i, int side, int64_t delta) {
  Piece& x = p[i];
  Piece& y = p[static_cast<size_t>(static_cast<int64_t>(i) + side)];
  x.len += delta;
  y.len -= delta;
  if (side < 0) {
    x.start -= delta;
  } else {
    y.start += delta;
  }
}

// Workload (SPEC Eq. 3 pairs) of the `g` tokens that ShiftCut(p, i, side, g)
// hands piece `x` = p[i].
double GrowthWorkload(const Piece& x, int side, int64_t g) {
  return side < 0 ? RangeWorkload(x.start - g, g) : RangeWorkload(x.start + x.len, g);
}

// Merges the first two touching pieces on one rank (one fix makes at most
// one such pair: the pieces either side of a removed sliver).
void MergeTouching(std::vector<Piece>& p) {
  for (size_t k = 1; k < p.size(); ++k) {
    if (p[k - 1].rank == p[k].rank) {
      p[k - 1].len += p[k].len;
      p.erase(p.begin() + static_cast<std::ptrdiff_t>(k));
      return;
    }
  }
}

// Piece i's neighbour on `side` takes all of piece i's tokens; piece i goes,
// and the pieces either side of it merge if they now touch on one rank.
void AbsorbPiece(std::vector<Piece>& p, size_t i, int side) {
  ShiftCut(p, i, side, -p[i].len);
  p.erase(p.begin() + static_cast<std::ptrdiff_t>(i));
  MergeTouching(p);
}

class SliverRepair {
 public:
  SliverRepair(int32_t n, int64_t m, double max_work, int64_t max_nonlast_growth)
      : n_(n), m_(m), max_work_(max_work), max_nonlast_growth_(max_nonlast_growth) {
    whole.resize(n);
  }
  SliverRepair() : SliverRepair(0, 0, 0, 0) {}

  // As if constructed anew with these bounds, the buffers kept (their
  // capacity, and each cut document's vector for the next Load): a
  // RepairScratch's repair serves one call after another.
  void Reset(int32_t n, int64_t m, double max_work, int64_t max_nonlast_growth) {
    n_ = n;
    m_ = m;
    max_work_ = max_work;
    max_nonlast_growth_ = max_nonlast_growth;
    for (std::vector<Piece>& p : docs) {
      p.clear();
      spare_docs_.push_back(std::move(p));
    }
    docs.clear();
    doc_index.clear();
    whole.resize(n);
    for (auto& w : whole) w.clear();
    dirty_ = true;
    exact_ = false;
    work_valid_ = nonlast_valid_ = false;
    banned_.clear();
  }

  std::vector<std::vector<Piece>> docs;  // cut documents only, pieces by start
  std::vector<int32_t> doc_index;        // document id per entry of `docs`
  // Per rank, its whole documents as (length, document id), in the order
  // Load met them (RepairSlivers sorts them ascending).
  std::vector<std::vector<std::pair<int64_t, int32_t>>> whole;

  // Takes raw pieces (as FinishPlan takes them) or a finished plan's
  // shards, and holds what that plan's shards hold: whole documents per rank
  // (in the order met; for a plan's shards by document), cut ones as pieces
  // sorted by start, touching pieces on one rank merged (FinishPlan's
  // merge), the cut documents in the order the plan's shards first meet
  // them: by their lowest rank, then by document. Raw pieces that merge into
  // a whole document join their rank's list last.
  void Load(const Batch& batch, const std::vector<Shard>& pieces) {
    // Counted first, so that each list is allocated once: per document its
    // cut pieces, per rank its whole documents.
    std::vector<int32_t>& count = count_;
    count.assign(batch.doc_lens.size(), 0);
    std::vector<int32_t>& whole_count = parent_;  // its buffer (FindChain assigns it)
    whole_count.assign(n_, 0);
    int64_t total = 0;
    size_t cut_docs = 0;
    for (const Shard& s : pieces) {
      total += s.len;
      if (s.len == 0) continue;
      if (s.len == batch.doc_lens[s.doc]) {
        ++whole_count[s.rank];
      } else if (count[s.doc]++ == 0) {
        ++cut_docs;
      }
    }
    for (int32_t r = 0; r < n_; ++r) whole[r].reserve(whole_count[r]);
    docs.reserve(cut_docs);
    doc_index.reserve(cut_docs);
    std::vector<int32_t>& slot = slot_;  // per document, its entry in `docs`
    slot.assign(batch.doc_lens.size(), -1);
    for (const Shard& s : pieces) {
      if (s.len == 0) continue;
      if (s.len == batch.doc_lens[s.doc]) {
        whole[s.rank].push_back({s.len, s.doc});
        continue;
      }
      if (slot[s.doc] < 0) {
        slot[s.doc] = static_cast<int32_t>(docs.size());
        if (spare_docs_.empty()) {
          docs.emplace_back();
        } else {
          docs.push_back(std::move(spare_docs_.back()));
          spare_docs_.pop_back();
        }
        docs.back().reserve(count[s.doc]);
        doc_index.push_back(s.doc);
      }
      docs[slot[s.doc]].push_back(Piece{s.start, s.len, s.rank});
    }
    exact_ = WorkloadsExact(total);
    // Sorted and merged; documents left whole move to `whole`.
    size_t kept = 0;
    for (size_t c = 0; c < docs.size(); ++c) {
      std::vector<Piece>& p = docs[c];
      std::sort(p.begin(), p.end(),
                [](const Piece& x, const Piece& y) { return x.start < y.start; });
      size_t k = 0;
      for (size_t i = 0; i < p.size(); ++i) {
        if (k > 0 && p[k - 1].rank == p[i].rank && p[k - 1].start + p[k - 1].len == p[i].start) {
          p[k - 1].len += p[i].len;
        } else {
          p[k++] = p[i];
        }
      }
      p.resize(k);
      if (k == 1) {
        whole[p[0].rank].push_back({p[0].len, doc_index[c]});
        continue;
      }
      if (kept != c) {
        docs[kept] = std::move(p);
        doc_index[kept] = doc_index[c];
      }
      ++kept;
    }
    for (size_t c = kept; c < docs.size(); ++c) {
      docs[c].clear();
      spare_docs_.push_back(std::move(docs[c]));
    }
    docs.resize(kept);
    doc_index.resize(kept);
    // The plan's order of cut documents (a plan's shards already have it).
    std::vector<std::pair<int32_t, int32_t>> keys(kept);  // (lowest rank, document)
    for (size_t c = 0; c < kept; ++c) {
      int32_t low = docs[c][0].rank;
      for (const Piece& x : docs[c]) low = std::min(low, x.rank);
      keys[c] = {low, doc_index[c]};
    }
    if (!std::is_sorted(keys.begin(), keys.end())) {
      std::vector<size_t> perm(kept);
      std::iota(perm.begin(), perm.end(), size_t{0});
      std::sort(perm.begin(), perm.end(), [&](size_t x, size_t y) { return keys[x] < keys[y]; });
      std::vector<std::vector<Piece>> sorted(kept);
      for (size_t c = 0; c < kept; ++c) {
        sorted[c] = std::move(docs[perm[c]]);
        doc_index[c] = keys[perm[c]].second;
      }
      docs = std::move(sorted);
    }
  }

  // Per-rank attention workload (SPEC Eq. 3) of the current pieces, summed
  // on first use in a fixed order (cut documents' pieces first, then whole
  // documents), then kept up to date by every edit (BeginEdit, EndEdit,
  // MoveWholeWork) in O(the edited pieces), not O(all pieces) per fix.
  // Each piece's workload is an integer, and while the batch's whole
  // workload is below 2^53 every partial sum is an exact double, so the
  // kept sums equal a fresh sum in any order (exact_); above that an edit
  // makes them stale and they are summed again in the fixed order, so the
  // bounds always compare the same sums.
  const std::vector<double>& RankWorkloads() {
    if (!work_valid_) {
      work_.assign(n_, 0.0);
      for (const std::vector<Piece>& d : docs) {
        for (const Piece& x : d) work_[x.rank] += RangeWorkload(x.start, x.len);
      }
      for (int32_t r = 0; r < n_; ++r) {
        for (const auto& [len, doc] : whole[r]) work_[r] += RangeWorkload(0, len);
      }
      work_valid_ = true;
    }
    return work_;
  }

  // Per-rank non-last tokens (SPEC Eq. 5) of the cut documents' pieces
  // (whole documents have none); summed on first use, then kept up to date
  // by every edit (integers: exact).
  const std::vector<int64_t>& RankNonlast() {
    if (!nonlast_valid_) {
      nonlast_.assign(n_, 0);
      for (const std::vector<Piece>& d : docs) {
        for (size_t k = 0; k + 1 < d.size(); ++k) nonlast_[d[k].rank] += d[k].len;
      }
      nonlast_valid_ = true;
    }
    return nonlast_;
  }

  // Every edit of cut document c's pieces is bracketed by these: BeginEdit
  // takes its part out of the sums and the boundary graph, EndEdit puts its
  // new part in (a document new in `docs` needs EndEdit only).
  void BeginEdit(size_t c) {
    const std::vector<Piece>& p = docs[c];
    if (work_valid_) {
      if (exact_) {
        for (const Piece& x : p) work_[x.rank] -= RangeWorkload(x.start, x.len);
      } else {
        work_valid_ = false;
      }
    }
    if (nonlast_valid_) {
      for (size_t k = 0; k + 1 < p.size(); ++k) nonlast_[p[k].rank] -= p[k].len;
    }
    if (!dirty_) {
      const auto doc = static_cast<int32_t>(c);
      for (const Piece& x : p) {
        std::vector<Edge>& edges = adj_[x.rank];
        const auto lo = std::lower_bound(edges.begin(), edges.end(), doc,
                                         [](const Edge& e, int32_t d) { return e.shift.doc < d; });
        const auto hi =
            std::find_if(lo, edges.end(), [&](const Edge& e) { return e.shift.doc != doc; });
        edges.erase(lo, hi);
      }
    }
  }
  void EndEdit(size_t c) {
    const std::vector<Piece>& p = docs[c];
    if (work_valid_) {  // exact_ (else BeginEdit made them stale)
      for (const Piece& x : p) work_[x.rank] += RangeWorkload(x.start, x.len);
    }
    if (nonlast_valid_) {
      for (size_t k = 0; k + 1 < p.size(); ++k) nonlast_[p[k].rank] += p[k].len;
    }
    if (!dirty_) {
      // Each rank's edges stay in the order a rebuild makes them.
      DocEdges(c, [&](int32_t rank, const Edge& e) {
        std::vector<Edge>& edges = adj_[rank];
        edges.insert(std::upper_bound(edges.begin(), edges.end(), e,
                                      [](const Edge& x, const Edge& y) {
                                        return EdgeKey(x) < EdgeKey(y);
                                      }),
                     e);
      });
    }
  }
  // ShiftCut(docs[c], i, side, delta) with the sums and the boundary graph
  // kept up to date: only pieces i and i + side change (their lengths, not
  // their ranks), so only their terms and the edges they give along change.
  void ShiftTracked(size_t c, size_t i, int side, int64_t delta) {
    std::vector<Piece>& p = docs[c];
    const size_t j = static_cast<size_t>(static_cast<int64_t>(i) + side);
    const auto terms = [&](double sign) {
      for (const size_t k : {i, j}) {
        const Piece& x = p[k];
        if (work_valid_) work_[x.rank] += sign * RangeWorkload(x.start, x.len);
        if (nonlast_valid_ && k + 1 < p.size()) {
          nonlast_[x.rank] += sign > 0 ? x.len : -x.len;
        }
      }
    };
    if (work_valid_ && !exact_) work_valid_ = false;
    terms(-1.0);
    ShiftCut(p, i, side, delta);
    terms(+1.0);
    if (dirty_) return;
    // Piece k gives along boundary k - 1 (as the right piece) and k (as the
    // left one), sparing len - m tokens; an edge exists while len > m.
    for (const size_t k : {i, j}) {
      const Piece& x = p[k];
      std::vector<Edge>& edges = adj_[x.rank];
      for (const bool left : {false, true}) {
        if (left ? k + 1 >= p.size() : k == 0) continue;
        const size_t other = left ? k + 1 : k - 1;
        const Edge e{p[other].rank, x.len - m_,
                     {static_cast<int32_t>(c), static_cast<int32_t>(left ? k : k - 1), left}};
        const auto at = std::lower_bound(
            edges.begin(), edges.end(), e,
            [](const Edge& a, const Edge& b) { return EdgeKey(a) < EdgeKey(b); });
        const bool found = at != edges.end() && EdgeKey(*at) == EdgeKey(e);
        if (x.len > m_) {
          if (found) {
            at->spare = e.spare;
          } else {
            edges.insert(at, e);
          }
        } else if (found) {
          edges.erase(at);
        }
      }
    }
  }

  // A whole document of `len` tokens leaves rank `from` (-1: none) for rank
  // `to` (-1: none).
  void MoveWholeWork(int32_t from, int32_t to, int64_t len) {
    if (!work_valid_) return;
    if (!exact_) {
      work_valid_ = false;
      return;
    }
    if (from >= 0) work_[from] -= RangeWorkload(0, len);
    if (to >= 0) work_[to] += RangeWorkload(0, len);
  }

  // Appends the current pieces to `out`: the cut documents' pieces, then
  // each rank's whole documents.
  void Emit(std::vector<Shard>& out) const {
    for (size_t c = 0; c < docs.size(); ++c) {
      for (const Piece& p : docs[c]) out.push_back(Shard{doc_index[c], p.start, p.len, p.rank});
    }
    for (int32_t r = 0; r < n_; ++r) {
      for (const auto& [len, doc] : whole[r]) out.push_back(Shard{doc, 0, len, r});
    }
  }

  // Moves `delta` tokens from rank `from` to rank `to` along a shortest
  // chain of cut-point shifts (every shrinking piece keeps >= m), without a
  // workload check; true on success.
  bool MoveTokens(int32_t from, int32_t to, int64_t delta) {
    std::vector<Shift> path;
    banned_.clear();
    if (!FindChain(from, to, delta, -1, path)) return false;
    Apply(path, delta);
    return true;
  }

  // Removes the sliver at docs[c][i] if a chain allows; true on success.
  bool Fix(size_t c, size_t i) {
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

  // Removes the sliver at docs[c][i] by whole-document moves between its
  // rank A and the rank B of a neighbouring piece (b tokens), where no chain
  // of cut-point shifts exists (Fix). Either
  //  - grow: the sliver grows by g, m - s <= g <= b - m, out of B's piece,
  //    and A hands B whole documents worth exactly g tokens more than B
  //    hands back (one document of A, or one each way), or
  //  - absorb: B's piece takes the sliver's s tokens, and B hands A whole
  //    documents worth exactly s more than A hands back (one document of B,
  //    or one each way).
  // Every rank keeps its tokens, no piece falls below m. Among the moves
  // that leave both A's and B's workload at most max(max_work, the plan's
  // current maximum) and raise the plan's maximum non-last tokens by at most
  // max_nonlast_growth, the one with the least resulting maximum over ranks
  // of non-last tokens (the allgather bottleneck), then the fewest tokens
  // added to cut pieces (g, or s), then the fewest whole tokens moved, wins.
  // True on success.
  bool FixByWhole(size_t c, size_t i) {
    std::vector<Piece>& p = docs[c];
    const int64_t s = p[i].len;
    const int32_t a = p[i].rank;
    const std::vector<double>& work = RankWorkloads();
    const double limit = std::max(max_work_, *std::max_element(work.begin(), work.end()));
    const std::vector<int64_t>& nonlast = RankNonlast();
    // The plan's maximum non-last tokens once this document's pieces are
    // `after` instead of p (only ranks A and B change).
    const auto max_nonlast_after = [&](const std::vector<Piece>& after, int32_t b) {
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
    };
    const int64_t max_nonlast_now = *std::max_element(nonlast.begin(), nonlast.end());
    std::vector<Piece> after;
    struct Move {
      int side = 0;        // -1: B's piece precedes the sliver, +1: follows
      bool grow = false;   // else absorb
      int64_t g = 0;       // tokens the sliver grows by (grow)
      size_t from_a = 0;   // index in whole[A] + 1 of the document A hands B (0: none)
      size_t from_b = 0;   // index in whole[B] + 1 of the document B hands A (0: none)
      int64_t max_nonlast = 0;  // the plan's, after the move
      int64_t cost = 0;    // tokens added to cut pieces
      int64_t moved = 0;   // whole tokens moved
    };
    Move best;
    bool found = false;
    // At most this many of each rank's shortest documents are tried (pairs:
    // its square), which bounds a fix's work at large N.
    constexpr size_t kMaxTried = 16;
    for (int side : {-1, +1}) {
      const int64_t j = static_cast<int64_t>(i) + side;
      if (j < 0 || j >= static_cast<int64_t>(p.size())) continue;
      const int32_t b = p[j].rank;
      const int64_t bl = p[j].len;
      const std::vector<std::pair<int64_t, int32_t>>& wa = whole[a];
      const std::vector<std::pair<int64_t, int32_t>>& wb = whole[b];
      const size_t na = std::min(wa.size(), kMaxTried), nb = std::min(wb.size(), kMaxTried);
      // This document's pieces after absorbing the sliver, and after
      // growing it by g (same pieces, other lengths).
      after = p;
      AbsorbPiece(after, i, side);
      const int64_t absorb_nonlast = max_nonlast_after(after, b);
      // Growing moves g tokens from piece j to piece i: non-last tokens
      // change only where those pieces are not their document's last.
      int64_t rest_max = 0;  // max non-last tokens over the ranks but A and B
      for (int32_t r = 0; r < n_; ++r) {
        if (r != a && r != b) rest_max = std::max(rest_max, nonlast[r]);
      }
      const bool i_nonlast = i + 1 < p.size();
      const bool j_nonlast = static_cast<size_t>(j) + 1 < p.size();
      const auto grow_nonlast = [&](int64_t g) {
        return std::max({rest_max, nonlast[a] + (i_nonlast ? g : 0),
                         nonlast[b] - (j_nonlast ? g : 0)});
      };
      const auto consider = [&](bool grow, int64_t g, size_t ia, size_t ib) {
        const int64_t la = ia > 0 ? wa[ia - 1].first : 0;
        const int64_t lb = ib > 0 ? wb[ib - 1].first : 0;
        Move mv{side, grow, g, ia, ib, grow ? grow_nonlast(g) : absorb_nonlast, grow ? g : s,
                la + lb};
        if (found && std::tie(mv.max_nonlast, mv.cost, mv.moved) >=
                         std::tie(best.max_nonlast, best.cost, best.moved)) {
          return;
        }
        // Workload A gains: the tokens its cut piece gains (or loses), plus
        // the whole documents it receives, minus those it hands over.
        double gain = RangeWorkload(0, lb) - RangeWorkload(0, la);
        if (grow) {
          gain += GrowthWorkload(p[i], side, g);
        } else {
          gain -= RangeWorkload(p[i].start, s);
        }
        if (work[a] + gain > limit || work[b] - gain > limit) return;
        if (mv.max_nonlast > max_nonlast_now + max_nonlast_growth_) return;
        best = mv;
        found = true;
      };
      const int64_t lo = m_ - s, hi = bl - m_;  // grow range for g
      for (size_t x = 0; x <= na; ++x) {
        const int64_t la = x > 0 ? wa[x - 1].first : 0;
        // g = la - lb must be in [lo, hi] or be -s: lb in [la - hi, la - lo]
        // or lb = la + s, and la - lo < la + s (lo > 0). wb is ascending, so
        // the y tried are a run: from the first with lb >= min(la - hi,
        // la + s) (y = 0 has lb = 0) while lb <= la + s, in the same order.
        const int64_t lb_min = std::min(la - hi, la + s);
        size_t y = 0;
        if (lb_min > 0) {
          y = 1 + static_cast<size_t>(
                      std::lower_bound(wb.begin(), wb.begin() + static_cast<std::ptrdiff_t>(nb),
                                       lb_min,
                                       [](const std::pair<int64_t, int32_t>& w, int64_t v) {
                                         return w.first < v;
                                       }) -
                      wb.begin());
        }
        for (; y <= nb; ++y) {
          const int64_t lb = y > 0 ? wb[y - 1].first : 0;
          if (lb > la + s) break;
          if (x == 0 && y == 0) continue;
          const int64_t g = la - lb;
          if (g >= lo && g <= hi) consider(true, g, x, y);
          if (g == -s) consider(false, 0, x, y);
        }
      }
    }
    if (!found) return false;
    const int64_t j = static_cast<int64_t>(i) + best.side;
    const int32_t b = p[j].rank;
    // The whole documents change ranks (kept ascending).
    // `work` and `nonlast` are not used after this: the edits change them.
    const auto take = [&](int32_t from, size_t index) {
      const std::pair<int64_t, int32_t> d = whole[from][index];
      whole[from].erase(whole[from].begin() + static_cast<std::ptrdiff_t>(index));
      MoveWholeWork(from, -1, d.first);
      return d;
    };
    const auto put = [&](int32_t to, std::pair<int64_t, int32_t> d) {
      auto& w = whole[to];
      w.insert(std::lower_bound(w.begin(), w.end(), d), d);
      MoveWholeWork(-1, to, d.first);
    };
    std::pair<int64_t, int32_t> da{0, -1}, db{0, -1};
    if (best.from_a > 0) da = take(a, best.from_a - 1);
    if (best.from_b > 0) db = take(b, best.from_b - 1);
    if (da.second >= 0) put(b, da);
    if (db.second >= 0) put(a, db);
    if (best.grow) {
      ShiftTracked(c, i, best.side, best.g);
      return true;
    }
    BeginEdit(c);
    AbsorbPiece(p, i, best.side);
    if (p.size() == 1) {  // the document is whole again
      put(p[0].rank, {p[0].len, doc_index[c]});
      p.clear();
    }
    EndEdit(c);
    return true;
  }

  // Removes the sliver at docs[c][i] (s tokens on rank A) by cutting a new
  // document, where neither a chain nor whole-document moves can (Fix,
  // FixByWhole): the sliver grows by m tokens out of its neighbour's piece
  // on rank B (which keeps >= m), and A hands B the m-token head of one of
  // its whole documents of >= 2m tokens (the shortest such, whose tail of
  // >= m stays on A as the document's last shard). Every rank keeps its
  // tokens and no piece is shorter than m. The head moves only W(0, m)
  // workload; the sliver's growth moves m tokens at its prefix p, about m p.
  // The same bounds as FixByWhole: A and B at most max(max_work, the current
  // maximum), the maximum non-last tokens up by at most max_nonlast_growth
  // (the head is non-last on B). Of the two neighbours, the one with the
  // least resulting maximum non-last tokens. True on success.
  bool FixByNewCut(size_t c, size_t i) {
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

 private:
  // A chain for a fix that moves `delta` tokens from `from` to `to` and
  // keeps the workload bound (KeepsBalance): the shortest chain first; if it
  // takes relay ranks over the bound, those are avoided and a chain is
  // sought again, at most four times (each O(N + cut pieces)).
  bool BalancedChain(int32_t from, int32_t to, int64_t delta, int32_t skip, int32_t a, int32_t b,
                     double gain_a, std::vector<Shift>& path) {
    banned_.assign(n_, 0);
    for (int tries = 0; tries < 4; ++tries) {
      if (!FindChain(from, to, delta, skip, path)) return false;
      if (KeepsBalance(path, delta, a, b, gain_a)) return true;
      bool more = false;
      for (int32_t r = 0; r < n_; ++r) {
        if (over_[r] && r != a && r != b) {
          banned_[r] = 1;
          more = true;
        }
      }
      if (!more) return false;
    }
    return false;
  }

  // Whether a chain fix keeps every rank it touches at most max(max_work,
  // the plan's current maximum workload), as the whole-document fixes must:
  // rank A gains `gain_a` workload from B (the sliver's own move), and each
  // shift of `path` moves `delta` tokens' workload across its boundary. So
  // that the repair never takes a plan that meets the target over it. Marks
  // the ranks over the bound in over_.
  bool KeepsBalance(const std::vector<Shift>& path, int64_t delta, int32_t a, int32_t b,
                    double gain_a) {
    std::vector<double>& work = balance_work_;
    work = RankWorkloads();
    const double limit = std::max(max_work_, *std::max_element(work.begin(), work.end()));
    work[a] += gain_a;
    work[b] -= gain_a;
    for (const Shift& sh : path) {
      const Piece& l = docs[sh.doc][sh.boundary];
      const Piece& r = docs[sh.doc][sh.boundary + 1];
      const double moved =
          sh.left_gives ? GrowthWorkload(r, -1, delta) : GrowthWorkload(l, +1, delta);
      work[sh.left_gives ? l.rank : r.rank] -= moved;
      work[sh.left_gives ? r.rank : l.rank] += moved;
    }
    over_.assign(n_, 0);
    bool ok = true;
    for (int32_t r = 0; r < n_; ++r) {
      if (work[r] > limit) {
        over_[r] = 1;
        ok = false;
      }
    }
    return ok;
  }

  // A shortest chain of cut-point shifts (not in document `skip`, not
  // through ranks marked in banned_) that moves `delta` tokens from rank
  // `from` to rank `to`, every shrinking piece keeping >= m tokens. A simple
  // path leaves each rank once, so no piece shrinks twice.
  bool FindChain(int32_t from, int32_t to, int64_t delta, int32_t skip,
                 std::vector<Shift>& path) {
    // The boundary graph is built on first use, then kept up to date by
    // every edit (BeginEdit, EndEdit); each edge keeps how many tokens its
    // shrinking piece can spare.
    if (dirty_) {
      // Counted first, so that each rank's list is allocated once.
      std::vector<int32_t>& degree = parent_;  // its buffer: the search assigns it below
      degree.assign(n_, 0);
      for (size_t c = 0; c < docs.size(); ++c) {
        DocEdges(c, [&](int32_t rank, const Edge&) { ++degree[rank]; });
      }
      adj_.resize(n_);
      for (int32_t r = 0; r < n_; ++r) {
        adj_[r].clear();
        adj_[r].reserve(degree[r]);
      }
      for (size_t c = 0; c < docs.size(); ++c) {
        DocEdges(c, [&](int32_t rank, const Edge& e) { adj_[rank].push_back(e); });
      }
      dirty_ = false;
    }
    const auto& adj = adj_;
    std::vector<int32_t>& parent = parent_;
    std::vector<Shift>& via = via_;
    std::vector<int32_t>& queue = queue_;
    parent.assign(n_, -2);
    via.resize(n_);
    queue.assign(1, from);
    parent[from] = -1;
    for (size_t q = 0; q < queue.size() && parent[to] == -2; ++q) {
      const int32_t x = queue[q];
      for (const Edge& e : adj[x]) {
        if (parent[e.dest] != -2 || e.spare < delta || e.shift.doc == skip) continue;
        if (!banned_.empty() && banned_[e.dest]) continue;
        parent[e.dest] = x;
        via[e.dest] = e.shift;
        queue.push_back(e.dest);
      }
    }
    if (parent[to] == -2) return false;
    path.clear();
    path.reserve(n_);  // a simple path: fewer than n_ shifts, allocated once
    for (int32_t x = to; parent[x] >= 0; x = parent[x]) path.push_back(via[x]);
    return true;
  }

  void Apply(const std::vector<Shift>& path, int64_t delta) {
    for (const Shift& sh : path) {
      const size_t b = static_cast<size_t>(sh.boundary);
      if (sh.left_gives) {
        ShiftTracked(static_cast<size_t>(sh.doc), b + 1, -1, delta);
      } else {
        ShiftTracked(static_cast<size_t>(sh.doc), b, +1, delta);
      }
    }
  }

  struct Edge {
    int32_t dest;
    int64_t spare;  // tokens the shrinking piece can give and keep >= m
    Shift shift;
  };
  // A rank's edges are in this order: by document, boundary, then the
  // left piece giving before the right one.
  static std::tuple<int32_t, int32_t, bool> EdgeKey(const Edge& e) {
    return {e.shift.doc, e.shift.boundary, !e.shift.left_gives};
  }
  // Calls f(giving rank, edge) for the edges of cut document c's boundaries
  // in EdgeKey order.
  template <typename F>
  void DocEdges(size_t c, F f) const {
    const std::vector<Piece>& p = docs[c];
    for (size_t b = 0; b + 1 < p.size(); ++b) {
      const Shift base{static_cast<int32_t>(c), static_cast<int32_t>(b), false};
      if (p[b].len > m_) {
        Shift sh = base;
        sh.left_gives = true;
        f(p[b].rank, Edge{p[b + 1].rank, p[b].len - m_, sh});
      }
      if (p[b + 1].len > m_) f(p[b + 1].rank, Edge{p[b].rank, p[b + 1].len - m_, base});
    }
  }

  int32_t n_;
  int64_t m_;
  double max_work_;  // no whole-document fix leaves a rank above this (or the current max)
  int64_t max_nonlast_growth_;  // nor raises the plan's max non-last tokens by more
  bool dirty_ = true;  // adj_ not built yet
  std::vector<std::vector<Edge>> adj_;
  // RankWorkloads' and RankNonlast's sums, once made; exact_: the batch's
  // workload is below 2^53 (set by Load).
  bool exact_ = false;
  bool work_valid_ = false, nonlast_valid_ = false;
  std::vector<double> work_;
  std::vector<int64_t> nonlast_;
  // Buffers reused by every chain search and balance check.
  std::vector<double> balance_work_;
  std::vector<int32_t> parent_, queue_;
  std::vector<Shift> via_;
  std::vector<char> banned_;  // per rank: FindChain avoids it (empty: none)
  std::vector<char> over_;    // per rank: over the bound in the last KeepsBalance
  // Load's per-document counts and slots; emptied vectors for cut documents.
  std::vector<int32_t> count_, slot_;
  std::vector<std::vector<Piece>> spare_docs_;
};

}  // namespace

struct RepairScratch::Buffers {
  SliverRepair repair;
};
RepairScratch::RepairScratch() : buffers(std::make_unique<Buffers>()) {}
RepairScratch::~RepairScratch() = default;

bool ShiftPiecesToRoom(const Batch& batch, int64_t min_shard, std::vector<Shard>& pieces,
                       std::vector<int64_t>& room) {
  const int32_t n = batch.cp_size;
  SliverRepair fit(n, min_shard, std::numeric_limits<double>::infinity(), kAnyNonlastGrowth);
  // Finished first although Load takes raw pieces: Emit lists the whole
  // documents in the order they were loaded, and the callers' later sums
  // and searches follow that order.
  fit.Load(batch, FinishPlan(batch, pieces).shards);
  std::vector<int64_t> left = room;
  for (int64_t tries = 4 * static_cast<int64_t>(n) + 16; tries > 0; --tries) {
    const auto over = std::min_element(left.begin(), left.end());
    if (*over >= 0) break;
    const auto under = std::max_element(left.begin(), left.end());
    const int32_t x = static_cast<int32_t>(over - left.begin());
    const int32_t y = static_cast<int32_t>(under - left.begin());
    // The whole difference if one chain can carry it, else less.
    bool moved = false;
    for (int64_t delta = std::min(-*over, *under); delta > 0 && !moved; delta /= 2) {
      if (fit.MoveTokens(x, y, delta)) {
        left[x] += delta;
        left[y] -= delta;
        moved = true;
      }
    }
    if (!moved) return false;
  }
  if (*std::min_element(left.begin(), left.end()) < 0) return false;
  room = left;
  pieces.clear();
  fit.Emit(pieces);
  return true;
}


std::vector<Shard> RepairSlivers(const Batch& batch, std::vector<Shard> pieces,
                                 int64_t min_shard, double max_workload,
                                 int64_t max_nonlast_growth) {
  RepairScratch scratch;
  return RepairSlivers(batch, std::move(pieces), min_shard, max_workload, max_nonlast_growth,
                       scratch);
}

std::vector<Shard> RepairSlivers(const Batch& batch, std::vector<Shard> pieces,
                                 int64_t min_shard, double max_workload,
                                 int64_t max_nonlast_growth, RepairScratch& scratch) {
  if (min_shard <= 1) return FinishPlan(batch, std::move(pieces)).shards;
  // Cut documents: those with a shard shorter than the document (merged).
  SliverRepair& repair = scratch.buffers->repair;
  repair.Reset(batch.cp_size, min_shard, max_workload, max_nonlast_growth);
  repair.Load(batch, pieces);
  // Passes until nothing changes: a fix can open a chain for a sliver that
  // had none. Each fix removes one sliver and creates none. Bounded work:
  // each attempt is O(cut pieces + documents) (up to four chain searches and
  // balance checks, plus at most 17^2 whole-document pairs per side). N + 16
  // attempts always; then up to four more per sliver at the start, so that a
  // plan of many slivers (a full 2N-chunk zigzag of short documents) gets the
  // passes it needs, but only while those extra attempts stay within 2^20
  // piece and document visits in all: the bound on a repair's time, which
  // would otherwise grow with the square of the slivers. What stays, the
  // caller's score charges.
  int64_t slivers = 0, pieces_now = 0;
  for (const std::vector<Piece>& p : repair.docs) {
    pieces_now += static_cast<int64_t>(p.size());
    for (const Piece& x : p) slivers += x.len < min_shard ? 1 : 0;
  }
  // `repair` holds the pieces now: its output reuses their buffer.
  std::vector<Shard>& out = pieces;
  out.clear();
  // Nothing to fix: the merged shards as they are.
  if (slivers == 0) {
    repair.Emit(out);
    return std::move(out);
  }
  for (auto& w : repair.whole) std::sort(w.begin(), w.end());
  const int64_t visits = pieces_now + static_cast<int64_t>(batch.doc_lens.size()) + 1;
  int64_t attempts = static_cast<int64_t>(batch.cp_size) + 16 +
                     std::min(4 * slivers, (int64_t{1} << 20) / visits);
  for (bool progress = true; progress && attempts > 0;) {
    progress = false;
    for (size_t c = 0; c < repair.docs.size() && attempts > 0; ++c) {
      for (size_t i = 0; i < repair.docs[c].size() && attempts > 0;) {
        const std::vector<Piece>& p = repair.docs[c];
        if (p.size() > 1 && p[i].len < min_shard) {
          --attempts;
          if (repair.Fix(c, i)) {
            progress = true;
            continue;  // position i now holds the next piece (or a grown one)
          }
        }
        ++i;
      }
    }
  }
  repair.Emit(out);
  return std::move(out);
}

double SliverFreeWorkloadBound(const Batch& batch, int64_t min_shard) {
  int64_t total = 0;
  for (int64_t len : batch.doc_lens) total += len;
  const int64_t floor_tokens = total / batch.cp_size;
  double bound = 0;
  for (int64_t len : batch.doc_lens) {
    const int64_t s = std::min(len, min_shard);
    bound = std::max(bound, RangeWorkload(len - s, s) +
                                static_cast<double>(std::max<int64_t>(0, floor_tokens - s)));
  }
  return bound;
}

Plan RepairCandidate(const Batch& batch, const FlashCpOptions& options, std::vector<Shard> pieces,
                     const PlanScore& score) {
  if (options.min_shard > 1 && score.slivers > 0) {
    Plan repaired = FinishPlan(batch, RepairSlivers(batch, pieces, options.min_shard,
                                                    options.max_work, options.sliver_cost));
    if (score.imbalance > options.target || ScorePlan(repaired).imbalance <= options.target) {
      return repaired;
    }
  }
  return FinishPlan(batch, std::move(pieces));
}

std::optional<Plan> RepairFallback(const Batch& batch, const FlashCpOptions& options,
                                   CompactedSearch& search,
                                   const std::vector<SearchCandidate>& candidates,
                                   const WinnerKey& winner) {
  std::optional<Plan> found;
  PlanScore found_score;
  size_t repairs = 0;
  for (size_t i = 0; i < candidates.size() && repairs < kMaxFallbacks; ++i) {
    const SearchCandidate& c = candidates[i];
    if (c.score.imbalance > options.target) break;  // sorted: the rest miss R too
    if (c.k == winner.k && c.reduced == winner.reduced && c.pieces.size() == winner.pieces &&
        SameScore(c.score, winner.score)) {
      continue;  // costs no repair slot
    }
    ++repairs;
    Plan other = RepairCandidate(batch, options,
                                 search.Assemble(c.pieces, c.placement, c.k, c.reduced), c.score);
    if (CountSlivers(other, options.min_shard) > 0) continue;
    const PlanScore score = ScorePlan(other);
    if (score.imbalance > options.target) continue;
    if (!found.has_value() || Better(score, found_score, options.target, options.sliver_cost)) {
      found = std::move(other);
      found_score = score;
    }
  }
  return found;
}

}  // namespace flashcp::core::internal
