#include "core/internal/recut.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <optional>
#include <utility>
#include <vector>

#include "coin/CoinError.hpp"
#include "coin/CoinPackedMatrix.hpp"
#include "coin/OsiClpSolverInterface.hpp"
#include "core/internal/flashcp_pieces.h"
#include "core/internal/flashcp_slivers.h"
#include "core/internal/strategies_internal.h"

namespace flashcp::core::internal {
namespace {

// Q(x) = x (x + 1) / 2: the workload of a document's first x tokens, so a
// piece [a, e) has Q(e) - Q(a).
double Q(double x) { return PrefixWorkload(x); }

// One endpoint of a piece: a cut point (a column) or a fixed position (0 or
// the document's length).
struct End {
  int32_t cut = -1;  // column, or -1 when fixed
  double at = 0;     // the fixed position (cut < 0)
};

struct Piece {
  int32_t rank;
  End start, end;
  double weight = 1;  // cost per pair: the model's a (starts at 0) or b
};

// The program's pieces, cut points and per-rank constants.
struct Program {
  std::vector<Piece> pieces;           // of cut documents
  std::vector<double> cut_at;          // current position of each cut point
  std::vector<int64_t> cut_doc_len;    // its document's length
  std::vector<double> fixed_tokens;    // per rank: tokens of whole documents
  // Per rank: the cost that no cut point moves: whole documents' pairs, and
  // the model's per-sequence and per-token terms (0 for the pairs model).
  std::vector<double> fixed_work;
};

double At(const Program& p, const End& e, const std::vector<double>& cuts) {
  return e.cut < 0 ? e.at : cuts[e.cut];
}

// Exact per-rank workload at cut points `cuts`.
std::vector<double> Workloads(const Program& p, const std::vector<double>& cuts) {
  std::vector<double> w = p.fixed_work;
  for (const Piece& pc : p.pieces) {
    w[pc.rank] += pc.weight * (Q(At(p, pc.end, cuts)) - Q(At(p, pc.start, cuts)));
  }
  return w;
}

// The linear program, built once: rows 0..N-1 are the ranks' tokens
// (equalities), N..2N-1 their workloads less the maximum M (<= 0, as
// linearized), then one row per piece, end - start >= keep. Solve
// re-linearizes the workload rows at new cut points and re-solves from the
// previous basis (only their coefficients and bounds change). CLP may throw
// CoinError: callers catch.
class RecutLp {
 public:
  RecutLp(const Program& p, const std::vector<int64_t>& targets, double keep)
      : p_(p),
        n_ranks_(static_cast<int>(targets.size())),
        m_col_(static_cast<int>(p.cut_at.size())) {
    const int n_cuts = m_col_;
    std::vector<double> col_lb(n_cuts + 1, 0.0), col_ub(n_cuts + 1), obj(n_cuts + 1, 0.0);
    for (int c = 0; c < n_cuts; ++c) col_ub[c] = static_cast<double>(p.cut_doc_len[c]);
    col_ub[m_col_] = OsiClpInfinity;
    obj[m_col_] = 1.0;
    std::vector<int> rows, cols;
    std::vector<double> elems, row_lb, row_ub;
    const auto add = [&](int row, int col, double v) {
      rows.push_back(row);
      cols.push_back(col);
      elems.push_back(v);
    };
    std::vector<double> token_const(p.fixed_tokens);
    for (const Piece& pc : p.pieces) {
      for (const auto& [e, sign] : {std::pair{pc.end, 1.0}, std::pair{pc.start, -1.0}}) {
        if (e.cut < 0) {
          token_const[pc.rank] += sign * e.at;
        } else {
          add(pc.rank, e.cut, sign);
          // Each cut point is one piece's end and the next one's start, on
          // two ranks (FinishPlan merged touching pieces on one rank), so
          // no (row, column) pair repeats.
          add(n_ranks_ + pc.rank, e.cut, sign * pc.weight * (p.cut_at[e.cut] + 0.5));
          work_entries_.push_back({n_ranks_ + pc.rank, e.cut, sign * pc.weight});
        }
      }
    }
    for (int r = 0; r < n_ranks_; ++r) {
      const double t = static_cast<double>(targets[r]) - token_const[r];
      row_lb.push_back(t);
      row_ub.push_back(t);
    }
    for (int r = 0; r < n_ranks_; ++r) {
      add(n_ranks_ + r, m_col_, -1.0);
      row_lb.push_back(-OsiClpInfinity);
      row_ub.push_back(0.0);
    }
    int row = 2 * n_ranks_;
    for (const Piece& pc : p.pieces) {
      double lb = keep;
      if (pc.end.cut >= 0) {
        add(row, pc.end.cut, 1.0);
      } else {
        lb -= pc.end.at;
      }
      if (pc.start.cut >= 0) {
        add(row, pc.start.cut, -1.0);
      } else {
        lb += pc.start.at;
      }
      row_lb.push_back(lb);
      row_ub.push_back(OsiClpInfinity);
      ++row;
    }
    solver_.messageHandler()->setLogLevel(0);
    solver_.setHintParam(OsiDoReducePrint, true, OsiHintTry);
    const CoinPackedMatrix matrix(false, rows.data(), cols.data(), elems.data(),
                                  static_cast<CoinBigIndex>(elems.size()));
    solver_.loadProblem(matrix, col_lb.data(), col_ub.data(), obj.data(), row_lb.data(),
                        row_ub.data());
  }

