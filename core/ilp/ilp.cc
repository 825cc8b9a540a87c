// The `ilp` strategy: an exact MILP over block-to-rank assignments, solved by
// CBC with a time limit (docs/ilp.md has the model, its linearization and
// measured solve times).
//
// Blocks. Every document is cut at multiples of the granularity g (its last
// block may be shorter) and, in addition, at every shard boundary of the Ring
// and Llama3 plans (at most 3N - 2 extra cuts in all) and of the best other
// heuristic plan that keeps the model within kMaxBinaryVars. Variables
// x[b][r] in {0,1} put block b on rank r.
//
// Exact equal tokens. Each rank's token row is an equality over integers,
//   sum_b len_b * x[b][r] = RankRealTokens(total, N, r),
// so every plan the model admits meets the invariant exactly, with no repair
// step and nothing left out of the reported objective. A plain g-grid may
// admit no such plan (docs [6, 6, 6] on 4 ranks at g = 6 needs 5, 5, 4, 4
// tokens); the Ring and Llama3 cut points make those two plans representable,
// so the model is always feasible. The price: at g > 1 a plan can only cut a
// document on the grid or at those points; at g = 1 every plan is
// representable and the optimum is the true optimum.
//
// Objective (SPEC Eq. 3 and Eq. 5), minimized:
//   max_r W_r + comm_weight * max_r nonlast_r
// A block's workload W_b = (2 start + len + 1) len / 2 is a constant, and W is
// additive over a document's blocks, so W_r = sum_b W_b x[b][r] is linear. A
// block is in the last shard of its document iff it and every later block of
// the document sit on one rank. With z[b][r] in [0,1] for each non-final block
//   z[b][r] <= x[b][r],  z[b][r] <= z[b+1][r]   (z of a final block is x)
// nonlast_r = sum_b len_b (x[b][r] - z[b][r]). Only upper bounds on z are
// needed: the objective pushes z up on the rank with the most non-last tokens,
// where z then equals the indicator; on other ranks a z below its indicator
// only overstates a non-binding row. The plan's objective is recomputed from
// the plan itself (Objective), never read off z.
//
// Incumbent. CBC starts from the best, by that objective, of every other
// strategy's plan the blocks can represent (the best one always is, when it
// fits the bound), so the ILP is never worse than any heuristic, even when
// stopped at once. Past tiny instances CBC rarely improves on it: the LP
// relaxation spreads every block evenly over the ranks, which is perfectly
// balanced and has no non-last tokens, so its bound stays at 1 (docs/ilp.md).
//
// Scaling. Rows are in pairs and tokens; the objective is divided by the mean
// rank workload, so it reads imbalance + comm_weight * max nonlast / mean W,
// and the reported gap is relative to it.
#include "core/ilp/ilp.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <functional>
#include <limits>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "coin/CbcEventHandler.hpp"
#include "coin/CbcModel.hpp"
#include "coin/ClpEventHandler.hpp"
#include "coin/CoinError.hpp"
#include "coin/CoinPackedMatrix.hpp"
#include "coin/OsiClpSolverInterface.hpp"
#include "core/analysis.h"
#include "core/internal/strategies_internal.h"
#include "core/status_macros.h"

namespace flashcp::core::ilp {

using internal::FinishPlan;
using internal::PlanLlama3;
using internal::PlanRing;

namespace {

// CBC's cutoff increment, in units of the mean rank workload: a solution must
// beat the incumbent by this much to be searched for. CBC's default (1e-5)
// would hide improvements of a few pairs on a 10^5-pair batch.
constexpr double kCutoffIncrement = 1e-7;

// Largest value an integer column may take (see BuildModel).
constexpr double kMaxIntegralColumn = 1 << 24;

struct Block {
  int32_t doc = 0;
  int64_t start = 0;
  int64_t len = 0;
  bool final = false;  // the last block of its document
};

// The MILP's columns and rows, in CBC's terms.
struct Model {
  int32_t ranks = 0;
  std::vector<Block> blocks;
  std::vector<int> z_base;  // per block: column of z[b][0], -1 for a final block
  std::vector<int32_t> group_start;  // per rank: first rank with the same token target
  std::vector<int> c_base;  // per rank r: column of c[0][r], or -1 (see BuildModel)
  int w_col = 0;            // max rank workload, (query, key) pairs
  int m_col = 0;            // max rank non-last tokens
  int num_cols = 0;
  double mean_work = 1.0;  // mean rank workload, (query, key) pairs
  bool w_integral = false;  // w_col is an integer column
  bool m_integral = false;  // m_col is an integer column
  std::vector<double> col_lb, col_ub, obj;
  std::vector<int> row_idx, col_idx;
  std::vector<double> elems;
  std::vector<double> row_lb, row_ub;

