// flashcp's sliver repair primitives (flashcp_repair.h's RepairSlivers and
// ShiftPiecesToRoom run on them): cut documents as pieces by start, whole
// documents per rank, and the edits that keep every rank's token count
// (cut-point shifts along chains, whole-document moves, new cuts).
// sliver_repair.cc holds the state and chain search, sliver_fix.cc the
// fixes of one sliver.
#ifndef FLASHCP_CORE_INTERNAL_SLIVER_REPAIR_H_
#define FLASHCP_CORE_INTERNAL_SLIVER_REPAIR_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

#include "core/internal/flashcp_pieces.h"
#include "core/internal/flashcp_tuning.h"
#include "core/types.h"

namespace flashcp::core::internal {

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
inline void ShiftCut(std::vector<Piece>& p, size_t i, int side, int64_t delta) {
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
inline double GrowthWorkload(const Piece& x, int side, int64_t g) {
  return side < 0 ? RangeWorkload(x.start - g, g) : RangeWorkload(x.start + x.len, g);
}

// Merges the first two touching pieces on one rank (one fix makes at most
// one such pair: the pieces either side of a removed sliver).
inline void MergeTouching(std::vector<Piece>& p) {
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
inline void AbsorbPiece(std::vector<Piece>& p, size_t i, int side) {
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
  void Reset(int32_t n, int64_t m, double max_work, int64_t max_nonlast_growth);

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
  void Load(const Batch& batch, std::span<const Shard> pieces);

  // Per-rank attention workload (SPEC Eq. 3) of the current pieces, summed
  // on first use in a fixed order (cut documents' pieces first, then whole
  // documents), then kept up to date by every edit (BeginEdit, EndEdit,
  // MoveWholeWork) in O(the edited pieces), not O(all pieces) per fix.
  // Each piece's workload is an integer, and while the batch's whole
  // workload is below 2^53 every partial sum is an exact double, so the
  // kept sums equal a fresh sum in any order (exact_); above that an edit
  // makes them stale and they are summed again in the fixed order, so the
  // bounds always compare the same sums.
  const std::vector<double>& RankWorkloads();

  // Per-rank non-last tokens (SPEC Eq. 5) of the cut documents' pieces
  // (whole documents have none); summed on first use, then kept up to date
  // by every edit (integers: exact).
  const std::vector<int64_t>& RankNonlast();

  // Every edit of cut document c's pieces is bracketed by these: BeginEdit
  // takes its part out of the sums and the boundary graph, EndEdit puts its
  // new part in (a document new in `docs` needs EndEdit only).
  void BeginEdit(size_t c);
  void EndEdit(size_t c);
  // ShiftCut(docs[c], i, side, delta) with the sums and the boundary graph
  // kept up to date: only pieces i and i + side change (their lengths, not
  // their ranks), so only their terms and the edges they give along change.
  void ShiftTracked(size_t c, size_t i, int side, int64_t delta);

  // A whole document of `len` tokens leaves rank `from` (-1: none) for rank
  // `to` (-1: none).
  void MoveWholeWork(int32_t from, int32_t to, int64_t len);

  // Appends the current pieces to `out`: the cut documents' pieces, then
  // each rank's whole documents.
  void Emit(std::vector<Shard>& out) const;

  // Moves `delta` tokens from rank `from` to rank `to` along a shortest
  // chain of cut-point shifts (every shrinking piece keeps >= m), without a
  // workload check; true on success.
  bool MoveTokens(int32_t from, int32_t to, int64_t delta);

  // Removes the sliver at docs[c][i] if a chain allows; true on success.
  bool Fix(size_t c, size_t i);

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
  bool FixByWhole(size_t c, size_t i);

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
  bool FixByNewCut(size_t c, size_t i);

 private:
  // One whole-document fix of a sliver (FixByWhole).
  struct WholeMove {
    int side = 0;        // -1: B's piece precedes the sliver, +1: follows
    bool grow = false;   // else absorb
    int64_t g = 0;       // tokens the sliver grows by (grow)
    size_t from_a = 0;   // index in whole[A] + 1 of the document A hands B (0: none)
    size_t from_b = 0;   // index in whole[B] + 1 of the document B hands A (0: none)
    int64_t max_nonlast = 0;  // the plan's, after the move
    int64_t cost = 0;    // tokens added to cut pieces
    int64_t moved = 0;   // whole tokens moved
  };
  // The sliver FixByWhole fixes (docs[c][i], s tokens on rank a) and the
  // bounds a move must keep.
  struct WholeFix {
    size_t c;
    size_t i;
    int64_t s;
    int32_t a;
    double limit;             // max(max_work, the plan's maximum rank workload)
    int64_t max_nonlast_now;  // the plan's maximum non-last tokens
  };

  // The plan's maximum non-last tokens once document c's pieces are
  // `after` instead of its own (only ranks a and b change).
  int64_t MaxNonlastAfter(size_t c, const std::vector<Piece>& after, int32_t a, int32_t b);

  // The first of whole[b]'s first nb documents (ascending) of at least
  // lb_min tokens, as an index + 1 (0 stands for "no document", length 0).
  size_t FirstWholeAtLeast(int32_t b, size_t nb, int64_t lb_min) const;

  // The moves with B the neighbour on `side`: absorb (A hands B exactly s
  // more whole tokens than it gets back) or grow by g (A hands B exactly g
  // more); the best so far into `best`.
  void SearchWholeMoves(const WholeFix& f, int side, WholeMove& best, bool& found);

  // `mv` into `best` where it beats it (least resulting maximum non-last
  // tokens, then cost, then whole tokens moved) and keeps the bounds.
  void ConsiderWholeMove(const WholeFix& f, int32_t b, const WholeMove& mv, WholeMove& best,
                         bool& found);

  // Whole document `index` of rank `from` taken off it.
  std::pair<int64_t, int32_t> TakeWhole(int32_t from, size_t index);
  // Whole document d onto rank `to` (its list kept ascending).
  void PutWhole(int32_t to, std::pair<int64_t, int32_t> d);

  // FixByWhole's move made.
  void ApplyWholeMove(size_t c, size_t i, const WholeMove& best);

  // A chain for a fix that moves `delta` tokens from `from` to `to` and
  // keeps the workload bound (KeepsBalance): the shortest chain first; if it
  // takes relay ranks over the bound, those are avoided and a chain is
  // sought again, at most four times (each O(N + cut pieces)).
  bool BalancedChain(int32_t from, int32_t to, int64_t delta, int32_t skip, int32_t a, int32_t b,
                     double gain_a, std::vector<Shift>& path);

  // Whether a chain fix keeps every rank it touches at most max(max_work,
  // the plan's current maximum workload), as the whole-document fixes must:
  // rank A gains `gain_a` workload from B (the sliver's own move), and each
  // shift of `path` moves `delta` tokens' workload across its boundary. So
  // that the repair never takes a plan that meets the target over it. Marks
  // the ranks over the bound in over_.
  bool KeepsBalance(const std::vector<Shift>& path, int64_t delta, int32_t a, int32_t b,
                    double gain_a);

  // A shortest chain of cut-point shifts (not in document `skip`, not
  // through ranks marked in banned_) that moves `delta` tokens from rank
  // `from` to rank `to`, every shrinking piece keeping >= m tokens. A simple
  // path leaves each rank once, so no piece shrinks twice.
  bool FindChain(int32_t from, int32_t to, int64_t delta, int32_t skip,
                 std::vector<Shift>& path);

  void Apply(const std::vector<Shift>& path, int64_t delta);

  struct Edge {
    int32_t dest;
    int64_t spare;  // tokens the shrinking piece can give and keep >= m
    Shift shift;
  };
  // A rank's edges are in this order: by document, boundary, then the
  // left piece giving before the right one.
  static std::tuple<int32_t, int32_t, bool> EdgeKey(const Edge& e);
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
  std::vector<Piece> after_;  // SearchWholeMoves' document after an absorb
};

}  // namespace flashcp::core::internal

#endif  // FLASHCP_CORE_INTERNAL_SLIVER_REPAIR_H_