  // The cut points minimizing the maximum workload as linearized at `at`,
  // or nullopt when the program is infeasible or not solved.
  std::optional<std::vector<double>> Solve(const std::vector<double>& at) {
    // Q(x) ~ Q(x0) + (x0 + 1/2)(x - x0) at each moving endpoint.
    std::vector<double> work_const(p_.fixed_work);
    for (const Piece& pc : p_.pieces) {
      for (const auto& [e, sign] : {std::pair{pc.end, 1.0}, std::pair{pc.start, -1.0}}) {
        if (e.cut < 0) {
          work_const[pc.rank] += sign * pc.weight * Q(e.at);
        } else {
          const double x0 = at[e.cut];
          work_const[pc.rank] += sign * pc.weight * (Q(x0) - (x0 + 0.5) * x0);
        }
      }
    }
    for (const WorkEntry& w : work_entries_) {
      solver_.modifyCoefficient(w.row, w.col, w.sign * (at[w.col] + 0.5));
    }
    for (int r = 0; r < n_ranks_; ++r) solver_.setRowUpper(n_ranks_ + r, -work_const[r]);
    if (solved_) {
      solver_.resolve();
    } else {
      solver_.initialSolve();
      solved_ = true;
    }
    if (!solver_.isProvenOptimal()) return std::nullopt;
    const double* x = solver_.getColSolution();
    return std::vector<double>(x, x + m_col_);
  }