  int X(size_t b, int32_t r) const { return static_cast<int>(b) * ranks + r; }
  int C(size_t b, int32_t r) const { return c_base[r] + static_cast<int>(b); }
  int NextZ(size_t b, int32_t r) const {  // z[b+1][r], or x[b+1][r] when b+1 is final
    return blocks[b + 1].final ? X(b + 1, r) : z_base[b + 1] + r;
  }
  int AddRow(double lb, double ub) {
    row_lb.push_back(lb);
    row_ub.push_back(ub);
    return static_cast<int>(row_lb.size()) - 1;
  }
  void Add(int row, int col, double v) {
    row_idx.push_back(row);
    col_idx.push_back(col);
    elems.push_back(v);
  }
};

// Blocks of at most `g` tokens, also cut at every shard boundary of `plans`.
std::vector<Block> MakeBlocks(const Batch& batch, int64_t g, const std::vector<Plan>& plans) {
  std::vector<std::vector<int64_t>> cuts(batch.doc_lens.size());
  for (const Plan& p : plans) {
    for (const Shard& s : p.shards) {
      cuts[s.doc].push_back(s.start);
      cuts[s.doc].push_back(s.start + s.len);
    }
  }
  std::vector<Block> blocks;
  for (size_t d = 0; d < batch.doc_lens.size(); ++d) {
    const int64_t len = batch.doc_lens[d];
    std::vector<int64_t>& c = cuts[d];
    for (int64_t a = 0; a < len; a += g) c.push_back(a);
    c.push_back(len);
    std::sort(c.begin(), c.end());
    c.erase(std::unique(c.begin(), c.end()), c.end());
    for (size_t i = 0; i + 1 < c.size(); ++i) {
      blocks.push_back(Block{static_cast<int32_t>(d), c[i], c[i + 1] - c[i], i + 2 == c.size()});
    }
  }
  return blocks;
}

Model BuildModel(const Batch& batch, std::vector<Block> blocks, double mean_work,
                 double comm_weight) {
  const int32_t n = batch.cp_size;
  const int64_t total = TotalTokens(batch.doc_lens);
  constexpr double kInf = std::numeric_limits<double>::infinity();

  Model m;
  m.ranks = n;
  m.mean_work = mean_work;
  m.blocks = std::move(blocks);
  const size_t nb = m.blocks.size();
  int next = static_cast<int>(nb) * n;
  m.z_base.assign(nb, -1);
  for (size_t b = 0; b < nb; ++b) {
    if (!m.blocks[b].final) {
      m.z_base[b] = next;
      next += n;
    }
  }
  // Symmetry: ranks with equal token targets are interchangeable (the groups
  // [0, N - pad) and [N - pad, N), pad = padding tokens), so the model keeps
  // only plans whose ranks within a group are ordered by their first block:
  // rank r above its group's start may hold block b only if rank r - 1 holds
  // a block before b. With c[b][r-1] = sum_{b' <= b} x[b'][r-1] (continuous):
  //   x[b][r] <= c[b-1][r-1]   and   x[b][r] = 0 for b < r - group start.
  // Every rank holds >= 1 token (N <= total), so any plan has such a relabeling.
  const int64_t pad = PaddingTokens(total, n);
  m.group_start.resize(n);
  m.c_base.assign(n, -1);
  for (int32_t r = 0; r < n; ++r) m.group_start[r] = r < n - pad ? 0 : static_cast<int32_t>(n - pad);
  for (int32_t r = 0; r + 1 < n; ++r) {
    if (m.group_start[r + 1] == m.group_start[r] && nb > 1) {
      m.c_base[r] = next;
      next += static_cast<int>(nb) - 1;  // c[b][r] for b < nb - 1
    }
  }
  m.w_col = next++;
  m.m_col = next++;
  m.num_cols = next;
  m.col_lb.assign(next, 0.0);
  m.col_ub.assign(next, 1.0);
  m.obj.assign(next, 0.0);
  m.col_ub[m.w_col] = kInf;
  m.col_ub[m.m_col] = kInf;
  m.obj[m.w_col] = 1.0 / mean_work;
  m.obj[m.m_col] = comm_weight / mean_work;
  // Both maxima are integers (pairs, tokens); declaring them so lets CBC round
  // its bounds up, which is most of what proves small instances optimal. Past
  // kMaxIntegralColumn a double no longer resolves CBC's integer tolerance.
  m.w_integral = mean_work * n <= kMaxIntegralColumn;
  m.m_integral = static_cast<double>(total) <= kMaxIntegralColumn;
  // Valid lower bounds: some rank holds at least the mean, and every block.
  double lb = m.w_integral ? std::ceil(mean_work - 1e-9) : mean_work;
  for (const Block& k : m.blocks) lb = std::max(lb, ShardWorkload(k.start, k.len));
  m.col_lb[m.w_col] = lb;

  for (int32_t r = 0; r < n; ++r) {
    for (size_t b = 0; b < nb && static_cast<int64_t>(b) < r - m.group_start[r]; ++b) {
      m.col_ub[m.X(b, r)] = 0.0;
    }
    if (m.c_base[r] < 0) continue;
    for (size_t b = 0; b + 1 < nb; ++b) {  // c[b][r] = c[b-1][r] + x[b][r]
      const int row = m.AddRow(0.0, 0.0);
      m.Add(row, m.C(b, r), 1.0);
      m.Add(row, m.X(b, r), -1.0);
      if (b > 0) m.Add(row, m.C(b - 1, r), -1.0);
      m.col_ub[m.C(b, r)] = static_cast<double>(b + 1);
      const int order = m.AddRow(-kInf, 0.0);  // x[b+1][r+1] <= c[b][r]
      m.Add(order, m.X(b + 1, r + 1), 1.0);
      m.Add(order, m.C(b, r), -1.0);
    }
  }

  for (size_t b = 0; b < nb; ++b) {  // each block on exactly one rank
    const int row = m.AddRow(1.0, 1.0);
    for (int32_t r = 0; r < n; ++r) m.Add(row, m.X(b, r), 1.0);
  }
  for (int32_t r = 0; r < n; ++r) {
    const double target = static_cast<double>(RankRealTokens(total, n, r));
    const int tokens = m.AddRow(target, target);  // integer coefficients: exact
    const int work = m.AddRow(-kInf, 0.0);
    const int nonlast = m.AddRow(-kInf, 0.0);
    for (size_t b = 0; b < nb; ++b) {
      const Block& k = m.blocks[b];
      m.Add(tokens, m.X(b, r), static_cast<double>(k.len));
      m.Add(work, m.X(b, r), ShardWorkload(k.start, k.len));
      if (!k.final) {
        const double t = static_cast<double>(k.len);
        m.Add(nonlast, m.X(b, r), t);
        m.Add(nonlast, m.z_base[b] + r, -t);
        const int zx = m.AddRow(-kInf, 0.0);  // z[b][r] <= x[b][r]
        m.Add(zx, m.z_base[b] + r, 1.0);
        m.Add(zx, m.X(b, r), -1.0);
        const int zn = m.AddRow(-kInf, 0.0);  // z[b][r] <= z[b+1][r]
        m.Add(zn, m.z_base[b] + r, 1.0);
        m.Add(zn, m.NextZ(b, r), -1.0);
      }
    }
    m.Add(work, m.w_col, -1.0);
    m.Add(nonlast, m.m_col, -1.0);
  }
  return m;
}

// Each block's owner in `plan`, whose shard boundaries are all block
// boundaries; nullopt if a block straddles two shards.
std::optional<std::vector<int32_t>> OwnersOf(const Plan& plan, const std::vector<Block>& blocks) {
  std::vector<Shard> shards = plan.shards;
  std::sort(shards.begin(), shards.end(), [](const Shard& a, const Shard& b) {
    return std::tie(a.doc, a.start) < std::tie(b.doc, b.start);
  });
  std::vector<int32_t> owners(blocks.size());
  size_t s = 0;
  for (size_t b = 0; b < blocks.size(); ++b) {
    const Block& k = blocks[b];
    while (s < shards.size() && (shards[s].doc < k.doc || (shards[s].doc == k.doc &&
                                                           shards[s].start + shards[s].len <= k.start))) {
      ++s;
    }
    if (s == shards.size() || shards[s].doc != k.doc || shards[s].start > k.start ||
        shards[s].start + shards[s].len < k.start + k.len) {
      return std::nullopt;
    }
    owners[b] = shards[s].rank;
  }
  return owners;
}

// Relabels ranks within each target group in order of their first block, the
// one labeling the symmetry rows admit; token targets and objective unchanged.
void Canonicalize(const Model& m, std::vector<int32_t>& owners) {
  std::vector<int32_t> label(m.ranks, -1);
  std::vector<int32_t> next(m.ranks);
  for (int32_t r = 0; r < m.ranks; ++r) next[r] = m.group_start[r];
  for (int32_t& o : owners) {
    if (label[o] < 0) label[o] = next[m.group_start[o]]++;
    o = label[o];
  }
}

// The full column vector (x, z, max workload, max non-last) of an assignment.
std::vector<double> SolutionOf(const Model& m, const std::vector<int32_t>& owners) {
  std::vector<double> sol(m.num_cols, 0.0);
  std::vector<double> work(m.ranks, 0.0), nonlast(m.ranks, 0.0);
  bool tail_same = true;  // after block i: blocks i.. of its document all on owners[i]
  for (size_t i = m.blocks.size(); i-- > 0;) {
    const Block& k = m.blocks[i];
    const int32_t r = owners[i];
    sol[m.X(i, r)] = 1.0;
    work[r] += ShardWorkload(k.start, k.len);
    if (k.final) {
      tail_same = true;
    } else {
      tail_same = tail_same && owners[i + 1] == r;
      if (tail_same) {
        sol[m.z_base[i] + r] = 1.0;
      } else {
        nonlast[r] += static_cast<double>(k.len);
      }
    }
  }
  for (int32_t r = 0; r < m.ranks; ++r) {
    if (m.c_base[r] < 0) continue;
    double held = 0.0;
    for (size_t b = 0; b + 1 < m.blocks.size(); ++b) {
      held += sol[m.X(b, r)];
      sol[m.C(b, r)] = held;
    }
  }
  sol[m.w_col] = *std::max_element(work.begin(), work.end());
  sol[m.m_col] = *std::max_element(nonlast.begin(), nonlast.end());
  return sol;
}

// The owners of a CBC solution: each block's rank with the largest x.
std::vector<int32_t> OwnersFromSolution(const Model& m, const double* sol) {
  std::vector<int32_t> owners(m.blocks.size());
  for (size_t b = 0; b < m.blocks.size(); ++b) {
    int32_t best = 0;
    for (int32_t r = 1; r < m.ranks; ++r) {
      if (sol[m.X(b, r)] > sol[m.X(b, best)]) best = r;
    }
    owners[b] = best;
  }
  return owners;
}

Plan PlanOfOwners(const Batch& batch, const Model& m, const std::vector<int32_t>& owners) {
  std::vector<Shard> pieces;
  pieces.reserve(m.blocks.size());
  for (size_t b = 0; b < m.blocks.size(); ++b) {
    const Block& k = m.blocks[b];
    pieces.push_back(Shard{k.doc, k.start, k.len, owners[b]});
  }
  return FinishPlan(batch, std::move(pieces));
}

struct CbcResult {
  std::optional<std::vector<int32_t>> owners;  // CBC's best solution, if any
  bool proven_optimal = false;
  double bound = -std::numeric_limits<double>::infinity();  // in mean workloads
};

// Whether the call is stopped or its time is up (IlpOptions::seconds_left).
// Both point at the caller's objects, which outlive the solve.
struct StopOrTimeUp {
  const StopToken* stop;
  const std::function<double()>* seconds_left;
  bool operator()() const {
    return !stop->Check().ok() || (*seconds_left && (*seconds_left)() <= 0);
  }
};

// Ends CBC's search at its next event (nodes, solutions) once StopOrTimeUp.
// CBC keeps a clone.
class CbcStop final : public CbcEventHandler {
 public:
  explicit CbcStop(StopOrTimeUp stopped) : stopped_(stopped) {}
  CbcAction event(CbcEvent /*which*/) override {
    return stopped_() ? CbcAction::stop : CbcAction::noAction;
  }
  CbcEventHandler* clone() const override { return new CbcStop(*this); }

 private:
  StopOrTimeUp stopped_;
};

// Ends an LP solve at its next simplex iteration once StopOrTimeUp: CBC's
// first LP and the check of the incumbent are simplex runs of seconds on
// large models, outside CBC's events and time limit. The stopped LP leaves
// CBC without a solution of its own; Solve then keeps the incumbent.
class ClpStop final : public ClpEventHandler {
 public:
  explicit ClpStop(StopOrTimeUp stopped) : stopped_(stopped) {}
  int event(Event which) override { return which == endOfIteration && stopped_() ? 0 : -1; }
  ClpEventHandler* clone() const override { return new ClpStop(*this); }

 private:
  StopOrTimeUp stopped_;
};

// Runs CBC, silenced, with `start` as its first incumbent, for at most
// options.time_limit_seconds (less what options.seconds_left says is left).
// No exception leaves.
absl::StatusOr<CbcResult> SolveWithCbc(const Model& m, const std::vector<double>* start,
                                       double start_obj, const IlpOptions& options,
                                       const StopToken& stop) {
  double time_limit_seconds = options.time_limit_seconds;
  if (options.seconds_left) {
    time_limit_seconds = std::max(0.0, std::min(time_limit_seconds, options.seconds_left()));
  }
  try {
    OsiClpSolverInterface solver;
    solver.messageHandler()->setLogLevel(0);
    solver.setHintParam(OsiDoReducePrint, true, OsiHintTry);
    const StopOrTimeUp stopped{&stop, &options.seconds_left};
    const ClpStop lp_stop(stopped);
    solver.getModelPtr()->passInEventHandler(&lp_stop);  // cloned, also into CBC's copy
    const CoinPackedMatrix matrix(false, m.row_idx.data(), m.col_idx.data(), m.elems.data(),
                                  static_cast<CoinBigIndex>(m.elems.size()));
    solver.loadProblem(matrix, m.col_lb.data(), m.col_ub.data(), m.obj.data(), m.row_lb.data(),
                       m.row_ub.data());
    for (size_t b = 0; b < m.blocks.size(); ++b) {
      for (int32_t r = 0; r < m.ranks; ++r) solver.setInteger(m.X(b, r));
    }
    if (m.w_integral) solver.setInteger(m.w_col);
    if (m.m_integral) solver.setInteger(m.m_col);

    CbcModel model(solver);
    model.setLogLevel(0);
    model.messageHandler()->setLogLevel(0);
    model.solver()->messageHandler()->setLogLevel(0);
    // No CbcStrategyDefault: its cut generators and heuristics made the
    // small-instance proofs slower (docs/ilp.md), and the heuristics' plans
    // already give CBC a good incumbent.
    model.setUseElapsedTime(true);
    model.setMaximumSeconds(time_limit_seconds);
    model.setAllowableGap(1e-9);
    model.setAllowableFractionGap(1e-9);
    model.setCutoffIncrement(kCutoffIncrement);
    model.setNumberThreads(0);
    const CbcStop search_stop(stopped);
    model.passInEventHandler(&search_stop);

    model.initialSolve();
    if (model.solver()->isProvenPrimalInfeasible()) {
      return absl::InternalError(
          "ilp: the LP relaxation is infeasible, though the Ring plan should be feasible");
    }
    if (start != nullptr) {
      model.setBestSolution(start->data(), m.num_cols, start_obj, /*check=*/true);
    }
    model.branchAndBound();

    CbcResult result;
    result.proven_optimal = model.isProvenOptimal();
    result.bound = model.getBestPossibleObjValue();
    if (const double* sol = model.bestSolution(); sol != nullptr) {
      result.owners = OwnersFromSolution(m, sol);
    }
    return result;
  } catch (const CoinError& e) {
    return absl::InternalError(absl::StrCat("ilp: CBC failed in ", e.className(),
                                            "::", e.methodName(), ": ", e.message()));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("ilp: out of memory in CBC");
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("ilp: CBC threw: ", e.what()));
  } catch (...) {
    return absl::InternalError("ilp: CBC threw an unknown exception");
  }
}

double TotalWorkload(const Batch& batch) {
  double w = 0.0;
  for (int64_t len : batch.doc_lens) w += ShardWorkload(0, len);
  return w;
}

}  // namespace