 private:
  struct WorkEntry {
    int row, col;
    double sign;  // +weight: the cut ends a piece of the row's rank; -weight: starts one
  };
  const Program& p_;
  const int n_ranks_;
  const int m_col_;  // the maximum rank workload; cut point c is column c
  std::vector<WorkEntry> work_entries_;
  OsiClpSolverInterface solver_;
  bool solved_ = false;
};

// Per-rank cost of merged shards: SPEC Eq. 3 for the pairs model (exactly
// PieceWorkloads), else the model's.
std::vector<double> RankCosts(int32_t n, const std::vector<Shard>& shards,
                              const CostCoefficients& cost, absl::Span<const double> rank_speed) {
  if (IsPairsModel(cost) && rank_speed.empty()) return PieceWorkloads(n, shards);
  std::vector<double> w(n, 0.0);
  for (const Shard& s : shards) {
    w[s.rank] += (s.start == 0 ? cost.whole_pair : cost.prefixed_pair) *
                     RangeWorkload(s.start, s.len) +
                 cost.sequence + cost.token * static_cast<double>(s.len);
  }
  for (size_t r = 0; r < rank_speed.size() && r < w.size(); ++r) w[r] *= rank_speed[r];
  return w;
}

// A heuristic early out before merging: far more raw cut points than the
// bound (merging touching pieces on one rank removes one in 2c - 1 of a
// reduced zigzag's, but could remove more elsewhere; the exact count after
// merging is checked later).
bool TooManyRawCuts(const Batch& batch, const std::vector<Shard>& pieces) {
  std::vector<int32_t> per_doc(batch.doc_lens.size(), 0);
  for (const Shard& s : pieces) ++per_doc[s.doc];
  int64_t raw_cuts = 0;
  for (int32_t c : per_doc) raw_cuts += std::max(c - 1, 0);
  return raw_cuts > 2 * kMaxRecutCuts;
}

// The program of `shards` (merged, sorted by document then start): whole
// documents fixed, each cut document's pieces with their cut points as
// variables; piece_shard gets each program piece's shard index.
Program BuildProgram(const Batch& batch, const std::vector<Shard>& shards,
                     const CostCoefficients& cost, std::vector<int32_t>& piece_shard) {
  const bool pairs = IsPairsModel(cost);
  Program p;
  p.fixed_tokens.assign(batch.cp_size, 0.0);
  p.fixed_work.assign(batch.cp_size, 0.0);
  for (size_t i = 0; i < shards.size();) {
    size_t j = i;
    while (j < shards.size() && shards[j].doc == shards[i].doc) ++j;
    const int64_t len = batch.doc_lens[shards[i].doc];
    if (j - i == 1) {
      p.fixed_tokens[shards[i].rank] += static_cast<double>(len);
      p.fixed_work[shards[i].rank] +=
          pairs ? Q(static_cast<double>(len))
                : cost.whole_pair * Q(static_cast<double>(len)) + cost.sequence;
      i = j;
      continue;
    }
    for (size_t k = i; k < j; ++k) {
      Piece pc{shards[k].rank, End{}, End{}, k == i ? cost.whole_pair : cost.prefixed_pair};
      if (!pairs) p.fixed_work[shards[k].rank] += cost.sequence;
      if (k == i) {
        pc.start.at = 0;
      } else {
        pc.start.cut = static_cast<int32_t>(p.cut_at.size()) - 1;
      }
      if (k + 1 == j) {
        pc.end.at = static_cast<double>(len);
      } else {
        pc.end.cut = static_cast<int32_t>(p.cut_at.size());
        p.cut_at.push_back(static_cast<double>(shards[k + 1].start));
        p.cut_doc_len.push_back(len);
      }
      p.pieces.push_back(pc);
      piece_shard.push_back(static_cast<int32_t>(k));
    }
    i = j;
  }
  return p;
}

// The model's per-token cost, and rank speeds scaling every term of a
// rank's cost: its pieces' pair weights and its constants.
void AddRankTerms(const std::vector<int64_t>& targets, const CostCoefficients& cost,
                  absl::Span<const double> rank_speed, Program& p) {
  const int32_t n = static_cast<int32_t>(targets.size());
  if (!IsPairsModel(cost)) {
    for (int32_t r = 0; r < n; ++r) {
      p.fixed_work[r] += cost.token * static_cast<double>(targets[r]);
    }
  }
  if (static_cast<int32_t>(rank_speed.size()) == n) {
    for (Piece& pc : p.pieces) pc.weight *= rank_speed[pc.rank];
    for (int32_t r = 0; r < n; ++r) p.fixed_work[r] *= rank_speed[r];
  }
}

// Plain infeasibility (CLP takes longer to prove it): a rank whose whole
// documents and minimal pieces (keep + 1 tokens each) exceed its tokens,
// or that holds no piece to grow and misses them.
bool PlainlyInfeasible(const Program& p, const std::vector<int64_t>& targets, int64_t keep) {
  const size_t n = targets.size();
  std::vector<double> least(p.fixed_tokens);
  std::vector<char> has_piece(n, 0);
  for (const Piece& pc : p.pieces) {
    least[pc.rank] += static_cast<double>(keep + 1);
    has_piece[pc.rank] = 1;
  }
  for (size_t r = 0; r < n; ++r) {
    const double t = static_cast<double>(targets[r]);
    if (least[r] > t || (!has_piece[r] && p.fixed_tokens[r] != t)) return true;
  }
  return false;
}

// Each round re-linearizes at the previous solution; rounds stop when the
// exact maximum stops falling (the program has many optima, which pin only
// the heaviest rank, so a round can also land somewhere worse), and the
// best cut points are returned (none where no round solved). Pieces get one
// token of slack (>= keep + 1) for the rounding after.
std::optional<std::vector<double>> SolveRounds(const Program& p,
                                               const std::vector<int64_t>& targets,
                                               int64_t keep, int32_t rounds) {
  std::vector<double> at = p.cut_at, best;
  double best_max = 0;
  try {
    RecutLp lp(p, targets, static_cast<double>(keep + 1));
    for (int32_t round = 0; round < rounds; ++round) {
      std::optional<std::vector<double>> next = lp.Solve(at);
      if (!next.has_value()) break;
      at = *std::move(next);
      const std::vector<double> w = Workloads(p, at);
      const double max_w = *std::max_element(w.begin(), w.end());
      if (!best.empty() && max_w >= best_max) break;
      best = at;
      best_max = max_w;
    }
  } catch (const CoinError&) {
    return std::nullopt;
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (best.empty()) return std::nullopt;
  return best;
}

// Integral cut points into `out` (the shards, as the program's pieces
// index them); false where a piece would fall under keep tokens.
bool RoundCuts(const Program& p, const std::vector<double>& at,
               const std::vector<int32_t>& piece_shard, int64_t keep, std::vector<Shard>& out) {
  for (size_t k = 0; k < p.pieces.size(); ++k) {
    const Piece& pc = p.pieces[k];
    const int64_t a = pc.start.cut < 0 ? static_cast<int64_t>(pc.start.at)
                                       : std::llround(at[pc.start.cut]);
    const int64_t e = pc.end.cut < 0 ? static_cast<int64_t>(pc.end.at)
                                     : std::llround(at[pc.end.cut]);
    if (e - a < keep) return false;
    out[piece_shard[k]].start = a;
    out[piece_shard[k]].len = e - a;
  }
  return true;
}

}  // namespace

std::optional<double> RecutPieces(const Batch& batch, std::vector<Shard>& pieces,
                                  int64_t min_shard, int32_t rounds, double accept_below,
                                  const CostCoefficients& cost,
                                  absl::Span<const double> rank_speed) {
  if (TooManyRawCuts(batch, pieces)) return std::nullopt;
  std::vector<Shard> shards = FinishPlan(batch, pieces).shards;
  std::sort(shards.begin(), shards.end(), [](const Shard& a, const Shard& b) {
    return a.doc != b.doc ? a.doc < b.doc : a.start < b.start;
  });
  std::vector<int32_t> piece_shard;  // shard index of each program piece
  Program p = BuildProgram(batch, shards, cost, piece_shard);
  if (p.cut_at.empty() || static_cast<int64_t>(p.cut_at.size()) > kMaxRecutCuts) {
    return std::nullopt;
  }
  const std::vector<int64_t> targets = RankTargets(batch);
  AddRankTerms(targets, cost, rank_speed, p);
  const int64_t keep = std::max<int64_t>(min_shard, 1);
  if (PlainlyInfeasible(p, targets, keep)) return std::nullopt;
  const std::optional<std::vector<double>> at = SolveRounds(p, targets, keep, rounds);
  if (!at.has_value()) return std::nullopt;
  // Integral cut points; the rounding's token errors go back along chains.
  std::vector<Shard> out = shards;
  if (!RoundCuts(p, *at, piece_shard, keep, out)) return std::nullopt;
  std::vector<int64_t> room = targets;
  for (const Shard& s : out) room[s.rank] -= s.len;
  if (std::any_of(room.begin(), room.end(), [](int64_t r) { return r != 0; }) &&
      !ShiftPiecesToRoom(batch, keep, out, room)) {
    return std::nullopt;
  }
  if (std::any_of(room.begin(), room.end(), [](int64_t r) { return r != 0; })) {
    return std::nullopt;
  }
  const std::vector<double> w = RankCosts(batch.cp_size, out, cost, rank_speed);
  const double max_w = *std::max_element(w.begin(), w.end());
  if (!(max_w < accept_below)) return std::nullopt;
  pieces = std::move(out);
  return max_w;
}

}  // namespace flashcp::core::internal