int64_t DefaultGranularity(const Batch& batch) {
  const int64_t total = TotalTokens(batch.doc_lens);
  const int64_t per = int64_t{16} * batch.cp_size;
  return std::max<int64_t>(1, (total + per - 1) / per);
}

double DefaultCommWeight(const Batch& batch) {
  const int64_t total = TotalTokens(batch.doc_lens);
  const double mean_work = TotalWorkload(batch) / batch.cp_size;
  return kDefaultCommFraction * mean_work /
         static_cast<double>(TokensPerRank(total, batch.cp_size));
}

absl::StatusOr<double> Objective(const Plan& plan, double comm_weight) {
  FLASHCP_ASSIGN_OR_RETURN(const CommLayout layout, BuildCommLayout(plan));
  double max_work = 0.0;
  int64_t max_nonlast = 0;
  for (const RankLayout& rank : layout.ranks) {
    double work = 0.0;
    for (int32_t s : rank.shards) work += ShardWorkload(plan.shards[s].start, plan.shards[s].len);
    max_work = std::max(max_work, work);
    max_nonlast = std::max(max_nonlast, rank.send_tokens);
  }
  return max_work + comm_weight * static_cast<double>(max_nonlast);
}

absl::StatusOr<Plan> Solve(const Batch& batch, const IlpOptions& options, const StopToken& stop,
                           PlanInfo* info) {
  if (!(options.granularity >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ilp.granularity: must be >= 0 tokens (0 picks ceil(C / 16N)), got ",
        options.granularity));
  }
  if (!std::isfinite(options.time_limit_seconds) || options.time_limit_seconds < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ilp.time_limit_seconds: must be a finite number of seconds >= 0, got ",
        options.time_limit_seconds));
  }
  if (!std::isfinite(options.comm_weight) || options.comm_weight < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ilp.comm_weight: must be finite and >= 0 (0 picks the default), got ",
        options.comm_weight));
  }
  const int32_t n = batch.cp_size;
  const int64_t g = options.granularity > 0 ? options.granularity : DefaultGranularity(batch);
  const double weight = options.comm_weight > 0 ? options.comm_weight : DefaultCommWeight(batch);

  // Bound the model before allocating it: grid blocks alone, then exactly.
  int64_t grid_blocks = 0;
  for (int64_t len : batch.doc_lens) grid_blocks += (len + g - 1) / g;
  const auto too_big = [&](int64_t blocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ilp.granularity: ", g, " tokens gives ", blocks, " blocks x ", n, " ranks = ",
        blocks * n, " binary variables, above the ILP's limit of ", kMaxBinaryVars,
        "; raise the granularity or plan a smaller batch"));
  };
  if (grid_blocks > kMaxBinaryVars / n) return too_big(grid_blocks);

  // One rank: every document whole on it is the only plan.
  if (n == 1) {
    std::vector<Shard> pieces;
    for (size_t d = 0; d < batch.doc_lens.size(); ++d) {
      pieces.push_back(Shard{static_cast<int32_t>(d), 0, batch.doc_lens[d], 0});
    }
    Plan plan = FinishPlan(batch, std::move(pieces));
    FLASHCP_ASSIGN_OR_RETURN(const double objective, Objective(plan, weight));
    if (info != nullptr) {
      info->ilp_gap = 0.0;
      info->ilp_optimal = true;
      info->ilp_objective = objective;
      info->ilp_granularity = g;
    }
    return plan;
  }

  // Blocks: the grid, the Ring and Llama3 cut points (always), and the cut
  // points of the best other strategy's plan (by the objective) whose cuts
  // keep the model within the bound, so the ILP starts from, and is never
  // worse than, every heuristic here. Every plan whose cuts are all block
  // boundaries is a candidate incumbent.
  std::vector<Plan> candidates = {PlanRing(batch), PlanLlama3(batch)};
  std::vector<Block> blocks = MakeBlocks(batch, g, candidates);
  if (static_cast<int64_t>(blocks.size()) > kMaxBinaryVars / n) {
    return too_big(static_cast<int64_t>(blocks.size()));
  }
  std::vector<std::pair<double, Plan>> others;
  for (Strategy s : AllStrategies()) {
    // magi is a comparison baseline, not a seed: the ILP's model stays as it was.
    if (s == Strategy::kIlp || s == Strategy::kRing || s == Strategy::kLlama3 ||
        s == Strategy::kMagi || s == Strategy::kBasp) {
      continue;
    }
    PlanOptions heuristic;
    heuristic.stop = stop;
    absl::StatusOr<Plan> p = MakePlan(s, batch, heuristic);
    FLASHCP_RETURN_IF_ERROR(stop.Check());
    FLASHCP_RETURN_IF_ERROR(p.status());  // a heuristic fails only on a bad batch
    FLASHCP_ASSIGN_OR_RETURN(const double obj, Objective(*p, weight));
    others.emplace_back(obj, *std::move(p));
  }
  std::stable_sort(others.begin(), others.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [obj, p] : others) {
    std::vector<Block> more = MakeBlocks(batch, g, {candidates[0], candidates[1], p});
    if (static_cast<int64_t>(more.size()) <= kMaxBinaryVars / n) {
      blocks = std::move(more);
      candidates.push_back(std::move(p));
      break;
    }
  }
  for (auto& [obj, p] : others) {
    if (!p.shards.empty()) candidates.push_back(std::move(p));  // representable or not
  }

  const double mean_work = TotalWorkload(batch) / n;
  const Model model = BuildModel(batch, std::move(blocks), mean_work, weight);

  // The incumbent: the best representable candidate by its true objective.
  std::optional<Plan> best;
  double best_obj = std::numeric_limits<double>::infinity();
  std::vector<double> start_sol;
  for (const Plan& p : candidates) {
    std::optional<std::vector<int32_t>> owners = OwnersOf(p, model.blocks);
    if (!owners) continue;
    Canonicalize(model, *owners);
    FLASHCP_ASSIGN_OR_RETURN(const double obj, Objective(p, weight));
    if (obj < best_obj) {
      best = p;
      best_obj = obj;
      start_sol = SolutionOf(model, *owners);
    }
  }
  FLASHCP_RETURN_IF_ERROR(stop.Check());
  FLASHCP_ASSIGN_OR_RETURN(
      const CbcResult solved,
      SolveWithCbc(model, start_sol.empty() ? nullptr : &start_sol, best_obj / mean_work, options,
                   stop));
  FLASHCP_RETURN_IF_ERROR(stop.Check());
  // CBC's proof covers the returned plan when CBC's solution is no worse than
  // the incumbent it was given (equal up to summation order when it is that
  // incumbent relabeled).
  const double start_obj = best_obj;
  bool optimal = false;
  if (solved.owners) {
    Plan plan = PlanOfOwners(batch, model, *solved.owners);
    if (absl::Status valid = ValidatePlan(plan); !valid.ok()) {
      return absl::InternalError(
          absl::StrCat("ilp: CBC's solution is not a valid plan: ", valid.message()));
    }
    FLASHCP_ASSIGN_OR_RETURN(const double obj, Objective(plan, weight));
    optimal = solved.proven_optimal && obj <= start_obj * (1 + 1e-12);
    if (obj < best_obj) {
      best = std::move(plan);
      best_obj = obj;
    }
  }
  if (!best) {
    return absl::DeadlineExceededError(absl::StrCat(
        "ilp: no feasible plan within ilp.time_limit_seconds = ", options.time_limit_seconds));
  }
  // Workload >= its mean on some rank, so 1 (in mean workloads) bounds any plan.
  const double obj_units = best_obj / mean_work;
  const double bound = std::max(1.0, solved.bound);
  if (info != nullptr) {
    info->ilp_optimal = optimal;
    info->ilp_gap = optimal ? 0.0 : std::max(0.0, (obj_units - bound) / obj_units);
    info->ilp_objective = best_obj;
    info->ilp_granularity = g;
  }
  return *std::move(best);
}

}  // namespace flashcp::core::ilp
